"""WriterService on grpc's asyncio server, one write path: a request (parsed by
protobuf's runtime) → its messages as the store's batch columns (:func:`request_batch`)
→ the group commit (:class:`GroupAppender`, Writer.append_group) → a response built by
protobuf's runtime; errors mapped at the edge (service.errors). The RocketMQ 5 gateway
(writer.rocketmq5) reads its own messages into the same columns and feeds the same
group commit."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import grpc
from opentelemetry import trace

from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import MSG_ID_OFFSET_DIGITS, offset_msg_ids
from rmqstore.common.errors import InvalidArgument, StoreError, invariant
from rmqstore.common.tracing import LINKS_MAX, tracing_on
from rmqstore.service.acl import may_see_paths
from rmqstore.service.errors import abort_with_async, mapped_async
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc
from rmqstore.writer.config import FlushPolicy
from rmqstore.writer.metrics import WriterMetrics
from rmqstore.writer.store import GROUP_MAX_MESSAGES, AppendResults, Writer
from rmqstore.writer.validate import EMPTY_PROPERTIES, MessageBatch

SERVICE_NAME = "rmqstore.v1.WriterService"
# A SendStream whose producer takes none of its acks for this long ends with
# RESOURCE_EXHAUSTED (its messages so far are stored; the acks it did not read are lost to it).
STALLED_WRITE_S = 30.0
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


def _born_host(text: str, position: int) -> SocketAddress | None:
    if not text:
        return None
    try:
        return SocketAddress.parse(text)
    except InvalidArgument as error:
        where = f"message {position}: " if position else ""
        raise InvalidArgument(f"{where}born_host: {error}") from None


def _properties_column(
    messages: Sequence[messages_pb2.Message], shared: Mapping[str, str]
) -> list[Mapping[str, str]]:
    """Each message's properties as a dict with the ``shared`` ones it does not set
    itself, a run of equal ones sharing one: a traced producer stamps every message of a
    request with the same trace context, and the batch screen and the record encoder do
    their work once per distinct mapping."""
    common = dict(shared) if shared else EMPTY_PROPERTIES
    column: list[Mapping[str, str]] = []
    previous: Mapping[str, str] = EMPTY_PROPERTIES
    for message in messages:
        if not message.properties:
            column.append(common)
            continue
        properties = {**common, **message.properties} if common else dict(message.properties)
        if properties != previous:
            previous = properties
        column.append(previous)
    return column


def to_batch(messages: Sequence[messages_pb2.Message], shared: Mapping[str, str] = EMPTY_PROPERTIES) -> MessageBatch:
    """A per-message request's messages as the writer's columns, each given the
    ``shared`` properties it does not set itself; one comprehension a field: this runs
    for every message sent this way, and reading a proto field costs more than anything
    done with it. Raises InvalidArgument for a born host that is no address."""
    messages = list(messages)
    numbered = len(messages) > 1
    return MessageBatch(
        [m.topic for m in messages],
        [m.body for m in messages],
        [m.keys[:] for m in messages],  # plain lists; the proto's container is slow to iterate
        [m.tags for m in messages],
        _properties_column(messages, shared),
        [m.queue_id if m.HasField("queue_id") else None for m in messages],
        [m.uniq_key for m in messages],
        [m.flag for m in messages],
        [m.born_timestamp_ms for m in messages],
        [_born_host(m.born_host, i if numbered else 0) if m.born_host else None for i, m in enumerate(messages, 1)],
    )


def columns_batch(columns: writer_pb2.MessageColumns, shared: Mapping[str, str] = EMPTY_PROPERTIES) -> MessageBatch:
    """A columnar request's messages (``SendBatchRequest.columns``) as the writer's
    columns, each message given the ``shared`` properties it does not set itself. Raises
    InvalidArgument for columns that do not line up (naming the column) or a born host
    that is no address; every other rule is the batch check's, as for ``messages``."""
    bodies = list(columns.bodies)
    count = len(bodies)
    numbered = count > 1
    topics = list(columns.topics)
    if len(topics) == 1:
        topics *= count
    queue_ids: list[int | None] = _column("queue_ids", columns.queue_ids, count, None)
    if -1 in queue_ids:
        queue_ids = [None if queue_id == -1 else queue_id for queue_id in queue_ids]
    born_hosts = [
        _born_host(host, i if numbered else 0) if host else None
        for i, host in enumerate(_column("born_hosts", columns.born_hosts, count, ""), 1)
    ]
    return MessageBatch(
        _column("topics", topics, count, ""),
        bodies,
        [key.split(" ") if key else [] for key in _column("keys", columns.keys, count, "")],
        _column("tags", columns.tags, count, ""),
        _columns_properties(columns, count, shared),
        queue_ids,
        _column("uniq_keys", columns.uniq_keys, count, ""),
        _column("flags", columns.flags, count, 0),
        _column("born_timestamps_ms", columns.born_timestamps_ms, count, 0),
        born_hosts,
    )


