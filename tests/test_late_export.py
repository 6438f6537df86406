"""A command's send spans written and exported without the SDK (rmqstore.client.late_export):
the request that reaches a real receiver is, byte for byte, the request the SDK's encoder
makes of the same spans under the resource the SDK's tracing set-up describes the process
with; the variables under which the SDK would export something else send the command down
the SDK's path; and a traced ``rmqstore send`` never loads the SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from test_tracing_live import Node

from rmqstore.client import late_export, tracing
from rmqstore.common.otlp import SpanEncoder, random_id

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
TIMEOUT_S = 10.0


class RawReceiver:
    """An OTLP/gRPC trace receiver on 127.0.0.1 keeping each request's bytes as sent."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(
            self._export, request_deserializer=None, response_serializer=None
        )
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": handler}
                ),
            )
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _export(self, request: bytes, context: Any) -> bytes:
        with self.lock:
            self.requests.append(request)
        return b""


@pytest.fixture
def receiver() -> Iterator[RawReceiver]:
    started = RawReceiver()
    yield started
    started.server.stop(None)


def _traced_env(monkeypatch: pytest.MonkeyPatch, port: int, **extra: str) -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


def _sdk_request(sent: bytes, service_name: str) -> bytes:
    """The request the SDK's encoder makes of the spans ``sent`` holds (their ids, times,
    names, kinds, parents, attributes and statuses read back from it), under the resource
    ``Resource.create`` makes as rmqstore's tracing set-up calls it and the client's scope."""
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(sent)
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    scope = InstrumentationScope(tracing.TRACER_NAME)
    spans = []
    for written in request.resource_spans[0].scope_spans[0].spans:
        trace_id = int.from_bytes(written.trace_id, "big")
        context = SpanContext(
            trace_id, int.from_bytes(written.span_id, "big"), is_remote=False, trace_flags=SAMPLED
        )
        parent = (
            SpanContext(
                trace_id,
                int.from_bytes(written.parent_span_id, "big"),
                is_remote=False,
                trace_flags=SAMPLED,
            )
            if written.parent_span_id
            else None
        )
        attributes = {}
        for each in written.attributes:
            kind = each.value.WhichOneof("value")
            value = each.value.array_value if kind == "array_value" else getattr(each.value, kind)
            attributes[each.key] = (
                tuple(v.string_value for v in value.values) if kind == "array_value" else value
            )
        status = (
            Status(StatusCode.ERROR, written.status.message)
            if written.status.code == written.status.STATUS_CODE_ERROR
            else Status()
        )
        spans.append(
            ReadableSpan(
                name=written.name,
                context=context,
                parent=parent,
                resource=resource,
                attributes=attributes,
                kind=SpanKind(written.kind - 1),
                status=status,
                start_time=written.start_time_unix_nano,
                end_time=written.end_time_unix_nano,
                instrumentation_scope=scope,
            )  # fmt: skip
        )
    return bytes(encode_spans(spans).SerializeToString())


def _send_spans(
    export: late_export.LateExport, parent_attributes: dict[str, Any], failure: str | None
) -> None:
    """A file's send as the command records it: a batch span per request (two topics'
    batches taking turns, one batch failed), then the file's span."""
    trace_id, span_id = random_id(128), random_id(64)
    one = tracing._send_attributes("TopicA", 1000)
    other = tracing._send_attributes(None, 1000)
    failed = {**one, "rpc.grpc.status_code": 14, "error.type": "UNAVAILABLE"}
    batches = [
        ("send TopicA", one, 10, 20, None),
        ("send", other, 21, 30, None),
        ("send TopicA", one, 31, 40, None),
    ]
    batches.append(("send TopicA", failed, 41, 50, "UNAVAILABLE: gone"))
    export.add_batches(trace_id, span_id, late_export.CLIENT, batches)
    export.add(
        trace_id,
        span_id,
        None,
        "send TopicA",
        late_export.PRODUCER,
        5,
        60,
        parent_attributes,
        failure,
    )


RESOURCE_VARIABLES = st.fixed_dictionaries(
    {},
    optional={
        "OTEL_SERVICE_NAME": st.sampled_from(["orders-cli", ""]),
        "OTEL_RESOURCE_ATTRIBUTES": st.sampled_from(
            [
                "deployment.environment=prod",
                " team = a%20b ,service.name=from-attrs",
                "service.instance.id=fixed,k=v=w",
                "k=",
            ]
        ),
    },
)


