"""apache.rocketmq.v2.MessagingService for producers, in front of writer groups (cluster
mode, docs/cluster.md). QueryRoute asks every group's writer for the topic's route (the
writer makes the topic as a first send would) and answers with every answering group's
queues, each under its broker name, all reached through the proxies' endpoints. A send
goes to one group's queue chosen here, as Apache's proxy chooses (a FIFO message group by
its hash over every group's queues, so a group stays on one queue; other messages round
robin over the groups that are up), and is stored through that group's coalesced batch
stream (:mod:`rmqstore.proxy.coalesce`), but for a transactional or timed message's
request, which goes whole to the group's writer gateway (:mod:`rmqstore.proxy.transactions`). Messages are read and checked by the writer's own
gateway reader (:class:`rmqstore.writer.rocketmq5.MessageReader`), so they are stored as
the writer's gateway stores them."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc

from rmqstore.proxy import consumers, queues, transactions
from rmqstore.proxy.cluster import GroupEndpoints
from rmqstore.proxy.coalesce import UNREACHABLE, BatchFailed, GroupSender
from rmqstore.proxy.metrics import proxy_metrics
from rmqstore.proxy.upstream import PLAINTEXT, Upstream
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.acl import Answered
from rmqstore.service.errors import StreamRefusal
from rmqstore.writer.config import WriterConfig
from rmqstore.writer.rocketmq5 import (
    ACCEPTED_TYPES,
    SHARDING_KEY,
    MessageReader,
    V2Refusal,
    ok_status,
    status_for,
    with_retry_policy,
)
from rmqstore.writer.service import peer_address

# A topic's route is asked of the groups again after this long (the clients ask every 30 s).
ROUTE_TTL_S = 10.0
# How long a group's writer has to answer a route question before it is left out.
ROUTE_TIMEOUT_S = 3.0

log = logging.getLogger(__name__)


@dataclass
class _Route:
    """A topic's queue count and accepted message types in each group that answered for it."""

    queue_counts: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, tuple[v2.MessageType, ...]] = field(default_factory=dict)
    fetched_at: float = 0.0


# The writers' accepted types (their routes') as the topic's message type.
_TYPE_OF_ACCEPTED = {accepted: name for name, accepted in ACCEPTED_TYPES.items()}


class _RouteTopics:
    """What the message reader asks of topics, from the routes known: the most queues
    any group has, and the message type of the first group (by name) that answered."""

    def __init__(self, routes: dict[str, _Route]):
        self.routes = routes

    def queue_count(self, topic: str) -> int | None:
        route = self.routes.get(topic)
        return max(route.queue_counts.values(), default=None) if route is not None else None

    def message_type(self, topic: str) -> str | None:
        route = self.routes.get(topic)
        if route is None or not route.accepted:
            return None
        return _TYPE_OF_ACCEPTED.get(route.accepted[min(route.accepted)], "NORMAL")


@dataclass
class _ReaderSource:
    config: WriterConfig
    topics: _RouteTopics


class _Group:
    """A writer group as the proxy reaches it: its batch stream and a v2 channel for routes."""

    def __init__(self, endpoints: GroupEndpoints, linger_s: float, batch_max: int, upstream: Upstream):
        self.endpoints = endpoints
        self.sender = GroupSender(endpoints.name, endpoints.writers, linger_s, batch_max, upstream)
        self.channel = upstream.channel(endpoints.writers[0])
        self.messaging = service_pb2_grpc.MessagingServiceStub(self.channel)  # type: ignore[no-untyped-call]  # generated

    async def close(self) -> None:
        await self.sender.close()
        await self.channel.close()


