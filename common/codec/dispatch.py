"""The one dispatch definition: a commit log record → its consume queue unit and index keys.

Dispatch is a pure function of the record (docs/design.md §3). The writer's online dispatch,
crash recovery and the batch reindex all call :func:`plan_dispatch`, so their consume queues
and indexes are identical. Rules (docs/format.md §6.1, §6.2, §7.4, store/CommitLog.java and
store/index/IndexService.java, 4.9.8):

* only NOT and COMMIT records get a consume queue unit, at their QUEUEOFFSET;
* tagsCode is String.hashCode(TAGS), except in SCHEDULE_TOPIC_XXXX where a DELAY level > 0
  makes it the deliver time (store time + the level's delay), and in rmq_sys_wheel_timer
  (rmqstore's timed messages) where it is the due time, TIMER_OUT_MS;
* every record but ROLLBACK is indexed: first ``topic#UNIQ_KEY``, then ``topic#part`` for
  each non-empty space-separated part of KEYS, repeats kept, under the stored topic.

:class:`DispatchBatch` holds the plans of many records as columns, so the file layer can
write a batch's consume queue units and index entries with a few array operations; it is
built from the same :func:`plan_dispatch`, or from the fields a writer already has in hand
through :meth:`DispatchBatch.add`, which applies the same rules.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rmqstore.common.codec import properties as props
from rmqstore.common.codec import sysflag
from rmqstore.common.codec.columnar import RecordColumns
from rmqstore.common.codec.consumequeue import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    deliver_timestamp,
    parse_delay_levels,
    tags_code,
)
from rmqstore.common.codec.javahash import (
    ascii_span_hashes,
    combine_hashes,
    index_key,
    offsets_within,
    topic_key_hashes,
    topic_prefix_hashes,
)
from rmqstore.common.codec.record import Record
from rmqstore.common.codec.speedups import _speedups
from rmqstore.common.errors import invariant
from rmqstore.common.sequences import numbered

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


_cached_tags_code = functools.lru_cache(maxsize=4096)(tags_code)


def _utf8(data: bytes) -> str:
    """A text field as the per-record decoder reads it."""
    return data.decode("utf-8", "replace")


# Topics and tags repeat from record to record.
_text = functools.lru_cache(maxsize=4096)(_utf8)


# The system topics delayed and timed messages wait in until released.
SCHEDULED_TOPICS = frozenset((SCHEDULE_TOPIC, TIMER_TOPIC))


def _tags_code_of(
    topic: str,
    properties: Mapping[str, str],
    store_timestamp_ms: int,
    delay_levels_ms: dict[int, int],
) -> int:
    if topic == SCHEDULE_TOPIC:
        delay = properties.get(props.DELAY)
        # A DELAY that is not a number makes Apache's parser throw and the record look
        # invalid; rmqstore keeps the record and treats it as not delayed.
        if delay is not None and delay.lstrip("-").isdigit():
            level = min(int(delay), max(delay_levels_ms, default=0))
            if level > 0:
                return deliver_timestamp(level, store_timestamp_ms, delay_levels_ms)
    elif topic == TIMER_TOPIC:
        due = properties.get(props.TIMER_OUT_MS)
        if due is not None and due.isascii() and due.isdigit() and len(due) <= 18:
            return int(due)
    return _cached_tags_code(properties.get(props.TAGS))


def _index_keys_of(sys_flag: int, properties: Mapping[str, str]) -> list[str]:
    """The keys a record is indexed under, without the topic: UNIQ_KEY, then KEYS."""
    keys: list[str] = []
    if sysflag.transaction_type(sys_flag) != sysflag.TRANSACTION_ROLLBACK:
        uniq = properties.get(props.UNIQ_KEY)
        if uniq is not None:
            keys.append(uniq)
        keys.extend(props.split_keys(properties.get(props.KEYS)))
    return keys


def _key_hashes_of_spans(
    columns: RecordColumns, topics: list[str], indexed: np.ndarray
) -> tuple[np.ndarray, list[int]] | None:
    """The index hashes of every record's keys (UNIQ_KEY, then each non-empty part of
    KEYS split at spaces), computed on the bytes of the property values; None if any of
    them is not ASCII (then UTF-16 code units differ from bytes: the caller decodes)."""
    data = columns.data
    rows = np.arange(columns.rows, dtype=np.int64)
    has_uniq = indexed & (columns.uniq_key >= 0)
    has_keys = indexed & (columns.keys >= 0)
    if _speedups is not None:
        distinct, record_topics = numbered(topics)
        found = _speedups.span_key_hashes(
            np.ascontiguousarray(data),
            topic_prefix_hashes(distinct).astype(np.int64)[record_topics],
            *_value_spans(columns, np.where(has_uniq, columns.uniq_key, -1)),
            *_value_spans(columns, np.where(has_keys, columns.keys, -1)),
        )
        if found is None:
            return None
        hashes_bytes, counts_bytes = found
        return np.frombuffer(hashes_bytes, np.int64), np.frombuffer(counts_bytes, np.int64).tolist()
    uniq_row = rows[has_uniq]
    uniq_at = columns.values.at[columns.uniq_key[has_uniq]]
    uniq_length = columns.values.length[columns.uniq_key[has_uniq]]
    keys_row = rows[has_keys]
    keys_at = columns.values.at[columns.keys[has_keys]]
    keys_length = columns.values.length[columns.keys[has_keys]]
    # Every byte of the KEYS values, then the runs of non-space bytes: the parts.
    inside = offsets_within(keys_length)
    where = np.repeat(keys_at, keys_length) + inside
    text = data[where]
    if (data[np.repeat(uniq_at, uniq_length) + offsets_within(uniq_length)] >= 0x80).any() or (text >= 0x80).any():
        return None
    solid = text != 0x20
    last_in_value = inside == np.repeat(keys_length, keys_length) - 1
    after_space = np.ones(len(text), bool)
    after_space[1:] = ~solid[:-1]
    before_space = np.ones(len(text), bool)
    before_space[:-1] = ~solid[1:]
    starts = np.flatnonzero(solid & ((inside == 0) | after_space))
    ends = np.flatnonzero(solid & (last_in_value | before_space))
    part_row = np.repeat(keys_row, keys_length)[starts]
    # Put order: a record's UNIQ_KEY, then its parts as they appear.
    row = np.concatenate((uniq_row, part_row))
    order = np.argsort(row * 2 + np.concatenate((np.zeros(len(uniq_row), np.int64), np.ones(len(part_row), np.int64))), kind="stable")
    at = np.concatenate((uniq_at, where[starts]))[order]
    length = np.concatenate((uniq_length, ends - starts + 1))[order]
    row = row[order]
    distinct, record_topics = numbered(topics)
    prefixes = topic_prefix_hashes(distinct)[record_topics[row]]
    hashes = combine_hashes(prefixes, ascii_span_hashes(data, at, length), length)
    return hashes, np.bincount(row, minlength=columns.rows).tolist()


def _value_spans(columns: RecordColumns, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each row's property pair's value is in ``columns.data`` (at, length, as
    contiguous int64s), at −1 where the row's pair is −1 (the row lacks it)."""
    if not len(columns.values.at):
        return np.full(len(pairs), -1, np.int64), np.zeros(len(pairs), np.int64)
    safe = np.maximum(pairs, 0)
    at = np.where(pairs >= 0, columns.values.at[safe], -1).astype(np.int64)
    return at, np.ascontiguousarray(columns.values.length[safe], np.int64)


