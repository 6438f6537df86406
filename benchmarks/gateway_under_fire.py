"""Issue 40's acceptance 2: a writer's send latency and memory under every hostile client
of the RocketMQ 5 gateway at once, measured in one run.

    .venv/bin/python benchmarks/gateway_under_fire.py [--sends N] [--loads watch,polls,repoll,greedy]
        [--elsewhere] [--large-answer-rate MIB_PER_S] [--out FILE.json]

A writer process on a fresh store in a temporary directory; its send p50/p99 (rmqstore.v1
Send of 100 bytes, one at a time, from this process) and resident memory measured alone,
then beside, each from a process of its own (tests/support/hostile_gateway.py):

* 2,048 unauthenticated health Watch streams;
* 500 idle ReceiveMessage long polls on a topic of their own;
* a group holding 65,536 messages in flight (12 h) whose two clients re-poll every 10 ms;
* two clients asking 100 messages of 4 MiB, by ReceiveMessage and PullMessage in turn.

With ``--elsewhere`` the hostile clients are aimed at a second writer process (seeded the
same), not at the one whose sends are timed: what the loads cost a send through the
machine alone (its cores, the kernel, loopback), the control the writer's own share is
read against.

Prints one JSON document (and writes it to --out): the figures and the targets (send p99
at most 2x alone, RSS growth at most 256 MiB). benchmarks/GATEWAY.md records runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import grpc  # noqa: E402
from support import gateway_load  # noqa: E402
from support.nodes import rss_bytes  # noqa: E402

from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc  # noqa: E402

RPC_TIMEOUT_S = 120.0
OPEN_TIMEOUT_S = 300.0
IN_FLIGHT = 65_536
BIG_MESSAGES = 100
BIG_BODY_BYTES = 4 * 1024 * 1024 - 1024
RSS_GROWTH_MAX_BYTES = 256 << 20
# Each hostile load: hostile_gateway.py's arguments.
LOADS = {
    "watch": ("watch", "2048"),
    "polls": ("polls", "500", "Idle", "idlers"),
    "repoll": ("repoll", "2", "Flight", "hoarders"),
    "greedy": ("greedy", "2", "Big", "greedy"),
}
P99_RATIO_MAX = 2.0


def start_writer(store: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    writer = subprocess.Popen(
        [sys.executable, "-m", "rmqstore.cli.main", "writer", "serve", "--store", str(store), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert writer.stdout is not None
    serving = json.loads(writer.stdout.readline())
    return writer, int(serving["port"])


def open_hostile(endpoint: str, *args: str) -> subprocess.Popen[bytes]:
    hostile, opened = gateway_load.open_hostile(endpoint, args, OPEN_TIMEOUT_S)
    print(f"hostile {' '.join(args)}: {opened}", file=sys.stderr)
    return hostile


def seed(channel: grpc.Channel) -> None:
    writer = writer_pb2_grpc.WriterServiceStub(channel)
    for name, queues in (("Idle", 8), ("Flight", 1), ("Big", 1)):
        writer.CreateTopic(writer_pb2.CreateTopicRequest(name=name, queue_count=queues), timeout=RPC_TIMEOUT_S)
    for i in range(BIG_MESSAGES):
        message = messages_pb2.Message(topic="Big", queue_id=0, body=bytes([i]) * BIG_BODY_BYTES)
        writer.Send(writer_pb2.SendRequest(message=message), timeout=RPC_TIMEOUT_S)
    gateway_load.hold_in_flight(channel, "Flight", "hoarders", IN_FLIGHT, RPC_TIMEOUT_S)


def sends(channel: grpc.Channel, count: int, pid: int) -> dict[str, float]:
    """``count`` sends one at a time: their p50 and p99 (ms) and the writer's peak RSS."""
    writer = writer_pb2_grpc.WriterServiceStub(channel)
    request = writer_pb2.SendRequest(message=messages_pb2.Message(topic="Busy", body=b"b" * 100))
    for _ in range(20):
        writer.Send(request, timeout=RPC_TIMEOUT_S)
    peak = [rss_bytes(pid)]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], rss_bytes(pid))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    timings = []
    for _ in range(count):
        started = time.perf_counter()
        writer.Send(request, timeout=RPC_TIMEOUT_S)
        timings.append(time.perf_counter() - started)
    done.set()
    watcher.join()
    timings.sort()
    return {
        "p50_ms": round(timings[len(timings) // 2] * 1000, 2),
        "p99_ms": round(timings[int(len(timings) * 0.99) - 1] * 1000, 2),
        "rss_peak_mib": round(peak[0] / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--loads", default=",".join(LOADS), help="the hostile loads to run (default: all four)")
    parser.add_argument("--large-answer-rate", metavar="MIB_PER_S", help="the writers' --large-answer-rate (default: theirs)")
    parser.add_argument("--elsewhere", action="store_true", help="aim the loads at a second writer (the control)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    loads = [load for load in args.loads.split(",") if load]
    if not loads or any(load not in LOADS for load in loads):
        parser.error(f"--loads: some of {','.join(LOADS)}")
    with tempfile.TemporaryDirectory(prefix="gateway-under-fire-") as scratch:
        extra = ("--large-answer-rate", args.large_answer_rate) if args.large_answer_rate is not None else ()
        writer, port = start_writer(Path(scratch) / "store", *extra)
        endpoint = f"127.0.0.1:{port}"
        channel = grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 64 << 20)])
        hostiles: list[subprocess.Popen[bytes]] = []
        target: subprocess.Popen[bytes] | None = None
        try:
            seed(channel)
            hostile_endpoint = endpoint
            if args.elsewhere:
                target, target_port = start_writer(Path(scratch) / "target", *extra)
                hostile_endpoint = f"127.0.0.1:{target_port}"
                with grpc.insecure_channel(hostile_endpoint) as target_channel:
                    seed(target_channel)
            time.sleep(2)  # the consumer groups' first flush of the 65,536 in flight is behind us
            alone = sends(channel, args.sends, writer.pid)
            rss_before = rss_bytes(writer.pid)
            for load in loads:
                hostiles.append(open_hostile(hostile_endpoint, *LOADS[load]))
            time.sleep(2)
            beside = sends(channel, args.sends, writer.pid)
            alive = all(hostile.poll() is None for hostile in hostiles)
        finally:
            for hostile in hostiles:
                gateway_load.stop_hostile(hostile)
            channel.close()
            for node in (writer, target):
                if node is not None:
                    node.terminate()
                    node.wait()
    growth_mib = round(beside["rss_peak_mib"] - rss_before / 2**20, 1)
    result: dict[str, Any] = {
        "loads": loads,
        "elsewhere": args.elsewhere,
        "large_answer_rate": args.large_answer_rate,
        "alone": alone,
        "beside": beside,
        "hostile_clients_alive": alive,
        "p99_ratio": round(beside["p99_ms"] / alone["p99_ms"], 2),
        "rss_growth_mib": growth_mib,
        "targets": {"p99_ratio_max": P99_RATIO_MAX, "rss_growth_mib_max": RSS_GROWTH_MAX_BYTES >> 20},
        "cpus": os.cpu_count(),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
