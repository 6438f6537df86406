"""QueryService: lookups over a read-only StoreView; errors mapped in service.errors."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

import grpc
from opentelemetry import trace

from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import offset_msg_id_prefix, offset_msg_id_tail
from rmqstore.common.codec.properties import KEYS, TAGS, UNIQ_KEY, split_keys
from rmqstore.common.codec.record import Record
from rmqstore.common.conventions import MESSAGING_DESTINATION_NAME, MESSAGING_SYSTEM, ROCKETMQ
from rmqstore.common.errors import InvalidArgument, StoreError
from rmqstore.common.files.broker_config import NORMAL, read_topic_types
from rmqstore.common.files.consumequeue import Boundary
from rmqstore.common.tracing import span
from rmqstore.query.groups import (
    BROKER_NAME_DEFAULT,
    GroupOffsets,
    group_lag,
    group_topics,
    queue_lags,
)
from rmqstore.query.metrics import QueryMetrics
from rmqstore.query.view import TIME_MAX_MS, TIME_MIN_MS, StoreView
from rmqstore.service.acl import may_see_paths
from rmqstore.service.errors import abort_with, abort_with_async, mapped
from rmqstore.service.limits import STALLED_WRITE_S
from rmqstore.service.stall import StallWatch
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc

SERVICE_NAME = "rmqstore.v1.QueryService"
_TRACER = trace.get_tracer("rmqstore.query")


_BOUNDARIES = {query_pb2.BOUNDARY_LOWER: Boundary.LOWER, query_pb2.BOUNDARY_UPPER: Boundary.UPPER}

# Hosts repeat from record to record (the compiled reader gives the records of one host the
# same SocketAddress): each host's java_text and msgId prefix are kept by the host's
# identity, which costs less than hashing a SocketAddress (a dataclass) twice a record. The
# host is kept beside its texts, so its id is not reused while it is here; past
# HOST_TEXTS_MAX hosts the table starts again.
HOST_TEXTS_MAX = 4096
_host_texts_by_id: dict[int, tuple[SocketAddress, str, str]] = {}


def _host_texts(host: SocketAddress) -> tuple[SocketAddress, str, str]:
    known = _host_texts_by_id.get(id(host))
    if known is None or known[0] is not host:
        if len(_host_texts_by_id) >= HOST_TEXTS_MAX:
            _host_texts_by_id.clear()
        known = _host_texts_by_id[id(host)] = (host, host.java_text(), offset_msg_id_prefix(host))
    return known


def stored_fields(record: Record) -> dict[str, Any]:
    """A record's StoredMessage as its fields, its properties aside (:func:`with_properties`):
    an answer made from these (a dict a message field) is built in place, where one made
    from StoredMessages copies each of them, which cost a third of the answer's making for
    a page of 32 (benchmarks/LOOKUPS.md). Zero numbers are left out, as proto3 leaves them
    out of the bytes: a field not given costs nothing to set."""
    properties = record.properties
    keys = properties.get(KEYS)
    born, store = _host_texts(record.born_host), _host_texts(record.store_host)
    fields = dict(
        topic=record.topic,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
        commitlog_offset=record.commitlog_offset,
        size=record.size,
        store_timestamp_ms=record.store_timestamp_ms,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=born[1],
        store_host=store[1],
        body_crc=record.body_crc,
        keys=split_keys(keys) if keys else [],
        tags=properties.get(TAGS) or "",
        uniq_key=properties.get(UNIQ_KEY) or "",
        body=record.body,
        offset_msg_id=store[2] + offset_msg_id_tail(record.commitlog_offset),
    )
    if record.sys_flag:
        fields["sys_flag"] = record.sys_flag
    if record.flag:
        fields["flag"] = record.flag
    if record.reconsume_times:
        fields["reconsume_times"] = record.reconsume_times
    if record.prepared_transaction_offset:
        fields["prepared_transaction_offset"] = record.prepared_transaction_offset
    return fields


def many_stored_fields(records: Sequence[Record]) -> list[dict[str, Any]]:
    """:func:`stored_fields` of an answer's records."""
    return [stored_fields(record) for record in records]


