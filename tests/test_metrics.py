"""The nodes' metrics as an operator receives them: real writer and query processes export
to a real OTLP gRPC receiver in this process (opentelemetry-proto's MetricsService on
127.0.0.1, port 0) and a writer serves a real Prometheus scrape endpoint; names, units,
attributes and bucket bounds are asserted as they arrive. Bad --metrics-port and exporter
settings stop a node with one clear error."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from support.cli import run
from support.nodes import Nodes
from support.stores import SIZE_ARGS
from support.telemetry import collected, metric_reader
from support.wait import clock_past, wait_until

from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.metrics import DURATION_BOUNDS_MS, DURATION_BOUNDS_S
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc, writer_pb2, writer_pb2_grpc

WAIT_S = 30.0  # for an export that is due every 300 ms
TOPIC = "Metered"


@dataclass(frozen=True)
class Point:
    service: str  # the resource's service.name
    name: str
    unit: str
    kind: str  # sum, gauge or histogram
    attributes: dict[str, Any]
    point: Any  # the OTLP data point
    received: int  # the order of arrival


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


class Receiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP metrics receiver keeping every data point it is sent."""

    def __init__(self) -> None:
        self.points: list[Point] = []
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        with self._lock:
            for resource in request.resource_metrics:
                service = {a.key: _value(a.value) for a in resource.resource.attributes}.get("service.name", "")
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            attributes = {a.key: _value(a.value) for a in point.attributes}
                            self.points.append(Point(service, metric.name, metric.unit, kind, attributes, point, len(self.points)))
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def latest(self, service: str, name: str, **attributes: Any) -> Point | None:
        """The newest point of ``name`` from ``service`` whose attributes include ``attributes``
        (cumulative temporality: the newest holds everything so far)."""
        with self._lock:
            found = [
                p for p in self.points
                if p.service == service and p.name == name and attributes.items() <= p.attributes.items()
            ]  # fmt: skip
        return found[-1] if found else None

    def wait_for(self, service: str, name: str, done: Any = lambda point: True, **attributes: Any) -> Point:
        def arrived() -> Point | None:
            point = self.latest(service, name, **attributes)
            return point if point is not None and done(point) else None

        return wait_until(arrived, WAIT_S, f"{name} {attributes} from {service} as expected", interval_s=0.1)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = Receiver()
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(None)


