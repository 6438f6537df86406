"""Resolving transactions' half messages (docs/design.md §4, "Transactions"): EndTransaction's
commit or rollback, and the check of those left unresolved, as Apache RocketMQ 5's
EndTransactionProcessor and TransactionalMessageServiceImpl.check do, over the records of
:mod:`rmqstore.writer.transactions`.

The check looks over RMQ_SYS_TRANS_HALF_TOPIC queue 0 from its progress, every check
interval: a half message an op record names is resolved; one younger than the transaction
timeout stops the look (those after it are younger still); one checked
``transactionCheckMax`` times goes to TRANS_CHECK_MAX_TIME_TOPIC; any other is appended
again with its check count up, and the caller asks its producer about the new copy.

Progress: ``config/rmqstore-transactions.json`` (ours: magic, version, CRC; Apache keeps the
same two offsets as group CID_RMQ_SYS_TRANS's offsets in consumerOffset.json) says "every
half message below ``halfOffset`` is resolved, discarded or appended again" and "op records
below ``opOffset`` name only half messages below ``halfOffset``". It is written after the
look's appends are flushed. A crash after an append and before the file loses nothing: the
half message is looked at again and appended again (its producer is then asked twice)."""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from dataclasses import dataclass

from rmqstore.common.codec import properties as props
from rmqstore.common.codec import sysflag
from rmqstore.common.codec.consumequeue import HALF_TOPIC, OP_TOPIC
from rmqstore.common.codec.record import Record
from rmqstore.common.errors import Corruption, InvalidArgument, NotFound
from rmqstore.common.files.config_file import read_or_set_aside, replace_durably
from rmqstore.writer.store import AppendResults, Writer
from rmqstore.writer.transactions import (
    HALF_QUEUE_ID,
    OP_QUEUE_ID,
    REMOVE_TAG,
    TransactionSettings,
    check_times,
    committed_copy,
    discarded_copy,
    first_check_ms,
    op_message,
    op_offsets,
    renewed_half,
)
from rmqstore.writer.validate import MessageBatch

log = logging.getLogger("rmqstore.writer")

PROGRESS_FILE_NAME = "rmqstore-transactions.json"
PROGRESS_MAGIC = "rmqstore-transactions"
PROGRESS_VERSION = 1
# Half messages looked at in one check, at most (TransactionalMessageServiceImpl bounds a
# look by time, MAX_PROCESS_TIME_LIMIT; the next interval goes on).
CHECK_BATCH_MAX = 1024


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class CheckProgress:
    half_offset: int = 0
    op_offset: int = 0

    def render(self) -> str:
        body = {"magic": PROGRESS_MAGIC, "version": PROGRESS_VERSION, "halfOffset": self.half_offset, "opOffset": self.op_offset}
        text = json.dumps(body, sort_keys=True)
        return json.dumps({**body, "crc32": zlib.crc32(text.encode())}, sort_keys=True)

    @classmethod
    def parse(cls, text: str, path: str) -> CheckProgress:
        try:
            document = json.loads(text)
            crc = document.pop("crc32")
            fields = (document["halfOffset"], document["opOffset"])
        except (ValueError, KeyError, AttributeError, TypeError):
            raise Corruption(f"{path} is not an rmqstore transactions file", path=path) from None
        if document.get("magic") != PROGRESS_MAGIC or document.get("version") != PROGRESS_VERSION:
            raise Corruption(f"{path}: unknown magic or version", path=path)
        if crc != zlib.crc32(json.dumps(document, sort_keys=True).encode()):
            raise Corruption(f"{path}: checksum mismatch", path=path)
        if not all(isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in fields):
            raise Corruption(f"{path}: offsets must be whole numbers", path=path)
        return cls(*fields)


def read_check_progress(config_dir: str) -> CheckProgress:
    """The check's progress; a missing file is a check that never ran. A file that fails its
    check is set aside: every half message is then looked at again (resolved ones are
    skipped by their op records, none is lost)."""
    path = os.path.join(config_dir, PROGRESS_FILE_NAME)
    return read_or_set_aside(path, CheckProgress.parse, CheckProgress(), "every half message is looked at again")


def write_check_progress(config_dir: str, progress: CheckProgress) -> None:
    replace_durably(config_dir, os.path.join(config_dir, PROGRESS_FILE_NAME), progress.render())


@dataclass(frozen=True)
class Check:
    """A half message whose producer is to be asked: its new copy in the half queue."""

    record: Record  # the copy as appended (its REAL_TOPIC, PGROUP, UNIQ_KEY)
    group: str  # PGROUP
    transaction_id: str  # its UNIQ_KEY (AbstractTransactionalMessageCheckListener.sendCheckMessage)
    half_queue_offset: int
    commitlog_offset: int


