"""WriterService: validate the request, call the store, map errors (service.errors)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import grpc

from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import MSG_ID_OFFSET_DIGITS
from rmqstore.common.errors import InvalidArgument, StoreError
from rmqstore.service.errors import abort_with, mapped
from rmqstore.service.metrics import WriterMetrics
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc
from rmqstore.writer.store import AppendResult, AppendResults, Writer
from rmqstore.writer.validate import EMPTY_PROPERTIES, MessageBatch

SERVICE_NAME = "rmqstore.v1.WriterService"


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


class WriterServicer(writer_pb2_grpc.WriterServiceServicer):
    def __init__(self, writer: Writer):
        self.writer = writer
        self.metrics = WriterMetrics(writer)

    def _append(self, messages: Sequence[messages_pb2.Message], context: grpc.ServicerContext) -> AppendResults:
        started = time.perf_counter()
        results = self.writer.append(to_batch(messages), peer=peer_address(context))
        self.metrics.appended(len(results), results.size_bytes, started)
        return results

    @mapped
    def Send(self, request: writer_pb2.SendRequest, context: grpc.ServicerContext) -> writer_pb2.SendResponse:
        if not request.HasField("message"):
            raise InvalidArgument("the request has no message")
        return writer_pb2.SendResponse(result=to_result(self._append([request.message], context)[0]))

    @mapped
    def SendBatch(self, request: writer_pb2.SendBatchRequest, context: grpc.ServicerContext) -> writer_pb2.SendBatchResponse:
        return to_response(self._append(request.messages, context), request.compact_results)

    def SendStream(
        self, request_iterator: Iterator[writer_pb2.SendBatchRequest], context: grpc.ServicerContext
    ) -> Iterator[writer_pb2.SendBatchResponse]:
        for request in request_iterator:
            try:
                results = self._append(request.messages, context)
            except StoreError as error:
                abort_with(context, error)
                return
            yield to_response(results, request.compact_results)

    @mapped
    def CreateTopic(self, request: writer_pb2.CreateTopicRequest, context: grpc.ServicerContext) -> writer_pb2.CreateTopicResponse:
        count = request.queue_count or self.writer.config.default_queue_count
        created = self.writer.topics.create(request.name, count)
        return writer_pb2.CreateTopicResponse(
            topic=messages_pb2.Topic(name=request.name, queue_count=self.writer.topics.queue_count(request.name) or count),
            created=created,
        )

    @mapped
    def ListTopics(self, request: writer_pb2.ListTopicsRequest, context: grpc.ServicerContext) -> writer_pb2.ListTopicsResponse:
        return writer_pb2.ListTopicsResponse(
            topics=[messages_pb2.Topic(name=n, queue_count=c) for n, c in sorted(self.writer.topics.snapshot().items())]
        )

    @mapped
    def Flush(self, request: writer_pb2.FlushRequest, context: grpc.ServicerContext) -> writer_pb2.FlushResponse:
        return writer_pb2.FlushResponse(flushed_offset=self.writer.flush_thoroughly())

    @mapped
    def Status(self, request: writer_pb2.StatusRequest, context: grpc.ServicerContext) -> writer_pb2.StatusResponse:
        status = self.writer.status()
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
