"""WriterService on grpc's asyncio server: validate the request, hand it to the store's
group commit, map errors (service.errors)."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc

from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import MSG_ID_OFFSET_DIGITS
from rmqstore.common.errors import InvalidArgument, StoreError
from rmqstore.service.errors import abort_with_async, mapped_async
from rmqstore.service.metrics import WriterMetrics
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc
from rmqstore.writer.store import GROUP_MAX_MESSAGES, AppendResult, AppendResults, Writer
from rmqstore.writer.validate import EMPTY_PROPERTIES, MessageBatch, validate_batch

SERVICE_NAME = "rmqstore.v1.WriterService"
T = TypeVar("T")


def peer_address(context: grpc.ServicerContext) -> SocketAddress | None:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` → the peer's socket address."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    try:
        return SocketAddress.parse(rest)
    except InvalidArgument:
        return None


def _born_host(text: str, position: int) -> SocketAddress | None:
    if not text:
        return None
    try:
        return SocketAddress.parse(text)
    except InvalidArgument as error:
        where = f"message {position}: " if position else ""
        raise InvalidArgument(f"{where}born_host: {error}") from None


def to_batch(messages: Sequence[messages_pb2.Message]) -> MessageBatch:
    """Proto messages as the writer's columns, one comprehension a field: this runs for
    every message sent, and reading a proto field costs more than anything done with it."""
    messages = list(messages)
    numbered = len(messages) > 1
    return MessageBatch(
        [m.topic for m in messages],
        [m.body for m in messages],
        [m.keys[:] for m in messages],  # plain lists; the proto's container is slow to iterate
        [m.tags for m in messages],
        [dict(m.properties) if m.properties else EMPTY_PROPERTIES for m in messages],
        [m.queue_id if m.HasField("queue_id") else None for m in messages],
        [m.uniq_key for m in messages],
        [m.flag for m in messages],
        [m.born_timestamp_ms for m in messages],
        [_born_host(m.born_host, i if numbered else 0) if m.born_host else None for i, m in enumerate(messages, 1)],
    )


def to_result(result: AppendResult) -> messages_pb2.SendResult:
    return messages_pb2.SendResult(
        offset_msg_id=result.offset_msg_id,
        uniq_key=result.uniq_key,
        topic=result.topic,
        queue_id=result.queue_id,
        queue_offset=result.queue_offset,
        commitlog_offset=result.commitlog_offset,
        store_timestamp_ms=result.store_timestamp_ms,
        size=result.size,
    )


def to_compact(results: AppendResults) -> writer_pb2.CompactResults:
    if not len(results):
        return writer_pb2.CompactResults()
    return writer_pb2.CompactResults(
        offset_msg_id_prefix=results[0].offset_msg_id[:-MSG_ID_OFFSET_DIGITS],
        store_timestamp_ms=results.store_timestamp_ms,
        uniq_keys=results.uniq_keys,
        queue_ids=results.queue_ids,
        queue_offsets=results.queue_offsets,
        commitlog_offsets=results.commitlog_offsets,
        sizes=results.sizes,
    )


def to_response(results: AppendResults, compact: bool) -> writer_pb2.SendBatchResponse:
    if compact:
        return writer_pb2.SendBatchResponse(compact=to_compact(results))
    return writer_pb2.SendBatchResponse(results=[to_result(r) for r in results])


class _Pending:
    __slots__ = ("batch", "peer", "future", "loop", "context")

    def __init__(self, batch: MessageBatch, peer: SocketAddress | None, future: asyncio.Future[AppendResults]):
        self.batch = batch
        self.peer = peer
        self.future = future
        self.loop = future.get_loop()
        # The caller's context (its trace): a group's append and flush spans belong to
        # the request at its front, as the leader's do in Writer.append.
        self.context = contextvars.copy_context()


class GroupAppender:
    """Appends for callers on an event loop: each awaits a future while one thread stores
    whatever has queued meanwhile as one group (one append, one dispatch and, under SYNC,
    one fsync) and settles the futures on their loop, one callback a group."""

    def __init__(self, writer: Writer):
        self.writer = writer
        self._ready = threading.Condition()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="appender", daemon=True)
        self._thread.start()

    def append(self, batch: MessageBatch, peer: SocketAddress | None) -> asyncio.Future[AppendResults]:
        """Validate ``batch`` (InvalidArgument at once) and queue it; the future holds its
        results or the error that refused it."""
        validate_batch(batch, self.writer.limits)
        pending = _Pending(batch, peer, asyncio.get_running_loop().create_future())
        with self._ready:
            if self._closed:
                raise InvalidArgument("the writer is closed")
            self._queue.append(pending)
            self._ready.notify()
        return pending.future

    def _take(self) -> list[_Pending] | None:
        with self._ready:
            while not self._queue:
                if self._closed:
                    return None
                self._ready.wait()
            group = [self._queue.popleft()]
            messages = group[0].batch.message_count
            while self._queue and messages + self._queue[0].batch.message_count <= GROUP_MAX_MESSAGES:
                messages += self._queue[0].batch.message_count
                group.append(self._queue.popleft())
            return group

    def _run(self) -> None:
        while (group := self._take()) is not None:
            try:
                outcomes: list[Any] = group[0].context.run(self.writer.append_group, [(p.batch, p.peer) for p in group])
            except BaseException as error:  # never leave a caller waiting
                outcomes = [error] * len(group)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[AppendResults], Any]]] = {}
            for pending, outcome in zip(group, outcomes):
                by_loop.setdefault(pending.loop, []).append((pending.future, outcome))
            for loop, settled in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:
                    pass  # the loop is closed: nobody awaits these any more

    def close(self) -> None:
        """Store what is queued, then stop the thread; later appends are refused."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()


