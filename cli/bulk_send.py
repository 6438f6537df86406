"""``rmqstore send --file``'s bulk path: a JSONL file read into columns, checked once by
the writer's rules, and turned into serialized SendBatchRequests without a protobuf object
per message; acks formatted from the writer's compact results.

The fast path parses the whole file with orjson in one call, screens every message with
the writer's own batch screen, and encodes the requests in the codecs' compiled loop. Any
line the fast path cannot vouch for sends the file down the slow path, which checks line
by line with :func:`message_from_json` and the writer's rules and so names the first bad
line exactly as it would alone.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import orjson

from rmqstore.cli.exits import INT32_MAX
from rmqstore.common.codec.speedups import _speedups
from rmqstore.common.errors import InvalidArgument
from rmqstore.v1 import messages_pb2, writer_pb2

KNOWN_FIELDS = frozenset({"topic", "body", "bodyBase64", "keys", "tags", "queueId", "properties", "uniqKey"})
NO_KEYS: list[str] = []


@dataclass
class Columns:
    """The file's messages as columns, the i-th entry of each the i-th message."""

    topics: list[str]
    queue_ids: list[int | None]
    bodies: list[bytes]
    keys: list[list[str]]
    tags: list[str]
    uniq_keys: list[str]
    properties: list[dict[str, str] | None]

    def __len__(self) -> int:
        return len(self.topics)


@contextlib.contextmanager
def _mapped(path: str) -> Iterator[bytes | mmap.mmap]:
    """The file's bytes, mapped rather than read when it can be (the compiled pass reads
    them once; a copy of a large file into fresh memory cost as much as that pass)."""
    try:
        handle = open(path, "rb")
    except IsADirectoryError:
        raise InvalidArgument(f"--file {path}: is a directory, not a JSONL file") from None
    except OSError as error:
        raise InvalidArgument(f"--file {path}: {error.strerror or error}") from None
    with handle:
        try:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):  # empty, or not a regular file (a pipe): read as before
            mapped = None
        if mapped is None:
            try:
                data = handle.read()
            except OSError as error:
                raise InvalidArgument(f"--file {path}: {error.strerror or error}") from None
            yield data
        else:
            with mapped:
                yield mapped


# The file is parsed, checked and encoded this many bytes (whole lines) at a time: the
# parsed objects of one chunk at most are alive at once, and what is kept until the sending
# is the encoded requests (about the file's size) and a reference to each message's topic.
CHUNK_BYTES = 8 << 20


@dataclass
class Prepared:
    """A file's messages, checked and encoded: the requests to send, and each message's
    topic (for its ack line)."""

    requests: list[bytes]
    topics: list[str]
    # How many messages each request holds.
    batch_sizes: list[int] = field(default_factory=list)


def prepare(path: str, limits: Any, batch_size: int, traceparent: str | None = None) -> Prepared:
    """Every message of ``path``, checked and encoded in batches of ``batch_size`` (the last
    batch of each chunk may be smaller); raises InvalidArgument naming the first bad line
    before any request exists. With ``traceparent`` (the send's span, when traced) each
    message without one of its own is stored with it (:func:`context_field`)."""
    context = context_field(traceparent)
    with _mapped(path) as mapped:
        compiled = _compiled(mapped, limits, batch_size, traceparent, context)
        if compiled is not None:
            return compiled
        data = mapped if isinstance(mapped, bytes) else mapped[:]
    prepared = Prepared([], [])
    distinct: dict[str, str] = {}
    # Parsing makes a dict per line and no reference cycles: the cyclic collector would only
    # walk the growing heap again and again (a third of the time, measured), so it is off
    # meanwhile, and what is kept is then frozen out of its later passes.
    collecting = gc.isenabled()
    gc.disable()
    try:
        start, first_line = 0, 1
        while start < len(data):
            end = data.find(b"\n", start + CHUNK_BYTES)
            end = len(data) if end < 0 else end + 1
            chunk = data[start:end]
            columns = _fast(chunk, limits)
            if columns is None:
                columns = _slow(path, chunk, limits, first_line, start)
            prepared.requests += encode_batches(columns, batch_size, context)
            whole, rest = divmod(len(columns), batch_size)
            prepared.batch_sizes += [batch_size] * whole + ([rest] if rest else [])
            prepared.topics += [distinct.setdefault(topic, topic) for topic in columns.topics]
            first_line += chunk.count(b"\n")
            start = end
    finally:
        if collecting:
            gc.enable()
    gc.freeze()
    return prepared


def context_field(traceparent: str | None) -> bytes:
    """A SendBatchRequest's ``shared_properties`` field carrying ``traceparent``,
    serialized (nothing without one): appended to a serialized request (it is a later
    field than the messages'), each message without a ``traceparent`` of its own is
    stored with this one. Sent once a request rather than in each message, it spares
    the stream about 70 bytes a message, and the writer reading them."""
    if traceparent is None:
        return b""
    from rmqstore.common.conventions import TRACEPARENT

    return writer_pb2.SendBatchRequest(shared_properties={TRACEPARENT: traceparent}).SerializeToString()


