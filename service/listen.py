"""Where and how a node listens: its address, TLS files, health and metrics ports, worker
threads and access control (the ``--host``, ``--port``, ``--tls-*``, ``--health-port``,
``--metrics-port``, ``--workers``, ``--acl`` and ``--insecure-open`` options of both
``writer serve`` and ``query serve``), checked before a node opens its store."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from rmqstore.common.errors import InvalidArgument

if TYPE_CHECKING:
    from rmqstore.service.acl import Acl
    from rmqstore.service.metrics import MetricsEndpoint

DEFAULT_WORKERS = 64


@dataclass(frozen=True)
class ListenOptions:
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port, the kernel's pick
    tls_cert: str | None = None  # PEM certificate (chain): serve TLS
    tls_key: str | None = None  # its PEM private key (unencrypted)
    tls_client_ca: str | None = None  # PEM CA every client certificate is signed by (mutual TLS)
    health_port: int | None = None  # grpc.health.v1 alone, in plaintext, on this port too
    metrics_port: int | None = None  # the Prometheus scrape endpoint (OTEL_METRICS_EXPORTER=prometheus)
    workers: int = DEFAULT_WORKERS  # threads running handlers
    acl: str | None = None  # the ACL file (service.acl): every call but health checks signed and checked
    insecure_open: bool = False  # a non-loopback host with neither an ACL nor mutual TLS


def server_credentials(options: ListenOptions) -> grpc.ServerCredentials | None:
    """The server's TLS credentials, None for plaintext; checks the files and the options'
    combinations first, so that a bad one stops the node before it starts."""
    from rmqstore.service.channels import load_server_credentials

    if options.workers < 1:
        raise InvalidArgument(f"--workers must be at least 1, got {options.workers}")
    if options.health_port is not None and options.health_port != 0 and options.health_port == options.port:
        raise InvalidArgument(f"--health-port {options.health_port} must differ from --port")
    if options.metrics_port:
        for option, other in (("--port", options.port), ("--health-port", options.health_port)):
            if options.metrics_port == other:
                raise InvalidArgument(f"--metrics-port {options.metrics_port} must differ from {option}")
    if options.tls_cert is None and options.tls_key is None:
        if options.tls_client_ca is not None:
            raise InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if options.tls_cert is None or options.tls_key is None:
        raise InvalidArgument("give --tls-cert and --tls-key together")
    return load_server_credentials(options.tls_cert, options.tls_key, options.tls_client_ca)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (a name may resolve anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def access(options: ListenOptions) -> Acl | None:
    """The node's ACL (None without one), after the rule that a node reachable from other
    hosts is closed to strangers: a non-loopback host needs an ACL, mutual TLS or an
    explicit ``insecure_open``."""
    from rmqstore.service.acl import load_acl

    if not is_loopback(options.host) and options.acl is None and options.tls_client_ca is None and not options.insecure_open:
        raise InvalidArgument(
            f"--host {options.host} is not a loopback address: give --acl FILE or mutual TLS (--tls-client-ca), "
            "or --insecure-open to let anyone who reaches the port call"
        )
    return None if options.acl is None else load_acl(options.acl)


def free_port(host: str) -> int:
    """A port free on ``host`` now (the kernel's pick), for a node asked for any port."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, 0))
        except OSError as error:
            raise InvalidArgument(f"--host {host}: cannot listen there ({error.strerror or error})") from None
        return int(probe.getsockname()[1])


def _refuse_taken(host: str, port: int, option: str) -> None:
    # gRPC reports a taken port in a log line of its own and an exception; a bind first
    # turns that into one clear error. With SO_REUSEADDR, as gRPC's own listener binds and
    # as a server should: a port still in TIME-WAIT from the connections of a node that was
    # killed (a container restarted in its pod) is free to listen on, while one another
    # process listens on is refused.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise InvalidArgument(
                f"{option} {port}: cannot listen on {host} ({error.strerror or error}); is another process using it?"
            ) from None


def check_ports(options: ListenOptions) -> None:
    """Refuse a taken port, health port or metrics port before the node opens its store."""
    ports = (("--port", options.port), ("--health-port", options.health_port), ("--metrics-port", options.metrics_port))
    for option, port in ports:
        if port:
            _refuse_taken(options.host, port, option)


@contextlib.contextmanager
def listening(options: ListenOptions, port: int) -> Iterator[None]:
    """A server that cannot bind its ports (``port``: the one it was given to listen on)
    is a usage error naming them."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        ports = f"--port {port}" + ("" if options.health_port is None else f" or --health-port {options.health_port}")
        raise InvalidArgument(f"{ports}: cannot listen on {options.host} ({error})") from None


def serving_fields(options: ListenOptions, health_port: int | None, metrics: MetricsEndpoint | None = None) -> dict[str, Any]:
    """What a node's serving line says about TLS, access control, the health port and the
    Prometheus scrape endpoint."""
    fields: dict[str, Any] = {
        "tls": options.tls_cert is not None,
        "clientAuth": options.tls_client_ca is not None,
        "acl": options.acl is not None,
    }
    if health_port is not None:
        fields["healthPort"] = health_port
    if metrics is not None and metrics.scrape_port is not None:
        fields["metricsPort"] = metrics.scrape_port
    return fields
