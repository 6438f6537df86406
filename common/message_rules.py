"""What a producer may send: the rules every message is checked by before anything is
written, shared by the writer (which enforces them) and the client (which checks a whole
file by them before sending any of it, naming the line of a bad message). Every rule
raises InvalidArgument; the screens decide in a few whole-column passes whether every
message passes, and leave the wording of a problem to :func:`validate_message`."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.record import PROPERTIES_LENGTH_MAX
from rmqstore.common.codec.speedups import _speedups
from rmqstore.common.codec.topic import NOT_ALLOWED_SEND_TOPICS, topic_problem
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.sequences import all_equal

# Properties the writer sets itself, or whose meaning the store would have to act on
# (re-delivery) — rmqstore does not, so it refuses them.
RESERVED_PROPERTIES = frozenset(
    {
        props.KEYS,
        props.TAGS,
        props.UNIQ_KEY,
        props.REAL_TOPIC,
        props.REAL_QID,
        props.CLUSTER,
        props.TRANSACTION_ID,
        props.TRANSACTION_CHECK_TIMES,
        "MIN_OFFSET",
        "MAX_OFFSET",
        "__STARTDELIVERTIME",
        props.TIMER_OUT_MS,
        props.TIMER_ENQUEUE_MS,
        props.TIMER_DEQUEUE_MS,
        props.TIMER_DEL_UNIQKEY,
        "INNER_NUM",
        "INNER_BASE",
    }
)
# Properties that schedule a message (writer.schedule): an Apache delay level, or RocketMQ
# 5's delivery time (a time, or a delay from now). Each value is a whole number of at most
# 18 digits; what it means (a level past the last, a time beyond --timer-max-delay) is the
# writer's to judge, as it knows the time and its settings.
SCHEDULING_PROPERTIES = frozenset({props.DELAY, props.TIMER_DELIVER_MS, props.TIMER_DELAY_SEC, props.TIMER_DELAY_MS})
SCHEDULING_DIGITS_MAX = 18
# A producer's transactional half message (TRAN_MSG "true", as Java's Boolean.parseBoolean
# reads it, with its producer group in PGROUP): the writer keeps it in
# RMQ_SYS_TRANS_HALF_TOPIC until EndTransaction or a check resolves it (writer.transactions).
TRANSACTION_PROPERTY = props.TRAN_MSG


def is_half_message(properties: Mapping[str, str]) -> bool:
    value = properties.get(props.TRAN_MSG)
    return value is not None and value.lower() == "true"
_SEPARATORS = ("\x01", "\x02")
UNIQ_KEY_LENGTH_MAX = 128


EMPTY_PROPERTIES: Mapping[str, str] = MappingProxyType({})


class MessageInput(NamedTuple):
    """A message as a producer hands it to the writer (the proto's Message, unpacked).
    A named tuple: the writer's batch path makes and reads millions of them."""

    topic: str
    body: bytes = b""
    keys: Sequence[str] = ()
    tags: str = ""
    properties: Mapping[str, str] = EMPTY_PROPERTIES
    queue_id: int | None = None
    uniq_key: str = ""
    flag: int = 0
    born_timestamp_ms: int = 0
    born_host: SocketAddress | None = None


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    max_keys: int
    max_key_length: int
    max_batch_messages: int


# A writer's limits by default (WriterConfig's defaults): what a client checks its messages
# against, as it cannot know a node's settings.
DEFAULT_LIMITS = Limits(
    max_body_bytes=4 * 1024 * 1024,  # maxMessageSize
    max_keys=32,
    max_key_length=255,
    max_batch_messages=10_000,
)


def _no_separators(text: str, what: str) -> None:
    if any(sep in text for sep in _SEPARATORS):
        raise InvalidArgument(f"{what} contains a 0x01 or 0x02 character, which would corrupt the properties")


def validate_message(message: MessageInput, limits: Limits, position: int = 0) -> dict[str, str]:
    """Check one message; return its properties as they will be stored (without
    UNIQ_KEY, which the writer adds). ``position`` names the message in a batch."""
    where = f"message {position}: " if position else ""
    problem = topic_problem(message.topic)
    if problem is not None:
        raise InvalidArgument(where + problem)
    if message.topic in NOT_ALLOWED_SEND_TOPICS:
        raise InvalidArgument(f"{where}topic {message.topic} is a system topic producers may not send to")
    if len(message.body) > limits.max_body_bytes:
        raise InvalidArgument(f"{where}body is {len(message.body)} bytes; at most {limits.max_body_bytes} allowed")
    if len(message.keys) > limits.max_keys:
        raise InvalidArgument(f"{where}{len(message.keys)} keys; at most {limits.max_keys} allowed")
    for key in message.keys:
        if not key:
            raise InvalidArgument(f"{where}a key is empty")
        if len(key) > limits.max_key_length:
            raise InvalidArgument(f"{where}key {key[:40]!r}… is {len(key)} characters; at most {limits.max_key_length}")
        if " " in key:
            raise InvalidArgument(f"{where}key {key!r} contains a space; KEYS are space-separated")
        _no_separators(key, f"{where}key {key!r}")
    if message.tags:
        _no_separators(message.tags, f"{where}tags")
    if message.queue_id is not None and message.queue_id < 0:
        raise InvalidArgument(f"{where}queue id {message.queue_id} is negative")
    if message.uniq_key:
        if len(message.uniq_key) > UNIQ_KEY_LENGTH_MAX or not message.uniq_key.isascii() or not message.uniq_key.isalnum():
            raise InvalidArgument(f"{where}uniq key must be 1-{UNIQ_KEY_LENGTH_MAX} ASCII letters and digits")
    stored: dict[str, str] = {}
    for name, value in message.properties.items():
        if not name:
            raise InvalidArgument(f"{where}a property name is empty")
        if name in RESERVED_PROPERTIES:
            raise InvalidArgument(f"{where}property {name} is reserved; use the message's own fields")
        if not value:
            raise InvalidArgument(f"{where}property {name} has an empty value, which RocketMQ's format cannot keep")
        if name in SCHEDULING_PROPERTIES and not _whole_number(value):
            raise InvalidArgument(
                f"{where}property {name} is {value[:40]!r}; it must be a whole number of 1-{SCHEDULING_DIGITS_MAX} digits"
            )
        _no_separators(name, f"{where}property name {name!r}")
        _no_separators(value, f"{where}property {name}")
        stored[name] = value
    if is_half_message(stored):
        if not stored.get(props.PGROUP):
            raise InvalidArgument(f"{where}a transaction's half message (TRAN_MSG=true) needs its producer group in PGROUP")
        if not SCHEDULING_PROPERTIES.isdisjoint(stored):
            raise InvalidArgument(f"{where}a transaction's half message cannot also be delayed or timed")
    if message.keys:
        stored[props.KEYS] = props.KEY_SEPARATOR.join(message.keys)
    if message.tags:
        stored[props.TAGS] = message.tags
    size = len(props.encode_properties(stored)) + len(props.UNIQ_KEY) + 2 + UNIQ_KEY_LENGTH_MAX
    if size > PROPERTIES_LENGTH_MAX:
        raise InvalidArgument(f"{where}properties take {size} bytes; at most {PROPERTIES_LENGTH_MAX} fit in a record")
    return stored


@functools.lru_cache(maxsize=4096)
def sendable_topic(topic: str) -> bool:
    return topic_problem(topic) is None and topic not in NOT_ALLOWED_SEND_TOPICS


class MessageBatch(NamedTuple):
    """Messages as columns, the i-th entry of each list belonging to the i-th message:
    the shape the writer's batch path works in (no object per message). The columns are
    in MessageInput's field order, which :meth:`of` and :meth:`message` rely on."""

    topics: list[str]
    bodies: list[bytes]
    keys: list[Sequence[str]]
    tags: list[str]
    properties: list[Mapping[str, str]]
    queue_ids: list[int | None]
    uniq_keys: list[str]
    flags: list[int]
    born_timestamps_ms: list[int]
    born_hosts: list[SocketAddress | None]

    @classmethod
    def of(cls, messages: Sequence[MessageInput]) -> MessageBatch:
        return cls(*(list(column) for column in zip(*messages))) if messages else cls(*([] for _ in MessageInput._fields))

    @classmethod
    def concat(cls, batches: Sequence[MessageBatch]) -> MessageBatch:
        """Several batches as one, in order."""
        return cls(*map(list, map(itertools.chain.from_iterable, zip(*batches))))

    @property
    def message_count(self) -> int:
        return len(self.topics)

    def message(self, position: int) -> MessageInput:
        return MessageInput(*(column[position] for column in self))  # type: ignore[arg-type]  # column-wise

    def slice(self, start: int, stop: int) -> MessageBatch:
        """Messages ``start`` to ``stop`` as a batch of their own."""
        return MessageBatch(*(column[start:stop] for column in self))  # type: ignore[arg-type]  # column-wise


def plainly_valid(batch: MessageBatch, limits: Limits) -> bool:
    """A whole-batch screen in a few C-speed passes (one compiled pass where the
    extension is built): True means every message passes :func:`validate_message`;
    False means some message may not (it is then checked one by one, which finds the
    first problem and words it)."""
    properties_bytes = plain_properties_bytes(batch.properties) if any(batch.properties) else 0
    if properties_bytes is None:
        return False
    return plainly_valid_beside(batch, limits, properties_bytes)


def plainly_valid_beside(batch: MessageBatch, limits: Limits, properties_bytes: int) -> bool:
    """:func:`plainly_valid` for messages whose properties are screened already (their
    column is not read): each passes the property rules and encodes to at most
    ``properties_bytes`` (:func:`plain_property_columns`)."""
    if not all(map(sendable_topic, set(batch.topics))):
        return False
    room = tags_room(limits, properties_bytes)
    if _speedups is not None:
        return bool(
            _speedups.screen_batch(
                batch.bodies, batch.keys, batch.tags, batch.uniq_keys, batch.queue_ids,
                limits.max_body_bytes, limits.max_keys, limits.max_key_length, room,
            )  # fmt: skip
        )
    if max(map(len, batch.bodies)) > limits.max_body_bytes:
        return False
    given = batch.queue_ids if None not in batch.queue_ids else [q for q in batch.queue_ids if q is not None]
    if given and min(given) < 0:  # type: ignore[type-var,operator]
        return False
    if max(map(len, batch.keys)) > limits.max_keys:
        return False
    keys = list(itertools.chain.from_iterable(batch.keys))
    text = "".join(keys) + "".join(batch.tags)
    if not text.isascii() or "\x01" in text or "\x02" in text or " " in "".join(keys):
        return False
    if keys and ("" in keys or max(map(len, keys)) > limits.max_key_length):
        return False
    if max(map(len, batch.tags)) > room:
        return False
    uniq_keys = "".join(batch.uniq_keys)
    # bytes.isalnum is str.isalnum on ASCII text, by table rather than Unicode lookups.
    if uniq_keys and not (
        uniq_keys.isascii()
        and uniq_keys.encode("ascii").isalnum()
        and max(map(len, batch.uniq_keys)) <= UNIQ_KEY_LENGTH_MAX
    ):
        return False
    return True


def tags_room(limits: Limits, properties_bytes: int) -> int:
    """The longest TAGS the batch screen passes: KEYS, TAGS and a UNIQ_KEY at their longest,
    with their separators, still fit beside user properties of ``properties_bytes``."""
    return (
        PROPERTIES_LENGTH_MAX - 64 - UNIQ_KEY_LENGTH_MAX - limits.max_keys * (limits.max_key_length + 1) - properties_bytes
    )


# More distinct mappings than this in a batch are screened as columns
# (:func:`plain_property_columns`), not one by one.
DISTINCT_SCREENED_ALONE_MAX = 16


def plain_properties_bytes(properties: Sequence[Mapping[str, str]]) -> int | None:
    """The encoded size of the largest user properties of a batch (at least that size,
    where many messages bring properties of their own) when every message's pass
    :func:`validate_message`'s property rules, else None. Each distinct mapping is
    checked once: a producer that stamps every message with the same trace context (as
    rmqstore's client does) hands over one shared mapping, and a batch of them is screened
    as cheaply as one without properties."""
    largest = 0
    if all_equal(properties):
        # One mapping for every message (a request's shared properties), or equal ones:
        # counted in C (by identity first), screened once.
        distinct: Iterable[Mapping[str, str]] = (properties[0],) if properties[0] else ()
    else:
        distinct = {id(each): each for each in properties if each}.values()
        if len(distinct) > DISTINCT_SCREENED_ALONE_MAX:  # exported messages, each with its own
            return plain_property_columns(
                list(map(len, distinct)),
                list(itertools.chain.from_iterable(distinct)),
                list(itertools.chain.from_iterable(map(operator.methodcaller("values"), distinct))),
            )
    for mapping in distinct:
        items = tuple(mapping.items())
        size = _screened.get(items, -1)
        if size == -1:
            size = _screen_properties(items)
            if len(_screened) >= _SCREENED_KEPT:
                _screened.clear()
            _screened[items] = size
        if size is None:
            return None
        largest = max(largest, size)
    return largest


def plain_property_columns(counts: Sequence[int], names: Sequence[str], values: Sequence[str]) -> int | None:
    """The properties of many messages as columns (message i has ``counts[i]`` pairs,
    taken in order from ``names`` and ``values``, its names distinct): at least the
    encoded size of the largest message's when every pair passes
    :func:`validate_message`'s property rules, else None. Whole-column passes, for
    messages that each bring properties of their own (a file of exported messages),
    where screening each mapping on its own would cost a Python step a message."""
    if not names:
        return 0
    if "" in names or "" in values or not RESERVED_PROPERTIES.isdisjoint(names):
        return None
    if not SCHEDULING_PROPERTIES.isdisjoint(names) or TRANSACTION_PROPERTY in names:
        return None  # their values are checked one message at a time
    name_text, value_text = "".join(names), "".join(values)
    if not _plain_text(name_text) or not _plain_text(value_text):
        return None
    # A pair is encoded as name 0x01 value 0x02: its UTF-8 lengths and two bytes (ASCII
    # text's length is its UTF-8 length).
    name_bytes = map(len, names if name_text.isascii() else map(str.encode, names))
    value_bytes = map(len, values if value_text.isascii() else map(str.encode, values))
    ends: list[int] = list(itertools.accumulate(map(operator.add, name_bytes, value_bytes), initial=0))
    bounds = list(itertools.accumulate(counts, initial=0))
    largest: int = max(map(operator.sub, map(ends.__getitem__, bounds[1:]), map(ends.__getitem__, bounds)))
    return largest + 2 * max(counts)


# Properties screened lately, by their items: their encoded size, or None where some
# property breaks a rule. A producer's requests each bring their own mapping with the same
# trace context in it (``SendBatchRequest.shared_properties``): screened once.
_SCREENED_KEPT = 256
_screened: dict[tuple[tuple[str, str], ...], int | None] = {}


def _screen_properties(items: tuple[tuple[str, str], ...]) -> int | None:
    for name, value in items:
        if not name or not value or name in RESERVED_PROPERTIES or not _plain_text(name) or not _plain_text(value):
            return None
        if name in SCHEDULING_PROPERTIES and not _whole_number(value):
            return None
        if name == TRANSACTION_PROPERTY and not _plain_half_message(dict(items)):
            return None
    return len(props.encode_properties(dict(items)))


def _plain_half_message(properties: Mapping[str, str]) -> bool:
    """A half message :func:`validate_message` passes (or TRAN_MSG not "true"): its group
    given, no schedule."""
    return not is_half_message(properties) or (
        bool(properties.get(props.PGROUP)) and SCHEDULING_PROPERTIES.isdisjoint(properties)
    )


def _whole_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= SCHEDULING_DIGITS_MAX


def _plain_text(text: str) -> bool:
    return "\x01" not in text and "\x02" not in text
