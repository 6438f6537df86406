"""Recovery over simulated power cuts (tests/support/powerloss.py makes the states).

A seeded SYNC workload (several topics, keys, bodies that roll every kind of file) runs
with its syncs recorded; at crash points after acknowledged appends the tool makes crash
states, and over each: the writer recovers, ``check`` is clean, every record kept is
found by every lookup (uniq key, each key, offset msg id, queue offset), and no
acknowledged message is lost. Under ASYNC an acknowledged message may be lost only if it
lies past the last commit log flush before the cut (docs/writer.md). A consumer group
acknowledging under ASYNC: after the cut no committed offset is past its queue's end and
nothing appended after the restart is skipped (docs/rocketmq5.md, "Durable progress").

The stores live on a tmpfs (``memory_fs``): the tool emulates the cuts from the syncs it
records, so what a real disk's syncs cost is not the subject.

``RMQSTORE_POWERLOSS_STATES`` sets the number of states of the slow test (default 1,000).
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.powerloss import Snapshot, recording, write_crash_state
from support.stores import SMALL, check_ok, verify_store

from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.consumer_offsets import read_offsets
from rmqstore.common.files.store import StorePaths
from rmqstore.writer.config import FlushPolicy, WriterConfig
from rmqstore.writer.consumers import ConsumerGroups, TagFilter
from rmqstore.writer.store import AppendResult, Writer
from rmqstore.writer.validate import MessageInput

pytestmark = pytest.mark.crash

TOPICS = ("PowerA", "PowerB", "Power_C")
APPENDS = 150
THOROUGH_EVERY = 12  # appends between the flushes of queues and index (the periodic task)
ASYNC_FLUSH_EVERY = 5  # appends between commit log flushes under ASYNC
SYNCS_BETWEEN_POINTS = 7  # crash points inside operations: one before every 7th sync
SEED = 20_251_125


@dataclass(frozen=True)
class Facts:
    acked: tuple[tuple[MessageInput, AppendResult], ...]
    flushed_offset: int


def workload(root: Path, flush: FlushPolicy, crash_points: int) -> list[Snapshot]:
    rng = random.Random(SEED)
    every = max(APPENDS // crash_points, 1)
    snapshots: list[Snapshot] = []
    acked: list[tuple[MessageInput, AppendResult]] = []
    number = 0
    root.mkdir()
    with recording(str(root)) as recorder:
        syncs_seen = [0]

        def inside() -> None:
            # Every SYNCS_BETWEEN_POINTS-th sync: a cut inside an append or a flush, with
            # only the appends that returned counted as acknowledged.
            syncs_seen[0] += 1
            if syncs_seen[0] % SYNCS_BETWEEN_POINTS == 0:
                recorder.before_sync = None  # the snapshot reads files: no recursion
                snapshots.append(recorder.snapshot(Facts(tuple(acked), writer.flushed_offset)))
                recorder.before_sync = inside

        writer = Writer(WriterConfig(store=str(root), sizes=SMALL, flush=flush))
        recorder.before_sync = inside
        try:
            for step in range(1, APPENDS + 1):
                batch = []
                for _ in range(rng.randint(1, 6)):
                    number += 1
                    batch.append(
                        MessageInput(
                            topic=rng.choice(TOPICS),
                            body=rng.randbytes(rng.randint(0, 1500)),
                            keys=[f"key-{number}", rng.choice(("shared-1", "shared-2"))][: rng.randint(1, 2)],
                            tags=rng.choice(("", "TagA")),
                            uniq_key=f"PL{number:030X}",
                        )
                    )
                acked.extend(zip(batch, writer.append(batch)))
                if flush is FlushPolicy.ASYNC and step % ASYNC_FLUSH_EVERY == 0:
                    writer.flush()
                if step % THOROUGH_EVERY == 0:
                    writer.flush_thoroughly()
                if step % every == 0:
                    recorder.before_sync = None
                    snapshots.append(recorder.snapshot(Facts(tuple(acked), writer.flushed_offset)))
                    recorder.before_sync = inside
        finally:
            recorder.before_sync = None
            writer.close()
    assert recorder.syncs > APPENDS // THOROUGH_EVERY
    # Points after acks and inside operations, in workload order: take crash_points of
    # them spread evenly.
    assert len(snapshots) >= crash_points, len(snapshots)
    stride = len(snapshots) / crash_points
    return [snapshots[int(i * stride)] for i in range(crash_points)]


def recover_and_check(state: Path, flush: FlushPolicy, facts: Facts, label: str) -> int:
    """Recover the state, check it, look every record up; returns the acknowledged
    messages lost (which must be none under SYNC, and lie past the flushed offset under
    ASYNC)."""
    # Restarted after the power cut: another boot of the machine.
    writer = Writer(WriterConfig(store=str(state), sizes=SMALL, flush=flush, boot_id="the-boot-after-the-cut"))
    writer.close()
    check_ok(state)
    verify_store(state)
    log = CommitLog(StorePaths(str(state)).commitlog, SMALL.commitlog_file_size_bytes)
    try:
        present = {record.uniq_key: record.commitlog_offset for record in log.records()}
    finally:
        log.close()
    lost = 0
    for message, result in facts.acked:
        if present.get(message.uniq_key) == result.commitlog_offset:
            continue
        assert message.uniq_key not in present, f"{label}: {message.uniq_key} moved"
        assert flush is FlushPolicy.ASYNC, f"{label}: acknowledged {message.uniq_key} at {result.commitlog_offset} lost"
        assert result.commitlog_offset >= facts.flushed_offset, (
            f"{label}: {message.uniq_key} at {result.commitlog_offset} lost, below the flushed offset {facts.flushed_offset}"
        )
        lost += 1
    return lost


def run(tmp_path: Path, flush: FlushPolicy, crash_points: int, states_per_point: int) -> tuple[int, int, int]:
    snapshots = workload(tmp_path / "live", flush, crash_points)
    assert len(snapshots) == crash_points, len(snapshots)
    rng = random.Random(SEED + 1)
    states = lost = dropped_entries = 0  # entries missing and pages old, over all states
    for point, snapshot in enumerate(snapshots):
        for number in range(states_per_point):
            state = tmp_path / "state"
            dropped = write_crash_state(snapshot, str(state), rng)
            dropped_entries += dropped["entries"] + dropped["old_pages"]
            lost += recover_and_check(state, flush, snapshot.facts, f"{flush.value} point {point} state {number}")
            shutil.rmtree(state)
            states += 1
    return states, lost, dropped_entries


def test_power_loss_sync_smoke(memory_fs: Path) -> None:
    states, lost, dropped = run(memory_fs, FlushPolicy.SYNC, 6, 5)
    assert (states, lost) == (30, 0)
    assert dropped > 0  # the states really differ from the live store


def test_power_loss_async_smoke(memory_fs: Path) -> None:
    states, _, _ = run(memory_fs, FlushPolicy.ASYNC, 6, 5)
    assert states == 30


@pytest.mark.slow
def test_power_loss_sync_1000_states(memory_fs: Path) -> None:
    total = int(os.environ.get("RMQSTORE_POWERLOSS_STATES", "1000"))
    points = 40
    per_point = -(-total // points)
    states, lost, _ = run(memory_fs, FlushPolicy.SYNC, points, per_point)
    print(f"power loss, SYNC: {states} crash states, {lost} acknowledged messages lost")
    assert states >= total and lost == 0


# Consumer groups over power cuts (issue 40): under ASYNC a group may acknowledge, and
# durably commit, messages whose commit log bytes a cut then loses.

GROUP = "power-group"
GROUP_TOPIC = "PowerG"
GROUP_STEPS = 60
GROUP_QUEUES = [0, 1, 2, 3]


def group_workload(root: Path, crash_points: int) -> list[Snapshot]:
    """Appends under ASYNC, a group receiving and acknowledging each at once and flushing
    its offsets (fsynced) every step, the commit log flushed every ASYNC_FLUSH_EVERY steps:
    the offsets run ahead of the durable log between flushes."""
    rng = random.Random(SEED + 2)
    snapshots: list[Snapshot] = []
    root.mkdir()
    with recording(str(root)) as recorder:
        writer = Writer(WriterConfig(store=str(root), sizes=SMALL, flush=FlushPolicy.ASYNC))
        groups = ConsumerGroups(writer, writer.paths.config)
        try:
            number = 0
            for step in range(1, GROUP_STEPS + 1):
                batch = []
                for _ in range(rng.randint(1, 6)):
                    number += 1
                    batch.append(MessageInput(topic=GROUP_TOPIC, body=rng.randbytes(rng.randint(1, 800)), uniq_key=f"PG{number:030X}"))
                writer.append(batch)
                handed, _ = groups.receive(GROUP, GROUP_TOPIC, GROUP_QUEUES, 1024, 60_000, TagFilter(None))
                for one in handed:
                    groups.ack(GROUP, GROUP_TOPIC, one.receipt_handle)
                groups.flush()
                if step % ASYNC_FLUSH_EVERY == 0:
                    writer.flush()
                if step % THOROUGH_EVERY == 0:
                    writer.flush_thoroughly()
                if step % ASYNC_FLUSH_EVERY == ASYNC_FLUSH_EVERY - 1:  # the log's last flush three steps back
                    snapshots.append(recorder.snapshot())
        finally:
            writer.close()
    stride = len(snapshots) / crash_points
    return [snapshots[int(i * stride)] for i in range(crash_points)]


def test_power_loss_async_consumer_offsets_are_moved_back_and_nothing_after_is_skipped(memory_fs: Path) -> None:
    """Over crash states of the workload above: after recovery no committed offset is past
    its queue's end, and every message appended after the restart is handed to the group
    (before the fix, those landing below an offset the cut left too high never were);
    check is clean once the group's corrected offsets are written."""
    snapshots = group_workload(memory_fs / "live", 6)
    rng = random.Random(SEED + 3)
    corrected_states = 0
    for point, snapshot in enumerate(snapshots):
        for number in range(5):
            state = memory_fs / "state"
            write_crash_state(snapshot, str(state), rng)
            writer = Writer(WriterConfig(store=str(state), sizes=SMALL, flush=FlushPolicy.ASYNC, boot_id="the-boot-after-the-cut"))
            try:
                table = read_offsets(str(state / "config"))
                ends = {q: (writer.queues.find(GROUP_TOPIC, q).max_offset if writer.queues.find(GROUP_TOPIC, q) else 0) for q in GROUP_QUEUES}
                corrected_states += any(c > ends[q] for q, c in table.get((GROUP_TOPIC, GROUP), {}).items())
                groups = ConsumerGroups(writer, writer.paths.config)
                for q in GROUP_QUEUES:
                    assert groups.committed(GROUP, GROUP_TOPIC, q) <= ends[q], (point, number, q)
                # What the group has not acknowledged before the cut may come again (at
                # least once); every message appended now must come.
                new = [MessageInput(topic=GROUP_TOPIC, body=b"after", uniq_key=f"AF{point:04X}{number:04X}{i:022X}") for i in range(12)]
                writer.append(new)
                handed, _ = groups.receive(GROUP, GROUP_TOPIC, GROUP_QUEUES, 1024, 60_000, TagFilter(None))
                got = {writer.log.read(one.commitlog_offset).uniq_key for one in handed}
                assert {m.uniq_key for m in new} <= got, f"point {point} state {number}: {len({m.uniq_key for m in new} - got)} skipped"
                groups.flush()
            finally:
                writer.close()
            check_ok(state)
            shutil.rmtree(state)
    # The states really held offsets past the durable ends (the case under test).
    assert corrected_states > 0
