"""What the nodes' metrics cost a call: off (the default) and on, against a server
without the metrics interceptor at all.

Three server processes, each serving a query node over one prebuilt store and a writer
over a store of its own on one asyncio server (``AsyncServing``, as ``query serve`` and
``writer serve`` do):

* ``without``: the RPC metrics interceptor is left out of the server's chain, and no meter
  provider is installed: the floor;
* ``off``: the product as shipped with no ``OTEL_*`` variable: the interceptor hands every
  handler back, the instruments are the API's no-ops;
* ``on``: an SDK meter provider with an in-memory reader (recording, no export): every
  call timed into ``rpc.server.duration``, every append counted per topic.

A client in this process times Ping, QueueBounds, a key page and a one-message Send
against each, alternately, round after round, and prints each median and p99 and the
ratios of the medians to ``without``.

    .venv/bin/python benchmarks/metrics_cost.py [--rounds 5] [--calls 2000]
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
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc, writer_pb2, writer_pb2_grpc

KINDS = ("without", "off", "on")
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


SEND = ("Send", writer_pb2.SendRequest(message=messages_pb2.Message(topic="Metered", queue_id=0, body=b"x" * 100)))


def serve(kind: str, root: str, writer_root: str, ports: Any, stop: Any) -> None:
    from rmqstore.query.service import SERVICE_NAME, AsyncQueryServicer
    from rmqstore.query.view import StoreView
    from rmqstore.service import server
    from rmqstore.service.rpc_metrics import AsyncRpcMetricsInterceptor
    from rmqstore.writer.config import WriterConfig
    from rmqstore.writer.service import SERVICE_NAME as WRITER_SERVICE
    from rmqstore.writer.service import WriterServicer
    from rmqstore.writer.store import Writer

    if kind == "without":
        make_server = grpc.aio.server

        def without_metrics(*args: Any, interceptors: Any = (), **kwargs: Any) -> Any:
            kept = [i for i in interceptors if not isinstance(i, AsyncRpcMetricsInterceptor)]
            return make_server(*args, interceptors=kept, **kwargs)

        server.grpc.aio.server = without_metrics  # type: ignore[attr-defined]
    elif kind == "on":
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    view = StoreView(root, SIZES)
    writer = Writer(WriterConfig(store=writer_root, sizes=SIZES))
    servicer = WriterServicer(writer)

    def register(s: grpc.aio.Server) -> None:
        query_pb2_grpc.add_QueryServiceServicer_to_server(AsyncQueryServicer(view), s)
        writer_pb2_grpc.add_WriterServiceServicer_to_server(servicer, s)

    serving = server.AsyncServing(
        register, [SERVICE_NAME, WRITER_SERVICE], host="127.0.0.1", port=0, credentials=None, health_port=None
    )
    ports.put((kind, serving.port))
    stop.wait()
    serving.stop(None)
    servicer.close()
    writer.close()
    view.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per call kind, server and round")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    calls = {**{name: (query_pb2_grpc.QueryServiceStub, *call) for name, call in CALLS.items()}, "one-message Send": (writer_pb2_grpc.WriterServiceStub, *SEND)}
    with tempfile.TemporaryDirectory(prefix="metrics-cost-") as scratch:
        root = Path(scratch) / "store"
        build_store(root)
        stop = context.Event()
        ports: Any = context.Queue()
        servers = {
            kind: context.Process(target=serve, args=(kind, str(root), str(Path(scratch) / f"writer-{kind}"), ports, stop))
            for kind in KINDS
        }
        channels: dict[str, grpc.Channel] = {}
        try:
            for process in servers.values():
                process.start()
            for _ in KINDS:
                kind, port = ports.get(timeout=60)
                channels[kind] = grpc.insecure_channel(f"127.0.0.1:{port}")
            timings: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for kind in KINDS:
                    for name, (stub, method, request) in calls.items():
                        timings.setdefault((kind, name), []).extend(time_calls(stub(channels[kind]), method, request, args.calls))
        finally:
            for channel in channels.values():
                channel.close()
            stop.set()
            for process in servers.values():
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
    report: dict[str, Any] = {"command": " ".join(["benchmarks/metrics_cost.py", *sys.argv[1:]]), "calls": {}}
    for name in calls:
        row: dict[str, float] = {}
        for kind in KINDS:
            ordered = sorted(timings[(kind, name)])
            row[f"{kind}_p50_us"] = round(statistics.median(ordered) * 1e6, 1)
            row[f"{kind}_p99_us"] = round(ordered[int(len(ordered) * 0.99) - 1] * 1e6, 1)
        row["p50_ratio_off_to_without"] = round(row["off_p50_us"] / row["without_p50_us"], 3)
        row["p50_ratio_on_to_without"] = round(row["on_p50_us"] / row["without_p50_us"], 3)
        report["calls"][name] = row
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
