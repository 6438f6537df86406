"""Consumer groups on the writer: which messages of a queue a group has been handed, which
it has acknowledged, and how far it has consumed (RocketMQ 5's "pop" consumption).

A group's position in a queue is its committed offset: every message below it is done
(acknowledged, or skipped by the group's tag filter). Above it, each message is either
waiting, in flight (handed out, invisible to the group until its ``visible_at_ms``), or
acknowledged out of order. Acknowledging the committed offset's message moves it up
over every acknowledged one after it. A message whose invisibility ends is handed out
again with its delivery attempt one higher: at-least-once.

Every hand-out carries a receipt handle: the message's place and a nonce of that one
delivery, signed (keyed BLAKE2b, a MAC of 128 bits; the handles of version 1, before it,
with HMAC-SHA256 and still taken) with the store's secret, so that a forged handle, one of
another group, or one of an earlier delivery of a message since handed out again, is
refused. The secret is kept in the state file: handles stay good across a restart.

Durability (:meth:`ConsumerGroups.flush`, every ``flush_interval_ms``, and at once while a
SYNC writer group's acknowledgement waits for the replicas: writer.rocketmq5): the committed
offsets go to ``config/consumerOffset.json`` in Apache RocketMQ 4.9's layout
(common.files.consumer_offsets), and what lies above them (acknowledgements out of
order, deliveries in flight) to ``config/consumerState.json``, our own, with a CRC32
(mode 0600: it holds the receipt handles' secret). The state file is written first; it
records every queue's committed offset it was written with, and is used for a queue only
where consumerOffset.json names the same offset (so an offset changed by hand, or a crash
between the two writes, falls back to the offset file: messages come back, none is lost).
Between flushes every hand-out (and every change of a delivery's invisibility) is also
appended to ``config/consumerState.journal``, one line a delivery and one ``write`` a
receive, unsynced: a SIGKILL of the writer leaves it in the page cache, so a message
handed out in the last flush interval keeps its delivery (attempt, invisibility, handle)
across the restart and comes back with its next attempt, as Apache's pop checkpoints
make it. The journal starts over at each flush (renamed ``.old`` while the flush writes,
removed once the state file holding its deliveries is durable); a power loss may lose
it, and then those deliveries count as not made.
A state file that fails its check is set aside (renamed ``consumerState.json.corrupt-<ms>``),
never overwritten. When consumerOffset.json and its ``.bak`` are both gone or empty while
the state file names queues, the offsets are taken from the state file, with a warning:
losing the offset file must not send every group back to the oldest message.

A committed offset is never past its queue's end (one past the newest message the queue
durably holds): one that is (a power cut under ``--flush async`` that lost acknowledged
messages, a restored backup, a hand edit, ``--truncate-corrupt-tail``) is moved back to
the end at load and at every use, logged and counted in ``rmqstore.consumer.offsets.corrected``,
so that the messages written after it at those offsets are delivered. Apache's broker
answers such a pull OFFSET_OVERFLOW_BADLY and corrects the offset the same way.

Everything here runs on the writer's event loop (the handlers call it); only the file
writes of a flush run elsewhere, on a snapshot."""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import heapq
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from opentelemetry import metrics

from rmqstore.common.codec.consumequeue import Unit, tags_code
from rmqstore.common.codec.record import Record
from rmqstore.common.codec.topic import TOPIC_LENGTH_MAX
from rmqstore.common.errors import Corruption, InvalidArgument, LimitReached, NotFound
from rmqstore.common.files import consumer_offsets
from rmqstore.common.files.consumequeue import ConsumeQueue
from rmqstore.common.files.mapped import fsync_directory, replace_file
from rmqstore.service.metrics import METER_NAME
from rmqstore.writer import sql92
from rmqstore.writer.store import Writer

STATE_FILE_NAME = "consumerState.json"
STATE_MAGIC = "rmqstore-consumer-state"
STATE_VERSION = 1
STATE_FILE_MODE = 0o600
JOURNAL_FILE_NAME = "consumerState.journal"
# RocketMQ's property holding a FIFO message's group.
SHARDING_KEY = "__SHARDINGKEY"
# Apache's consumer group name charset (letters, digits, %, |, _, -): no '@', so
# "topic@group" in consumerOffset.json splits one way only. Apache allows 255 characters;
# a group here has at most 120, so that its retry and dead-letter topics (%RETRY%<group>,
# %DLQ%<group>) are names within the topic rule's 127: a longer group's exhausted
# messages could be neither dead-lettered nor handed out again, and the group would stall.
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
GROUP_LENGTH_MAX = TOPIC_LENGTH_MAX - max(len(RETRY_PREFIX), len(DLQ_PREFIX))
GROUP_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
# Bounds on one receive: the units it looks at (a queue with more messages in flight
# than this hands out nothing further until some are acknowledged) and the messages.
SCAN_UNITS_MAX = 65_536
BATCH_MAX = 1_024
# The records one receive hands out, after its first (so a 4 MiB message always goes):
# the query node's response budget (query.view.RESPONSE_BYTES_MAX).
RECEIVE_BYTES_MAX = 16 * 1024 * 1024
INVISIBLE_MS_MAX = 12 * 3600 * 1000  # Apache's proxy bounds invisible_duration the same way
DEFAULT_FLUSH_INTERVAL_MS = 1_000
DEFAULT_MAX_GROUPS = 1_000
# Apache's maxReconsumeTimes 16: 17 deliveries.
DEFAULT_MAX_ATTEMPTS = 17
# A message bound for the dead-letter topic stays invisible while it is written there.
DEAD_LETTER_HOLD_MS = 60_000
# Version 2 handles are signed with keyed BLAKE2b (one hash call, several times cheaper
# than OpenSSL's HMAC-SHA256 for a handle's few bytes: it is paid twice a message, at the
# hand-out and at the ack); version 1 handles, with HMAC-SHA256, are still taken.
HANDLE_VERSION = "2"
_HMAC_VERSION = b"1 "
# Nonces drawn from the OS in one call (one draw serves many receives).
NONCES_DRAWN = 256
_MAC_BYTES = 16
log = logging.getLogger(__name__)


