"""A writer node, built from options: the store opened and recovered, the WriterService and
RocketMQ 5's MessagingService on one gRPC server, and its stop in order.

``rmqstore writer serve`` parses its flags into :class:`WriterOptions` and calls
:func:`serve`; tests start a node in their own process with :meth:`WriterNode.start`
(port 0: :attr:`WriterNode.port` is the one bound) and stop it with
:meth:`WriterNode.stop`."""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.directories import writer_store
from rmqstore.common.files.store import RequestedSizes, checked_sizes
from rmqstore.common.transport import endpoint_text, parse_endpoint
from rmqstore.service import process
from rmqstore.service.limits import ServerLimits
from rmqstore.service.listen import ListenOptions, free_port
from rmqstore.writer.config import LARGE_ANSWER_BYTES_PER_S, FlushPolicy, WriterConfig

if TYPE_CHECKING:
    from rmqstore.service.metrics import MetricsEndpoint
    from rmqstore.writer.consumers import ConsumerGroups
    from rmqstore.writer.replication.election import EtcdElection
    from rmqstore.writer.replication.follower import Follower
    from rmqstore.writer.replication.forward import ForwardingServicer
    from rmqstore.writer.replication.group import GroupOptions
    from rmqstore.writer.replication.replica import Replica
    from rmqstore.writer.rocketmq5 import MessagingServicer
    from rmqstore.writer.service import WriterServicer
    from rmqstore.writer.store import AppendResults, Writer


log = logging.getLogger("rmqstore.writer")

@dataclass(frozen=True)
class WriterOptions:
    """What a writer node is started with (``rmqstore writer serve``'s options, whose
    defaults these are)."""

    store: str  # the store directory, created if missing
    # Make a store in a non-empty directory that holds none (else refused: a mistyped path
    # never gets a store's files written beside a user's own).
    init: bool = False
    listen: ListenOptions = field(default_factory=ListenOptions)
    sizes: RequestedSizes = field(default_factory=RequestedSizes)
    flush: FlushPolicy = FlushPolicy.ASYNC
    flush_interval_ms: int = 500  # ASYNC: fsync this often
    # ip:port written into records and msgIds (None: 127.0.0.1 and the port served on).
    store_host: str | None = None
    auto_create_topics: bool = True
    max_topics: int = 10_000  # topics clients may make, in all
    max_queues: int = 100_000  # queues of all topics
    max_groups: int = 1_000  # consumer groups the gateway keeps progress for
    # HOST:PORT RocketMQ 5 clients are routed to by QueryRoute (None: the listen address).
    advertise: str | None = None
    broker_name: str = "rmqstore-0"
    consumer_flush_interval_ms: int = 1000  # the consumer groups' progress written this often
    consumer_max_attempts: int = 17  # deliveries before a message goes to %DLQ%<group>
    consumer_retry_delays_s: tuple[int, ...] | None = None  # None: Apache's levels
    consumer_min_invisible_ms: int = 10_000  # Apache's proxy's minInvisibleTimeMillsForRecv
    fifo_groups: tuple[str, ...] = ()  # consumer groups that consume FIFO
    # Large answers' bytes a second, every client's together (--large-answer-rate; 0: unlimited).
    large_answer_bytes_per_s: int = LARGE_ANSWER_BYTES_PER_S
    retention_hours: float = 72.0
    retention_delete_hours: tuple[int, ...] = WriterConfig.retention_delete_hours  # hours of day files expire in
    disk_clean_ratio: float = 0.75
    disk_full_ratio: float = 0.90
    truncate_corrupt_tail: bool = False
    auto_create_queue_count: int = WriterConfig.auto_create_queue_count  # queues of a topic a send creates
    default_queue_count: int = WriterConfig.default_queue_count  # queues of a topic created without a count
    limits: ServerLimits = field(default_factory=ServerLimits)
    # How far ahead a timed message may be due (--timer-max-delay; Apache's timerMaxDelaySec).
    timer_max_delay_ms: int = WriterConfig.timer_max_delay_ms
    # Transactions' checks (--transaction-*; Apache's transactionTimeOut,
    # transactionCheckInterval and transactionCheckMax).
    transaction_timeout_ms: int = 6_000
    transaction_check_interval_ms: int = 30_000
    transaction_check_max: int = 15
    # The periodic flushes and retention; False leaves them to whoever drives the store
    # (a test calling flush and run_retention itself).
    background: bool = True
    # A replica of a writer group (docs/replication.md); None: a single node.
    group: GroupOptions | None = None


