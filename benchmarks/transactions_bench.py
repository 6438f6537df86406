"""What a committed transaction costs a writer process, against a normal send.

One writer (``rmqstore writer serve``, default flush and check settings), two topics (NORMAL
and TRANSACTION, 4 queues each). One caller — this script, THREADS threads of the project's
v2 stubs, one message of 100 bytes a request — alternates ROUNDS rounds of MESSAGES normal
sends (SendMessage) with ROUNDS rounds of MESSAGES committed transactions (SendMessage of a
TRANSACTION message, then EndTransaction COMMIT with its receipt's transaction id). The
writer's CPU (user + system, /proc/PID/stat) is read before and after each round. Target: a
committed transaction (half message, committed copy and op record: three records and two
calls) costs at most 2.5 times a normal send.

    python benchmarks/transactions_bench.py [--messages 2000] [--rounds 3] [--threads 8]
        [--out benchmarks/TIMERS.md]

With --out, the figures are also written as JSON to results/transactions-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_common import Nodes, load_average, machine_facts  # noqa: E402

from rmqstore.rocketmq_v2 import definition_pb2 as v2  # noqa: E402
from rmqstore.rocketmq_v2 import service_pb2 as v2s  # noqa: E402
from rmqstore.rocketmq_v2 import service_pb2_grpc  # noqa: E402
from rmqstore.v1 import writer_pb2, writer_pb2_grpc  # noqa: E402

PLAIN = "PlainBench"
TRANSACTIONS = "TxBench"
BODY = b"x" * 100
RATIO_TARGET = 2.5
RPC_TIMEOUT_S = 30.0


def process_cpu_s(pid: int) -> float:
    """User and system CPU a live process has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def message(topic: str, kind: int) -> v2.Message:
    system = v2.SystemProperties(message_id=uuid.uuid4().hex.upper(), message_type=kind)  # type: ignore[arg-type]
    return v2.Message(topic=v2.Resource(name=topic), body=BODY, system_properties=system)


def plain(stub: service_pb2_grpc.MessagingServiceStub) -> None:
    answer = stub.SendMessage(v2s.SendMessageRequest(messages=[message(PLAIN, v2.NORMAL)]), timeout=RPC_TIMEOUT_S)
    if answer.status.code != v2.OK:
        raise RuntimeError(f"SendMessage: {answer.status}")


def committed(stub: service_pb2_grpc.MessagingServiceStub) -> None:
    half = message(TRANSACTIONS, v2.TRANSACTION)
    sent = stub.SendMessage(v2s.SendMessageRequest(messages=[half]), timeout=RPC_TIMEOUT_S)
    if sent.status.code != v2.OK:
        raise RuntimeError(f"SendMessage: {sent.status}")
    entry = sent.entries[0]
    end = v2s.EndTransactionRequest(
        topic=v2.Resource(name=TRANSACTIONS), message_id=entry.message_id, transaction_id=entry.transaction_id,
        resolution=v2.COMMIT, source=v2.SOURCE_CLIENT,
    )  # fmt: skip
    ended = stub.EndTransaction(end, timeout=RPC_TIMEOUT_S)
    if ended.status.code != v2.OK:
        raise RuntimeError(f"EndTransaction: {ended.status}")


def round_of(stub: service_pb2_grpc.MessagingServiceStub, call: Callable[[Any], None], messages: int, threads: int, pid: int) -> dict[str, float]:
    left = [messages]
    lock = threading.Lock()
    failures: list[BaseException] = []

    def work() -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            try:
                call(stub)
            except BaseException as error:  # reported after the round
                failures.append(error)
                return

    cpu_before, started = process_cpu_s(pid), time.perf_counter()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds, cpu = time.perf_counter() - started, process_cpu_s(pid) - cpu_before
    if failures:
        raise failures[0]
    return {"seconds": round(seconds, 2), "writer_cpu_s": round(cpu, 2), "cpu_us_per_message": round(cpu / messages * 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="transactions-bench-") as temp, Nodes(Path(temp) / "logs") as nodes:
        writer = nodes.start("writer", Path(temp) / "store")
        channel = grpc.insecure_channel(writer.endpoint)
        admin = writer_pb2_grpc.WriterServiceStub(channel)
        admin.CreateTopic(writer_pb2.CreateTopicRequest(name=PLAIN, queue_count=4, message_type="NORMAL"))
        admin.CreateTopic(writer_pb2.CreateTopicRequest(name=TRANSACTIONS, queue_count=4, message_type="TRANSACTION"))
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for _ in range(50):  # warm both paths
            plain(stub)
            committed(stub)
        load_before = load_average()
        rounds: dict[str, list[dict[str, float]]] = {"normal": [], "committed_transaction": []}
        for _ in range(args.rounds):
            rounds["normal"].append(round_of(stub, plain, args.messages, args.threads, writer.proc.pid))
            rounds["committed_transaction"].append(round_of(stub, committed, args.messages, args.threads, writer.proc.pid))
        channel.close()
        writer.stop()
    normal = statistics.median(r["cpu_us_per_message"] for r in rounds["normal"])
    transaction = statistics.median(r["cpu_us_per_message"] for r in rounds["committed_transaction"])
    report = {
        "machine": machine_facts(REPO),
        "load_before": load_before,
        "load_after": load_average(),
        "messages_per_round": args.messages,
        "threads": args.threads,
        "rounds": rounds,
        "median_cpu_us_per_message": {"normal": normal, "committed_transaction": transaction},
        "ratio": round(transaction / normal, 2),
        "ratio_target": RATIO_TARGET,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        (args.out.parent / "results" / f"transactions-{stamp}.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