@settings(max_examples=12, deadline=None)
@given(variables=RESOURCE_VARIABLES, failure=st.sampled_from([None, "DEADLINE_EXCEEDED: slow"]))
def test_the_request_is_the_one_the_sdks_encoder_makes(
    variables: dict[str, str], failure: str | None
) -> None:
    """Under every resource the variables describe, the spans of a send (batches of two
    topics, a failed batch, the file's span with a list attribute, failed or not) reach a
    real receiver as the bytes the SDK's encoder writes for them. The random
    ``service.instance.id`` each side draws is the one thing set alike first."""
    with pytest.MonkeyPatch.context() as patch:
        started = RawReceiver()
        try:
            _traced_env(patch, started.port, **variables)
            assert late_export.possible(os.environ)
            export = late_export.LateExport(tracing.SERVICE_NAME, tracing.TRACER_NAME, TIMEOUT_S)
            parent_attributes = {
                **tracing._send_attributes("TopicA", 1),
                "messaging.rocketmq.message.keys": ["k1", "k2"],
            }
            _send_spans(export, parent_attributes, failure)
            export.export()
            [sent] = started.requests
            # The instance id is drawn at random on each side: the SDK's is given to both.
            sdk_id = Resource.create({}).attributes["service.instance.id"]
            ours = trace_service_pb2.ExportTraceServiceRequest.FromString(sent)
            [instance] = [
                a
                for a in ours.resource_spans[0].resource.attributes
                if a.key == "service.instance.id"
            ]
            if "service.instance.id=fixed" not in variables.get("OTEL_RESOURCE_ATTRIBUTES", ""):
                assert (
                    len(instance.value.string_value) == 36
                    and instance.value.string_value[14] == "4"
                )
                instance.value.string_value = str(sdk_id)
            expected = _sdk_request(ours.SerializeToString(), tracing.SERVICE_NAME)
            assert ours.SerializeToString() == expected
            assert len(ours.resource_spans[0].scope_spans[0].spans) == 5
        finally:
            started.server.stop(None)


