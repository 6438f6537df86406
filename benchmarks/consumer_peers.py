"""The servers users would pick instead of rmqstore for consumer groups, consuming as our own
v2 caller does in benchmarks/consumer_bench.py: receive BATCH, acknowledge them in one call.

* Redis Streams consumer groups (Debian's redis-server, PyPI redis): XREADGROUP COUNT BATCH,
  then one XACK of the batch's ids. The server with an append-only file synced every second
  (`appendfsync everysec`, Redis's own advice for durability), as the writer runs with ASYNC
  flush and group offsets flushed every second; no RDB snapshots.
* NATS JetStream pull consumers (Debian's nats-server with -js, PyPI nats-py): a durable pull
  consumer fetching BATCH, acknowledged either message by message (explicit acks, each its own
  publish, the batch's sent in one flush: JetStream has no batch of explicit acks) or by
  acknowledging the batch's last message under AckPolicy.ALL (one ack for the batch). A stream
  with file storage, the server's defaults otherwise.

Each server runs alone in a temporary directory on 127.0.0.1 at a free port and is stopped
after its run. COUNT messages of the caller's bodies are stored first, then one consumer
process (this file, run as a script) takes them all; the figures are the consumer's msgs/s,
the CPU seconds the server process spent meanwhile (/proc, every thread) and the consumer
process's own (its start-up included), each a message. The consumer process checks that
every message came once and that nothing is left unacknowledged at the end.

    python consumer_peers.py consume redis PORT COUNT BATCH
    python consumer_peers.py consume nats-explicit PORT COUNT BATCH
    python consumer_peers.py consume nats-ack-all PORT COUNT BATCH
"""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import quiet_env  # noqa: E402
from rocketmq5_bench import process_cpu_s  # noqa: E402

from rmqstore.service.listen import free_port  # noqa: E402

STREAM = "consume-bench"
GROUP = "consume-bench"
SUBJECT = "consume.bench"
NATS_STREAM = "CONSUME_BENCH"
PRELOAD_BATCH = 256
SERVING_TIMEOUT_S = 30.0
CONSUME_TIMEOUT_S = 1800.0
# A consumer's wait for a batch: long enough for any stall of a loaded machine, so an empty
# answer means the server had nothing more to hand out.
FETCH_WAIT_S = 10.0
PEERS = ("redis", "nats-explicit", "nats-ack-all")
SERVERS = {"redis": "redis-server", "nats-explicit": "nats-server", "nats-ack-all": "nats-server"}


def missing_servers() -> list[str]:
    """The peers' server commands not on PATH (Debian's redis-server and nats-server)."""
    return sorted({command for command in SERVERS.values() if shutil.which(command) is None})


class PeerServer:
    """One peer server process on 127.0.0.1 at a free port, its files under ``work``."""

    def __init__(self, peer: str, work: Path):
        self.port = free_port("127.0.0.1")
        work.mkdir(parents=True, exist_ok=True)
        self.log_path = work / "server.log"
        if SERVERS[peer] == "redis-server":
            command = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(work),
                       "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no",
                       "--logfile", str(self.log_path)]  # fmt: skip
        else:
            command = ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(work / "jetstream"),
                       "-l", str(self.log_path)]  # fmt: skip
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=work)
        self._wait_serving()

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + SERVING_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.proc.args[0]} exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.proc.args[0]} did not listen within {SERVING_TIMEOUT_S:g} s: {self.log_tail()}") from None
                time.sleep(0.05)

    def log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-2000:]

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def preload(peer: str, port: int, count: int, body: Callable[[int], bytes]) -> None:
    if peer == "redis":
        import redis

        client = redis.Redis(host="127.0.0.1", port=port)
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        for start in range(0, count, PRELOAD_BATCH):
            pipeline = client.pipeline(transaction=False)
            for n in range(start, min(start + PRELOAD_BATCH, count)):
                pipeline.xadd(STREAM, {"body": body(n)})
            pipeline.execute()
        client.close()
    else:
        asyncio.run(_nats_preload(port, count, body))


async def _nats_preload(port: int, count: int, body: Callable[[int], bytes]) -> None:
    import nats
    from nats.js.api import StorageType

    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        stream = connection.jetstream()
        await stream.add_stream(name=NATS_STREAM, subjects=[SUBJECT], storage=StorageType.FILE)
        for start in range(0, count, PRELOAD_BATCH):
            # Plain publishes, stored by the stream; the batch's acknowledgements are the count below.
            for n in range(start, min(start + PRELOAD_BATCH, count)):
                await connection.publish(SUBJECT, body(n))
            await connection.flush()
        deadline = time.monotonic() + SERVING_TIMEOUT_S
        while (stored := (await stream.stream_info(NATS_STREAM)).state.messages) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the JetStream stream holds {stored} of the {count} messages published")
            await asyncio.sleep(0.05)
    finally:
        await connection.close()


