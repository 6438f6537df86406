"""Delayed and timed messages as Apache's broker stores and releases them: pure functions
over a batch's columns and over records, no I/O, no clock (docs/format.md §16).

* A **delay level** (``DELAY`` 1..N, Apache 4.9's CommitLog.putMessage): stored in
  SCHEDULE_TOPIC_XXXX, queue level − 1, with REAL_TOPIC and REAL_QID added (a level past
  the last is the last, DELAY rewritten); its unit's tagsCode is its deliver time. Released
  by ScheduleMessageService.messageTimeup: :func:`level_copy`.
* A **delivery time** (``TIMER_DELIVER_MS``, or ``TIMER_DELAY_SEC``/``TIMER_DELAY_MS`` from
  now; RocketMQ 5's HookUtils.transformTimerMessage): a time still ahead is stored in
  rmq_sys_wheel_timer, queue 0, with TIMER_OUT_MS (its due time), REAL_TOPIC and REAL_QID;
  its unit's tagsCode is the due time. Released by TimerMessageStore.convert:
  :func:`timer_copy`. A time already come is an ordinary message (Apache's too).
  Apache rounds the due time down to its timer's precision (1 s by default); rmqstore
  keeps the millisecond given.
* A **recall** (RocketMQ 5.3): a marker in rmq_sys_wheel_timer with TIMER_DEL_UNIQKEY
  ``REAL_TOPIC+UNIQ_KEY`` (TimerMessageStore.buildDeleteKey), due when its message is:
  :func:`recall_marker`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.consumequeue import SCHEDULE_TOPIC, TIMER_TOPIC, deliver_timestamp
from rmqstore.common.codec.record import Record
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.message_rules import SCHEDULING_PROPERTIES, UNIQ_KEY_LENGTH_MAX, MessageInput
from rmqstore.common.sequences import all_equal

# Apache's timerMaxDelaySec: 3 days.
DEFAULT_TIMER_MAX_DELAY_MS = 3 * 24 * 3600 * 1000
TIMER_QUEUE_ID = 0
# RocketMQ 5.3's recall handle: "v1 topic brokerName timestamp messageId", URL-safe Base64.
RECALL_HANDLE_VERSION = "v1"


@dataclass(frozen=True)
class Scheduling:
    """A writer's settings for scheduled messages."""

    delay_levels_ms: Mapping[int, int]  # level → delay (messageDelayLevel)
    timer_max_delay_ms: int = DEFAULT_TIMER_MAX_DELAY_MS

    @property
    def max_level(self) -> int:
        return max(self.delay_levels_ms, default=0)


@dataclass
class Rerouted:
    """A batch's columns once its scheduled messages are moved to their system topics:
    ``tags_codes`` gives each moved row's tagsCode (deliver or due time)."""

    topics: list[str]
    queue_ids: list[int]
    properties: list[Mapping[str, str]]
    tags_codes: dict[int, int]


def scheduled_rows(properties: Sequence[Mapping[str, str]]) -> list[int]:
    """The rows whose properties schedule them: one look at a run of one shared mapping
    (a traced producer's), a step a message only where messages bring their own."""
    if not any(properties):
        return []
    if all_equal(properties):
        return list(range(len(properties))) if not SCHEDULING_PROPERTIES.isdisjoint(properties[0]) else []
    return [row for row, mapping in enumerate(properties) if mapping and not SCHEDULING_PROPERTIES.isdisjoint(mapping)]


def _due_ms(properties: Mapping[str, str], now_ms: int) -> int | None:
    """HookUtils.transformTimerMessage's deliver time: a delay in seconds, else one in
    milliseconds, else the time given; None for a message without one."""
    if props.TIMER_DELAY_SEC in properties:
        return now_ms + int(properties[props.TIMER_DELAY_SEC]) * 1000
    if props.TIMER_DELAY_MS in properties:
        return now_ms + int(properties[props.TIMER_DELAY_MS])
    if props.TIMER_DELIVER_MS in properties:
        return int(properties[props.TIMER_DELIVER_MS])
    return None


def reroute(
    topics: list[str],
    queue_ids: list[int],
    properties: list[Mapping[str, str]],
    rows: list[int],
    store_timestamp_ms: int,
    scheduling: Scheduling,
) -> Rerouted:
    """Move the scheduled ``rows`` (validated: their values are whole numbers) to
    SCHEDULE_TOPIC_XXXX or rmq_sys_wheel_timer. Raises InvalidArgument for a delivery
    time beyond the timer's maximum delay, before anything is written."""
    topics, queue_ids, properties = topics[:], queue_ids[:], properties[:]
    codes: dict[int, int] = {}
    numbered = len(topics) > 1
    for row in rows:
        mapping = dict(properties[row])
        level = int(mapping.get(props.DELAY, "0"))
        if level > 0:
            # checkIfTimerMessage: a delay level wins, its timer properties are dropped.
            for name in (props.TIMER_DELIVER_MS, props.TIMER_DELAY_SEC, props.TIMER_DELAY_MS):
                mapping.pop(name, None)
            level = min(level, scheduling.max_level)
            mapping[props.DELAY] = str(level)
            mapping[props.REAL_TOPIC] = topics[row]
            mapping[props.REAL_QID] = str(queue_ids[row])
            topics[row], queue_ids[row] = SCHEDULE_TOPIC, level - 1
            codes[row] = deliver_timestamp(level, store_timestamp_ms, dict(scheduling.delay_levels_ms))
            properties[row] = mapping
            continue
        due = _due_ms(mapping, store_timestamp_ms)
        if due is not None and due <= store_timestamp_ms and props.TIMER_DEL_UNIQKEY in mapping:
            raise InvalidArgument("recall failed, timestamp invalid")  # its message is due already
        if due is None or due <= store_timestamp_ms:
            continue  # a time already come: an ordinary message, its properties kept
        if due - store_timestamp_ms > scheduling.timer_max_delay_ms:
            where = f"message {row + 1}: " if numbered else ""
            raise InvalidArgument(
                f"{where}the delivery time is {due - store_timestamp_ms} ms ahead; "
                f"at most {scheduling.timer_max_delay_ms} ms (--timer-max-delay)"
            )
        mapping[props.TIMER_OUT_MS] = str(due)
        mapping[props.REAL_TOPIC] = topics[row]
        mapping[props.REAL_QID] = str(queue_ids[row])
        topics[row], queue_ids[row] = TIMER_TOPIC, TIMER_QUEUE_ID
        codes[row] = due
        properties[row] = mapping
    return Rerouted(topics, queue_ids, properties, codes)


