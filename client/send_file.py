"""``rmqstore send --file``: a JSON Lines file of messages (one object a line: README,
"send") read into the columns of the v1 contract's columnar request
(``SendBatchRequest.columns``), checked whole by the writer's rules
(:mod:`rmqstore.common.message_rules`) before any of it is sent, sent in batches, and the
batches' acks written as JSON Lines.

Every file takes one path. orjson parses the lines; each field becomes a column in a few
whole-column passes (C-speed ``map``s and ``set``s, no Python step a message); the
writer's batch screen vouches for every message at once; protobuf's runtime builds each
request from slices of the columns. Only where a pass finds something amiss is the file
checked one message at a time, in order, so that the first bad line is the one named, in
the words a line alone would get: the lines, by :func:`first_problem`, where one is no
message of the format (not UTF-8, not JSON, a field of the wrong type); the columns'
messages, by the writer's rules, where the screen declines some. The screen may decline
a message the rules accept (a key outside ASCII, say): then that check finds nothing,
and the columns are sent as they are."""

from __future__ import annotations

import binascii
import functools
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, repeat
from typing import Any

import orjson

from rmqstore.client.jsonl import FIELDS, QUEUE_ID_MAX, message_from_json
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.message_rules import (
    Limits,
    MessageBatch,
    MessageInput,
    plain_properties_bytes,
    plain_property_columns,
    plainly_valid_beside,
    validate_message,
)
from rmqstore.common.sequences import all_equal
from rmqstore.v1 import messages_pb2, writer_pb2

# The columns' queue id that asks the writer to pick one.
PICKED_BY_WRITER = -1

# Shared, never changed: the default of a message without keys or properties.
_NO_KEYS: list[str] = []
_NO_PROPERTIES: dict[str, str] = {}
_NONE_TYPE = type(None)
# base64.b64decode(text, validate=True) without its Python frame: the same strict check.
_from_base64 = functools.partial(binascii.a2b_base64, strict_mode=True)


@dataclass
class Columns:
    """Messages as MessageColumns takes them, each column one entry a message (``keys``
    joined by single spaces, ``queue_ids`` -1 where the writer picks). ``given`` names the
    columns any message sets: the others are left out of the requests (empty: every
    message takes the default)."""

    topics: list[str]
    bodies: list[bytes]
    keys: list[str]
    tags: list[str]
    queue_ids: list[int]
    uniq_keys: list[str]
    property_counts: list[int]
    property_names: list[str]
    property_values: list[str]
    given: frozenset[str] = field(default_factory=frozenset)

    def __len__(self) -> int:
        return len(self.topics)


def read_file(path: str, limits: Limits, shared_properties: Mapping[str, str]) -> Columns:
    """Every message of the JSON Lines file at ``path``, checked by the writer's rules as
    stored with ``shared_properties`` (those it does not set itself); raises
    InvalidArgument naming the first bad line. Blank lines are skipped."""
    lines = _read(path).split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    documents, numbers = _parsed(path, lines, limits, shared_properties)
    columns = _columns(documents, limits, shared_properties, numbers)
    if columns is None:  # a line that is no message of the format
        first_problem(path, lines, limits, shared_properties)
        raise AssertionError("a line the columns refuse is a problem first_problem names")
    return columns


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except IsADirectoryError:
        raise InvalidArgument(f"--file {path}: is a directory, not a JSONL file") from None
    except OSError as error:
        raise InvalidArgument(f"--file {path}: {error.strerror or error}") from None


def _parsed(
    path: str, lines: list[bytes], limits: Limits, shared_properties: Mapping[str, str]
) -> tuple[list[Any], list[int] | None]:
    """Each line's JSON value, blank lines skipped, and each value's line number (None
    when no line is blank: the i-th value is line i + 1)."""
    try:
        return list(map(orjson.loads, lines)), None
    except orjson.JSONDecodeError:
        pass
    numbers = [number for number, line in enumerate(lines, start=1) if line.strip()]
    try:
        return list(map(orjson.loads, [lines[number - 1] for number in numbers])), numbers
    except orjson.JSONDecodeError:
        first_problem(path, lines, limits, shared_properties)
    raise AssertionError("a line orjson refuses is a problem first_problem names")


