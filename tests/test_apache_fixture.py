"""Byte compatibility against the stores Apache RocketMQ 4.9.4 wrote (tests/fixtures)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import CLEAN, CRASHED, FIXTURE_SIZE_ARGS, FIXTURE_SIZES, FIXTURES, read_jsonl

from rmqstore.cli.main import main
from rmqstore.common.codec.record import Record, encode_record
from rmqstore.common.files.checkpoint import read_checkpoint
from rmqstore.common.files.commitlog import CommitLog, StopReason
from rmqstore.common.files.consumequeue import Boundary, ConsumeQueueSet
from rmqstore.common.files.index import MAX_MSGS_NUM_BATCH, IndexFileList
from rmqstore.common.files.store import StorePaths, reindex

STORES = {
    "clean": (CLEAN, FIXTURES / "store-clean-commitlog-dump.jsonl", FIXTURES / "store-clean-consumequeue-dump.jsonl"),
    "crashed": (
        CRASHED,
        FIXTURES / "store-crashed-recovered-commitlog-dump.jsonl",
        FIXTURES / "store-crashed-recovered-consumequeue-dump.jsonl",
    ),
}


def all_records(store: Path) -> list[Record]:
    log = CommitLog(str(store / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        return list(log.records())
    finally:
        log.close()


@pytest.mark.parametrize("name", sorted(STORES))
def test_dump_commitlog_equals_apache(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    store, expected_path, _ = STORES[name]
    assert main(["dump", "commitlog", str(store)]) == 0
    ours = capsys.readouterr().out.splitlines()
    theirs = expected_path.read_text(encoding="utf-8").splitlines()
    assert len(ours) == len(theirs) == {"clean": 2007, "crashed": 795}[name]
    for mine, apache in zip(ours, theirs):
        assert json.loads(mine) == json.loads(apache)
        assert mine == apache  # same value formats, same field order


@pytest.mark.parametrize("name", sorted(STORES))
def test_dump_consumequeue_equals_apache(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    store, _, expected_path = STORES[name]
    assert main(["dump", "consumequeue", str(store)]) == 0
    ours = capsys.readouterr().out.splitlines()
    theirs = expected_path.read_text(encoding="utf-8").splitlines()
    assert len(ours) == len(theirs) == {"clean": 1995, "crashed": 790}[name]
    assert ours == theirs


@pytest.mark.parametrize("store", [CLEAN, CRASHED], ids=["clean", "crashed"])
def test_reencoding_gives_the_bytes_on_disk(store: Path) -> None:
    log = CommitLog(str(store / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        count = 0
        for record in log.records():
            mapped = log.files.find(record.commitlog_offset)
            assert mapped is not None
            position = record.commitlog_offset - mapped.start_offset
            assert encode_record(record) == bytes(mapped.buf[position : position + record.size])
            count += 1
        assert count == {CLEAN: 2007, CRASHED: 795}[store]
    finally:
        log.close()


@pytest.mark.parametrize("store", [CLEAN, CRASHED], ids=["clean", "crashed"])
def test_written_commitlog_files_are_apaches(store: Path, tmp_path: Path) -> None:
    """Append the decoded records, one by one, to a new log: every file, blank end-of-file
    records and zero tails included, is byte-identical to Apache's."""
    records = all_records(store)
    log = CommitLog(str(tmp_path / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes, writable=True)
    log.set_write_position(0)
    for record in records:
        [offset] = log.append([bytearray(encode_record(record))], [record.queue_offset])
        assert offset == record.commitlog_offset
    log.flush()
    log.close()
    ours = sorted(os.listdir(tmp_path / "commitlog"))
    theirs = sorted(os.listdir(store / "commitlog"))
    # Apache pre-allocates the next, all-zero file; we create files when data needs them.
    assert theirs[: len(ours)] == ours
    for extra in theirs[len(ours) :]:
        assert not any((store / "commitlog" / extra).read_bytes())
    for name in ours:
        assert (tmp_path / "commitlog" / name).read_bytes() == (store / "commitlog" / name).read_bytes(), name


def test_blank_records_at_apaches_file_ends() -> None:
    log = CommitLog(str(CLEAN / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        blanks = []
        for mapped in list(log.files)[:-1]:
            records_in_file = [r for r in log.records(mapped.start_offset, stop=mapped.end_offset)]
            end = records_in_file[-1].next_offset - mapped.start_offset
            size = int.from_bytes(mapped.buf[end : end + 4], "big")
            assert bytes(mapped.buf[end + 4 : end + 8]).hex().upper() == "CBD43194"
            assert end + size == mapped.file_size_bytes
            blanks.append(size)
        assert blanks == [141, 66, 2035]  # fixtures README
    finally:
        log.close()


def _same_tree_bytes(ours: Path, theirs: Path) -> int:
    compared = 0
    for dirpath, _, names in os.walk(theirs):
        for name in names:
            apache = Path(dirpath) / name
            mine = ours / apache.relative_to(theirs)
            assert mine.read_bytes() == apache.read_bytes(), str(apache)
            compared += 1
    ours_count = sum(len(names) for _, _, names in os.walk(ours))
    assert ours_count == compared
    return compared


def test_reindex_is_byte_identical(tmp_path: Path) -> None:
    result = reindex(str(CLEAN), str(tmp_path), FIXTURE_SIZES)
    assert result.records == 2007
    assert result.stop.reason is StopReason.END and result.stop.end_offset == 2_089_474
    assert _same_tree_bytes(tmp_path / "consumequeue", CLEAN / "consumequeue") == 14
    ours = sorted(os.listdir(tmp_path / "index"))
    theirs = sorted(os.listdir(CLEAN / "index"))
    assert len(ours) == len(theirs) == 4
    for mine, apache in zip(ours, theirs):
        assert (tmp_path / "index" / mine).read_bytes() == (CLEAN / "index" / apache).read_bytes()


def test_reindex_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = ["reindex", str(CLEAN), "--out", str(out), "--cq-file-units", "200", *FIXTURE_SIZE_ARGS]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == {"records": 2007, "endOffset": 2089474, "stop": "end"}
    _same_tree_bytes(out / "consumequeue", CLEAN / "consumequeue")
    theirs = [(CLEAN / "index" / n).read_bytes() for n in sorted(os.listdir(CLEAN / "index"))]
    assert [(out / "index" / n).read_bytes() for n in sorted(os.listdir(out / "index"))] == theirs
    # A second run refuses to mix with existing output.
    assert main(args) == 2
    assert "already exists and is not empty" in capsys.readouterr().err


def test_reindex_with_other_geometry_still_finds_everything(tmp_path: Path) -> None:
    """Smaller files than Apache's: more rollovers, same answers."""
    from rmqstore.common.files.store import StoreSizes

    sizes = StoreSizes(FIXTURE_SIZES.commitlog_file_size_bytes, cq_file_units=7, index_slots=11, index_entries=50)
    reindex(str(CLEAN), str(tmp_path), sizes)
    index = IndexFileList(str(tmp_path / "index"), 11, 50)
    queues = ConsumeQueueSet(str(tmp_path / "consumequeue"), 7)
    try:
        assert len(index.files) > 100
        for line in read_jsonl(FIXTURES / "manifest.jsonl")[:300]:
            topic = line["storedTopic"]
            assert line["commitLogOffset"] in set(index.candidates(topic, line["uniqKey"]))
            if line["tranType"] in ("NOT", "COMMIT"):
                unit = queues.get(topic, line["storedQueueId"]).read(line["queueOffset"])
                assert unit is not None and unit.commitlog_offset == line["commitLogOffset"]
    finally:
        index.close()
        queues.close()


QUERY_LINES = [q for q in read_jsonl(FIXTURES / "queries.jsonl") if q["kind"] == "queryMessage"]


@pytest.mark.parametrize("query", QUERY_LINES, ids=[q["why"] for q in QUERY_LINES])
def test_index_query_offsets_equal_apaches(query: dict) -> None:
    index = IndexFileList(str(CLEAN / "index"), FIXTURE_SIZES.index_slots, FIXTURE_SIZES.index_entries)
    try:
        result = index.query_offsets(
            query["topic"], query["key"], min(query["maxNum"], MAX_MSGS_NUM_BATCH), query["begin"], query["end"]
        )
    finally:
        index.close()
    assert result.phy_offsets == query["indexService.queryOffset.phyOffsets"]
    assert result.index_last_update_timestamp_ms == query["indexService.queryOffset.indexLastUpdateTimestamp"]
    assert result.index_last_update_phy_offset == query["indexService.queryOffset.indexLastUpdatePhyoffset"]


def test_there_are_21_key_queries() -> None:
    assert len(QUERY_LINES) == 21


def test_queue_bounds_equal_apaches_summary() -> None:
    summary = json.loads((FIXTURES / "store-clean-summary.json").read_text())
    queues = ConsumeQueueSet(str(CLEAN / "consumequeue"), FIXTURE_SIZES.cq_file_units)
    try:
        checked = 0
        for name, bounds in summary["queues"].items():
            topic, queue_id = name.rsplit("/", 1)
            queue = queues.find(topic, int(queue_id))
            if bounds["maxPhysicOffset"] == -1:
                assert queue is None or queue.max_offset == 0
                continue
            assert queue is not None
            assert (queue.min_offset, queue.max_offset) == (bounds["minOffsetInQueue"], bounds["maxOffsetInQueue"])
            assert queue.max_commitlog_end == bounds["maxPhysicOffset"]
            checked += 1
        assert checked == 14
    finally:
        queues.close()


def test_checkpoints_read_as_apache_read_them() -> None:
    summary = json.loads((FIXTURES / "store-clean-summary.json").read_text())
    clean = read_checkpoint(str(CLEAN / "checkpoint"))
    assert clean is not None
    assert (clean.physic_msg_timestamp_ms, clean.logics_msg_timestamp_ms, clean.index_msg_timestamp_ms) == (
        summary["checkpoint.physicMsgTimestamp"],
        summary["checkpoint.logicsMsgTimestamp"],
        summary["checkpoint.indexMsgTimestamp"],
    )
    preload = json.loads((FIXTURES / "store-crashed-recovered-preload.json").read_text())
    crashed = read_checkpoint(str(CRASHED / "checkpoint"))
    assert crashed is not None
    assert crashed.physic_msg_timestamp_ms == preload["physicMsgTimestamp"]
    assert crashed.logics_msg_timestamp_ms == preload["logicsMsgTimestamp"]
    assert crashed.index_msg_timestamp_ms == preload["indexMsgTimestamp"]
    assert crashed.min_timestamp_ms == preload["minTimestamp"]
    assert crashed.min_timestamp_index_ms == preload["minTimestampIndex"]
    assert os.path.exists(StorePaths(str(CRASHED)).abort)


def test_commitlog_end_equals_apaches_max_phy_offset() -> None:
    for store, summary_name in ((CLEAN, "store-clean-summary.json"), (CRASHED, "store-crashed-recovered-summary.json")):
        summary = json.loads((FIXTURES / summary_name).read_text())
        log = CommitLog(str(store / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
        try:
            stop = log.scan()
        finally:
            log.close()
        assert stop.reason is StopReason.END
        assert (log.min_offset, stop.end_offset) == (summary["minPhyOffset"], summary["maxPhyOffset"])


TIME_LINES = [q for q in read_jsonl(FIXTURES / "queries.jsonl") if q["kind"] == "getOffsetInQueueByTime"]


@pytest.mark.parametrize("query", TIME_LINES, ids=[q["why"] for q in TIME_LINES])
def test_offset_by_time_bounds_bracket_apaches_answer(query: dict) -> None:
    """Apache returns the entry *nearest* to t (docs/format.md §6.4); our LOWER and UPPER are
    exact bounds from record times, so Apache's answer is one of them (its "after the
    last message" answer, max − 1, is UPPER), and each bound is right by brute force."""
    log = CommitLog(str(CLEAN / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    queues = ConsumeQueueSet(str(CLEAN / "consumequeue"), FIXTURE_SIZES.cq_file_units)
    try:
        queue = queues.find(query["topic"], query["queueId"])
        if queue is None:  # Apache answers 0 for a queue that does not exist
            assert query["why"] in ("unknown topic", "unknown queue id") and query["result"] == 0
            return

        def store_time(unit) -> int:  # type: ignore[no-untyped-def]
            return log.read(unit.commitlog_offset, check_crc=False).store_timestamp_ms

        ts = query["timestamp"]
        lower = queue.offset_by_time(ts, store_time, Boundary.LOWER)
        upper = queue.offset_by_time(ts, store_time, Boundary.UPPER)
        times = [store_time(unit) for _, unit in queue.units()]
        assert lower == next((i for i, t in enumerate(times) if t >= ts), len(times))
        assert upper == max((i for i, t in enumerate(times) if t <= ts), default=-1)
        assert query["result"] in (lower, upper)
    finally:
        log.close()
        queues.close()