def record_copy(record: Record, topic: str, queue_id: int, properties: Mapping[str, str]) -> MessageInput:
    """A copy of ``record`` in ``topic``/``queue_id`` with ``properties`` (all of them, in
    the record's order: Writer.append_released stores them so), the body, flag, born
    time and born host kept (MessageExtBrokerInner as messageTimeup fills it)."""
    return MessageInput(
        topic=topic,
        body=record.body,
        keys=props.split_keys(properties.get(props.KEYS)),
        tags=properties.get(props.TAGS) or "",
        properties=properties,
        queue_id=queue_id,
        uniq_key=properties.get(props.UNIQ_KEY) or "",
        flag=record.flag,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=record.born_host,
    )


def real_queue(record: Record) -> tuple[str, int] | None:
    """The topic and queue a scheduled record is released to (or a half message commits
    to), or None when its REAL_TOPIC or REAL_QID is missing or no queue id (such a record
    is skipped)."""
    topic = record.properties.get(props.REAL_TOPIC)
    queue = record.properties.get(props.REAL_QID, "")
    if not topic or not queue.isascii() or not queue.isdigit():
        return None
    return topic, int(queue)


def level_copy(record: Record) -> MessageInput | None:
    """ScheduleMessageService.messageTimeup (4.9): the record in its real topic and queue
    with every property it had — DELAY, REAL_TOPIC and REAL_QID included, as Apache's
    propertiesString is built before DELAY is cleared from the map."""
    real = real_queue(record)
    if real is None:
        return None
    return record_copy(record, real[0], real[1], record.properties)


def timer_copy(record: Record, dequeue_ms: int) -> MessageInput | None:
    """TimerMessageStore.convert: the record in its real topic and queue with
    TIMER_ENQUEUE_MS (when the timer took it: its store time) and TIMER_DEQUEUE_MS (now)
    added. REAL_TOPIC and REAL_QID stay in the stored properties, as in Apache's copy,
    whose propertiesString is built before convertMessage clears them from the map."""
    real = real_queue(record)
    if real is None:
        return None
    properties = dict(record.properties)
    properties[props.TIMER_ENQUEUE_MS] = str(record.store_timestamp_ms)
    properties[props.TIMER_DEQUEUE_MS] = str(dequeue_ms)
    return record_copy(record, real[0], real[1], properties)


def delete_key(real_topic: str, uniq_key: str) -> str:
    """TimerMessageStore.buildDeleteKey."""
    return f"{real_topic}+{uniq_key}"


def recall_handle(topic: str, broker_name: str, due_ms: int, message_id: str) -> str:
    """The handle a timed message's send receipt carries (SendMessageProcessor.attachRecallHandle:
    the due time + 1, "consider of floor")."""
    raw = " ".join((RECALL_HANDLE_VERSION, topic, broker_name, str(due_ms + 1), message_id))
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii")


@dataclass(frozen=True)
class RecallHandle:
    topic: str
    broker_name: str
    timestamp_ms: int  # the due time + 1
    message_id: str


def parse_recall_handle(handle: str) -> RecallHandle:
    """RecallMessageHandle.decodeHandle; InvalidArgument("recall handle is invalid") as Apache words it."""
    try:
        raw = base64.urlsafe_b64decode(handle.encode("ascii") + b"=" * (-len(handle) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        raise InvalidArgument("recall handle is invalid") from None
    items = raw.split(" ")
    if not handle or len(items) < 5 or items[0] != RECALL_HANDLE_VERSION:
        raise InvalidArgument("recall handle is invalid")
    message_id = items[4]
    if not (message_id.isascii() and message_id.isalnum() and len(message_id) <= UNIQ_KEY_LENGTH_MAX):
        # Only a message id the writer could have stored: it goes into a property value.
        raise InvalidArgument("recall handle is invalid")
    timestamp = items[3]
    return RecallHandle(items[1], items[2], int(timestamp) if timestamp.isascii() and timestamp.isdigit() else -1, items[4])


def recall_marker(handle: RecallHandle, born_timestamp_ms: int) -> MessageInput:
    """RecallMessageProcessor.buildMessage: body "0", tag _RECALL_TAG_ (its constant), sent
    to the message's topic, queue 0, with the delete key and the message's due time (the
    handle's − 1) as its delivery time, so that :func:`reroute` moves it to
    rmq_sys_wheel_timer beside its message."""
    return MessageInput(
        topic=handle.topic,
        body=b"0",
        tags=RECALL_TAG,
        properties={
            props.TIMER_DEL_UNIQKEY: delete_key(handle.topic, handle.message_id),
            props.TIMER_DELIVER_MS: str(handle.timestamp_ms - 1),
        },
        queue_id=0,
        born_timestamp_ms=born_timestamp_ms,
    )


RECALL_TAG = "_RECALL_TAG_"
