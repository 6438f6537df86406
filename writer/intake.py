"""What a write request becomes: its messages as the store's batch columns
(:func:`request_batch`: ``columns`` mapped straight onto them, ``messages`` read a field at
a time), and its results as the response (built by protobuf's runtime). Pure functions:
no I/O, no store."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import MSG_ID_OFFSET_DIGITS, offset_msg_ids
from rmqstore.common.errors import InvalidArgument
from rmqstore.v1 import messages_pb2, writer_pb2
from rmqstore.writer.store import AppendResults
from rmqstore.writer.validate import EMPTY_PROPERTIES, MessageBatch


@functools.lru_cache(maxsize=4096)
def _parsed_host(text: str) -> SocketAddress:
    """A born host's address: a producer's (or a proxy's clients') few hosts come back with
    every message, and parsing one costs more than the rest of its column entry."""
    return SocketAddress.parse(text)


def _born_host(text: str, position: int) -> SocketAddress | None:
    if not text:
        return None
    try:
        return _parsed_host(text)
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