@functools.cache
def _offsets_corrected() -> metrics.Counter:
    return metrics.get_meter(METER_NAME).create_counter(
        "rmqstore.consumer.offsets.corrected",
        unit="{queue}",
        description="committed offsets found past their queue's end and moved back to it",
    )


class InvalidReceiptHandle(InvalidArgument):
    """A receipt handle that is not one this store gave out, or not the message's latest."""


class ExpiredReceiptHandle(InvalidReceiptHandle):
    """A receipt handle whose invisible duration is over (Apache's ReceiptHandle.isExpired):
    the message may be handed out again, so the handle no longer acknowledges or hides it."""


class IllegalFilter(InvalidArgument):
    """A subscription expression the writer does not evaluate (SQL92) or cannot read."""


class IllegalGroup(InvalidArgument):
    """A consumer group name outside RocketMQ's rule."""


def _check_unexpired(delivery: Delivery) -> None:
    if delivery.visible_at_ms <= now_ms():
        raise ExpiredReceiptHandle("receipt handle is expired")


def check_group(group: str) -> str:
    if not GROUP_PATTERN.match(group):
        raise IllegalGroup(f"consumer group {group[:80]!r} must be 1-{GROUP_LENGTH_MAX} of letters, digits, %, |, _ and -")
    if len(group) > GROUP_LENGTH_MAX:
        raise IllegalGroup(
            f"consumer group {group[:80]!r}… is {len(group)} characters; at most {GROUP_LENGTH_MAX}, "
            f"so that {DLQ_PREFIX}<group> and {RETRY_PREFIX}<group> are topic names (at most {TOPIC_LENGTH_MAX})"
        )
    return group


@dataclass(frozen=True)
class TagFilter:
    """A subscription: by TAG, ``*`` (every message) or tags joined by ``||``; or by a
    SQL92 expression over the message's properties (writer.sql92), which the consume
    queue's units cannot answer: every unit is picked, and the record decides."""

    tags: frozenset[str] | None  # None: every message
    selector: sql92.Selector | None = None

    @classmethod
    def sql(cls, expression: str) -> TagFilter:
        """A SQL92 subscription; refused, as Apache's broker refuses one it cannot parse
        (SUBSCRIPTION_PARSE_FAILED, its remark), with what is wrong."""
        try:
            return cls(None, sql92.parse(expression))
        except sql92.SelectorError as error:
            raise IllegalFilter(f"parse the consumer's subscription failed: {error}") from None

    @classmethod
    def parse(cls, expression: str) -> TagFilter:
        text = expression.strip()
        if not text or text == "*":
            return cls(None)
        tags = frozenset(part.strip() for part in text.split("||"))
        if "" in tags or any(c in text for c in "\x01\x02") or len(text) > 4096:
            raise IllegalFilter(f"tag expression {expression[:80]!r} is not '*' or tags joined by '||'")
        return cls(tags)

    @property
    def codes(self) -> frozenset[int] | None:
        return None if self.tags is None else frozenset(tags_code(t) for t in self.tags)

    def admits(self, record: Record) -> bool:
        if self.selector is not None:
            return self.selector.matches(record.properties)
        return self.admits_tag(record.tags)

    def admits_tag(self, tag: str | None) -> bool:
        return self.tags is None or (tag or "") in self.tags


@dataclass
class Delivery:
    """A message handed out and not acknowledged: invisible until ``visible_at_ms``,
    then waiting to be handed out again (the entry keeps the attempt count)."""

    attempt: int
    visible_at_ms: int
    nonce: int
    message_group: str = ""


