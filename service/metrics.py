"""OpenTelemetry metrics of the writer and the query node (docs/design.md §8).

Instruments come from the global meter provider: a no-op until :func:`configure_metrics`
installs the SDK (``OTEL_METRICS_EXPORTER=otlp|console``, or an OTLP endpoint), so an
unconfigured process pays almost nothing. Names follow OpenTelemetry's conventions: dotted,
units in the ``unit`` field, durations in seconds.

Writer: ``rmqstore.writer.messages`` and ``rmqstore.writer.bytes`` (appended),
``rmqstore.writer.append.duration`` (per request, including the SYNC wait),
``rmqstore.writer.unflushed`` (bytes written but not yet fsynced) and
``rmqstore.writer.dispatch.lag`` (bytes appended but not yet dispatched and published).
Query node: ``rmqstore.query.duration`` (per lookup, attribute ``rmqstore.lookup``),
``rmqstore.query.lag`` (bytes the writer published that the node does not show yet) and
``rmqstore.query.staleness`` (milliseconds since the node last looked at the progress file).
Gauges carry the store directory as ``rmqstore.store``.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from rmqstore.service.telemetry import exporter_requested

if TYPE_CHECKING:
    from rmqstore.query.view import StoreView
    from rmqstore.writer.store import Writer

_METER_NAME = "rmqstore"
_configured = False


def metrics_requested(environ: dict[str, str] | None = None) -> str | None:
    """The metric exporter to use, or None for no metrics."""
    return exporter_requested("METRICS", environ)


def configure_metrics(service_name: str) -> bool:
    """Install an SDK meter provider exporting periodically (``OTEL_METRIC_EXPORT_INTERVAL``
    ms, the SDK's default 60 s) if the environment asks for one. Returns whether metrics
    are on. Safe to call more than once."""
    global _configured
    exporter_name = metrics_requested()
    if exporter_name is None or _configured:
        return _configured
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        MetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource

    exporter: MetricExporter
    if exporter_name == "console":
        exporter = ConsoleMetricExporter()
    elif exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter()
    else:
        raise ValueError(f"OTEL_METRICS_EXPORTER={exporter_name!r}: rmqstore supports otlp, console or none")
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(exporter)]))
    _configured = True
    return True


class _Gauge:
    """One observable gauge per process, observing every live owner (a writer, a store
    view) with its own attributes: the API cannot unregister a callback, so owners are
    held weakly and drop out when they are gone."""

    def __init__(self, name: str, unit: str, description: str):
        self._owners: weakref.WeakKeyDictionary[object, tuple[dict[str, str], Callable[[object], float]]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        metrics.get_meter(_METER_NAME).create_observable_gauge(name, [self._observe], unit=unit, description=description)

    def watch(self, owner: object, attributes: dict[str, str], read: Callable[[object], float]) -> None:
        with self._lock:
            self._owners[owner] = (attributes, read)

    def _observe(self, options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            owners = list(self._owners.items())
        for owner, (attributes, read) in owners:
            yield Observation(read(owner), attributes)


_gauges: dict[str, _Gauge] = {}
_gauges_lock = threading.Lock()


def _gauge(name: str, unit: str, description: str) -> _Gauge:
    with _gauges_lock:
        if name not in _gauges:
            _gauges[name] = _Gauge(name, unit, description)
        return _gauges[name]


class WriterMetrics:
    """The writer's instruments; its gauges read the writer when the SDK collects and
    carry the store directory as ``rmqstore.store``."""

    def __init__(self, writer: Writer):
        meter = metrics.get_meter(_METER_NAME)
        self.messages = meter.create_counter("rmqstore.writer.messages", unit="{message}", description="messages appended")
        self.bytes = meter.create_counter("rmqstore.writer.bytes", unit="By", description="commit log bytes appended")
        self.append_duration = meter.create_histogram(
            "rmqstore.writer.append.duration", unit="s", description="time to append and acknowledge one request"
        )
        store = {"rmqstore.store": writer.config.store}
        _gauge("rmqstore.writer.unflushed", "By", "written, not yet fsynced").watch(
            writer, store, lambda w: w.unflushed_bytes  # type: ignore[attr-defined]
        )
        _gauge("rmqstore.writer.dispatch.lag", "By", "appended, not yet dispatched and published to query nodes").watch(
            writer, store, lambda w: w.dispatch_lag_bytes  # type: ignore[attr-defined]
        )

    def appended(self, messages: int, size_bytes: int, started: float) -> None:
        self.append_duration.record(time.perf_counter() - started)
        self.messages.add(messages)
        self.bytes.add(size_bytes)


class QueryMetrics:
    """The query node's instruments; its gauges carry the store as ``rmqstore.store``."""

    def __init__(self, view: StoreView):
        meter = metrics.get_meter(_METER_NAME)
        self.duration = meter.create_histogram(
            "rmqstore.query.duration", unit="s", description="time to answer one lookup"
        )
        store = {"rmqstore.store": view.root}
        _gauge("rmqstore.query.lag", "By", "published by the writer, not yet visible here").watch(
            view, store, lambda v: v.status().lag_bytes  # type: ignore[attr-defined]
        )
        _gauge("rmqstore.query.staleness", "ms", "time since this node last read the writer's progress").watch(
            view, store, lambda v: v.status().refreshed_ago_ms  # type: ignore[attr-defined]
        )

    @contextmanager
    def timed(self, lookup: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.duration.record(time.perf_counter() - started, {"rmqstore.lookup": lookup})
