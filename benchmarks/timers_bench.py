"""Timed messages on a writer process: how late they are received, and what pending ones cost.

Lateness: MESSAGES timed messages, due over SPREAD seconds from a start a few seconds ahead
(about MESSAGES / SPREAD due a second), are sent through RocketMQ 5's SendMessage (the
project's v2 stubs, 100 a request) before the first comes due; then a consumer thread
a queue long-polls the topic's queues (ReceiveMessage, batches of 256, acknowledging each batch).
The writer's own release lateness is read, after the run, from each stored copy's
TIMER_DEQUEUE_MS (a received message no longer carries it, as in Apache).
Lateness is receive time − due time, on the machine's one clock. Target: p99 ≤ 100 ms
(Apache's timer works to a precision of 1 s by default). A message received before its due
time is counted apart (there must be none).

Memory: PENDING timed messages due an hour ahead, sent through WriterService.SendStream
(columns, 1,000 a batch, TIMER_DELIVER_MS a property): the writer's anonymous memory
(RssAnon: its heap, not the mapped store files the kernel can drop) before the first and
after the last, and again after a restart, which rebuilds the wheel from the consume
queue. Target: ≤ 100 MB growth.

    python benchmarks/timers_bench.py [--messages 100000] [--spread 60] [--pending 1000000]
        [--out benchmarks/TIMERS.md]

With --out, the figures are also written as JSON to results/timers-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_common import Nodes, load_average, machine_facts, process_memory  # noqa: E402

from rmqstore.common.files.commitlog import CommitLog  # noqa: E402
from rmqstore.common.files.geometry import read_geometry  # noqa: E402
from rmqstore.rocketmq_v2 import definition_pb2 as v2  # noqa: E402
from rmqstore.rocketmq_v2 import service_pb2 as v2s  # noqa: E402
from rmqstore.rocketmq_v2 import service_pb2_grpc  # noqa: E402
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc  # noqa: E402

TOPIC = "TimerBench"
GROUP = v2.Resource(name="timer-bench")
QUEUES = 4
SEND_BATCH = 100
RECEIVE_BATCH = 256
# The first message is due this long after the sending starts: long enough for every
# message to be sent before then (500 a second assumed: the shared machine's worst seen).
LEAD_S = 8.0
SEND_RATE_FLOOR = 500
P99_TARGET_MS = 100.0
MEMORY_TARGET_MB = 100.0
PENDING_BATCH = 1000


def now_ms() -> int:
    return int(time.time() * 1000)


def timed(number: int, due_ms: int) -> v2.Message:
    system = v2.SystemProperties(
        message_id=f"B{number:08d}{uuid.uuid4().hex[:16]}",
        message_type=v2.DELAY,
        delivery_timestamp=timestamp_pb2.Timestamp(seconds=due_ms // 1000, nanos=(due_ms % 1000) * 1_000_000),
    )
    return v2.Message(topic=v2.Resource(name=TOPIC), body=f"{number} {due_ms}".encode(), system_properties=system)


def percentile(values: list[float], q: int) -> float:
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 1) if len(values) > 1 else values[0]


def release_lateness(store: Path) -> list[float]:
    """Each released copy's TIMER_DEQUEUE_MS (when the writer appended it) − its due time
    (in its body), read from the stopped writer's commit log."""
    geometry = read_geometry(str(store / "config"))
    assert geometry is not None, f"{store} has no geometry file"
    log = CommitLog(str(store / "commitlog"), geometry.commitlog_file_size_bytes)
    try:
        return [
            float(int(record.properties["TIMER_DEQUEUE_MS"]) - int(record.body.split()[1]))
            for record in log.records()
            if record.topic == TOPIC and "TIMER_DEQUEUE_MS" in record.properties
        ]
    finally:
        log.close()


