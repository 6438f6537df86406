"""Messages as the v1 contract's columnar request (``SendBatchRequest.columns``,
``MessageColumns``): what the writer reads without an object a message, and stores
exactly as it stores the same messages sent as ``messages``."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from rmqstore.common.sequences import all_equal
from rmqstore.v1 import messages_pb2, writer_pb2

# The columns' queue id that asks the writer to pick one.
PICKED_BY_WRITER = -1
_NO_PROPERTIES: dict[str, str] = {}  # shared, never changed


def batch_request(messages: Sequence[messages_pb2.Message], **fields: Any) -> writer_pb2.SendBatchRequest:
    """A SendBatchRequest of ``messages`` and the request's other ``fields``: as
    ``columns`` where :func:`message_columns` can say them so, else as ``messages``."""
    columns = message_columns(messages)
    if columns is None:
        return writer_pb2.SendBatchRequest(messages=messages, **fields)
    return writer_pb2.SendBatchRequest(columns=columns, **fields)  # the lists handed to protobuf's runtime whole


def message_columns(messages: Sequence[messages_pb2.Message]) -> dict[str, list[Any]] | None:
    """The MessageColumns fields of ``messages`` (a column every message leaves at its
    default is left out), or None where they cannot be said as columns: where the writer
    would read the columns otherwise than the messages, which it refuses — a key that is
    empty or holds a space (the keys column joins a message's keys by spaces) or a queue
    id of -1 (the column's "the writer picks"). Those are sent as messages, for the
    writer to refuse in its own words; so is an empty batch.

    Each field is read for all messages in one pass: reading a field of a proto message
    costs more than anything done with it."""
    if not messages:
        return None
    key_lists = [m.keys[:] for m in messages]  # plain lists; the proto's container is slow to iterate
    keys = list(map(" ".join, key_lists))
    if any(keys) and [key.split(" ") if key else [] for key in keys] != key_lists:
        return None
    chosen = [m.queue_id if m.HasField("queue_id") else None for m in messages]
    if PICKED_BY_WRITER in chosen:
        return None
    topics = [m.topic for m in messages]
    columns: dict[str, list[Any]] = {
        "bodies": [m.body for m in messages],
        "topics": topics[:1] if all_equal(topics) else topics,
        "queue_ids": [PICKED_BY_WRITER if queue_id is None else queue_id for queue_id in chosen],
        "keys": keys,
        "tags": [m.tags for m in messages],
        "uniq_keys": [m.uniq_key for m in messages],
        "flags": [m.flag for m in messages],
        "born_timestamps_ms": [m.born_timestamp_ms for m in messages],
        "born_hosts": [m.born_host for m in messages],
    }
    if chosen.count(None) == len(chosen):
        del columns["queue_ids"]
    properties = [dict(m.properties) if m.properties else _NO_PROPERTIES for m in messages]  # dict() of an empty map costs
    if any(properties):
        columns["property_counts"] = list(map(len, properties))
        columns["property_names"] = list(chain.from_iterable(properties))
        columns["property_values"] = list(chain.from_iterable(map(dict.values, properties)))
    return {name: values for name, values in columns.items() if name == "bodies" or any(values)}
