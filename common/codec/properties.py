"""Message properties: ``name 0x01 value`` pairs joined by 0x02 (docs/format.md §3.6)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from rmqstore.common.codec.javahash import java_hashmap_order
from rmqstore.common.codec.speedups import _speedups

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "

# Well-known names (common/message/MessageConst.java, 4.9.8).
KEYS = "KEYS"
TAGS = "TAGS"
WAIT = "WAIT"
DELAY = "DELAY"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
UNIQ_KEY = "UNIQ_KEY"
CLUSTER = "CLUSTER"
TRAN_MSG = "TRAN_MSG"
# Transactions (MessageConst; TransactionalMessageUtil.TRANSACTION_ID): the producer group
# a half message's check goes to, the UNIQ_KEY the broker copies as its transaction id, how
# often it was checked, and the producer's own first-check delay.
PGROUP = "PGROUP"
TRANSACTION_ID = "__transactionId__"
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
# RocketMQ 5's timer (MessageConst, 5.x): a producer's delivery time, as a time or a delay;
# the due time the broker keeps (TIMER_OUT_MS); when the timer took and released it; and a
# recall's key of the message it cancels (TimerMessageStore.buildDeleteKey).
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Serialize in the mapping's order, as messageProperties2String does for its map.

    Each pair is ``name 0x01 value 0x02`` with the final 0x02 dropped. Callers that want the
    broker's exact bytes pass the names in Java HashMap order (:func:`broker_order`).
    """
    if not properties:
        return b""
    text = PROPERTY_SEPARATOR.join(
        f"{name}{NAME_VALUE_SEPARATOR}{value}" for name, value in properties.items()
    )
    return text.encode("utf-8")


def decode_properties(data: bytes | bytearray | memoryview) -> dict[str, str]:
    """string2messageProperties, exactly: empty names or values are dropped, a later
    duplicate wins, and a value may itself contain 0x01."""
    result: dict[str, str] = {}
    if not data:
        return result
    for segment in str(data, "utf-8", "replace").split(PROPERTY_SEPARATOR):
        # partition cuts at the first 0x01; a segment without one has an empty value.
        name, _, value = segment.partition(NAME_VALUE_SEPARATOR)
        if name and value:
            result[name] = value
    return result


def broker_order(properties: Mapping[str, str]) -> dict[str, str]:
    """The same properties in the order a Java HashMap iterates them (the broker's order)."""
    return {name: properties[name] for name in java_hashmap_order(properties)}


@functools.lru_cache(maxsize=1024)
def _broker_template(names: tuple[str, ...]) -> tuple[str, operator.itemgetter[Any]]:
    """For properties with these names in this insertion order: a format string that
    writes them in broker order, and the getter that puts their values in that order."""
    order = java_hashmap_order(names)
    escaped = (name.replace("{", "{{").replace("}", "}}") for name in order)
    template = PROPERTY_SEPARATOR.join(f"{name}{NAME_VALUE_SEPARATOR}{{}}" for name in escaped)
    positions = [names.index(name) for name in order]
    # itemgetter of one position returns a bare value, of two a tuple: repeat the single
    # position so the result is always a tuple (format uses the first).
    return template, operator.itemgetter(*[*positions, *positions[: 2 - len(positions)]])


def encode_message_properties(user: Mapping[str, str], keys: Sequence[str], tags: str, uniq_key: str) -> bytes:
    """The properties of a message as the broker writes them: the producer's own
    properties, then KEYS (space-joined), TAGS and UNIQ_KEY, in Java HashMap order.
    The same bytes as ``encode_properties(broker_order({...}))``, with the order worked
    out once per set of names (the writer's hot path)."""
    names: tuple[str, ...] = ()
    values: tuple[str, ...] = ()
    if user:
        names, values = tuple(user), tuple(user.values())
    if keys:
        names += (KEYS,)
        values += (KEY_SEPARATOR.join(keys),)
    if tags:
        names += (TAGS,)
        values += (tags,)
    template, in_order = _broker_template((*names, UNIQ_KEY))
    return template.format(*in_order((*values, uniq_key))).encode("utf-8")