def _all(values: Any, *types: type) -> bool:
    """Whether every value is of one of ``types`` (exactly: a bool is no int here)."""
    return set(map(type, values)) <= set(types)


def _columns(
    documents: list[Any], limits: Limits, shared_properties: Mapping[str, str], numbers: list[int] | None
) -> Columns | None:
    """The documents' columns when every one is a message of the file format, else None.
    Each message is checked by the writer's rules (raising InvalidArgument for the first
    one that breaks one, named by its line in ``numbers``, :func:`_parsed`'s)."""
    count = len(documents)
    if not _all(documents, dict):
        return None
    given = frozenset().union(*documents)
    if not given <= FIELDS:
        return None
    topics: list[Any] = list(map(dict.get, documents, repeat("topic")))
    if not _all(topics, str):
        return None
    bodies = _bodies(documents, given, count)
    if bodies is None:
        return None
    key_lists: list[Any] = [_NO_KEYS] * count
    if "keys" in given:
        key_lists = list(map(dict.get, documents, repeat("keys"), repeat(_NO_KEYS)))
        kinds = set(map(type, key_lists))
        if not kinds <= {list, str}:
            return None
        if str in kinds:  # one space-separated string
            key_lists = [keys.split() if type(keys) is str else keys for keys in key_lists]
        if not _all(chain.from_iterable(key_lists), str):
            return None
    tags = _texts(documents, "tags", given, count)
    uniq_keys = _texts(documents, "uniqKey", given, count)
    if tags is None or uniq_keys is None:
        return None
    queue_ids: list[Any] = list(map(dict.get, documents, repeat("queueId")))
    kinds = set(map(type, queue_ids))
    if not kinds <= {int, _NONE_TYPE}:
        return None
    chosen = queue_ids if _NONE_TYPE not in kinds else [queue_id for queue_id in queue_ids if queue_id is not None]
    if chosen and (min(chosen) < 0 or max(chosen) > QUEUE_ID_MAX):
        return None
    properties: list[Any] = [_NO_PROPERTIES] * count
    if "properties" in given:
        properties = list(map(dict.get, documents, repeat("properties"), repeat(_NO_PROPERTIES)))
        if not _all(properties, dict):
            return None
    names: list[str] = list(chain.from_iterable(properties))
    values: list[Any] = list(chain.from_iterable(map(dict.values, properties)))
    if not _all(values, str):
        return None
    counts = list(map(len, properties)) if names else []
    if count:
        batch = MessageBatch(topics, bodies, key_lists, tags, properties, queue_ids, uniq_keys, [], [], [])
        if not _screened(batch, counts, names, values, limits, shared_properties):
            _check_each(batch, limits, shared_properties, numbers)
    return Columns(
        topics, bodies, list(map(" ".join, key_lists)), tags,
        _queue_id_column(queue_ids, kinds) if chosen else [],
        uniq_keys, counts, names, values, given,
    )  # fmt: skip


def _queue_id_column(queue_ids: list[Any], kinds: set[type]) -> list[int]:
    """The queue ids as the columns give them: -1 where the writer picks."""
    if _NONE_TYPE not in kinds:
        return queue_ids
    return [PICKED_BY_WRITER if queue_id is None else queue_id for queue_id in queue_ids]