def with_properties(messages: Iterable[messages_pb2.StoredMessage], records: Iterable[Record]) -> None:
    """Each record's properties into its StoredMessage made from :func:`stored_fields`: a
    map given to a message's constructor goes through the Python MutableMapping.update of
    protobuf's map (an ABC isinstance check and a lookup an entry), at twice the cost of
    setting its entries here, which insert them in the same order (the same bytes)."""
    for message, record in zip(messages, records, strict=True):
        properties = message.properties
        for name, value in record.properties.items():
            properties[name] = value


def to_stored(record: Record) -> messages_pb2.StoredMessage:
    message = messages_pb2.StoredMessage(**stored_fields(record))
    with_properties((message,), (record,))
    return message


class _Lookup:
    """A lookup's span ``rmqstore.lookup.<kind>`` (with the topic looked in) and its
    duration (QueryMetrics.record) as one context manager: the two, nested in a generator's
    context manager, cost a few µs of every lookup."""

    __slots__ = ("kind", "metrics", "spanning", "started_s", "topic")

    def __init__(self, metrics: QueryMetrics, kind: str, topic: str):
        self.metrics, self.kind, self.topic = metrics, kind, topic

    def __enter__(self) -> trace.Span:
        self.started_s = time.perf_counter()
        self.spanning = span(_TRACER, f"rmqstore.lookup.{self.kind}")
        current = self.spanning.__enter__()
        if self.topic and current.is_recording():
            current.set_attributes({MESSAGING_SYSTEM: ROCKETMQ, MESSAGING_DESTINATION_NAME: self.topic})
        return current

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace_back: TracebackType | None) -> None:
        try:
            self.spanning.__exit__(kind, error, trace_back)
        finally:
            self.metrics.record(self.kind, time.perf_counter() - self.started_s)


