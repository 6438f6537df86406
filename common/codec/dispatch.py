"""The one dispatch definition: a commit log record → its consume queue unit and index keys.

Dispatch is a pure function of the record (DESIGN.md §3). The writer's online dispatch,
crash recovery and the batch reindex all call :func:`plan_dispatch`, so their consume queues
and indexes are identical. Rules (FORMAT.md §6.1, §6.2, §7.4, store/CommitLog.java and
store/index/IndexService.java, 4.9.8):

* only NOT and COMMIT records get a consume queue unit, at their QUEUEOFFSET;
* tagsCode is String.hashCode(TAGS), except in SCHEDULE_TOPIC_XXXX where a DELAY level > 0
  makes it the deliver time (store time + the level's delay);
* every record but ROLLBACK is indexed: first ``topic#UNIQ_KEY``, then ``topic#part`` for
  each non-empty space-separated part of KEYS, repeats kept, under the stored topic.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmqstore.common.codec import properties as props
from rmqstore.common.codec import sysflag
from rmqstore.common.codec.consumequeue import (
    SCHEDULE_TOPIC,
    deliver_timestamp,
    parse_delay_levels,
    tags_code,
)
from rmqstore.common.codec.javahash import index_key
from rmqstore.common.codec.record import Record

DEFAULT_DELAY_LEVELS_MS = parse_delay_levels()
_QUEUED = (sysflag.TRANSACTION_NOT, sysflag.TRANSACTION_COMMIT)


@dataclass(frozen=True, slots=True)
class DispatchPlan:
    """What one record contributes to the consume queues and the index."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    store_timestamp_ms: int
    tags_code: int
    has_unit: bool
    index_keys: tuple[str, ...]


def record_tags_code(record: Record, delay_levels_ms: dict[int, int] = DEFAULT_DELAY_LEVELS_MS) -> int:
    if record.topic == SCHEDULE_TOPIC:
        delay = record.properties.get(props.DELAY)
        # A DELAY that is not a number makes Apache's parser throw and the record look
        # invalid; rmqstore keeps the record and treats it as not delayed.
        if delay is not None and delay.lstrip("-").isdigit():
            level = min(int(delay), max(delay_levels_ms, default=0))
            if level > 0:
                return deliver_timestamp(level, record.store_timestamp_ms, delay_levels_ms)
    return tags_code(record.tags)


def plan_dispatch(record: Record, delay_levels_ms: dict[int, int] = DEFAULT_DELAY_LEVELS_MS) -> DispatchPlan:
    transaction = record.transaction_type
    keys: list[str] = []
    if transaction != sysflag.TRANSACTION_ROLLBACK:
        uniq = record.uniq_key
        if uniq is not None:
            keys.append(index_key(record.topic, uniq))
        keys.extend(index_key(record.topic, part) for part in props.split_keys(record.keys))
    return DispatchPlan(
        topic=record.topic,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
        commitlog_offset=record.commitlog_offset,
        size=record.size,
        store_timestamp_ms=record.store_timestamp_ms,
        tags_code=record_tags_code(record, delay_levels_ms),
        has_unit=transaction in _QUEUED,
        index_keys=tuple(keys),
    )