def _bodies(documents: list[Any], given: frozenset[str], count: int) -> list[bytes] | None:
    """Each message's body: its ``body`` as UTF-8, or its ``bodyBase64`` decoded; None
    where one is of the wrong type, not base64, or a message gives both or neither."""
    texts: list[Any] = []
    given_body = sum(map(operator.contains, documents, repeat("body"))) if "body" in given else 0
    given_base64 = sum(map(operator.contains, documents, repeat("bodyBase64"))) if "bodyBase64" in given else 0
    if given_body + given_base64 < count:  # a message without a body (first_problem names it)
        return None
    if "body" in given:
        texts = list(map(dict.get, documents, repeat("body"), repeat("")))
        if not _all(texts, str):
            return None
    if "bodyBase64" not in given:
        return list(map(str.encode, texts)) if texts else [b""] * count
    try:
        decoded = list(map(_from_base64, map(dict.get, documents, repeat("bodyBase64"), repeat(""))))
    except (ValueError, TypeError):  # binascii.Error is a ValueError
        return None
    if not texts:
        return decoded
    # Some messages give text, others base64: none may give both.
    if any(map(operator.and_, map(operator.contains, documents, repeat("body")), map(operator.contains, documents, repeat("bodyBase64")))):
        return None
    return list(map(bytes.__add__, map(str.encode, texts), decoded))


def _texts(documents: list[Any], name: str, given: frozenset[str], count: int) -> list[str] | None:
    """A text field's column (null and absent are ""), or None where one is not text."""
    if name not in given:
        return [""] * count
    texts: list[Any] = list(map(dict.get, documents, repeat(name), repeat("")))
    kinds = set(map(type, texts))
    if not kinds <= {str, _NONE_TYPE}:
        return None
    return [text or "" for text in texts] if _NONE_TYPE in kinds else texts


def _screened(
    batch: MessageBatch, counts: list[int], names: list[str], values: list[str], limits: Limits,
    shared_properties: Mapping[str, str],
) -> bool:  # fmt: skip
    """Whether the writer's batch screen passes every message, stored with its own
    properties and the shared ones (their sizes added: at least the merged size)."""
    own = plain_property_columns(counts, names, values)
    shared = plain_properties_bytes([shared_properties]) if shared_properties else 0
    if own is None or shared is None:
        return False
    return plainly_valid_beside(batch, limits, own + shared)


def _check_each(batch: MessageBatch, limits: Limits, shared_properties: Mapping[str, str], numbers: list[int] | None) -> None:
    """Every message by the writer's rules, one by one (where the batch screen declined
    some: it finds the first problem and words it, or passes a message the screen could
    not vouch for, such as one with a key outside ASCII)."""
    for position, (topic, body, keys, tags, own, queue_id, uniq_key) in enumerate(
        zip(batch.topics, batch.bodies, batch.keys, batch.tags, batch.properties, batch.queue_ids, batch.uniq_keys)
    ):
        properties = {**shared_properties, **own} if shared_properties else own
        try:
            validate_message(MessageInput(topic, body, keys, tags, properties, queue_id, uniq_key), limits)
        except InvalidArgument as error:
            number = position + 1 if numbers is None else numbers[position]
            raise InvalidArgument(f"line {number}: {error}") from None


def first_problem(path: str, lines: Sequence[bytes], limits: Limits, shared_properties: Mapping[str, str]) -> None:
    """Check the lines one by one, in order, by every rule (UTF-8, JSON, the format's
    fields, the writer's rules for the message stored with ``shared_properties``); raise
    InvalidArgument for the first bad one, naming it. Returns when every line passes."""
    at = 0  # the line's first byte in the file
    for number, line in enumerate(lines, start=1):
        start, at = at, at + len(line) + 1
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidArgument(
                f"--file {path}: line {number} is not UTF-8 ({error.reason} at byte {start + error.start})"
            ) from None
        try:
            document = orjson.loads(text)
        except orjson.JSONDecodeError as error:
            # orjson counts lines and columns in what it was given, the one line: its column.
            raise InvalidArgument(f"line {number}, column {error.colno}: not JSON: {error.msg}") from None
        message = message_from_json(number, document)
        candidate = MessageInput(
            topic=message.topic,
            body=message.body,
            keys=tuple(message.keys),
            tags=message.tags,
            properties={**shared_properties, **document.get("properties", {})},
            queue_id=message.queue_id if message.HasField("queue_id") else None,
            uniq_key=message.uniq_key,
        )
        try:
            validate_message(candidate, limits)
        except InvalidArgument as error:
            raise InvalidArgument(f"line {number}: {error}") from None