@functools.lru_cache(maxsize=1024)
def _shared_pieces(shared: tuple[tuple[str, str], ...]) -> tuple[tuple[int, int, int], tuple[bytes, bytes, bytes, bytes]]:
    """For messages that all have the properties ``shared`` (name, value pairs) besides
    their own KEYS, TAGS and UNIQ_KEY: the order in which the broker writes those three
    (positions in KEYS, TAGS, UNIQ_KEY) and the bytes before, between and after them
    (every other name and value, and the separators), for the compiled fill."""
    values = dict(shared)
    own = (KEYS, TAGS, UNIQ_KEY)
    order: list[int] = []
    pieces = [""]
    for number, name in enumerate(java_hashmap_order((*values, *own))):
        pieces[-1] += f"{PROPERTY_SEPARATOR if number else ''}{name}{NAME_VALUE_SEPARATOR}"
        if name in own:
            order.append(own.index(name))
            pieces.append("")
        else:
            pieces[-1] += values[name]
    encoded = [piece.encode("utf-8") for piece in pieces]
    return (order[0], order[1], order[2]), (encoded[0], encoded[1], encoded[2], encoded[3])


# KEYS, TAGS and UNIQ_KEY in broker order, filled by position ({0} KEYS, {1} TAGS,
# {2} UNIQ_KEY): the properties of nearly every message a producer sends.
_template, _in_order = _broker_template((KEYS, TAGS, UNIQ_KEY))
_KEYS_TAGS_UNIQ_KEY = _template.format(*_in_order(("{0}", "{1}", "{2}")))
# The same order as positions in (KEYS, TAGS, UNIQ_KEY), for the compiled path.
_COMMON_ORDER = tuple(_in_order((0, 1, 2)))[:3]
del _template, _in_order


def encode_messages_properties(
    users: Sequence[Mapping[str, str]], keys: Sequence[Sequence[str]], tags: Sequence[str], uniq_keys: Sequence[str]
) -> list[bytes]:
    """:func:`encode_message_properties` of many messages; messages with KEYS and TAGS
    and no properties of their own (the usual shape) share one template."""
    if all(keys) and all(tags) and not any(users):
        if _speedups is not None and isinstance(keys, list) and isinstance(tags, list) and isinstance(uniq_keys, list):
            encoded: list[bytes] = _speedups.encode_common_properties(_COMMON_ORDER, keys, tags, uniq_keys)
            return encoded
        fill = _KEYS_TAGS_UNIQ_KEY.format
        join = KEY_SEPARATOR.join
        return [fill(join(k), t, u).encode("utf-8") for k, t, u in zip(keys, tags, uniq_keys)]
    if users and all(keys) and all(tags) and all(user is users[0] for user in users):
        # One mapping shared by every message (a traced producer's trace context): its
        # names and the broker order worked out once, each message filling its own
        # KEYS, TAGS and UNIQ_KEY.
        shared = users[0]
        if (
            _speedups is not None and isinstance(keys, list) and isinstance(tags, list) and isinstance(uniq_keys, list)
            and KEYS not in shared and TAGS not in shared and UNIQ_KEY not in shared
        ):  # fmt: skip
            order, pieces = _shared_pieces(tuple(shared.items()))
            filled: list[bytes] = _speedups.encode_common_properties(order, keys, tags, uniq_keys, pieces)
            return filled
        names = (*shared, KEYS, TAGS, UNIQ_KEY) if shared else (KEYS, TAGS, UNIQ_KEY)
        values = tuple(shared.values())
        template, in_order = _broker_template(names)
        fill, join = template.format, KEY_SEPARATOR.join
        return [fill(*in_order((*values, join(k), t, u))).encode("utf-8") for k, t, u in zip(keys, tags, uniq_keys)]
    if users and all(keys) and all(tags):
        orders = set(map(tuple, users))
        if len(orders) == 1:
            # Every message names the same properties in the same order, each with values of
            # its own (an exporter's messages): one template, filled a message at a time.
            (own,) = orders
            if KEYS not in own and TAGS not in own and UNIQ_KEY not in own:
                template, in_order = _broker_template((*own, KEYS, TAGS, UNIQ_KEY))
                fill, join = template.format, KEY_SEPARATOR.join
                return [
                    fill(*in_order((*user.values(), join(k), t, u))).encode("utf-8")
                    for user, k, t, u in zip(users, keys, tags, uniq_keys)
                ]
    return [encode_message_properties(*fields) for fields in zip(users, keys, tags, uniq_keys)]


def split_keys(keys: str | None) -> list[str]:
    """The non-empty space-separated parts of a KEYS value, repeats kept (docs/format.md §7.4)."""
    if not keys:
        return []
    return [part for part in keys.split(KEY_SEPARATOR) if part]
