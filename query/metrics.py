"""The query node's OpenTelemetry instruments (docs/observability.md, Metrics), from the
process's meter provider (service.metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rmqstore.common.files.progress import read_progress
from rmqstore.service.metrics import duration_histogram_s, gauge

if TYPE_CHECKING:
    from rmqstore.query.view import StoreView


def _query_lag(view: StoreView) -> tuple[int, int | None]:
    """Bytes and milliseconds of store time the node shows less than the writer has
    published now (the node itself catches up only when it next serves a lookup). The
    time is unknown without the writer's progress file (a store Apache's broker wrote)."""
    status = view.status()
    progress = read_progress(view.root)
    if progress is None:
        return status.lag_bytes, None
    lag_bytes = max(progress.dispatched_offset - status.visible_offset, 0)
    if lag_bytes == 0:
        return 0, 0
    return lag_bytes, max(progress.last_store_timestamp_ms - status.last_store_timestamp_ms, 0)


class QueryMetrics:
    """The query node's instruments; its gauges carry the store as ``rmqstore.store``."""

    def __init__(self, view: StoreView):
        self.duration = duration_histogram_s("rmqstore.query.duration", "time to answer one lookup")
        store: dict[str, str | int] = {"rmqstore.store": view.root}
        gauge("rmqstore.query.lag", "By", "published by the writer, not yet visible here").watch(
            view, store, lambda v: _query_lag(v)[0]
        )
        gauge(
            "rmqstore.query.lag.time", "ms", "store time between the writer's newest published message and this node's"
        ).watch(view, store, lambda v: _query_lag(v)[1])
        gauge("rmqstore.query.staleness", "ms", "time since this node last read the writer's progress").watch(
            view, store, lambda v: v.status().refreshed_ago_ms
        )

    def record(self, lookup: str, duration_s: float) -> None:
        """One lookup's duration."""
        self.duration.record(duration_s, {"rmqstore.lookup": lookup})