@dataclass
class QueueProgress:
    """A group's progress in one queue, and its index of what comes next: ``fresh``, the
    first offset never handed out (below it every message is done or in flight), and
    ``due``, a heap of (visible_at_ms, offset) of the deliveries in flight (an entry whose
    delivery is gone or was moved since is stale and skipped). A receive looks only at
    what the heap says is visible again and at the queue from ``fresh`` on, so a large
    set in flight costs it nothing."""

    committed: int
    acked: set[int] = field(default_factory=set)
    inflight: dict[int, Delivery] = field(default_factory=dict)
    fresh: int = -1  # at least committed (set there when made)
    due: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.fresh = max(self.fresh, self.committed)

    def hold(self, offset: int, delivery: Delivery) -> None:
        """Put a message in flight until ``delivery.visible_at_ms``."""
        self.inflight[offset] = delivery
        heapq.heappush(self.due, (delivery.visible_at_ms, offset))

    def moved(self, offset: int, delivery: Delivery) -> None:
        """``delivery``'s visible_at_ms has changed (its earlier heap entry is now stale)."""
        heapq.heappush(self.due, (delivery.visible_at_ms, offset))

    def reindex(self) -> None:
        """Rebuild the index from ``inflight`` (loaded from the state file): every
        offset from ``committed`` on is looked at once more by the next receive."""
        self.fresh = self.committed
        self.due = [(d.visible_at_ms, o) for o, d in self.inflight.items()]
        heapq.heapify(self.due)

    def soonest_due(self) -> tuple[int, int] | None:
        """The heap's first live entry, the stale ones before it dropped."""
        due = self.due
        while due:
            visible_at, offset = due[0]
            delivery = self.inflight.get(offset)
            if delivery is not None and delivery.visible_at_ms == visible_at:
                return due[0]
            heapq.heappop(due)
        return None

    def reset(self, offset: int) -> None:
        """Start over at ``offset``: nothing acknowledged above it, nothing in flight."""
        self.committed = self.fresh = offset
        self.acked.clear()
        self.inflight.clear()
        self.due.clear()

    def advance(self) -> None:
        while self.committed in self.acked:
            self.acked.discard(self.committed)
            self.inflight.pop(self.committed, None)
            self.committed += 1

    def done(self, offset: int) -> None:
        if offset < self.committed:
            return
        self.acked.add(offset)
        self.inflight.pop(offset, None)
        self.advance()

    def move_to(self, offset: int) -> None:
        """Set the committed offset (the queue's floor, or a client's UpdateOffset): what
        lies below is forgotten, what lies above stays as it is."""
        self.committed = self.fresh = offset  # what lies above is looked at again, once
        self.acked = {o for o in self.acked if o >= offset}
        self.inflight = {o: d for o, d in self.inflight.items() if o >= offset}
        self.advance()


@dataclass(frozen=True)
class Handed:
    """One message handed out by :meth:`ConsumerGroups.receive`."""

    record: Record
    queue_id: int
    queue_offset: int
    attempt: int
    receipt_handle: str
    visible_at_ms: int


@dataclass(frozen=True)
class Picked:
    """A message :meth:`ConsumerGroups.receive` put in flight, before its record is read
    (the caller reads it, off the event loop where it is large): its place in the queue
    and the commit log, and its delivery."""

    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int  # the record's bytes, as its consume queue unit gives them
    attempt: int
    receipt_handle: str
    visible_at_ms: int
    record: Record | None = None  # already read (a FIFO group's scan reads each for its message group)

    def handed(self, record: Record) -> Handed:
        return Handed(record, self.queue_id, self.queue_offset, self.attempt, self.receipt_handle, self.visible_at_ms)


@dataclass(frozen=True)
class Receipt:
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    nonce: int


Key = tuple[str, str, int]  # (group, topic, queue id)


def now_ms() -> int:
    return int(time.time() * 1000)