def _compiled(data: bytes | mmap.mmap, limits: Any, batch_size: int, traceparent: str | None, context: bytes) -> Prepared | None:
    """The whole file in one compiled pass from its bytes to the requests, when every line
    is plainly good (else None: the columns' paths below decide, and word any error). The
    writer's rules are the batch screen's: the compiled pass applies its per-message checks,
    and the few distinct topics (and the trace context's property) are checked here."""
    if _speedups is None:
        return None
    from rmqstore.common.conventions import TRACEPARENT
    from rmqstore.common.message_rules import (
        UNIQ_KEY_LENGTH_MAX,
        plain_properties_bytes,
        sendable_topic,
        tags_room,
    )

    stamp = {} if traceparent is None else {TRACEPARENT: traceparent}
    properties_bytes = plain_properties_bytes([stamp])
    if properties_bytes is None:
        return None
    # The messages have no properties of their own here: the trace context, stored with
    # each (and so counted against each one's room above), ends each request.
    found = _speedups.jsonl_send_batches(
        data, batch_size, limits.max_body_bytes, limits.max_keys, limits.max_key_length,
        tags_room(limits, properties_bytes), UNIQ_KEY_LENGTH_MAX, context,
    )  # fmt: skip
    if found is None:
        return None
    requests, topics, distinct = found
    if not all(map(sendable_topic, distinct)):
        return None
    whole, rest = divmod(len(topics), batch_size)
    gc.freeze()  # what is kept is out of the cyclic collector's later passes (as below)
    return Prepared(requests, topics, [batch_size] * whole + ([rest] if rest else []))


def _fast(data: bytes, limits: Any) -> Columns | None:
    """The columns when every line is plainly good, else None (the slow path decides)."""
    # One parse of all lines as one array. A line that is not one object (several values, a
    # value spanning lines) would shift the count or fail the object checks below; every
    # line starting with "{" and ending with "}", and the count, rule that out.
    text = data.rstrip()
    line_count = text.count(b"\n") + 1
    # Every newline between "}" and "{" (occurrences of "}\n{" cannot overlap, so the count
    # equals the newlines' only then): one pass for the pattern instead of one per side.
    if text[:1] == b"{" and text[-1:] == b"}" and text.count(b"}\n{") == line_count - 1:
        joined = b"[" + text.replace(b"\n", b",") + b"]"  # the usual file: no blank lines, no \r
    else:
        lines = [line for line in data.split(b"\n") if line.strip()]
        if not lines or not all(line.lstrip()[:1] == b"{" and line.rstrip()[-1:] == b"}" for line in lines):
            return None
        line_count, joined = len(lines), b"[" + b",".join(lines) + b"]"
    try:
        documents = orjson.loads(joined)
    except orjson.JSONDecodeError:
        return None
    if len(documents) != line_count:
        return None
    if _speedups is not None:
        # Every line's fields, type-checked, into columns in one compiled pass.
        extracted = _speedups.json_columns(documents)
        if extracted is None:
            return None
        topics, queue_ids, bodies, keys, tags, uniq_keys = extracted
        return _screened(topics, queue_ids, bodies, keys, tags, uniq_keys, limits)
    # Whole-column checks at C speed (map, set), not a Python step per message.
    if set(map(type, documents)) != {dict}:
        return None
    fields = set().union(*documents)
    if not fields <= KNOWN_FIELDS or "bodyBase64" in fields or "properties" in fields:
        return None
    topics = list(map(dict.get, documents, repeat("topic")))
    texts = list(map(dict.get, documents, repeat("body"), repeat("")))
    keys = list(map(dict.get, documents, repeat("keys"), repeat(NO_KEYS)))
    tags = list(map(dict.get, documents, repeat("tags"), repeat("")))
    queue_ids = list(map(dict.get, documents, repeat("queueId")))
    uniq_keys = list(map(dict.get, documents, repeat("uniqKey"), repeat("")))
    if not (
        set(map(type, topics)) == {str}
        and set(map(type, texts)) == {str}
        and set(map(type, keys)) == {list}
        and set(map(type, tags)) == {str}
        and set(map(type, uniq_keys)) == {str}
        and set(map(type, queue_ids)) <= {int, type(None)}
        and max(filter(None, queue_ids), default=0) <= INT32_MAX  # (None and 0 skipped; negatives: the screen below)
    ):
        return None
    return _screened(topics, queue_ids, list(map(str.encode, texts)), keys, tags, uniq_keys, limits)