class QueryServicer(query_pb2_grpc.QueryServiceServicer):
    def __init__(self, view: StoreView, *, broker_name: str = BROKER_NAME_DEFAULT):
        self.view = view
        self.metrics = QueryMetrics(view)
        self.broker_name = broker_name
        self.group_offsets = GroupOffsets(view.paths.config)

    def _lookup(self, kind: str, topic: str = "") -> _Lookup:
        return _Lookup(self.metrics, kind, topic)

    @mapped
    def QueryByKey(self, request: query_pb2.QueryByKeyRequest, context: grpc.ServicerContext) -> query_pb2.QueryByKeyResponse:
        with self._lookup("key", request.topic) as span:
            page = self.view.by_key(
                request.topic,
                request.key,
                begin_ms=request.begin_ms if request.HasField("begin_ms") else TIME_MIN_MS,
                end_ms=request.end_ms if request.HasField("end_ms") else TIME_MAX_MS,
                page_size=request.page_size,
                cursor=request.cursor,
            )
            span.set_attribute("rmqstore.results", len(page.records))
        response = query_pb2.QueryByKeyResponse(
            messages=many_stored_fields(page.records), cursor=page.cursor, complete=page.complete
        )
        with_properties(response.messages, page.records)
        return response

    @mapped
    def QueryByUniqKey(self, request: query_pb2.QueryByUniqKeyRequest, context: grpc.ServicerContext) -> query_pb2.QueryByUniqKeyResponse:
        with self._lookup("uniq_key", request.topic) as span:
            page = self.view.uniq_key_page(request.topic, request.uniq_key, request.cursor)
            span.set_attribute("rmqstore.results", len(page.records))
        response = query_pb2.QueryByUniqKeyResponse(
            messages=many_stored_fields(page.records), cursor=page.cursor, complete=page.complete
        )
        with_properties(response.messages, page.records)
        return response

    @mapped
    def QueryByMsgId(self, request: query_pb2.QueryByMsgIdRequest, context: grpc.ServicerContext) -> query_pb2.QueryByMsgIdResponse:
        with self._lookup("msg_id") as span:
            record = self.view.by_msg_id(request.msg_id)
            span.set_attributes({MESSAGING_SYSTEM: ROCKETMQ, MESSAGING_DESTINATION_NAME: record.topic, "rmqstore.results": 1})
        response = query_pb2.QueryByMsgIdResponse(message=stored_fields(record))
        with_properties((response.message,), (record,))
        return response

    @mapped
    def QueryByQueueOffset(
        self, request: query_pb2.QueryByQueueOffsetRequest, context: grpc.ServicerContext
    ) -> query_pb2.QueryByQueueOffsetResponse:
        with self._lookup("queue_offset", request.topic) as span:
            span.set_attribute("rmqstore.results", 1)
            record = self.view.by_queue_offset(request.topic, request.queue_id, request.queue_offset)
        response = query_pb2.QueryByQueueOffsetResponse(message=stored_fields(record))
        with_properties((response.message,), (record,))
        return response

    @mapped
    def Pull(self, request: query_pb2.PullRequest, context: grpc.ServicerContext) -> query_pb2.PullResponse:
        with self._lookup("pull", request.topic) as span:
            records, next_offset = self.view.pull(
                request.topic, request.queue_id, request.from_offset, request.max_count, request.max_bytes
            )
            low, high = self.view.queue_bounds(request.topic, request.queue_id)
            span.set_attribute("rmqstore.results", len(records))
        response = query_pb2.PullResponse(
            messages=many_stored_fields(records), next_offset=next_offset, min_offset=low, max_offset=high
        )
        with_properties(response.messages, records)
        return response

    @mapped
    def QueueBounds(self, request: query_pb2.QueueBoundsRequest, context: grpc.ServicerContext) -> query_pb2.QueueBoundsResponse:
        low, high = self.view.queue_bounds(request.topic, request.queue_id)
        return query_pb2.QueueBoundsResponse(min_offset=low, max_offset=high)

    @mapped
    def SearchOffset(self, request: query_pb2.SearchOffsetRequest, context: grpc.ServicerContext) -> query_pb2.SearchOffsetResponse:
        boundary = _BOUNDARIES.get(request.boundary)
        if boundary is None:
            # proto3 keeps an enum value it does not know: it is the client's mistake, not LOWER.
            raise InvalidArgument(f"boundary {request.boundary} is neither BOUNDARY_LOWER (0) nor BOUNDARY_UPPER (1)")
        with self._lookup("search_offset"):
            result = self.view.search_offset(request.topic, request.queue_id, request.timestamp_ms, boundary)
        return query_pb2.SearchOffsetResponse(offset=result.offset, found=result.found)

    def StreamByTime(self, request: query_pb2.StreamByTimeRequest, context: grpc.ServicerContext) -> Iterator[messages_pb2.StoredMessage]:
        with self._lookup("time_range"):
            try:
                for record in self.view.messages_between(request.topic, request.queue_id, request.begin_ms, request.end_ms):
                    yield to_stored(record)
            except StoreError as error:
                abort_with(context, error)

    @mapped
    def ListTopics(self, request: query_pb2.ListQueryTopicsRequest, context: grpc.ServicerContext) -> query_pb2.ListQueryTopicsResponse:
        topics = []
        types = read_topic_types(self.view.paths.config)
        for name, queue_ids in self.view.topics().items():
            queues = []
            for queue_id in queue_ids:
                low, high = self.view.queue_bounds(name, queue_id)
                newest = self.view.newest_store_timestamp(name, queue_id)
                queues.append(
                    query_pb2.QueueInfo(queue_id=queue_id, min_offset=low, max_offset=high, newest_store_timestamp_ms=newest)
                )
            topics.append(query_pb2.TopicInfo(name=name, queues=queues, message_type=types.get(name, NORMAL)))
        return query_pb2.ListQueryTopicsResponse(topics=topics)

    @mapped
    def OffsetsByTime(self, request: query_pb2.OffsetsByTimeRequest, context: grpc.ServicerContext) -> query_pb2.OffsetsByTimeResponse:
        with self._lookup("offsets_by_time"):
            offsets = self.view.offsets_by_time(request.topic, request.queue_id, list(request.timestamps_ms))
        return query_pb2.OffsetsByTimeResponse(offsets=offsets)

    @mapped
    def ListGroups(self, request: query_pb2.ListGroupsRequest, context: grpc.ServicerContext) -> query_pb2.ListGroupsResponse:
        with self._lookup("list_groups"):
            table = self.group_offsets.table()
            groups = []
            for group, topics in group_topics(table).items():
                lag_total = sum(row.lag for row in queue_lags(self.view, table, group, topics))
                groups.append(query_pb2.GroupSummary(group=group, topics=topics, lag_total=lag_total))
        return query_pb2.ListGroupsResponse(groups=groups)

    @mapped
    def GroupLag(self, request: query_pb2.GroupLagRequest, context: grpc.ServicerContext) -> query_pb2.GroupLagResponse:
        with self._lookup("group_lag") as span:
            span.set_attribute("rmqstore.group", request.group)
            rows = group_lag(self.view, self.group_offsets.table(), request.group, request.topic)
        queues = [
            query_pb2.QueueLag(
                topic=row.topic,
                queue_id=row.queue_id,
                broker_offset=row.broker_offset,
                consumer_offset=row.consumer_offset,
                lag=row.lag,
            )
            for row in rows
        ]
        return query_pb2.GroupLagResponse(
            group=request.group, broker_name=self.broker_name, queues=queues, lag_total=sum(row.lag for row in rows)
        )

    @mapped
    def Ping(self, request: query_pb2.PingRequest, context: grpc.ServicerContext) -> query_pb2.PingResponse:
        return query_pb2.PingResponse()

    @mapped
    def Stats(self, request: query_pb2.StatsRequest, context: grpc.ServicerContext) -> query_pb2.StatsResponse:
        stats = self.view.stats()
        status = self.view.status()
        return query_pb2.StatsResponse(
            commitlog_min_offset=status.min_offset,
            visible_offset=status.visible_offset,
            published_offset=status.published_offset,
            lag_bytes=status.lag_bytes,
            refreshed_ago_ms=status.refreshed_ago_ms,
            messages=stats["messages"],  # type: ignore[arg-type]
            commitlog_files=stats["commitlog_files"],  # type: ignore[arg-type]
            index_files=stats["index_files"],  # type: ignore[arg-type]
            follows_writer=status.has_progress,
            store=self.view.root,
        )


