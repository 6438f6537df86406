"""The Spark pipeline on a real local Spark: the data source against Apache's dumps, filter
pushdown, byte-identical reindex, Parquet export, idempotent load, stats and the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyarrow.dataset as pads
from conftest import CLEAN, CRASHED, FIXTURE_SIZE_ARGS, FIXTURE_SIZES, FIXTURES, read_jsonl
from support.inprocess import QueryNode, WriterNode
from support.stores import SMALL

from rmqstore.cli.main import main
from rmqstore.common.codec.msgid import offset_msg_id
from rmqstore.common.codec.record import Record
from rmqstore.common.errors import Corruption
from rmqstore.common.files.commitlog import CommitLog, StopReason
from rmqstore.common.files.index import IndexFile
from rmqstore.common.files.store import StoreSizes, reindex
from rmqstore.common.times import iso_time
from rmqstore.pipeline import export, load, session, splits, stats
from rmqstore.pipeline import reindex as spark_reindex
from rmqstore.pipeline.source import RmqstoreDataSource, read_split
from rmqstore.v1 import messages_pb2, writer_pb2

pytestmark = pytest.mark.spark

DUMPS = {
    "clean": (CLEAN, FIXTURES / "store-clean-commitlog-dump.jsonl"),
    "crashed": (CRASHED, FIXTURES / "store-crashed-recovered-commitlog-dump.jsonl"),
}
SCALAR_FIELDS = (
    "commitLogOffset",
    "size",
    "msgId",
    "topic",
    "queueId",
    "queueOffset",
    "sysFlag",
    "flag",
    "bodyCRC",
    "bornTimestamp",
    "storeTimestamp",
    "bornHost",
    "storeHost",
    "reconsumeTimes",
    "preparedTransactionOffset",
)
# Everything a message keeps through export → load → export, apart from where and when it
# was stored (and what follows from that: msgId, queue offset).
KEPT_FIELDS = (
    "topic", "queueId", "sysFlag", "flag", "bodyCRC", "size", "bornTimestamp", "bornHost", "storeHost",
    "keys", "tags", "uniqKey", "body",
)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    started = session.start("local[2]")
    yield started
    started.stop()


def records_of(store: Path, file_size: int = FIXTURE_SIZES.commitlog_file_size_bytes) -> list[Record]:
    log = CommitLog(str(store / "commitlog"), file_size)
    try:
        return list(log.records())
    finally:
        log.close()


def rows_of(frame: Any) -> list[dict[str, Any]]:
    return sorted((row.asDict(recursive=True) for row in frame.collect()), key=lambda r: (r["store"], r["commitLogOffset"]))


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def clean_rows(spark: Any) -> list[dict[str, Any]]:
    return rows_of(spark.read.format("rmqstore").load(str(CLEAN)))


def test_a_local_session_runs_its_workers_and_jvm_as_configured(spark: Any) -> None:
    """Arrow Java's checks off in the JVM that reads the workers' batches; one OpenBLAS
    thread in the Python workers; everything on the loopback interface."""
    jvm_property = spark.sparkContext._jvm.java.lang.System.getProperty
    assert [jvm_property(option[2:].split("=")[0]) for option in session.LOCAL_JAVA_OPTIONS] == ["true", "false"]
    seen = spark.sparkContext.parallelize([0, 1], 2).map(lambda _: __import__("os").environ.get("OPENBLAS_NUM_THREADS")).collect()
    assert seen == ["1", "1"]
    assert spark.sparkContext.getConf().get("spark.driver.bindAddress") == "127.0.0.1"


# The data source


@pytest.mark.parametrize("name", sorted(DUMPS))
def test_source_returns_apaches_commitlog_dump(spark: Any, clean_rows: list[dict[str, Any]], name: str) -> None:
    store, dump_path = DUMPS[name]
    rows = clean_rows if name == "clean" else rows_of(spark.read.format("rmqstore").load(str(store)))
    dump = read_jsonl(dump_path)
    assert len(rows) == len(dump) == {"clean": 2007, "crashed": 795}[name]
    for row, apache in zip(rows, dump):
        assert {field: row[field] for field in SCALAR_FIELDS} == {field: apache[field] for field in SCALAR_FIELDS}
        assert len(row["body"]) == apache["bodyLen"]
        assert hashlib.sha256(row["body"]).hexdigest() == apache["bodySha256"]
        assert row["properties"] == apache["properties"]
        assert (row["keys"], row["tags"], row["uniqKey"]) == tuple(apache["properties"].get(n) for n in ("KEYS", "TAGS", "UNIQ_KEY"))
        assert row["store"] == str(store)


def test_files_cut_at_record_boundaries_give_the_same_rows(spark: Any, clean_rows: list[dict[str, Any]]) -> None:
    reader = RmqstoreDataSource({"path": str(CLEAN), "maxPartitionBytes": "65536"}).reader(
        RmqstoreDataSource({}).schema()
    )
    pieces = reader.partitions()
    assert len(pieces) > 4 * 6  # four 512 KiB files, each cut into ~8 pieces
    starts = {record.commitlog_offset for record in records_of(CLEAN)}
    for piece in pieces:
        split = piece.split  # type: ignore[attr-defined]
        assert split.start % 524288 == 0 or split.start in starts
    cut = rows_of(spark.read.format("rmqstore").option("maxPartitionBytes", 65536).load(str(CLEAN)))
    assert cut == clean_rows


def test_several_stores_in_one_read(spark: Any, clean_rows: list[dict[str, Any]]) -> None:
    both = spark.read.format("rmqstore").load([str(CLEAN), str(CRASHED)])
    counts = {row["store"]: row["count"] for row in both.groupBy("store").count().collect()}
    assert counts == {str(CLEAN): 2007, str(CRASHED): 795}


FILTERS = {
    "topic": ("topic = 'TopicTest'", lambda r: r["topic"] == "TopicTest"),
    "topic in": ("topic IN ('OrderTopic', 'SCHEDULE_TOPIC_XXXX')", lambda r: r["topic"] in ("OrderTopic", "SCHEDULE_TOPIC_XXXX")),
    "time window": (
        "storeTimestamp >= 1795316575000 AND storeTimestamp < 1795316577000",
        lambda r: 1795316575000 <= r["storeTimestamp"] < 1795316577000,
    ),
    "topic and time": (
        "topic = 'Pay_Events-2' AND storeTimestamp > 1795316576000",
        lambda r: r["topic"] == "Pay_Events-2" and r["storeTimestamp"] > 1795316576000,
    ),
    "one instant": ("storeTimestamp = 1795316571614", lambda r: r["storeTimestamp"] == 1795316571614),
    "offsets": (
        "commitLogOffset >= 600000 AND commitLogOffset <= 1100000",
        lambda r: 600000 <= r["commitLogOffset"] <= 1100000,
    ),
    "nothing": ("storeTimestamp < 0", lambda r: False),
    "or (not pushed)": (
        "topic = 'TopicTest' OR storeTimestamp <= 1795316572000",
        lambda r: r["topic"] == "TopicTest" or r["storeTimestamp"] <= 1795316572000,
    ),
    "tags (not pushed) and time": (
        "tags = 'TagA' AND storeTimestamp <= 1795316574000",
        lambda r: r["tags"] == "TagA" and r["storeTimestamp"] <= 1795316574000,
    ),
}


@pytest.mark.parametrize("case", sorted(FILTERS))
def test_pushed_filters_give_the_rows_filtered_after_the_read(spark: Any, clean_rows: list[dict[str, Any]], case: str) -> None:
    condition, keep = FILTERS[case]
    pushed = rows_of(spark.read.format("rmqstore").option("maxPartitionBytes", 65536).load(str(CLEAN)).where(condition))
    after = [row for row in clean_rows if keep(row)]
    assert pushed == after
    assert case == "nothing" or after


def _reader(filters: list[Any], **options: str) -> Any:
    source = RmqstoreDataSource({"path": str(CLEAN), **options})
    reader = source.reader(source.schema())
    assert list(reader.pushFilters(filters)) == []
    return reader


def _files(reader: Any) -> set[int]:
    return {piece.split.start // 524288 for piece in reader.partitions()}


def test_time_filters_skip_files_on_the_reader(clean_rows: list[dict[str, Any]]) -> None:
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
    )

    assert _files(_reader([])) == {0, 1, 2, 3}
    first_file_end = max(r["storeTimestamp"] for r in clean_rows if r["commitLogOffset"] < 524288)
    last_file_begin = min(r["storeTimestamp"] for r in clean_rows if r["commitLogOffset"] >= 3 * 524288)
    early = _reader([IsNotNull(("storeTimestamp",)), LessThanOrEqual(("storeTimestamp",), first_file_end - 1)])
    late = _reader([GreaterThanOrEqual(("storeTimestamp",), last_file_begin), EqualTo(("topic",), "TopicTest")])
    nothing = _reader([LessThan(("storeTimestamp",), 0)])
    assert _files(early) == {0}
    assert _files(late) == {3}
    assert nothing.partitions() == []
    # Files are skipped only where no record could match: every matching row is in a file read.
    for reader, keep in (
        (early, lambda r: r["storeTimestamp"] <= first_file_end - 1),
        (late, lambda r: r["storeTimestamp"] >= last_file_begin and r["topic"] == "TopicTest"),
    ):
        wanted = [r["commitLogOffset"] for r in clean_rows if keep(r)]
        got = [
            offset
            for piece in reader.partitions()
            for batch in reader.read(piece)
            for offset in batch.column("commitLogOffset").to_pylist()
        ]
        assert sorted(got) == wanted
    # Cut files skip pieces, not just files.
    early_ts = max(r["storeTimestamp"] for r in clean_rows if r["commitLogOffset"] < 100_000)
    pieces = _reader([LessThanOrEqual(("storeTimestamp",), early_ts)], maxPartitionBytes="65536").partitions()
    assert 1 <= len(pieces) <= 3
    # Topic filters cannot skip files, and filters the source does not take go back to Spark.
    assert _files(_reader([In(("topic",), ("OrderTopic",))])) == {0, 1, 2, 3}
    source = RmqstoreDataSource({"path": str(CLEAN)})
    reader = source.reader(source.schema())
    kept = EqualTo(("tags",), "TagA")
    assert list(reader.pushFilters([kept, EqualTo(("topic",), "TopicTest")])) == [kept]


def corrupt_copy(tmp_path: Path) -> tuple[Path, int]:
    """The clean store with one body byte flipped in its second file."""
    target = tmp_path / "corrupt"
    shutil.copytree(CLEAN, target)
    victim = next(r for r in records_of(CLEAN) if r.commitlog_offset > 700_000 and len(r.body) > 10)
    path = target / "commitlog" / "00000000000000524288"
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    body_at = data.find(victim.body, victim.commitlog_offset - 524288)
    assert 0 < body_at < victim.commitlog_offset - 524288 + victim.size
    data[body_at + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    return target, victim.commitlog_offset


def test_corruption_fails_the_read_naming_its_offset(spark: Any, tmp_path: Path) -> None:
    store, offset = corrupt_copy(tmp_path)
    with pytest.raises(Exception) as caught:
        spark.read.format("rmqstore").load(str(store)).count()
    explained = session.explain(caught.value)
    assert isinstance(explained, Corruption)
    assert f"commit log offset {offset}" in str(explained)
    # The pieces before it still read, the reader says where it stopped.
    split = splits.plan([str(store)])[0]
    assert sum(batch.num_rows for batch in read_split(split)) > 0


def test_a_cut_on_a_record_hidden_in_a_body_fails_the_read(tmp_path: Path) -> None:
    """Cuts are found by searching for a record start; a body can hold a perfect copy of
    one. The piece before such a cut notices that its last record runs past it."""
    from rmqstore.common.codec.record import encode_record

    log = CommitLog(str(tmp_path / "store" / "commitlog"), 1 << 20, writable=True)
    log.set_write_position(0)
    for n in range(50):
        log.append([bytearray(encode_record(Record(topic="Plain", body=bytes([n]) * 300)))], [n])
    assert log.write_offset is not None
    host_at = log.write_offset
    hidden = encode_record(Record(topic="Hidden", body=b"inside", commitlog_offset=host_at + 88))
    log.append([bytearray(encode_record(Record(topic="Host", body=hidden + b"tail")))], [0])
    log.append([bytearray(encode_record(Record(topic="Plain", body=b"after")))], [50])
    log.flush()
    log.close()
    store = str(tmp_path / "store")
    reader = CommitLog(str(tmp_path / "store" / "commitlog"), 1 << 20)
    try:
        found = splits._record_start(reader, reader.files.files[0], host_at + 1, 1 << 20)
    finally:
        reader.close()
    assert found == host_at + 88  # the hidden copy passes every test a search can make
    before = splits.Split(store, 1 << 20, 0, host_at + 88, cut_end=True)
    with pytest.raises(Corruption, match=f"{host_at + 88} looked like a record start"):
        list(read_split(before))
    whole = [batch.column("topic").to_pylist() for batch in read_split(splits.Split(store, 1 << 20, 0, 1 << 20))]
    assert [topic for batch in whole for topic in batch] == ["Plain"] * 50 + ["Host", "Plain"]


# reindex


def test_spark_reindex_equals_apaches_files(spark: Any, tmp_path: Path) -> None:
    summary = spark_reindex.run(spark, str(CLEAN), str(tmp_path), FIXTURE_SIZES)
    assert (summary.records, summary.stop.reason, summary.stop.end_offset) == (2007, StopReason.END, 2_089_474)
    assert (summary.queues, summary.units, summary.index_keys) == (14, 1995, 5846)
    assert tree(tmp_path / "consumequeue") == tree(CLEAN / "consumequeue")
    ours = [(tmp_path / "index" / n).read_bytes() for n in sorted(os.listdir(tmp_path / "index"))]
    theirs = [(CLEAN / "index" / n).read_bytes() for n in sorted(os.listdir(CLEAN / "index"))]
    assert len(ours) == 4 and ours == theirs


@pytest.mark.parametrize(
    "sizes",
    [
        StoreSizes(FIXTURE_SIZES.commitlog_file_size_bytes, cq_file_units=7, index_slots=11, index_entries=50),
        StoreSizes(FIXTURE_SIZES.commitlog_file_size_bytes, cq_file_units=3, index_slots=2, index_entries=20),
    ],
    ids=["120-index-files", "308-index-files"],
)
def test_spark_reindex_equals_single_process_at_any_geometry(spark: Any, tmp_path: Path, sizes: StoreSizes) -> None:
    """Many rollovers: files that fill mid-record, files opened by records without keys
    (ROLLBACK), and the last file opened by the record after the last key."""
    reindex(str(CLEAN), str(tmp_path / "single"), sizes)
    summary = spark_reindex.run(spark, str(CLEAN), str(tmp_path / "spark"), sizes)
    assert len(summary.index_files) > 100
    assert tree(tmp_path / "spark") == tree(tmp_path / "single")


def test_spark_reindex_of_apaches_crashed_store_equals_the_single_process_one(spark: Any, tmp_path: Path) -> None:
    single = reindex(str(CRASHED), str(tmp_path / "single"), FIXTURE_SIZES)
    summary = spark_reindex.run(spark, str(CRASHED), str(tmp_path / "spark"), FIXTURE_SIZES)
    assert (summary.records, summary.stop.end_offset) == (single.records, single.stop.end_offset) == (795, 840015)
    assert tree(tmp_path / "spark") == tree(tmp_path / "single")


def test_spark_reindex_of_a_corrupt_log_stops_where_the_single_process_one_does(spark: Any, tmp_path: Path) -> None:
    store, offset = corrupt_copy(tmp_path)
    single = reindex(str(store), str(tmp_path / "single"), FIXTURE_SIZES)
    summary = spark_reindex.run(spark, str(store), str(tmp_path / "spark"), FIXTURE_SIZES)
    assert single.stop.reason is summary.stop.reason is StopReason.CORRUPT
    assert single.stop.end_offset == summary.stop.end_offset == offset
    assert summary.stop.describe() == single.stop.describe()
    assert summary.records == single.records
    assert tree(tmp_path / "spark") == tree(tmp_path / "single")


@pytest.fixture(scope="module")
def writer_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store the writer wrote, through its gRPC API: rolled-over commit log, consume queue
    and index files; IPv4 and IPv6 born hosts; non-ASCII keys and tags; empty bodies; keys
    repeated within a message; explicit and round-robin queues."""
    store = tmp_path_factory.mktemp("writer") / "store"
    node = WriterNode(store)
    try:
        sent = []
        for n in range(2400):
            keys = [f"k-{n}", "order-common"] if n % 3 else [f"订单-{n % 7}", "emoji-\U0001F680", f"k-{n}", f"k-{n}"]
            msg = messages_pb2.Message(
                topic=["TopicA", "Pay_Events-2", "Order%Topic|x"][n % 3],
                body=b"" if n % 10 == 0 else hashlib.sha256(str(n).encode()).digest() * (n % 5),
                keys=keys if n % 11 else [],
                tags="TagA" if n % 2 else "标签-Ü",
                properties={"seq": str(n)},
                born_host="[2001:db8::5]:4000" if n % 4 == 0 else "192.0.2.9:5000",
                born_timestamp_ms=1_700_000_000_000 + n,
                flag=n % 3,
            )
            if n % 5 == 0:
                msg.queue_id = 2
            sent.append(msg)
        for start in range(0, len(sent), 400):
            node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=sent[start : start + 400]))
    finally:
        node.close()
    return store