def _column(name: str, values: Sequence[Any], count: int, default: Any) -> list[Any]:
    """A column of one entry a message, or ``default`` for each message when it is empty."""
    if not values:
        return [default] * count
    if len(values) != count:
        raise InvalidArgument(
            f"columns.{name} has {len(values)} entries for {count} messages (columns.bodies): one a message, or none"
        )
    return values if isinstance(values, list) else list(values)


def _columns_properties(
    columns: writer_pb2.MessageColumns, count: int, shared: Mapping[str, str]
) -> list[Mapping[str, str]]:
    """Each message's properties out of the property columns, with the shared ones."""
    names, values = list(columns.property_names), list(columns.property_values)
    if len(names) != len(values):
        raise InvalidArgument(
            f"columns.property_values has {len(values)} entries for {len(names)} columns.property_names"
        )
    counts: list[int] = _column("property_counts", columns.property_counts, count, 0)
    if min(counts, default=0) < 0:
        raise InvalidArgument(f"columns.property_counts holds {min(counts)}: a message has 0 properties or more")
    if sum(counts) != len(names):
        raise InvalidArgument(f"columns.property_counts add up to {sum(counts)} for {len(names)} columns.property_names")
    shared = dict(shared) if shared else EMPTY_PROPERTIES
    if not names:
        return [shared] * count
    column: list[Mapping[str, str]] = []
    previous: Mapping[str, str] = EMPTY_PROPERTIES
    start = 0
    for position, given in enumerate(counts, 1):
        if not given:
            column.append(shared)
            continue
        own = dict(zip(names[start : start + given], values[start : start + given]))
        if len(own) != given:
            where = f"message {position}: " if count > 1 else ""
            raise InvalidArgument(f"{where}a property name is given more than once")
        start += given
        properties = {**shared, **own} if shared else own
        if properties != previous:  # a run of equal mappings shares one, as _properties_column's do
            previous = properties
        column.append(previous)
    return column


def request_batch(request: writer_pb2.SendBatchRequest) -> MessageBatch:
    """A SendBatchRequest's messages, sent as ``messages`` or as ``columns``, as the
    writer's columns: the one shape its group commit takes."""
    if request.HasField("columns"):
        if request.messages:
            raise InvalidArgument(
                "the request sets both messages and columns; a batch sends its messages one way or the other"
            )
        return columns_batch(request.columns, request.shared_properties)
    return to_batch(request.messages, request.shared_properties)


Respond = Callable[[AppendResults], Any]  # a request's results → its response message


def send_response(results: AppendResults) -> writer_pb2.SendResponse:
    response = writer_pb2.SendResponse()
    response.result.CopyFrom(batch_response(results).results[0])  # one message's, made as a batch's
    return response


def batch_response(results: AppendResults) -> writer_pb2.SendBatchResponse:
    response = writer_pb2.SendBatchResponse()
    add = response.results.add  # built in place: a SendResult made apart is copied in
    timestamp_ms = results.store_timestamp_ms
    for msg_id, uniq_key, topic, queue_id, queue_offset, offset, size in zip(
        offset_msg_ids(results.store_host, results.commitlog_offsets), results.uniq_keys, results.topics,
        results.queue_ids, results.queue_offsets, results.commitlog_offsets, results.sizes,
    ):  # fmt: skip
        add(
            offset_msg_id=msg_id,
            uniq_key=uniq_key,
            topic=topic,
            queue_id=queue_id,
            queue_offset=queue_offset,
            commitlog_offset=offset,
            store_timestamp_ms=timestamp_ms,
            size=size,
        )
    return response