class ConsumerGroups:
    """Every group's progress on one writer's store."""

    def __init__(
        self,
        writer: Writer,
        config_dir: str,
        *,
        flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS,
        fifo_groups: frozenset[str] = frozenset(),
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_groups: int | None = DEFAULT_MAX_GROUPS,
    ):
        self.writer = writer
        # A cap on the groups clients may make (each costs memory and every flush's
        # snapshot); groups the store already has are kept past it.
        self.max_groups = max_groups
        self.groups: set[str] = set()
        self.config_dir = config_dir
        self.state_path = os.path.join(config_dir, STATE_FILE_NAME)
        self.flush_interval_ms = flush_interval_ms
        # --fifo-group's groups; the groups configured orderly (updateSubGroup -o true)
        # consume FIFO as well.
        self.fifo_groups = fifo_groups
        # Deliveries of a message before it goes to the group's dead-letter topic.
        self.max_attempts = max_attempts
        self.progress: dict[Key, QueueProgress] = {}
        self.dirty = False
        # Acknowledgements (and offsets set) taken so far, and the count the last snapshot
        # held. Under SYNC replication an acknowledgement is answered once the in-sync
        # replicas hold a snapshot of its count (writer.replication, docs/replication.md).
        self.version = 0
        self.snapshot_version = 0
        # A writer group's replica keeps each snapshot's files for its followers' streams,
        # which send them as the flush starts writing them here: (its count,
        # consumerOffset.json's bytes, consumerState.json's bytes), and the snapshots taken.
        self.replicated = False
        self.last_snapshot: tuple[int, bytes, bytes] | None = None
        self.snapshots = 0
        self.secret = b""
        self._write_lock = threading.Lock()
        # A writer group's follower writes nothing of its own: its files are the primary's,
        # replicated (writer.replication), and read again once it is promoted.
        self.following = False
        # The journal of deliveries made since the last flush (see the module's note): its
        # descriptor (opened at the first line), the lines of the receive under way, and the
        # state text of the snapshot that renamed it .old (the write of that text removes it).
        self.journal_path = os.path.join(config_dir, JOURNAL_FILE_NAME)
        self._journal: int | None = None
        self._journal_lines: list[bytes] = []
        self._journal_rotated_for: str | None = None
        self._journal_failed = False
        self._secret_written = False
        self._nonces: list[int] = []
        self._load()

    def is_fifo(self, group: str) -> bool:
        """Whether the group consumes FIFO: named by --fifo-group, or configured orderly."""
        return group in self.fifo_groups or group in self.writer.subscription_groups.orderly

    # Loading and flushing

    def _load(self) -> None:
        offsets = consumer_offsets.read_offsets(self.config_dir)
        state = self._read_state()
        self.secret = bytes.fromhex(state["secret"]) if state else secrets.token_bytes(32)
        self._secret_written = state is not None
        entries = state.get("queues", []) if state else []
        if not offsets and entries:
            offsets = self._offsets_from_state(entries)
        for (topic, group), queues in offsets.items():
            for queue_id, committed in queues.items():
                self.progress[(group, topic, queue_id)] = QueueProgress(committed)
        for entry in entries:
            key = (entry["group"], entry["topic"], int(entry["queue"]))
            progress = self.progress.get(key)
            if progress is None or progress.committed != entry["committed"]:
                continue  # consumerOffset.json moved since: it is the authority
            progress.acked = {int(o) for o in entry["acked"]}
            progress.inflight = {
                int(o): Delivery(int(attempt), int(visible), int(nonce), str(group_name))
                for o, attempt, visible, nonce, group_name in entry["inflight"]
            }
            progress.advance()
            progress.reindex()
        journaled = self._replay_journal()
        for (group, topic, queue_id), progress in self.progress.items():
            self._within_queue(group, topic, queue_id, progress)
        self.groups = {group for group, _, _ in self.progress}
        if not state:
            self.dirty = True  # write the secret down with the first flush
        if journaled and not self.following:
            # The journal's deliveries made durable in the state file before it is removed.
            self._write(*self.snapshot())
            self._drop_journal()
            fsync_directory(self.config_dir)

    def _replay_journal(self) -> bool:
        """Apply the journal's deliveries (``.old`` first, then the current one) over the
        state file's: a delivery made since the last flush, before a SIGKILL, is kept. A
        line for a message acknowledged in the state file, or past its queue's end, is
        left out; a torn or unreadable line ends its file. Whether there was a journal."""
        found = False
        for path in (self.journal_path + ".old", self.journal_path):
            try:
                with open(path, "rb") as handle:
                    lines = handle.read().split(b"\n")
            except FileNotFoundError:
                continue
            found = True
            for line in lines:
                try:
                    group, topic, queue_id, offset, attempt, visible_at, nonce, message_group = orjson.loads(line)
                    key = (str(group), str(topic), int(queue_id))
                    delivery = Delivery(int(attempt), int(visible_at), int(nonce), str(message_group))
                    offset = int(offset)
                except (orjson.JSONDecodeError, ValueError, TypeError):
                    if line:
                        log.warning("%s: an unreadable line (a torn write) ends it", path)
                    break
                queue = self.writer.queues.find(key[1], key[2])
                if queue is None or not queue.min_offset <= offset < queue.max_offset:
                    continue
                progress = self.progress.get(key)
                if progress is None:
                    progress = self.progress[key] = QueueProgress(queue.min_offset)
                if offset < progress.committed or offset in progress.acked:
                    continue
                before = progress.inflight.get(offset)
                if before is None or delivery.attempt >= before.attempt:
                    progress.inflight[offset] = delivery
        for progress in self.progress.values():
            progress.reindex()
        return found

    def _journal_line(self, group: str, topic: str, queue_id: int, offset: int, delivery: Delivery) -> None:
        self._journal_lines.append(
            orjson.dumps(
                [group, topic, queue_id, offset, delivery.attempt, delivery.visible_at_ms, delivery.nonce, delivery.message_group]
            )
        )

    def _write_journal(self) -> None:
        """Append the lines of the call under way in one write, unsynced (see the module's
        note). A failure (a full disk) is logged once and the call still answered: its
        deliveries are then as durable as the next flush makes them."""
        lines, self._journal_lines = self._journal_lines, []
        if not lines or self.following:
            return
        data = b"\n".join(lines) + b"\n"
        try:
            if not self._secret_written:
                # The journal's handles are good after a restart only with the secret that signed them.
                self._write(*self.snapshot())
            if self._journal is None:
                os.makedirs(self.config_dir, exist_ok=True)
                self._journal = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, STATE_FILE_MODE)
            os.write(self._journal, data)
        except OSError as error:
            if not self._journal_failed:
                log.warning("appending to %s failed (%s): deliveries since the last flush are lost to a SIGKILL", self.journal_path, error)
            self._journal_failed = True
            return
        self._journal_failed = False

    def _rotate_journal(self) -> str | None:
        """At a snapshot: rename the journal .old (unless an earlier snapshot's .old is still
        being written) so that the next lines go to a new one."""
        if self._journal is None or self._journal_rotated_for is not None:
            return None
        os.close(self._journal)
        self._journal = None
        try:
            os.replace(self.journal_path, self.journal_path + ".old")
        except OSError as error:
            log.warning("renaming %s failed (%s): it is kept and appended to", self.journal_path, error)
            return None
        return self.journal_path + ".old"

    def _offsets_from_state(self, entries: list[dict[str, Any]]) -> consumer_offsets.OffsetTable:
        """The committed offsets the state file was written with: consumerOffset.json and
        its .bak are gone or empty, yet the state file names queues (deleted by mistake,
        a backup restored without it). Starting every group over from the oldest message
        would be a silent reset; these offsets are at most one flush older than the lost file's."""
        table: consumer_offsets.OffsetTable = {}
        for entry in entries:
            table.setdefault((entry["topic"], entry["group"]), {})[int(entry["queue"])] = int(entry["committed"])
        log.warning(
            "%s (and its .bak) is missing or empty, but %s names %d queue(s) of %d group(s): their committed offsets are "
            "taken from %s; to start every group from the oldest message instead, stop the writer and delete both files",
            consumer_offsets.path_in(self.config_dir), self.state_path, len(entries), len({g for _, g in table}), STATE_FILE_NAME,
        )  # fmt: skip
        self.dirty = True
        return table

    def _within_queue(self, group: str, topic: str, queue_id: int, progress: QueueProgress) -> None:
        """Move a committed offset past the queue's durable end back to it (see the module's
        note): the messages the queue receives from there on are the group's to consume."""
        queue = self.writer.queues.find(topic, queue_id)
        end = queue.max_offset if queue is not None else 0
        if progress.committed <= end:
            return
        log.warning(
            "consumer group %s: %s queue %d: committed offset %d is past the queue's end %d (messages lost to a power cut "
            "under --flush async, a restored backup, a hand edit or --truncate-corrupt-tail): moved back to %d",
            group, topic, queue_id, progress.committed, end, end,
        )  # fmt: skip
        _offsets_corrected().add(1, {"messaging.consumer.group.name": group, "messaging.destination.name": topic})
        progress.reset(end)
        self.dirty = True

    def _read_state(self) -> dict[str, Any] | None:
        """The state file's document, or None when there is none or it fails its check
        (then every message above the committed offsets comes back: nothing is lost). A
        file that fails is set aside for inspection, never overwritten."""
        try:
            with open(self.state_path, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as error:
            self._set_aside(f"{self.state_path} is not readable ({error})")
            return None
        try:
            return parse_state(text, self.state_path)
        except Corruption as error:
            self._set_aside(str(error))
            return None

    def _set_aside(self, problem: str) -> None:
        aside = f"{self.state_path}.corrupt-{now_ms()}"
        try:
            os.replace(self.state_path, aside)
            fsync_directory(self.config_dir)
        except OSError as error:
            # Not renamed: the next flush replaces it. Starting matters more than the copy.
            log.warning("%s; could not set it aside (%s): starting from consumerOffset.json", problem, error)
            return
        log.warning("%s; set aside as %s: starting from consumerOffset.json", problem, aside)

    def snapshot(self) -> tuple[consumer_offsets.OffsetTable, str]:
        """What a flush writes, taken on the loop: the offset table and the state file's text."""
        table: consumer_offsets.OffsetTable = {}
        queues = []
        for (group, topic, queue_id), progress in sorted(self.progress.items()):
            table.setdefault((topic, group), {})[queue_id] = progress.committed
            # Every queue, with nothing above its offset too: the state file then names
            # every group's offsets should consumerOffset.json be lost (see _load).
            queues.append(
                {
                    "group": group,
                    "topic": topic,
                    "queue": queue_id,
                    "committed": progress.committed,
                    "acked": sorted(progress.acked),
                    "inflight": [
                        [o, d.attempt, d.visible_at_ms, d.nonce, d.message_group] for o, d in sorted(progress.inflight.items())
                    ],
                }
            )
        self.dirty = False
        self.snapshot_version = self.version
        text = render_state({"secret": self.secret.hex(), "queues": queues})
        if self.replicated:
            self.last_snapshot = (self.version, consumer_offsets.render_offsets(table).encode(), text.encode())
            self.snapshots += 1
        if self._journal_rotated_for == "" or self._rotate_journal() is not None:
            # "": the write of the snapshot that renamed it failed; this later one holds its deliveries too.
            self._journal_rotated_for = text
        return table, text

    def write(self, table: consumer_offsets.OffsetTable, state_text: str) -> None:
        """Write a snapshot: the state file first, then consumerOffset.json (see the module's note)."""
        with self._write_lock:  # the final flush at a stop may meet a periodic one still writing
            if not self.following:
                try:
                    self._write(table, state_text)
                except OSError:
                    if self._journal_rotated_for is state_text:
                        self._journal_rotated_for = ""
                    raise
            if self._journal_rotated_for is state_text:
                # Its deliveries are in the state file just made durable.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.journal_path + ".old")
                self._journal_rotated_for = None

    def follow(self) -> None:
        """Write nothing from now on (a follower: the primary's files are replicated here)."""
        with self._write_lock:
            self.following = True
            self.dirty = False
            self.last_snapshot = None  # the followers' streams of a primary it no longer is
            self._drop_journal()

    def _drop_journal(self) -> None:
        """A follower's journal is no record of anything (the primary's files are)."""
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None
        self._journal_rotated_for = None
        for path in (self.journal_path + ".old", self.journal_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def write_replicated(self, name: str, content: bytes) -> None:
        """Replace one of the group files with the primary's copy (temp file, fsync,
        rename, fsync directory)."""
        with self._write_lock:
            replace_file(self.config_dir, name, content)

    def lead(self) -> None:
        """Read the files again (as replicated) and write them from now on (promoted)."""
        with self._write_lock:
            self.progress = {}
            self.groups = set()
            self._load()
            self.last_snapshot = None  # a new follower's stream starts from the files as read
            self.following = False

    def _write(self, table: consumer_offsets.OffsetTable, state_text: str) -> None:
        os.makedirs(self.config_dir, exist_ok=True)
        temp = self.state_path + ".tmp"
        # Owner only, from its creation: it holds the receipt handles' secret.
        descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, STATE_FILE_MODE)
        os.fchmod(descriptor, STATE_FILE_MODE)  # a .tmp left by a crash keeps its mode otherwise
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(state_text)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)  # the state file before it stays whole
            raise
        os.replace(temp, self.state_path)
        fsync_directory(self.config_dir)
        self._secret_written = True
        consumer_offsets.write_offsets(self.config_dir, table)

    def flush(self) -> None:
        """Snapshot and write at once (at shutdown, when no handler runs)."""
        if self.dirty:
            self.write(*self.snapshot())

    # Receipt handles

    def _sign(self, payload: bytes) -> bytes:
        if payload.startswith(_HMAC_VERSION):
            return hmac.digest(self.secret, payload, "sha256")[:_MAC_BYTES]
        return hashlib.blake2b(payload, key=self.secret, digest_size=_MAC_BYTES).digest()

    def _nonce(self) -> int:
        """A delivery's nonce: 62 random bits, drawn from the OS NONCES_DRAWN at a time."""
        if not self._nonces:
            drawn = secrets.token_bytes(8 * NONCES_DRAWN)
            self._nonces = [int.from_bytes(drawn[i : i + 8], "little") >> 2 for i in range(0, len(drawn), 8)]
        return self._nonces.pop()

    def make_handle(self, group: str, topic: str, queue_id: int, queue_offset: int, nonce: int) -> str:
        payload = f"{HANDLE_VERSION} {group} {topic} {queue_id} {queue_offset} {nonce}".encode()
        return base64.urlsafe_b64encode(payload + self._sign(payload)).decode().rstrip("=")

    def read_handle(self, handle: str) -> Receipt:
        try:
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        except (binascii.Error, ValueError):
            raise InvalidReceiptHandle("the receipt handle is not one this writer gave out") from None
        payload, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        if len(raw) <= _MAC_BYTES or not hmac.compare_digest(mac, self._sign(payload)):
            raise InvalidReceiptHandle("the receipt handle is not one this writer gave out")
        _, group, topic, queue_id, queue_offset, nonce = payload.decode().split(" ")
        return Receipt(group, topic, int(queue_id), int(queue_offset), int(nonce))

    # The calls

    def _progress(self, group: str, topic: str, queue_id: int) -> QueueProgress:
        key = (group, topic, queue_id)
        progress = self.progress.get(key)
        queue = self.writer.queues.find(topic, queue_id)
        floor = queue.min_offset if queue is not None else 0
        if progress is None:
            if group not in self.groups:
                if self.max_groups is not None and len(self.groups) >= self.max_groups:
                    raise LimitReached(
                        f"the writer holds {len(self.groups)} consumer groups, its limit (--max-groups {self.max_groups}): "
                        f"group {group} is not made"
                    )
                self.groups.add(group)
            # A new group starts at the queue's oldest message.
            progress = self.progress[key] = QueueProgress(floor)
            self.dirty = True
        elif progress.committed < floor:
            progress.move_to(floor)  # retention removed what it had not consumed
            self.dirty = True
        elif queue is not None and progress.committed > queue.max_offset:
            self._within_queue(group, topic, queue_id, progress)
        return progress

    def queue_count(self, topic: str) -> int:
        count = self.writer.topics.queue_count(topic)
        if count is None:
            raise NotFound(f"topic {topic} does not exist")
        return int(count)

    def receive(
        self,
        group: str,
        topic: str,
        queue_ids: list[int],
        batch_size: int,
        invisible_ms: int,
        tag_filter: TagFilter,
        bytes_max: int = RECEIVE_BYTES_MAX,
    ) -> tuple[list[Picked], list[Picked]]:
        """Up to ``batch_size`` visible, unacknowledged messages of the queues, and (after
        the first) at most ``bytes_max`` of records, each now in flight until
        ``invisible_ms`` from now; and the messages met that have had their
        ``max_attempts`` deliveries, held invisible for the caller to store in the
        dead-letter topic and then acknowledge. The records are the caller's to read
        (:meth:`read`); one whose tag the filter does not take after all (its tag's hash
        matched) it hands back to :meth:`unpick`."""
        check_group(group)
        now = now_ms()
        out: list[Picked] = []
        dead: list[Picked] = []
        fifo = self.is_fifo(group)
        budget = [bytes_max]
        for queue_id in queue_ids:
            if len(out) >= batch_size or (out and budget[0] <= 0):
                break
            out += self._receive_queue(
                group, topic, queue_id, batch_size - len(out), now, invisible_ms, tag_filter, fifo, dead, budget, not out
            )
        self._write_journal()
        return out, dead

    def _receive_queue(
        self,
        group: str,
        topic: str,
        queue_id: int,
        wanted: int,
        now: int,
        invisible_ms: int,
        tag_filter: TagFilter,
        fifo: bool,
        dead: list[Picked],
        budget: list[int],
        first: bool,
    ) -> list[Picked]:
        queue = self.writer.queues.find(topic, queue_id)
        if queue is None or (queue.max_offset == queue.min_offset and (group, topic, queue_id) not in self.progress):
            return []  # nothing to hand out: a group becomes known in a queue once it holds a message
        progress = self._progress(group, topic, queue_id)
        if fifo:
            return self._scan_fifo(group, topic, queue_id, queue, progress, wanted, now, invisible_ms, tag_filter, dead, budget, first)
        out: list[Picked] = []
        codes = tag_filter.codes

        def full(unit: Unit) -> bool:
            return unit.size > budget[0] and not (first and not out)

        # What comes back: deliveries in flight whose invisibility has ended, soonest first.
        while len(out) < wanted and budget[0] > 0:
            entry = progress.soonest_due()
            if entry is None or entry[0] > now:
                break
            offset = entry[1]
            unit = queue.read(offset)
            if unit is not None and full(unit):
                break  # the answer is full; the rest waits for the next receive
            heapq.heappop(progress.due)
            if unit is None:
                progress.done(offset)  # removed by retention since it was handed out
                self.dirty = True
                continue
            handed = len(out)
            self._hand(group, topic, queue_id, progress, offset, unit, progress.inflight[offset], now, invisible_ms, codes, "", None, out, dead)
            budget[0] -= sum(one.size for one in out[handed:])
        # Then what was never handed out, from the index's fresh offset on.
        start = max(progress.fresh, progress.committed)
        stop = min(queue.max_offset, progress.committed + SCAN_UNITS_MAX)
        if len(out) < wanted and budget[0] > 0 and start < stop:
            for offset, unit in queue.units(start, stop):
                if offset in progress.acked:
                    progress.fresh = offset + 1
                    continue
                delivery = progress.inflight.get(offset)
                if delivery is not None and delivery.visible_at_ms > now:
                    progress.fresh = offset + 1
                    continue
                if full(unit):
                    break  # the answer is full; the rest waits for the next receive
                handed = len(out)
                self._hand(group, topic, queue_id, progress, offset, unit, delivery, now, invisible_ms, codes, "", None, out, dead)
                budget[0] -= sum(one.size for one in out[handed:])
                progress.fresh = offset + 1
                if len(out) >= wanted or budget[0] <= 0:
                    break
        return out

    def _hand(
        self,
        group: str,
        topic: str,
        queue_id: int,
        progress: QueueProgress,
        offset: int,
        unit: Unit,
        delivery: Delivery | None,
        now: int,
        invisible_ms: int,
        codes: frozenset[int] | None,
        message_group: str,
        record: Record | None,
        out: list[Picked],
        dead: list[Picked],
    ) -> None:
        """Hand out the message at ``offset`` (its ``delivery`` so far, if any) into
        ``out``, or into ``dead`` once its deliveries are used up; a message retention
        removed, or that the filter's tag codes leave out, is done instead."""
        if unit.commitlog_offset < self.writer.log.min_offset:
            progress.done(offset)  # removed by retention before the group read it
            self.dirty = True
            return
        if codes is not None and unit.tags_code not in codes:
            progress.done(offset)  # not the group's: consumed by skipping
            self.dirty = True
            return
        attempt = delivery.attempt + 1 if delivery is not None else 1
        nonce = self._nonce()
        self.dirty = True
        if attempt > self.max_attempts:
            visible_at = now + DEAD_LETTER_HOLD_MS
            held = Delivery(attempt - 1, visible_at, nonce, message_group)
            progress.hold(offset, held)
            self._journal_line(group, topic, queue_id, offset, held)
            handle = self.make_handle(group, topic, queue_id, offset, nonce)
            dead.append(Picked(queue_id, offset, unit.commitlog_offset, unit.size, attempt - 1, handle, visible_at, record))
            return
        visible_at = now + invisible_ms
        held = Delivery(attempt, visible_at, nonce, message_group)
        progress.hold(offset, held)
        self._journal_line(group, topic, queue_id, offset, held)
        handle = self.make_handle(group, topic, queue_id, offset, nonce)
        out.append(Picked(queue_id, offset, unit.commitlog_offset, unit.size, attempt, handle, visible_at, record))

    def _scan_fifo(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue: ConsumeQueue,
        progress: QueueProgress,
        wanted: int,
        now: int,
        invisible_ms: int,
        tag_filter: TagFilter,
        dead: list[Picked],
        budget: list[int],
        first: bool,
    ) -> list[Picked]:
        """A FIFO group's receive: the queue in order from the committed offset, since a
        message group's next message waits for the one before it in flight (each record
        is read here for its message group)."""
        codes = tag_filter.codes
        blocked: set[str] = set()  # FIFO message groups with an earlier message in flight
        out: list[Picked] = []
        stop = min(queue.max_offset, progress.committed + SCAN_UNITS_MAX)
        for offset, unit in queue.units(progress.committed, stop):
            if offset in progress.acked:
                continue
            delivery = progress.inflight.get(offset)
            if delivery is not None and delivery.visible_at_ms > now:
                if delivery.message_group:
                    blocked.add(delivery.message_group)
                continue
            if unit.commitlog_offset < self.writer.log.min_offset or (codes is not None and unit.tags_code not in codes):
                self._hand(group, topic, queue_id, progress, offset, unit, delivery, now, invisible_ms, codes, "", None, out, dead)
                continue
            if unit.size > budget[0] and not (first and not out):
                break  # the answer is full; the rest waits for the next receive
            record = self.writer.log.read(unit.commitlog_offset)
            if not tag_filter.admits(record):
                progress.done(offset)
                self.dirty = True
                continue
            message_group = record.properties.get(SHARDING_KEY, "")
            if message_group:
                if message_group in blocked:
                    continue
                blocked.add(message_group)
            handed = len(out)
            self._hand(group, topic, queue_id, progress, offset, unit, delivery, now, invisible_ms, codes, message_group, record, out, dead)
            budget[0] -= sum(one.size for one in out[handed:])
            if len(out) >= wanted or budget[0] <= 0:
                break
        return out

    def read(self, picked: list[Picked]) -> list[Record | None]:
        """The records of ``picked`` (None for one retention removed since): the commit
        log only, so any thread may call it."""
        log = self.writer.log
        records: list[Record | None] = []
        for one in picked:
            if one.record is not None:
                records.append(one.record)
                continue
            try:
                records.append(log.read(one.commitlog_offset))
            except NotFound:
                records.append(None)
        return records

    def unpick(self, group: str, topic: str, picked: Picked) -> None:
        """A message picked that the group does not take after all (its tag is not the
        filter's, though its hash matched; or retention removed it): consumed by
        skipping, as the scan consumes what the filter leaves out, unless handed out again since."""
        try:
            self.ack(group, topic, picked.receipt_handle)
        except InvalidReceiptHandle:
            pass

    def _current(self, group: str, topic: str, handle: str) -> tuple[Receipt, QueueProgress, Delivery | None]:
        """The handle's message and its delivery; None when already acknowledged.
        Raises InvalidReceiptHandle for a forged handle, another group's or topic's, or
        a delivery since superseded."""
        receipt = self.read_handle(handle)
        if receipt.group != group or receipt.topic != topic:
            raise InvalidReceiptHandle(f"the receipt handle is for group {receipt.group} on topic {receipt.topic}")
        progress = self.progress.get((group, topic, receipt.queue_id))
        if progress is None:
            raise InvalidReceiptHandle("the receipt handle names a queue the group has not received from")
        if receipt.queue_offset < progress.committed or receipt.queue_offset in progress.acked:
            return receipt, progress, None
        delivery = progress.inflight.get(receipt.queue_offset)
        if delivery is None or delivery.nonce != receipt.nonce:
            raise InvalidReceiptHandle("the receipt handle is stale: the message has been handed out again since")
        return receipt, progress, delivery

    def ack(self, group: str, topic: str, handle: str) -> None:
        """Acknowledge a delivery; acknowledging it again is no error. A delivery whose
        invisible duration is over is refused, as Apache's proxy refuses it."""
        receipt, progress, delivery = self._current(group, topic, handle)
        if delivery is not None:
            _check_unexpired(delivery)
            progress.done(receipt.queue_offset)
            self.dirty = True
            self.version += 1

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        """Make the delivery invisible for ``invisible_ms`` from now; a new handle for it."""
        receipt, progress, delivery = self._current(group, topic, handle)
        if delivery is None:
            raise InvalidReceiptHandle("the message is already acknowledged")
        _check_unexpired(delivery)
        delivery.visible_at_ms = now_ms() + invisible_ms
        delivery.nonce = self._nonce()
        progress.moved(receipt.queue_offset, delivery)
        self._journal_line(group, topic, receipt.queue_id, receipt.queue_offset, delivery)
        self._write_journal()
        self.dirty = True
        return self.make_handle(group, topic, receipt.queue_id, receipt.queue_offset, delivery.nonce)

    def delivery_of(self, group: str, topic: str, handle: str) -> tuple[Receipt, Delivery]:
        """The current delivery a handle names (for a dead-letter forward)."""
        receipt, _, delivery = self._current(group, topic, handle)
        if delivery is None:
            raise InvalidReceiptHandle("the message is already acknowledged")
        return receipt, delivery

    def next_visible_ms(self, group: str, topic: str, queue_ids: list[int]) -> int | None:
        """When the first message in flight on these queues becomes visible again."""
        soonest: int | None = None
        for queue_id in queue_ids:
            progress = self.progress.get((group, topic, queue_id))
            entry = progress.soonest_due() if progress is not None else None
            if entry is not None and (soonest is None or entry[0] < soonest):
                soonest = entry[0]
        return soonest

    def committed(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset (a group never seen: the queue's oldest offset,
        without making the group known), within the queue's bounds."""
        check_group(group)
        progress = self.progress.get((group, topic, queue_id))
        queue = self.writer.queues.find(topic, queue_id)
        if queue is None:
            return 0  # a queue without files is empty: 0 is its oldest offset and its end
        if progress is None:
            return queue.min_offset
        return min(max(progress.committed, queue.min_offset), queue.max_offset)

    def update_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        check_group(group)
        progress = self._progress(group, topic, queue_id)
        progress.move_to(offset)
        self.dirty = True
        self.version += 1


def render_state(document: dict[str, Any]) -> str:
    body = json.dumps(document, separators=(",", ":"), sort_keys=True)
    crc = zlib.crc32(body.encode())
    return f"{STATE_MAGIC} {STATE_VERSION} {crc:08x}\n{body}\n"


def parse_state(text: str, path: str = STATE_FILE_NAME) -> dict[str, Any]:
    """The state file's document; Corruption when its header or checksum do not match."""
    header, newline, body = text.partition("\n")
    parts = header.split(" ")
    if not newline or len(parts) != 3 or parts[0] != STATE_MAGIC:
        raise Corruption(f"{path} does not start with the {STATE_MAGIC} header", path=path)
    if parts[1] != str(STATE_VERSION):
        raise Corruption(f"{path} is version {parts[1]}; this writer reads version {STATE_VERSION}", path=path)
    body = body.rstrip("\n")
    if f"{zlib.crc32(body.encode()):08x}" != parts[2]:
        raise Corruption(f"{path} fails its checksum (a torn or damaged write)", path=path)
    try:
        document = json.loads(body)
        bytes.fromhex(document["secret"])
        for entry in document["queues"]:
            str(entry["group"]), str(entry["topic"]), int(entry["queue"]), int(entry["committed"])
            list(entry["acked"]), list(entry["inflight"])
    except (ValueError, KeyError, TypeError) as error:
        raise Corruption(f"{path} has a good checksum but not the expected fields: {error}", path=path) from None
    return document  # type: ignore[no-any-return]
