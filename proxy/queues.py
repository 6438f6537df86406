"""The calls that name one queue through a proxy (cluster mode, docs/cluster.md): a pull
consumer's PullMessage, and GetOffset, UpdateOffset and QueryOffset. Each request's
MessageQueue carries the broker name of the route it came from; the request goes as it
is to that writer group's gateway and its answer comes back as it is, so through a proxy
these calls answer exactly what the group's writer answers (offsets are per group, in
its consumerOffset.json).

A broker name the cluster file does not list is BAD_REQUEST (an empty one names the only
group when there is one); a group that is down, or whose writer does not answer,
HA_NOT_AVAILABLE, as the proxy's other calls answer a lost group."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping

import grpc

from rmqstore.proxy.coalesce import UNREACHABLE
from rmqstore.proxy.consumers import CALL_TIMEOUT_S, ConsumerGroupLink
from rmqstore.proxy.metrics import proxy_metrics
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.writer.rocketmq5 import LONG_POLL_MS_MAX, V2Refusal

log = logging.getLogger(__name__)

# A pull's call to the writer may last its long poll (at most LONG_POLL_MS_MAX) and this.
PULL_MARGIN_S = CALL_TIMEOUT_S


def group_named(groups: Mapping[str, ConsumerGroupLink], name: str, what: str) -> tuple[str, ConsumerGroupLink]:
    """The live group ``name`` (``what`` says where the name came from, for the refusal)."""
    if not name and len(groups) == 1:
        name = next(iter(groups))
    link = groups.get(name)
    if link is None:
        raise V2Refusal(v2.BAD_REQUEST, f"{what} names writer group {name[:80]!r}, which the cluster file does not list")
    if not link.sender.available:
        raise V2Refusal(v2.HA_NOT_AVAILABLE, f"writer group {name} is unavailable; ask again")
    return name, link


def unanswered(link: ConsumerGroupLink, name: str, call: str, error: grpc.aio.AioRpcError) -> V2Refusal:
    """A writer's gRPC failure as the proxy's answer: an unreachable writer marks its group
    down (HA_NOT_AVAILABLE); anything else is the writer's fault (INTERNAL_SERVER_ERROR).
    Either is counted among the proxy's upstream errors."""
    proxy_metrics().upstream_failed(name, error.code())
    if error.code() in UNREACHABLE:
        link.sender.mark_down(f"{call}: {error.code().name}")
        return V2Refusal(v2.HA_NOT_AVAILABLE, f"writer group {name} did not answer {call}: {error.code().name}; ask again")
    return V2Refusal(v2.INTERNAL_SERVER_ERROR, f"writer group {name} failed {call}: {error.code().name}: {error.details()}")


def _queue_group(groups: Mapping[str, ConsumerGroupLink], queue: v2.MessageQueue) -> tuple[str, ConsumerGroupLink]:
    return group_named(groups, queue.broker.name, "the message queue's broker")


async def get_offset(request: v2s.GetOffsetRequest, groups: Mapping[str, ConsumerGroupLink]) -> v2s.GetOffsetResponse:
    name, link = _queue_group(groups, request.message_queue)
    try:
        answer: v2s.GetOffsetResponse = await link.messaging.GetOffset(request, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        raise unanswered(link, name, "GetOffset", error) from None
    return answer


async def update_offset(request: v2s.UpdateOffsetRequest, groups: Mapping[str, ConsumerGroupLink]) -> v2s.UpdateOffsetResponse:
    name, link = _queue_group(groups, request.message_queue)
    try:
        answer: v2s.UpdateOffsetResponse = await link.messaging.UpdateOffset(request, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        raise unanswered(link, name, "UpdateOffset", error) from None
    return answer


async def query_offset(request: v2s.QueryOffsetRequest, groups: Mapping[str, ConsumerGroupLink]) -> v2s.QueryOffsetResponse:
    name, link = _queue_group(groups, request.message_queue)
    try:
        answer: v2s.QueryOffsetResponse = await link.messaging.QueryOffset(request, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        raise unanswered(link, name, "QueryOffset", error) from None
    return answer


async def pull(
    request: v2s.PullMessageRequest, groups: Mapping[str, ConsumerGroupLink], time_remaining_s: float | None
) -> AsyncIterator[v2s.PullMessageResponse]:
    """The group's writer's answers to the pull, as they come. A refusal before the
    writer answered is raised (V2Refusal); a stream the writer breaks after its status
    ends without a next_offset, as a writer's failed piece ends it (the client pulls from
    where it was)."""
    name, link = _queue_group(groups, request.message_queue)
    timeout_s = LONG_POLL_MS_MAX / 1000 + PULL_MARGIN_S
    if time_remaining_s is not None:
        timeout_s = min(timeout_s, time_remaining_s)
    answered = False
    try:
        async for answer in link.messaging.PullMessage(request, timeout=timeout_s):
            answered = True
            yield answer
    except grpc.aio.AioRpcError as error:
        if not answered:
            raise unanswered(link, name, "PullMessage", error) from None
        log.warning("writer group %s broke a pull's answer: %s %s", name, error.code().name, error.details())
