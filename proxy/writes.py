"""rmqstore.v1.WriterService through a proxy (cluster mode, docs/cluster.md), for the CLI's
commands against a proxy: ``send`` (one message, or ``--file``), ``updateTopic`` and
``updateSubGroup``.

- A send request (``Send``, ``SendBatch``, each request of ``SendStream``) goes whole to
  one group's writer, the groups taken in turn; the writer's answer comes back as it is
  (its offsetMsgIds name the group's store host). A group whose writers do not answer
  (UNAVAILABLE: nothing was stored) is left out for DOWN_S and the request goes to the
  next group; any other status of the writer is the answer.
- ``CreateTopic`` and ``UpdateSubscriptionGroup`` are made in every group (a topic's
  queues are in each), answered with the first group's result; ``ListTopics`` is every
  group's topics together.
- ``Flush`` and ``Status`` describe one writer: UNIMPLEMENTED, naming where to ask."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from rmqstore.common.errors import Unavailable
from rmqstore.proxy.cluster import GroupEndpoints
from rmqstore.proxy.lookups import (
    GROUP_CALL_TIMEOUT_S,
    GroupNodes,
    GroupSet,
    GroupUnanswered,
    relayed,
)
from rmqstore.proxy.upstream import PLAINTEXT, Upstream
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

# A group whose writers did not answer a send is left out of the turn this long.
DOWN_S = 2.0


class GroupWriters(GroupNodes):
    """A writer group's writers (its replicas: the primary answers the sends)."""

    def __init__(self, endpoints: GroupEndpoints, upstream: Upstream = PLAINTEXT):
        super().__init__(endpoints, endpoints.writers, writer_pb2_grpc.WriterServiceStub, "writer", upstream)
        self.down_until = 0.0


class ProxyWriterServicer(GroupSet[GroupWriters], writer_pb2_grpc.WriterServiceServicer):
    def __init__(self, groups: Sequence[GroupEndpoints], upstream: Upstream = PLAINTEXT):
        super().__init__(groups, lambda endpoints: GroupWriters(endpoints, upstream))
        self._turn = itertools.count()

    async def _store(self, method: str, request: Any, timeout_s: float) -> Any:
        """The request stored by the next group in turn that answers."""
        groups = list(self.groups.values())
        start = next(self._turn)
        now = time.monotonic()
        order = [groups[(start + i) % len(groups)] for i in range(len(groups))]
        # The groups left out recently last: tried only when every other did not answer.
        order.sort(key=lambda group: group.down_until > now)
        unanswered = []
        for group in order:
            try:
                return await group.call(method, request, timeout_s)
            except GroupUnanswered as error:
                group.down_until = time.monotonic() + DOWN_S
                unanswered.append(str(error))
        raise Unavailable("no writer group answered: " + "; ".join(unanswered))

    @relayed
    async def Send(
        self, request: writer_pb2.SendRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> writer_pb2.SendResponse:
        answer: writer_pb2.SendResponse = await self._store(
            "Send", request, self._timeout_s(context)
        )
        return answer

    @relayed
    async def SendBatch(
        self, request: writer_pb2.SendBatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> writer_pb2.SendBatchResponse:
        answer: writer_pb2.SendBatchResponse = await self._store(
            "SendBatch", request, self._timeout_s(context)
        )
        return answer

    async def SendStream(
        self,
        request_iterator: AsyncIterator[writer_pb2.SendBatchRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[writer_pb2.SendBatchResponse]:
        # One request at a time, answered in order, as the writer's stream answers.
        async for request in request_iterator:
            yield await _stored_batch(self, request, context)

    async def _every_group(
        self, method: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> list[Any]:
        groups = list(self.groups.values())
        timeout_s = self._timeout_s(context)
        outcomes = await asyncio.gather(
            *(g.call(method, request, timeout_s) for g in groups), return_exceptions=True
        )
        unanswered = [
            g.name for g, o in zip(groups, outcomes, strict=True) if isinstance(o, GroupUnanswered)
        ]
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, GroupUnanswered):
                raise outcome
        if unanswered:
            raise Unavailable(
                f"group{'s' if len(unanswered) > 1 else ''} {', '.join(unanswered)} did not answer: "
                "made in the other groups only; ask again"
            )
        return list(outcomes)

    @relayed
    async def CreateTopic(
        self, request: writer_pb2.CreateTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> writer_pb2.CreateTopicResponse:
        answers = await self._every_group("CreateTopic", request, context)
        first: writer_pb2.CreateTopicResponse = answers[0]
        first.created = any(answer.created for answer in answers)
        return first

    @relayed
    async def UpdateSubscriptionGroup(
        self,
        request: writer_pb2.UpdateSubscriptionGroupRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> writer_pb2.UpdateSubscriptionGroupResponse:
        answers = await self._every_group("UpdateSubscriptionGroup", request, context)
        first: writer_pb2.UpdateSubscriptionGroupResponse = answers[0]
        first.changed = any(answer.changed for answer in answers)
        return first

    @relayed
    async def ListTopics(
        self, request: writer_pb2.ListTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> writer_pb2.ListTopicsResponse:
        answers = await self._every_group("ListTopics", request, context)
        topics: dict[str, messages_pb2.Topic] = {}
        for answer in answers:
            for topic in answer.topics:
                topics.setdefault(topic.name, topic)
        return writer_pb2.ListTopicsResponse(topics=list(topics.values()))

    async def Flush(
        self, request: writer_pb2.FlushRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> writer_pb2.FlushResponse:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "Flush is a writer's: ask a group's writer (the cluster file names them)",
        )
        raise AssertionError("abort returned")

    async def Status(
        self, request: writer_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> writer_pb2.StatusResponse:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "Status is a writer's: ask a group's writer (the cluster file names them)",
        )
        raise AssertionError("abort returned")


@relayed
async def _stored_batch(
    servicer: ProxyWriterServicer,
    request: writer_pb2.SendBatchRequest,
    context: grpc.aio.ServicerContext[Any, Any],
) -> writer_pb2.SendBatchResponse:
    """A stream's request stored (its errors end the stream with their status)."""
    answer: writer_pb2.SendBatchResponse = await servicer._store(
        "SendBatch", request, GROUP_CALL_TIMEOUT_S
    )
    return answer
