"""OpenTelemetry metrics of the writer and the query node (docs/observability.md, Metrics):
their set-up and the instruments' common parts; each node's own instruments are in
writer.metrics and query.metrics.

Instruments come from the global meter provider: a no-op until :func:`configure_metrics`
installs the SDK (``OTEL_METRICS_EXPORTER=otlp|prometheus|console``, or an OTLP endpoint),
so an unconfigured process pays almost nothing; the few recordings that cost more than a
call (a batch's messages counted per topic, an RPC timed) first ask :func:`metrics_on`.

Names follow OpenTelemetry's semantic conventions where one exists (``rpc.server.duration``,
in milliseconds as that convention defines it, with ``rpc.system``, ``rpc.service``,
``rpc.method``, ``rpc.grpc.status_code``; ``messaging.destination.name`` for the topic);
rmqstore's own are dotted under ``rmqstore.``, their units in the ``unit`` field, durations
in seconds. Every duration histogram carries explicit bucket bounds from 50 µs to 10 s (the
SDK's defaults, 0, 5, 10, 25 … meant for milliseconds, put every observation here in the
first bucket). Gauges carry the store directory as ``rmqstore.store``.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.telemetry import exporter_requested

METER_NAME = "rmqstore"
_configured: MetricsEndpoint | None = None

# Bucket bounds of every duration histogram: 50 µs (a lookup served from the page cache)
# to 10 s (a stalled fsync), about three to a decade so that a 1 ms append and a 2 ms one
# land in different buckets.
DURATION_BOUNDS_S = (
    0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
    0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
DURATION_BOUNDS_MS = (
    0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0,
    100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
)  # fmt: skip
# The Prometheus exporter's customary port (OpenTelemetry's default for it).
PROMETHEUS_PORT_DEFAULT = 9464


@dataclass(frozen=True)
class MetricsEndpoint:
    """What :func:`configure_metrics` installed: the exporter, and for ``prometheus`` the
    address its scrape endpoint is bound to (the port the kernel chose for port 0)."""

    exporter: str
    scrape_host: str | None = None
    scrape_port: int | None = None


def metrics_requested(environ: dict[str, str] | None = None) -> str | None:
    """The metric exporter to use, or None for no metrics."""
    return exporter_requested("METRICS", environ)


def metrics_on() -> bool:
    """Whether an SDK meter provider is installed (else every instrument is a no-op).
    Asked once per call or request: where the SDK's metrics module is not even loaded no
    SDK meter provider can exist, and nothing is imported to say so (a node without
    metrics would load the module on its first request: benchmarks/TRACING.md); else an
    isinstance check."""
    sdk = sys.modules.get("opentelemetry.sdk.metrics")
    return sdk is not None and isinstance(metrics.get_meter_provider(), sdk.MeterProvider)


def configure_metrics(
    service_name: str, *, scrape_host: str = "127.0.0.1", scrape_port: int | None = None
) -> MetricsEndpoint | None:
    """Install an SDK meter provider if the environment asks for one: OTLP or console
    export every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (the SDK's default 60 s), or with
    ``prometheus`` a scrape endpoint on ``scrape_host:scrape_port`` (default 9464; 0 takes
    a free port). Returns what is on, None for no metrics. Safe to call more than once.

    A ``scrape_port`` without the ``prometheus`` exporter is refused: it would promise an
    endpoint that never answers. A port that cannot be bound is refused naming it."""
    global _configured
    exporter_name = metrics_requested()
    if scrape_port is not None and exporter_name != "prometheus":
        raise InvalidArgument(
            f"--metrics-port {scrape_port} serves Prometheus metrics: set OTEL_METRICS_EXPORTER=prometheus"
        )
    if exporter_name is None or _configured is not None:
        return _configured
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        MetricExporter,
        MetricReader,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource

    endpoint = MetricsEndpoint(exporter_name)
    reader: MetricReader
    if exporter_name == "prometheus":
        reader, endpoint = _prometheus_reader(scrape_host, PROMETHEUS_PORT_DEFAULT if scrape_port is None else scrape_port)
    else:
        exporter: MetricExporter
        if exporter_name == "console":
            exporter = ConsoleMetricExporter()
        elif exporter_name == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

            exporter = OTLPMetricExporter()
        else:
            raise InvalidArgument(
                f"OTEL_METRICS_EXPORTER={exporter_name!r}: rmqstore supports otlp, prometheus, console or none"
            )
        reader = PeriodicExportingMetricReader(exporter)
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
    _configured = endpoint
    return endpoint


def _prometheus_reader(host: str, port: int) -> tuple[Any, MetricsEndpoint]:
    """The SDK's Prometheus reader and prometheus_client's HTTP server (a daemon thread)
    answering ``GET /metrics`` on ``host:port``."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(port, addr=host)
    except OSError as error:
        raise InvalidArgument(
            f"--metrics-port {port}: cannot listen on {host} ({error.strerror or error}); is another process using it?"
        ) from None
    return PrometheusMetricReader(), MetricsEndpoint("prometheus", host, int(server.server_port))


def duration_histogram_s(name: str, description: str) -> metrics.Histogram:
    """A histogram of durations in seconds with :data:`DURATION_BOUNDS_S`."""
    return metrics.get_meter(METER_NAME).create_histogram(
        name, unit="s", description=description, explicit_bucket_boundaries_advisory=DURATION_BOUNDS_S
    )


class Gauge:
    """One observable gauge per process, observing every live owner (a writer, a store
    view, a server) with its own attributes: the API cannot unregister a callback, so
    owners are held weakly and drop out when they are gone. A reading of None is no
    observation (the value is unknown for now)."""

    def __init__(self, name: str, unit: str, description: str):
        self._owners: weakref.WeakKeyDictionary[
            object, tuple[dict[str, str | int], Callable[[Any], float | None]]
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        metrics.get_meter(METER_NAME).create_observable_gauge(name, [self._observe], unit=unit, description=description)

    def watch(self, owner: object, attributes: dict[str, str | int], read: Callable[[Any], float | None]) -> None:
        with self._lock:
            self._owners[owner] = (attributes, read)

    def _observe(self, options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            owners = list(self._owners.items())
        for owner, (attributes, read) in owners:
            value = read(owner)
            if value is not None:
                yield Observation(value, attributes)


_gauges: dict[str, Gauge] = {}
_gauges_lock = threading.Lock()


def gauge(name: str, unit: str, description: str) -> Gauge:
    """The process's observable gauge of that name (made on first use): each owner
    watches it with its own attributes."""
    with _gauges_lock:
        if name not in _gauges:
            _gauges[name] = Gauge(name, unit, description)
        return _gauges[name]


def watch_open_streams(limiter: object, port: int, read: Callable[[Any], int]) -> None:
    """``rmqstore.rpc.streams.open``: the streaming calls a server holds open now."""
    gauge("rmqstore.rpc.streams.open", "{stream}", "streaming calls open on this server").watch(
        limiter, {"server.port": port}, read
    )
