"""What the writer's default caps on topics, queues and groups cost when clients fill
them (docs/security.md, "Caps on what clients make"), measured on one writer process.

    .venv/bin/python benchmarks/caps_cost.py [--topics 9000] [--queues-per-topic 10] [--groups 900] [--out FILE.json]

A writer on a fresh store in a temporary directory. Its send p99 (rmqstore.v1 Send of 100
bytes, one at a time) and resident memory are measured empty; then ``--topics`` topics of
``--queues-per-topic`` queues are made by CreateTopic (each timed), and ``--groups``
consumer groups each receive once (RocketMQ 5 ReceiveMessage, no long poll) from a topic
of their own, so that each keeps progress for every queue of it; one more group keeps
receiving and acknowledging meanwhile, so the progress table (every group's) is written
at each flush. The send p99 and memory are measured again: the figures are their ratio
and growth, the CreateTopic p50/p99, the store's disk use and the size of its config files (topics, offsets, groups' state).
Defaults: 90% of the default caps (--max-topics 10,000, --max-queues 100,000,
--max-groups 1,000).
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
from google.protobuf import duration_pb2  # noqa: E402
from support.nodes import rss_bytes  # noqa: E402

from rmqstore.rocketmq_v2 import definition_pb2 as v2  # noqa: E402
from rmqstore.rocketmq_v2 import service_pb2 as v2s  # noqa: E402
from rmqstore.rocketmq_v2 import service_pb2_grpc  # noqa: E402
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc  # noqa: E402

RPC_TIMEOUT_S = 120.0


def start_writer(store: Path) -> tuple[subprocess.Popen[bytes], int]:
    writer = subprocess.Popen(
        [sys.executable, "-m", "rmqstore.cli.main", "writer", "serve", "--store", str(store), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert writer.stdout is not None
    return writer, int(json.loads(writer.stdout.readline())["port"])


def disk_kib(store: Path) -> int:
    return int(subprocess.run(["du", "-sk", str(store)], capture_output=True, text=True, check=True).stdout.split()[0])


def percentile(timings: list[float], share: float) -> float:
    ordered = sorted(timings)
    return round(ordered[max(0, int(len(ordered) * share) - 1)] * 1000, 2)


def sends(writer: Any, count: int) -> dict[str, float]:
    request = writer_pb2.SendRequest(message=messages_pb2.Message(topic="Busy", body=b"b" * 100))
    timings = []
    for _ in range(count):
        started = time.perf_counter()
        writer.Send(request, timeout=RPC_TIMEOUT_S)
        timings.append(time.perf_counter() - started)
    return {"p50_ms": percentile(timings, 0.5), "p99_ms": percentile(timings, 0.99)}


def receive(messaging: Any, group: str, topic: str) -> list[v2s.ReceiveMessageResponse]:
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=32,
        invisible_duration=duration_pb2.Duration(seconds=30),
        long_polling_timeout=duration_pb2.Duration(seconds=0),
    )
    return list(messaging.ReceiveMessage(request, timeout=RPC_TIMEOUT_S))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=9_000)
    parser.add_argument("--queues-per-topic", type=int, default=10)
    parser.add_argument("--groups", type=int, default=900)
    parser.add_argument("--sends", type=int, default=1000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="caps-cost-") as scratch:
        store = Path(scratch) / "store"
        process, port = start_writer(store)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        writer = writer_pb2_grpc.WriterServiceStub(channel)
        messaging = service_pb2_grpc.MessagingServiceStub(channel)
        stop = threading.Event()
        try:
            writer.CreateTopic(writer_pb2.CreateTopicRequest(name="Busy", queue_count=1), timeout=RPC_TIMEOUT_S)
            empty = sends(writer, args.sends)
            rss_empty = rss_bytes(process.pid)
            disk_empty = disk_kib(store)
            creates = []
            for i in range(args.topics):
                started = time.perf_counter()
                writer.CreateTopic(writer_pb2.CreateTopicRequest(name=f"T{i}", queue_count=args.queues_per_topic), timeout=RPC_TIMEOUT_S)
                creates.append(time.perf_counter() - started)
            rss_topics = rss_bytes(process.pid)
            for i in range(args.groups):
                receive(messaging, f"G{i}", f"T{i % args.topics}")
            rss_groups = rss_bytes(process.pid)

            def churn() -> None:
                # One group's progress moves at every flush, so the whole table is written.
                feed = writer_pb2.SendRequest(message=messages_pb2.Message(topic="T0", queue_id=0, body=b"c"))
                while not stop.is_set():
                    writer.Send(feed, timeout=RPC_TIMEOUT_S)
                    for answer in receive(messaging, "churn", "T0"):
                        if answer.HasField("message"):
                            ack = v2s.AckMessageRequest(
                                group=v2.Resource(name="churn"),
                                topic=v2.Resource(name="T0"),
                                entries=[v2s.AckMessageEntry(message_id=answer.message.system_properties.message_id,
                                                             receipt_handle=answer.message.system_properties.receipt_handle)],
                            )  # fmt: skip
                            messaging.AckMessage(ack, timeout=RPC_TIMEOUT_S)
                    time.sleep(0.05)

            churner = threading.Thread(target=churn, daemon=True)
            churner.start()
            time.sleep(2)
            full = sends(writer, args.sends)
            stop.set()
            churner.join()
            disk_full = disk_kib(store)
            config_kib = sum(path.stat().st_size for path in (store / "config").iterdir() if path.is_file()) / 1024
            result = {
                "topics": args.topics,
                "queues": args.topics * args.queues_per_topic,
                "groups": args.groups,
                "send_empty": empty,
                "send_full": full,
                "p99_ratio": round(full["p99_ms"] / empty["p99_ms"], 2),
                "create_topic_p50_ms": percentile(creates, 0.5),
                "create_topic_p99_ms": percentile(creates, 0.99),
                "rss_empty_mib": round(rss_empty / 2**20, 1),
                "rss_topics_growth_mib": round((rss_topics - rss_empty) / 2**20, 1),
                "rss_groups_growth_mib": round((rss_groups - rss_topics) / 2**20, 1),
                "store_disk_growth_mib": round((disk_full - disk_empty) / 1024, 1),
                "config_files_kib": round(config_kib, 1),
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
            }
        finally:
            stop.set()
            channel.close()
            process.terminate()
            process.wait()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
