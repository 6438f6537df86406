"""WriterService on grpc's asyncio server, one write path: a request (parsed by
protobuf's runtime) → its messages as the store's batch columns (writer.intake's
request_batch) → the group commit (writer.group_commit's GroupAppender, then
Writer.append_group) → a response built by protobuf's runtime (writer.intake); errors
mapped at the edge (service.errors). The RocketMQ 5 gateway (writer.rocketmq5) reads its
own messages into the same columns and feeds the same group commit."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc

from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.errors import InvalidArgument, StoreError
from rmqstore.service.acl import may_see_paths
from rmqstore.service.errors import abort_with_async, mapped_async
from rmqstore.service.limits import STALLED_WRITE_S
from rmqstore.service.stall import StallWatch
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc
from rmqstore.writer.consumers import check_group
from rmqstore.writer.group_commit import GroupAppender
from rmqstore.writer.intake import request_batch, respond_for, send_response, to_batch
from rmqstore.writer.metrics import WriterMetrics
from rmqstore.writer.store import Writer

SERVICE_NAME = "rmqstore.v1.WriterService"
# Requests a SendStream appends ahead of its acks (measured: benchmarks/REPLICATION.md, "A
# stream's requests in flight"): 3 to 5 overlap a writer group's replica round; 9 gained
# nothing over 5.
SEND_STREAM_AHEAD = 4
T = TypeVar("T")


def peer_address(context: grpc.ServicerContext) -> SocketAddress | None:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` → the peer's socket address."""
    return _parse_peer(context.peer() or "")


@functools.lru_cache(maxsize=1024)  # a producer's address comes back with each of its calls
def _parse_peer(peer: str) -> SocketAddress | None:
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    try:
        return SocketAddress.parse(rest)
    except InvalidArgument:
        return None


