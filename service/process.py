"""What a writer node and a query node share: their listening options checked, the server
they serve on, their stop, and the process that runs one until it is told to stop
(``writer serve``, ``query serve``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import grpc

from rmqstore.service.limits import ServerLimits
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
    from rmqstore.service.acl import Acl, MethodRule
    from rmqstore.service.metrics import MetricsEndpoint
    from rmqstore.service.server import AsyncServing


@dataclass(frozen=True)
class NodeKind:
    """What tells a kind of node apart in its process."""

    name: str  # the serving and stopped lines' "service": writer, query
    service_name: str  # its telemetry's service.name
    watchdog_name: str  # how the stop watchdog's log line names it
    shutdown_grace_s: float  # open requests get this long to finish once it is told to stop
    stop_within_s: float  # the whole stop within this, else the stop watchdog ends the process


@dataclass(frozen=True)
class CheckedListen:
    """Listening options whose TLS files, ACL and ports were checked."""

    listen: ListenOptions
    credentials: grpc.ServerCredentials | None
    acl: Acl | None


def check_listen(listen: ListenOptions) -> CheckedListen:
    """The TLS files, ACL and ports of ``listen``, checked before a node opens its store
    (InvalidArgument naming the option otherwise)."""
    credentials = server_credentials(listen)
    acl = access(listen)
    check_ports(listen)
    return CheckedListen(listen, credentials, acl)


def start_serving(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    checked: CheckedListen,
    port: int,
    limits: ServerLimits,
    acl_rules: Mapping[str, MethodRule] | None = None,
) -> AsyncServing:
    """A node's services (``register``) served on ``port`` as ``checked`` says, under
    ``limits``; a port it cannot bind is a usage error naming it."""
    from rmqstore.service.server import AsyncServing

    listen = checked.listen
    with listening(listen, port):
        return AsyncServing(
            register, service_names, host=listen.host, port=port, credentials=checked.credentials,
            health_port=listen.health_port, workers=listen.workers, limits=limits.calls,
            acl=checked.acl, acl_rules=acl_rules, connection_idle_max_ms=limits.connection_idle_max_ms,
        )  # fmt: skip


class ServingNode:
    """A node serving on ``serving`` (grpc's asyncio server, on a thread of its own),
    stopped once, by :meth:`stop` or on leaving a ``with`` block. A node kind defines
    :attr:`KIND`, :meth:`close` (its stop after the server's) and its serving line's own
    fields."""

    KIND: NodeKind

    def __init__(self, serving: AsyncServing, listen: ListenOptions, metrics: MetricsEndpoint | None):
        """``metrics``: the endpoint the process's metrics are served on, named in the
        serving line."""
        self.serving = serving
        self.listen = listen
        self.metrics = metrics
        self._stopped = False

    @property
    def port(self) -> int:
        """The port the node serves on (the kernel's pick for port 0)."""
        return int(self.serving.port)

    @property
    def health_port(self) -> int | None:
        return self.serving.health_port

    @property
    def endpoint(self) -> str:
        return f"{self.listen.host}:{self.port}"

    def listen_fields(self) -> dict[str, Any]:
        """What the serving line says about TLS, access control and the extra ports."""
        return serving_fields(self.listen, self.health_port, self.metrics)

    def serving_line(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self, grace_s: float) -> None:
        """Stop serving (open requests get ``grace_s``) and release what the node holds."""
        raise NotImplementedError

    def stop(self, grace_s: float | None = None) -> None:
        """:meth:`close`, once (default grace: the kind's ``shutdown_grace_s``); a second
        call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        self.close(self.KIND.shutdown_grace_s if grace_s is None else grace_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.stop()


def run_node(
    kind: NodeKind,
    listen: ListenOptions,
    start: Callable[[MetricsEndpoint | None], ServingNode],
    *,
    before_serving: Callable[[], None] | None = None,
) -> None:
    """Run a node of ``kind`` in this process until SIGTERM or SIGINT, then stop it under
    the stop watchdog (the kind's ``stop_within_s``).

    The signal handlers come first, so that a signal while ``start`` builds the node (a
    writer's recovery) or right after the serving line still ends in a clean stop; then
    tracing, logging and metrics as the environment asks (the kind's ``service_name``;
    docs/observability.md); then the node, ``before_serving``, and its serving line on
    stdout (JSON); once it has stopped, ``{"event": "stopped", "service": kind.name}``.
    The caller checks the node's options first: a bad one costs nothing of this."""
    from rmqstore.common.telemetry import configure_tracing
    from rmqstore.service.logs import configure_logging
    from rmqstore.service.metrics import configure_metrics

    stopping = stop_requested()
    configure_tracing(kind.service_name)
    configure_logging(kind.service_name)
    metrics = configure_metrics(kind.service_name, scrape_host=listen.host, scrape_port=listen.metrics_port)
    node = start(metrics)
    if before_serving is not None:
        before_serving()
    print(json.dumps(node.serving_line()), flush=True)
    wait_for_stop(stopping)
    watchdog = stop_watchdog(kind.watchdog_name, kind.stop_within_s)
    node.stop()
    watchdog.cancel()
    print(json.dumps({"event": "stopped", "service": kind.name}), flush=True)