# Records a stream reads from the store at a time, on the executor, between writes: what a
# stream whose reader has stopped holds (with grpc's 64 KiB window), about 150 KB of
# memory for records of 1 KiB.
STREAM_BATCH_RECORDS = 16


def _take(records: Iterator[Record], count: int) -> list[messages_pb2.StoredMessage]:
    return [to_stored(record) for record in itertools.islice(records, count)]


# A key page of at most this many records may be answered on the event loop.
INLINE_KEY_PAGE_MAX = 32


def _unary(name: str, inline: Callable[[StoreView, Any], bool] | None = None) -> Callable[..., Awaitable[Any]]:
    """An asyncio handler running QueryServicer's lookup ``name`` on the loop's executor,
    or on the loop itself when ``inline`` says the request reads a record or a few and the
    view's lock is free: a hop to a thread and back costs more than such a lookup, and the
    loop never waits on the lock (a long Pull holding it sends the lookup to a thread)."""
    lookup = getattr(QueryServicer, name).__wrapped__  # the lookup under its error mapping

    async def handler(self: AsyncQueryServicer, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            view = self.lookups.view
            if inline is not None and inline(view, request) and view.lock.acquire(blocking=False):
                try:
                    return lookup(self.lookups, request, context)  # in the call's context already
                finally:
                    view.lock.release()
            # In the call's context: the lookup's span is the server span's child.
            return await asyncio.get_running_loop().run_in_executor(
                None, contextvars.copy_context().run, lookup, self.lookups, request, context
            )
        except StoreError as error:
            await abort_with_async(context, error)

    handler.__name__ = handler.__qualname__ = name
    return handler


def _always(view: StoreView, request: Any) -> bool:
    return True


def _short_key_page(view: StoreView, request: query_pb2.QueryByKeyRequest) -> bool:
    return request.page_size <= INLINE_KEY_PAGE_MAX and view.walks_little_first()


def _uniq_key_page(view: StoreView, request: query_pb2.QueryByUniqKeyRequest) -> bool:
    return view.walks_little_first()


def _indexed_time_search(view: StoreView, request: query_pb2.SearchOffsetRequest) -> bool:
    return view.has_time_index(request.topic, request.queue_id)


class AsyncQueryServicer(query_pb2_grpc.QueryServiceServicer):
    """:class:`QueryServicer` on grpc's asyncio server (service.server.AsyncServing): a
    lookup is short CPU work under the view's lock; a point lookup that reads little runs
    on the loop (_unary), the others on the loop's executor, while waiting holds no thread:
    an idle connection, a stream whose reader has stopped, or a thousand of them leave the
    executor to the lookups and the loop to Ping, health and the point lookups."""

    def __init__(self, view: StoreView, *, stalled_write_s: float = STALLED_WRITE_S, broker_name: str = BROKER_NAME_DEFAULT):
        self.lookups = QueryServicer(view, broker_name=broker_name)
        self.stalled_write_s = stalled_write_s

    # Point lookups on the loop when they read little (_unary); the rest on the executor.
    QueryByKey = _unary("QueryByKey", _short_key_page)
    QueryByUniqKey = _unary("QueryByUniqKey", _uniq_key_page)
    QueryByMsgId = _unary("QueryByMsgId", _always)
    QueryByQueueOffset = _unary("QueryByQueueOffset", _always)
    Pull = _unary("Pull")
    QueueBounds = _unary("QueueBounds")
    SearchOffset = _unary("SearchOffset", _indexed_time_search)
    ListTopics = _unary("ListTopics")
    OffsetsByTime = _unary("OffsetsByTime")
    ListGroups = _unary("ListGroups")
    GroupLag = _unary("GroupLag")
    _stats = _unary("Stats")

    async def Stats(self, request: query_pb2.StatsRequest, context: grpc.aio.ServicerContext[Any, Any]) -> query_pb2.StatsResponse:
        response: query_pb2.StatsResponse = await self._stats(request, context)
        if not may_see_paths():  # decided here, on the call's task, where the ACL set its caller
            response.store = ""
        return response

    async def Ping(self, request: query_pb2.PingRequest, context: grpc.aio.ServicerContext[Any, Any]) -> query_pb2.PingResponse:
        return query_pb2.PingResponse()  # on the loop itself: it measures the node, not its executor

    async def StreamByTime(self, request: query_pb2.StreamByTimeRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        loop = asyncio.get_running_loop()
        view = self.lookups.view
        with self.lookups._lookup("time_range"):
            records = view.messages_between(
                request.topic, request.queue_id, request.begin_ms, request.end_ms, chunk_records=STREAM_BATCH_RECORDS
            )
            with StallWatch(self.stalled_write_s, "nothing") as watch:
                while True:
                    try:
                        batch = await loop.run_in_executor(None, _take, records, STREAM_BATCH_RECORDS)
                    except StoreError as error:
                        await abort_with_async(context, error)
                        return
                    if not batch:
                        return
                    for message in batch:
                        # A write completes once HTTP/2 flow control lets the message go: a
                        # reader that stops reading stops the stream here, holding only this
                        # message, and past the limit the stream ends.
                        await watch.write(context, message)