def test_the_bytes_sent_are_the_sdks_bytes_where_nothing_is_drawn(
    receiver: RawReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the instance id given, nothing in the resource is drawn: the bytes that reach
    the receiver are the SDK encoder's bytes as they are, not as parsed and written again."""
    _traced_env(
        monkeypatch,
        receiver.port,
        OTEL_RESOURCE_ATTRIBUTES="service.instance.id=i-1",
        OTEL_SERVICE_NAME="cli",
    )
    export = late_export.LateExport(tracing.SERVICE_NAME, tracing.TRACER_NAME, TIMEOUT_S)
    _send_spans(export, tracing._send_attributes("TopicA", 1), None)
    export.export()
    [sent] = receiver.requests
    assert sent == _sdk_request(sent, tracing.SERVICE_NAME)
    resource = (
        trace_service_pb2.ExportTraceServiceRequest.FromString(sent).resource_spans[0].resource
    )
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == "cli"


def test_spans_past_a_request_are_sent_in_further_requests(
    receiver: RawReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100,000 batch spans (one message a request) go in requests of at most 1 MiB each,
    every span once, in the order given."""
    _traced_env(monkeypatch, receiver.port)
    export = late_export.LateExport(tracing.SERVICE_NAME, tracing.TRACER_NAME, TIMEOUT_S)
    attributes = tracing._send_attributes("Many", 1)
    count = 100_000
    export.add_batches(
        7, 9, late_export.CLIENT, [("send Many", attributes, i, i + 1, None) for i in range(count)]
    )
    export.export()
    assert len(receiver.requests) > 1
    assert all(len(request) <= late_export.REQUEST_BYTES + 1024 for request in receiver.requests)
    starts = [
        span.start_time_unix_nano
        for request in receiver.requests
        for span in trace_service_pb2.ExportTraceServiceRequest.FromString(request)
        .resource_spans[0]
        .scope_spans[0]
        .spans
    ]
    assert starts == list(range(count))


def test_a_failed_request_drops_the_rest_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver that is not there: the first request fails within the timeout, the spans
    after it are dropped, both said in the log, and the channel is closed."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _traced_env(monkeypatch, port)
    export = late_export.LateExport(tracing.SERVICE_NAME, tracing.TRACER_NAME, 1.0)
    attributes = tracing._send_attributes("Lost", 1)
    export.add_batches(
        7, 9, late_export.CLIENT, [("send Lost", attributes, i, i + 1, None) for i in range(20_000)]
    )
    with caplog.at_level("WARNING", logger="rmqstore.common.otlp_exporter"):
        export.export()
    messages = [record.getMessage() for record in caplog.records]
    assert any(
        m.startswith(
            f"Failed to export traces to 127.0.0.1:{port}, error code: StatusCode.UNAVAILABLE"
        )
        for m in messages
    )
    [dropped] = [m for m in messages if m.endswith("more spans are not exported")]
    assert 0 < int(dropped.split()[0]) < 20_000
    assert export.channel.stopped


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "2"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10"),
        ("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "process"),
        ("OTEL_PYTHON_EXPORTER_OTLP_GRPC_CREDENTIAL_PROVIDER", "custom"),
        ("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true"),
        ("OTEL_RESOURCE_ATTRIBUTES", "team=a,oops"),
    ],
)
def test_variables_the_sdk_would_act_on_leave_the_spans_to_it(name: str, value: str) -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert late_export.possible(environ)
    assert not late_export.possible({**environ, name: value})


def _send_env(port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {
        **env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_METRICS_EXPORTER": "none",
        **extra,
    }


def _modules_loaded(
    program_env: dict[str, str], tmp_path: Path, endpoint: str
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """``rmqstore send --file`` as a process, and the OpenTelemetry SDK modules it loaded."""
    messages = tmp_path / "messages.jsonl"
    messages.write_text(
        "".join(json.dumps({"topic": "Lite", "body": f"m{i}"}) + "\n" for i in range(30))
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rmqstore.cli.main", "send", "--endpoint", endpoint,
         "--file", str(messages), "--batch-size", "10", "--acks", "summary"],
        env=program_env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    loaded = sorted(
        {
            line.rsplit("|", 1)[1].strip()
            for line in done.stderr.splitlines()
            if line.startswith("import time:")
        }
    )
    return [m for m in loaded if m.startswith(("opentelemetry.sdk.", "grpc._interceptor"))], done


def test_a_traced_send_loads_no_sdk_and_a_limit_brings_it_back(
    tmp_path: Path, receiver: RawReceiver, started: list[Node]
) -> None:
    """A real writer and ``rmqstore send`` traced with the defaults: the command loads
    nothing of the SDK but its version (nor gRPC's interceptors: its channel only streams
    sends), and its four spans arrive. With a span attribute limit set the SDK records
    them, and its limit shows on the spans."""
    writer = Node(
        "writer",
        tmp_path / "store",
        _send_env(receiver.port, OTEL_SDK_DISABLED="true"),
        tmp_path / "writer.log",
    )
    started.append(writer)
    sdk, done = _modules_loaded(_send_env(receiver.port), tmp_path, writer.endpoint)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["acked"] == 30
    assert sdk == ["opentelemetry.sdk.version"]
    [request] = receiver.requests
    spans = (
        trace_service_pb2.ExportTraceServiceRequest.FromString(request)
        .resource_spans[0]
        .scope_spans[0]
        .spans
    )
    assert sorted(s.name for s in spans) == ["send Lite"] * 4
    assert all(len(s.attributes) > 2 for s in spans)

    limited, done = _modules_loaded(
        _send_env(receiver.port, OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT="2"), tmp_path, writer.endpoint
    )
    assert done.returncode == 0, done.stderr
    assert "opentelemetry.sdk.trace" in limited
    spans = [
        span
        for request in receiver.requests[1:]
        for span in trace_service_pb2.ExportTraceServiceRequest.FromString(request)
        .resource_spans[0]
        .scope_spans[0]
        .spans
    ]
    assert sorted(s.name for s in spans) == ["send Lite"] * 4
    assert all(len(s.attributes) == 2 and s.dropped_attributes_count > 0 for s in spans)


def test_the_encoders_parts_need_no_opentelemetry_module() -> None:
    """What the late export writes with (the encoder, the channel) loads no OpenTelemetry module."""
    program = (
        "import sys; from rmqstore.common.otlp import SpanEncoder; from rmqstore.common.otlp_exporter import TraceChannel; "
        "from rmqstore.client import late_export; "
        "SpanEncoder().resource_field({'service.name': 's'}); "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert (
        SpanEncoder.scope_field("rmqstore.client")
        == bytes([0x0A, 17, 0x0A, 15]) + b"rmqstore.client"
    )
