"""The OTLP/gRPC span exporter the nodes and the client install: rmqstore's own, reading
the OTLP exporter settings as the SDK's ``OTLPSpanExporter`` reads them, and sending the
request :class:`~rmqstore.common.otlp.SpanEncoder` writes as bytes.

Why not the SDK's exporter: its module loads the SDK's metrics and logs and three
services' protobuf modules (about 60 ms of a core, holding the GIL), which a command
line pays on every run, on the same core as its send. This one needs grpc, which every
rmqstore process has loaded already.

What it reads, as the SDK does (the traces' own variable first, then the shared one):
``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` (default ``http://localhost:4317``; ``https``
is TLS, ``http`` plaintext, a bare ``host:port`` TLS unless ``..._INSECURE=true``),
``..._INSECURE``, ``..._CERTIFICATE``, ``..._CLIENT_KEY``, ``..._CLIENT_CERTIFICATE``,
``..._HEADERS`` (W3C baggage format), ``..._COMPRESSION`` (``gzip``; ``none`` too, which
the SDK refuses), ``..._TIMEOUT`` (seconds, retries included; default 10) and
``OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES``. A failed export is retried as
the SDK retries it: up to 6 tries, backing off 1, 2, 4 … s (±20 %, or the server's
``RetryInfo``) within the timeout, the channel made again after a first UNAVAILABLE.
``tests/test_otlp.py`` holds the settings equal to the SDK exporter's on generated
environments.

The SDK's own extensions of those settings (a credential provider named by
``OTEL_PYTHON_EXPORTER_OTLP_GRPC_(TRACES_)CREDENTIAL_PROVIDER``, the exporter's internal
metrics by ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``) are the SDK exporter's alone:
when one is set, :func:`span_exporter` gives that exporter, encoding with the same
encoder (:mod:`rmqstore.common.otlp_sdk_exporter`).

This module loads none of OpenTelemetry's SDK: :class:`TraceChannel` sends requests
already written as bytes, which is all a command that writes its spans itself needs
(:mod:`rmqstore.client.late_export`); the SDK's exporter interface over it is
:class:`rmqstore.common.otlp_span_exporter.SpanExporter`."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import grpc

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter as SDKSpanExporter

    from rmqstore.common.otlp import SpanEncoder

_logger = logging.getLogger(__name__)

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
DEFAULT_ENDPOINT = "http://localhost:4317"
DEFAULT_TIMEOUT_S = 10.0
MAX_ATTEMPTS = 6
# The codes a failed export is tried again on (the SDK's, from the OTLP specification).
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
RETRY_INFO_KEY = "google.rpc.retryinfo-bin"
RETRYABLE_CODES_VARIABLE = "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES"
# Set, these hand the export to the SDK's exporter (module doc).
SDK_ONLY_VARIABLES = (
    "OTEL_PYTHON_EXPORTER_OTLP_GRPC_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_GRPC_TRACES_CREDENTIAL_PROVIDER",
)
INTERNAL_METRICS_VARIABLE = "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"
USER_AGENT = "rmqstore-otlp-exporter"

_COMPRESSIONS = {"gzip": grpc.Compression.Gzip, "none": grpc.Compression.NoCompression}


class CompressionRefused(ValueError):
    """A compression variable names no compression the exporter has (worded as the SDK's)."""

    def __init__(self, variable: str, value: str):
        super().__init__(f'Invalid value "{value}" for compression envvar {variable}')


@dataclass(frozen=True)
class TlsFiles:
    """The files a TLS channel is made with; None is the default (the system's roots, no
    client certificate)."""

    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None


@dataclass(frozen=True)
class ExportSettings:
    """Where and how spans are exported, resolved from the variables once."""

    target: str  # host:port, as grpc takes it
    tls: TlsFiles | None  # None: plaintext
    headers: tuple[tuple[str, str], ...]
    timeout_s: float
    compression: grpc.Compression
    retryable: frozenset[grpc.StatusCode]


def _compression(environ: Mapping[str, str], variable: str) -> grpc.Compression | None:
    if variable not in environ:
        return None
    value = environ[variable].lower().strip()
    if value not in _COMPRESSIONS:
        raise CompressionRefused(variable, value)
    return _COMPRESSIONS[value]


def _tls_files(environ: Mapping[str, str], prefix: str) -> TlsFiles:
    certificate = environ.get(f"{prefix}CERTIFICATE")
    if not certificate:
        return TlsFiles()
    return TlsFiles(certificate, environ.get(f"{prefix}CLIENT_KEY"), environ.get(f"{prefix}CLIENT_CERTIFICATE"))


def export_settings(
    environ: Mapping[str, str] | None = None,
    *,
    endpoint: str | None = None,
    insecure: bool | None = None,
    timeout_s: float | None = None,
) -> ExportSettings:
    """The settings the variables (``os.environ`` by default) give, with the SDK
    exporter's precedence and quirks; ``endpoint``, ``insecure`` and ``timeout_s`` given
    here come before them, as the SDK exporter's arguments do. Raises
    :class:`CompressionRefused` (a ``ValueError``) for an unknown compression and
    ``ValueError`` for a timeout or a retryable code that is none."""
    env = os.environ if environ is None else environ
    traces = "OTEL_EXPORTER_OTLP_TRACES_"
    shared = "OTEL_EXPORTER_OTLP_"
    if insecure is None and env.get(f"{traces}INSECURE") is not None:
        insecure = env[f"{traces}INSECURE"].lower() == "true"
    # The traces' certificate counts only when the traces' settings alone say TLS.
    tls: TlsFiles | None = None
    if not insecure and env.get(f"{traces}CERTIFICATE") is not None:
        tls = _tls_files(env, traces)
    traces_timeout = env.get(f"{traces}TIMEOUT")
    timeout_s = timeout_s or (float(traces_timeout) if traces_timeout is not None else None)
    compression = _compression(env, f"{traces}COMPRESSION")
    endpoint = endpoint or env.get(f"{traces}ENDPOINT") or env.get(f"{shared}ENDPOINT", DEFAULT_ENDPOINT)
    parsed = urlparse(endpoint)
    if parsed.scheme == "https":
        insecure = False
    if insecure is None:
        shared_insecure = env.get(f"{shared}INSECURE")
        insecure = shared_insecure.lower() == "true" if shared_insecure is not None else parsed.scheme == "http"
    headers_set = env.get(f"{traces}HEADERS") or env.get(f"{shared}HEADERS")
    headers = _headers(headers_set) if headers_set else ()
    if compression is None:
        compression = _compression(env, f"{shared}COMPRESSION")
    codes = env.get(RETRYABLE_CODES_VARIABLE)
    try:
        retryable = frozenset(grpc.StatusCode[c.strip().upper()] for c in codes.split(",") if c.strip()) if codes is not None else RETRYABLE_CODES
    except KeyError as error:
        raise ValueError(f"{RETRYABLE_CODES_VARIABLE}: {error.args[0]} is no gRPC status code") from None
    return ExportSettings(
        target=parsed.netloc or endpoint,
        tls=None if insecure else (tls if tls is not None else _tls_files(env, shared)),
        headers=headers,
        timeout_s=timeout_s or float(env.get(f"{shared}TIMEOUT", DEFAULT_TIMEOUT_S)),
        compression=compression or grpc.Compression.NoCompression,
        retryable=retryable,
    )


def _headers(value: str) -> tuple[tuple[str, str], ...]:
    from opentelemetry.util.re import parse_env_headers

    return tuple(parse_env_headers(value, liberal=True).items())


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        # As the SDK does: said, and the channel made without it.
        _logger.error("the OTLP exporter cannot read %s: %s", path, error.strerror)
        return None


def _credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=_read(files.certificate),
        private_key=_read(files.client_key),
        certificate_chain=_read(files.client_certificate),
    )


