"""The writer's settings. Names are ours; defaults and meaning follow RocketMQ's
MessageStoreConfig where one exists (docs/format.md §11)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rmqstore.common.files.store import StoreSizes
from rmqstore.writer.validate import DEFAULT_LIMITS

# The bytes of RocketMQ 5 answers over 256 KiB (receives and pulls of large messages) the
# writer reads a second at most, every client's together (--large-answer-rate): clients
# taking 16 MiB answers without a pause would otherwise take the machine's cores from
# everyone else's sends (benchmarks/GATEWAY.md).
LARGE_ANSWER_BYTES_PER_S = 64 * 1024 * 1024


class FlushPolicy(enum.Enum):
    SYNC = "sync"  # ack after the commit log is fsynced (group commit)
    ASYNC = "async"  # ack after the write; fsync every flush_interval_ms


@dataclass(frozen=True)
class WriterConfig:
    store: str
    sizes: StoreSizes = field(default_factory=StoreSizes)
    flush: FlushPolicy = FlushPolicy.ASYNC
    flush_interval_ms: int = 500  # flushIntervalCommitLog
    # The store host written into every record (and so into every offsetMsgId).
    store_host: str = "127.0.0.1:10911"
    # Limits on what a producer may send.
    max_body_bytes: int = DEFAULT_LIMITS.max_body_bytes
    max_keys: int = DEFAULT_LIMITS.max_keys
    max_key_length: int = DEFAULT_LIMITS.max_key_length
    max_batch_messages: int = DEFAULT_LIMITS.max_batch_messages
    auto_create_topics: bool = True
    auto_create_queue_count: int = 4  # min(producer 4, TBW102 8)
    default_queue_count: int = 8  # mqadmin updateTopic
    # Caps on what clients may make (LimitReached past them): topics, and their queues in all.
    max_topics: int = 10_000
    max_queues: int = 100_000
    # Retention (fileReservedTime, deleteWhen, diskMaxUsedSpaceRatio, the full ratio).
    retention_hours: float = 72.0
    retention_delete_hours: tuple[int, ...] = (4,)
    disk_clean_ratio: float = 0.75
    disk_full_ratio: float = 0.90
    retention_interval_ms: int = 10_000
    # Mid-log corruption stops the writer from starting unless the loss is accepted.
    truncate_corrupt_tail: bool = False
    # How far ahead a timed message's delivery time may be (Apache's timerMaxDelaySec, 3 days).
    timer_max_delay_ms: int = 3 * 24 * 3600 * 1000
    # The machine's boot (None: the kernel's boot id). Written into ``abort``: a start
    # that finds another boot's there knows the page cache may have lost unsynced pages.
    boot_id: str | None = None
