"""The offline tools and the store's file layers, on real files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CLEAN, CRASHED, FIXTURE_SIZE_ARGS, FIXTURE_SIZES

from rmqstore.cli.main import main
from rmqstore.common.codec.consumequeue import FILLER, encode_unit
from rmqstore.common.errors import Corruption, NotFound
from rmqstore.common.files.check import check_store
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.consumequeue import UNIT_DTYPE, ConsumeQueue
from rmqstore.common.files.index import IndexFileList


def test_inspect_json_on_apaches_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(CLEAN), "--json", *FIXTURE_SIZE_ARGS]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["abort"] is False and report["lock"] is True
    assert report["sizes"] == {"commitlogFileSize": 524288, "cqFileUnits": 200, "indexSlots": 500, "indexEntries": 1500}
    assert report["commitlog"]["files"] == [
        "00000000000000000000",
        "00000000000000524288",
        "00000000000001048576",
        "00000000000001572864",
    ]
    assert (report["commitlog"]["minOffset"], report["commitlog"]["endOffset"]) == (0, 2089474)
    assert [entry["indexCount"] for entry in report["index"]] == [1500, 1500, 1500, 1350]
    queues = {f"{q['topic']}/{q['queueId']}": (q["minOffset"], q["maxOffset"]) for q in report["consumequeues"]}
    assert queues["TopicTest/3"] == (0, 190) and queues["SCHEDULE_TOPIC_XXXX/1"] == (0, 3)
    assert len(queues) == 14
    assert report["checkpoint"]["indexMsgTimestamp"] == 1795316576449


def test_inspect_text_on_crashed_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(CRASHED), *FIXTURE_SIZE_ARGS]) == 0
    out = capsys.readouterr().out
    assert "abort marker present (last exit was unclean)" in out
    # The third file is Apache's pre-allocated, all-zero next file: the end is in the first two.
    assert "3 file(s) of 524288 B, offsets [0, 840015): end of log at commit log offset 840015" in out
    assert "20261122030320065: 788 entries" in out


def test_check_passes_on_both_apache_stores(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(CLEAN), *FIXTURE_SIZE_ARGS]) == 0
    assert "ok: 2007 records, 1995 consume queue units and 5846 index keys agree" in capsys.readouterr().out
    assert main(["check", str(CRASHED), *FIXTURE_SIZE_ARGS]) == 0
    assert "ok: 795 records, 790 consume queue units and 2287 index keys agree" in capsys.readouterr().out


def test_check_names_a_missing_index_file(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    newest = sorted((clean_copy / "index").iterdir())[-1]
    newest.unlink()
    assert main(["check", str(clean_copy), *FIXTURE_SIZE_ARGS]) == 1
    out = capsys.readouterr().out
    # The first record indexed into the deleted file: its offset is the file's beginPhyOffset.
    assert out.startswith("FAIL: record at commit log offset 1608787: key ")
    assert "is not in the index" in out


def test_check_names_extra_consume_queue_units(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queue = ConsumeQueue(str(clean_copy / "consumequeue"), "TopicTest", 0, 200, writable=True)
    assert queue.max_offset == 146
    queue.append(146, encode_unit(0, 243, 0))
    queue.close()
    report = check_store(str(clean_copy), FIXTURE_SIZES)
    assert not report.ok
    assert report.problems == [
        "consume queue TopicTest/0 has 1 unit(s) past offset 145, the last record of that queue in the commit log"
    ]


def test_check_names_a_missing_consume_queue(clean_copy: Path) -> None:
    shutil.rmtree(clean_copy / "consumequeue" / "OrderTopic" / "2")
    report = check_store(str(clean_copy), FIXTURE_SIZES)
    assert report.problem_count == 157
    assert report.problems[0] == (
        "record at commit log offset 645 (OrderTopic/2 offset 0): consume queue OrderTopic/2 does not exist"
    )


def test_check_names_index_entries_chained_from_the_wrong_slot(clean_copy: Path) -> None:
    """Two slots' heads swapped in an index file: every entry of both chains is then
    reached from a slot its hash does not give, and check names each, in slot order."""
    from rmqstore.common.codec import index as ix

    oldest = sorted((clean_copy / "index").iterdir())[0]
    data = bytearray(oldest.read_bytes())
    slots = FIXTURE_SIZES.index_slots
    heads = np.frombuffer(bytes(data[ix.HEADER_SIZE : ix.HEADER_SIZE + 4 * slots]), dtype=">i4")
    first, second = np.flatnonzero(heads)[:2].tolist()

    def chain(number: int) -> list[tuple[int, int]]:
        numbers = []
        while number > 0:
            key_hash, _, _, prev = ix.ENTRY.unpack_from(data, ix.entry_position(slots, number))
            numbers.append((number, key_hash))
            number = prev
        return numbers

    moved_first, moved_second = chain(int(heads[first])), chain(int(heads[second]))
    ix.SLOT.pack_into(data, ix.HEADER_SIZE + 4 * first, int(heads[second]))
    ix.SLOT.pack_into(data, ix.HEADER_SIZE + 4 * second, int(heads[first]))
    oldest.write_bytes(data)
    report = check_store(str(clean_copy), FIXTURE_SIZES)
    assert report.problems == [
        f"index {oldest.name}: entry {number} (hash {key_hash}) is chained from slot {slot}"
        for slot, moved in ((first, moved_second), (second, moved_first))
        for number, key_hash in moved
    ]


def test_console_script_runs(tmp_path: Path) -> None:
    """The installed `rmqstore` command, as a user runs it."""
    exe = Path(sys.executable).with_name("rmqstore")
    done = subprocess.run(
        [str(exe), "dump", "consumequeue", str(CLEAN), "--topic", "SCHEDULE_TOPIC_XXXX"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(u["queueId"], u["queueOffset"]) for u in lines] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]
    # Delayed messages carry their deliver time as tagsCode: level 1 is 1 s after storing.
    log = CommitLog(str(CLEAN / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        first = log.read(lines[0]["commitLogOffset"])
    finally:
        log.close()
    assert lines[0]["tagsCode"] == first.store_timestamp_ms + 1000


def test_read_outside_the_log_is_not_found() -> None:
    log = CommitLog(str(CLEAN / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        with pytest.raises(NotFound, match="outside"):
            log.read(4 * 524288)
        with pytest.raises(NotFound, match="no record at commit log offset 2089474"):
            log.read(2089474)
        assert log.read(243).topic == "OrderTopic"
    finally:
        log.close()


def test_consume_queue_starting_late_gets_fillers(tmp_path: Path) -> None:
    queue = ConsumeQueue(str(tmp_path), "T", 0, 4, writable=True)
    assert queue.append(6, encode_unit(100, 50, 7))
    assert queue.append(7, encode_unit(150, 50, 7))
    assert queue.append(8, encode_unit(200, 50, 7))
    assert not queue.append(7, encode_unit(150, 50, 7))  # re-dispatch is a no-op
    queue.close()
    files = sorted((tmp_path / "T" / "0").iterdir())
    assert [f.name for f in files] == ["00000000000000000080", "00000000000000000160"]
    assert files[0].read_bytes() == FILLER * 2 + encode_unit(100, 50, 7) + encode_unit(150, 50, 7)
    assert files[1].read_bytes() == encode_unit(200, 50, 7) + bytes(60)
    reader = ConsumeQueue(str(tmp_path), "T", 0, 4)
    try:
        assert (reader.min_offset, reader.max_offset) == (6, 9)
        assert reader.read(5) is None and reader.read(9) is None
        assert reader.read(8) is not None and reader.read(8).commitlog_offset == 200  # type: ignore[union-attr]
        assert [offset for offset, _ in reader.units()] == [6, 7, 8]
    finally:
        reader.close()


def test_append_units_writes_what_appending_one_by_one_writes(tmp_path: Path) -> None:
    """Blocks across files, a queue starting late (fillers), units already there
    (re-dispatch) and a torn unit rewritten: the same files, the same count."""
    steps = [[6, 7, 8, 9, 10, 11, 12], [13], [12, 13, 14], [20]]

    def unit(offset: int) -> bytes:
        return encode_unit(100 * offset, 50, offset % 3)

    def units(offsets: list[int]) -> np.ndarray:
        return np.frombuffer(b"".join(unit(o) for o in offsets), dtype=UNIT_DTYPE)

    counts: dict[str, list[int]] = {"blocks": [], "one_by_one": []}
    for how in counts:
        queue = ConsumeQueue(str(tmp_path / how), "T", 0, 4, writable=True)
        try:
            for offsets in steps[:3]:
                if how == "blocks":
                    counts[how].append(queue.append_units(np.array(offsets, np.int64), units(offsets)))
                else:
                    counts[how].append(sum(queue.append(o, unit(o)) for o in offsets))
            with pytest.raises(Corruption, match="ends at offset 15; cannot write offset 20"):
                if how == "blocks":
                    queue.append_units(np.array(steps[3], np.int64), units(steps[3]))
                else:
                    queue.append(20, unit(20))
        finally:
            queue.close()
    assert counts["blocks"] == counts["one_by_one"] == [7, 1, 1]
    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    assert files(tmp_path / "blocks") == files(tmp_path / "one_by_one")
    assert len(files(tmp_path / "blocks")) == 3
    first = (tmp_path / "blocks" / "T" / "0" / "00000000000000000080").read_bytes()
    assert first == FILLER * 2 + unit(6) + unit(7)


def test_consume_queue_truncation(tmp_path: Path) -> None:
    queue = ConsumeQueue(str(tmp_path), "T", 1, 3, writable=True)
    for n in range(7):
        queue.append(n, encode_unit(n * 100, 100, 0))
    queue.truncate_to_commitlog(300)
    assert queue.max_offset == 3
    assert [f.name for f in sorted((tmp_path / "T" / "1").iterdir())] == ["00000000000000000000"]
    queue.append(3, encode_unit(300, 90, 0))
    queue.close()
    reader = ConsumeQueue(str(tmp_path), "T", 1, 3)
    try:
        assert [(o, u.size) for o, u in reader.units()] == [(0, 100), (1, 100), (2, 100), (3, 90)]
    finally:
        reader.close()


def test_index_reopened_writable_continues_the_chain(tmp_path: Path) -> None:
    """A writer that restarts keeps adding to the newest file and its chains."""
    from rmqstore.common.codec.dispatch import DispatchPlan

    def plan(offset: int, *keys: str) -> DispatchPlan:
        return DispatchPlan("T", 0, 0, offset, 10, 1_700_000_000_000 + offset, 0, True, tuple(f"T#{k}" for k in keys))

    index = IndexFileList(str(tmp_path), 3, 4, writable=True)
    index.build_index(plan(10, "a", "b"))
    index.build_index(plan(20, "a"))
    index.close()
    index = IndexFileList(str(tmp_path), 3, 4, writable=True)
    assert index.build_index(plan(15, "a")) == 0  # below the newest file's end: already indexed
    index.build_index(plan(30, "a", "c"))
    index.close()
    reader = IndexFileList(str(tmp_path), 3, 4)
    try:
        assert len(reader.files) == 2
        assert list(reader.candidates("T", "a")) == [30, 20, 10]
        assert list(reader.candidates("T", "c")) == [30]
        assert list(reader.candidates("T", "zzz")) == []
    finally:
        reader.close()


def test_checkpoint_round_trip_in_place(tmp_path: Path) -> None:
    from rmqstore.common.codec.checkpoint import Checkpoint
    from rmqstore.common.files.checkpoint import read_checkpoint, write_checkpoint

    path = str(tmp_path / "checkpoint")
    assert read_checkpoint(path) is None
    write_checkpoint(path, Checkpoint(1700000000123, 1700000000000, 0))
    write_checkpoint(path, Checkpoint(1700000000999, 1700000000500, 1700000000001))
    data = Path(path).read_bytes()
    assert len(data) == 4096
    assert data[:24].hex().upper() == "0000018BCFE56BE7" "0000018BCFE569F4" "0000018BCFE56801"
    assert read_checkpoint(path) == Checkpoint(1700000000999, 1700000000500, 1700000000001)


def test_short_checkpoint_is_corruption(tmp_path: Path) -> None:
    from rmqstore.common.files.checkpoint import read_checkpoint

    (tmp_path / "checkpoint").write_bytes(bytes(23))
    with pytest.raises(Corruption, match="23 bytes; at least 24"):
        read_checkpoint(str(tmp_path / "checkpoint"))


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_read_only_views_never_write(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every tool and read-only view leaves the store's bytes and mtimes untouched, and a
    write through a read-only mapping is refused."""
    from rmqstore.common.errors import ReadOnly

    before = _snapshot(clean_copy)
    for args in (
        ["dump", "commitlog", str(clean_copy)],
        ["dump", "consumequeue", str(clean_copy)],
        ["inspect", str(clean_copy), *FIXTURE_SIZE_ARGS],
        ["check", str(clean_copy), *FIXTURE_SIZE_ARGS],
    ):
        assert main(args) == 0
    capsys.readouterr()
    log = CommitLog(str(clean_copy / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    index = IndexFileList(str(clean_copy / "index"), 500, 1500)
    queue = ConsumeQueue(str(clean_copy / "consumequeue"), "TopicTest", 0, 200)
    try:
        with pytest.raises(ReadOnly):
            log.files.files[0].write(0, b"x")
        with pytest.raises(ReadOnly):
            index.files[0].mapped.write(0, b"x")
        with pytest.raises(TypeError):
            log.files.files[0].buf[0] = 1  # the exported view itself is read-only
        assert queue.max_offset == 146
    finally:
        log.close()
        index.close()
        queue.close()
    assert _snapshot(clean_copy) == before
