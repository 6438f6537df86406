"""The writer's OpenTelemetry instruments (docs/observability.md, Metrics), from the
process's meter provider (service.metrics)."""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING

from opentelemetry import metrics

from rmqstore.common.sequences import all_equal
from rmqstore.service.metrics import METER_NAME, duration_histogram_s, gauge, metrics_on

if TYPE_CHECKING:
    from rmqstore.writer.store import AppendResults, Writer


def _disk_utilization(writer: Writer) -> float:
    usage = shutil.disk_usage(writer.config.store)
    return usage.used / usage.total if usage.total else 0.0


class WriterMetrics:
    """The writer's instruments; its gauges read the writer when the SDK collects and
    carry the store directory as ``rmqstore.store``."""

    def __init__(self, writer: Writer):
        meter = metrics.get_meter(METER_NAME)
        self.messages = meter.create_counter("rmqstore.writer.messages", unit="{message}", description="messages appended")
        self.bytes = meter.create_counter("rmqstore.writer.bytes", unit="By", description="commit log bytes appended")
        self.append_duration = duration_histogram_s(
            "rmqstore.writer.append.duration", "time to append and acknowledge one request (under SYNC, its fsync too)"
        )
        self.fsync_duration = duration_histogram_s(
            "rmqstore.writer.fsync.duration", "time to fsync the commit log bytes written since the last flush"
        )
        self._store = str(writer.config.store)
        writer.flush_observer = self.flushed
        store: dict[str, str | int] = {"rmqstore.store": self._store}
        gauge("rmqstore.writer.unflushed", "By", "written, not yet fsynced").watch(
            writer, store, lambda w: w.unflushed_bytes
        )
        gauge("rmqstore.writer.dispatch.lag", "By", "appended, not yet dispatched and published to query nodes").watch(
            writer, store, lambda w: w.dispatch_lag_bytes
        )
        gauge("rmqstore.writer.disk.utilization", "1", "used share of the store's file system").watch(
            writer, store, _disk_utilization
        )

    def appended(self, results: AppendResults, started: float) -> None:
        """One request acknowledged: its duration, and its messages and bytes per topic."""
        if not metrics_on():
            return
        self.append_duration.record(time.perf_counter() - started)
        topics = results.topics
        if not topics:
            return
        if all_equal(topics):  # one topic, the usual batch
            per_topic = {topics[0]: (len(topics), results.size_bytes)}
        else:
            counts: dict[str, list[int]] = {}
            for topic, size in zip(topics, results.sizes):
                entry = counts.setdefault(topic, [0, 0])
                entry[0] += 1
                entry[1] += size
            per_topic = {topic: (entry[0], entry[1]) for topic, entry in counts.items()}
        for topic, (count, size_bytes) in per_topic.items():
            attributes = {"messaging.destination.name": topic}
            self.messages.add(count, attributes)
            self.bytes.add(size_bytes, attributes)

    def flushed(self, size_bytes: int, duration_s: float) -> None:
        """An fsync of ``size_bytes`` commit log bytes took ``duration_s`` (flushes with
        nothing to write are not recorded: an idle ASYNC writer would fill the lowest
        bucket twice a second)."""
        if size_bytes > 0:
            self.fsync_duration.record(duration_s)
