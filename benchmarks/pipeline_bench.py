"""The Spark pipeline's throughput, beside the single-process reindex in the same run.

    python benchmarks/pipeline_bench.py --store /tmp/bench-store --messages 1000000 --master 'local[2]'

1. Workload (once; kept in --store and reused if it holds --messages records): the writer,
   in-process, appends N messages in batches of 1,000 at RocketMQ's default sizes (1 GiB
   commit log files, 300,000-unit queues, 5,000,000-slot / 20,000,000-entry index files).
   4 topics × 8 queues; a unique order key per message and, on 30 %, one of 16 hot keys;
   5 tags; bodies of 100–400 random bytes; seed 20261122.
2. Single process, for scale: a scan of the whole log record by record
   (``CommitLog.records``, what the data source did per row before its columnar decoder)
   and through the data source's own reader in one process (``read_split``: columnar
   decode and Arrow batches): rows/s.
3. Spark ``count()`` of the data source, as the jobs read it
   (``spark.read.format("rmqstore").option("minPartitions", cores).load(store)``: one
   piece per core), and with three pieces per core, and with batches of 32,768 rows.
4. The Spark floor: the same ``count()`` through Python data sources that decode nothing —
   each task yields one pre-built batch (the store's first records, repeated) over and
   over — with the data source's schema (1 piece per core and 3; batches of 8,192 and
   32,768 rows) and with a single bigint column: what Spark's Python data source path
   itself allows here.
   The counts of 3 and 4 take turns (one warm-up each, then --scans rounds), and each
   reports the CPU Spark's JVM and its Python workers spent per row (from /proc).
5. The Spark ``reindex`` and the single-process ``reindex``, taking turns (one warm-up
   each, then --reindexes rounds; the median reported): msgs/s, the Spark output checked
   byte for byte against the single-process one.

Prints one JSON document with every figure, then the Markdown table of PIPELINE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SEED = 20261122
TOPICS = ("Orders", "Payments", "Inventory", "Audit")
QUEUES_PER_TOPIC = 8
TAGS = ("TagA", "TagB", "TagC", "TagD", "TagE")
HOT_KEYS = 16
BATCH = 1000
SAMPLE_ROWS = 4096  # decoded once per task by the no-decoding reader, then repeated
TARGET_ROWS_PER_S = 1_000_000


def count_records(store: Path) -> int:
    from rmqstore.common.files.commitlog import CommitLog
    from rmqstore.common.files.store import StorePaths, resolve_sizes

    if not (store / "commitlog").is_dir():
        return 0
    log = CommitLog(StorePaths(str(store)).commitlog, resolve_sizes(str(store)).commitlog_file_size_bytes)
    try:
        return len(log.sys_flags(log.min_offset, log.max_file_offset)[0])
    finally:
        log.close()


def generate(store: Path, messages: int) -> float:
    from rmqstore.common.files.store import StoreSizes
    from rmqstore.writer.config import FlushPolicy, WriterConfig
    from rmqstore.writer.store import Writer
    from rmqstore.writer.validate import MessageInput

    if store.exists():
        shutil.rmtree(store)
    rng = random.Random(SEED)
    writer = Writer(WriterConfig(store=str(store), sizes=StoreSizes(), flush=FlushPolicy.ASYNC))
    started = time.perf_counter()
    try:
        for topic in TOPICS:
            writer.topics.create(topic, QUEUES_PER_TOPIC)
        for first in range(0, messages, BATCH):
            batch = []
            for n in range(first, min(first + BATCH, messages)):
                keys = [f"ord-{n:09d}"]
                if rng.random() < 0.3:
                    keys.append(f"hot-{rng.randrange(HOT_KEYS)}")
                batch.append(
                    MessageInput(
                        topic=TOPICS[n % len(TOPICS)],
                        body=rng.randbytes(rng.randint(100, 400)),
                        keys=keys,
                        tags=TAGS[rng.randrange(len(TAGS))],
                        properties={"source": "bench"},
                    )
                )
            writer.append(batch)
            if first % 100_000 == 0:
                print(f"  generated {first:,}", file=sys.stderr, flush=True)
    finally:
        writer.close()
    return time.perf_counter() - started


def process_cpu_s() -> dict[str, float]:
    """CPU seconds used so far by Spark's JVM (this process's java child) and by its Python
    workers (pyspark.daemon and the workers it forks, reaped ones included). Linux only;
    empty elsewhere."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    used = {"jvm": 0.0, "python_workers": 0.0}
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ")
        except OSError:
            continue  # gone meanwhile
        parent, own, children = int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
        if b"java" in command and parent == os.getpid():
            used["jvm"] += own / ticks
        elif b"pyspark.daemon" in command:
            used["python_workers"] += (own + children) / ticks
    return used


