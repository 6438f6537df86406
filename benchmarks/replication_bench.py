"""A writer group against a single node, in one run (benchmarks/REPLICATION.md).

Each round, on fresh stores, both under ``--flush sync``: a single ``writer serve``, then
a group of three replicas on 127.0.0.1 with ``--replication sync --min-insync 2`` (no
etcd: the lowest id leads), all with 64 MiB commit log files and a smaller index than
RocketMQ's defaults (seven nodes a round fit a shared disk). Against each:

* ``send --file``: MESSAGES messages (256-byte bodies, two keys, one topic, four queues)
  sent by the command as users run it (``--acks summary``), timed from its start to its
  exit;
* ``PRODUCERS`` SYNC producers: threads of this process, each sending one message a
  request (``SendBatch`` of one) for SECONDS seconds; acknowledged messages a second.
  Then one such producer alone for LONE_SECONDS (a light load, which the primary does
  not pace: docs/replication.md).
  Meanwhile, against the group, the primary's ``ReplicaStatus`` every 50 ms: each
  follower's lag (ms since it was caught up, and bytes), whose p50/p99 are reported; and
  the CPU time each node and this process used per acknowledged message.
* consumption (after ``send --file``, unless ``--consume 0``): the official Python
  client's SimpleConsumer (benchmarks/consumer_client.py, its own process) receives
  batches of CONSUME_BATCH and acknowledges every message (a batch's acks together, from
  threads) until CONSUME messages came; messages a second. A group answers an
  acknowledgement once the in-sync replicas hold it (docs/replication.md).

With ``--baseline DIR`` each round also runs the group with the ``rmqstore`` package found
on that PYTHONPATH (a directory holding another version's tree as ``rmqstore``), so two
versions are compared under the same load.

    python benchmarks/replication_bench.py [--messages 50000] [--producers 64] [--seconds 10] [--lone-seconds 5]
        [--consume 10000] [--rounds 1] [--out F.json] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import grpc
from bench_common import Node, load_average, machine_facts, quiet_env
from consumer_bench import client_env, rmq5_python

from rmqstore.service.listen import free_port
from rmqstore.v1 import (
    messages_pb2,
    replication_pb2,
    replication_pb2_grpc,
    writer_pb2,
    writer_pb2_grpc,
)

REPO = Path(__file__).resolve().parent.parent
TOPIC = "ReplicationBench"
SEED = 20261129
CONSUME_BATCH = 32
CONSUMER_GROUP = "bench-readers"


def write_file(path: Path, count: int) -> None:
    rng = random.Random(SEED)
    with open(path, "w", encoding="utf-8") as out:
        for i in range(count):
            body = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(256))
            out.write(json.dumps({"topic": TOPIC, "body": body, "keys": [f"k{i}", f"g{i % 100}"], "queueId": i % 4}) + "\n")


def send_file(endpoint: str, path: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "send", "--endpoint", endpoint, "--file", str(path), "--acks", "summary"],
        capture_output=True, text=True, env=quiet_env(), timeout=1800, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"send --file failed: {done.stderr[-2000:]}")
    return time.perf_counter() - started


def consume(endpoint: str, count: int, home: Path) -> float:
    """Messages a second the official Python SimpleConsumer receives and acknowledges."""
    home.mkdir(parents=True, exist_ok=True)
    command = [
        rmq5_python(), str(Path(__file__).parent / "consumer_client.py"), "rate", endpoint, TOPIC, CONSUMER_GROUP, str(count), str(CONSUME_BATCH),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=client_env(home), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the consumer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if figures["messages"] < count:
        raise RuntimeError(f"the consumer took {figures['messages']} of {count} messages")
    return float(figures["messages"] / figures["seconds"])


def producers(endpoint: str, count: int, seconds: float) -> float:
    """Acknowledged messages a second from ``count`` threads sending one message a request."""
    acked = [0] * count
    stop = time.perf_counter() + seconds
    channel = grpc.insecure_channel(endpoint)
    stub = writer_pb2_grpc.WriterServiceStub(channel)
    body = os.urandom(256)

    def run(number: int) -> None:
        request = writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic=TOPIC, body=body, keys=[f"p{number}"])])
        while time.perf_counter() < stop:
            stub.SendBatch(request, timeout=30)
            acked[number] += 1

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - started
    channel.close()
    return sum(acked) / took


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured_producers(nodes: dict[str, Node], endpoint: str, args: argparse.Namespace, result: dict[str, Any], prefix: str) -> float:
    """``producers`` against ``endpoint``, with the CPU time each node (and this process,
    the producers' side) used per acknowledged message, in microseconds."""
    before = {name: cpu_seconds(node.proc.pid) for name, node in nodes.items()}
    own = os.times()
    started = time.perf_counter()
    rate = producers(endpoint, args.producers, args.seconds)
    messages = rate * (time.perf_counter() - started)
    after = os.times()
    for name, node in nodes.items():
        result[f"{prefix}_{name}_cpu_us_per_msg"] = round((cpu_seconds(node.proc.pid) - before[name]) / messages * 1e6, 1)
    result[f"{prefix}_producers_cpu_us_per_msg"] = round((after.user + after.system - own.user - own.system) / messages * 1e6, 1)
    return rate


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * share), len(ordered) - 1)] if ordered else 0.0