def peer_rate(peer: str, work: Path, count: int, batch: int, body: Callable[[int], bytes]) -> dict[str, Any]:
    """Store ``count`` messages in a fresh ``peer`` server, consume them all in one consumer
    process; its result with msgs/s and the CPU a message in the server and the consumer."""
    server = PeerServer(peer, work / peer)
    try:
        preload(peer, server.port, count, body)
        command = [sys.executable, __file__, "consume", peer, str(server.port), str(count), str(batch)]
        server_before = server.cpu_s()
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(command, capture_output=True, text=True, timeout=CONSUME_TIMEOUT_S, env=quiet_env(), check=False)
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_cpu_s = server.cpu_s() - server_before
    finally:
        server.stop()
    if done.returncode != 0:
        raise RuntimeError(f"the {peer} consumer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    consumer_cpu_s = (children_after.ru_utime + children_after.ru_stime) - (children_before.ru_utime + children_before.ru_stime)
    result["msgs_per_s"] = result["messages"] / result["seconds"]
    result["consumer_cpu_us_per_message"] = consumer_cpu_s / result["messages"] * 1e6
    result["server_cpu_us_per_message"] = server_cpu_s / result["messages"] * 1e6
    return result


# The consumer processes


def redis_consume(port: int, count: int, batch: int) -> dict[str, Any]:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, protocol=2)
    seen: set[bytes] = set()
    duplicates = 0
    started = time.perf_counter()
    while len(seen) < count:
        answer = client.xreadgroup(GROUP, "consumer-1", {STREAM: ">"}, count=batch, block=int(FETCH_WAIT_S * 1000))
        if not answer:
            raise RuntimeError(f"Redis had nothing more to hand out after {len(seen)} of {count} messages")
        [(_, entries)] = answer
        ids = [entry_id for entry_id, _ in entries]
        duplicates += sum(entry_id in seen for entry_id in ids)
        seen.update(ids)
        acknowledged = client.xack(STREAM, GROUP, *ids)
        if acknowledged != len(ids):
            raise RuntimeError(f"XACK acknowledged {acknowledged} of {len(ids)} entries")
    seconds = time.perf_counter() - started
    pending = client.xpending(STREAM, GROUP)["pending"]
    client.close()
    if pending:
        raise RuntimeError(f"{pending} entries left pending in the group after the run")
    return {"messages": len(seen), "duplicates": duplicates, "seconds": seconds}


async def nats_consume(port: int, count: int, batch: int, ack_all: bool) -> dict[str, Any]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        stream = connection.jetstream()
        policy = AckPolicy.ALL if ack_all else AckPolicy.EXPLICIT
        subscription = await stream.pull_subscribe(SUBJECT, durable=GROUP, stream=NATS_STREAM, config=ConsumerConfig(ack_policy=policy))
        seen: set[int] = set()
        duplicates = 0
        started = time.perf_counter()
        while len(seen) < count:
            messages = await subscription.fetch(batch, timeout=FETCH_WAIT_S)
            sequences = [message.metadata.sequence.stream for message in messages]
            duplicates += sum(sequence in seen for sequence in sequences)
            seen.update(sequences)
            if ack_all:
                await messages[-1].ack()
            else:
                for message in messages:
                    await message.ack()
        await connection.flush()
        seconds = time.perf_counter() - started
        # The server has every ack (flush); its consumer applies them on its own time.
        deadline = time.monotonic() + FETCH_WAIT_S
        while (info := await stream.consumer_info(NATS_STREAM, GROUP)).num_ack_pending or info.num_pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{info.num_ack_pending} messages left unacknowledged and {info.num_pending} undelivered after the run")
            await asyncio.sleep(0.05)
    finally:
        await connection.close()
    return {"messages": len(seen), "duplicates": duplicates, "seconds": seconds}


def main() -> None:
    mode, peer, port, count, batch = sys.argv[1:6]
    if mode != "consume" or peer not in PEERS:
        raise SystemExit(f"usage: consumer_peers.py consume {{{','.join(PEERS)}}} PORT COUNT BATCH (got {mode} {peer})")
    if peer == "redis":
        result = redis_consume(int(port), int(count), int(batch))
    else:
        result = asyncio.run(nats_consume(int(port), int(count), int(batch), ack_all=peer == "nats-ack-all"))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