def compact_response(results: AppendResults) -> writer_pb2.SendBatchResponse:
    response = writer_pb2.SendBatchResponse()
    compact = response.compact  # built in place: a CompactResults made apart is copied in
    compact.SetInParent()
    if len(results):
        compact.offset_msg_id_prefix = results[0].offset_msg_id[:-MSG_ID_OFFSET_DIGITS]
        compact.store_timestamp_ms = results.store_timestamp_ms
        compact.uniq_keys.extend(results.uniq_keys)
        compact.queue_ids.extend(results.queue_ids)
        compact.queue_offsets.extend(results.queue_offsets)
        compact.commitlog_offsets.extend(results.commitlog_offsets)
        compact.sizes.extend(results.sizes)
    return response


def respond_for(request: writer_pb2.SendBatchRequest) -> Respond:
    """How a batch request's results become its response: SendResults, or the compact
    columns it asked for."""
    return compact_response if request.compact_results else batch_response


class _Pending:
    """One request waiting for the group commit: its messages as columns."""

    __slots__ = ("batch", "context", "future", "peer", "respond", "started")

    def __init__(self, batch: MessageBatch, peer: SocketAddress | None, respond: Respond, future: asyncio.Future[Any]):
        self.batch = batch
        self.peer = peer
        self.respond = respond
        self.future = future
        # The caller's context (its trace): a group's append and flush spans belong to
        # the request at its front.
        self.context = contextvars.copy_context()
        self.started = time.perf_counter()

    @property
    def count(self) -> int:
        return self.batch.message_count


def _request_links(waiting: list[tuple[_Pending, Any]]) -> list[trace.Link]:
    """Links to the spans of the requests ``waiting`` (the ones in a trace), at most
    :data:`LINKS_MAX`."""
    links = []
    for pending, _ in waiting:
        context = pending.context.run(trace.get_current_span).get_span_context()
        if context.is_valid:
            links.append(trace.Link(context))
            if len(links) >= LINKS_MAX:
                break
    return links


class _Stored(NamedTuple):
    """A request appended, its response made, waiting to be acknowledged."""

    response: Any
    results: AppendResults


