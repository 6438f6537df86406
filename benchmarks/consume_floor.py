"""The writer's CPU per consumed message when every call is as full as a proxy could make
it (benchmarks/CLUSTER.md, issue 36's acceptance 4): the floor under the consume half of
cluster mode's target.

A writer process on a fresh store holds MESSAGES small messages in one queue; THREADS of
our own v2 consumers of one group each receive batches of BATCH (ReceiveMessage) and
acknowledge each whole batch in one AckMessage, until every message is acknowledged. The
writer's CPU (user + system, from /proc) over that, per message, with its idle background
measured just before and taken out; and the same for a second way in the same round where
each message gets an AckMessage of its own (as the official clients acknowledge). Rounds
alternate the two ways on fresh writers.

    python benchmarks/consume_floor.py [--messages 20000] [--batch 32] [--threads 4] [--rounds 3] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_common import Nodes, in_threads, load_average, machine_facts
from cluster_bench import preload, receive_request
from rocketmq5_bench import create_topic, process_cpu_s

REPO = Path(__file__).resolve().parent.parent
TOPIC = "Floor"
GROUP = "FloorGroup"
IDLE_S = 2.0


def consume(endpoint: str, count: int, batch: int, threads: int, ack_whole_batch: bool) -> dict[str, int]:
    """Receive and acknowledge ``count`` messages; the calls made of each kind."""
    import grpc

    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s
    from rmqstore.rocketmq_v2 import service_pb2_grpc

    request = receive_request(GROUP, TOPIC, batch)
    group, topic = request.group, request.message_queue.topic
    calls = {"receives": 0, "acks": 0, "acknowledged": 0}
    lock = threading.Lock()
    failures: list[str] = []
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]  # generated

        def consumer() -> None:
            while not failures:
                with lock:
                    if calls["acknowledged"] >= count:
                        return
                    calls["receives"] += 1
                got = [a.message.system_properties for a in stub.ReceiveMessage(request, timeout=30) if a.HasField("message")]
                entries = [v2s.AckMessageEntry(message_id=s.message_id, receipt_handle=s.receipt_handle) for s in got]
                for part in [entries] if ack_whole_batch else [[e] for e in entries]:
                    if not part:
                        continue
                    answer = stub.AckMessage(v2s.AckMessageRequest(group=group, topic=topic, entries=part), timeout=30)
                    if answer.status.code != v2.OK:
                        failures.append(f"AckMessage answered {answer.status.code}: {answer.status.message}")
                        return
                    with lock:
                        calls["acks"] += 1
                        calls["acknowledged"] += len(part)

        in_threads(consumer, threads)
    if failures:
        raise RuntimeError(f"{len(failures)} acknowledgements failed, first: {failures[0]}")
    if calls["acknowledged"] != count:
        raise RuntimeError(f"{calls['acknowledged']} messages acknowledged, {count} stored")
    return calls


def one_way(nodes: Nodes, store: Path, args: argparse.Namespace, ack_whole_batch: bool) -> dict[str, Any]:
    writer = nodes.start("writer", store)
    try:
        create_topic(writer.endpoint, TOPIC)
        preload(writer.endpoint, TOPIC, args.messages)
        pid = writer.proc.pid
        idle_before = process_cpu_s(pid)
        time.sleep(IDLE_S)
        idle_per_s = (process_cpu_s(pid) - idle_before) / IDLE_S
        before, started = process_cpu_s(pid), time.perf_counter()
        calls = consume(writer.endpoint, args.messages, args.batch, args.threads, ack_whole_batch)
        seconds = time.perf_counter() - started
        cpu_s = process_cpu_s(pid) - before - idle_per_s * seconds
    finally:
        writer.stop()
    return {
        **calls,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(args.messages / seconds, 1),
        "writer_idle_cpu_ms_per_s": round(idle_per_s * 1000, 1),
        "writer_cpu_us_per_message": round(cpu_s / args.messages * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ways = {"batch_acks": True, "one_ack_a_message": False}
    rounds: list[dict[str, Any]] = []
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="consume-floor-") as temp, Nodes(Path(temp) / "logs") as nodes:
        for number in range(args.rounds):
            rounds.append({way: one_way(nodes, Path(temp) / f"{way}-{number}", args, whole) for way, whole in ways.items()})
    document = {
        "command": "python benchmarks/consume_floor.py " + " ".join(sys.argv[1:]),
        "machine": machine_facts(REPO),
        "messages": args.messages, "batch": args.batch, "threads": args.threads,
        "load_average_before": load_before, "load_average_after": load_average(),
        "rounds": rounds,
        **{
            f"{way}_writer_cpu_us_per_message_median": statistics.median(r[way]["writer_cpu_us_per_message"] for r in rounds)
            for way in ways
        },
    }  # fmt: skip
    text = json.dumps(document, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