def _retry_delay_s(retry_info: bytes) -> float:
    from google.rpc.error_details_pb2 import RetryInfo  # type: ignore[import-untyped]

    delay = RetryInfo.FromString(retry_info).retry_delay
    return float(delay.seconds + delay.nanos / 1e9)


class TraceChannel:
    """Sends ``ExportTraceServiceRequest`` bytes to an OTLP/gRPC receiver, with the
    settings the variables give (or ``settings``), retrying as the SDK's exporter does
    (module doc)."""

    def __init__(self, settings: ExportSettings | None = None) -> None:
        self.settings = settings if settings is not None else export_settings()
        self._credentials = _credentials(self.settings.tls) if self.settings.tls is not None else None
        self._stopping = threading.Event()
        self._stopped = False
        self._channel, self._export = self._open()

    def _open(self) -> tuple[grpc.Channel, Any]:
        options = (("grpc.primary_user_agent", USER_AGENT),)
        settings = self.settings
        if self._credentials is None:
            channel = grpc.insecure_channel(settings.target, options=options, compression=settings.compression)
        else:
            channel = grpc.secure_channel(settings.target, self._credentials, options=options, compression=settings.compression)
        # Bytes in (the encoder's request), bytes out (the response is not read).
        return channel, channel.unary_unary(EXPORT_METHOD)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def export(self, request: bytes, timeout_s: float | None = None) -> bool:
        """Send ``request``, retried within ``timeout_s`` (the settings' timeout by
        default); whether it was received. A failure is logged as the SDK logs it."""
        settings = self.settings
        deadline = time.monotonic() + (settings.timeout_s if timeout_s is None else timeout_s)
        for attempt in range(MAX_ATTEMPTS):
            try:
                self._export(request, metadata=settings.headers, timeout=max(deadline - time.monotonic(), 0.0))
                return True
            except grpc.RpcError as error:
                code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
                details = error.details() if isinstance(error, grpc.Call) else str(error)
                trailers = dict(error.trailing_metadata() or ()) if isinstance(error, grpc.Call) else {}
                retry_info = trailers.get(RETRY_INFO_KEY)
                delay_s = _retry_delay_s(retry_info) if isinstance(retry_info, bytes) else 2**attempt * random.uniform(0.8, 1.2)
                if code is grpc.StatusCode.UNAVAILABLE and attempt == 0:
                    # The collector may have moved (a new address behind its name).
                    self._channel.close()
                    self._channel, self._export = self._open()
                if (
                    code not in settings.retryable
                    or attempt + 1 == MAX_ATTEMPTS
                    or delay_s > deadline - time.monotonic()
                    or self._stopped
                ):
                    _logger.error(
                        "Failed to export traces to %s, error code: %s, error details: %s", settings.target, code, details
                    )
                    return False
                _logger.warning(
                    "Transient error %s encountered while exporting traces to %s, retrying in %.2fs. Error details: %s",
                    code, settings.target, delay_s, details,
                )  # fmt: skip
            if self._stopping.wait(delay_s):
                _logger.warning("the OTLP exporter is shutting down: the export is not retried")
                break
        return False

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        self._channel.close()


def span_exporter(encoder: SpanEncoder | None = None, timeout: float | None = None) -> SDKSpanExporter:
    """The OTLP exporter for the variables: this module's, or the SDK's when a variable
    only the SDK's exporter reads is set (module doc)."""
    if any(os.environ.get(name) for name in SDK_ONLY_VARIABLES) or (
        os.environ.get(INTERNAL_METRICS_VARIABLE, "").strip().lower() == "true"
    ):
        from rmqstore.common.otlp_sdk_exporter import SDKEncodingExporter

        return SDKEncodingExporter(encoder, timeout=timeout)
    from rmqstore.common.otlp_span_exporter import SpanExporter

    return SpanExporter(encoder, timeout=timeout)
