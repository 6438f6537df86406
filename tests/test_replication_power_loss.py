"""A rejoining replica's truncation over simulated power cuts (tests/support/powerloss.py
makes the states): the bug Apache's tracker has (apache/rocketmq#10666: a slave's
truncation after a master switch reset positions in memory only, and a crash brought the
stale tail back) must be impossible here.

A former primary holds records its group never acknowledged (the tail); it truncates at
the consistent point (Writer.truncate_replica) and takes the new primary's bytes
(Writer.write_replicated, sync_replicated, dispatch_replicated), its syncs recorded. At
crash points inside the truncation, after it, and inside the replication that follows,
crash states are made; over each the replica restarts (recovery, after another boot) and, as a rejoin does, cuts at the consistent
point again: no record of the tail is ever found, the log is the new primary's byte for
byte up to its end, ``check`` is clean and every record is found by every lookup.

``RMQSTORE_REJOIN_POWERLOSS_STATES`` sets the number of states (default 500);
``RMQSTORE_REPORT_POWERLOSS_POINTS`` the reports a follower is cut at (default 12).
"""

from __future__ import annotations

import os
import random
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from support.powerloss import Snapshot, recording, write_crash_state
from support.stores import SMALL, check_ok, verify_store

from rmqstore.common.codec.dispatch import SMALL_BATCH_RECORDS
from rmqstore.common.errors import Corruption
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.writer.config import FlushPolicy, WriterConfig
from rmqstore.writer.replication.service import chunk_end
from rmqstore.writer.store import REPLICATED_SINGLY_MAX, Writer
from rmqstore.writer.validate import MessageInput

pytestmark = pytest.mark.crash

SEED = 20_261_129
STATES = int(os.environ.get("RMQSTORE_REJOIN_POWERLOSS_STATES", "500"))
STATES_PER_POINT = 5
# Reports a follower is cut at (before their dispatch), each with a kill and two power cuts.
REPORT_POINTS = int(os.environ.get("RMQSTORE_REPORT_POWERLOSS_POINTS", "12"))


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
                replica.write_replicated(offset, bytes(mapped.buf[offset - mapped.start_offset : stop - mapped.start_offset]))
                replica.sync_replicated()
                replica.dispatch_replicated()
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


def _kill_state(snapshot: Snapshot) -> Snapshot:
    """The state a killed process leaves (the page cache whole): every file as it is."""
    return Snapshot(snapshot.files, snapshot.listings, snapshot.files, snapshot.listings)


def test_a_follower_cut_between_its_report_and_its_dispatch_keeps_every_reported_record(tmp_path: Path) -> None:
    """A follower reports the bytes stored once written and synced, and dispatches them
    after (writer.replication.follower). Crash states taken at each report, before the
    dispatch (a kill: the page cache whole; a power cut: any unsynced page old or new):
    after recovery every reported byte is there, and once the follower has taken the
    rest, its commit log, consume queues and index files are the primary's byte for byte
    (the index files' names aside)."""
    rng = random.Random(SEED + 1)
    primary_root, replica_root = tmp_path / "primary", tmp_path / "replica"
    config = {"sizes": SMALL, "flush": FlushPolicy.SYNC}
    primary = Writer(WriterConfig(store=str(primary_root), **config))
    _append(primary, _messages(rng, "P", 400), rng)
    primary.flush_thoroughly()
    end = primary.log.write_offset or 0
    boundaries = [record.commitlog_offset + record.size for record in primary.log.records()]
    Writer(WriterConfig(store=str(replica_root), **config)).close()

    def chunk(offset: int) -> tuple[int, bytes]:
        """Bytes from ``offset`` to a record boundary a few records on (as the primary sends)."""
        later = [b for b in boundaries if b > offset]
        stop = chunk_end(primary.log, offset, later[min(rng.randint(0, 7), len(later) - 1)])
        mapped = primary.log.files.find(offset)
        assert mapped is not None
        return stop, bytes(mapped.buf[offset - mapped.start_offset : stop - mapped.start_offset])

    def follow(replica: Writer, on_report: Callable[[int], None] | None = None) -> None:
        offset = replica.log.write_offset or 0
        while offset < end:
            stop, data = chunk(offset)
            replica.write_replicated(offset, data)
            offset = stop
            reported = replica.sync_replicated()
            assert reported == offset
            if on_report is not None:
                on_report(reported)
            replica.dispatch_replicated()
            if rng.random() < 0.25:
                replica.flush_thoroughly()  # the periodic flush: queues, index, durable offset

    snapshots: list[tuple[Snapshot, int]] = []
    with recording(str(replica_root)) as recorder:
        for directory, _, names in os.walk(replica_root):
            recorder.record_path(directory)
            for name in names:
                recorder.record_path(os.path.join(directory, name))
        replica = Writer(WriterConfig(store=str(replica_root), **config))
        try:
            follow(replica, lambda reported: snapshots.append((recorder.snapshot(), reported)))
        finally:
            replica.close()
    assert len(snapshots) > 40
    reference = _log_bytes(primary_root)
    expected = {name: data for name, data in _store_files(primary_root).items() if not name.startswith("commitlog")}
    points = REPORT_POINTS
    stride = len(snapshots) / points
    states = 0
    for point in range(min(points, len(snapshots))):
        snapshot, reported = snapshots[int(point * stride)]
        for number in range(3):
            killed = number == 0
            state = tmp_path / "state"
            write_crash_state(_kill_state(snapshot) if killed else snapshot, str(state), rng)
            label = f"report at {reported}, {'kill' if killed else 'power cut'} state {number}"
            boot = None if killed else "the-boot-after-the-cut"
            restarted = Writer(WriterConfig(store=str(state), boot_id=boot, **config))
            recovered = restarted.log.write_offset or 0
            restarted.close()
            assert recovered >= reported, f"{label}: recovery ends at {recovered}, before the reported {reported}"
            assert _log_bytes(state)[:recovered] == reference[:recovered], f"{label}: the log is not the primary's"
            # Recovery dispatched what the crash left undispatched: each consume queue is
            # the primary's up to the recovered end, and every record is found.
            check_ok(state)
            verify_store(state)
            for name, data in _store_files(state).items():
                if name.startswith("consumequeue"):
                    units = expected[name]
                    kept = next((at for at in range(0, len(units), CQ_UNIT) if _unit_offset(units, at) >= recovered or not any(units[at : at + CQ_UNIT])), len(units))
                    assert data == units[:kept].ljust(len(data), b"\x00"), f"{label}: {name} after recovery"
            restarted = Writer(WriterConfig(store=str(state), boot_id=boot, **config))
            try:
                follow(restarted)
            finally:
                restarted.close()
            check_ok(state)
            verify_store(state)
            files = _store_files(state)
            assert _log_bytes(state)[:end] == reference[:end], label
            queues = {name: data for name, data in files.items() if name.startswith("consumequeue")}
            assert queues == {name: data for name, data in expected.items() if name.startswith("consumequeue")}, label
            # An index file is named by the time of the record whose keys rolled it over,
            # which depends on how the records were batched (a recovery after a power cut
            # dispatches them in one scan): the files' bytes, in order, are the primary's.
            indexes = [data for name, data in sorted(files.items()) if name.startswith("index")]
            assert indexes == [data for name, data in sorted(expected.items()) if name.startswith("index")], label
            shutil.rmtree(state)
            states += 1
    assert states == 3 * min(points, len(snapshots))


