"""Send latency against the number of queues in the store.

    python benchmarks/queue_count_latency.py [--queues 9000] [--seconds 10] [--rounds 5] [--out benchmarks/results/queue_count_latency.json]

Two writers (ASYNC, the default policy, so the periodic flushes run as in production)
run at once and are measured in alternating windows: the baseline on a store of one topic of 4 queues, the
other on a store where ``--queues`` queues (topics of 1,000 queues, each queue written
once) sit idle beside it. A single producer sends one message per request to the 4-queue
topic for ``--seconds`` against each; the figures are each writer's p50 and p99 request
latency and their ratio to the baseline's. When the periodic flush opened and synced
every queue file under the append lock, 9,000 queues made p50 103 ms and p99 7.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

SIZE_ARGS = ["--commitlog-file-size", str(64 << 20), "--cq-file-units", "1000"]
TOPIC_QUEUES_MAX = 1000
TIMEOUT_S = 120.0


def start_writer(store: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_SDK_DISABLED"] = "true"
    with open(log, "ab") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rmqstore.cli.main", "writer", "serve", "--store", str(store), "--port", "0", *SIZE_ARGS],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    assert proc.stdout is not None
    event = json.loads(proc.stdout.readline())
    assert event["event"] == "serving", event
    return proc, int(event["port"])


def fill_queues(stub: writer_pb2_grpc.WriterServiceStub, queues: int) -> None:
    topic = 0
    while queues > 0:
        count = min(queues, TOPIC_QUEUES_MAX)
        name = f"Idle{topic}"
        stub.CreateTopic(writer_pb2.CreateTopicRequest(name=name, queue_count=count), timeout=TIMEOUT_S)
        batch = [messages_pb2.Message(topic=name, queue_id=q, body=b"idle") for q in range(count)]
        stub.SendBatch(writer_pb2.SendBatchRequest(messages=batch), timeout=TIMEOUT_S)
        queues -= count
        topic += 1


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def window(stub: writer_pb2_grpc.WriterServiceStub, seconds: float) -> list[float]:
    request = writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="Busy", body=b"x" * 100)])
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        stub.SendBatch(request, timeout=TIMEOUT_S)
        latencies.append(time.perf_counter() - started)
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    latencies = sorted(latencies)
    return {
        "requests": len(latencies),
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
        "max_ms": round(latencies[-1] * 1000, 3),
    }


def measure(root: Path, idle_queues: int, seconds: float, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Both writers run at once; their windows alternate, so a change in the machine's
    load falls on both."""
    processes = []
    try:
        stubs = []
        channels = []
        for name, idle in (("baseline", 0), ("many", idle_queues)):
            proc, port = start_writer(root / name, root / f"{name}.stderr")
            processes.append(proc)
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            channels.append(channel)
            stub = writer_pb2_grpc.WriterServiceStub(channel)
            stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Busy", queue_count=4), timeout=TIMEOUT_S)
            fill_queues(stub, idle)
            stubs.append(stub)
        baseline: list[float] = []
        many: list[float] = []
        for _ in range(rounds):
            baseline += window(stubs[0], seconds / rounds)
            many += window(stubs[1], seconds / rounds)
        for channel in channels:
            channel.close()
    finally:
        for proc in processes:
            proc.terminate()
            proc.wait(timeout=TIMEOUT_S)
            if proc.stdout is not None:
                proc.stdout.close()
    return summary(baseline), summary(many)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=9000)
    parser.add_argument("--seconds", type=float, default=10.0, help="per writer, over all rounds")
    parser.add_argument("--rounds", type=int, default=5, help="alternating windows per writer")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "queue_count_latency.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="queue-latency-") as scratch:
        baseline, many = measure(Path(scratch), args.queues, args.seconds, args.rounds)
    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "queues": args.queues,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "baseline_4_queues": baseline,
        "with_idle_queues": many,
        "p50_ratio": round(many["p50_ms"] / baseline["p50_ms"], 2),
        "p99_ratio": round(many["p99_ms"] / baseline["p99_ms"], 2),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
