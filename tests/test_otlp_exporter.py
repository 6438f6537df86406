"""rmqstore's OTLP/gRPC span exporter (rmqstore.common.otlp_exporter): it reads the OTLP
settings as the SDK's exporter reads them (held equal on generated environments), and
exports to real receivers on 127.0.0.1: plaintext, TLS and mutual TLS, with headers and
gzip, retrying as the SDK retries and stopping when it is shut down."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc import exporter as sdk_exporter_module
from opentelemetry.exporter.otlp.proto.grpc.exporter import InvalidCompressionValueException
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext, Status, StatusCode
from test_tls import Pki, pki  # noqa: F401 (pki is a fixture)

from rmqstore.common import otlp_exporter
from rmqstore.common.otlp_exporter import (
    CompressionRefused,
    TlsFiles,
    export_settings,
    span_exporter,
)
from rmqstore.common.otlp_sdk_exporter import SDKEncodingExporter
from rmqstore.common.otlp_span_exporter import SpanExporter
from rmqstore.service.channels import load_server_credentials

TIMEOUT_S = 10.0

SPANS = [
    ReadableSpan("rmqstore.append", SpanContext(0xABC, 0x1, is_remote=False), attributes={"messaging.system": "rocketmq"},
                 status=Status(StatusCode.UNSET), start_time=1, end_time=2),
    ReadableSpan("send T", SpanContext(0xABC, 0x2, is_remote=False), status=Status(StatusCode.ERROR, "UNAVAILABLE: gone")),
]  # fmt: skip


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP/gRPC trace receiver on 127.0.0.1 keeping each request and its metadata;
    ``refusals`` are (code, retry delay or None) answered to the first calls, in order."""

    def __init__(self, credentials: grpc.ServerCredentials | None = None, refusals: list[tuple[grpc.StatusCode, float | None]] | None = None):
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.calls = 0
        self.refusals = list(refusals or [])
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        if credentials is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        self.server.start()

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.lock:
            self.calls += 1
            refusal = self.refusals.pop(0) if self.refusals else None
            if refusal is None:
                self.requests.append(request)
                self.metadata.append(dict(context.invocation_metadata()))
        if refusal is not None:
            code, delay_s = refusal
            if delay_s is not None:
                whole = int(delay_s)
                info = RetryInfo(retry_delay=Duration(seconds=whole, nanos=int((delay_s - whole) * 1e9)))
                context.set_trailing_metadata(((otlp_exporter.RETRY_INFO_KEY, info.SerializeToString()),))
            context.abort(code, "refused by the test")
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    started: list[Receiver] = []
    yield started
    for each in started:
        each.server.stop(None)


# The SDK's exporter and this one, on the same environment.

VARIABLES = {
    "ENDPOINT": ["http://127.0.0.1:4317", "https://collector.example:4317", "collector.example:4317", "grpc://c:1", ""],
    "INSECURE": ["true", "false", "TRUE", ""],
    "CERTIFICATE": ["/etc/otel/ca.pem", ""],
    "CLIENT_KEY": ["/etc/otel/client.key"],
    "CLIENT_CERTIFICATE": ["/etc/otel/client.pem"],
    "HEADERS": ["api-key=secret,Tenant=a%20b", "x=1", "=bad,ok=2", ""],
    "TIMEOUT": ["5", "0.5"],
    "COMPRESSION": ["gzip", " GZIP", "zstd", ""],
}
environments = st.dictionaries(
    st.sampled_from([f"OTEL_EXPORTER_OTLP_{scope}{name}" for scope in ("", "TRACES_") for name in VARIABLES]),
    st.just(""),
    max_size=10,
).flatmap(
    lambda chosen: st.fixed_dictionaries(
        {name: st.sampled_from(VARIABLES[name.rsplit("_OTLP_", 1)[1].removeprefix("TRACES_")]) for name in chosen}
    )
)
retryable_codes = st.one_of(st.none(), st.just("UNAVAILABLE, aborted"), st.just("deadline_exceeded"))


class _Sentinel:
    def __init__(self, files: TlsFiles):
        self.files = files


