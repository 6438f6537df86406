"""RocketMQ 5 consumers against the writer, beside SQLite used as a queue, in one run.

Rate: MESSAGES messages stored first, then consumed. rmqstore: the official Python
client's SimpleConsumer (benchmarks/consumer_client.py, its own virtualenv and process)
receives batches of BATCH with a waiting long poll and acknowledges every message.
SQLite: one file (WAL, synchronous=NORMAL: durable at checkpoints, as the writer's group
offsets are durable at their flush interval; and again with FULL, every commit synced), a table of messages, and a consumer
process that takes BATCH in one transaction: SELECT … ORDER BY id LIMIT BATCH, then
DELETE of those ids, COMMIT. The figure is rmqstore's rate ÷ SQLite's (target ≥ 5).

Latency: a producer sends RATE msgs/s (each of --rates in turn) steadily for SECONDS (our own WriterService
SendBatch every 10 ms; each body is its send time, time.time_ns) while CONSUMERS
SimpleConsumer processes of one group wait in their long polls; latency is receive time
minus send time, on one machine's clock. SQLite the same: a producer inserting each 10 ms
batch in one transaction, a consumer process polling (1 ms sleep when the table is
empty: SQLite cannot wake a reader). Target: rmqstore's p99 ≤ 50 ms.

    python benchmarks/consumer_bench.py [--messages N] [--batch 32] [--rates 5000 500]
        [--seconds S] [--consumers C] [--out benchmarks/CONSUMERS.md]

With --out, the report is also written as JSON to results/consumers-<UTC time>-<N>.json
beside the markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_common import Nodes, load_average, machine_facts, quiet_env, ratio  # noqa: E402
from consumer_peers import PEERS, missing_servers, peer_rate  # noqa: E402
from rocketmq5_bench import process_cpu_s  # noqa: E402

RATE_TARGET = 5.0
P99_TARGET_MS = 50.0
# Writer CPU a consumed message, our own v2 caller (receive 32, one AckMessage of 32).
OWN_V2_WRITER_US_TARGET = 20.0
TIMEOUT_S = 1800.0
TICK_S = 0.01
PACED_SEND_MAX = 1_000
PRELOAD_BATCH = 256
TOPIC = "ConsumeBench"
GROUP = "consume-bench"
# Consumers long-poll before the producer starts: this is their start-up allowance.
CONSUMER_START_S = 4.0
# After the producer stops, what the consumers may take to drain.
DRAIN_S = 5.0
BODY_BYTES = 100
# One queue: the writer serves a receive from the queue the request names, and the
# clients name one queue per call in turn, so on a topic of several queues a receive
# on an empty queue waits out its long poll while others hold messages.
QUEUES = 1
SQLITE_POLL_SLEEP_S = 0.001


def _body(n: int) -> bytes:
    return f"{n:020d}".encode().ljust(BODY_BYTES, b".")


# rmqstore


def rmq5_python() -> str:
    python = Path(os.environ.get("RMQSTORE_RMQ5_VENV", REPO / ".venv-rmq5")) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"the official Python client's virtualenv is missing ({python}): run test.sh once")
    return str(python)


def client_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in quiet_env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(home)  # the client's log goes under ~/logs
    return env


def preload(endpoint: str, count: int) -> None:
    import grpc

    from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        create_topic(stub)
        for start in range(0, count, PRELOAD_BATCH):
            messages = [messages_pb2.Message(topic=TOPIC, body=_body(n), tags="T") for n in range(start, min(start + PRELOAD_BATCH, count))]
            stub.SendBatch(writer_pb2.SendBatchRequest(messages=messages), timeout=60)


def create_topic(stub: Any) -> None:
    from rmqstore.v1 import writer_pb2

    stub.CreateTopic(writer_pb2.CreateTopicRequest(name=TOPIC, queue_count=QUEUES), timeout=60)


def rmqstore_rate(nodes: Nodes, work: Path, count: int, batch: int) -> dict[str, Any]:
    writer = nodes.start("writer", work / "store-rate")
    preload(writer.endpoint, count)
    command = [rmq5_python(), str(HERE / "consumer_client.py"), "rate", writer.endpoint, TOPIC, GROUP, str(count), str(batch)]
    # Which process a message costs more CPU: the consumer's (start-up included) or the writer's.
    writer_before = process_cpu_s(writer.proc.pid)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=client_env(work), check=False)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    writer_cpu_s = process_cpu_s(writer.proc.pid) - writer_before
    if done.returncode != 0:
        writer.stop()
        raise RuntimeError(f"the consumer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["msgs_per_s"] = result["messages"] / result["seconds"]
    consumer_cpu_s = (children_after.ru_utime + children_after.ru_stime) - (children_before.ru_utime + children_before.ru_stime)
    result["consumer_cpu_us_per_message"] = consumer_cpu_s / result["messages"] * 1e6
    result["writer_cpu_us_per_message"] = writer_cpu_s / result["messages"] * 1e6
    # The same messages again, for a group of its own, by the cheapest caller.
    own_command = [sys.executable, __file__, "--own-v2-consumer", writer.endpoint, str(count), str(batch)]
    writer_before = process_cpu_s(writer.proc.pid)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = subprocess.run(own_command, capture_output=True, text=True, timeout=TIMEOUT_S, env=quiet_env(), check=False)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    writer_cpu_s = process_cpu_s(writer.proc.pid) - writer_before
    writer.stop()
    if own.returncode != 0:
        raise RuntimeError(f"our own v2 consumer failed ({own.returncode}):\n{own.stderr[-3000:]}")
    own_result: dict[str, Any] = json.loads(own.stdout.strip().splitlines()[-1])
    own_result["msgs_per_s"] = own_result["messages"] / own_result["seconds"]
    consumer_cpu_s = (children_after.ru_utime + children_after.ru_stime) - (children_before.ru_utime + children_before.ru_stime)
    own_result["consumer_cpu_us_per_message"] = consumer_cpu_s / own_result["messages"] * 1e6
    own_result["writer_cpu_us_per_message"] = writer_cpu_s / own_result["messages"] * 1e6
    result["own_v2"] = own_result
    return result


def bare_v2_rate(count: int, batch: int) -> dict[str, Any]:
    """Our own v2 caller against a bare grpc.aio server streaming the same answers
    (benchmarks/bare_receive.py): grpcio's own cost of a receive and an ack, the floor
    under the writer's figure."""
    from bare_receive import BareReceive

    server = BareReceive(count, batch)
    try:
        own_command = [sys.executable, __file__, "--own-v2-consumer", server.endpoint, str(count), str(batch)]
        before = process_cpu_s(server.process.pid)
        own = subprocess.run(own_command, capture_output=True, text=True, timeout=TIMEOUT_S, env=quiet_env(), check=False)
        server_cpu_s = process_cpu_s(server.process.pid) - before
    finally:
        server.close()
    if own.returncode != 0:
        raise RuntimeError(f"our own v2 consumer failed against the bare server ({own.returncode}):\n{own.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(own.stdout.strip().splitlines()[-1])
    result["msgs_per_s"] = result["messages"] / result["seconds"]
    result["server_cpu_us_per_message"] = server_cpu_s / result["messages"] * 1e6
    return result


def own_v2_consume(endpoint: str, count: int, batch: int, deadline_s: float | None = None) -> dict[str, Any]:
    """The writer's receive and ack path with the least client cost the protocol allows:
    our own v2 stubs, a receive of ``batch`` and one AckMessage carrying all of them.
    With ``deadline_s``, one of several consumers of a paced producer's stamped messages
    (bodies: time.time_ns at the send): an empty long poll is no error, it stops at ``count``
    or the deadline, and the result has each message's send → receive latency."""
    import grpc
    from google.protobuf import duration_pb2

    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s
    from rmqstore.rocketmq_v2 import service_pb2_grpc

    group, topic = v2.Resource(name=GROUP + "-own"), v2.Resource(name=TOPIC)
    request = v2s.ReceiveMessageRequest(
        group=group, message_queue=v2.MessageQueue(topic=topic, id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=batch,
        invisible_duration=duration_pb2.Duration(seconds=30), long_polling_timeout=duration_pb2.Duration(seconds=5),
    )  # fmt: skip
    seen: set[str] = set()
    duplicates = 0
    latencies_us: list[int] = []
    stop_at = time.monotonic() + (deadline_s if deadline_s is not None else TIMEOUT_S)
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        started = time.perf_counter()
        while len(seen) < count and time.monotonic() < stop_at:
            messages = [a.message for a in stub.ReceiveMessage(request, timeout=30) if a.HasField("message")]
            arrived_ns = time.time_ns()
            if not messages and deadline_s is None:
                raise RuntimeError(f"the writer had nothing more to hand out after {len(seen)} of {count} messages")
            if not messages:
                continue
            if deadline_s is not None:
                latencies_us += [(arrived_ns - int(message.body)) // 1000 for message in messages]
            entries = []
            for message in messages:
                system = message.system_properties
                duplicates += system.message_id in seen
                seen.add(system.message_id)
                entries.append(v2s.AckMessageEntry(message_id=system.message_id, receipt_handle=system.receipt_handle))
            answer = stub.AckMessage(v2s.AckMessageRequest(group=group, topic=topic, entries=entries), timeout=30)
            if answer.status.code != v2.OK:
                raise RuntimeError(f"AckMessage answered {answer.status.code}: {answer.status.message}")
        seconds = time.perf_counter() - started
    result: dict[str, Any] = {"messages": len(seen), "duplicates": duplicates, "seconds": seconds}
    if deadline_s is not None:
        result["latencies_us"] = latencies_us
    return result


def paced(rate: int, seconds: float, send: Any) -> int:
    """Call ``send(first_n, count)`` every TICK_S with what is due at ``rate``; the count sent."""
    total = int(rate * seconds)
    sent = 0
    started = time.perf_counter()
    while sent < total:
        # At most PACED_SEND_MAX a call: a producer stalled on a loaded machine catches up in
        # several sends, each within the writer's batch limit.
        due = min(total, int((time.perf_counter() - started) * rate) + 1, sent + PACED_SEND_MAX)
        if due > sent:
            send(sent, due - sent)
            sent = due
        time.sleep(max(0.0, started + sent / rate - time.perf_counter()))
    return sent


def rmqstore_latency(
    nodes: Nodes, work: Path, rate: int, seconds: float, batch: int, consumers: int, own_v2: bool = False
) -> dict[str, Any]:
    """Send → receive at ``rate`` with ``consumers`` processes of one group: the official
    SimpleConsumer's, or with ``own_v2`` our own v2 caller's (a batch acknowledged in one call)."""
    import grpc

    from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

    writer = nodes.start("writer", work / f"store-latency-{rate}{'-own-v2' if own_v2 else ''}")
    total = int(rate * seconds)
    deadline_s = CONSUMER_START_S + seconds + DRAIN_S
    with grpc.insecure_channel(writer.endpoint) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        create_topic(stub)  # before the consumers ask for its route
        command = [rmq5_python(), str(HERE / "consumer_client.py"), "latency", writer.endpoint, TOPIC, GROUP, str(total), str(batch), str(deadline_s)]
        env = client_env(work)
        if own_v2:
            command = [sys.executable, __file__, "--own-v2-consumer", writer.endpoint, str(total), str(batch), str(deadline_s)]
            env = quiet_env()
        # What bounds a run that falls behind: the cores the writer and the consumers used
        # from the consumers' start to their end (the writer's include the producer's sends).
        writer_before, started = process_cpu_s(writer.proc.pid), time.monotonic()
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(consumers)]
        try:
            time.sleep(CONSUMER_START_S)

            def send(first: int, count: int) -> None:
                stamp = str(time.time_ns()).encode()
                messages = [messages_pb2.Message(topic=TOPIC, body=stamp) for _ in range(count)]
                stub.SendBatch(writer_pb2.SendBatchRequest(messages=messages), timeout=60)

            sent = paced(rate, seconds, send)
            outputs = [proc.communicate(timeout=deadline_s + 60) for proc in procs]
            elapsed_s, writer_cpu_s = time.monotonic() - started, process_cpu_s(writer.proc.pid) - writer_before
            children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    writer.stop()
    latencies: list[int] = []
    received = duplicates = 0
    for proc, (stdout, stderr) in zip(procs, outputs):
        if proc.returncode != 0:
            raise RuntimeError(f"a consumer failed ({proc.returncode}):\n{stderr[-3000:]}")
        result = json.loads(stdout.strip().splitlines()[-1])
        latencies += result["latencies_us"]
        received += result["messages"]
        duplicates += result["duplicates"]
    consumers_cpu_s = (children_after.ru_utime + children_after.ru_stime) - (children_before.ru_utime + children_before.ru_stime)
    cores = {"writer_cores": round(writer_cpu_s / elapsed_s, 2), "consumers_cores": round(consumers_cpu_s / elapsed_s, 2)}
    return {"sent": sent, "received": received, "duplicates": duplicates, **percentiles(latencies), **cores}


def percentiles(latencies_us: list[int]) -> dict[str, Any]:
    if not latencies_us:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    ms = sorted(v / 1000 for v in latencies_us)
    if len(ms) == 1:
        p50 = p99 = ms[0]
    else:
        cuts = statistics.quantiles(ms, n=100, method="inclusive")
        p50, p99 = cuts[49], cuts[98]
    return {"p50_ms": round(p50, 2), "p99_ms": round(p99, 2), "max_ms": round(ms[-1], 2)}


# SQLite as a queue


def sqlite_connect(path: Path, synchronous: str = "NORMAL") -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, timeout=30)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute(f"PRAGMA synchronous={synchronous}")
    connection.execute("CREATE TABLE IF NOT EXISTS queue (id INTEGER PRIMARY KEY AUTOINCREMENT, tag TEXT, body BLOB NOT NULL)")
    return connection


def sqlite_take(connection: sqlite3.Connection, batch: int) -> list[tuple[int, bytes]]:
    """One consumer step: a batch taken and deleted in one transaction."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        rows = connection.execute("SELECT id, body FROM queue ORDER BY id LIMIT ?", (batch,)).fetchall()
        if rows:
            connection.execute(f"DELETE FROM queue WHERE id IN ({','.join('?' * len(rows))})", [r[0] for r in rows])
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return rows


def sqlite_insert(connection: sqlite3.Connection, bodies: list[bytes]) -> None:
    connection.execute("BEGIN IMMEDIATE")
    connection.executemany("INSERT INTO queue (tag, body) VALUES ('T', ?)", [(b,) for b in bodies])
    connection.execute("COMMIT")


def sqlite_consume(path: Path, count: int, batch: int, deadline_s: float, stamped: bool, synchronous: str) -> dict[str, Any]:
    """The SQLite consumer process: take batches until ``count`` messages or the deadline."""
    connection = sqlite_connect(path, synchronous)
    taken = 0
    latencies_us: list[int] = []
    started = time.perf_counter()
    stop_at = time.monotonic() + deadline_s
    while taken < count and time.monotonic() < stop_at:
        rows = sqlite_take(connection, batch)
        if not rows:
            time.sleep(SQLITE_POLL_SLEEP_S)
            continue
        arrived_ns = time.time_ns()
        taken += len(rows)
        if stamped:
            latencies_us += [(arrived_ns - int(body)) // 1000 for _, body in rows]
    seconds = time.perf_counter() - started
    connection.close()
    return {"messages": taken, "seconds": seconds, "latencies_us": latencies_us}


def _sqlite_consumer_process(
    path: Path, count: int, batch: int, deadline_s: float, stamped: bool, synchronous: str = "NORMAL"
) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "--sqlite-consumer", str(path), str(count), str(batch), str(deadline_s),
               "1" if stamped else "0", synchronous]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=quiet_env())


def _result_of(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    stdout, stderr = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the SQLite consumer failed ({proc.returncode}):\n{stderr[-3000:]}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


def sqlite_rate(work: Path, count: int, batch: int, synchronous: str) -> dict[str, Any]:
    path = work / f"rate-{synchronous}.sqlite"
    connection = sqlite_connect(path, synchronous)
    for start in range(0, count, PRELOAD_BATCH):
        sqlite_insert(connection, [_body(n) for n in range(start, min(start + PRELOAD_BATCH, count))])
    connection.close()
    result = _result_of(_sqlite_consumer_process(path, count, batch, TIMEOUT_S, False, synchronous), TIMEOUT_S)
    result.pop("latencies_us")
    result["msgs_per_s"] = result["messages"] / result["seconds"]
    return result


def sqlite_latency(work: Path, rate: int, seconds: float, batch: int) -> dict[str, Any]:
    path = work / f"latency-{rate}.sqlite"
    connection = sqlite_connect(path)
    total = int(rate * seconds)
    deadline_s = CONSUMER_START_S + seconds + DRAIN_S
    proc = _sqlite_consumer_process(path, total, batch, deadline_s, stamped=True)
    try:
        time.sleep(CONSUMER_START_S)
        sent = paced(rate, seconds, lambda first, n: sqlite_insert(connection, [str(time.time_ns()).encode()] * n))
        result = _result_of(proc, deadline_s + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        connection.close()
    return {"sent": sent, "received": result["messages"], "duplicates": 0, **percentiles(result["latencies_us"])}


# The run


def peer_ratios(own_v2: dict[str, Any], peers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Our own v2 caller's figures over each peer's, same run: the writer's CPU a message ÷
    the peer server's (> 1: the writer costs more) and msgs/s ÷ the peer's (> 1: ours faster),
    from the figures as the report rounds them."""
    own_v2 = _rounded(own_v2)
    peers = {peer: _rounded(figures) for peer, figures in peers.items()}
    ratios = {
        peer: {
            "server_cpu_ratio": round(own_v2["writer_cpu_us_per_message"] / figures["server_cpu_us_per_message"], 2)
            if figures["server_cpu_us_per_message"] else None,
            "msgs_per_s_ratio": round(own_v2["msgs_per_s"] / figures["msgs_per_s"], 2),
        }
        for peer, figures in peers.items()
    }  # fmt: skip
    return {"peer_ratios": ratios}


PEER_NAMES = {
    "redis": "Redis Streams, redis-py (XREADGROUP COUNT {batch}, one XACK of {batch})",
    "nats-explicit": "NATS JetStream pull, nats-py (fetch {batch}, {batch} explicit acks in one flush)",
    "nats-ack-all": "NATS JetStream pull, nats-py (fetch {batch}, AckPolicy.ALL: one ack)",
}


def peers_markdown(report: dict[str, Any]) -> str:
    if not report["peers"]:
        return ""
    batch = report["batch"]
    own = report["receive_ack"]["rmqstore_own_v2"]
    rows = [
        f"| rmqstore writer, our own v2 caller (receive {batch}, one AckMessage of {batch}) | {own['msgs_per_s']:,.0f} | "
        f"{own['writer_cpu_us_per_message']:,.1f} | {own['consumer_cpu_us_per_message']:,.1f} | 1 | 1 |"
    ]
    for peer, figures in report["peers"].items():
        ratios = report["peer_ratios"][peer]
        rows.append(
            f"| {PEER_NAMES[peer].format(batch=batch)} | {figures['msgs_per_s']:,.0f} | {figures['server_cpu_us_per_message']:,.1f} | "
            f"{figures['consumer_cpu_us_per_message']:,.1f} | {ratios['server_cpu_ratio']} | {ratios['msgs_per_s_ratio']} |"
        )
    twice = ", ".join(f"{peer} {figures['duplicates']}" for peer, figures in report["peers"].items())
    return f"""
## Beside the servers users would pick instead

The same {report['messages']:,} messages of {BODY_BYTES} bytes stored in each server first, then consumed by one
consumer process in batches of {batch}, each batch acknowledged before the next receive; each server fresh,
alone on 127.0.0.1, in a temporary directory (benchmarks/consumer_peers.py says how each is configured).
Server CPU: the server process's user + system seconds (/proc, every thread) while the consumer ran, a
message; consumer CPU: the consumer process's, its start-up included. The ratios are ours over the peer's
(CPU: > 1 means the writer spends more a message; msgs/s: > 1 means ours is faster).

| server and client | msgs/s | server CPU µs/msg | consumer CPU µs/msg | writer CPU ÷ server CPU | msgs/s ÷ |
|---|---|---|---|---|---|
{chr(10).join(rows)}

Messages received twice: {twice}.
"""


def _rounded(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages stored, then consumed, for the rate")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--rates", type=int, nargs="+", default=[5_000, 500],
        help="the producer's msgs/s for the latency, one run each; the first is the target's",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the producer sends for the latency")
    parser.add_argument("--consumers", type=int, default=1, help="SimpleConsumer processes of the group for the latency")
    parser.add_argument("--out", type=Path, help="write the results as markdown here, and as JSON in results/ beside it")
    parser.add_argument("--sqlite-consumer", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument(
        "--own-v2-consumers", type=int, default=2,
        help="processes of our own v2 caller (receive a batch, one AckMessage) of one group for the latency",
    )  # fmt: skip
    parser.add_argument("--no-peers", action="store_true", help="leave out Redis Streams and NATS JetStream")
    parser.add_argument("--own-v2-consumer", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.own_v2_consumer:
        endpoint, count, batch, *deadline = args.own_v2_consumer
        deadline_s = float(deadline[0]) if deadline else None
        print(json.dumps(own_v2_consume(endpoint, int(count), int(batch), deadline_s)), flush=True)
        return
    if args.sqlite_consumer:
        path, count, batch, deadline_s, stamped, synchronous = args.sqlite_consumer
        result = sqlite_consume(Path(path), int(count), int(batch), float(deadline_s), stamped == "1", synchronous)
        print(json.dumps(result), flush=True)
        return
    if not args.no_peers and (missing := missing_servers()):
        raise SystemExit(f"the peers' servers are missing ({', '.join(missing)}): install Debian's redis-server and nats-server, or pass --no-peers")
    with tempfile.TemporaryDirectory(prefix="consumer-bench-") as work_text:
        work = Path(work_text)
        with Nodes(work / "logs") as nodes:
            official = rmqstore_rate(nodes, work, args.messages, args.batch)
            rates = {
                "rmqstore": official,
                "rmqstore_own_v2": official.pop("own_v2"),
                "bare_v2": bare_v2_rate(args.messages, args.batch),
                "sqlite": sqlite_rate(work, args.messages, args.batch, "NORMAL"),
                "sqlite_full": sqlite_rate(work, args.messages, args.batch, "FULL"),
            }
            # The servers users would pick instead, the same messages consumed the same way.
            peers = {} if args.no_peers else {peer: peer_rate(peer, work / "peers", args.messages, args.batch, _body) for peer in PEERS}
            latency = [
                {
                    "rate": rate,
                    "rmqstore": rmqstore_latency(nodes, work, rate, args.seconds, args.batch, args.consumers),
                    "rmqstore_own_v2": rmqstore_latency(nodes, work, rate, args.seconds, args.batch, args.own_v2_consumers, own_v2=True),
                    "sqlite": sqlite_latency(work, rate, args.seconds, args.batch),
                }
                for rate in args.rates
            ]
    figure = ratio(rates["rmqstore"]["msgs_per_s"], rates["sqlite"]["msgs_per_s"])
    target_p99 = latency[0]["rmqstore"]["p99_ms"]
    report = {
        "messages": args.messages,
        "batch": args.batch,
        "seconds": args.seconds,
        "consumers": args.consumers,
        "own_v2_consumers": args.own_v2_consumers,
        "queues": QUEUES,
        "receive_ack": {name: _rounded(figures) for name, figures in rates.items()},
        "rate_ratio": figure,
        "rate_ratio_sqlite_full": ratio(rates["rmqstore"]["msgs_per_s"], rates["sqlite_full"]["msgs_per_s"]),
        # The writer's own path, without the official client's per-message calls (not the target's figure).
        "own_v2_rate_ratio": ratio(rates["rmqstore_own_v2"]["msgs_per_s"], rates["sqlite"]["msgs_per_s"]),
        "latency": latency,
        "rate_target": RATE_TARGET,
        "p99_target_ms": P99_TARGET_MS,
        "rate_met": figure is not None and figure >= RATE_TARGET,
        "p99_met": target_p99 is not None and target_p99 <= P99_TARGET_MS,
        "peers": {peer: _rounded(figures) for peer, figures in peers.items()},
        **peer_ratios(rates["rmqstore_own_v2"], peers),
        "own_v2_p99_ms": latency[0]["rmqstore_own_v2"]["p99_ms"],
        "own_v2_p99_met": latency[0]["rmqstore_own_v2"]["p99_ms"] is not None and latency[0]["rmqstore_own_v2"]["p99_ms"] <= P99_TARGET_MS,
    }
    print(json.dumps(report), flush=True)
    if args.out:
        text = markdown(report, " ".join(["python", "benchmarks/consumer_bench.py", *sys.argv[1:]]))
        args.out.write_text(text + kept_analysis(args.out))
        results = args.out.parent / "results"
        results.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%MZ", time.gmtime())
        (results / f"consumers-{stamp}-{args.messages}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


ANALYSIS_HEADING = "\n## What bounds the figures"


def kept_analysis(out: Path) -> str:
    """The hand-written analysis at the end of an earlier report (from its heading on),
    kept when the figures above it are measured again."""
    if not out.exists():
        return ""
    earlier = out.read_text(encoding="utf-8")
    start = earlier.find(ANALYSIS_HEADING)
    return earlier[start:] if start >= 0 else ""


def markdown(report: dict[str, Any], command: str) -> str:
    facts = machine_facts(REPO)
    rate = report["receive_ack"]
    batch = report["batch"]

    def verdict(met: bool) -> str:
        return "met" if met else "missed"

    def rate_row(name: str, figures: dict[str, Any]) -> str:
        return f"| {name} | {figures['messages']:,} | {figures['seconds']} | {figures['msgs_per_s']:,.0f} |"

    def latency_row(rate_per_s: int, name: str, figures: dict[str, Any]) -> str:
        return (
            f"| {rate_per_s:,} | {name} | {figures['sent']:,} | {figures['received']:,} | {figures['duplicates']} | "
            f"{figures['p50_ms']} | {figures['p99_ms']} | {figures['max_ms']} | {figures.get('writer_cores', '')} | {figures.get('consumers_cores', '')} |"
        )

    latency_rows = "\n".join(
        row
        for run in report["latency"]
        for row in (
            latency_row(run["rate"], "rmqstore", run["rmqstore"]),
            *([latency_row(run["rate"], f"rmqstore, own v2 caller ×{report['own_v2_consumers']}", run["rmqstore_own_v2"])] if "rmqstore_own_v2" in run else []),
            latency_row(run["rate"], "SQLite", run["sqlite"]),
        )
    )
    first = report["latency"][0]
    return f"""# RocketMQ 5 consumers: the official Python SimpleConsumer beside SQLite as a queue

`{command}`

{facts['date_utc']}, commit {facts['git_commit']}, {facts['cores']} cores ({facts['cpu']}), load average at the
end {load_average()}. Every process on 127.0.0.1; the writer with its defaults (ASYNC flush, group
offsets flushed every second), a topic of {report['queues']} queue.

## Receive and acknowledge, batches of {batch}

{report['messages']:,} messages stored first, then consumed by one consumer process. SQLite in WAL mode,
`synchronous=NORMAL` (durable at checkpoints, as the group's offsets are at their flush) and
`FULL` (every commit synced).

| consumer | messages | seconds | msgs/s |
|---|---|---|---|
{rate_row(f"rmqstore, official Python SimpleConsumer (receive {batch}, ack each)", rate['rmqstore'])}
{rate_row(f"rmqstore, our own v2 caller (receive {batch}, one AckMessage of {batch})", rate['rmqstore_own_v2'])}
{rate_row(f"SQLite NORMAL (SELECT … LIMIT {batch} + DELETE, one transaction)", rate['sqlite'])}
{rate_row("SQLite FULL (the same)", rate['sqlite_full'])}

rmqstore ÷ SQLite NORMAL: **{report['rate_ratio']}** (target ≥ {report['rate_target']:g}: {verdict(report['rate_met'])});
÷ SQLite FULL: {report['rate_ratio_sqlite_full']}. Messages received twice by rmqstore's consumer: {rate['rmqstore']['duplicates']}.
CPU a message cost (user + system): {rate['rmqstore']['consumer_cpu_us_per_message']:,.0f} µs in the consumer's process (its
start-up included), {rate['rmqstore']['writer_cpu_us_per_message']:,.0f} µs in the writer. Our own v2 caller, the same messages for a
group of its own (not the target's figure: it shows the writer's path without the client's call a message):
{report['own_v2_rate_ratio']} of SQLite NORMAL's rate; {rate['rmqstore_own_v2']['consumer_cpu_us_per_message']:,.0f} µs a message in the caller,
{rate['rmqstore_own_v2']['writer_cpu_us_per_message']:,.0f} µs in the writer (target ≤ {OWN_V2_WRITER_US_TARGET:g} µs:
{verdict(rate['rmqstore_own_v2']['writer_cpu_us_per_message'] <= OWN_V2_WRITER_US_TARGET)}). The same caller against a bare
`grpc.aio` server streaming the same answers (benchmarks/bare_receive.py, no store): {rate['bare_v2']['server_cpu_us_per_message']:,.0f} µs a
message in the server, {rate['bare_v2']['msgs_per_s']:,.0f} msgs/s: the writer's cost above grpcio's is
{rate['rmqstore_own_v2']['writer_cpu_us_per_message'] - rate['bare_v2']['server_cpu_us_per_message']:,.0f} µs a message.
{peers_markdown(report)}
## Send → receive under a steady producer

{report['seconds']:g} s of sending at each rate; rmqstore: {report['consumers']} SimpleConsumer process(es) in a
waiting long poll (then, against a fresh writer, {report['own_v2_consumers']} process(es) of our own v2 caller); SQLite: one consumer process polling every {SQLITE_POLL_SLEEP_S * 1000:g} ms when the table is empty.

| msgs/s | system | sent | received | twice | p50 ms | p99 ms | max ms | writer cores | consumer cores |
|---|---|---|---|---|---|---|---|---|---|
{latency_rows}

rmqstore's p99 at {first['rate']:,} msgs/s: **{first['rmqstore']['p99_ms']} ms** (target ≤ {report['p99_target_ms']:g} ms: {verdict(report['p99_met'])}).
With {report['own_v2_consumers']} processes of our own v2 caller (a batch acknowledged in one call): **{report['own_v2_p99_ms']} ms** ({verdict(report['own_v2_p99_met'])}).
"""


if __name__ == "__main__":
    main()
