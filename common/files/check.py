"""``check``: do the commit log, the consume queues and the index agree?

Every record of the commit log is run through the one dispatch definition; the consume
queues must hold exactly the units it gives (no missing, different, duplicate or extra
unit) and the index must hold every key it gives, each entry reachable from its hash
slot. Disagreements are collected in commit log order; the first is the headline. Last,
no consumer group's committed offset (``config/consumerOffset.json``) may lie past its
queue's end: the group would skip the messages the queue receives at those offsets (the
writer moves such an offset back to the end when it starts).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rmqstore.common.codec import index as ix
from rmqstore.common.codec.consumequeue import encode_unit
from rmqstore.common.codec.dispatch import plan_dispatch
from rmqstore.common.codec.javahash import index_key_hash
from rmqstore.common.errors import Corruption, NotFound
from rmqstore.common.files import consumer_offsets
from rmqstore.common.files.commitlog import CommitLog, ScanStop, StopReason
from rmqstore.common.files.consumequeue import ConsumeQueueSet
from rmqstore.common.files.index import IndexFile, IndexFileList
from rmqstore.common.files.store import StorePaths, StoreSizes

PROBLEMS_KEPT_MAX = 100


@dataclass
class CheckReport:
    records: int = 0
    units: int = 0
    index_keys: int = 0
    stop: ScanStop | None = None
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < PROBLEMS_KEPT_MAX:
            self.problems.append(text)


def _index_entries(index_file: IndexFile, report: CheckReport) -> Counter[tuple[int, int]]:
    """(keyHash, phyOffset) of every entry in use, checking each is reachable from its slot."""
    count = index_file.header.index_count
    found: Counter[tuple[int, int]] = Counter()
    if count <= 1:
        return found
    entries_view = index_file.mapped.buf[ix.entry_position(index_file.slots, 1) : ix.entry_position(index_file.slots, count)]
    entries = list(ix.ENTRY.iter_unpack(entries_view))
    reachable = bytearray(count)
    heads = np.frombuffer(index_file.mapped.buf, dtype=ix.SLOT_DTYPE, count=index_file.slots, offset=ix.HEADER_SIZE)
    # Only the slots in use are walked: a default index file has 5,000,000 slots, most of
    # them empty in any store, and a Python step each took seconds.
    used = np.flatnonzero(heads)
    for slot, number in zip(used.tolist(), heads[used].tolist()):
        steps = 0
        while 0 < number < count and steps < count:
            key_hash, _, _, prev = entries[number - 1]
            if key_hash % index_file.slots != slot:
                report.problem(f"index {index_file.name}: entry {number} (hash {key_hash}) is chained from slot {slot}")
            if reachable[number]:
                report.problem(f"index {index_file.name}: entry {number} is reached twice (chain loop or shared tail)")
                break
            reachable[number] = 1
            number = prev
            steps += 1
    for number, (key_hash, phy_offset, _, _) in enumerate(entries, start=1):
        if not reachable[number]:
            report.problem(f"index {index_file.name}: entry {number} (offset {phy_offset}) is not reachable from its slot")
        found[(key_hash, phy_offset)] += 1
    return found


def check_store(root: str, sizes: StoreSizes) -> CheckReport:
    paths = StorePaths(root)
    report = CheckReport()
    log = CommitLog(paths.commitlog, sizes.commitlog_file_size_bytes)
    queues = ConsumeQueueSet(paths.consumequeue, sizes.cq_file_units)
    index = IndexFileList(paths.index, sizes.index_slots, sizes.index_entries)
    try:
        indexed: Counter[tuple[int, int]] = Counter()
        for index_file in index.files:
            indexed.update(_index_entries(index_file, report))
        expected_ends: dict[tuple[str, int], int] = {}
        records = log.records()
        for record in records:
            report.records += 1
            plan = plan_dispatch(record)
            if plan.has_unit:
                report.units += 1
                key = (plan.topic, plan.queue_id)
                queue = queues.find(plan.topic, plan.queue_id)
                where = f"record at commit log offset {plan.commitlog_offset} ({plan.topic}/{plan.queue_id} offset {plan.queue_offset})"
                previous_end = expected_ends.get(key)
                if previous_end is not None and plan.queue_offset != previous_end:
                    report.problem(f"{where}: queue offsets jump from {previous_end - 1} to {plan.queue_offset}")
                expected_ends[key] = plan.queue_offset + 1
                if queue is None:
                    report.problem(f"{where}: consume queue {plan.topic}/{plan.queue_id} does not exist")
                else:
                    unit = queue.read(plan.queue_offset)
                    want = encode_unit(plan.commitlog_offset, plan.size, plan.tags_code)
                    if unit is None:
                        report.problem(f"{where}: missing from the consume queue")
                    elif encode_unit(unit.commitlog_offset, unit.size, unit.tags_code) != want:
                        report.problem(
                            f"{where}: consume queue holds offset {unit.commitlog_offset} size {unit.size} "
                            f"tagsCode {unit.tags_code}, expected {plan.commitlog_offset}/{plan.size}/{plan.tags_code}"
                        )
            for key_text in plan.index_keys:
                report.index_keys += 1
                entry_key = (index_key_hash(key_text), plan.commitlog_offset)
                if indexed[entry_key] > 0:
                    indexed[entry_key] -= 1
                else:
                    report.problem(f"record at commit log offset {plan.commitlog_offset}: key {key_text!r} is not in the index")
        report.stop = records.stop
        assert report.stop is not None
        if report.stop.reason is StopReason.CORRUPT:
            report.problem(f"commit log: {report.stop.describe()}")
        elif report.stop.reason is StopReason.TORN:
            report.notes.append(f"commit log: {report.stop.describe()}")
        for queue in queues.open_all():
            key = (queue.topic, queue.queue_id)
            want_end = expected_ends.get(key)
            if want_end is not None and queue.max_offset > want_end:
                report.problem(
                    f"consume queue {queue.topic}/{queue.queue_id} has {queue.max_offset - want_end} unit(s) "
                    f"past offset {want_end - 1}, the last record of that queue in the commit log"
                )
            elif want_end is None and queue.max_offset > queue.min_offset:
                first = queue.read(queue.min_offset)
                if first is not None and first.commitlog_offset >= log.min_offset:
                    report.problem(
                        f"consume queue {queue.topic}/{queue.queue_id} has units but the commit log has no record for it"
                    )
        _check_consumer_offsets(paths.config, queues, report)
        duplicates = 0
        unchecked = 0
        for (key_hash, phy_offset), count in indexed.items():
            if count <= 0:
                continue
            if phy_offset >= report.stop.end_offset:
                unchecked += count
            elif _record_has_key_hash(log, phy_offset, key_hash):
                duplicates += count
            elif phy_offset >= log.min_offset:
                report.problem(
                    f"index entry (hash {key_hash}, commit log offset {phy_offset}) matches no key of a record there"
                )
        if unchecked:
            report.notes.append(
                f"index: {unchecked} entr{'y' if unchecked == 1 else 'ies'} at or past commit log offset "
                f"{report.stop.end_offset}, where the scan stopped, not checked"
            )
        if duplicates:
            report.notes.append(f"index: {duplicates} repeated entr{'y' if duplicates == 1 else 'ies'} (re-indexed after a restart)")
    except Corruption as error:
        report.problem(str(error))
    finally:
        log.close()
        queues.close()
        index.close()
    return report


def _check_consumer_offsets(config_dir: str, queues: ConsumeQueueSet, report: CheckReport) -> None:
    """Every committed offset within its queue's end (0 for a queue without files)."""
    try:
        table = consumer_offsets.read_offsets(config_dir)
    except Corruption as error:
        report.problem(str(error))
        return
    for (topic, group), offsets in sorted(table.items()):
        for queue_id, committed in sorted(offsets.items()):
            queue = queues.find(topic, queue_id)
            end = queue.max_offset if queue is not None else 0
            if committed > end:
                report.problem(
                    f"consumer group {group}: {topic}/{queue_id}: committed offset {committed} is past the queue's end {end} "
                    f"(the writer moves it back to {end} when it starts)"
                )


def _record_has_key_hash(log: CommitLog, offset: int, key_hash: int) -> bool:
    try:
        record = log.read(offset, check_crc=False)
    except (Corruption, NotFound):
        return False
    return any(index_key_hash(key) == key_hash for key in plan_dispatch(record).index_keys)
