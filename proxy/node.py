"""``rmqstore proxy serve``: a proxy node (cluster mode, docs/cluster.md) serving RocketMQ
5's MessagingService in front of the writer groups of a cluster file, which it reads again
when it changes. It keeps nothing of its own: killing one loses nothing stored."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.transport import endpoint_text, parse_endpoint
from rmqstore.proxy.upstream import Upstream, UpstreamOptions
from rmqstore.service import process
from rmqstore.service.limits import ServerLimits
from rmqstore.service.listen import ListenOptions

if TYPE_CHECKING:
    from rmqstore.proxy.cluster import ClusterFile
    from rmqstore.proxy.gateway import ProxyServicer
    from rmqstore.rocketmq_v2 import definition_pb2
    from rmqstore.service.metrics import MetricsEndpoint

# The coalescing defaults (benchmarks/CLUSTER.md): a batch waits at most this long for
# more messages, and leaves at once with this many.
DEFAULT_LINGER_MS = 2.0
DEFAULT_BATCH_MAX = 512
LINGER_MS_MAX = 1000.0
# The cluster file is looked at this often for a change.
RELOAD_INTERVAL_S = 1.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProxyOptions:
    cluster: str
    listen: ListenOptions = field(default_factory=ListenOptions)
    advertise: tuple[str, ...] = ()  # the endpoints QueryRoute names (default: the listen address)
    linger_ms: float = DEFAULT_LINGER_MS
    batch_max: int = DEFAULT_BATCH_MAX
    limits: ServerLimits = field(default_factory=ServerLimits)
    # The key lookup cursors are signed with, shared by the proxies (made if missing);
    # empty: this process's own, so a cursor continues only through this proxy.
    cursor_key: str = ""
    # How the groups' writers and query nodes are dialled (TLS, the proxy's own user).
    upstream: UpstreamOptions = field(default_factory=UpstreamOptions)


@dataclass(frozen=True)
class CheckedProxy:
    """A proxy's options checked: its cluster file read, its listening options (TLS files,
    ACL, ports) and its upstream TLS files and credentials."""

    options: ProxyOptions
    cluster: ClusterFile
    listen: process.CheckedListen
    upstream: Upstream


def advertised_endpoints(endpoints: tuple[str, ...]) -> definition_pb2.Endpoints:
    """The Endpoints every route names: all IP addresses (one scheme) or one host name."""
    import ipaddress

    from rmqstore.rocketmq_v2 import definition_pb2 as v2

    parsed = [parse_endpoint(endpoint) for endpoint in endpoints]
    versions: set[int] = set()
    for host, _ in parsed:
        try:
            versions.add(ipaddress.ip_address(host).version)
        except ValueError:
            versions.add(0)
    if len(versions) != 1 or (0 in versions and len(parsed) > 1):
        raise InvalidArgument("--advertise: give IP addresses of one family, or one host name")
    scheme = {0: v2.DOMAIN_NAME, 4: v2.IPv4, 6: v2.IPv6}[versions.pop()]
    return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=port) for host, port in parsed])


class ProxyNode(process.ServingNode):
    KIND = process.NodeKind(
        name="proxy",
        service_name="rmqstore-proxy",
        watchdog_name="proxy",
        shutdown_grace_s=2.0,
        stop_within_s=20.0,
    )

    def __init__(self, checked: CheckedProxy, metrics: MetricsEndpoint | None = None):
        from rmqstore.common.files.cursorkey import ensure_key_file
        from rmqstore.proxy.gateway import ProxyServicer
        from rmqstore.proxy.lookups import ProxyQueryServicer
        from rmqstore.proxy.writes import ProxyWriterServicer
        from rmqstore.query.service import SERVICE_NAME as QUERY_SERVICE_NAME
        from rmqstore.rocketmq_v2 import service_pb2_grpc
        from rmqstore.v1 import query_pb2_grpc, writer_pb2_grpc
        from rmqstore.writer.rocketmq5 import SERVICE_NAME, acl_rules
        from rmqstore.writer.service import SERVICE_NAME as WRITER_SERVICE_NAME

        options, cluster, upstream = checked.options, checked.cluster, checked.upstream
        listen = options.listen
        advertise = options.advertise or (endpoint_text(listen.host, listen.port or 1),)
        servicer = ProxyServicer(
            cluster.groups, advertised_endpoints(advertise), linger_s=options.linger_ms / 1000, batch_max=options.batch_max,
            upstream=upstream,
        )  # fmt: skip
        writes = ProxyWriterServicer(cluster.groups, upstream)
        cursor_key = ensure_key_file(options.cursor_key) if options.cursor_key else None
        lookups = ProxyQueryServicer(cluster.groups, cursor_key, upstream)

        def register(server: grpc.aio.Server) -> None:
            service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]  # generated
            query_pb2_grpc.add_QueryServiceServicer_to_server(lookups, server)  # type: ignore[no-untyped-call]  # generated
            writer_pb2_grpc.add_WriterServiceServicer_to_server(writes, server)  # type: ignore[no-untyped-call]  # generated

        # Under --acl the proxy checks its clients exactly as the nodes do: the v2 gateway's
        # rules for MessagingService, the nodes' own for rmqstore.v1 (docs/cluster.md).
        names = [SERVICE_NAME, QUERY_SERVICE_NAME, WRITER_SERVICE_NAME]
        serving = process.start_serving(register, names, checked.listen, listen.port, options.limits, acl_rules())
        if not options.advertise:
            servicer.advertise = advertised_endpoints((endpoint_text(listen.host, serving.port),))
        serving.call(servicer.start())
        serving.call(lookups.start())
        serving.call(writes.start())
        self.options = options
        self.cluster = cluster
        self.servicer: ProxyServicer = servicer
        self.lookups: ProxyQueryServicer = lookups
        self.writes: ProxyWriterServicer = writes
        self._reloader = asyncio.run_coroutine_threadsafe(self._reload_loop(), serving.loop)
        super().__init__(serving, listen, metrics)

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_INTERVAL_S)
            try:
                if not self.cluster.changed():
                    continue
            except InvalidArgument as error:
                log.error("the cluster file was not reloaded (the groups stay as they were): %s", error)
                continue
            await self.servicer.set_groups(self.cluster.groups)
            await self.lookups.set_groups(self.cluster.groups)
            await self.writes.set_groups(self.cluster.groups)
            log.info("cluster file reloaded: groups %s", ", ".join(g.name for g in self.cluster.groups))

    def serving_line(self) -> dict[str, Any]:
        addresses = self.servicer.advertise.addresses
        return {
            "event": "serving",
            "service": "proxy",
            "port": self.port,
            "cluster": self.options.cluster,
            "groups": [group.name for group in self.cluster.groups],
            "advertise": [endpoint_text(a.host, a.port) for a in addresses],
            "linger_ms": self.options.linger_ms,
            "batch_max": self.options.batch_max,
            "upstreamTls": self.options.upstream.tls,
            "upstreamSigned": self.options.upstream.signed,
            **self.listen_fields(),
        }

    def close(self, grace_s: float) -> None:
        self._reloader.cancel()
        try:
            self.serving.call(self.servicer.close())
            self.serving.call(self.lookups.close())
            self.serving.call(self.writes.close())
        finally:
            self.serving.stop(grace_s)


def check(options: ProxyOptions) -> CheckedProxy:
    """The options checked (InvalidArgument naming the flag), the cluster file read, the
    TLS files and the ACL loaded and the ports tried: all before anything starts."""
    from rmqstore.proxy.cluster import ClusterFile

    if not 0 <= options.linger_ms <= LINGER_MS_MAX:
        raise InvalidArgument(f"--linger-ms must be 0-{LINGER_MS_MAX:g}, got {options.linger_ms:g}")
    if options.batch_max < 1:
        raise InvalidArgument(f"--batch-max must be at least 1, got {options.batch_max}")
    if options.advertise:
        advertised_endpoints(options.advertise)
    cluster = ClusterFile(options.cluster)
    upstream = Upstream(options.upstream)
    return CheckedProxy(options, cluster, process.check_listen(options.listen), upstream)


def serve(options: ProxyOptions) -> None:
    """Run a proxy node in this process until SIGTERM or SIGINT (service.process.run_node)."""
    checked = check(options)
    process.run_node(ProxyNode.KIND, options.listen, lambda metrics: ProxyNode(checked, metrics))