class ProxyServicer(service_pb2_grpc.MessagingServiceServicer):
    """MessagingService for producers, for simple and push consumers (their calls:
    :mod:`rmqstore.proxy.consumers`) and for pull consumers and offset calls
    (:mod:`rmqstore.proxy.queues`), transactions and recalls
    (:mod:`rmqstore.proxy.transactions`)."""

    def __init__(
        self, groups: Sequence[GroupEndpoints], advertise: v2.Endpoints, *, linger_s: float, batch_max: int,
        limits: WriterConfig | None = None, upstream: Upstream = PLAINTEXT,
    ):  # fmt: skip
        self.advertise = advertise
        self.linger_s = linger_s
        self.batch_max = batch_max
        self.upstream = upstream
        self.limits = limits or WriterConfig(store="")
        self.routes: dict[str, _Route] = {}
        self.reader = MessageReader(_ReaderSource(self.limits, _RouteTopics(self.routes)))
        self.groups: dict[str, _Group] = {}
        self.ackers: dict[str, consumers.AckBatcher] = {}
        self.receives = consumers.ReceiveRouter()
        self._round_robin = itertools.count()
        self._stopping = asyncio.Event()
        self._telemetry_outboxes: set[asyncio.Queue[v2s.TelemetryCommand | StreamRefusal | None]] = set()
        self._pending_groups = tuple(groups)

    async def start(self) -> None:
        """Open the groups' channels (on the server's loop)."""
        await self.set_groups(self._pending_groups)

    async def set_groups(self, groups: Sequence[GroupEndpoints]) -> None:
        """Route to ``groups`` from now on (a reloaded cluster file): new groups are
        opened, removed or changed ones closed (their unanswered sends fail)."""
        wanted = {group.name: group for group in groups}
        for name in list(self.groups):
            if wanted.get(name) != self.groups[name].endpoints:
                await self.ackers.pop(name).close()
                await self.groups.pop(name).close()
        for name, endpoints in wanted.items():
            if name not in self.groups:
                self.groups[name] = _Group(endpoints, self.linger_s, self.batch_max, self.upstream)
                self.ackers[name] = consumers.AckBatcher(name, self.groups[name], self.linger_s)
        for route in self.routes.values():
            for name in list(route.queue_counts):
                if name not in self.groups:
                    del route.queue_counts[name]
                    route.accepted.pop(name, None)

    async def close(self) -> None:
        self._stopping.set()
        for outbox in self._telemetry_outboxes:
            outbox.put_nowait(None)
        if self.receives.writer_receives:
            log.info("%d messages received in %d writer receives", self.receives.messages_received, self.receives.writer_receives)
        for acker in self.ackers.values():
            await acker.close()
        for group in self.groups.values():
            await group.close()

    # Routes

    async def _ask_route(self, group: _Group, request: v2s.QueryRouteRequest) -> v2s.QueryRouteResponse | None:
        try:
            answer: v2s.QueryRouteResponse = await group.messaging.QueryRoute(request, timeout=ROUTE_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            proxy_metrics().upstream_failed(group.endpoints.name, error.code())
            if error.code() in UNREACHABLE:
                group.sender.mark_down(f"QueryRoute: {error.code().name}")
            return None
        return answer

    async def _fetch_route(self, request: v2s.QueryRouteRequest) -> tuple[_Route, v2.Status | None]:
        """Ask every group; the route of the groups that answered OK (and the first
        refusal, when none did)."""
        topic = request.topic.name
        groups = list(self.groups.values())
        answers = await asyncio.gather(*(self._ask_route(group, request) for group in groups))
        route = self.routes.setdefault(topic, _Route())
        refusal: v2.Status | None = None
        answered = False
        for group, answer in zip(groups, answers):
            if answer is None:
                continue
            if answer.status.code != v2.OK:
                refusal = refusal or answer.status
                continue
            brokers = {queue.broker.name for queue in answer.message_queues}
            if brokers != {group.endpoints.name}:
                log.error("writer group %s answers QueryRoute as broker %s: left out (its --broker-name must be its name)",
                          group.endpoints.name, ", ".join(sorted(brokers)))
                continue
            route.queue_counts[group.endpoints.name] = len(answer.message_queues)
            route.accepted[group.endpoints.name] = tuple(answer.message_queues[0].accept_message_types) if answer.message_queues else ()
            answered = True
        route.fetched_at = time.monotonic()
        if not route.queue_counts:
            self.routes.pop(topic, None)
        return route, None if answered else refusal

    async def _route(self, topic: str, namespace: str) -> _Route:
        route = self.routes.get(topic)
        if route is None or time.monotonic() - route.fetched_at > ROUTE_TTL_S:
            request = v2s.QueryRouteRequest(topic=v2.Resource(name=topic, resource_namespace=namespace))
            route, refusal = await self._fetch_route(request)
            if not route.queue_counts:
                raise V2Refusal(refusal.code, refusal.message) if refusal is not None else self._no_group(topic)
        return route

    @staticmethod
    def _no_group(topic: str) -> V2Refusal:
        return V2Refusal(v2.HA_NOT_AVAILABLE, f"no writer group answered for topic {topic}")

    def _live(self, route: _Route) -> list[tuple[str, int]]:
        return sorted(
            (name, count) for name, count in route.queue_counts.items()
            if name in self.groups and self.groups[name].sender.available
        )  # fmt: skip

    async def QueryRoute(self, request: v2s.QueryRouteRequest, context: grpc.aio.ServicerContext) -> v2s.QueryRouteResponse:
        try:
            route, refusal = await self._fetch_route(request)
        except Exception as error:
            log.exception("QueryRoute failed")
            return v2s.QueryRouteResponse(status=status_for(error))
        live = self._live(route)
        if not live:
            return v2s.QueryRouteResponse(status=refusal or status_for(self._no_group(request.topic.name)))
        resource = v2.Resource(name=request.topic.name, resource_namespace=request.topic.resource_namespace)
        queues = []
        for name, count in live:
            broker = v2.Broker(name=name, id=0, endpoints=self.advertise)
            queues += [
                v2.MessageQueue(
                    topic=resource, id=queue_id, permission=v2.READ_WRITE, broker=broker, accept_message_types=route.accepted.get(name, ())
                )
                for queue_id in range(count)
            ]
        return v2s.QueryRouteResponse(status=ok_status(), message_queues=queues)

    # Sends

    def _pick(self, route: _Route, message_group: str) -> tuple[str, int]:
        """The (group, queue id) a request's messages go to."""
        if message_group:
            every = [(name, q) for name, count in sorted(route.queue_counts.items()) for q in range(count)]
            name, queue_id = every[int.from_bytes(hashlib.sha256(message_group.encode()).digest(), "big") % len(every)]
            if not self.groups[name].sender.available:
                raise V2Refusal(v2.HA_NOT_AVAILABLE, f"message group {message_group}'s queue is on writer group {name}, which is down")
            return name, queue_id
        live = self._live(route)
        if not live:
            raise V2Refusal(v2.HA_NOT_AVAILABLE, "every writer group of the topic is down")
        slot = next(self._round_robin) % sum(count for _, count in live)
        for name, count in live:
            if slot < count:
                return name, slot
            slot -= count
        raise AssertionError("unreachable: the slot is below the queues' total")

    async def SendMessage(self, request: v2s.SendMessageRequest, context: grpc.aio.ServicerContext) -> v2s.SendMessageResponse:
        try:
            return await self._send(request, context)
        except Exception as error:  # every answer is a v2 status
            status = _send_status(error)
            if status.code == v2.INTERNAL_SERVER_ERROR:
                log.exception("SendMessage failed")
            return v2s.SendMessageResponse(status=status, entries=[v2s.SendResultEntry(status=status) for _ in request.messages])

    async def _send(self, request: v2s.SendMessageRequest, context: grpc.aio.ServicerContext) -> v2s.SendMessageResponse:
        messages = request.messages
        if not messages:
            raise V2Refusal(v2.BAD_REQUEST, "the request has no messages")
        topics = {m.topic.name for m in messages}
        if len(topics) > 1:
            raise V2Refusal(v2.BAD_REQUEST, "the messages of a request go to one topic")
        topic = messages[0].topic
        route = await self._route(topic.name, topic.resource_namespace)  # first: the reader's topic checks read it
        peer = peer_address(context)
        batch = self.reader.read(messages, peer, sends_queue_id=False)
        groups = {p.get(SHARDING_KEY, "") for p in batch.properties}
        if len(groups) > 1:
            raise V2Refusal(v2.BAD_REQUEST, "the messages of a request belong to one message group")
        name, queue_id = self._pick(route, groups.pop())
        peer_text = peer.java_text() if peer is not None else ""
        born_hosts = [host.java_text() if host is not None else peer_text for host in batch.born_hosts]
        if transactions.goes_whole(messages):
            return await transactions.send_whole(self.groups[name], name, request, queue_id, born_hosts)
        uniq_keys, offsets = await self.groups[name].sender.send(batch, queue_id, born_hosts)
        response = v2s.SendMessageResponse(status=ok_status())
        for uniq_key, offset in zip(uniq_keys, offsets):
            response.entries.add(status=ok_status(), message_id=uniq_key, offset=offset)
        return response

    # The client's session

    async def Heartbeat(self, request: v2s.HeartbeatRequest, context: grpc.aio.ServicerContext) -> v2s.HeartbeatResponse:
        if request.client_type not in v2.ClientType.values():
            return v2s.HeartbeatResponse(status=v2.Status(code=v2.BAD_REQUEST, message=f"unknown client type {request.client_type}"))
        return v2s.HeartbeatResponse(status=ok_status())

    async def NotifyClientTermination(
        self, request: v2s.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> v2s.NotifyClientTerminationResponse:
        return v2s.NotifyClientTerminationResponse(status=ok_status())

    async def Telemetry(
        self, request_iterator: AsyncIterator[v2s.TelemetryCommand | Answered], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2s.TelemetryCommand]:
        """Answer each producer's Settings as the writer's gateway does, and each simple or
        push consumer's as a writer answers it; other clients are told they are not served.
        A producer's stream also carries the writers' transaction checks to it
        (:class:`rmqstore.proxy.transactions.ProducerChecks`). Other commands are read and
        dropped. The stream ends when the client ends it or the proxy stops."""
        if self._stopping.is_set():
            return
        outbox: asyncio.Queue[v2s.TelemetryCommand | StreamRefusal | None] = asyncio.Queue()  # None: the end
        checks = transactions.ProducerChecks(self.groups, outbox.put_nowait)

        async def read() -> None:
            try:
                async for command in request_iterator:
                    answer = await self._telemetry_answer(command, checks)
                    if answer is not None:
                        outbox.put_nowait(answer)
            except StreamRefusal as refusal:  # a command that does not parse: after the answers before it
                outbox.put_nowait(refusal)
            finally:
                outbox.put_nowait(None)  # also when the client's stream fails

        reader = asyncio.ensure_future(read())
        reader.add_done_callback(_collect)
        self._telemetry_outboxes.add(outbox)
        try:
            while (outgoing := await outbox.get()) is not None:
                if isinstance(outgoing, StreamRefusal):
                    raise outgoing
                yield outgoing
        finally:
            self._telemetry_outboxes.discard(outbox)
            reader.cancel()
            await checks.close()

    async def _telemetry_answer(
        self, command: v2s.TelemetryCommand | Answered, checks: transactions.ProducerChecks
    ) -> v2s.TelemetryCommand | None:
        if isinstance(command, Answered):  # refused by the ACL: its status-only reply
            return command.response  # type: ignore[no-any-return]  # the rule's answer, a TelemetryCommand
        if command.WhichOneof("command") != "settings":
            return None
        settings = command.settings
        if settings.client_type in consumers.CONSUMER_TYPES:
            return await consumers.consumer_settings(settings, self.groups, sorted(self.groups))
        if settings.client_type not in (v2.CLIENT_TYPE_UNSPECIFIED, v2.PRODUCER):
            name = v2.ClientType.Name(settings.client_type) if settings.client_type in v2.ClientType.values() else str(settings.client_type)
            return v2s.TelemetryCommand(
                status=v2.Status(code=v2.NOT_IMPLEMENTED, message=f"{name} clients are not served by an rmqstore proxy yet"),
                settings=settings,
            )
        checks.settings(settings)
        return v2s.TelemetryCommand(status=ok_status(), settings=self._settings(settings))

    def _settings(self, settings: v2.Settings) -> v2.Settings:
        answer = with_retry_policy(settings)
        answer.publishing.max_body_size = self.limits.max_body_bytes
        answer.publishing.validate_message_type = settings.publishing.validate_message_type
        return answer


    # Consumers (rmqstore.proxy.consumers): every answer is a v2 status.

    async def QueryAssignment(
        self, request: v2s.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> v2s.QueryAssignmentResponse:
        try:
            route = await self._route(request.topic.name, request.topic.resource_namespace)
        except Exception as error:
            return v2s.QueryAssignmentResponse(status=_consumer_status("QueryAssignment", error))
        found = consumers.assignments(request.topic, self._live(route), route.accepted, self.advertise)
        return v2s.QueryAssignmentResponse(status=ok_status(), assignments=found)

    async def ReceiveMessage(
        self, request: v2s.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2s.ReceiveMessageResponse]:
        try:
            topic = request.message_queue.topic
            route = await self._route(topic.name, topic.resource_namespace)
            names = [name for name, _ in self._live(route)]
            if not names:
                raise V2Refusal(v2.HA_NOT_AVAILABLE, f"every writer group of topic {topic.name} is down")
            received = await self.receives.receive(request, context, self.groups, names)
        except Exception as error:
            yield v2s.ReceiveMessageResponse(status=_consumer_status("ReceiveMessage", error))
            return
        async for answer in consumers.receive_answers(received):
            yield answer

    async def AckMessage(self, request: v2s.AckMessageRequest, context: grpc.aio.ServicerContext) -> v2s.AckMessageResponse:
        try:
            return await consumers.acknowledge(request, self.groups, self.ackers)
        except Exception as error:
            return v2s.AckMessageResponse(status=_consumer_status("AckMessage", error))

    async def ChangeInvisibleDuration(
        self, request: v2s.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> v2s.ChangeInvisibleDurationResponse:
        try:
            return await consumers.change_invisible(request, self.groups)
        except Exception as error:
            return v2s.ChangeInvisibleDurationResponse(status=_consumer_status("ChangeInvisibleDuration", error))

    async def ForwardMessageToDeadLetterQueue(
        self, request: v2s.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> v2s.ForwardMessageToDeadLetterQueueResponse:
        try:
            return await consumers.forward_to_dead_letters(request, self.groups)
        except Exception as error:
            return v2s.ForwardMessageToDeadLetterQueueResponse(status=_consumer_status("ForwardMessageToDeadLetterQueue", error))

    # The calls that name a queue (rmqstore.proxy.queues), routed by its broker name.

    async def PullMessage(
        self, request: v2s.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2s.PullMessageResponse]:
        try:
            async for answer in queues.pull(request, self.groups, context.time_remaining()):
                yield answer
        except Exception as error:
            yield v2s.PullMessageResponse(status=_consumer_status("PullMessage", error))

    async def GetOffset(self, request: v2s.GetOffsetRequest, context: grpc.aio.ServicerContext) -> v2s.GetOffsetResponse:
        try:
            return await queues.get_offset(request, self.groups)
        except Exception as error:
            return v2s.GetOffsetResponse(status=_consumer_status("GetOffset", error))

    async def UpdateOffset(self, request: v2s.UpdateOffsetRequest, context: grpc.aio.ServicerContext) -> v2s.UpdateOffsetResponse:
        try:
            return await queues.update_offset(request, self.groups)
        except Exception as error:
            return v2s.UpdateOffsetResponse(status=_consumer_status("UpdateOffset", error))

    async def QueryOffset(self, request: v2s.QueryOffsetRequest, context: grpc.aio.ServicerContext) -> v2s.QueryOffsetResponse:
        try:
            return await queues.query_offset(request, self.groups)
        except Exception as error:
            return v2s.QueryOffsetResponse(status=_consumer_status("QueryOffset", error))


    # Transactions and recalls (rmqstore.proxy.transactions), routed by the id or handle.

    async def EndTransaction(self, request: v2s.EndTransactionRequest, context: grpc.aio.ServicerContext) -> v2s.EndTransactionResponse:
        try:
            return await transactions.end_transaction(request, self.groups)
        except Exception as error:
            return v2s.EndTransactionResponse(status=_consumer_status("EndTransaction", error))

    async def RecallMessage(self, request: v2s.RecallMessageRequest, context: grpc.aio.ServicerContext) -> v2s.RecallMessageResponse:
        try:
            return await transactions.recall(request, self.groups)
        except Exception as error:
            return v2s.RecallMessageResponse(status=_consumer_status("RecallMessage", error))


def _collect(task: asyncio.Future[None]) -> None:
    """A finished task's outcome retrieved (a client's stream that fails is not an error
    of the proxy's)."""
    if not task.cancelled():
        task.exception()


def _consumer_status(call: str, error: BaseException) -> v2.Status:
    status = status_for(error)
    if status.code == v2.INTERNAL_SERVER_ERROR:
        log.error("%s failed", call, exc_info=error)
    return status


# A writer's refusal of a batch, as the v2 status its callers get (a RocketMQ client sends
# again on another queue for any but TOO_MANY_REQUESTS).
_BATCH_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: v2.BAD_REQUEST,
    grpc.StatusCode.NOT_FOUND: v2.TOPIC_NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED: v2.TOO_MANY_REQUESTS,
    grpc.StatusCode.FAILED_PRECONDITION: v2.HA_NOT_AVAILABLE,
}


def _send_status(error: BaseException) -> v2.Status:
    if isinstance(error, BatchFailed):
        code = _BATCH_CODES.get(error.code, v2.HA_NOT_AVAILABLE)
        return v2.Status(code=code, message=f"the writer group did not store the batch: {error.code.name}: {error}")
    return status_for(error)