def _sdk_settings(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the SDK's exporter makes of ``environ``: its fields, and which TLS files it
    would read (its credential loading noted rather than done)."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sdk_exporter_module, "_load_credentials", lambda c, k, cc: _Sentinel(TlsFiles(c, k, cc)))
    monkeypatch.setattr(sdk_exporter_module, "ssl_channel_credentials", lambda: _Sentinel(TlsFiles()))
    monkeypatch.setattr(sdk_exporter_module.OTLPExporterMixin, "_initialize_channel_and_stub", lambda self: None)
    sdk = OTLPSpanExporter(**kwargs)
    return {
        "target": sdk._endpoint,
        "tls": None if sdk._insecure else sdk._credentials.files,
        "headers": sdk._headers,
        "timeout_s": sdk._timeout,
        "compression": sdk._compression,
        "retryable": sdk._retryable_error_codes,
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    environ=environments,
    codes=retryable_codes,
    endpoint=st.sampled_from([None, "http://127.0.0.1:1", "localhost:2"]),
    insecure=st.sampled_from([None, True, False]),
    timeout_s=st.sampled_from([None, 2.0]),
)
def test_the_settings_are_the_sdk_exporters(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], codes: str | None, endpoint: str | None, insecure: bool | None, timeout_s: float | None
) -> None:
    if codes is not None:
        environ = {**environ, otlp_exporter.RETRYABLE_CODES_VARIABLE: codes}
    kwargs = {"endpoint": endpoint, "insecure": insecure, "timeout": timeout_s}
    with monkeypatch.context() as patched:
        try:
            sdks: dict[str, Any] | Exception = _sdk_settings(patched, environ, kwargs)
        except InvalidCompressionValueException as error:
            sdks = error
    try:
        ours = export_settings(environ, endpoint=endpoint, insecure=insecure, timeout_s=timeout_s)
    except CompressionRefused as error:
        assert isinstance(sdks, InvalidCompressionValueException)
        assert str(error) == str(sdks)
        return
    assert not isinstance(sdks, Exception), sdks
    assert {name: getattr(ours, name) for name in sdks} == sdks


