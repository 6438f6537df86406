"""RocketMQ 5's consumer calls through a proxy (cluster mode, docs/cluster.md): receives
served from every writer group of the topic, acknowledgements and invisibility changes
routed back to the group that handed the message out.

A receive first looks at each live group in turn, without waiting (its start turns over
from receive to receive, so no group is favoured), and answers with the first group's
messages. When none has any, it long-polls every live group at once and answers with the
first group that hands messages out; the other polls are cancelled (a poll cancelled the
moment its writer handed messages out leaves them invisible until their invisible
duration ends: they are delivered again then, never lost). Nothing loops on a timer: the
writers' own long polls wake on appends.

A receipt handle through a proxy is the writer's handle behind its group's name,
``rmqp1.<group, base64url>.<the writer's handle>``. The proxy checks the form and the
group; the writer checks its own part (an HMAC of its secret), so a handle sent to the
wrong group is refused there. A handle that is not of this form, or names no group of the
cluster file, is answered INVALID_RECEIPT_HANDLE, as Apache's proxy answers a handle it
cannot decode.

Acknowledgements are coalesced per writer group, consumer group and topic into one v2
AckMessage of many entries (:class:`AckBatcher`), as sends are coalesced into the batch
stream; each caller gets its own entries' statuses. A group that is down answers its
acknowledgements, invisibility changes and dead-letter forwards HA_NOT_AVAILABLE (the
message comes back once its invisible duration ends, after the group's restart)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import grpc
from google.protobuf import duration_pb2

from rmqstore.proxy.coalesce import UNREACHABLE
from rmqstore.proxy.metrics import proxy_metrics
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.writer.rocketmq5 import (
    DEFAULT_LONG_POLL_MS,
    LONG_POLL_MS_MAX,
    POLL_MARGIN_S,
    V2Refusal,
    ok_status,
    status_for,
)

if TYPE_CHECKING:
    from rmqstore.proxy.coalesce import GroupSender
    from rmqstore.rocketmq_v2 import service_pb2_grpc

HANDLE_PREFIX = "rmqp1"
# The consumer client types whose settings the writers answer.
CONSUMER_TYPES = frozenset({v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER})
# How long a writer has to answer a call that does not long-poll.
CALL_TIMEOUT_S = 5.0
# Time a receive's answer needs to reach the client: the polls end this much before the
# client's deadline (the writer's own margin is inside it).
RECEIVE_MARGIN_S = 2 * POLL_MARGIN_S
# An AckMessage to a writer carries at most this many entries (the writer's per-entry cost
# is small; the cap bounds one call's size and the latency of its last caller).
ACK_BATCH_MAX = 1024

log = logging.getLogger(__name__)


# Receipt handles


def tag_with_group(prefix: str, group: str, inner: str) -> str:
    """``inner`` (a writer's receipt handle or transaction id) tagged with the writer group
    that gave it out: ``PREFIX.<group, unpadded base64url>.<inner>``."""
    name = base64.urlsafe_b64encode(group.encode()).decode().rstrip("=")
    return f"{prefix}.{name}.{inner}"


def group_of_tag(prefix: str, tagged: str) -> tuple[str, str] | None:
    """The group and the writer's own text of a :func:`tag_with_group` text; None for
    anything else (another prefix, a name that is not strict base64url, an empty part)."""
    head, _, rest = tagged.partition(".")
    name, _, inner = rest.partition(".")
    if head != prefix or not name or not inner:
        return None
    try:
        group = base64.b64decode(name + "=" * (-len(name) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):
        return None
    return (group, inner) if group else None


def wrap_handle(group: str, handle: str) -> str:
    return tag_with_group(HANDLE_PREFIX, group, handle)


def unwrap_handle(handle: str) -> tuple[str, str]:
    """The group and the writer's handle of a proxy's receipt handle; V2Refusal
    INVALID_RECEIPT_HANDLE for anything else."""
    untagged = group_of_tag(HANDLE_PREFIX, handle)
    if untagged is None:
        raise V2Refusal(v2.INVALID_RECEIPT_HANDLE, "the receipt handle is not one an rmqstore proxy gave out")
    return untagged


# What the consumer calls need of the proxy's groups


class ConsumerGroupLink(Protocol):
    """A writer group as the consumer calls reach it (proxy.gateway._Group)."""

    @property
    def sender(self) -> GroupSender: ...

    @property
    def messaging(self) -> service_pb2_grpc.MessagingServiceStub: ...


def _down(name: str) -> V2Refusal:
    return V2Refusal(v2.HA_NOT_AVAILABLE, f"writer group {name} is unavailable; the message comes back after its invisible duration")


def _link(groups: Mapping[str, ConsumerGroupLink], name: str) -> ConsumerGroupLink:
    """The live group a receipt handle names."""
    link = groups.get(name)
    if link is None:
        raise V2Refusal(v2.INVALID_RECEIPT_HANDLE, f"the receipt handle names writer group {name[:80]!r}, which the cluster file does not list")
    if not link.sender.available:
        raise _down(name)
    return link


def _rpc_failed(link: ConsumerGroupLink, name: str, call: str, error: grpc.aio.AioRpcError) -> V2Refusal:
    proxy_metrics().upstream_failed(name, error.code())
    if error.code() in UNREACHABLE:
        link.sender.mark_down(f"{call}: {error.code().name}")
        return _down(name)
    return V2Refusal(v2.INTERNAL_SERVER_ERROR, f"writer group {name} failed {call}: {error.code().name}: {error.details()}")


# Acknowledgements, coalesced


@dataclass
class _Acks:
    """Acknowledgements gathered for one AckMessage: entries (the writer's handles), and
    per caller its count and future."""

    entries: list[v2s.AckMessageEntry] = field(default_factory=list)
    callers: list[tuple[int, asyncio.Future[list[v2.Status]]]] = field(default_factory=list)
    since: float = 0.0  # time.monotonic() of the first acknowledgement


class AckBatcher:
    """One writer group's acknowledgements: per consumer group and topic, the entries of
    every caller gathered into one AckMessage. A batch leaves when its first entry has
    waited ``linger_s`` (or it holds ``batch_max``), and one call per key is in flight:
    a batch ready while one is waits for its answer. So a batch holds about the rate of
    acknowledgements times the linger, or times the writer's turnaround when that is
    longer."""

    def __init__(self, name: str, link: ConsumerGroupLink, linger_s: float, batch_max: int = ACK_BATCH_MAX):
        self.name = name
        self.link = link
        self.linger_s = linger_s
        self.batch_max = batch_max
        self._gathering: dict[tuple[str, str, str], _Acks] = {}
        self._in_flight: set[tuple[str, str, str]] = set()
        self._timers: dict[tuple[str, str, str], asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        self.acks = 0

    async def ack(self, group: str, topic: str, namespace: str, entries: list[v2s.AckMessageEntry]) -> list[v2.Status]:
        """Each entry's status, in order (the writer's, or HA_NOT_AVAILABLE when it did
        not answer)."""
        key = (group, topic, namespace)
        future: asyncio.Future[list[v2.Status]] = asyncio.get_running_loop().create_future()
        acks = self._gathering.setdefault(key, _Acks(since=time.monotonic()))
        acks.entries += entries
        acks.callers.append((len(entries), future))
        if len(acks.entries) >= self.batch_max:
            self._flush(key)
        elif key not in self._timers:
            self._timers[key] = asyncio.get_running_loop().call_later(self.linger_s, self._flush, key)
        return await asyncio.shield(future)

    def _flush(self, key: tuple[str, str, str]) -> None:
        """Send the key's gathered acknowledgements once the first has waited the linger
        out (or the batch is full) and no call of the key is in flight."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._in_flight or key not in self._gathering:
            return
        acks = self._gathering[key]
        waited_s = time.monotonic() - acks.since
        if waited_s < self.linger_s and len(acks.entries) < self.batch_max:
            self._timers[key] = asyncio.get_running_loop().call_later(self.linger_s - waited_s, self._flush, key)
            return
        del self._gathering[key]
        self._in_flight.add(key)
        task = asyncio.get_running_loop().create_task(self._call(key, acks))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, key: tuple[str, str, str], acks: _Acks) -> None:
        group, topic, namespace = key
        request = v2s.AckMessageRequest(
            group=v2.Resource(name=group, resource_namespace=namespace),
            topic=v2.Resource(name=topic, resource_namespace=namespace),
            entries=acks.entries,
        )
        try:
            statuses = await self._statuses(request)
        finally:
            self._in_flight.discard(key)
            if key in self._gathering:
                self._flush(key)
        start = 0
        for count, future in acks.callers:
            if not future.done():
                future.set_result(statuses[start : start + count])
            start += count

    async def _statuses(self, request: v2s.AckMessageRequest) -> list[v2.Status]:
        self.calls += 1
        self.acks += len(request.entries)
        proxy_metrics().acks_sent(self.name, len(request.entries))
        try:
            answer: v2s.AckMessageResponse = await self.link.messaging.AckMessage(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            status = status_for(_rpc_failed(self.link, self.name, "AckMessage", error))
            return [status] * len(request.entries)
        except Exception as error:  # every caller is answered
            log.exception("AckMessage to writer group %s failed", self.name)
            return [status_for(error)] * len(request.entries)
        if len(answer.entries) != len(request.entries):
            # A request-wide refusal (a bad group or topic) has no entries: it is each entry's.
            return [answer.status] * len(request.entries)
        return [entry.status for entry in answer.entries]

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        stopping = v2.Status(code=v2.HA_NOT_AVAILABLE, message="the proxy is stopping")
        for acks in self._gathering.values():
            for count, future in acks.callers:
                if not future.done():
                    future.set_result([stopping] * count)
        self._gathering.clear()
        log.info("writer group %s: %d acknowledgements in %d calls", self.name, self.acks, self.calls)


# Receives


def _poll_s(request: v2s.ReceiveMessageRequest, context: grpc.aio.ServicerContext) -> float:
    if request.HasField("long_polling_timeout"):
        duration = request.long_polling_timeout
        poll_ms = duration.seconds * 1000 + duration.nanos // 1_000_000
        if not 0 <= poll_ms <= LONG_POLL_MS_MAX:
            raise V2Refusal(v2.ILLEGAL_POLLING_TIME, f"long_polling_timeout {poll_ms} ms: expected 0-{LONG_POLL_MS_MAX}")
    else:
        poll_ms = DEFAULT_LONG_POLL_MS
    remaining_s = context.time_remaining()
    poll_s = poll_ms / 1000
    return poll_s if remaining_s is None else max(0.0, min(poll_s, remaining_s - RECEIVE_MARGIN_S))


@dataclass
class Received:
    """One group's answer to a receive: its messages (handles wrapped), or the status of
    a refusal that is the client's to see (a bad group or filter, say)."""

    messages: list[v2.Message] = field(default_factory=list)
    refusal: v2.Status | None = None


class ReceiveRouter:
    """ReceiveMessage across the groups that hold a topic (see the module's docstring)."""

    def __init__(self) -> None:
        self._turn: collections.Counter[tuple[str, str]] = collections.Counter()
        self.polls_cancelled = 0
        self.writer_receives = 0  # receives asked of writers
        self.messages_received = 0  # messages they handed out

    def order(self, group: str, topic: str, names: list[str]) -> list[str]:
        """``names`` starting at the next group in turn for the consumer group's topic."""
        start = self._turn[(group, topic)] % len(names)
        self._turn[(group, topic)] += 1
        return names[start:] + names[:start]

    async def receive(
        self, request: v2s.ReceiveMessageRequest, context: grpc.aio.ServicerContext, groups: Mapping[str, ConsumerGroupLink],
        names: list[str],
    ) -> Received:  # fmt: skip
        """The messages of one group (or none after the poll), from the live ``names``."""
        poll_s = _poll_s(request, context)
        deadline = time.monotonic() + poll_s
        order = self.order(request.group.name, request.message_queue.topic.name, names)
        for name in order:
            received = await self._one(request, groups[name], name, 0.0)
            if received.messages or received.refusal is not None:
                return received
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return Received()
        return await self._poll_all(request, groups, order, left_s)

    async def _poll_all(
        self, request: v2s.ReceiveMessageRequest, groups: Mapping[str, ConsumerGroupLink], order: list[str], poll_s: float
    ) -> Received:
        tasks = {asyncio.ensure_future(self._one(request, groups[name], name, poll_s)): name for name in order}
        pending = set(tasks)
        found: list[Received] = []
        try:
            while pending and not found:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                # In the group's turn order, every answer that came with the first.
                found = [task.result() for task in tasks if task in done and (task.result().messages or task.result().refusal)]
        finally:
            for task in pending:
                task.cancel()
            self.polls_cancelled += len(pending)
        if not found:
            return Received()
        refused = [one for one in found if one.refusal is not None and not one.messages]
        with_messages = [one for one in found if one.messages]
        if not with_messages:
            return refused[0]
        # Answers of several groups at once are all handed to the client: each writer
        # gave at most batch_size, so the client may get a few batches' worth (their
        # messages are invisible to others and acknowledged one by one all the same).
        return Received(messages=[message for one in with_messages for message in one.messages])

    async def _one(self, request: v2s.ReceiveMessageRequest, link: ConsumerGroupLink, name: str, poll_s: float) -> Received:
        """A receive of one group, polling ``poll_s``."""
        forwarded = v2s.ReceiveMessageRequest()
        forwarded.CopyFrom(request)
        forwarded.message_queue.CopyFrom(
            v2.MessageQueue(topic=request.message_queue.topic, id=0, permission=v2.READ_WRITE, broker=v2.Broker(name=name))
        )
        forwarded.long_polling_timeout.CopyFrom(duration_pb2.Duration(seconds=int(poll_s), nanos=int(poll_s % 1 * 1e9)))
        received = Received()
        self.writer_receives += 1
        try:
            call = link.messaging.ReceiveMessage(forwarded, timeout=poll_s + CALL_TIMEOUT_S)
            async for answer in call:
                content = answer.WhichOneof("content")
                if content == "message":
                    message = answer.message
                    message.system_properties.receipt_handle = wrap_handle(name, message.system_properties.receipt_handle)
                    received.messages.append(message)
                    self.messages_received += 1
                elif content == "status" and answer.status.code not in (v2.OK, v2.MESSAGE_NOT_FOUND):
                    if answer.status.code in _CLIENTS_FAULT:
                        received.refusal = answer.status
                    else:
                        log.warning("writer group %s refused a receive: %s %s", name, v2.Code.Name(answer.status.code), answer.status.message)
        except grpc.aio.AioRpcError as error:
            # Only an unreachable writer marks its group down: a long poll's deadline or
            # cancellation (another group answered first) says nothing of the writer.
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                link.sender.mark_down(f"ReceiveMessage: {error.code().name}")
            elif error.code() != grpc.StatusCode.CANCELLED:
                log.warning("writer group %s failed a receive: %s %s", name, error.code().name, error.details())
            # The messages already read are handed out all the same (their handles are good).
        return received


# A receive refused for these is refused alike by every group: the client is told.
_CLIENTS_FAULT = frozenset(
    {v2.BAD_REQUEST, v2.ILLEGAL_CONSUMER_GROUP, v2.ILLEGAL_FILTER_EXPRESSION, v2.ILLEGAL_INVISIBLE_TIME, v2.ILLEGAL_POLLING_TIME,
     v2.UNAUTHORIZED, v2.FORBIDDEN}
)  # fmt: skip


async def receive_answers(received: Received) -> AsyncIterator[v2s.ReceiveMessageResponse]:
    """The stream a client reads: status, delivery time, then the messages (as the
    writer's gateway answers)."""
    if received.refusal is not None and not received.messages:
        yield v2s.ReceiveMessageResponse(status=received.refusal)
        return
    if not received.messages:
        yield v2s.ReceiveMessageResponse(status=v2.Status(code=v2.MESSAGE_NOT_FOUND, message="no new message"))
        return
    yield v2s.ReceiveMessageResponse(status=ok_status())
    now_ms = time.time_ns() // 1_000_000
    answer = v2s.ReceiveMessageResponse()
    answer.delivery_timestamp.FromMilliseconds(now_ms)
    yield answer
    for message in received.messages:
        yield v2s.ReceiveMessageResponse(message=message)


def overall(entries: list[v2s.AckMessageResultEntry]) -> v2.Status:
    """As the writer's gateway: one entry's status is the request's; of several, OK when
    all are, else MULTIPLE_RESULTS."""
    if len(entries) == 1:
        return entries[0].status
    if all(entry.status.code == v2.OK for entry in entries):
        return ok_status()
    return v2.Status(code=v2.MULTIPLE_RESULTS, message="some entries failed: see each entry's status")


async def acknowledge(
    request: v2s.AckMessageRequest, groups: Mapping[str, ConsumerGroupLink], batchers: Mapping[str, AckBatcher]
) -> v2s.AckMessageResponse:
    """Each entry routed by its handle to its group's batcher; each entry's status."""
    if not request.entries:
        raise V2Refusal(v2.BAD_REQUEST, "the request has no entries")
    statuses: list[v2.Status | None] = [None] * len(request.entries)
    by_group: dict[str, list[tuple[int, v2s.AckMessageEntry]]] = collections.defaultdict(list)
    for index, entry in enumerate(request.entries):
        try:
            name, inner = unwrap_handle(entry.receipt_handle)
            _link(groups, name)
        except V2Refusal as refusal:
            statuses[index] = status_for(refusal)
            continue
        by_group[name].append((index, v2s.AckMessageEntry(message_id=entry.message_id, receipt_handle=inner)))
    namespace = request.topic.resource_namespace
    answers = await asyncio.gather(
        *(batchers[name].ack(request.group.name, request.topic.name, namespace, [e for _, e in placed]) for name, placed in by_group.items())
    )
    for placed, answer in zip(by_group.values(), answers):
        for (index, _), status in zip(placed, answer):
            statuses[index] = status
    entries = [
        v2s.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status)
        for entry, status in zip(request.entries, statuses)
    ]
    return v2s.AckMessageResponse(status=overall(entries), entries=entries)


