"""The small store geometry most tests use, and a store's verification through the
library (check_store, then every record findable every way)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.msgid import decode_offset_msg_id, offset_msg_id
from rmqstore.common.files.check import CheckReport, check_store
from rmqstore.common.files.commitlog import CommitLog, StopReason
from rmqstore.common.files.consumequeue import ConsumeQueueSet
from rmqstore.common.files.index import IndexFileList
from rmqstore.common.files.store import StorePaths, StoreSizes

# Small files, so that tests roll commit log, consume queue and index files.
SMALL = StoreSizes(commitlog_file_size_bytes=65536, cq_file_units=50, index_slots=17, index_entries=200)
SIZE_ARGS = [
    "--commitlog-file-size", str(SMALL.commitlog_file_size_bytes),
    "--cq-file-units", str(SMALL.cq_file_units),
    "--index-slots", str(SMALL.index_slots),
    "--index-entries", str(SMALL.index_entries),
]  # fmt: skip
# 1 MiB commit log files: room for the RocketMQ 5 tests' larger messages.
GATEWAY_SIZES = StoreSizes(commitlog_file_size_bytes=1 << 20, cq_file_units=100, index_slots=17, index_entries=400)
# Keys many records share: verify_store looks each up once per topic.
SHARED_KEYS = ("shared-1", "shared-2", "общий-ключ", "共有キー")


@dataclass
class StoreFacts:
    records: int
    queues: int
    index_files: int
    commitlog_files: int
    end_offset: int
    most_queue_files: int


def copy_live_store(store: Path, to: Path, *left_out: str) -> None:
    """A copy of a store a writer is running on, without the files it writes under a
    temporary name and renames (its checkpoint's, its config's), which may be gone by the
    time the copy reaches them; and without the ``left_out`` patterns."""
    shutil.copytree(store, to, ignore=shutil.ignore_patterns("*.writing", "*.tmp", *left_out))


def repeated_index_entries(report: CheckReport) -> list[str]:
    """check_store's note on index entries put twice for one record (none are expected:
    recovery puts only the keys a kill kept it from putting, docs/writer.md)."""
    return [note for note in report.notes if "repeated entr" in note]


def check_ok(root: Path) -> CheckReport:
    """check_store finds no problem (no missing, different, duplicate or extra consume
    queue unit; every index key present and reachable), no repeated index entry, and the
    log ends cleanly."""
    report = check_store(str(root), SMALL)
    assert report.ok, f"{report.problem_count} problem(s): {report.problems[:10]}"
    assert report.stop is not None and report.stop.reason is StopReason.END, report.stop
    assert repeated_index_entries(report) == []
    return report


def verify_store(root: Path) -> StoreFacts:
    """Every record is findable by UNIQ_KEY, each KEYS part, offsetMsgId and queue
    offset; queues are contiguous from 0 and hold exactly the records' units. (Run
    check_ok first: it names index and queue problems precisely.)"""
    paths = StorePaths(str(root))
    log = CommitLog(paths.commitlog, SMALL.commitlog_file_size_bytes)
    queues = ConsumeQueueSet(paths.consumequeue, SMALL.cq_file_units)
    index = IndexFileList(paths.index, SMALL.index_slots, SMALL.index_entries)
    try:
        assert log.min_offset == 0
        per_queue: dict[tuple[str, int], list[int]] = defaultdict(list)
        by_offset: dict[int, tuple[str, int, int]] = {}
        shared_hits: dict[tuple[str, str], set[int]] = {}
        records = log.records()
        for record in records:
            offset = record.commitlog_offset
            where = f"record at commit log offset {offset} ({record.topic}/{record.queue_id}#{record.queue_offset})"
            by_offset[offset] = (record.topic, record.queue_id, record.queue_offset)
            per_queue[(record.topic, record.queue_id)].append(record.queue_offset)
            # by UNIQ_KEY
            assert record.uniq_key, where
            assert offset in index.candidates(record.topic, record.uniq_key), f"{where}: not found by UNIQ_KEY"
            # by each KEYS part
            for part in set(props.split_keys(record.keys)):
                if part in SHARED_KEYS:
                    found = shared_hits.get((record.topic, part))
                    if found is None:
                        found = shared_hits[(record.topic, part)] = set(index.candidates(record.topic, part))
                    assert offset in found, f"{where}: not found by key {part!r}"
                else:
                    assert offset in index.candidates(record.topic, part), f"{where}: not found by key {part!r}"
            # by offsetMsgId
            msg_id = offset_msg_id(record.store_host, offset)
            decoded = decode_offset_msg_id(msg_id)
            assert decoded.store_host == record.store_host, where
            assert log.read(decoded.commitlog_offset) == record, f"{where}: offsetMsgId {msg_id} reads another record"
            # by queue offset
            consume_queue = queues.find(record.topic, record.queue_id)
            assert consume_queue is not None, f"{where}: no consume queue"
            unit = consume_queue.read(record.queue_offset)
            assert unit is not None, f"{where}: no consume queue unit"
            assert (unit.commitlog_offset, unit.size) == (offset, record.size), where
        assert records.stop is not None and records.stop.reason is StopReason.END, records.stop
        # Queue offsets: contiguous from 0 in log order, and each queue holds exactly those.
        on_disk = {(q.topic, q.queue_id): q for q in queues.open_all()}
        assert set(per_queue) <= set(on_disk)
        for key, consume_queue in sorted(on_disk.items()):
            offsets = per_queue.get(key, [])
            assert offsets == list(range(len(offsets))), f"queue {key}: offsets not contiguous from 0 in log order"
            assert (consume_queue.min_offset, consume_queue.max_offset) == (0, len(offsets)), key
            for queue_offset, unit in consume_queue.units():
                assert by_offset[unit.commitlog_offset] == (*key, queue_offset), (key, queue_offset)
        return StoreFacts(
            records=len(by_offset),
            queues=len(per_queue),
            index_files=len(index.files),
            commitlog_files=len(log.files.files),
            end_offset=records.stop.end_offset,
            most_queue_files=max(len(q.files.files) for q in on_disk.values()),
        )
    finally:
        log.close()


def fill(mount: Path, name: str) -> None:
    """Another process writes a file until the file system is full."""
    code = (
        "import sys\n"
        "with open(sys.argv[1], 'wb', buffering=0) as f:\n"
        "    chunk = bytes(4096)\n"
        "    try:\n"
        "        while f.write(chunk): pass\n"
        "    except OSError as e:\n"
        "        assert e.errno == 28, e\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(mount / name)], check=True, timeout=60
    )
    assert os.statvfs(mount).f_bavail == 0