def test_spark_reindex_of_a_writer_store_equals_the_writers_own_files(spark: Any, writer_store: Path, tmp_path: Path) -> None:
    summary = spark_reindex.run(spark, str(writer_store), str(tmp_path), SMALL)
    assert summary.records == 2400 and summary.stop.reason is StopReason.END
    assert len(os.listdir(writer_store / "commitlog")) > 5 and len(summary.index_files) > 5
    assert tree(tmp_path / "consumequeue") == tree(writer_store / "consumequeue")
    assert tree(tmp_path / "index") == tree(writer_store / "index")  # names too: both from record times


def test_reindex_command(tmp_path: Path, capsys: pytest.CaptureFixture[str], spark: Any) -> None:
    out = tmp_path / "out"
    args = ["pipeline", "reindex", str(CLEAN), "--out", str(out), *FIXTURE_SIZE_ARGS]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {
        "records": 2007,
        "endOffset": 2089474,
        "stop": "end",
        "queues": 14,
        "units": 1995,
        "indexFiles": 4,
        "indexKeys": 5846,
    }
    assert "pipeline reindex: dispatching" in captured.err  # progress
    assert tree(out / "consumequeue") == tree(CLEAN / "consumequeue")
    # A second run refuses to mix with existing output, before starting anything.
    assert main(args) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    # Spark is still up for the other tests: a command never stops a session it did not start.
    assert spark.range(3).count() == 3


