"""The nodes' log records: JSON lines on stderr carrying the trace context of the span they
were written in, and, with ``OTEL_LOGS_EXPORTER=otlp``, the same records over OTLP."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import IO, Any

# The loggers under this name are the nodes' (rmqstore.writer, rmqstore.writer.rocketmq5, …).
ROOT_LOGGER = "rmqstore"

_handlers: list[logging.Handler] = []


def _span_context() -> Any:
    """The current span's context when a valid one is current; None without tracing (the
    API is not even imported then)."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


class JsonLines(logging.Formatter):
    """One JSON object a record: time (UTC, ms), level, logger, message, service, and
    ``trace_id``/``span_id`` inside a span; ``exception`` with the traceback."""

    def __init__(self, service_name: str):
        super().__init__()
        self.service_name = service_name

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        document: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "service": self.service_name,
        }
        context = _span_context()
        if context is not None:
            document["trace_id"] = f"{context.trace_id:032x}"
            document["span_id"] = f"{context.span_id:016x}"
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False)


class OtlpRecords(logging.Handler):
    """Hands each record to an OpenTelemetry SDK logger provider, in the current context
    (so the exported record carries the span's trace and span ids)."""

    def __init__(self, provider: Any):
        super().__init__()
        self.provider = provider

    def emit(self, record: logging.LogRecord) -> None:
        from opentelemetry import context

        attributes: dict[str, Any] = {"code.function.name": record.funcName, "code.line.number": record.lineno}
        if record.exc_info and record.exc_info[1] is not None:
            attributes["exception.type"] = type(record.exc_info[1]).__name__
            attributes["exception.stacktrace"] = logging.Formatter().formatException(record.exc_info)
        self.provider.get_logger(record.name).emit(
            timestamp=int(record.created * 1e9),
            context=context.get_current(),
            severity_number=severity_of(record.levelno),
            severity_text=record.levelname,
            body=record.getMessage(),
            attributes=attributes,
        )

    def flush(self) -> None:
        self.provider.force_flush()

    def close(self) -> None:
        self.provider.shutdown()
        super().close()


def severity_of(levelno: int) -> Any:
    """The OpenTelemetry severity of a ``logging`` level: each of Python's five levels to
    its range's first number (DEBUG 5, INFO 9, WARN 13, ERROR 17, FATAL 21), a level
    between them to the one below it (the log data model's mapping)."""
    from opentelemetry._logs import SeverityNumber

    if levelno < logging.DEBUG:
        return SeverityNumber.UNSPECIFIED
    return SeverityNumber(5 + 4 * min((levelno - logging.DEBUG) // 10, 4))


def logs_exporter_requested(environ: dict[str, str] | None = None) -> str | None:
    """``otlp`` when ``OTEL_LOGS_EXPORTER`` asks for it (and the SDK is not disabled);
    log export is never turned on by an endpoint alone."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    exporter = env.get("OTEL_LOGS_EXPORTER", "").strip().lower()
    if exporter in ("", "none"):
        return None
    if exporter != "otlp":
        from rmqstore.common.errors import InvalidArgument

        raise InvalidArgument(f"OTEL_LOGS_EXPORTER={exporter!r}: rmqstore supports otlp or none")
    return exporter


def configure_logging(service_name: str, stream: IO[str] | None = None) -> list[logging.Handler]:
    """The ``rmqstore`` loggers write JSON lines to ``stream`` (stderr) at INFO and above,
    and export over OTLP when asked. Returns the handlers added (none on a second call)."""
    if _handlers:
        return []
    logger = logging.getLogger(ROOT_LOGGER)
    lines = logging.StreamHandler(stream if stream is not None else sys.stderr)
    lines.setFormatter(JsonLines(service_name))
    added: list[logging.Handler] = [lines]
    if logs_exporter_requested() == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.resources import Resource

        provider = LoggerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)}))
        provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
        added.append(OtlpRecords(provider))
    for handler in added:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # The records are the nodes' own lines; the root logger's last-resort output would
    # print each a second time, in another form.
    logger.propagate = False
    _handlers.extend(added)
    return added


def unconfigure_logging() -> None:
    """Remove what :func:`configure_logging` added (tests running it in their process)."""
    logger = logging.getLogger(ROOT_LOGGER)
    for handler in _handlers:
        logger.removeHandler(handler)
        handler.close()
    _handlers.clear()
    logger.propagate = True
    logger.setLevel(logging.NOTSET)