def timed_counts(loads: dict[str, Any], runs: int) -> dict[str, dict[str, Any]]:
    """rows/s of ``load().count()`` for each load: best and median of ``runs``, and the CPU
    the JVM and the Python workers spent per row (µs, over the timed runs). One warm-up
    count each (JIT, workers), then the loads take turns, run after run, so that a change
    in the machine's load falls on all of them alike."""
    for load in loads.values():
        load().count()
    times: dict[str, list[float]] = {label: [] for label in loads}
    rows: dict[str, int] = {label: 0 for label in loads}
    cpu: dict[str, dict[str, float]] = {label: {} for label in loads}
    for _ in range(runs):
        for label, load in loads.items():
            before = process_cpu_s()
            started = time.perf_counter()
            counted = load().count()
            times[label].append(time.perf_counter() - started)
            after = process_cpu_s()
            rows[label] += counted
            for kind in after:
                cpu[label][kind] = cpu[label].get(kind, 0.0) + after[kind] - before[kind]
    results = {}
    for label in loads:
        per_run = rows[label] / runs
        results[label] = {
            "rows": round(per_run),
            "s": [round(t, 2) for t in times[label]],
            "rows_per_s_best": round(per_run / min(times[label])),
            "rows_per_s_median": round(per_run / statistics.median(times[label])),
            **{f"{kind}_cpu_us_per_row": round(used / rows[label] * 1e6, 2) for kind, used in cpu[label].items()},
        }
    return results


