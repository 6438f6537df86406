"""What a writer node and a query node share once built: the server they serve on, their
stop, and the process that runs one until it is told to stop (``writer serve``,
``query serve``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from rmqstore.service.listen import ListenOptions, serving_fields
from rmqstore.service.stopping import stop_requested, stop_watchdog, wait_for_stop

if TYPE_CHECKING:
    from rmqstore.service.metrics import MetricsEndpoint
    from rmqstore.service.server import AsyncServing


class ServingNode:
    """A node serving on ``serving`` (grpc's asyncio server, on a thread of its own),
    stopped once, by :meth:`stop` or on leaving a ``with`` block. A node kind defines
    :meth:`close` (its stop after the server's) and its serving line's own fields."""

    def __init__(self, serving: AsyncServing, listen: ListenOptions, metrics: MetricsEndpoint | None, shutdown_grace_s: float):
        """``metrics``: the endpoint the process's metrics are served on, named in the
        serving line; ``shutdown_grace_s``: how long open requests get to finish once the
        node is told to stop."""
        self.serving = serving
        self.listen = listen
        self.metrics = metrics
        self.shutdown_grace_s = shutdown_grace_s
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
        """:meth:`close`, once (default grace: ``shutdown_grace_s``); a second call does
        nothing."""
        if self._stopped:
            return
        self._stopped = True
        self.close(self.shutdown_grace_s if grace_s is None else grace_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.stop()


def run_node(
    service_name: str,
    kind: str,
    listen: ListenOptions,
    start: Callable[[MetricsEndpoint | None], ServingNode],
    *,
    stop_within_s: float,
    watchdog_name: str,
    before_serving: Callable[[], None] | None = None,
) -> None:
    """Run a node in this process until SIGTERM or SIGINT, then stop it under the stop
    watchdog (``stop_within_s``; its log line names the node ``watchdog_name``).

    The signal handlers come first, so that a signal while ``start`` builds the node (a
    writer's recovery) or right after the serving line still ends in a clean stop; then
    tracing, logging and metrics as the environment asks (``service_name``;
    docs/observability.md); then the node, ``before_serving``, and its serving line on
    stdout (JSON); once it has stopped, ``{"event": "stopped", "service": kind}``. The
    caller checks the node's options first: a bad one costs nothing of this."""
    from rmqstore.common.telemetry import configure_tracing
    from rmqstore.service.logs import configure_logging
    from rmqstore.service.metrics import configure_metrics

    stopping = stop_requested()
    configure_tracing(service_name)
    configure_logging(service_name)
    metrics = configure_metrics(service_name, scrape_host=listen.host, scrape_port=listen.metrics_port)
    node = start(metrics)
    if before_serving is not None:
        before_serving()
    print(json.dumps(node.serving_line()), flush=True)
    wait_for_stop(stopping)
    watchdog = stop_watchdog(watchdog_name, stop_within_s)
    node.stop()
    watchdog.cancel()
    print(json.dumps({"event": "stopped", "service": kind}), flush=True)
