"""A query node, built from options: a read-only view of a store directory, the
QueryService on a gRPC server, and its stop.

``rmqstore query serve`` parses its flags into :class:`QueryOptions` and calls
:func:`serve`; tests start a node in their own process with :meth:`QueryNode.start`
(port 0: :attr:`QueryNode.port` is the one bound) and stop it with :meth:`QueryNode.stop`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from rmqstore.common.files.directories import existing_store
from rmqstore.common.files.store import RequestedSizes, checked_sizes
from rmqstore.query.groups import BROKER_NAME_DEFAULT
from rmqstore.service import process
from rmqstore.service.limits import ServerLimits
from rmqstore.service.listen import ListenOptions

if TYPE_CHECKING:
    from rmqstore.query.view import StoreView
    from rmqstore.service.metrics import MetricsEndpoint


@dataclass(frozen=True)
class QueryOptions:
    """What a query node is started with (``rmqstore query serve``'s options, whose
    defaults these are)."""

    store: str  # the store directory, never written
    listen: ListenOptions = field(default_factory=ListenOptions)
    sizes: RequestedSizes = field(default_factory=RequestedSizes)
    # Resident mapped store pages kept before they are dropped (None: query.view's
    # MAPPED_RESIDENT_BUDGET_BYTES).
    mapped_budget_mb: int | None = None
    broker_name: str = BROKER_NAME_DEFAULT  # what consumerProgress shows: the writer's broker name
    # A lookup's response bytes at the most (None: query.view's RESPONSE_BYTES_MAX).
    response_bytes_max: int | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)


@dataclass(frozen=True)
class CheckedQueryOptions:
    """Options whose files and ports were checked, before the store is mapped."""

    options: QueryOptions
    listen: process.CheckedListen


def check(options: QueryOptions) -> CheckedQueryOptions:
    """The options' TLS files, ACL, ports and store directory, checked (InvalidArgument
    naming the option otherwise)."""
    listen = process.check_listen(options.listen)
    existing_store(options.store, "--store", empty_ok=True)
    return CheckedQueryOptions(options, listen)


class QueryNode(process.ServingNode):
    """A query node serving: its view of the store open, the QueryService on a gRPC server
    (asyncio, on a thread of its own)."""

    KIND = process.NodeKind(
        name="query", service_name="rmqstore-query", watchdog_name="query node", shutdown_grace_s=5.0, stop_within_s=30.0
    )

    def __init__(self, checked: CheckedQueryOptions, metrics: MetricsEndpoint | None = None):
        """Map the store and serve. ``metrics``: the endpoint the process's metrics are
        served on, named in the serving line."""
        from rmqstore.query.service import SERVICE_NAME, AsyncQueryServicer
        from rmqstore.query.view import StoreView
        from rmqstore.v1 import query_pb2_grpc

        options, listen = checked.options, checked.options.listen
        self.options = options
        budget = options.mapped_budget_mb
        view = StoreView(
            options.store,
            checked_sizes(options.store, options.sizes),
            mapped_budget_bytes=None if budget is None else budget << 20,
            response_bytes_max=options.response_bytes_max,
        )

        def register(server: grpc.aio.Server) -> None:
            servicer = AsyncQueryServicer(view, stalled_write_s=options.limits.stalled_write_s, broker_name=options.broker_name)
            query_pb2_grpc.add_QueryServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]  # generated

        try:
            serving = process.start_serving(register, [SERVICE_NAME], checked.listen, listen.port, options.limits)
        except BaseException:
            view.close()
            raise
        self.view: StoreView = view
        super().__init__(serving, listen, metrics)

    @classmethod
    def start(cls, options: QueryOptions, metrics: MetricsEndpoint | None = None) -> QueryNode:
        """Check the options, then map the store and serve."""
        return cls(check(options), metrics)

    def serving_line(self) -> dict[str, Any]:
        """The line ``query serve`` prints once it serves (docs/query.md)."""
        status = self.view.status()
        return {
            "event": "serving",
            "service": "query",
            "port": self.port,
            "store": self.options.store,
            "followsWriter": status.has_progress,
            "visibleOffset": status.visible_offset,
            **self.listen_fields(),
        }

    def close(self, grace_s: float) -> None:
        """Stop the server (open requests get ``grace_s``) and unmap the store."""
        self.serving.stop(grace_s)
        self.view.close()


def serve(options: QueryOptions) -> None:
    """Run a query node in this process until SIGTERM or SIGINT (service.process.run_node)."""
    checked = check(options)
    process.run_node(QueryNode.KIND, options.listen, lambda metrics: QueryNode(checked, metrics))