def prebuilt_source(store: Path, rows: int, pieces: int, batch_rows: int, columns_kept: tuple[str, ...] | None = None) -> Any:
    """A Python data source that decodes nothing: each of ``pieces`` tasks yields one
    pre-built batch of ``batch_rows`` rows (the store's first records, repeated) until it
    has its share of ``rows``. With ``columns_kept``, a schema of those columns only."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from pyspark.sql.types import StructType

    from rmqstore.pipeline import columns

    root = str(store)
    schema = columns.spark_schema()
    if columns_kept is not None:
        schema = StructType([field for field in schema.fields if field.name in columns_kept])
    name = f"rmqstore_bench_prebuilt_{pieces}_{batch_rows}_{len(schema.fields)}"

    class Reader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(n) for n in range(pieces)]

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa

            from rmqstore.common.files.commitlog import CommitLog
            from rmqstore.common.files.scan import ColumnScan

            log = CommitLog(os.path.join(root, "commitlog"), 1 << 30)
            try:
                first = next(iter(ColumnScan(log, 0, log.max_file_offset, batch_rows=SAMPLE_ROWS)))
                small = columns.arrow_batch(first, root, columns.arrow_schema())
            finally:
                log.close()
            small = small.select(schema.fieldNames())
            repeats = max(1, batch_rows // small.num_rows)
            batch = pa.Table.from_batches([small] * repeats).combine_chunks().to_batches()[0].slice(0, batch_rows)
            for _ in range(max(1, rows // pieces // batch.num_rows)):
                yield batch

    class Prebuilt(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> Any:
            return schema

        def reader(self, schema: Any) -> Reader:
            return Reader()

    return Prebuilt


def single_process_scans(store: Path, messages: int) -> dict[str, Any]:
    """rows/s of one process reading the whole log: record by record (``CommitLog.records``,
    what the data source did per row before the columnar decoder) and through the data
    source's own reader (``read_split``: columnar decode and Arrow batches)."""
    from rmqstore.common.files.commitlog import CommitLog
    from rmqstore.pipeline import splits
    from rmqstore.pipeline.source import read_split

    log = CommitLog(str(store / "commitlog"), 1 << 30)
    try:
        started = time.perf_counter()
        count = sum(1 for _ in log.records())
        per_record_s = time.perf_counter() - started
    finally:
        log.close()
    assert count == messages, count
    (whole,) = splits.plan([str(store)], min_partitions=1, max_partition_bytes=1 << 30)
    started = time.perf_counter()
    count = sum(batch.num_rows for batch in read_split(whole))
    columnar_s = time.perf_counter() - started
    assert count == messages, count
    return {
        "single_per_record_rows_per_s": round(messages / per_record_s),
        "single_columnar_rows_per_s": round(messages / columnar_s),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default=os.path.join(tempfile.gettempdir(), "rmqstore-bench-store"))
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--scans", type=int, default=3, help="timed rounds of the counts (default 3)")
    parser.add_argument("--reindexes", type=int, default=3, help="timed rounds of the two reindexes (default 3)")
    args = parser.parse_args()

    from rmqstore.common.files.store import StoreSizes, reindex, resolve_sizes
    from rmqstore.pipeline import reindex as spark_reindex
    from rmqstore.pipeline import session
    from rmqstore.pipeline.export import pieces_for, read_store
    from rmqstore.pipeline.source import BATCH_ROWS_DEFAULT

    store = Path(args.store)
    figures: dict[str, Any] = {
        "messages": args.messages,
        "master": args.master,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    if count_records(store) != args.messages:
        print(f"generating {args.messages:,} messages in {store}", file=sys.stderr)
        figures["generate_s"] = round(generate(store, args.messages), 1)
    sizes = resolve_sizes(str(store))
    assert sizes == StoreSizes(), sizes
    figures["commitlog_bytes"] = sum(p.stat().st_size for p in (store / "commitlog").iterdir())
    work = Path(tempfile.mkdtemp(prefix="rmqstore-bench-"))
    try:
        figures.update(single_process_scans(store, args.messages))

        started = time.perf_counter()
        spark = session.start(args.master)
        figures["spark_start_s"] = round(time.perf_counter() - started, 1)
        cores = spark.sparkContext.defaultParallelism
        figures["spark_parallelism"] = cores
        try:
            root = str(store)

            def scan(pieces: int, batch_rows: int | None = None) -> Any:
                def load() -> Any:
                    reader = spark.read.format("rmqstore").option("minPartitions", str(pieces))
                    if batch_rows is not None:
                        reader = reader.option("batchRows", str(batch_rows))
                    return reader.load(root)

                return load

            def floor(pieces: int, batch_rows: int, kept: tuple[str, ...] | None = None) -> Any:
                source = prebuilt_source(store, args.messages, pieces, batch_rows, kept)
                spark.dataSource.register(source)
                return lambda: spark.read.format(source.name()).load()

            jobs_pieces = pieces_for(spark)
            loads = {
                "scan": lambda: read_store(spark, [root]),
                "scan_three_pieces_per_core": scan(3 * cores),
                "scan_batches_of_32768": scan(jobs_pieces, 32_768),
                "floor": floor(jobs_pieces, BATCH_ROWS_DEFAULT),
                "floor_three_pieces_per_core": floor(3 * cores, BATCH_ROWS_DEFAULT),
                "floor_batches_of_32768": floor(jobs_pieces, 32_768),
                "floor_one_bigint_column": floor(jobs_pieces, BATCH_ROWS_DEFAULT, ("commitLogOffset",)),
            }
            figures.update(timed_counts(loads, args.scans))
            for label in ("scan", "scan_three_pieces_per_core", "scan_batches_of_32768"):
                assert figures[label]["rows"] == args.messages, figures[label]

            # One warm-up each (the Python workers' imports, the JVM's JIT), then the
            # two take turns, as the counts do; the last outputs stay to be compared.
            runs: dict[str, list[float]] = {"single": [], "spark": []}
            for round_number in range(args.reindexes + 1):
                for kind in runs:
                    out = work / kind
                    shutil.rmtree(out, ignore_errors=True)
                    started = time.perf_counter()
                    if kind == "single":
                        records = reindex(str(store), str(out), sizes).records
                    else:
                        records = spark_reindex.run(spark, str(store), str(out), sizes).records
                    if round_number:
                        runs[kind].append(time.perf_counter() - started)
                    assert records == args.messages
        finally:
            spark.stop()
        for kind, label in (("single", "single_reindex"), ("spark", "spark_reindex")):
            figures[f"{label}_s"] = [round(t, 2) for t in runs[kind]]
            figures[f"{label}_msgs_per_s"] = round(args.messages / statistics.median(runs[kind]))
        figures["spark_vs_single_reindex"] = round(statistics.median(runs["single"]) / statistics.median(runs["spark"]), 2)
        figures["reindex_outputs_identical"] = _same_tree(work / "single", work / "spark")
        assert figures["reindex_outputs_identical"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = figures["scan"]["rows_per_s_best"]
    figures["scan_vs_target"] = round(best / TARGET_ROWS_PER_S, 2)
    figures["scan_vs_single_columnar"] = round(best / figures["single_columnar_rows_per_s"], 2)
    figures["scan_vs_single_per_record"] = round(best / figures["single_per_record_rows_per_s"], 2)
    figures["scan_vs_floor"] = round(best / figures["floor"]["rows_per_s_best"], 2)
    print(json.dumps(figures, indent=2))
    print()
    print("| figure | value |")
    print("|---|---|")
    for label in (
        "scan", "scan_three_pieces_per_core", "scan_batches_of_32768",
        "floor", "floor_three_pieces_per_core", "floor_batches_of_32768", "floor_one_bigint_column",
    ):
        item = figures[label]
        print(
            f"| {label} (best / median of {args.scans}) | {item['rows_per_s_best']:,} / {item['rows_per_s_median']:,} rows/s "
            f"(CPU per row: JVM {item.get('jvm_cpu_us_per_row', '?')} µs, Python {item.get('python_workers_cpu_us_per_row', '?')} µs) |"
        )
    print(f"| single process, record by record | {figures['single_per_record_rows_per_s']:,} rows/s |")
    print(f"| single process, columnar + Arrow | {figures['single_columnar_rows_per_s']:,} rows/s |")
    for ratio in ("scan_vs_target", "scan_vs_single_columnar", "scan_vs_single_per_record", "scan_vs_floor"):
        print(f"| {ratio} | {figures[ratio]}× |")
    for label, name in (("single_reindex", "single-process reindex"), ("spark_reindex", "Spark reindex")):
        seconds = ", ".join(f"{s}" for s in figures[f"{label}_s"])
        print(f"| {name} (median of {len(figures[f'{label}_s'])}) | {figures[f'{label}_msgs_per_s']:,} msgs/s ({seconds} s) |")
    print(f"| Spark reindex ÷ single-process | {figures['spark_vs_single_reindex']}× |")
    return 0


def _same_tree(a: Path, b: Path) -> bool:
    def files(root: Path) -> dict[str, Path]:
        return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}

    left, right = files(a), files(b)
    if left.keys() != right.keys():
        return False
    for name, path in left.items():
        with open(path, "rb") as x, open(right[name], "rb") as y:
            while True:
                chunk = x.read(1 << 20)
                if chunk != y.read(1 << 20):
                    return False
                if not chunk:
                    break
    return True


if __name__ == "__main__":
    sys.exit(main())
