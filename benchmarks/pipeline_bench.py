"""The Spark pipeline's throughput, beside the single-process reindex in the same run.

    python benchmarks/pipeline_bench.py --store /tmp/bench-store --messages 1000000 --master 'local[2]'

1. Workload (once; kept in --store and reused if it holds --messages records): the writer,
   in-process, appends N messages in batches of 1,000 at RocketMQ's default sizes (1 GiB
   commit log files, 300,000-unit queues, 5,000,000-slot / 20,000,000-entry index files).
   4 topics × 8 queues; a unique order key per message and, on 30 %, one of 16 hot keys;
   5 tags; bodies of 100–400 random bytes; seed 20261122.
2. Single-process ``reindex`` of the commit log (``common/files/store.py``): msgs/s.
3. Spark: a full scan counted through the data source, as the jobs read it
   (``spark.read.format("rmqstore").option("minPartitions", 3 × cores).load(store).count()``):
   rows/s, best and median of --scans runs; then the Spark ``reindex``: msgs/s, its output
   checked byte for byte against the single-process one.
4. For scale: the same ``count()`` through a Python data source that decodes nothing — it
   yields one pre-built batch of 32,768 rows (4,096 of the store's own records, repeated)
   over and over — which is what Spark's Python data source path itself allows here.

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
BATCH_ROWS = 32_768  # the data source's batch size (pipeline.scan.BATCH_ROWS_MAX)


def count_records(store: Path) -> int:
    from rmqstore.common.files.commitlog import CommitLog
    from rmqstore.common.files.store import StorePaths, resolve_sizes

    if not (store / "commitlog").is_dir():
        return 0
    log = CommitLog(StorePaths(str(store)).commitlog, resolve_sizes(str(store)).commitlog_file_size_bytes)
    try:
        return sum(1 for _ in log.headers(log.min_offset, log.max_file_offset))
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


def ceiling(spark: Any, store: Path, rows: int) -> float:
    """rows/s of count() over pre-built batches: no decoding, only Spark's own work."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from rmqstore.pipeline import columns

    pieces = 3 * spark.sparkContext.defaultParallelism
    root = str(store)

    class Reader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(n) for n in range(pieces)]

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa
            from rmqstore.common.files.commitlog import CommitLog
            from rmqstore.pipeline.scan import ColumnScan

            log = CommitLog(os.path.join(root, "commitlog"), 1 << 30)
            try:
                first = next(iter(ColumnScan(log, 0, log.max_file_offset, batch_rows=SAMPLE_ROWS)))
                small = columns.arrow_batch(first, root, columns.arrow_schema())
            finally:
                log.close()
            repeats = BATCH_ROWS // small.num_rows
            batch = pa.Table.from_batches([small] * repeats).combine_chunks().to_batches()[0]
            for _ in range(max(1, rows // pieces // batch.num_rows)):
                yield batch

    class Prebuilt(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rmqstore_bench_prebuilt"

        def schema(self) -> Any:
            return columns.spark_schema()

        def reader(self, schema: Any) -> Reader:
            return Reader()

    spark.dataSource.register(Prebuilt)
    best = 0.0
    for _ in range(3):
        started = time.perf_counter()
        counted = spark.read.format("rmqstore_bench_prebuilt").load().count()
        best = max(best, counted / (time.perf_counter() - started))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default=os.path.join(tempfile.gettempdir(), "rmqstore-bench-store"))
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--scans", type=int, default=3, help="full-scan runs (default 3)")
    args = parser.parse_args()

    from rmqstore.common.files.store import StoreSizes, reindex, resolve_sizes
    from rmqstore.pipeline import reindex as spark_reindex
    from rmqstore.pipeline import session
    from rmqstore.pipeline.export import read_store

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
        started = time.perf_counter()
        single = reindex(str(store), str(work / "single"), sizes)
        single_s = time.perf_counter() - started
        assert single.records == args.messages
        figures["single_reindex_s"] = round(single_s, 2)
        figures["single_reindex_msgs_per_s"] = round(args.messages / single_s)

        started = time.perf_counter()
        spark = session.start(args.master)
        figures["spark_start_s"] = round(time.perf_counter() - started, 1)
        figures["spark_parallelism"] = spark.sparkContext.defaultParallelism
        try:
            scans = []
            for _ in range(args.scans):
                started = time.perf_counter()
                counted = read_store(spark, [str(store)]).count()
                scans.append(time.perf_counter() - started)
                assert counted == args.messages, counted
            figures["scan_s"] = [round(s, 2) for s in scans]
            figures["scan_rows_per_s_best"] = round(args.messages / min(scans))
            figures["scan_rows_per_s_median"] = round(args.messages / statistics.median(scans))

            started = time.perf_counter()
            summary = spark_reindex.run(spark, str(store), str(work / "spark"), sizes)
            spark_s = time.perf_counter() - started
            assert summary.records == args.messages
            figures["spark_reindex_s"] = round(spark_s, 2)
            figures["spark_reindex_msgs_per_s"] = round(args.messages / spark_s)
            figures["python_source_ceiling_rows_per_s"] = round(ceiling(spark, store, args.messages))
        finally:
            spark.stop()
        figures["spark_vs_single_reindex"] = round(single_s / spark_s, 2)
        figures["reindex_outputs_identical"] = _same_tree(work / "single", work / "spark")
        assert figures["reindex_outputs_identical"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| full scan, `count()` (best of {args.scans}) | {figures['scan_rows_per_s_best']:,} rows/s |")
    print(f"| full scan, `count()` (median) | {figures['scan_rows_per_s_median']:,} rows/s |")
    print(f"| single-process reindex | {figures['single_reindex_msgs_per_s']:,} msgs/s ({figures['single_reindex_s']} s) |")
    print(f"| Spark reindex | {figures['spark_reindex_msgs_per_s']:,} msgs/s ({figures['spark_reindex_s']} s) |")
    print(f"| Spark reindex ÷ single-process | {figures['spark_vs_single_reindex']}× |")
    print(f"| Spark's Python data source with no decoding (best of 3) | {figures['python_source_ceiling_rows_per_s']:,} rows/s |")
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