def sample_lag(endpoint: str, until: threading.Event, lag_ms: list[float], lag_bytes: list[float]) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        stub = replication_pb2_grpc.ReplicationServiceStub(channel)
        while not until.is_set():
            status = stub.ReplicaStatus(replication_pb2.ReplicaStatusRequest(), timeout=5)
            for follower in status.followers:
                if follower.connected:
                    lag_ms.append(follower.lag_ms)
                    lag_bytes.append(follower.lag_bytes)
            until.wait(0.05)


def one_round(work: Path, args: argparse.Namespace, jsonl: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    sync = ("--flush", "sync", "--commitlog-file-size", str(64 * 1024 * 1024), "--index-slots", "500000", "--index-entries", "2000000")
    logs = work / "logs"
    # A single node.
    for phase in ("file", "producers"):
        node = Node("writer", work / f"single-{phase}", logs, *sync)
        try:
            node.wait_serving()
            if phase == "file":
                result["single_send_file_s"] = send_file(node.endpoint, jsonl)
                if args.consume:
                    result["single_consume_msgs_s"] = consume(node.endpoint, args.consume, logs / "single-consumer")
            else:
                result["single_producers_msgs_s"] = measured_producers({"node": node}, node.endpoint, args, result, "single")
                if args.lone_seconds:
                    result["single_lone_msgs_s"] = producers(node.endpoint, 1, args.lone_seconds)
            node.stop()
        finally:
            node.close()
    # A group of three, SYNC replication, min-insync 2; with --baseline, the same again
    # with the other version's package ("baseline_" figures).
    runs = [("", None)]
    if args.baseline is not None:
        runs.append(("baseline_", {**quiet_env(), "PYTHONPATH": str(args.baseline)}))
    for (prefix, env), phase in itertools.product(runs, ("file", "producers")):
        ports = {k: free_port("127.0.0.1") for k in range(3)}
        replicas = ",".join(f"{k}=127.0.0.1:{p}" for k, p in ports.items())
        group = [
            Node("writer", work / f"{prefix}group-{phase}-{k}", logs, *sync, "--port", str(ports[k]), "--group", "bench",
                 "--replica-id", str(k), "--replicas", replicas, "--replication", "sync", "--min-insync", "2", env=env)
            for k in range(3)
        ]  # fmt: skip
        try:
            for node in group:
                node.wait_serving()
            primary = f"127.0.0.1:{ports[0]}"
            with grpc.insecure_channel(primary) as channel:
                stub = replication_pb2_grpc.ReplicationServiceStub(channel)
                deadline = time.monotonic() + 60
                while sum(f.in_sync for f in stub.ReplicaStatus(replication_pb2.ReplicaStatusRequest(), timeout=5).followers) < 2:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the followers did not get in sync")
                    time.sleep(0.1)
            if phase == "file":
                result[f"{prefix}group_send_file_s"] = send_file(primary, jsonl)
                if args.consume:
                    result[f"{prefix}group_consume_msgs_s"] = consume(primary, args.consume, logs / f"{prefix}group-consumer")
            else:
                lag_ms: list[float] = []
                lag_bytes: list[float] = []
                until = threading.Event()
                sampler = threading.Thread(target=sample_lag, args=(primary, until, lag_ms, lag_bytes))
                sampler.start()
                named = {("primary" if k == 0 else f"follower{k}"): node for k, node in enumerate(group)}
                result[f"{prefix}group_producers_msgs_s"] = measured_producers(named, primary, args, result, f"{prefix}group")
                until.set()
                sampler.join()
                if args.lone_seconds:
                    result[f"{prefix}group_lone_msgs_s"] = producers(primary, 1, args.lone_seconds)
                result[f"{prefix}lag_ms_p50"], result[f"{prefix}lag_ms_p99"] = percentile(lag_ms, 0.5), percentile(lag_ms, 0.99)
                result[f"{prefix}lag_bytes_p50"], result[f"{prefix}lag_bytes_p99"] = percentile(lag_bytes, 0.5), percentile(lag_bytes, 0.99)
            for node in group:
                node.stop()
        finally:
            for node in group:
                node.close()
    result["send_file_ratio"] = result["single_send_file_s"] / result["group_send_file_s"]
    result["producers_ratio"] = result["group_producers_msgs_s"] / result["single_producers_msgs_s"]
    if args.lone_seconds:
        result["lone_ratio"] = result["group_lone_msgs_s"] / result["single_lone_msgs_s"]
    if args.consume:
        result["consume_ratio"] = result["group_consume_msgs_s"] / result["single_consume_msgs_s"]
    if args.baseline is not None:
        result["baseline_send_file_ratio"] = result["single_send_file_s"] / result["baseline_group_send_file_s"]
        result["baseline_producers_ratio"] = result["baseline_group_producers_msgs_s"] / result["single_producers_msgs_s"]
        if args.lone_seconds:
            result["baseline_lone_ratio"] = result["baseline_group_lone_msgs_s"] / result["single_lone_msgs_s"]
        if args.consume:
            result["baseline_consume_ratio"] = result["baseline_group_consume_msgs_s"] / result["single_consume_msgs_s"]
    result["load_average"] = load_average()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--producers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lone-seconds", type=float, default=5.0, help="then one SYNC producer for this long against each (0: not)")
    parser.add_argument("--consume", type=int, default=10_000, help="then this many messages consumed from each (0: not)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--baseline", type=Path, metavar="DIR",
        help="also run the group with the rmqstore package found on this PYTHONPATH (another version), in the same rounds",
    )  # fmt: skip
    args = parser.parse_args()
    if args.baseline is not None and not any((args.baseline / "rmqstore" / "common" / "codec").glob("_speedups*.so")):
        # Built at install, not kept in git: a tree unpacked from git alone runs the
        # pure-Python fallbacks, and the comparison would measure that instead.
        parser.error(f"--baseline {args.baseline}: rmqstore/common/codec has no compiled _speedups module (copy or build it)")
    with tempfile.TemporaryDirectory(prefix="replication-bench-") as temp:
        work = Path(temp)
        jsonl = work / "messages.jsonl"
        write_file(jsonl, args.messages)
        rounds = [one_round(work / f"round-{n}", args, jsonl) for n in range(args.rounds)]
    document = {
        "command": "python benchmarks/replication_bench.py " + " ".join(sys.argv[1:]),
        "machine": machine_facts(REPO),
        "messages": args.messages,
        "producers": args.producers,
        "seconds": args.seconds,
        "rounds": rounds,
        "send_file_ratio_median": statistics.median(r["send_file_ratio"] for r in rounds),
        "producers_ratio_median": statistics.median(r["producers_ratio"] for r in rounds),
        **({"lone_ratio_median": statistics.median(r["lone_ratio"] for r in rounds)} if args.lone_seconds else {}),
        **({"consume_ratio_median": statistics.median(r["consume_ratio"] for r in rounds)} if args.consume else {}),
        **({
            "baseline": str(args.baseline),
            "baseline_send_file_ratio_median": statistics.median(r["baseline_send_file_ratio"] for r in rounds),
            "baseline_producers_ratio_median": statistics.median(r["baseline_producers_ratio"] for r in rounds),
            **({"baseline_lone_ratio_median": statistics.median(r["baseline_lone_ratio"] for r in rounds)} if args.lone_seconds else {}),
            **({"baseline_consume_ratio_median": statistics.median(r["baseline_consume_ratio"] for r in rounds)} if args.consume else {}),
        } if args.baseline is not None else {}),
    }
    text = json.dumps(document, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