def _store_files(root: Path) -> dict[str, bytes]:
    """The commit log, consume queue and index files of a store, by relative path."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for part in ("commitlog", "consumequeue", "index")
        for path in sorted((root / part).rglob("*"))
        if path.is_file()
    }


CQ_UNIT = 20  # a consume queue unit: commit log offset (8 bytes), size (4), tags code (8)


def _unit_offset(units: bytes, at: int) -> int:
    return int.from_bytes(units[at : at + 8], "big")


@pytest.mark.parametrize(
    "records", [1, 5, 12, 40], ids=["one-record", "a-record-at-a-time", "dispatched-as-a-batch", "in-columns"]
)
def test_a_corrupt_chunk_is_refused_and_the_good_bytes_make_the_same_store(tmp_path: Path, records: int) -> None:
    """A follower decodes what its primary streams before reporting it stored: a record at
    a time for a chunk of a few (REPLICATED_SINGLY_MAX), in columns for more; the records
    decoded one by one are dispatched one by one below SMALL_BATCH_RECORDS, as one batch
    from it. On each path a chunk with one flipped body byte is refused with Corruption,
    nothing of it stays in the log, and the same chunk unharmed then gives files
    byte-identical to the primary's."""
    rng = random.Random(SEED + records)
    config = {"sizes": SMALL, "flush": FlushPolicy.SYNC}
    primary = Writer(WriterConfig(store=str(tmp_path / "primary"), **config))
    _append(primary, _messages(rng, "P", records), rng)
    end = primary.log.write_offset
    mapped = primary.log.files.find(0)
    assert mapped is not None and end < mapped.end_offset  # one file, one chunk
    assert (records <= REPLICATED_SINGLY_MAX) == (records < 40)
    assert (records >= SMALL_BATCH_RECORDS) == (records >= 12)
    good = bytes(mapped.buf[:end])
    last = list(primary.log.records(0))[-1]
    primary.close()
    bad = bytearray(good)
    bad[good.rindex(last.body)] ^= 0xFF  # the last record's body: its CRC no longer matches
    replica = Writer(WriterConfig(store=str(tmp_path / "replica"), **config))
    try:
        with pytest.raises(Corruption) as refused:
            replica.write_replicated(0, bytes(bad))
        at, flipped = last.commitlog_offset, bytes(bad[good.rindex(last.body) :][: len(last.body)])
        assert str(refused.value) == (
            f"replicated bytes at 0 do not decode: corruption at commit log offset {at}: body CRC mismatch at commit log "
            f"offset {at}: stored {last.body_crc:08X}, computed {zlib.crc32(flipped) & 0x7FFFFFFF:08X} ({end - at} bytes after it)"
        )
        assert replica.log.write_offset == 0
        replica.dispatch_replicated()
        assert replica.write_replicated(0, good) == end
        replica.sync_replicated()
        replica.dispatch_replicated()
    finally:
        replica.close()
    assert _store_files(tmp_path / "replica") == _store_files(tmp_path / "primary")
    check_ok(tmp_path / "replica")