# export


def exported(root: Path) -> list[dict[str, Any]]:
    table = pads.dataset(str(root), format="parquet", partitioning="hive").to_table()
    rows = table.to_pylist()
    for row in rows:
        row["properties"] = dict(row["properties"])
        row["topic"] = str(row["topic"])
    return sorted(rows, key=lambda r: r["commitLogOffset"])


def test_export_read_back_with_pyarrow_equals_the_commitlog(spark: Any, tmp_path: Path) -> None:
    summary = export.run(spark, str(CLEAN), str(tmp_path / "out"))
    rows = exported(tmp_path / "out")
    records = records_of(CLEAN)
    assert summary.rows == len(rows) == len(records) == 2007
    for row, record in zip(rows, records):
        assert row["commitLogOffset"] == record.commitlog_offset
        assert row["topic"] == record.topic and row["queueId"] == record.queue_id
        assert row["queueOffset"] == record.queue_offset and row["size"] == record.size
        assert row["msgId"] == offset_msg_id(record.store_host, record.commitlog_offset)
        assert (row["sysFlag"], row["flag"], row["bodyCRC"]) == (record.sys_flag, record.flag, record.body_crc)
        assert (row["bornTimestamp"], row["storeTimestamp"]) == (record.born_timestamp_ms, record.store_timestamp_ms)
        assert (row["bornHost"], row["storeHost"]) == (record.born_host.java_text(), record.store_host.java_text())
        assert (row["reconsumeTimes"], row["preparedTransactionOffset"]) == (record.reconsume_times, record.prepared_transaction_offset)
        assert row["properties"] == record.properties and row["body"] == record.body
        assert (row["keys"], row["tags"], row["uniqKey"]) == (record.keys, record.tags, record.uniq_key)
    dirs = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").glob("topic=*/date=*"))
    assert dirs == [f"topic={t}/date=2026-11-22" for t in ("OrderTopic", "Pay_Events-2", "SCHEDULE_TOPIC_XXXX", "TopicTest")]
    counts = [("OrderTopic", 649), ("Pay_Events-2", 666), ("SCHEDULE_TOPIC_XXXX", 7), ("TopicTest", 685)]
    assert [(t, n) for t, _, n in summary.partitions] == counts