def _screened(
    topics: list[str], queue_ids: list[int | None], bodies: list[bytes], keys: list[list[str]], tags: list[str],
    uniq_keys: list[str], limits: Any,
) -> Columns | None:  # fmt: skip
    """The columns if the writer's batch screen passes every message, else None."""
    from rmqstore.common.message_rules import MessageBatch, plainly_valid

    count = len(topics)
    batch = MessageBatch(topics, bodies, keys, tags, [{}] * count, queue_ids, uniq_keys, [0] * count, [0] * count, [None] * count)  # type: ignore[arg-type]
    if not plainly_valid(batch, limits):
        return None
    return Columns(topics, queue_ids, bodies, keys, tags, uniq_keys, [None] * count)


def _slow(path: str, data: bytes, limits: Any, first_line: int = 1, first_byte: int = 0) -> Columns:
    """Line by line, every rule, every error naming its line (``data`` is the file's part
    from line ``first_line``, at byte ``first_byte``)."""
    from rmqstore.cli.writer_tools import check_message, message_from_json

    columns = Columns([], [], [], [], [], [], [])
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=first_line):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as error:
            before = sum(len(previous) + 1 for previous in lines[: number - first_line])
            at = first_byte + before + error.start
            raise InvalidArgument(f"--file {path}: line {number} is not UTF-8 ({error.reason} at byte {at})") from None
        try:
            document = orjson.loads(text)
        except orjson.JSONDecodeError as error:
            raise InvalidArgument(f"line {number}: not JSON: {error}") from None
        message = message_from_json(number, document)
        check_message(message, limits, f"line {number}")
        columns.topics.append(message.topic)
        columns.queue_ids.append(message.queue_id if message.HasField("queue_id") else None)
        columns.bodies.append(message.body)
        columns.keys.append(list(message.keys))
        columns.tags.append(message.tags)
        columns.uniq_keys.append(message.uniq_key)
        columns.properties.append(dict(message.properties) or None)
    return columns


def encode_batches(columns: Columns, batch_size: int, context: bytes = b"") -> list[bytes]:
    """Serialized SendBatchRequests of ``batch_size`` messages, asking for compact results,
    each ending with ``context`` (:func:`context_field`)."""
    if _speedups is not None:
        encoded: list[bytes] = _speedups.encode_send_batches(
            columns.topics, columns.queue_ids, columns.bodies, columns.keys, columns.tags,
            columns.uniq_keys, columns.properties, batch_size,
        )  # fmt: skip
        return [request + context for request in encoded] if context else encoded
    requests = []
    for start in range(0, len(columns), batch_size):
        messages = []
        for i in range(start, min(start + batch_size, len(columns))):
            message = messages_pb2.Message(
                topic=columns.topics[i], body=columns.bodies[i], keys=columns.keys[i], tags=columns.tags[i],
                uniq_key=columns.uniq_keys[i], properties=columns.properties[i] or {},
            )  # fmt: skip
            if columns.queue_ids[i] is not None:
                message.queue_id = columns.queue_ids[i]  # type: ignore[assignment]
            messages.append(message)
        requests.append(writer_pb2.SendBatchRequest(messages=messages, compact_results=True).SerializeToString() + context)
    return requests


# An ack line: the JSON json.dumps writes for these fields, in this order. Topics and uniq
# keys need no escaping: the writer accepted them, so they are [%|a-zA-Z0-9_-] and ASCII
# letters and digits.
ACK_LINE = (
    '{{"offsetMsgId": "{}{:016X}", "uniqKey": "{}", "topic": "{}", "queueId": {}, "queueOffset": {}, '
    '"commitLogOffset": {}, "storeTimestamp": {}}}\n'
)


def ack_lines(response: writer_pb2.SendBatchResponse, topics: Sequence[str]) -> Iterator[str]:
    """The ack lines of a batch answered with compact results; ``topics`` are its messages'."""
    compact = response.compact
    prefix, stored = compact.offset_msg_id_prefix, compact.store_timestamp_ms
    line = ACK_LINE.format
    for topic, uniq_key, queue_id, queue_offset, offset in zip(
        topics, compact.uniq_keys, compact.queue_ids, compact.queue_offsets, compact.commitlog_offsets
    ):
        yield line(prefix, offset, uniq_key, topic, queue_id, queue_offset, offset, stored)


def ack_text(response: writer_pb2.SendBatchResponse, topics: Sequence[str]) -> str:
    """All the ack lines of a batch answered with compact results, as one string: built in
    the compiled loop (a str.format per line was a fifth of the client's time with every ack
    printed), in Python when that loop declines a text it would not escape as json.dumps does."""
    if _speedups is not None:
        compact = response.compact
        text: str | None = _speedups.ack_lines(
            compact.offset_msg_id_prefix, topics, compact.uniq_keys, compact.queue_ids, compact.queue_offsets,
            compact.commitlog_offsets, compact.store_timestamp_ms,
        )  # fmt: skip
        if text is not None:
            return text
    return "".join(ack_lines(response, topics))


def acked(response: writer_pb2.SendBatchResponse) -> int:
    return len(response.compact.commitlog_offsets) or len(response.results)