# Fewer records than this are dispatched one plan at a time (files.store.Dispatcher):
# numpy's fixed cost per call outweighs its per-record saving for a handful of records.
# The writer's append of a batch of 6, 8 or 12 messages (three index keys each) costs
# 20-40% less as arrays, of 4 or 5 about the same (benchmarks/CLUSTER.md, 2026-11-30).
SMALL_BATCH_RECORDS = 6


def record_tags_code(record: Record, delay_levels_ms: dict[int, int] = DEFAULT_DELAY_LEVELS_MS) -> int:
    return _tags_code_of(record.topic, record.properties, record.store_timestamp_ms, delay_levels_ms)


def plan_dispatch(record: Record, delay_levels_ms: dict[int, int] = DEFAULT_DELAY_LEVELS_MS) -> DispatchPlan:
    return DispatchPlan(
        topic=record.topic,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
        commitlog_offset=record.commitlog_offset,
        size=record.size,
        store_timestamp_ms=record.store_timestamp_ms,
        tags_code=record_tags_code(record, delay_levels_ms),
        has_unit=record.transaction_type in _QUEUED,
        index_keys=tuple(index_key(record.topic, key) for key in _index_keys_of(record.sys_flag, record.properties)),
    )


@dataclass(slots=True)
class DispatchBatch:
    """The dispatch plans of consecutive records, as columns, in commit log order.

    A record's index keys are ``topic#key`` for the next ``key_counts[i]`` entries of
    ``keys`` (UNIQ_KEY first, then the KEYS parts), kept without the topic prefix so the
    index can hash them without building the strings — or only their hashes
    (``key_hashes``)."""

    delay_levels_ms: dict[int, int] = field(default_factory=lambda: DEFAULT_DELAY_LEVELS_MS)
    topics: list[str] = field(default_factory=list)
    queue_ids: list[int] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    commitlog_offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    store_timestamps_ms: list[int] = field(default_factory=list)
    tags_codes: list[int] = field(default_factory=list)
    has_unit: list[bool] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    key_counts: list[int] = field(default_factory=list)
    # The index hashes of all keys in put order, when the plans were made from bytes
    # without the key strings (then ``keys`` is empty).
    key_hashes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.topics)

    def add(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        commitlog_offset: int,
        size: int,
        store_timestamp_ms: int,
        sys_flag: int,
        properties: Mapping[str, str],
    ) -> None:
        """Plan one record from its fields (the rules of :func:`plan_dispatch`)."""
        self.topics.append(topic)
        self.queue_ids.append(queue_id)
        self.queue_offsets.append(queue_offset)
        self.commitlog_offsets.append(commitlog_offset)
        self.sizes.append(size)
        self.store_timestamps_ms.append(store_timestamp_ms)
        self.tags_codes.append(_tags_code_of(topic, properties, store_timestamp_ms, self.delay_levels_ms))
        self.has_unit.append(sysflag.transaction_type(sys_flag) in _QUEUED)
        keys = _index_keys_of(sys_flag, properties)
        self.keys.extend(keys)
        self.key_counts.append(len(keys))

    @classmethod
    def of_messages(
        cls,
        topics: list[str],
        queue_ids: list[int],
        queue_offsets: list[int],
        commitlog_offsets: list[int],
        sizes: list[int],
        store_timestamps_ms: list[int],
        tags: Sequence[str],
        uniq_keys: Sequence[str],
        keys: Sequence[Sequence[str]],
        scheduled_tags_codes: Mapping[int, int] | None = None,
    ) -> DispatchBatch:
        """The plans of plain messages as a writer stores them — sysFlag NOT (every one
        gets a unit), KEYS already split — built column-wise: the same plans :meth:`add`
        makes, without a properties map per record. A batch of ``SMALL_BATCH_RECORDS`` or
        more keeps only its keys' hashes when the codecs are compiled. The rows in
        SCHEDULE_TOPIC_XXXX or rmq_sys_wheel_timer are those of ``scheduled_tags_codes``,
        each with the tagsCode the one-record rule gives it (its deliver or due time)."""
        invariant(
            set(scheduled_tags_codes or ()) == {i for i, topic in enumerate(topics) if topic in SCHEDULED_TOPICS}
            if scheduled_tags_codes or not SCHEDULED_TOPICS.isdisjoint(topics)
            else True,
            "the scheduled rows are those in the schedule and timer topics",
        )
        plans = cls._of_messages(topics, queue_ids, queue_offsets, commitlog_offsets, sizes, store_timestamps_ms, tags, uniq_keys, keys)
        for row, code in (scheduled_tags_codes or {}).items():
            plans.tags_codes[row] = code
        return plans

    @classmethod
    def _of_messages(
        cls,
        topics: list[str],
        queue_ids: list[int],
        queue_offsets: list[int],
        commitlog_offsets: list[int],
        sizes: list[int],
        store_timestamps_ms: list[int],
        tags: Sequence[str],
        uniq_keys: Sequence[str],
        keys: Sequence[Sequence[str]],
    ) -> DispatchBatch:
        if _speedups is not None and len(topics) >= SMALL_BATCH_RECORDS:
            # Hashed here, without the flat list of key strings (a batch this large is
            # dispatched as arrays, which need only the hashes).
            distinct, record_topics = numbered(topics)
            hashes, counts = _speedups.message_key_hashes(
                topic_prefix_hashes(distinct).astype(np.int64)[record_topics], list(uniq_keys), list(keys)
            )
            return cls(
                DEFAULT_DELAY_LEVELS_MS, topics, queue_ids, queue_offsets, commitlog_offsets, sizes,
                store_timestamps_ms, _speedups.tags_codes(list(tags)), [True] * len(topics), [],
                np.frombuffer(counts, np.int64).tolist(), np.frombuffer(hashes, np.int64),
            )  # fmt: skip
        return cls(
            DEFAULT_DELAY_LEVELS_MS,
            topics,
            queue_ids,
            queue_offsets,
            commitlog_offsets,
            sizes,
            store_timestamps_ms,
            [_cached_tags_code(t) for t in tags],
            [True] * len(topics),
            [key for uniq_key, parts in zip(uniq_keys, keys) for key in (uniq_key, *parts)],
            [len(parts) + 1 for parts in keys],
        )

    @classmethod
    def of_columns(cls, columns: RecordColumns, delay_levels_ms: dict[int, int] = DEFAULT_DELAY_LEVELS_MS) -> DispatchBatch:
        """The plans of bulk-decoded records (``codec.columnar``): the rules of
        :meth:`add` over columns, with texts cut from the records' bytes."""
        raw = np.ascontiguousarray(columns.data).data.cast("B")

        def texts(pairs: np.ndarray, decode: Callable[[bytes], str]) -> list[str | None]:
            """The value of a per-row property pair, None where the row lacks it."""
            at = columns.values.at[np.maximum(pairs, 0)].tolist()
            length = columns.values.length[np.maximum(pairs, 0)].tolist()
            return [decode(bytes(raw[a : a + n])) if p >= 0 else None for p, a, n in zip(pairs.tolist(), at, length)]

        if _speedups is not None:
            data = np.ascontiguousarray(columns.data)
            topic_at = np.ascontiguousarray(columns.topic.at, np.int64)
            topics = _speedups.span_texts(data, topic_at, np.ascontiguousarray(columns.topic.length, np.int64))
            tags = _speedups.span_texts(data, *_value_spans(columns, columns.tags))
        else:
            topics = [
                _text(bytes(raw[a : a + n])) for a, n in zip(columns.topic.at.tolist(), columns.topic.length.tolist())
            ]
            tags = texts(columns.tags, _text)
        transaction = columns.sys_flag & sysflag.TRANSACTION_MASK
        store_timestamps = columns.store_timestamp_ms.tolist()
        tags_codes = _speedups.tags_codes(tags) if _speedups is not None else [_cached_tags_code(t) for t in tags]
        scheduled = SCHEDULE_TOPIC in topics or TIMER_TOPIC in topics
        delayed = [i for i, topic in enumerate(topics) if topic in SCHEDULED_TOPICS] if scheduled else []
        for row in delayed:
            # Delayed and timed messages: tagsCode from DELAY or TIMER_OUT_MS, read as the
            # one-record rule reads it.
            at, length = int(columns.properties.at[row]), int(columns.properties.length[row])
            properties = props.decode_properties(raw[at : at + length])
            tags_codes[row] = _tags_code_of(topics[row], properties, store_timestamps[row], delay_levels_ms)
        indexed = transaction != sysflag.TRANSACTION_ROLLBACK
        hashed = _key_hashes_of_spans(columns, topics, indexed)
        flat: list[str] = []
        counts: list[int] = []
        key_hashes = None
        if hashed is not None:
            key_hashes, counts = hashed
        else:
            for uniq, joined, plain in zip(texts(columns.uniq_key, _utf8), texts(columns.keys, _utf8), indexed.tolist()):
                if not plain:
                    counts.append(0)
                    continue
                parts = props.split_keys(joined)
                if uniq is not None:
                    flat.append(uniq)
                flat.extend(parts)
                counts.append(len(parts) + (uniq is not None))
        return cls(
            delay_levels_ms,
            topics,
            columns.queue_id.tolist(),
            columns.queue_offset.tolist(),
            columns.commitlog_offset.tolist(),
            columns.size.tolist(),
            store_timestamps,
            tags_codes,
            ((transaction == sysflag.TRANSACTION_NOT) | (transaction == sysflag.TRANSACTION_COMMIT)).tolist(),
            flat,
            counts,
            key_hashes,
        )

    def queue_groups(self) -> list[tuple[str, int, np.ndarray]]:
        """Each queue the records with a unit go to — (topic, queue id, their positions
        in commit log order) — found with array operations, not a step per record."""
        if not self.topics:
            return []
        distinct, record_topics = numbered(self.topics)
        queued = np.flatnonzero(np.asarray(self.has_unit, dtype=bool))
        if not len(queued):
            return []  # no record has a unit (PREPARED and ROLLBACK records only)
        # One int64 per queue: the topic's number above a queue id made non-negative.
        queue_ids = np.asarray(self.queue_ids, dtype=np.int64)[queued] + 2**31
        key = (record_topics[queued] << 33) | queue_ids
        order = np.argsort(key, kind="stable")
        key = key[order]
        positions = queued[order]
        starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1]))).tolist()
        ends = starts[1:] + [len(key)]
        keys = key[starts].tolist()
        return [
            (distinct[k >> 33], (k & (2**33 - 1)) - 2**31, positions[start:end])
            for k, start, end in zip(keys, starts, ends)
        ]

    def index_hashes(self) -> np.ndarray:
        """``index_key_hash`` of every index key, in put order: ``key_hashes`` when the
        plans were made from bytes, else hashed from the key strings."""
        if self.key_hashes is not None:
            return self.key_hashes
        distinct, record_topics = numbered(self.topics)
        key_records = np.repeat(np.arange(len(self), dtype=np.int64), self.key_counts)
        return topic_key_hashes(distinct, record_topics[key_records], self.keys)

    def index_keys_of(self, record: int, first_key: int) -> tuple[str, ...]:
        """The ``topic#key`` strings of one record, whose keys start at ``first_key``."""
        topic = self.topics[record]
        return tuple(index_key(topic, key) for key in self.keys[first_key : first_key + self.key_counts[record]])

    def add_record(self, record: Record) -> None:
        self.add(
            record.topic,
            record.queue_id,
            record.queue_offset,
            record.commitlog_offset,
            record.size,
            record.store_timestamp_ms,
            record.sys_flag,
            record.properties,
        )