class WriterServicer(writer_pb2_grpc.WriterServiceServicer):
    """The service's handlers, all async (for :class:`service.server.AsyncServing`):
    appends await the group commit; the calls that block go to the loop's executor."""

    def __init__(self, writer: Writer, *, stalled_write_s: float = STALLED_WRITE_S):
        self.writer = writer
        self.stalled_write_s = stalled_write_s
        self.metrics = WriterMetrics(writer)
        self.appender = GroupAppender(writer, self.metrics)

    def close(self) -> None:
        self.appender.close()

    @staticmethod
    async def _blocking(call: Callable[[], T]) -> T:
        # In the caller's context: the call's spans (a Flush's fsync) stay in its trace.
        return await asyncio.get_running_loop().run_in_executor(None, contextvars.copy_context().run, call)

    def _append(self, request: writer_pb2.SendBatchRequest, peer: SocketAddress | None) -> asyncio.Future[Any]:
        return self.appender.append(request_batch(request), peer, respond_for(request))

    @mapped_async
    async def Send(self, request: writer_pb2.SendRequest, context: grpc.aio.ServicerContext) -> writer_pb2.SendResponse:
        if not request.HasField("message"):
            raise InvalidArgument("the request has no message")
        return await self.appender.append(to_batch([request.message]), peer_address(context), send_response)  # type: ignore[no-any-return]

    @mapped_async
    async def SendBatch(
        self, request: writer_pb2.SendBatchRequest, context: grpc.aio.ServicerContext
    ) -> writer_pb2.SendBatchResponse:
        return await self._append(request, peer_address(context))  # type: ignore[no-any-return]

    async def SendStream(
        self, request_iterator: AsyncIterator[writer_pb2.SendBatchRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """Each request is appended as it arrives, up to :data:`SEND_STREAM_AHEAD` of them
        ahead of the ack being written, and the acks go back in order: a request's append
        overlaps the fsync (and a writer group's replica round) of the ones before it. A
        request refused (it does not parse, the caller may not send it, it cannot be stored)
        ends the stream once the acks before it are written. No request is read once one is
        known refused; one read before that (the store refuses a request only once it is
        appended with those after it) is stored but not acknowledged, as after a lost
        connection."""
        peer = peer_address(context)
        # What the reader hands the writer, in order: a request's future, the error that
        # ended the reading, or None once the client has sent its last request.
        appended: asyncio.Queue[asyncio.Future[Any] | Exception | None] = asyncio.Queue()
        # A request is read only when fewer than SEND_STREAM_AHEAD wait for their acks to be
        # written: a producer that reads no acks is held by HTTP/2 flow control (its sends
        # wait), so what the writer holds for it stays bounded, and after the limit its
        # stream ends (StallWatch).
        ahead = asyncio.Semaphore(SEND_STREAM_AHEAD)
        refused = False

        def settled(future: asyncio.Future[Any]) -> None:
            nonlocal refused
            if not future.cancelled() and future.exception() is not None:
                refused = True

        async def read() -> None:
            requests = aiter(request_iterator)
            try:
                while True:
                    await ahead.acquire()
                    if refused:
                        return  # the stream ends at the request refused (below): none is read past it
                    try:
                        request = await anext(requests)
                    except StopAsyncIteration:
                        appended.put_nowait(None)
                        return
                    future = self._append(request, peer)
                    future.add_done_callback(settled)
                    appended.put_nowait(future)
            except Exception as error:  # StoreError, StreamRefusal: raised in order, below
                appended.put_nowait(error)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            with StallWatch(self.stalled_write_s, "no ack") as watch:
                while (item := await appended.get()) is not None:
                    try:
                        if isinstance(item, Exception):
                            raise item
                        response = await item
                    except StoreError as error:
                        await abort_with_async(context, error)
                        return
                    await watch.write(context, response)
                    ahead.release()
        finally:
            reader.cancel()
            while not appended.empty():
                left = appended.get_nowait()
                if isinstance(left, asyncio.Future):
                    left.cancel()  # stored or refused, not acknowledged: nobody reads its outcome

    @mapped_async
    async def CreateTopic(
        self, request: writer_pb2.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> writer_pb2.CreateTopicResponse:
        topics = self.writer.topics
        # No count: a new topic gets the default, an existing one keeps its count.
        count = request.queue_count or topics.queue_count(request.name) or self.writer.config.default_queue_count
        message_type = request.message_type or None
        self.writer.check_writable()
        created = await self._blocking(lambda: topics.create(request.name, count, message_type))
        return writer_pb2.CreateTopicResponse(
            topic=messages_pb2.Topic(
                name=request.name,
                queue_count=topics.queue_count(request.name) or count,
                message_type=topics.message_type(request.name) or "",
            ),
            created=created,
        )

    @mapped_async
    async def ListTopics(
        self, request: writer_pb2.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> writer_pb2.ListTopicsResponse:
        types = self.writer.topics.types_snapshot()
        return writer_pb2.ListTopicsResponse(
            topics=[
                messages_pb2.Topic(name=n, queue_count=c, message_type=types.get(n, ""))
                for n, c in sorted(self.writer.topics.snapshot().items())
            ]
        )

    @mapped_async
    async def UpdateSubscriptionGroup(
        self, request: writer_pb2.UpdateSubscriptionGroupRequest, context: grpc.aio.ServicerContext
    ) -> writer_pb2.UpdateSubscriptionGroupResponse:
        check_group(request.group)
        self.writer.check_writable()
        orderly = request.consume_orderly if request.HasField("consume_orderly") else None
        entry, changed = await self._blocking(lambda: self.writer.subscription_groups.update(request.group, orderly))
        return writer_pb2.UpdateSubscriptionGroupResponse(
            group=request.group, consume_orderly=entry["consumeMessageOrderly"] is True, changed=changed
        )

    @mapped_async
    async def Flush(self, request: writer_pb2.FlushRequest, context: grpc.aio.ServicerContext) -> writer_pb2.FlushResponse:
        return writer_pb2.FlushResponse(flushed_offset=await self._blocking(self.writer.flush_thoroughly))

    @mapped_async
    async def Status(self, request: writer_pb2.StatusRequest, context: grpc.aio.ServicerContext) -> writer_pb2.StatusResponse:
        status = await self._blocking(self.writer.status)
        return writer_pb2.StatusResponse(
            commitlog_min_offset=status["commitlog_min_offset"],
            commitlog_max_offset=status["commitlog_max_offset"],
            dispatched_offset=status["dispatched_offset"],
            flushed_offset=status["flushed_offset"],
            queues=[
                writer_pb2.QueueStatus(topic=t, queue_id=q, min_offset=lo, max_offset=hi)
                for t, q, lo, hi in status["queues"]
            ],
            disk_total_bytes=status["disk_total_bytes"],
            disk_used_bytes=status["disk_used_bytes"],
            disk_used_ratio=status["disk_used_ratio"],
            flush_policy=status["flush_policy"],
            store=status["store"] if may_see_paths() else "",
        )