@dataclass(frozen=True)
class CheckedWriterOptions:
    """Options whose files and ports were checked, before the store is opened: a bad TLS
    file, ACL, directory or taken port costs no recovery."""

    options: WriterOptions
    listen: process.CheckedListen
    port: int  # to listen on: the option's, or with port 0 and no store host a free one taken now


def check(options: WriterOptions) -> CheckedWriterOptions:
    """The options' TLS files, ACL, ports and store directory, checked (InvalidArgument
    naming the option otherwise)."""
    listen = process.check_listen(options.listen)
    writer_store(options.store, "--store", init=options.init)
    port = options.listen.port
    if port == 0 and options.store_host is None:
        # Records and msgIds carry the store host's port: take the port now, so that they
        # name the one the node serves on rather than a placeholder.
        port = free_port(options.listen.host)
    return CheckedWriterOptions(options, listen, port)


class WriterNode(process.ServingNode):
    """A writer node serving: its store recovered and its background tasks running, its
    services on a gRPC server (asyncio, on a thread of its own)."""

    KIND = process.NodeKind(
        name="writer",
        service_name="rmqstore-writer",
        watchdog_name="writer",
        shutdown_grace_s=10.0,
        # The final flush and checkpoint included: within the chart's default termination
        # grace, 60 s.
        stop_within_s=50.0,
    )

    def __init__(self, checked: CheckedWriterOptions, metrics: MetricsEndpoint | None = None):
        """Open the store (recovery), start its background tasks and serve. ``metrics``:
        the endpoint the process's metrics are served on, named in the serving line."""
        from rmqstore.rocketmq_v2 import service_pb2_grpc as messaging_pb2_grpc
        from rmqstore.v1 import replication_pb2_grpc, writer_pb2_grpc
        from rmqstore.writer.consumers import ConsumerGroups, check_group
        from rmqstore.writer.replication.service import SERVICE_NAME as REPLICATION_SERVICE_NAME
        from rmqstore.writer.rocketmq5 import (
            DEFAULT_RETRY_DELAYS_S,
            ConsumerPolicy,
            MessagingServicer,
            RouteConfig,
            acl_rules,
        )
        from rmqstore.writer.rocketmq5 import SERVICE_NAME as MESSAGING_SERVICE_NAME
        from rmqstore.writer.service import SERVICE_NAME, WriterServicer
        from rmqstore.writer.store import Writer
        from rmqstore.writer.timers import ScheduledDelivery
        from rmqstore.writer.transaction_check import TransactionCheck
        from rmqstore.writer.transactions import TransactionSettings

        options, listen, port = checked.options, checked.options.listen, checked.port
        self.options = options
        config = WriterConfig(
            store=options.store,
            sizes=checked_sizes(options.store, options.sizes),
            flush=options.flush,
            flush_interval_ms=options.flush_interval_ms,
            store_host=options.store_host or f"127.0.0.1:{port}",
            auto_create_topics=options.auto_create_topics,
            max_topics=options.max_topics,
            max_queues=options.max_queues,
            auto_create_queue_count=options.auto_create_queue_count,
            default_queue_count=options.default_queue_count,
            retention_hours=options.retention_hours,
            retention_delete_hours=options.retention_delete_hours,
            disk_clean_ratio=options.disk_clean_ratio,
            disk_full_ratio=options.disk_full_ratio,
            truncate_corrupt_tail=options.truncate_corrupt_tail,
            timer_max_delay_ms=options.timer_max_delay_ms,
        )
        self.config = config
        # Checked before recovery, like the TLS files; without an advertised endpoint the
        # port is the bound one, known once the server listens.
        route = RouteConfig.parse(options.advertise or endpoint_text(listen.host, port or 1), options.broker_name)
        for group in options.fifo_groups:
            try:
                check_group(group)
            except InvalidArgument as error:
                raise InvalidArgument(f"--fifo-group: {error}") from None
        policy = ConsumerPolicy(
            max_attempts=options.consumer_max_attempts,
            retry_delays_s=options.consumer_retry_delays_s or DEFAULT_RETRY_DELAYS_S,
            min_invisible_ms=options.consumer_min_invisible_ms,
            large_answer_bytes_per_s=options.large_answer_bytes_per_s,
        )
        writer = Writer(config)
        try:
            scheduled = ScheduledDelivery(writer)
            transactions = TransactionCheck(
                writer,
                TransactionSettings(
                    options.transaction_timeout_ms, options.transaction_check_interval_ms, options.transaction_check_max
                ),
            )
            groups = ConsumerGroups(
                writer,
                writer.paths.config,
                flush_interval_ms=options.consumer_flush_interval_ms,
                fifo_groups=frozenset(options.fifo_groups),
                max_groups=options.max_groups,
            )
        except BaseException:
            writer.close()
            raise
        if options.background:
            writer.start_background()
        servicer = WriterServicer(writer, stalled_write_s=options.limits.stalled_write_s)
        # RocketMQ 5's producers share the WriterService's group commit: one appender per loop.
        messaging = MessagingServicer(writer, servicer.appender, route, groups, policy, transactions)
        replica: Replica | None = None
        if options.group is not None:
            from rmqstore.writer.replication.forward import ForwardingServicer
            from rmqstore.writer.replication.replica import Replica
            from rmqstore.writer.replication.service import ReplicationServicer

            replica = Replica(options.group, writer, groups)
            servicer.appender.gate = replica.tracker
            groups.replicated = True
            messaging.progress_taken.append(replica.tracker.progress_taken)
            if options.group.waits_for_followers:
                messaging.progress_gate = replica.tracker
            replication = ReplicationServicer(replica)
            # Any replica serves RocketMQ 5 clients: a follower forwards to the primary.
            forwarding = ForwardingServicer(messaging, replica)

        def register(server: grpc.aio.Server) -> None:
            writer_pb2_grpc.add_WriterServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]  # generated
            if replica is None:
                messaging_pb2_grpc.add_MessagingServiceServicer_to_server(messaging, server)  # type: ignore[no-untyped-call]  # generated
            else:
                messaging_pb2_grpc.add_MessagingServiceServicer_to_server(forwarding, server)  # type: ignore[no-untyped-call]  # generated
                replication_pb2_grpc.add_ReplicationServiceServicer_to_server(replication, server)  # type: ignore[no-untyped-call]  # generated

        names = [SERVICE_NAME, MESSAGING_SERVICE_NAME]
        if replica is not None:
            names.append(REPLICATION_SERVICE_NAME)
        try:
            serving = process.start_serving(register, names, checked.listen, port, options.limits, acl_rules())
        except BaseException:
            servicer.close()
            writer.close()
            raise
        if not options.advertise:
            # A writer group's replica is reached at the endpoint --replicas names for it.
            own = parse_endpoint(options.group.endpoint) if options.group is not None else (route.advertise_host, serving.port)
            messaging.route = RouteConfig(own[0], own[1], route.broker_name)
        serving.call(messaging.start_flushing())
        if options.background:
            serving.call(messaging.start_checking())
        # Released messages wake the long polls on their real topics, on the server's loop.

        def released(results: AppendResults) -> None:
            serving.loop.call_soon_threadsafe(messaging.wakeup.appended, results)

        scheduled.released = released
        if options.background:
            scheduled.start()
        self.scheduled: ScheduledDelivery = scheduled
        self.replica: Replica | None = replica
        self.follower: Follower | None = None
        self.election: EtcdElection | None = None
        self.forwarding: ForwardingServicer | None = None
        if replica is not None:
            self.follower, self.election = _start_replica(replica, serving)
            self.forwarding = forwarding
        self.writer: Writer = writer
        self.groups: ConsumerGroups = groups
        self.servicer: WriterServicer = servicer
        self.messaging: MessagingServicer = messaging
        super().__init__(serving, listen, metrics)

    @classmethod
    def start(cls, options: WriterOptions, metrics: MetricsEndpoint | None = None) -> WriterNode:
        """Check the options, then open the store and serve."""
        return cls(check(options), metrics)

    def serving_line(self) -> dict[str, Any]:
        """The line ``writer serve`` prints once it serves (docs/writer.md)."""
        recovery = self.writer.recovery
        route = self.messaging.route
        return {
            "event": "serving",
            "service": "writer",
            "port": self.port,
            "store": self.config.store,
            "flush": self.config.flush.value,
            "advertise": endpoint_text(route.advertise_host, route.advertise_port),
            **self.listen_fields(),
            "recovered": {
                "uncleanShutdown": recovery.unclean,
                "endOffset": recovery.stop.end_offset,
                "stop": recovery.stop.reason.value,
                "redispatchedRecords": recovery.redispatched_records,
            },
        }

    def close(self, grace_s: float) -> None:
        """End the streams, stop the server (open requests get ``grace_s``), then write the
        groups' progress, the final flush and the checkpoint."""
        if self.election is not None:
            self.election.stop()
        if self.follower is not None:
            self.follower.stop()
        self.serving.call(self.messaging.end_streams())
        if self.forwarding is not None:
            self.serving.call(self.forwarding.close())  # calls being forwarded end now (the clients retry)
        self.serving.stop(grace_s)
        self.scheduled.stop()  # its progress written while the writer is open
        self.servicer.close()
        try:
            self.groups.flush()  # no handler runs now: the groups' progress as it stands
        except OSError as error:
            # A full disk, say: the files keep the last progress written whole (each is
            # replaced by a rename), and the store still closes cleanly.
            log.error("the consumer groups' progress could not be written at the stop: %s", error)
        self.writer.close()
        if self.election is not None:
            self.election.release()