class TransactionCheck:
    """EndTransaction's resolution and the check, over one writer. Its calls block (reads
    and appends): the gateway runs them on a thread."""

    def __init__(self, writer: Writer, settings: TransactionSettings | None = None):
        self.writer = writer
        self.settings = settings if settings is not None else TransactionSettings()
        self.config_dir = writer.paths.config
        self._load()

    def _load(self) -> None:
        progress = read_check_progress(self.config_dir)
        self.half_offset = progress.half_offset
        self.op_offset = progress.op_offset  # the first op record not read yet
        self._written = progress
        # Half queue offsets at or above half_offset that op records name, and each op
        # record read since the written opOffset with the highest offset it names.
        self._done: set[int] = set()
        self._ops_read: list[tuple[int, int]] = []
        self._op_persist_from = progress.op_offset
        self._following = False

    # EndTransaction

    def end(self, group: str, half_queue_offset: int, commitlog_offset: int, commit: bool, from_check: bool) -> str | None:
        """Commit or roll back the half message at ``commitlog_offset`` (what the gateway's
        transaction data names). None once done; otherwise what the broker refused with
        (EndTransactionProcessor's remark), which Apache's proxy never reports to the
        producer (its EndTransaction to the broker is one-way)."""
        try:
            half = self.writer.log.read(commitlog_offset, check_crc=False)
        except (NotFound, Corruption):
            return "Find prepared transaction message failed"
        if half.topic != HALF_TOPIC:
            return "Find prepared transaction message failed"
        if not from_check and props.CHECK_IMMUNITY_TIME_IN_SECONDS in half.properties:
            # rejectCommitOrRollback: past its own first-check time, only a check's answer counts.
            if now_ms() - half.born_timestamp_ms > first_check_ms(half, self.settings.timeout_ms):
                return "ILLEGAL_OPERATION"
        if half.properties.get(props.PGROUP) != group:
            return "The producer group wrong"
        if half.queue_offset != half_queue_offset:
            return "The transaction state table offset wrong"
        op = op_message(half.queue_offset, self.writer.store_host, now_ms())
        if not commit:
            self.writer.append_released(MessageBatch.of([op]))
            return None
        copy = committed_copy(half)
        if copy is None:
            return "the half message has no REAL_TOPIC/REAL_QID"
        try:
            self.writer.append_released(
                MessageBatch.of([copy, op]), transactions={0: (sysflag.TRANSACTION_COMMIT, commitlog_offset)}
            )
        except (InvalidArgument, NotFound) as error:  # its topic deleted since, say
            return str(error)
        return None

    # The check

    def check(self, now: int | None = None) -> list[Check]:
        """One look over the half queue (not on a replica that takes no writes); the half
        messages whose producers are to be asked, each already appended again."""
        now = now_ms() if now is None else now
        if self.writer.refusal is not None:
            self._following = True
            return []
        if self._following:
            self._load()  # a replica that became the primary: its primary's progress
        self._read_ops()
        checks: list[Check] = []
        queue = self.writer.queues.find(HALF_TOPIC, HALF_QUEUE_ID)
        if queue is None:
            return []
        offset = max(self.half_offset, queue.min_offset)
        end = min(queue.max_offset, offset + CHECK_BATCH_MAX)
        for queue_offset, unit in queue.units(offset, end):
            if queue_offset in self._done:
                self._done.discard(queue_offset)
                offset = queue_offset + 1
                continue
            try:
                half = self.writer.log.read(unit.commitlog_offset, check_crc=False)
            except (NotFound, Corruption) as error:
                log.error("half message at commit log offset %d is unreadable and skipped: %s", unit.commitlog_offset, error)
                offset = queue_offset + 1
                continue
            if half.store_timestamp_ms >= now or now - half.born_timestamp_ms <= first_check_ms(half, self.settings.timeout_ms):
                break  # too young to check; those after it are younger
            times = check_times(half)
            if times >= self.settings.check_max:
                log.error(
                    "half message %s of %s was checked %d times and is discarded to TRANS_CHECK_MAX_TIME_TOPIC",
                    half.uniq_key, half.properties.get(props.REAL_TOPIC), times,
                )  # fmt: skip
                self.writer.append_released(MessageBatch.of([discarded_copy(half)]))
            else:
                checks.append(self._renew(half, times + 1))
            offset = queue_offset + 1
        self.half_offset = max(self.half_offset, offset)
        self._done = {done for done in self._done if done >= self.half_offset}
        self._checkpoint()
        return checks

    def _renew(self, half: Record, times: int) -> Check:
        results: AppendResults = self.writer.append_released(MessageBatch.of([renewed_half(half, times)]))
        renewed = self.writer.log.read(results.commitlog_offsets[0], check_crc=False)
        return Check(
            renewed,
            half.properties.get(props.PGROUP, ""),
            half.uniq_key or "",
            results.queue_offsets[0],
            results.commitlog_offsets[0],
        )

    def _read_ops(self) -> None:
        queue = self.writer.queues.find(OP_TOPIC, OP_QUEUE_ID)
        if queue is None:
            return
        start = max(self.op_offset, queue.min_offset)
        for op_queue_offset, unit in queue.units(start, queue.max_offset):
            try:
                record = self.writer.log.read(unit.commitlog_offset, check_crc=False)
            except (NotFound, Corruption) as error:
                log.error("op record at commit log offset %d is unreadable and skipped: %s", unit.commitlog_offset, error)
                named = []
            else:
                named = op_offsets(record.body) if record.properties.get(props.TAGS) == REMOVE_TAG else []
            self._done.update(offset for offset in named if offset >= self.half_offset)
            self._ops_read.append((op_queue_offset, max(named, default=-1)))
            self.op_offset = op_queue_offset + 1

    def _checkpoint(self) -> None:
        """Write the progress when it moved, once what the look appended is flushed. The op
        offset written is the first op record read that names a half message still ahead."""
        waiting = [op for op, highest in self._ops_read if highest >= self.half_offset]
        persist_op = min(waiting, default=self.op_offset)
        self._ops_read = [(op, highest) for op, highest in self._ops_read if op >= persist_op]
        progress = CheckProgress(self.half_offset, persist_op)
        if progress == self._written:
            return
        self.writer.flush()
        write_check_progress(self.config_dir, progress)
        self._written = progress

    def pending(self) -> int:
        """Half messages not yet looked past (resolved ones among them)."""
        queue = self.writer.queues.find(HALF_TOPIC, HALF_QUEUE_ID)
        return max(queue.max_offset - self.half_offset, 0) if queue is not None else 0