def _settle(settled: list[tuple[asyncio.Future[AppendResults], Any]]) -> None:
    for future, outcome in settled:
        if future.done():
            continue  # the call was cancelled (its client went away)
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


class WriterServicer(writer_pb2_grpc.WriterServiceServicer):
    """The service's handlers, all async (for :class:`service.server.AsyncServing`):
    appends await the group commit; the calls that block go to the loop's executor."""

    def __init__(self, writer: Writer):
        self.writer = writer
        self.metrics = WriterMetrics(writer)
        self.appender = GroupAppender(writer)

    def close(self) -> None:
        self.appender.close()

    async def _append(self, messages: Sequence[messages_pb2.Message], context: grpc.aio.ServicerContext) -> AppendResults:
        started = time.perf_counter()
        results = await self.appender.append(to_batch(messages), peer_address(context))
        self.metrics.appended(len(results), results.size_bytes, started)
        return results

    @staticmethod
    async def _blocking(call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, call)

    @mapped_async
    async def Send(self, request: writer_pb2.SendRequest, context: grpc.aio.ServicerContext) -> writer_pb2.SendResponse:
        if not request.HasField("message"):
            raise InvalidArgument("the request has no message")
        return writer_pb2.SendResponse(result=to_result((await self._append([request.message], context))[0]))

    @mapped_async
    async def SendBatch(
        self, request: writer_pb2.SendBatchRequest, context: grpc.aio.ServicerContext
    ) -> writer_pb2.SendBatchResponse:
        return to_response(await self._append(request.messages, context), request.compact_results)

    async def SendStream(
        self, request_iterator: AsyncIterator[writer_pb2.SendBatchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[writer_pb2.SendBatchResponse]:
        async for request in request_iterator:
            try:
                results = await self._append(request.messages, context)
            except StoreError as error:
                await abort_with_async(context, error)
                return
            yield to_response(results, request.compact_results)

    @mapped_async
    async def CreateTopic(
        self, request: writer_pb2.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> writer_pb2.CreateTopicResponse:
        count = request.queue_count or self.writer.config.default_queue_count
        created = await self._blocking(lambda: self.writer.topics.create(request.name, count))
        return writer_pb2.CreateTopicResponse(
            topic=messages_pb2.Topic(name=request.name, queue_count=self.writer.topics.queue_count(request.name) or count),
            created=created,
        )

    @mapped_async
    async def ListTopics(
        self, request: writer_pb2.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> writer_pb2.ListTopicsResponse:
        return writer_pb2.ListTopicsResponse(
            topics=[messages_pb2.Topic(name=n, queue_count=c) for n, c in sorted(self.writer.topics.snapshot().items())]
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
                for t, q, lo, hi in status["queues"]  # type: ignore[attr-defined]
            ],
            disk_total_bytes=status["disk_total_bytes"],
            disk_used_bytes=status["disk_used_bytes"],
            disk_used_ratio=status["disk_used_ratio"],
            flush_policy=status["flush_policy"],
            store=status["store"],
        )