def one_message(message: messages_pb2.Message) -> Columns:
    """A single message (``send -t``) as columns."""
    properties = dict(message.properties)
    return Columns(
        [message.topic], [message.body], [" ".join(message.keys)], [message.tags],
        [message.queue_id] if message.HasField("queue_id") else [], [message.uniq_key],
        [len(properties)] if properties else [], list(properties), list(properties.values()),
        frozenset({"topic", "body", "keys", "tags", "uniqKey", "properties"}),
    )  # fmt: skip


def batch_sizes(count: int, batch_size: int) -> list[int]:
    """How many messages each request holds."""
    whole, rest = divmod(count, batch_size)
    return [batch_size] * whole + ([rest] if rest else [])


def requests(columns: Columns, batch_size: int, shared_properties: Mapping[str, str]) -> Iterator[bytes]:
    """The serialized SendBatchRequests of ``batch_size`` messages each (the last may be
    fewer), asking for compact results. Built as they are sent: gRPC's thread takes each
    one while the writer stores the one before."""
    given = columns.given
    property_ends = list(accumulate(columns.property_counts, initial=0)) if columns.property_names else []
    for start in range(0, len(columns), batch_size):
        stop = start + batch_size
        topics = columns.topics[start:stop]
        request = writer_pb2.SendBatchRequest(compact_results=True, shared_properties=shared_properties)
        # Set field by field: a column left out is an empty one (every message's default).
        made = request.columns
        made.bodies.extend(columns.bodies[start:stop])
        made.topics.extend(topics[:1] if all_equal(topics) else topics)
        if columns.queue_ids:
            made.queue_ids.extend(columns.queue_ids[start:stop])
        if "keys" in given:
            made.keys.extend(columns.keys[start:stop])
        if "tags" in given:
            made.tags.extend(columns.tags[start:stop])
        if "uniqKey" in given:
            made.uniq_keys.extend(columns.uniq_keys[start:stop])
        if property_ends:
            first, last = property_ends[start], property_ends[min(stop, len(columns))]
            made.property_counts.extend(columns.property_counts[start:stop])
            made.property_names.extend(columns.property_names[first:last])
            made.property_values.extend(columns.property_values[first:last])
        yield request.SerializeToString()


# An ack line's fields, in this order (the ``--acks all`` output's interface).
ACK_FIELDS = ("offsetMsgId", "uniqKey", "topic", "queueId", "queueOffset", "commitLogOffset", "storeTimestamp")


def ack_lines(compact: writer_pb2.CompactResults, topics: Sequence[str]) -> bytes:
    """A batch's acks as JSON Lines, one object of :data:`ACK_FIELDS` a message, from its
    compact results (``topics``: its messages', in order). A message's offsetMsgId is
    the batch's prefix and its commit log offset in 16 uppercase hex digits."""
    offsets = compact.commitlog_offsets
    if not offsets:
        return b""
    ids = map((compact.offset_msg_id_prefix + "%016X").__mod__, offsets)
    stored = compact.store_timestamp_ms
    acks = orjson.dumps([
        {"offsetMsgId": msg_id, "uniqKey": uniq_key, "topic": topic, "queueId": queue_id,
         "queueOffset": queue_offset, "commitLogOffset": offset, "storeTimestamp": stored}
        for msg_id, uniq_key, topic, queue_id, queue_offset, offset
        in zip(ids, compact.uniq_keys, topics, compact.queue_ids, compact.queue_offsets, offsets)
    ])  # fmt: skip
    # One array written at once, then cut into lines between its objects: no value holds
    # "},{" (numbers, hex ids, uniq keys of ASCII letters and digits, topics of
    # [%|a-zA-Z0-9_-]), so each "},{" is a boundary.
    return acks[1:-1].replace(b"},{", b"}\n{") + b"\n"
