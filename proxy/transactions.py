"""Transactions, timed messages and their recall through a proxy (cluster mode,
docs/cluster.md).

A transactional or timed send is not coalesced: the request goes whole, as a v2
SendMessage, to the gateway of the writer group that owns the queue the proxy picked for
it (the message's queue id set to that queue), so that the writer keeps the half
message's transaction data for its EndTransaction and answers a timed message's recall
handle, exactly as in local mode. Its writer CPU is a call's, not a batch's share.

A transaction id through a proxy is the writer's id behind its group's name,
``rmqt1.<group, base64url>.<the writer's id>``, as a receipt handle is
(:mod:`rmqstore.proxy.consumers`): EndTransaction is routed by it, and an id not of this
form, or naming no group of the cluster file, is INVALID_TRANSACTION_ID. The writer's
part is checked by the writer (its transaction data: a forged id finds none, and is
answered as Apache's proxy answers an id it has no data for).

A recall handle needs no wrapping: it names the broker that issued it (the writer's
``--broker-name``, its group's name), and RecallMessage goes to that group.

Transaction checks: each producer's Telemetry stream through a proxy is mirrored, for
as long as it lasts, by a Telemetry stream of the proxy to every group's writer carrying
the producer's settings (:class:`ProducerChecks`), so every writer counts the producer
among its topics' producers. A RecoverOrphanedTransactionCommand a writer sends on its
mirror goes to the producer with its transaction id wrapped; the producer's answer, an
EndTransaction through any proxy, reaches that group. A proxy killed mid-way ends its
mirrors with it: the writers ask again at their next check, on a stream of the producer
through another proxy."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import grpc

from rmqstore.common.errors import InvalidArgument
from rmqstore.proxy.consumers import CALL_TIMEOUT_S, ConsumerGroupLink, group_of_tag, tag_with_group
from rmqstore.proxy.queues import group_named, unanswered
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.writer.rocketmq5 import V2Refusal
from rmqstore.writer.schedule import parse_recall_handle

TRANSACTION_PREFIX = "rmqt1"
# A mirror that broke (its writer restarting, say) is opened again after this long,
# doubling up to MIRROR_RETRY_MAX_S while it keeps failing.
MIRROR_RETRY_MIN_S = 0.5
MIRROR_RETRY_MAX_S = 8.0

log = logging.getLogger(__name__)


# Transaction ids


def wrap_transaction(group: str, transaction_id: str) -> str:
    return tag_with_group(TRANSACTION_PREFIX, group, transaction_id)


def unwrap_transaction(transaction_id: str) -> tuple[str, str]:
    """The group and the writer's id of a proxy's transaction id; V2Refusal
    INVALID_TRANSACTION_ID for anything else."""
    if not transaction_id.strip():
        raise V2Refusal(v2.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
    untagged = group_of_tag(TRANSACTION_PREFIX, transaction_id)
    if untagged is None or not untagged[1].strip():
        raise V2Refusal(v2.INVALID_TRANSACTION_ID, "the transaction id is not one an rmqstore proxy gave out")
    return untagged


def _transaction_group(groups: Mapping[str, ConsumerGroupLink], transaction_id: str) -> tuple[str, str, ConsumerGroupLink]:
    group, inner = unwrap_transaction(transaction_id)
    if group not in groups:
        raise V2Refusal(
            v2.INVALID_TRANSACTION_ID, f"the transaction id names writer group {group[:80]!r}, which the cluster file does not list"
        )
    name, link = group_named(groups, group, "the transaction id")
    return name, inner, link


# Sends


def goes_whole(messages: Sequence[v2.Message]) -> bool:
    """Whether a request's messages go to the writer's gateway rather than into a batch:
    a transactional or a timed message is among them."""
    return any(
        message.system_properties.message_type == v2.TRANSACTION or message.system_properties.HasField("delivery_timestamp")
        for message in messages
    )


async def send_whole(
    link: ConsumerGroupLink, name: str, request: v2s.SendMessageRequest, queue_id: int, born_hosts: Sequence[str]
) -> v2s.SendMessageResponse:
    """The request sent to group ``name``'s writer gateway, its messages in queue
    ``queue_id`` (each with its client's connection as its born host, unless it names one);
    the writer's answer with its transaction ids wrapped."""
    forwarded = v2s.SendMessageRequest()
    forwarded.CopyFrom(request)
    for message, born_host in zip(forwarded.messages, born_hosts, strict=True):
        system = message.system_properties
        system.queue_id = queue_id
        if not system.born_host:
            system.born_host = born_host  # the client's connection, as local mode keeps it
    try:
        answer: v2s.SendMessageResponse = await link.messaging.SendMessage(forwarded, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        raise unanswered(link, name, "SendMessage", error) from None
    for entry in answer.entries:
        if entry.transaction_id:
            entry.transaction_id = wrap_transaction(name, entry.transaction_id)
    return answer


# EndTransaction and RecallMessage


async def end_transaction(
    request: v2s.EndTransactionRequest, groups: Mapping[str, ConsumerGroupLink]
) -> v2s.EndTransactionResponse:
    name, inner, link = _transaction_group(groups, request.transaction_id)
    forwarded = v2s.EndTransactionRequest()
    forwarded.CopyFrom(request)
    forwarded.transaction_id = inner
    try:
        answer: v2s.EndTransactionResponse = await link.messaging.EndTransaction(forwarded, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        raise unanswered(link, name, "EndTransaction", error) from None
    return answer


async def recall(request: v2s.RecallMessageRequest, groups: Mapping[str, ConsumerGroupLink]) -> v2s.RecallMessageResponse:
    """The recall sent to the group its handle names. A handle that does not decode, or
    names no group, is refused with the writer's (Apache's) words and code."""
    try:
        handle = parse_recall_handle(request.recall_handle)
    except InvalidArgument as error:
        raise V2Refusal(v2.INTERNAL_SERVER_ERROR, str(error)) from None
    if handle.broker_name not in groups:
        raise V2Refusal(v2.INTERNAL_SERVER_ERROR, "recall failed, broker service not available")
    name, link = group_named(groups, handle.broker_name, "the recall handle")
    try:
        answer: v2s.RecallMessageResponse = await link.messaging.RecallMessage(request, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        raise unanswered(link, name, "RecallMessage", error) from None
    return answer


# Transaction checks


class ProducerChecks:
    """A producer's Telemetry stream through the proxy, mirrored on every group's writer
    (see the module's docstring). ``deliver`` puts a command on the producer's stream."""

    def __init__(self, groups: Mapping[str, ConsumerGroupLink], deliver: Callable[[v2s.TelemetryCommand], None]):
        self.groups = groups
        self.deliver = deliver
        self._mirrors: dict[str, _Mirror] = {}

    def settings(self, settings: v2.Settings) -> None:
        """The producer's (new) settings, sent on every group's mirror (opened when it has
        none: a group the cluster file gained since is mirrored from the producer's next
        settings)."""
        if not settings.publishing.topics:
            return  # a writer keeps a stream as a producer's only for the topics it publishes
        for name in list(self.groups):
            mirror = self._mirrors.get(name)
            if mirror is None or mirror.ended:  # a new group, or one that left and came back
                self._mirrors[name] = _Mirror(name, self.groups, settings, self.deliver)
            else:
                mirror.update(settings)

    async def close(self) -> None:
        for mirror in self._mirrors.values():
            await mirror.close()
        self._mirrors.clear()


class _Mirror:
    """One group's mirror of a producer's stream, opened again while it fails."""

    def __init__(
        self, name: str, groups: Mapping[str, ConsumerGroupLink], settings: v2.Settings,
        deliver: Callable[[v2s.TelemetryCommand], None],
    ):  # fmt: skip
        self.name = name
        self.groups = groups
        self.settings = settings
        self.deliver = deliver
        self._outgoing: asyncio.Queue[v2s.TelemetryCommand] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run())

    @property
    def ended(self) -> bool:
        return self._task.done()

    def update(self, settings: v2.Settings) -> None:
        self.settings = settings
        self._outgoing.put_nowait(v2s.TelemetryCommand(settings=settings))

    async def _requests(self) -> AsyncIterator[v2s.TelemetryCommand]:
        while not self._outgoing.empty():  # a new stream starts from the latest settings
            self._outgoing.get_nowait()
        yield v2s.TelemetryCommand(settings=self.settings)
        while True:
            yield await self._outgoing.get()

    async def _run(self) -> None:
        retry_s = MIRROR_RETRY_MIN_S
        while True:
            link = self.groups.get(self.name)
            if link is None:
                return  # the group left the cluster file
            try:
                async for command in link.messaging.Telemetry(self._requests()):
                    retry_s = MIRROR_RETRY_MIN_S
                    if command.WhichOneof("command") == "recover_orphaned_transaction_command":
                        self._relay(command)
            except grpc.aio.AioRpcError as error:
                log.info("writer group %s: a producer's Telemetry mirror ended: %s", self.name, error.code().name)
            except grpc.aio.UsageError:
                log.info("writer group %s: a producer's Telemetry mirror ended: its channel closed", self.name)
            except Exception:  # the mirror keeps the producer's checks coming: it is opened again
                log.exception("writer group %s: a producer's Telemetry mirror failed", self.name)
            await asyncio.sleep(retry_s)
            retry_s = min(2 * retry_s, MIRROR_RETRY_MAX_S)

    def _relay(self, command: v2s.TelemetryCommand) -> None:
        relayed = v2s.TelemetryCommand()
        relayed.CopyFrom(command)
        check = relayed.recover_orphaned_transaction_command
        check.transaction_id = wrap_transaction(self.name, check.transaction_id)
        self.deliver(relayed)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
