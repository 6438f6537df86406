"""A query node, built from options: a read-only view of a store directory, the
QueryService on a gRPC server, and its stop.

``rmqstore query serve`` parses its flags into :class:`QueryOptions` and calls
:func:`serve`; tests start a node in their own process with :meth:`QueryNode.start`
(port 0: :attr:`QueryNode.port` is the one bound) and stop it with :meth:`QueryNode.stop`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc

from rmqstore.common.files.directories import existing_store
from rmqstore.common.files.store import RequestedSizes, checked_sizes
from rmqstore.query.groups import BROKER_NAME_DEFAULT
from rmqstore.service.listen import (
    ListenOptions,
    access,
    check_ports,
    listening,
    server_credentials,
    serving_fields,
)
from rmqstore.service.stopping import stop_requested, stop_watchdog, wait_for_stop

if TYPE_CHECKING:
    from rmqstore.query.view import StoreView
    from rmqstore.service.acl import Acl
    from rmqstore.service.metrics import MetricsEndpoint
    from rmqstore.service.server import AsyncServing

SERVICE = "rmqstore-query"
# Open requests get this long to finish once the node is told to stop.
SHUTDOWN_GRACE_S = 5.0
# The whole stop within this, else stop_watchdog ends the process.
STOP_WITHIN_S = 30.0


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


@dataclass(frozen=True)
class CheckedQueryOptions:
    """Options whose files and ports were checked, before the store is mapped."""

    options: QueryOptions
    credentials: grpc.ServerCredentials | None
    acl: Acl | None


def check(options: QueryOptions) -> CheckedQueryOptions:
    """The options' TLS files, ACL, store directory and ports, checked (InvalidArgument
    naming the option otherwise)."""
    credentials = server_credentials(options.listen)
    acl = access(options.listen)
    existing_store(options.store, "--store")
    check_ports(options.listen)
    return CheckedQueryOptions(options, credentials, acl)


class QueryNode:
    """A query node serving: its view of the store open, the QueryService on a gRPC server
    (asyncio, on a thread of its own)."""

    def __init__(self, checked: CheckedQueryOptions, metrics: MetricsEndpoint | None = None):
        """Map the store and serve. ``metrics``: the endpoint the process's metrics are
        served on, named in the serving line."""
        from rmqstore.query.service import SERVICE_NAME, AsyncQueryServicer
        from rmqstore.query.view import StoreView
        from rmqstore.service.server import AsyncServing
        from rmqstore.v1 import query_pb2_grpc

        options, listen = checked.options, checked.options.listen
        self.options = options
        self.metrics = metrics
        budget = options.mapped_budget_mb
        view = StoreView(
            options.store,
            checked_sizes(options.store, options.sizes),
            mapped_budget_bytes=None if budget is None else budget << 20,
        )

        def register(server: grpc.aio.Server) -> None:
            servicer = AsyncQueryServicer(view, broker_name=options.broker_name)
            query_pb2_grpc.add_QueryServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]  # generated

        try:
            with listening(listen, listen.port):
                serving = AsyncServing(
                    register,
                    [SERVICE_NAME],
                    host=listen.host,
                    port=listen.port,
                    credentials=checked.credentials,
                    health_port=listen.health_port,
                    workers=listen.workers,
                    acl=checked.acl,
                )
        except BaseException:
            view.close()
            raise
        self.view: StoreView = view
        self.serving: AsyncServing = serving
        self._stopped = False

    @classmethod
    def start(cls, options: QueryOptions, metrics: MetricsEndpoint | None = None) -> QueryNode:
        """Check the options, then map the store and serve."""
        return cls(check(options), metrics)

    @property
    def port(self) -> int:
        """The port the node serves on (the kernel's pick for port 0)."""
        return int(self.serving.port)

    @property
    def health_port(self) -> int | None:
        return self.serving.health_port

    @property
    def endpoint(self) -> str:
        return f"{self.options.listen.host}:{self.port}"

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
            **serving_fields(self.options.listen, self.health_port, self.metrics),
        }

    def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop the server (open requests get ``grace_s``) and unmap the store. A second
        call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        self.serving.stop(grace_s)
        self.view.close()

    def __enter__(self) -> QueryNode:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.stop()


def serve(options: QueryOptions) -> None:
    """Run a query node in this process until SIGTERM or SIGINT, then stop it under the
    stop watchdog: the serving line and the stopped line on stdout (JSON), telemetry as
    the environment asks (docs/observability.md)."""
    from rmqstore.common.telemetry import configure_tracing
    from rmqstore.service.logs import configure_logging
    from rmqstore.service.metrics import configure_metrics

    checked = check(options)
    stopping = stop_requested()
    configure_tracing(SERVICE)
    configure_logging(SERVICE)
    metrics = configure_metrics(SERVICE, scrape_host=options.listen.host, scrape_port=options.listen.metrics_port)
    node = QueryNode(checked, metrics)
    print(json.dumps(node.serving_line()), flush=True)
    wait_for_stop(stopping)
    watchdog = stop_watchdog("query node", STOP_WITHIN_S)
    node.stop()
    watchdog.cancel()
    print(json.dumps({"event": "stopped", "service": "query"}), flush=True)