def otlp_metrics_only(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    """The nodes' environment: metrics to the receiver every 300 ms, nothing else exported."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "300")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")


def bucket_of(bounds: list[float], value: float) -> int:
    """The index of the bucket holding ``value`` (OTLP: bucket i is (bounds[i-1], bounds[i]])."""
    return next((i for i, bound in enumerate(bounds) if value <= bound), len(bounds))


def test_writer_and_query_metrics_over_otlp(
    nodes: Nodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receiver: tuple[Receiver, int]
) -> None:
    points, port = receiver
    otlp_metrics_only(monkeypatch, port)
    store = tmp_path / "store"
    writer = nodes.start("writer", store, "--flush", "sync", *SIZE_ARGS, env=dict(os.environ))
    channel = grpc.insecure_channel(writer.endpoint)
    stub = writer_pb2_grpc.WriterServiceStub(channel)
    # One-message appends, each timed by the client: the server's duration of each is
    # within its round trip.
    round_trips_s = []
    for n in range(20):
        started = time.perf_counter()
        stub.Send(writer_pb2.SendRequest(message=messages_pb2.Message(topic=TOPIC, body=b"m%d" % n, keys=[f"k{n}"])), timeout=10)
        round_trips_s.append(time.perf_counter() - started)
    other = stub.SendBatch(
        writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="Other", body=bytes(50))] * 3 + [messages_pb2.Message(topic=TOPIC, body=b"x")]),
        timeout=10,
    ).results
    with pytest.raises(grpc.RpcError) as refused:
        stub.Send(writer_pb2.SendRequest(), timeout=10)  # no message
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    gateway = service_pb2_grpc.MessagingServiceStub(channel)
    route = gateway.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name=TOPIC)), timeout=10)
    assert route.status.code == v2.Code.OK
    end_offset = other[-1].commitlog_offset + other[-1].size  # the last record's end

    # Appends per topic, in messages and commit log bytes.
    sizes = {TOPIC: sum(a.size for a in other if a.topic == TOPIC), "Other": sum(a.size for a in other if a.topic == "Other")}
    messages = points.wait_for("rmqstore-writer", "rmqstore.writer.messages", lambda p: p.point.as_int == 21, **{"messaging.destination.name": TOPIC})
    assert (messages.unit, messages.kind, messages.attributes) == ("{message}", "sum", {"messaging.destination.name": TOPIC})
    assert messages.point.as_int == 21
    assert points.latest("rmqstore-writer", "rmqstore.writer.messages", **{"messaging.destination.name": "Other"}).point.as_int == 3
    sent_bytes = points.wait_for("rmqstore-writer", "rmqstore.writer.bytes", lambda p: p.point.as_int == sizes["Other"], **{"messaging.destination.name": "Other"})
    assert sent_bytes.unit == "By"
    topic_bytes = points.latest("rmqstore-writer", "rmqstore.writer.bytes", **{"messaging.destination.name": TOPIC}).point.as_int
    assert topic_bytes + sizes["Other"] == end_offset  # every byte of the commit log, by topic

    # The append histogram: seconds, the explicit bounds, one count per request; no
    # server duration exceeds its client's round trip, so for every bound at least as
    # many appends as round trips fall below it.
    append = points.wait_for("rmqstore-writer", "rmqstore.writer.append.duration", lambda p: p.point.count == 21)
    assert (append.unit, append.kind, list(append.point.explicit_bounds)) == ("s", "histogram", list(DURATION_BOUNDS_S))
    counts = list(append.point.bucket_counts)
    assert sum(counts) == 21 and len(counts) == len(DURATION_BOUNDS_S) + 1
    for i, bound in enumerate(DURATION_BOUNDS_S):
        client_below = sum(1 for r in round_trips_s if r <= bound)
        assert sum(counts[: i + 1]) >= client_below, (bound, counts, sorted(round_trips_s))
    assert 0 < append.point.sum <= sum(round_trips_s) + 0.5  # the batch's own round trip is not counted here

    # Every SYNC append waited for an fsync: timed, in seconds, with the same bounds.
    fsync = points.wait_for("rmqstore-writer", "rmqstore.writer.fsync.duration", lambda p: p.point.count >= 1)
    assert (fsync.unit, list(fsync.point.explicit_bounds)) == ("s", list(DURATION_BOUNDS_S))
    assert 1 <= fsync.point.count <= 22

    # rpc.server.duration per method, milliseconds, the RPC conventions' attributes,
    # the RocketMQ 5 gateway's calls included; a refused call carries its status.
    def rpc(service: str, method: str, code: int) -> Point:
        return points.wait_for(
            "rmqstore-writer", "rpc.server.duration", **{"rpc.system": "grpc", "rpc.service": service, "rpc.method": method, "rpc.grpc.status_code": code}
        )

    sends = rpc("rmqstore.v1.WriterService", "Send", 0)
    assert (sends.unit, sends.kind, list(sends.point.explicit_bounds)) == ("ms", "histogram", list(DURATION_BOUNDS_MS))
    assert sends.point.count == 20
    assert sends.point.sum <= sum(round_trips_s) * 1000  # milliseconds, each within its round trip
    assert rpc("rmqstore.v1.WriterService", "Send", grpc.StatusCode.INVALID_ARGUMENT.value[0]).point.count == 1
    assert rpc("rmqstore.v1.WriterService", "SendBatch", 0).point.count == 1
    assert rpc("apache.rocketmq.v2.MessagingService", "QueryRoute", 0).point.count == 1

    # The writer's gauges: nothing waits for dispatch, the disk is in use.
    store_attr = {"rmqstore.store": str(store)}
    lag = points.wait_for("rmqstore-writer", "rmqstore.writer.dispatch.lag", **store_attr)
    assert (lag.unit, lag.kind, lag.point.as_int) == ("By", "gauge", 0)
    unflushed = points.wait_for("rmqstore-writer", "rmqstore.writer.unflushed", **store_attr)
    assert unflushed.point.as_int == 0  # SYNC: acknowledged means fsynced
    disk = points.wait_for("rmqstore-writer", "rmqstore.writer.disk.utilization", **store_attr)
    assert disk.unit == "1" and 0 < disk.point.as_double <= 1
    server_port = {"server.port": writer.serving["port"]}
    streams = points.wait_for("rmqstore-writer", "rmqstore.rpc.streams.open", **server_port)
    assert (streams.unit, streams.point.as_int) == ("{stream}", 0)

    # A stream held open shows in the gauge, and counts as one call from start to end.
    def one_batch_then_wait() -> Iterator[writer_pb2.SendBatchRequest]:
        yield writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic="Streamed", body=b"s")])
        points.wait_for("rmqstore-writer", "rmqstore.rpc.streams.open", lambda p: p.point.as_int == 1, **server_port)

    streamed = [ack for response in stub.SendStream(one_batch_then_wait(), timeout=WAIT_S) for ack in response.results]
    assert [ack.topic for ack in streamed] == ["Streamed"]
    points.wait_for("rmqstore-writer", "rmqstore.rpc.streams.open", lambda p: p.point.as_int == 0, **server_port)
    assert rpc("rmqstore.v1.WriterService", "SendStream", 0).point.count == 1
    end_offset = streamed[-1].commitlog_offset + streamed[-1].size

    # A query node started now shows everything; what the writer appends next it
    # shows only at its next lookup: the lag gauges say how far behind it is.
    query = nodes.start("query", store, env=dict(os.environ))
    points.wait_for("rmqstore-query", "rmqstore.query.lag", lambda p: p.point.as_int == 0, **store_attr)
    clock_past(streamed[-1].store_timestamp_ms)  # a later store time than the node's newest message
    later = stub.SendBatch(writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic=TOPIC, body=bytes(200))] * 4), timeout=10).results
    behind = later[-1].commitlog_offset + later[-1].size - end_offset
    query_lag = points.wait_for("rmqstore-query", "rmqstore.query.lag", lambda p: p.point.as_int > 0, **store_attr)
    assert (query_lag.unit, query_lag.point.as_int) == ("By", behind)
    lag_time = points.wait_for("rmqstore-query", "rmqstore.query.lag.time", lambda p: p.point.as_int > 0, **store_attr)
    assert lag_time.unit == "ms" and 10 <= lag_time.point.as_int < 60_000
    staleness = points.wait_for("rmqstore-query", "rmqstore.query.staleness", **store_attr)
    assert staleness.unit == "ms" and 0 <= staleness.point.as_double < 60_000

    # Lookups: their duration per kind, and their RPCs.
    with grpc.insecure_channel(query.endpoint) as query_channel:
        lookups = query_pb2_grpc.QueryServiceStub(query_channel)
        found = lookups.QueryByKey(query_pb2.QueryByKeyRequest(topic=TOPIC, key="k3", page_size=5), timeout=10)
        assert [m.body for m in found.messages] == [b"m3"]
        with pytest.raises(grpc.RpcError) as missing:
            lookups.QueryByMsgId(query_pb2.QueryByMsgIdRequest(msg_id="00" * 16), timeout=10)
        lookup_code = missing.value.code().value[0]
    by_key = points.wait_for("rmqstore-query", "rmqstore.query.duration", **{"rmqstore.lookup": "key"})
    assert (by_key.unit, by_key.attributes, by_key.point.count, list(by_key.point.explicit_bounds)) == (
        "s", {"rmqstore.lookup": "key"}, 1, list(DURATION_BOUNDS_S),
    )  # fmt: skip
    assert points.wait_for("rmqstore-query", "rmqstore.query.duration", **{"rmqstore.lookup": "msg_id"}).point.count == 1
    by_key_rpc = points.wait_for(
        "rmqstore-query", "rpc.server.duration",
        **{"rpc.service": "rmqstore.v1.QueryService", "rpc.method": "QueryByKey", "rpc.grpc.status_code": 0},
    )  # fmt: skip
    assert (by_key_rpc.unit, by_key_rpc.point.count) == ("ms", 1)
    assert points.wait_for(
        "rmqstore-query", "rpc.server.duration", **{"rpc.method": "QueryByMsgId", "rpc.grpc.status_code": lookup_code}
    ).point.count == 1
    channel.close()
    query.stop()
    writer.stop()


@dataclass
class Added:
    """What a histogram gained between two collections."""

    explicit_bounds: list[float]
    bucket_counts: list[int]
    count: int
    sum: float


def histogram_added(before: dict[str, list[Any]], after: dict[str, list[Any]], name: str) -> Added:
    [now] = [p for p in after[name] if not p.attributes]
    then = next((p for p in before.get(name, []) if not p.attributes), None)
    if then is None:
        return Added(list(now.explicit_bounds), list(now.bucket_counts), now.count, now.sum)
    return Added(
        list(now.explicit_bounds),
        [a - b for a, b in zip(now.bucket_counts, then.bucket_counts)],
        now.count - then.count,
        now.sum - then.sum,
    )


def test_the_rpc_interceptor_hands_handlers_back_untouched_without_a_meter_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metrics off: the call runs the handler as registered (no wrapper, no timing); with an
    SDK meter provider it runs a wrapper."""
    import asyncio
    from types import SimpleNamespace

    from opentelemetry import metrics as api
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.sdk.metrics import MeterProvider

    from rmqstore.service.rpc_metrics import AsyncRpcMetricsInterceptor

    async def ping(request: Any, context: Any) -> Any:
        return request

    handler = grpc.unary_unary_rpc_method_handler(ping)
    details = SimpleNamespace(method="/rmqstore.v1.QueryService/Ping")
    interceptor = AsyncRpcMetricsInterceptor()

    async def continuation(_: Any) -> Any:
        return handler

    monkeypatch.setattr(api, "get_meter_provider", NoOpMeterProvider)
    assert asyncio.run(interceptor.intercept_service(continuation, details)) is handler
    monkeypatch.setattr(api, "get_meter_provider", lambda: MeterProvider())
    timed = asyncio.run(interceptor.intercept_service(continuation, details))
    assert timed is not handler and timed.unary_unary is not ping


def test_a_one_millisecond_append_lands_in_the_bucket_above_one_millisecond(tmp_path: Path) -> None:
    """The writer's recording itself, of appends started 1 ms ago: (1 ms, 2 ms], not the
    SDK's default first bucket (and the flush between them, of 0 bytes the second time,
    records one fsync)."""
    from rmqstore.writer.config import WriterConfig
    from rmqstore.writer.metrics import WriterMetrics
    from rmqstore.writer.store import Writer
    from rmqstore.writer.validate import MessageInput

    reader = metric_reader()  # cumulative, shared by this process's tests: compared before and after
    before = collected(reader)
    writer = Writer(WriterConfig(store=str(tmp_path / "store")))
    try:
        meters = WriterMetrics(writer)
        results = writer.append([MessageInput(TOPIC, b"one", queue_id=0)])
        longest_s = 0.0
        for _ in range(2):
            started = time.perf_counter() - 0.001
            meters.appended(results, started)
            longest_s = max(longest_s, time.perf_counter() - started)
            writer.flush()
    finally:
        writer.close()
    found = collected(reader)
    append = histogram_added(before, found, "rmqstore.writer.append.duration")
    fsync = histogram_added(before, found, "rmqstore.writer.fsync.duration")
    assert list(append.explicit_bounds) == list(DURATION_BOUNDS_S)
    # Each took 1 ms and the recording's own microseconds: (1 ms, 2 ms] unless this
    # machine stalled past 2 ms, and then the bucket of that stall.
    assert append.count == 2 and 0.002 <= append.sum <= 2 * longest_s
    landed = [i for i, count in enumerate(append.bucket_counts) if count]
    assert landed[0] == DURATION_BOUNDS_S.index(0.001) + 1 and landed[-1] <= bucket_of(list(DURATION_BOUNDS_S), longest_s)
    assert sum(append.bucket_counts) == 2
    assert fsync.count == 1 and list(fsync.explicit_bounds) == list(DURATION_BOUNDS_S)


def scrape(port: int) -> dict[str, Any]:
    """GET /metrics, parsed by prometheus_client's own text parser: family name → family."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode("utf-8")
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(family: Any, name: str, **labels: str) -> list[Any]:
    return [s for s in family.samples if s.name == name and labels.items() <= s.labels.items()]


def test_prometheus_scrape_endpoints_of_a_writer_and_a_query_node(nodes: Nodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    store = tmp_path / "store"
    writer = nodes.start("writer", store, "--metrics-port", "0", *SIZE_ARGS, env=dict(os.environ))
    metrics_port = writer.serving["metricsPort"]
    assert isinstance(metrics_port, int) and metrics_port not in (0, writer.serving["port"])
    with grpc.insecure_channel(writer.endpoint) as channel:
        acks = writer_pb2_grpc.WriterServiceStub(channel).SendBatch(
            writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic=TOPIC, body=bytes(10), keys=["k"])] * 5), timeout=10
        ).results
    families = scrape(metrics_port)
    query = nodes.start("query", store, "--metrics-port", "0", env=dict(os.environ))
    with grpc.insecure_channel(query.endpoint) as channel:
        page = query_pb2_grpc.QueryServiceStub(channel).QueryByKey(query_pb2.QueryByKeyRequest(topic=TOPIC, key="k", page_size=10), timeout=10)
    assert len(page.messages) == 5
    query_families = scrape(query.serving["metricsPort"])
    query.stop()
    writer.stop()
    topic = {"messaging_destination_name": TOPIC}
    assert [s.value for s in samples(families["rmqstore_writer_messages"], "rmqstore_writer_messages_total", **topic)] == [5]
    assert [s.value for s in samples(families["rmqstore_writer_bytes"], "rmqstore_writer_bytes_total", **topic)] == [
        acks[-1].commitlog_offset + acks[-1].size
    ]
    rpc = {"rpc_system": "grpc", "rpc_service": "rmqstore.v1.WriterService", "rpc_method": "SendBatch", "rpc_grpc_status_code": "0"}
    family = families["rpc_server_duration_milliseconds"]
    assert family.type == "histogram"
    buckets = samples(family, "rpc_server_duration_milliseconds_bucket", **rpc)
    assert [s.labels["le"] for s in buckets] == [str(float(b)) for b in DURATION_BOUNDS_MS] + ["+Inf"]
    assert buckets[-1].value == 1
    [count] = samples(family, "rpc_server_duration_milliseconds_count", **rpc)
    assert count.value == 1
    append = families["rmqstore_writer_append_duration_seconds"]
    assert [s.value for s in samples(append, "rmqstore_writer_append_duration_seconds_count")] == [1]
    store_label = {"rmqstore_store": str(store)}
    [disk] = samples(families["rmqstore_writer_disk_utilization"], "rmqstore_writer_disk_utilization", **store_label)
    assert 0 < disk.value <= 1
    [lag] = samples(families["rmqstore_writer_dispatch_lag_bytes"], "rmqstore_writer_dispatch_lag_bytes", **store_label)
    assert lag.value == 0
    [streams] = samples(families["rmqstore_rpc_streams_open"], "rmqstore_rpc_streams_open", server_port=str(writer.serving["port"]))
    assert streams.value == 0

    # The query node's own endpoint: its lookups, its RPCs and how far behind it is.
    lookups = query_families["rmqstore_query_duration_seconds"]
    assert [s.value for s in samples(lookups, "rmqstore_query_duration_seconds_count", rmqstore_lookup="key")] == [1]
    by_key = {"rpc_service": "rmqstore.v1.QueryService", "rpc_method": "QueryByKey", "rpc_grpc_status_code": "0"}
    assert [s.value for s in samples(query_families["rpc_server_duration_milliseconds"], "rpc_server_duration_milliseconds_count", **by_key)] == [1]
    for name in ("rmqstore_query_lag_bytes", "rmqstore_query_lag_time_milliseconds"):
        assert [s.value for s in samples(query_families[name], name, **store_label)] == [0], name
    [staleness] = samples(query_families["rmqstore_query_staleness_milliseconds"], "rmqstore_query_staleness_milliseconds", **store_label)
    assert 0 <= staleness.value < 60_000


def test_a_node_without_metrics_serves_no_scrape_port(nodes: Nodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS, env=dict(os.environ))
    writer.stop()  # exit code 0
    assert "metricsPort" not in writer.serving


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    """A node run in this process installs its SIGTERM and SIGINT handlers: put pytest's back."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


@pytest.mark.parametrize("command", ["writer", "query"])
def test_bad_metrics_settings_are_refused(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signal_handlers: None
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    serve = [command, "serve", "--store", str(store), "--port", "0"]
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    code, out, err = run(capsys, *serve, "--metrics-port", "9464")
    assert (code, out) == (2, "")
    assert err == "rmqstore: error: --metrics-port 9464 serves Prometheus metrics: set OTEL_METRICS_EXPORTER=prometheus\n"
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    code, out, err = run(capsys, *serve[:-1], "7001", "--metrics-port", "7001")
    assert (code, out, err) == (2, "", "rmqstore: error: --metrics-port 7001 must differ from --port\n")
    code, out, err = run(capsys, *serve, "--health-port", "7002", "--metrics-port", "7002")
    assert (code, out, err) == (2, "", "rmqstore: error: --metrics-port 7002 must differ from --health-port\n")
    with socket_taken() as taken:
        code, out, err = run(capsys, *serve, "--metrics-port", str(taken))
    assert (code, out) == (2, "")
    assert err.startswith(f"rmqstore: error: --metrics-port {taken}: cannot listen on 127.0.0.1 (")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "statsd")
    code, out, err = run(capsys, *serve)
    assert (code, out) == (2, "")
    assert err == "rmqstore: error: OTEL_METRICS_EXPORTER='statsd': rmqstore supports otlp, prometheus, console or none\n"
    assert sorted(p.name for p in store.iterdir()) == []  # refused before the store was touched


class socket_taken:
    """A port bound (and listening) on 127.0.0.1 for the duration of a ``with``."""

    def __enter__(self) -> int:
        import socket

        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen()
        return int(self._socket.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._socket.close()



def test_a_node_without_metrics_never_loads_the_sdks_metrics(nodes: Nodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer with no metrics asked for serves requests without loading the SDK's metrics
    module (about 15 ms, once paid by its first request): its instruments are the API's
    no-ops, and asking whether metrics are on imports nothing."""
    for name in ("OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    # Python's -X importtime, which writes every import to stderr.
    writer = nodes.start("writer", tmp_path / "store", *SIZE_ARGS, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    with grpc.insecure_channel(writer.endpoint) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        next_offset = 0
        for n in range(3):
            sent = stub.Send(writer_pb2.SendRequest(message=messages_pb2.Message(topic=TOPIC, body=b"m%d" % n)), timeout=WAIT_S)
            assert sent.result.commitlog_offset == next_offset
            next_offset += sent.result.size
    writer.stop()
    imports = writer.stderr_path.read_text()
    loaded = [line.rsplit("|", 1)[1].strip() for line in imports.splitlines() if line.startswith("import time:")]
    assert "rmqstore.service.metrics" in loaded  # the record is read whole: the node's own modules are in it
    assert [name for name in loaded if name.startswith("opentelemetry.sdk.metrics")] == []
