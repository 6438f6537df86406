"""The writer's CPU per message on the `rmqstore send --file` path.

A real ASYNC ``rmqstore writer serve`` process takes ``--batches`` pre-encoded
1,000-message SendBatchRequests (the workload of benchmarks/workload.py, encoded as
benchmarks/grpc_clients.py encodes them, ``compact_results`` on) on one SendStream
from this process. Measured per round: the writer's CPU seconds (user + system, all its
threads, from /proc/PID/stat just before the first send and just after the last ack)
per message, and the wall msgs/s. On a shared machine CPU per message is the figure to
trust; wall time moves with the neighbours.

``--python`` names the interpreter that runs the writer (its installed rmqstore is the
code measured); given more than once, the rounds alternate between them, so an old and a
new tree are compared in the same run under the same load. ``--shape`` (once per
``--python``, in the same order; ``messages`` where not given) is how that writer's
requests carry their messages: one Message each (``messages``) or as
``SendBatchRequest.columns`` (``columns``, every column given, as tests/support/columns.py
builds them for the writer's tests). Prints one JSON line: every round's figures,
the median per interpreter (and shape, where shapes are given), and the ratio of each
one's median CPU per message to the first's.

    python benchmarks/intake_probe.py [--batches 200] [--rounds 3] [--python OLD --python NEW]
        [--shape messages --shape columns]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import grpc  # noqa: E402
from bench_common import Nodes  # noqa: E402
from bench_grpc import create_topics  # noqa: E402
from grpc_clients import CHANNEL_OPTIONS, SEND_STREAM  # noqa: E402
from support.columns import as_columns_of  # noqa: E402
from workload import Workload, WorkloadSpec  # noqa: E402

from rmqstore.v1 import writer_pb2  # noqa: E402

BATCH_MESSAGES = 1000
RPC_TIMEOUT_S = 600.0
_CLOCK_TICKS_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid`` so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        text = handle.read()
    # The command name (field 2) may hold spaces: the fields after it follow its ')'.
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _CLOCK_TICKS_S


def encoded_batches(batches: int, body_bytes: int, shape: str = "messages") -> list[bytes]:
    workload = Workload(WorkloadSpec(batches * BATCH_MESSAGES, body_bytes))
    requests = []
    for indexes in workload.batches(BATCH_MESSAGES):
        messages = workload.proto_messages(indexes)
        if shape == "columns":
            request = writer_pb2.SendBatchRequest(columns=as_columns_of(messages), compact_results=True)
        else:
            request = writer_pb2.SendBatchRequest(messages=messages, compact_results=True)
        requests.append(request.SerializeToString())
    return requests


def one_round(python: str, payloads: list[bytes], work: Path, label: str) -> dict[str, Any]:
    """A fresh store and writer run by ``python``; the payloads sent on one SendStream."""
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    with Nodes(work / "logs") as nodes:
        writer = nodes.start("writer", store, "--flush", "async", python=python)
        create_topics(writer.endpoint)
        acked = 0
        with grpc.insecure_channel(writer.endpoint, options=CHANNEL_OPTIONS) as channel:
            call = channel.stream_stream(
                SEND_STREAM, request_serializer=None, response_deserializer=writer_pb2.SendBatchResponse.FromString
            )
            cpu_before = process_cpu_s(writer.proc.pid)
            started = time.perf_counter()
            for response in call(iter(payloads), timeout=RPC_TIMEOUT_S):
                acked += len(response.compact.uniq_keys)
            seconds = time.perf_counter() - started
            cpu_s = process_cpu_s(writer.proc.pid) - cpu_before
        writer.stop()
    messages = len(payloads) * BATCH_MESSAGES
    if acked != messages:
        raise RuntimeError(f"the writer acknowledged {acked} of {messages} messages")
    return {
        "python": label,
        "messages": messages,
        "writer_cpu_s": round(cpu_s, 3),
        "writer_cpu_us_per_msg": round(cpu_s / messages * 1e6, 3),
        "seconds": round(seconds, 3),
        "msgs_per_s": round(messages / seconds),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200, help="1,000-message requests a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per interpreter")
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--python", action="append", help="the writer's interpreter (repeat to alternate)")
    parser.add_argument(
        "--shape", action="append", choices=("messages", "columns"), help="each --python's request shape, in order"
    )
    parser.add_argument("--work", help="scratch directory (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    interpreters = args.python or [sys.executable]
    shapes = (args.shape or []) + ["messages"] * (len(interpreters) - len(args.shape or []))
    # Each writer's label: its interpreter, and with --shape its requests' shape.
    runs = [(python, shape, f"{python} {shape}" if args.shape else python) for python, shape in zip(interpreters, shapes)]
    pythons = [label for _, _, label in runs]
    payloads = {shape: encoded_batches(args.batches, args.body_bytes, shape) for shape in set(shapes)}
    rounds = []
    with tempfile.TemporaryDirectory(prefix="intake-probe-", dir=args.work) as scratch:
        for _ in range(args.rounds):
            for python, shape, label in runs:
                rounds.append(one_round(python, payloads[shape], Path(scratch), label))
    medians = {
        python: {
            key: statistics.median(r[key] for r in rounds if r["python"] == python)
            for key in ("writer_cpu_us_per_msg", "msgs_per_s")
        }
        for python in pythons
    }
    baseline = medians[pythons[0]]["writer_cpu_us_per_msg"]
    result = {
        "command": " ".join(["benchmarks/intake_probe.py", *(argv if argv is not None else sys.argv[1:])]),
        "loadavg_start": list(os.getloadavg()),
        "rounds": rounds,
        "medians": medians,
        "cpu_per_msg_vs_first": {
            python: round(m["writer_cpu_us_per_msg"] / baseline, 3) if baseline else None for python, m in medians.items()
        },
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
