"""The seeded workload of the benchmark suite and its query sets.

Messages: 3 topics × 8 queues; each message has a 32-hex UNIQ_KEY, KEYS with 1–2 keys
(each key 70 % a fresh order id, 30 % one of 1,000 hot customer keys), one of 5 tags and
a body of ``body_bytes`` (256 by default). Everything is drawn from one numpy Generator
seeded with ``seed``, so every process that builds ``Workload(spec)`` gets the very same
messages in the same order: the in-process writer, the gRPC load client, SQLite.

Store times: the workload's *synthetic* store times are 20 µs apart (kept at RocketMQ's
millisecond resolution, so about 50 messages share a millisecond). Only SQLite stores them.
rmqstore's writer stamps each batch with its own wall clock and cannot be told otherwise,
so time searches on an rmqstore store use the times it really wrote. That is why a time
search is defined here as a *fraction* of a store's time range (plus topic, queue and
boundary), resolved against each store's own range, and checked against an oracle built
from that store's own times rather than against SQLite's answer.

Query sets (drawn from a second generator, also seeded): key lookups (80 % hits: a key of
a random stored message, so hot customer keys come up as often as they occur; 20 % keys
that were never sent), UNIQ_KEY lookups and queue-offset lookups of random stored
messages, and time searches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

DEFAULT_SEED = 20261122
TOPICS = ("BenchOrders", "BenchPayments", "BenchShipments")
QUEUES_PER_TOPIC = 8
TAGS = ("TagA", "TagB", "TagC", "TagD", "TagE")
HOT_CUSTOMER_KEYS = 1000
HOT_KEY_SHARE = 0.3  # of all keys; the rest are unique order ids
TWO_KEYS_SHARE = 0.5  # messages with two keys (the others have one)
SYNTHETIC_SPACING_US = 20
SYNTHETIC_T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
BODY_POOL_BYTES = 1 << 16  # bodies are windows of one random pool: distinct, cheap to hold
KEY_PAGE_SIZE = 32  # a key lookup asks for the newest 32 matches (and whether there are more)


@dataclass(frozen=True)
class WorkloadSpec:
    messages: int
    body_bytes: int = 256
    seed: int = DEFAULT_SEED


class Workload:
    """The messages of a spec as columns (index i is the i-th message sent)."""

    def __init__(self, spec: WorkloadSpec):
        self.spec = spec
        n = spec.messages
        rng = np.random.default_rng(spec.seed)
        self.topic_index = rng.integers(0, len(TOPICS), n).tolist()
        self.queue_ids = rng.integers(0, QUEUES_PER_TOPIC, n).tolist()
        self.tag_index = rng.integers(0, len(TAGS), n).tolist()
        hex_keys = rng.bytes(16 * n).hex().upper()
        self.uniq_keys = [hex_keys[32 * i : 32 * i + 32] for i in range(n)]
        self.keys = self._draw_keys(rng, n)
        self._body_pool = rng.bytes(BODY_POOL_BYTES + spec.body_bytes)
        self.body_offsets = rng.integers(0, BODY_POOL_BYTES, n).tolist()
        self.queue_offsets = self._queue_offsets()

    @staticmethod
    def _draw_keys(rng: np.random.Generator, n: int) -> list[tuple[str, ...]]:
        two = (rng.random(n) < TWO_KEYS_SHARE).tolist()
        hot = (rng.random(2 * n) < HOT_KEY_SHARE).tolist()
        customers = rng.integers(0, HOT_CUSTOMER_KEYS, 2 * n).tolist()
        keys: list[tuple[str, ...]] = []
        order_seq = 0
        for i in range(n):
            drawn: list[str] = []
            for slot in (2 * i, 2 * i + 1)[: 2 if two[i] else 1]:
                if hot[slot]:
                    customer = customers[slot]
                    if drawn and drawn[0] == f"cust-{customer:04d}":
                        customer = (customer + 1) % HOT_CUSTOMER_KEYS  # a message never repeats a key
                    drawn.append(f"cust-{customer:04d}")
                else:
                    drawn.append(f"ord-{order_seq:010d}")
                    order_seq += 1
            keys.append(tuple(drawn))
        return keys

    def _queue_offsets(self) -> list[int]:
        """Messages name their queue, so queue offsets follow from the order alone."""
        next_offset: dict[tuple[int, int], int] = {}
        offsets = []
        for queue_key in zip(self.topic_index, self.queue_ids):
            offset = next_offset.get(queue_key, 0)
            next_offset[queue_key] = offset + 1
            offsets.append(offset)
        return offsets

    def __len__(self) -> int:
        return self.spec.messages

    def topic(self, i: int) -> str:
        return TOPICS[self.topic_index[i]]

    def tag(self, i: int) -> str:
        return TAGS[self.tag_index[i]]

    def body(self, i: int) -> bytes:
        start = self.body_offsets[i]
        return self._body_pool[start : start + self.spec.body_bytes]

    def synthetic_store_ms(self, i: int) -> int:
        return SYNTHETIC_T0_MS + (i * SYNTHETIC_SPACING_US) // 1000

    def batches(self, batch_size: int) -> Iterator[range]:
        for first in range(0, len(self), batch_size):
            yield range(first, min(first + batch_size, len(self)))

    def message_inputs(self, indexes: range) -> list[Any]:
        """Messages as the in-process writer takes them."""
        from rmqstore.writer.validate import MessageInput

        return [
            MessageInput(
                topic=self.topic(i),
                body=self.body(i),
                keys=self.keys[i],
                tags=self.tag(i),
                queue_id=self.queue_ids[i],
                uniq_key=self.uniq_keys[i],
            )
            for i in indexes
        ]

    def proto_messages(self, indexes: range) -> list[Any]:
        """Messages as a gRPC producer sends them."""
        from rmqstore.v1 import messages_pb2

        return [
            messages_pb2.Message(
                topic=self.topic(i),
                queue_id=self.queue_ids[i],
                body=self.body(i),
                keys=self.keys[i],
                tags=self.tag(i),
                uniq_key=self.uniq_keys[i],
            )
            for i in indexes
        ]


# Query sets


@dataclass(frozen=True)
class KeyLookup:
    topic: str
    key: str
    kind: str  # "order" (unique order id), "hot" (hot customer key) or "miss" (never sent)


@dataclass(frozen=True)
class UniqLookup:
    topic: str
    uniq_key: str


@dataclass(frozen=True)
class OffsetLookup:
    topic: str
    queue_id: int
    queue_offset: int


@dataclass(frozen=True)
class TimeSearch:
    topic: str
    queue_id: int
    fraction: float  # of the store's [first, last] store time range
    boundary: str  # "lower" (first stored at or after t) or "upper" (last at or before t)

    def timestamp_ms(self, first_ms: int, last_ms: int) -> int:
        return first_ms + int(self.fraction * (last_ms - first_ms + 1))


@dataclass(frozen=True)
class QuerySets:
    keys: list[KeyLookup] = field(default_factory=list)
    uniq_keys: list[UniqLookup] = field(default_factory=list)
    offsets: list[OffsetLookup] = field(default_factory=list)
    times: list[TimeSearch] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> QuerySets:
        document = json.loads(text)
        return cls(
            keys=[KeyLookup(**q) for q in document["keys"]],
            uniq_keys=[UniqLookup(**q) for q in document["uniq_keys"]],
            offsets=[OffsetLookup(**q) for q in document["offsets"]],
            times=[TimeSearch(**q) for q in document["times"]],
        )


def build_query_sets(
    workload: Workload,
    *,
    key_lookups: int = 10_000,
    uniq_lookups: int = 10_000,
    offset_lookups: int = 10_000,
    time_searches: int = 1_000,
    key_hit_share: float = 0.8,
) -> QuerySets:
    rng = np.random.default_rng([workload.spec.seed, 1])
    n = len(workload)
    keys = []
    for j in range(key_lookups):
        if rng.random() < key_hit_share:
            i = int(rng.integers(n))
            key = workload.keys[i][int(rng.integers(len(workload.keys[i])))]
            keys.append(KeyLookup(workload.topic(i), key, "hot" if key.startswith("cust-") else "order"))
        else:
            keys.append(KeyLookup(TOPICS[int(rng.integers(len(TOPICS)))], f"nokey-{j:09d}", "miss"))
    uniq = [UniqLookup(workload.topic(i), workload.uniq_keys[i]) for i in rng.integers(0, n, uniq_lookups).tolist()]
    offsets = [
        OffsetLookup(workload.topic(i), workload.queue_ids[i], workload.queue_offsets[i])
        for i in rng.integers(0, n, offset_lookups).tolist()
    ]
    times = [
        TimeSearch(
            TOPICS[int(rng.integers(len(TOPICS)))],
            int(rng.integers(QUEUES_PER_TOPIC)),
            float(rng.random()),
            "lower" if rng.random() < 0.5 else "upper",
        )
        for _ in range(time_searches)
    ]
    return QuerySets(keys, uniq, offsets, times)


class TimeOracle:
    """Exact time-search answers from a store's own per-message store times (in queue
    order): LOWER = the first queue offset stored at or after t (the queue's length if
    none), UPPER = the last one at or before t (−1 if none) — the query view's contract."""

    def __init__(self, workload: Workload, store_times_ms: list[int]):
        import bisect

        self._bisect = bisect
        self.per_queue: dict[tuple[str, int], list[int]] = {}
        for i, ts in enumerate(store_times_ms):
            self.per_queue.setdefault((workload.topic(i), workload.queue_ids[i]), []).append(ts)
        self.first_ms = min(store_times_ms)
        self.last_ms = max(store_times_ms)

    def answer(self, search: TimeSearch) -> int:
        times = self.per_queue.get((search.topic, search.queue_id), [])
        t = search.timestamp_ms(self.first_ms, self.last_ms)
        if search.boundary == "lower":
            return self._bisect.bisect_left(times, t)
        return self._bisect.bisect_right(times, t) - 1