def lateness(nodes: Nodes, work: Path, messages: int, spread_s: float) -> dict[str, Any]:
    writer = nodes.start("writer", work / "lateness")
    channel = grpc.insecure_channel(writer.endpoint)
    writer_pb2_grpc.WriterServiceStub(channel).CreateTopic(
        writer_pb2.CreateTopicRequest(name=TOPIC, queue_count=QUEUES, message_type="DELAY")
    )
    messaging = service_pb2_grpc.MessagingServiceStub(channel)
    first_due = now_ms() + int(max(LEAD_S, messages / SEND_RATE_FLOOR) * 1000)
    dues = [first_due + (n * int(spread_s * 1000)) // messages for n in range(messages)]
    late_ms: list[float] = []
    early: list[int] = []
    seen: set[int] = set()
    stop = threading.Event()

    lock = threading.Lock()

    def consume(queue: int) -> None:
        while not stop.is_set() and len(seen) < messages:
            request = v2s.ReceiveMessageRequest(
                group=GROUP,
                message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=queue),
                filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                batch_size=RECEIVE_BATCH,
                invisible_duration=duration_pb2.Duration(seconds=300),
                long_polling_timeout=duration_pb2.Duration(nanos=200_000_000),
            )
            entries = []
            for answer in messaging.ReceiveMessage(request, timeout=30):
                if not answer.HasField("message"):
                    continue
                at = now_ms()
                number, due = map(int, answer.message.body.split())
                with lock:
                    if number in seen:
                        continue
                    seen.add(number)
                    (early.append(number) if at < due else late_ms.append(at - due))
                entries.append(v2s.AckMessageEntry(
                    message_id=answer.message.system_properties.message_id,
                    receipt_handle=answer.message.system_properties.receipt_handle,
                ))  # fmt: skip
            if entries:
                messaging.AckMessage(v2s.AckMessageRequest(group=GROUP, topic=v2.Resource(name=TOPIC), entries=entries), timeout=30)

    consumers = [threading.Thread(target=consume, args=(queue,), daemon=True) for queue in range(QUEUES)]
    send_started = time.perf_counter()
    for start in range(0, messages, SEND_BATCH):
        batch = [timed(n, dues[n]) for n in range(start, min(start + SEND_BATCH, messages))]
        response = messaging.SendMessage(v2s.SendMessageRequest(messages=batch), timeout=30)
        assert response.status.code == v2.OK, response.status
    send_s = time.perf_counter() - send_started
    sent_before_first_due = now_ms() <= first_due
    # The consumer starts once everything is sent: the client's sends and receives share
    # this process, and a sender still running would slow its receives.
    for consumer in consumers:
        consumer.start()
    deadline = time.monotonic() + spread_s + max(LEAD_S, messages / SEND_RATE_FLOOR) + 120
    for consumer in consumers:
        consumer.join(timeout=max(deadline - time.monotonic(), 0))
    stop.set()
    memory = process_memory(writer.proc.pid)
    writer.stop()
    channel.close()
    released_late_ms = release_lateness(work / "lateness")
    return {
        "messages": messages,
        "spread_s": spread_s,
        "due_per_s": round(messages / spread_s),
        "send_s": round(send_s, 2),
        "all_sent_before_the_first_was_due": sent_before_first_due,
        "received": len(seen),
        "received_early": len(early),
        "lateness_ms": {
            "p50": percentile(late_ms, 50),
            "p90": percentile(late_ms, 90),
            "p99": percentile(late_ms, 99),
            "max": max(late_ms),
        } if late_ms else None,
        "released_lateness_ms": {
            "count": len(released_late_ms),
            "p50": percentile(released_late_ms, 50),
            "p99": percentile(released_late_ms, 99),
        } if released_late_ms else None,
        "writer_memory_kib_after": memory,
        "p99_target_ms": P99_TARGET_MS,
    }


def pending_memory(nodes: Nodes, work: Path, pending: int) -> dict[str, Any]:
    store = work / "pending"
    writer = nodes.start("writer", store)
    channel = grpc.insecure_channel(writer.endpoint)
    stub = writer_pb2_grpc.WriterServiceStub(channel)
    stub.CreateTopic(writer_pb2.CreateTopicRequest(name=TOPIC, queue_count=QUEUES))
    stub.SendBatch(writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic=TOPIC, body=b"warm-up")]))
    time.sleep(1)
    before = process_memory(writer.proc.pid)
    due = now_ms() + 3_600_000

    def batches():  # type: ignore[no-untyped-def]
        for start in range(0, pending, PENDING_BATCH):
            count = min(PENDING_BATCH, pending - start)
            columns = writer_pb2.MessageColumns(
                topics=[TOPIC],
                bodies=[b"x" * 100] * count,
                property_names=["TIMER_DELIVER_MS"] * count,
                property_values=[str(due + (start + i) % 3_000_000) for i in range(count)],
                property_counts=[1] * count,
            )
            yield writer_pb2.SendBatchRequest(columns=columns, compact_results=True)

    started = time.perf_counter()
    acked = sum(len(r.compact.sizes) for r in stub.SendStream(batches(), timeout=1800))
    send_s = time.perf_counter() - started
    time.sleep(2)  # the release thread takes the last units in
    after = process_memory(writer.proc.pid)
    writer.stop()
    channel.close()
    restarted = nodes.start("writer", store)
    recovered_s = restarted.seconds_to_serving
    time.sleep(1)
    after_restart = process_memory(restarted.proc.pid)
    restarted.stop()
    growth_mb = (after["RssAnon"] - before["RssAnon"]) / 1024
    return {
        "pending": pending,
        "acked": acked,
        "send_s": round(send_s, 1),
        "rss_anon_kib_before": before["RssAnon"],
        "rss_anon_kib_after": after["RssAnon"],
        "growth_mb": round(growth_mb, 1),
        "growth_bytes_per_timer": round((after["RssAnon"] - before["RssAnon"]) * 1024 / pending, 1),
        "restart_seconds_to_serving": round(recovered_s, 1),
        "rss_anon_kib_after_restart": after_restart["RssAnon"],
        "memory_target_mb": MEMORY_TARGET_MB,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--spread", type=float, default=60.0)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="timers-bench-") as temp, Nodes(Path(temp) / "logs") as nodes:
        work = Path(temp)
        report = {
            "machine": machine_facts(REPO),
            "load_before": load_average(),
            "lateness": lateness(nodes, work, args.messages, args.spread) if args.messages else None,
            "pending_memory": pending_memory(nodes, work, args.pending) if args.pending else None,
            "load_after": load_average(),
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        (args.out.parent / "results" / f"timers-{stamp}.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
