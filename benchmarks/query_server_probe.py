"""What the query node's asyncio server costs a lookup, against grpc's threaded server.

The query node serves on grpc's asyncio server so that idle and stalled streams hold no
thread (docs/security.md). This probe measures what that costs a call: one store, two
server processes over it, the threaded one (``QueryServicer`` on ``start_server``, what
``query serve`` ran before) and the asyncio one (``AsyncQueryServicer`` on
``AsyncServing``, what it runs now), and a client in this process timing Ping, QueueBounds
and a key page against each, alternately, round after round. It prints each median and
p99 and the asyncio/threaded ratio of the medians.

    .venv/bin/python benchmarks/query_server_probe.py [--rounds 5] [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from rmqstore.common.files.store import StoreSizes
from rmqstore.v1 import query_pb2, query_pb2_grpc

SIZES = StoreSizes(commitlog_file_size_bytes=8 * 1024 * 1024, cq_file_units=10_000, index_slots=4099, index_entries=20_000)


def build_store(root: Path) -> None:
    from rmqstore.writer.config import WriterConfig
    from rmqstore.writer.store import Writer
    from rmqstore.writer.validate import MessageInput

    writer = Writer(WriterConfig(store=str(root), sizes=SIZES))
    try:
        writer.append([MessageInput(topic="TopicA", body=b"x" * 200, keys=("k",), queue_id=0) for _ in range(500)])
        writer.flush_thoroughly()
    finally:
        writer.close()


def serve(kind: str, root: str, ports: Any, stop: Any) -> None:
    from rmqstore.query.service import SERVICE_NAME, AsyncQueryServicer, QueryServicer
    from rmqstore.query.view import StoreView
    from rmqstore.service.server import AsyncServing, start_server

    view = StoreView(root, SIZES)
    if kind == "threaded":
        server, port, _ = start_server(
            lambda s: query_pb2_grpc.add_QueryServiceServicer_to_server(QueryServicer(view), s), [SERVICE_NAME]
        )
        ports.put(port)
        stop.wait()
        server.stop(None).wait()
    else:
        serving = AsyncServing(
            lambda s: query_pb2_grpc.add_QueryServiceServicer_to_server(AsyncQueryServicer(view), s),
            [SERVICE_NAME], host="127.0.0.1", port=0, credentials=None, health_port=None,
        )  # fmt: skip
        ports.put(serving.port)
        stop.wait()
        serving.stop(None)
    view.close()


CALLS = {
    "Ping": ("Ping", query_pb2.PingRequest()),
    "QueueBounds": ("QueueBounds", query_pb2.QueueBoundsRequest(topic="TopicA", queue_id=0)),
    "key page of 8": ("QueryByKey", query_pb2.QueryByKeyRequest(topic="TopicA", key="k", page_size=8)),
}


def time_calls(stub: Any, method: str, request: Any, calls: int) -> list[float]:
    call = getattr(stub, method)
    for _ in range(50):
        call(request, timeout=10)
    timings = []
    for _ in range(calls):
        started = time.perf_counter()
        call(request, timeout=10)
        timings.append(time.perf_counter() - started)
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per lookup, server and round")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="query-server-probe-") as scratch:
        root = Path(scratch) / "store"
        build_store(root)
        stop = context.Event()
        ports: Any = context.Queue()
        servers = {kind: context.Process(target=serve, args=(kind, str(root), ports, stop)) for kind in ("threaded", "asyncio")}
        channels: dict[str, grpc.Channel] = {}
        try:
            for kind, process in servers.items():
                process.start()
                channels[kind] = grpc.insecure_channel(f"127.0.0.1:{ports.get(timeout=60)}")
            stubs = {kind: query_pb2_grpc.QueryServiceStub(channel) for kind, channel in channels.items()}
            timings: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for kind in ("threaded", "asyncio"):
                    for name, (method, request) in CALLS.items():
                        timings.setdefault((kind, name), []).extend(time_calls(stubs[kind], method, request, args.calls))
        finally:
            for channel in channels.values():
                channel.close()
            stop.set()
            for process in servers.values():
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
    report: dict[str, Any] = {"command": " ".join(["benchmarks/query_server_probe.py", *sys.argv[1:]]), "lookups": {}}
    for name in CALLS:
        row: dict[str, float] = {}
        for kind in ("threaded", "asyncio"):
            ordered = sorted(timings[(kind, name)])
            row[f"{kind}_p50_us"] = round(statistics.median(ordered) * 1e6, 1)
            row[f"{kind}_p99_us"] = round(ordered[int(len(ordered) * 0.99) - 1] * 1e6, 1)
        row["p50_ratio_asyncio_to_threaded"] = round(row["asyncio_p50_us"] / row["threaded_p50_us"], 2)
        report["lookups"][name] = row
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