async def change_invisible(
    request: v2s.ChangeInvisibleDurationRequest, groups: Mapping[str, ConsumerGroupLink]
) -> v2s.ChangeInvisibleDurationResponse:
    name, inner = unwrap_handle(request.receipt_handle)
    link = _link(groups, name)
    forwarded = v2s.ChangeInvisibleDurationRequest()
    forwarded.CopyFrom(request)
    forwarded.receipt_handle = inner
    try:
        answer: v2s.ChangeInvisibleDurationResponse = await link.messaging.ChangeInvisibleDuration(forwarded, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        raise _rpc_failed(link, name, "ChangeInvisibleDuration", error) from None
    if answer.receipt_handle:
        answer.receipt_handle = wrap_handle(name, answer.receipt_handle)
    return answer


async def forward_to_dead_letters(
    request: v2s.ForwardMessageToDeadLetterQueueRequest, groups: Mapping[str, ConsumerGroupLink]
) -> v2s.ForwardMessageToDeadLetterQueueResponse:
    name, inner = unwrap_handle(request.receipt_handle)
    link = _link(groups, name)
    forwarded = v2s.ForwardMessageToDeadLetterQueueRequest()
    forwarded.CopyFrom(request)
    forwarded.receipt_handle = inner
    try:
        answer: v2s.ForwardMessageToDeadLetterQueueResponse = await link.messaging.ForwardMessageToDeadLetterQueue(
            forwarded, timeout=CALL_TIMEOUT_S
        )
    except grpc.aio.AioRpcError as error:
        raise _rpc_failed(link, name, "ForwardMessageToDeadLetterQueue", error) from None
    return answer


async def consumer_settings(
    settings: v2.Settings, groups: Mapping[str, ConsumerGroupLink], names: list[str]
) -> v2s.TelemetryCommand:
    """A consumer's settings as the first live group's writer answers them (every group's
    writer runs with the cluster's consumer policy): its retries, whether the consumer
    group is FIFO, the long poll and batch."""
    for name in names:
        link = groups[name]
        if not link.sender.available:
            continue
        call = link.messaging.Telemetry(timeout=CALL_TIMEOUT_S)
        try:
            await call.write(v2s.TelemetryCommand(settings=settings))
            answer: v2s.TelemetryCommand = await call.read()
        except grpc.aio.AioRpcError as error:
            if error.code() in UNREACHABLE:
                link.sender.mark_down(f"Telemetry: {error.code().name}")
            continue
        finally:
            call.cancel()
        if isinstance(answer, v2s.TelemetryCommand):
            return answer
    return v2s.TelemetryCommand(status=status_for(V2Refusal(v2.HA_NOT_AVAILABLE, "no writer group answered")), settings=settings)


def assignments(topic: v2.Resource, live: list[tuple[str, int]], accepted: Mapping[str, tuple[v2.MessageType, ...]], endpoints: v2.Endpoints) -> list[v2.Assignment]:
    """A push consumer's assignment: every live group's queues, each under its broker name,
    reached through the proxies."""
    return [
        v2.Assignment(
            message_queue=v2.MessageQueue(
                topic=topic, id=queue_id, permission=v2.READ_WRITE, broker=v2.Broker(name=name, id=0, endpoints=endpoints),
                accept_message_types=accepted.get(name, ()),
            )
        )
        for name, count in live
        for queue_id in range(count)
    ]