def test_none_is_no_compression_where_the_sdk_refuses_it() -> None:
    """The specification's ``none``, which the SDK's exporter refuses."""
    settings_ = export_settings({"OTEL_EXPORTER_OTLP_COMPRESSION": "none", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip"})
    assert settings_.compression is grpc.Compression.Gzip
    assert export_settings({"OTEL_EXPORTER_OTLP_COMPRESSION": "None"}).compression is grpc.Compression.NoCompression
    with pytest.raises(InvalidCompressionValueException), pytest.MonkeyPatch.context() as patched:
        _sdk_settings(patched, {"OTEL_EXPORTER_OTLP_COMPRESSION": "none"}, {})


def test_an_unknown_retryable_code_is_refused_by_name() -> None:
    with pytest.raises(ValueError) as refused:
        export_settings({otlp_exporter.RETRYABLE_CODES_VARIABLE: "UNAVAILABLE,SLOW"})
    assert str(refused.value) == "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES: SLOW is no gRPC status code"


def test_a_credential_provider_or_internal_metrics_hand_the_export_to_the_sdks_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    ours = span_exporter()
    assert type(ours) is SpanExporter
    ours.shutdown()
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    sdks = span_exporter()
    assert type(sdks) is SDKEncodingExporter
    sdks.shutdown()


# Exports to real receivers.


def _exporter(receiver: Receiver, **settings_: Any) -> SpanExporter:
    return SpanExporter(environ=settings_, endpoint=f"http://127.0.0.1:{receiver.port}", timeout=TIMEOUT_S)


def test_spans_reach_a_receiver_with_the_headers_and_gzip(receivers: list[Receiver]) -> None:
    receiver = Receiver()
    receivers.append(receiver)
    exporter = _exporter(receiver, OTEL_EXPORTER_OTLP_HEADERS="api-key=s3cret,Tenant=a%20b", OTEL_EXPORTER_OTLP_COMPRESSION="gzip")
    assert exporter.export(SPANS) == SpanExportResult.SUCCESS
    assert receiver.requests == [encode_spans(SPANS)]
    assert receiver.metadata[0]["api-key"] == "s3cret" and receiver.metadata[0]["tenant"] == "a b"
    assert exporter.settings.compression is grpc.Compression.Gzip  # the request came gzipped, and was read
    assert receiver.metadata[0]["user-agent"].startswith(otlp_exporter.USER_AGENT)
    exporter.shutdown()


def test_spans_reach_a_tls_receiver_trusting_its_ca_and_a_mutual_tls_one_with_the_client_certificate(
    receivers: list[Receiver], pki: Pki  # noqa: F811
) -> None:
    tls = Receiver(load_server_credentials(str(pki.server_cert), str(pki.server_key)))
    mutual = Receiver(load_server_credentials(str(pki.server_cert), str(pki.server_key), str(pki.ca)))
    receivers += [tls, mutual]
    trusting = SpanExporter(environ={"OTEL_EXPORTER_OTLP_CERTIFICATE": str(pki.ca)}, endpoint=f"https://127.0.0.1:{tls.port}", timeout=TIMEOUT_S)
    assert trusting.export(SPANS) == SpanExportResult.SUCCESS
    assert tls.requests == [encode_spans(SPANS)]
    presenting = SpanExporter(
        environ={
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(pki.ca),
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": str(pki.client_key),
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": str(pki.client_cert),
        },
        endpoint=f"127.0.0.1:{mutual.port}",
        timeout=TIMEOUT_S,
    )
    assert presenting.settings.tls == TlsFiles(str(pki.ca), str(pki.client_key), str(pki.client_cert))
    assert presenting.export(SPANS) == SpanExportResult.SUCCESS
    assert mutual.requests == [encode_spans(SPANS)]
    # Without its certificate the mutual TLS receiver refuses the connection.
    anonymous = SpanExporter(environ={"OTEL_EXPORTER_OTLP_CERTIFICATE": str(pki.ca)}, endpoint=f"https://127.0.0.1:{mutual.port}", timeout=1.0)
    assert anonymous.export(SPANS) == SpanExportResult.FAILURE
    assert len(mutual.requests) == 1
    for each in (trusting, presenting, anonymous):
        each.shutdown()


def test_a_refused_export_is_retried_after_the_receivers_retry_delay(receivers: list[Receiver], caplog: pytest.LogCaptureFixture) -> None:
    receiver = Receiver(refusals=[(grpc.StatusCode.UNAVAILABLE, 0.2), (grpc.StatusCode.RESOURCE_EXHAUSTED, 0.1)])
    receivers.append(receiver)
    exporter = _exporter(receiver)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=otlp_exporter.__name__):
        assert exporter.export(SPANS) == SpanExportResult.SUCCESS
    elapsed_s = time.monotonic() - began
    assert receiver.calls == 3 and receiver.requests == [encode_spans(SPANS)]
    assert 0.3 <= elapsed_s < 3.0, elapsed_s
    assert [r.getMessage().split(". Error details")[0] for r in caplog.records] == [
        f"Transient error StatusCode.UNAVAILABLE encountered while exporting traces to 127.0.0.1:{receiver.port}, retrying in 0.20s",
        f"Transient error StatusCode.RESOURCE_EXHAUSTED encountered while exporting traces to 127.0.0.1:{receiver.port}, retrying in 0.10s",
    ]
    exporter.shutdown()


def test_a_code_that_is_not_retryable_fails_the_export_at_once(receivers: list[Receiver], caplog: pytest.LogCaptureFixture) -> None:
    receiver = Receiver(refusals=[(grpc.StatusCode.INVALID_ARGUMENT, None)])
    receivers.append(receiver)
    exporter = _exporter(receiver)
    with caplog.at_level(logging.WARNING, logger=otlp_exporter.__name__):
        assert exporter.export(SPANS) == SpanExportResult.FAILURE
    assert receiver.calls == 1 and receiver.requests == []
    assert [r.getMessage() for r in caplog.records] == [
        f"Failed to export traces to 127.0.0.1:{receiver.port}, error code: StatusCode.INVALID_ARGUMENT, "
        "error details: refused by the test"
    ]
    exporter.shutdown()


def test_retries_stop_at_the_timeout(receivers: list[Receiver]) -> None:
    """A receiver that keeps asking for 0.4 s: tries within the 1 s timeout, then failure."""
    receiver = Receiver(refusals=[(grpc.StatusCode.UNAVAILABLE, 0.4)] * 10)
    receivers.append(receiver)
    exporter = SpanExporter(environ={}, endpoint=f"http://127.0.0.1:{receiver.port}", timeout=1.0)
    began = time.monotonic()
    assert exporter.export(SPANS) == SpanExportResult.FAILURE
    assert time.monotonic() - began < 1.5
    assert receiver.calls == 3 and receiver.requests == []
    exporter.shutdown()


def test_a_shutdown_ends_a_waiting_retry_and_later_exports_fail(receivers: list[Receiver]) -> None:
    receiver = Receiver(refusals=[(grpc.StatusCode.UNAVAILABLE, 5.0)])
    receivers.append(receiver)
    exporter = _exporter(receiver)
    results: list[SpanExportResult] = []
    exporting = threading.Thread(target=lambda: results.append(exporter.export(SPANS)))
    exporting.start()
    deadline = time.monotonic() + 5.0
    while receiver.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    began = time.monotonic()
    exporter.shutdown()
    exporting.join(5.0)
    assert results == [SpanExportResult.FAILURE] and time.monotonic() - began < 1.0
    assert exporter.export(SPANS) == SpanExportResult.FAILURE
    assert receiver.calls == 1


def test_the_sdks_exporter_sends_the_encoders_bytes(receivers: list[Receiver]) -> None:
    receiver = Receiver()
    receivers.append(receiver)
    exporter = SDKEncodingExporter(endpoint=f"127.0.0.1:{receiver.port}", insecure=True, timeout=TIMEOUT_S)
    assert exporter.export(SPANS) == SpanExportResult.SUCCESS
    assert receiver.requests == [encode_spans(SPANS)]
    exporter.shutdown()


def test_a_traced_command_does_not_load_the_sdks_exporter() -> None:
    """The cost this exporter exists for: the SDK's exporter module (and with it the SDK's
    metrics and logs) stays unloaded in a process that traces over OTLP."""
    program = (
        "import sys; from rmqstore.service.telemetry import configure_tracing; "
        "assert configure_tracing('probe'); "
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.exporter.otlp.proto.grpc', 'opentelemetry.sdk._logs'))))"
    )
    env = {"PATH": "/usr/bin:/bin", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "false"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