def _start_replica(replica: Replica, serving: Any) -> tuple[Follower, EtcdElection | None]:
    """A group's replica, once its server serves: the tracker's clock on the loop, the
    replication thread and, with etcd, the election's."""
    from rmqstore.writer.replication.follower import Follower
    from rmqstore.writer.replication.metrics import watch_replica

    async def start_tracker() -> None:
        replica.loop = asyncio.get_running_loop()
        replica.tracker.start()

    serving.call(start_tracker())
    follower = Follower(replica, manual=not replica.options.etcd)
    watch_replica(replica, follower)
    follower.start()
    election = None
    if replica.options.etcd:
        from rmqstore.writer.replication.election import EtcdElection

        election = EtcdElection(replica)
        election.start()
    return follower, election


def serve(options: WriterOptions) -> None:
    """Run a writer node in this process until SIGTERM or SIGINT (service.process.run_node)."""
    checked = check(options)
    process.run_node(WriterNode.KIND, options.listen, lambda metrics: WriterNode(checked, metrics), before_serving=_tune_collector)


def _tune_collector() -> None:
    # A batch's columns are thousands of short-lived objects, freed by their reference
    # counts (no cycles), yet each 700 allocations set the cyclic collector off over the
    # young objects, and often enough over the whole heap (its cost: benchmarks/WRITE_PATH.md).
    # What is alive once serving (modules, the store's state) is moved out of its passes,
    # and the youngest generation is collected every 10,000 allocations.
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)