class GroupAppender:
    """The writer's group commit: appends for the handlers of one event loop, as
    RocketMQ's group commit takes them.

    A handler reads its request's messages into columns (:func:`request_batch`), queues
    them and awaits a future. A drain, scheduled on the loop when a request finds none
    pending, takes every request queued by then as one group and appends it right
    there: checked, appended and dispatched as one batch (Writer.append_group), and each
    request's response made. Under ASYNC the futures are settled at once; under SYNC the
    flusher thread fsyncs what has been appended, then settles every request the fsync
    covered, while the loop reads the next requests and appends them.

    The append runs on the loop rather than on a thread of its own because it holds the
    GIL wherever it runs: an appender thread only took turns with the loop, waiting for
    the GIL after every burst of requests, and a SYNC producer's round trip is the whole
    cost."""

    def __init__(self, writer: Writer, metrics: WriterMetrics):
        self.writer = writer
        self.metrics = metrics
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: collections.deque[_Pending] = collections.deque()
        self._drain_scheduled = False
        self._closed = False
        # Called on the loop after messages are stored (the consumers' long polls wake).
        self.listeners: list[Callable[[], None]] = []
        # Appended, waiting for an fsync (SYNC only), each request with its outcome.
        self._appended = threading.Condition()
        self._unflushed: list[tuple[_Pending, _Stored | BaseException]] = []
        self._flusher: threading.Thread | None = None
        if writer.config.flush is FlushPolicy.SYNC:
            self._flusher = threading.Thread(target=self._flush_run, name="group-flush", daemon=True)
            self._flusher.start()

    def append(self, batch: MessageBatch, peer: SocketAddress | None, respond: Respond) -> asyncio.Future[Any]:
        """Queue a request's messages (on the loop); the future holds
        ``respond(results)`` once they are stored, or the error that refused them."""
        if self._closed:
            raise InvalidArgument("the writer is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        invariant(loop is self._loop, "a GroupAppender serves one event loop")
        pending = _Pending(batch, peer, respond, loop.create_future())
        self._queue.append(pending)
        if not self._drain_scheduled:
            # After the callbacks already due: the requests read meanwhile join the group.
            self._drain_scheduled = True
            loop.call_soon(self._drain)
        return pending.future

    def _drain(self) -> None:
        self._drain_scheduled = False
        if not self._queue:
            return
        group = [self._queue.popleft()]
        messages = group[0].count
        while self._queue and messages + self._queue[0].count <= GROUP_MAX_MESSAGES:
            messages += self._queue[0].count
            group.append(self._queue.popleft())
        if self._queue:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)
        try:
            outcomes: list[_Stored | BaseException] = group[0].context.run(self._store, group)
        except BaseException as error:  # never leave a caller waiting
            outcomes = [error] * len(group)
        if self._flusher is None:
            self._settle(list(zip(group, outcomes)))
        else:
            with self._appended:
                self._unflushed.extend(zip(group, outcomes))
                self._appended.notify()

    def _store(self, group: list[_Pending]) -> list[_Stored | BaseException]:
        """Append the group; each request's response, or the error that refused it."""
        batch = group[0].batch if len(group) == 1 else MessageBatch.concat([pending.batch for pending in group])
        parts = [(pending.count, pending.peer) for pending in group]
        outcomes: list[_Stored | BaseException] = []
        for pending, result in zip(group, self.writer.append_group(batch, parts, flush=False)):
            outcome: _Stored | BaseException
            if isinstance(result, AppendResults):
                try:
                    outcome = _Stored(pending.respond(result), result)
                except BaseException as error:  # never leave a caller waiting
                    outcome = error
            else:
                outcome = result
            outcomes.append(outcome)
        return outcomes

    def _flush_run(self) -> None:
        while True:
            with self._appended:
                while not self._unflushed and not self._closed:
                    self._appended.wait()
                if not self._unflushed:
                    return
                waiting, self._unflushed = self._unflushed, []
            if any(isinstance(outcome, _Stored) for _, outcome in waiting):
                try:
                    # Every request here was appended before this fsync began. Its span
                    # is the first request's child, linked to the others it acknowledges.
                    links = _request_links(waiting[1:]) if tracing_on() else []
                    if links:
                        waiting[0][0].context.run(self.writer.flush, links)
                    else:
                        waiting[0][0].context.run(self.writer.flush)
                except BaseException as error:
                    # Not known to be stored: nobody is acknowledged.
                    waiting = [(p, error if isinstance(o, _Stored) else o) for p, o in waiting]
            loop = self._loop
            assert loop is not None
            try:
                loop.call_soon_threadsafe(self._settle, waiting)
            except RuntimeError:
                pass  # the loop is closed: nobody awaits these any more

    def _settle(self, done: list[tuple[_Pending, _Stored | BaseException]]) -> None:
        """Acknowledge (or refuse) each request, then wake the listeners: on the loop."""
        for pending, outcome in done:
            if pending.future.done():
                continue  # the call was cancelled (its client went away)
            if isinstance(outcome, _Stored):
                self.metrics.appended(outcome.results, pending.started)
                pending.future.set_result(outcome.response)
            else:
                pending.future.set_exception(outcome)
        if any(isinstance(outcome, _Stored) for _, outcome in done):
            for listener in self.listeners:
                listener()

    def close(self) -> None:
        """Flush and acknowledge what is appended, then stop the flusher; later appends
        are refused. Called once the server has stopped (no handler is waiting)."""
        self._closed = True
        if self._flusher is not None:
            with self._appended:
                self._appended.notify()
            self._flusher.join()


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
        peer = peer_address(context)
        async for request in request_iterator:
            try:
                response = await self._append(request, peer)
            except StoreError as error:
                await abort_with_async(context, error)
                return
            # The next request is read only once this ack is on its way: a producer that
            # reads no acks is held by HTTP/2 flow control (its sends wait), so what the
            # writer holds for it stays one window, and after the limit its stream ends.
            try:
                await asyncio.wait_for(context.write(response), self.stalled_write_s)
            except TimeoutError:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the client read no ack for {self.stalled_write_s:g} s: the stream is closed",
                )

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
                for t, q, lo, hi in status["queues"]
            ],
            disk_total_bytes=status["disk_total_bytes"],
            disk_used_bytes=status["disk_used_bytes"],
            disk_used_ratio=status["disk_used_ratio"],
            flush_policy=status["flush_policy"],
            store=status["store"] if may_see_paths() else "",
        )
