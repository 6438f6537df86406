"""A rejoining replica's truncation over simulated power cuts (tests/support/powerloss.py
makes the states): the bug Apache's tracker has (apache/rocketmq#10666: a slave's
truncation after a master switch reset positions in memory only, and a crash brought the
stale tail back) must be impossible here.

A former primary holds records its group never acknowledged (the tail); it truncates at
the consistent point (Writer.truncate_replica) and takes the new primary's bytes
(Writer.replicate), its syncs recorded. At crash points inside the truncation, after it,
and inside the replication that follows, crash states are made; over each the replica
restarts (recovery, after another boot) and, as a rejoin does, cuts at the consistent
point again: no record of the tail is ever found, the log is the new primary's byte for
byte up to its end, ``check`` is clean and every record is found by every lookup.

``RMQSTORE_REJOIN_POWERLOSS_STATES`` sets the number of states (default 500).
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from support.powerloss import Snapshot, recording, write_crash_state
from support.stores import SMALL, check_ok, verify_store

from rmqstore.common.files.commitlog import CommitLog
from rmqstore.writer.config import FlushPolicy, WriterConfig
from rmqstore.writer.replication.service import chunk_end
from rmqstore.writer.store import Writer
from rmqstore.writer.validate import MessageInput

pytestmark = pytest.mark.crash

SEED = 20_261_129
STATES = int(os.environ.get("RMQSTORE_REJOIN_POWERLOSS_STATES", "500"))
STATES_PER_POINT = 5


def _messages(rng: random.Random, prefix: str, count: int) -> list[MessageInput]:
    return [
        MessageInput(
            topic=rng.choice(("RejoinA", "RejoinB")),
            body=rng.randbytes(rng.randint(10, 900)),
            keys=[f"{prefix}-{n}", "shared"][: rng.randint(1, 2)],
            tags=rng.choice(("", "TagA")),
            uniq_key=f"{prefix}{n:030X}",
        )
        for n in range(count)
    ]


def _append(writer: Writer, messages: list[MessageInput], rng: random.Random) -> None:
    at = 0
    while at < len(messages):
        step = rng.randint(1, 8)
        writer.append(messages[at : at + step])
        at += step


def _log_bytes(root: Path) -> bytes:
    """The commit log's bytes in offset order (its files joined)."""
    files = sorted((root / "commitlog").iterdir())
    return b"".join(path.read_bytes() for path in files)


def test_no_crash_state_of_a_rejoin_brings_a_truncated_record_back(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    primary_root, replica_root = tmp_path / "primary", tmp_path / "replica"
    config = {"sizes": SMALL, "flush": FlushPolicy.SYNC}
    # The shared history, then each side's own: the replica's tail (never acknowledged by
    # the group) and the new primary's records from the same offset on.
    primary = Writer(WriterConfig(store=str(primary_root), **config))
    _append(primary, _messages(rng, "SHARED", 120), rng)
    primary.close()
    shutil.copytree(primary_root, replica_root)
    cut = CommitLog(str(primary_root / "commitlog"), SMALL.commitlog_file_size_bytes, writable=True)
    cut_offset = cut.recover_write_position().end_offset
    cut.close()
    replica = Writer(WriterConfig(store=str(replica_root), **config))
    tail = _messages(rng, "TAIL", 150)
    _append(replica, tail, rng)
    replica.flush_thoroughly()
    replica.close()
    primary = Writer(WriterConfig(store=str(primary_root), **config))
    _append(primary, _messages(rng, "NEW", 150), rng)
    primary.flush_thoroughly()
    new_end = primary.log.write_offset or 0
    tail_keys = {m.uniq_key for m in tail}

    snapshots: list[tuple[Snapshot, str]] = []
    with recording(str(replica_root)) as recorder:
        # Everything there was synced by the close: the crash states start from it.
        for directory, _, names in os.walk(replica_root):
            recorder.record_path(directory)
            for name in names:
                recorder.record_path(os.path.join(directory, name))
        phase = ["truncating"]

        def inside() -> None:
            recorder.before_sync = None  # the snapshot reads files: no recursion
            snapshots.append((recorder.snapshot(), phase[0]))
            recorder.before_sync = inside

        replica = Writer(WriterConfig(store=str(replica_root), **config))
        try:
            recorder.before_sync = inside
            replica.truncate_replica(cut_offset)
            phase[0] = "following"
            recorder.before_sync = None
            snapshots.append((recorder.snapshot(), phase[0]))
            recorder.before_sync = inside
            offset = cut_offset
            while offset < new_end:
                stop = chunk_end(primary.log, offset, new_end)
                mapped = primary.log.files.find(offset)
                assert mapped is not None
                replica.replicate(offset, bytes(mapped.buf[offset - mapped.start_offset : stop - mapped.start_offset]))
                offset = stop
        finally:
            recorder.before_sync = None
            replica.close()
    primary.close()
    assert {phase for _, phase in snapshots} == {"truncating", "following"}
    points = max(STATES // STATES_PER_POINT, 1)
    stride = len(snapshots) / points
    chosen = [snapshots[int(i * stride)] for i in range(min(points, len(snapshots)))]
    reference = _log_bytes(primary_root)
    states = 0
    for point, (snapshot, phase) in enumerate(chosen):
        for number in range(STATES_PER_POINT):
            state = tmp_path / "state"
            write_crash_state(snapshot, str(state), rng)
            label = f"point {point} ({phase}) state {number}"
            restarted = Writer(WriterConfig(store=str(state), boot_id="the-boot-after-the-cut", **config))
            # The rejoin's first step: cut at the consistent point again (a no-op once done).
            restarted.truncate_replica(min(cut_offset, restarted.log.write_offset or 0))
            end = restarted.log.write_offset or 0
            restarted.close()
            check_ok(state)
            verify_store(state)
            log = CommitLog(str(state / "commitlog"), SMALL.commitlog_file_size_bytes)
            try:
                back = {record.uniq_key for record in log.records()} & tail_keys
            finally:
                log.close()
            assert not back, f"{label}: truncated records came back: {sorted(back)[:3]}"
            assert _log_bytes(state)[:end] == reference[:end], f"{label}: the log is not the primary's up to {end}"
            shutil.rmtree(state)
            states += 1
    assert states >= min(STATES, len(snapshots) * STATES_PER_POINT)