def test_export_command_with_topic_and_time(tmp_path: Path, capsys: pytest.CaptureFixture[str], spark: Any) -> None:
    out = tmp_path / "out"
    begin, end = 1795316573000, 1795316576000
    args = ["pipeline", "export", str(CLEAN), "--out", str(out), "--topic", "TopicTest"]
    args += ["--begin", str(begin), "--end", str(end), "--quiet"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    wanted = [r.commitlog_offset for r in records_of(CLEAN) if r.topic == "TopicTest" and begin <= r.store_timestamp_ms <= end]
    assert [row["commitLogOffset"] for row in exported(out)] == wanted
    assert summary["rows"] == len(wanted) > 0
    assert main(args) == 2  # the directory exists now
    assert "already exists" in capsys.readouterr().err
    # The same range as ISO 8601 (with and without a zone) and as mqadmin writes a time.
    iso = ["--begin", "2026-11-22T03:02:53Z", "--end", "2026-11-22 03:02:56.000"]
    mqadmin = ["--begin", iso_time(begin, local=True).replace("T", "#").replace(".", ":")[:23]]
    for n, times in enumerate((iso, mqadmin + ["--end", str(end)])):
        again = tmp_path / f"out-{n}"
        assert main([*args[:4], str(again), *args[5:7], *times, "--quiet"]) == 0
        assert json.loads(capsys.readouterr().out)["rows"] == len(wanted)
        assert [row["commitLogOffset"] for row in exported(again)] == wanted


# load


def load_summary(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["pipeline", "load", *args, "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


def by_uniq(rows: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    kept = {}
    for row in rows:
        kept[row["uniqKey"]] = tuple(row[field] for field in KEPT_FIELDS) + (row["properties"],)
    return kept


@pytest.fixture(scope="module")
def writer_export(spark: Any, writer_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "writer"
    export.run(spark, str(writer_store), str(out))
    return out


def test_load_then_export_gives_the_same_messages_and_a_second_load_adds_nothing(
    spark: Any, writer_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = WriterNode(tmp_path / "target")
    try:
        endpoint = f"127.0.0.1:{node.port}"
        first = load_summary(capsys, str(writer_export), "--endpoint", endpoint)
        assert first == {
            "input": 2400, "unsendableSkipped": 0, "repeatedInInput": 0, "alreadyStored": 0, "sent": 2400, "dedupe": "store",
        }
        again = load_summary(capsys, str(writer_export), "--endpoint", endpoint)
        assert again["sent"] == 0 and again["alreadyStored"] == 2400
        node.writer.flush_thoroughly()
        export.run(spark, str(tmp_path / "target"), str(tmp_path / "back"))
    finally:
        node.close()
    source, back = exported(writer_export), exported(tmp_path / "back")
    assert len(back) == 2400
    assert by_uniq(back) == by_uniq(source)
    # Per queue, the order is the source's.
    for rows in (source, back):
        rows.sort(key=lambda r: (r["topic"], r["queueId"], r["queueOffset"]))
    assert [r["uniqKey"] for r in back] == [r["uniqKey"] for r in source]


def test_a_load_run_again_after_a_partial_one_adds_only_the_rest(
    spark: Any, writer_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a run that failed half-way got stored: the first half of the log.
    partial = tmp_path / "partial"
    spark.read.parquet(str(writer_export)).where("commitLogOffset < 200000").write.partitionBy("topic", "date").parquet(str(partial))
    node = WriterNode(tmp_path / "target")
    try:
        endpoint = f"127.0.0.1:{node.port}"
        done = load_summary(capsys, str(partial), "--endpoint", endpoint)
        rest = load_summary(capsys, str(writer_export), "--endpoint", endpoint, "--target-store", str(tmp_path / "target"))
        assert done["sent"] > 0 and rest["sent"] == 2400 - done["sent"] and rest["alreadyStored"] == done["sent"]
        node.writer.flush_thoroughly()
        stored = records_of(tmp_path / "target", SMALL.commitlog_file_size_bytes)
        assert len(stored) == len({(r.topic, r.uniq_key) for r in stored}) == 2400
        # A retried Spark task checks each message against the store first.
        rows = pads.dataset(str(writer_export), format="parquet", partitioning="hive").to_table().to_pylist()
        checker = load.StoreChecker(str(tmp_path / "target"), SMALL)
        try:
            assert load.send_rows(iter(rows[:50]), endpoint, keep_queue_ids=True, checker=checker) == (0, 50)
        finally:
            checker.close()
    finally:
        node.close()


def test_load_with_a_query_node_and_json_input(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [{"topic": "Jsonic", "body": f"m{n}", "keys": f"a{n} b", "tags": "T", "properties": {"p": str(n)}} for n in range(30)]
    lines += [{"topic": "Jsonic", "bodyBase64": "AAEC", "uniqKey": "ABCDEF0123456789ABCDEF0123456789", "queueId": 1}] * 2
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    node = WriterNode(tmp_path / "target")
    query = QueryNode(tmp_path / "target")
    try:
        endpoint = f"127.0.0.1:{node.port}"
        args = [str(source), "--format", "json", "--endpoint", endpoint, "--query-endpoint", query.endpoint]
        first = load_summary(capsys, *args)
        assert first == {"input": 32, "unsendableSkipped": 0, "repeatedInInput": 1, "alreadyStored": 0, "sent": 31, "dedupe": "query"}
        again = load_summary(capsys, *args)
        assert again["sent"] == 0 and again["alreadyStored"] == 31
        node.writer.flush_thoroughly()
    finally:
        query.close()
        node.close()
    stored = records_of(tmp_path / "target", SMALL.commitlog_file_size_bytes)
    assert sorted(r.body for r in stored) == sorted([f"m{n}".encode() for n in range(30)] + [b"\x00\x01\x02"])
    derived = {r.uniq_key for r in stored} - {"ABCDEF0123456789ABCDEF0123456789"}
    assert len(derived) == 30 and all(len(k) == 32 for k in derived)


def test_load_refuses_what_a_writer_cannot_store_unless_told(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export.run(spark, str(CLEAN), str(tmp_path / "apache"), topic="SCHEDULE_TOPIC_XXXX")
    node = WriterNode(tmp_path / "target")
    try:
        endpoint = f"127.0.0.1:{node.port}"
        assert main(["pipeline", "load", str(tmp_path / "apache"), "--endpoint", endpoint, "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "7 of 7 messages cannot be stored" in err[0] and "--skip-unsendable" in err[0]
        assert load_summary(capsys, str(tmp_path / "apache"), "--endpoint", endpoint, "--skip-unsendable")["sent"] == 0
    finally:
        node.close()


# stats


def test_stats_on_apaches_store(spark: Any) -> None:
    report = stats.run(spark, str(CLEAN), FIXTURE_SIZES, top=3)
    records = records_of(CLEAN)
    assert report["messages"] == 2007 and report["bytes"] == sum(r.size for r in records)
    topics = {t["topic"]: t for t in report["topics"]}
    assert {name: t["messages"] for name, t in topics.items()} == {
        "OrderTopic": 649, "Pay_Events-2": 666, "SCHEDULE_TOPIC_XXXX": 7, "TopicTest": 685,
    }
    queue = next(q for q in topics["TopicTest"]["queues"] if q["queueId"] == 3)
    mine = [r for r in records if r.topic == "TopicTest" and r.queue_id == 3]
    assert queue["messages"] == len(mine)
    times = [r.store_timestamp_ms for r in mine]
    assert (queue["beginTimestamp"], queue["endTimestamp"]) == (min(times), max(times))
    assert queue["distinctKeys"] == len({k for r in mine for k in (r.keys or "").split(" ") if k})
    assert topics["OrderTopic"]["hottestKeys"][0] == {"key": "order-common", "messages": 272}
    files = report["index"]["files"]
    assert [f["entries"] for f in files] == [1499, 1499, 1499, 1349]
    for item in files:  # chain lengths as IndexFile.chain walks them
        index_file = IndexFile.open(str(CLEAN / "index" / item["file"]), 500, 1500, writable=False)
        try:
            lengths = [n for n in (sum(1 for _ in index_file.chain(slot)) for slot in range(500)) if n]
        finally:
            index_file.close()
        assert (item["slotsUsed"], item["chainMax"]) == (len(lengths), max(lengths))
        assert item["chainMean"] == pytest.approx(sum(lengths) / len(lengths))


def test_stats_command_prints_a_table_and_json(capsys: pytest.CaptureFixture[str], spark: Any) -> None:
    assert main(["pipeline", "stats", str(CRASHED), *FIXTURE_SIZE_ARGS, "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "hottest keys" in table and "index files" in table and "TopicTest/0" in table
    assert main(["pipeline", "stats", str(CRASHED), *FIXTURE_SIZE_ARGS, "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["messages"] == 795
    # Times for people in ISO 8601 (UTC), epoch ms in the JSON.
    assert f"times     [{iso_time(report['beginTimestamp'])}, {iso_time(report['endTimestamp'])}]" in table.splitlines()
    topic = next(t for t in report["topics"] if t["topic"] == "TopicTest")
    [row] = [line for line in table.splitlines() if line.startswith("TopicTest ")]
    assert row.split()[-2:] == [iso_time(topic["beginTimestamp"]), iso_time(topic["endTimestamp"])]


# Several stores: a cluster's writer groups read as one data set

CLUSTER_GROUPS = {"broker-a": 30, "broker-b": 20, "broker-c": 10}  # Orders messages each
ONLY_B = 5  # messages of a topic only broker-b has


@pytest.fixture(scope="module")
def cluster_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three stores written by three real writers, each a writer group with its own broker
    name and store host: one topic in every group, one in broker-b only; explicit queues
    and keys, one of them ("shared") in every group."""
    root = tmp_path_factory.mktemp("cluster")
    stores = {}
    for k, (broker, count) in enumerate(CLUSTER_GROUPS.items()):
        store = root / broker / "store"
        node = WriterNode(store, store_host=f"127.0.0.{k + 1}:10911", broker_name=broker)
        try:
            sent = [
                messages_pb2.Message(
                    topic="Orders", body=f"{broker}-{n}".encode(), queue_id=n % 3,
                    keys=[f"{broker}-k{n}", *(["shared"] if n % 2 == 0 else [])],
                )
                for n in range(count)
            ]  # fmt: skip
            if broker == "broker-b":
                sent += [messages_pb2.Message(topic="Only-b", body=b"b", queue_id=0, keys=["shared"]) for _ in range(ONLY_B)]
            node.stub.SendBatch(writer_pb2.SendBatchRequest(messages=sent))
            node.writer.flush_thoroughly()
        finally:
            node.close()
        stores[broker] = store
    return stores


def cluster_args(stores: dict[str, Path]) -> list[str]:
    args = [arg for store in stores.values() for arg in ("--store", str(store))]
    return args + [arg for broker in stores for arg in ("--broker-name", broker)]


def test_stats_over_several_stores_counts_every_group_and_keeps_queues_apart(
    cluster_stores: dict[str, Path], capsys: pytest.CaptureFixture[str], spark: Any
) -> None:
    assert main(["pipeline", "stats", *cluster_args(cluster_stores), "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    records = {broker: records_of(store, SMALL.commitlog_file_size_bytes) for broker, store in cluster_stores.items()}
    assert report["messages"] == sum(CLUSTER_GROUPS.values()) + ONLY_B == 65
    assert "store" not in report
    assert [(s["store"], s["brokerName"], s["messages"]) for s in report["stores"]] == [
        (str(cluster_stores["broker-a"]), "broker-a", 30), (str(cluster_stores["broker-b"]), "broker-b", 25),
        (str(cluster_stores["broker-c"]), "broker-c", 10),
    ]  # fmt: skip
    for item in report["stores"]:
        mine = records[item["brokerName"]]
        assert item["bytes"] == sum(r.size for r in mine)
        assert (item["beginTimestamp"], item["endTimestamp"]) == (min(r.store_timestamp_ms for r in mine), max(r.store_timestamp_ms for r in mine))
    topics = {t["topic"]: t for t in report["topics"]}
    assert {name: t["messages"] for name, t in topics.items()} == {"Orders": 60, "Only-b": 5}
    # Queue 1 of broker-a is not queue 1 of broker-b: each group's queues apart, in the stores' order.
    assert [(q["brokerName"], q["queueId"], q["messages"], q["minQueueOffset"], q["maxQueueOffset"]) for q in topics["Orders"]["queues"]] == [
        ("broker-a", 0, 10, 0, 9), ("broker-a", 1, 10, 0, 9), ("broker-a", 2, 10, 0, 9),
        ("broker-b", 0, 7, 0, 6), ("broker-b", 1, 7, 0, 6), ("broker-b", 2, 6, 0, 5),
        ("broker-c", 0, 4, 0, 3), ("broker-c", 1, 3, 0, 2), ("broker-c", 2, 3, 0, 2),
    ]  # fmt: skip
    assert [(q["store"], q["brokerName"], q["messages"]) for q in topics["Only-b"]["queues"]] == [(str(cluster_stores["broker-b"]), "broker-b", 5)]
    # A topic's keys over every group: "shared" is in 15 + 10 + 5 Orders messages.
    assert topics["Orders"]["hottestKeys"][0] == {"key": "shared", "messages": 30}
    assert topics["Orders"]["distinctKeys"] == 60 + 1
    assert {f["brokerName"] for f in report["index"]["files"]} == set(CLUSTER_GROUPS)
    assert sum(f["entries"] for f in report["index"]["files"] if f["brokerName"] == "broker-c") > 0
    # The table names each queue's group.
    assert main(["pipeline", "stats", *cluster_args(cluster_stores), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "Orders/broker-b/1" in table and "Only-b/broker-b/0" in table
    assert table.startswith(f"stores    {cluster_stores['broker-a']} (broker-a), ")
    # Without broker names the stores still stay apart, each queue named by its directory.
    assert main(["pipeline", "stats", "--store", str(cluster_stores["broker-a"]), "--store", str(cluster_stores["broker-c"]), "--quiet", "--json"]) == 0
    unnamed = json.loads(capsys.readouterr().out)
    assert unnamed["messages"] == 40
    assert [(q["store"], q["brokerName"], q["messages"]) for q in unnamed["topics"][0]["queues"]][::3] == [
        (str(cluster_stores["broker-a"]), None, 10), (str(cluster_stores["broker-c"]), None, 4),
    ]  # fmt: skip


def test_export_over_several_stores_writes_one_data_set_naming_each_rows_group(
    cluster_stores: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], spark: Any
) -> None:
    out = tmp_path / "out"
    assert main(["pipeline", "export", *cluster_args(cluster_stores), "--out", str(out), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = pads.dataset(str(out), format="parquet", partitioning="hive").to_table().to_pylist()
    assert summary["rows"] == len(rows) == 65
    assert [(p["topic"], p["rows"]) for p in summary["partitions"]] == [("Only-b", 5), ("Orders", 60)]
    got = sorted((r["brokerName"], r["store"], str(r["topic"]), r["queueId"], r["queueOffset"], r["commitLogOffset"], r["msgId"], r["body"]) for r in rows)
    expected = sorted(
        (broker, str(store), r.topic, r.queue_id, r.queue_offset, r.commitlog_offset, offset_msg_id(r.store_host, r.commitlog_offset), r.body)
        for broker, store in cluster_stores.items()
        for r in records_of(store, SMALL.commitlog_file_size_bytes)
    )
    assert got == expected
    # Each group's records carry its own store host, so their ids differ where offsets repeat.
    assert len({r["msgId"] for r in rows}) == 65
    assert len({r["commitLogOffset"] for r in rows}) < 65


def test_several_stores_on_the_command_line_are_checked_before_spark_starts(cluster_stores: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = (str(cluster_stores[name]) for name in ("broker-a", "broker-b"))
    cases = [
        (["stats", "--store", a, "--store", a], f"--store {a} is given twice"),
        (["stats", "--store", a, "--store", b, "--broker-name", "broker-a"], "1 --broker-name for 2 store(s): give one per store, in the stores' order"),
        (["stats", "--store", a, "--store", b, "--broker-name", "x", "--broker-name", "x"], "--broker-name x is given twice: each store is one writer group"),
        (["stats", a, "--store", b], f"store directories given as DIR ({a}) and as --store {b}; give one DIR, or every store as --store DIR"),
        (["export", "--store", a, "--store", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")], f"--store {tmp_path / 'nowhere'}: no such directory"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(["pipeline", *argv, "--quiet"]) == 2
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", f"rmqstore: error: {message}\n")
    assert not (tmp_path / "out").exists()


# errors, in one line


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_bad_store_unreachable_writer_and_missing_java_are_one_line_each(tmp_path: Path) -> None:
    bad = run_cli("pipeline", "stats", str(tmp_path / "nowhere"))
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"rmqstore: error: store directory {tmp_path / 'nowhere'}: no such directory"]
    (tmp_path / "empty").mkdir()
    not_store = run_cli("pipeline", "reindex", str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert not_store.returncode == 2 and len(not_store.stderr.strip().splitlines()) == 1
    assert f"store directory {tmp_path / 'empty'}: not a store directory" in not_store.stderr
    writer = run_cli("pipeline", "load", str(CLEAN), "--endpoint", "127.0.0.1:1")
    assert writer.returncode == 2 and len(writer.stderr.strip().splitlines()) == 1
    assert "the writer at 127.0.0.1:1 is unreachable" in writer.stderr
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # no java here
    # The fixture's index geometry is given: sizes are checked against the files first.
    java = run_cli("pipeline", "stats", str(CLEAN), *FIXTURE_SIZE_ARGS, env=env)
    assert java.returncode == 2 and java.stderr.strip().splitlines() == [
        "rmqstore: error: Spark needs Java 17 or later: no `java` on PATH and JAVA_HOME is not set"
    ]


def test_runs_under_spark_submit(tmp_path: Path) -> None:
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    script = Path(sys.modules["rmqstore.pipeline"].__file__).parent / "__main__.py"  # type: ignore[arg-type]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [str(submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2", str(script),
         "stats", str(CLEAN), *FIXTURE_SIZE_ARGS, "--json", "--quiet"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["messages"] == 2007
