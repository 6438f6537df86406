"""The proxy's OpenTelemetry instruments (docs/observability.md, Metrics), from the
process's meter provider (service.metrics): what it coalesced into each writer group's
batches, and the calls to a group's nodes that failed. Every instrument carries the group's
broker name as ``rmqstore.group``. The proxy's own RPCs (every client's SendMessage,
ReceiveMessage, …) are ``rpc.server.duration``, as on every node."""

from __future__ import annotations

import functools

import grpc
from opentelemetry import metrics

from rmqstore.service.metrics import METER_NAME, metrics_on

# Messages per coalesced batch: one (no other send within the linger) to the largest
# --batch-max worth having, by powers of two.
BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class ProxyMetrics:
    def __init__(self) -> None:
        meter = metrics.get_meter(METER_NAME)
        self.messages = meter.create_counter(
            "rmqstore.proxy.messages", unit="{message}", description="client messages sent to a writer group in coalesced batches"
        )
        self.batches = meter.create_counter(
            "rmqstore.proxy.batches", unit="{batch}", description="coalesced batches sent to a writer group"
        )
        self.batch_size = meter.create_histogram(
            "rmqstore.proxy.batch.size", unit="{message}", description="messages per coalesced batch",
            explicit_bucket_boundaries_advisory=BATCH_SIZE_BOUNDS,
        )  # fmt: skip
        self.acks = meter.create_counter(
            "rmqstore.proxy.acks", unit="{message}", description="acknowledgements sent to a writer group in coalesced calls"
        )
        self.upstream_errors = meter.create_counter(
            "rmqstore.proxy.upstream.errors", unit="{call}",
            description="calls to a writer group's writers or query nodes that failed, by status code",
        )  # fmt: skip

    def batch_sent(self, group: str, size: int) -> None:
        if not metrics_on():
            return
        attributes = {"rmqstore.group": group}
        self.messages.add(size, attributes)
        self.batches.add(1, attributes)
        self.batch_size.record(size, attributes)

    def acks_sent(self, group: str, count: int) -> None:
        if metrics_on():
            self.acks.add(count, {"rmqstore.group": group})

    def upstream_failed(self, group: str, code: grpc.StatusCode) -> None:
        if metrics_on():
            self.upstream_errors.add(1, {"rmqstore.group": group, "rpc.grpc.status_code": code.value[0]})


@functools.cache
def proxy_metrics() -> ProxyMetrics:
    """The process's instruments, made on first use (after the node configured metrics)."""
    return ProxyMetrics()
