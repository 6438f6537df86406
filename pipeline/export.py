"""``rmqstore pipeline export``: a store's records as Parquet, partitioned by topic and date.

Layout (Hive-style partitions, readable by Spark, pyarrow, DuckDB, …)::

    OUT/topic=<topic>/date=<yyyy-MM-dd>/part-….parquet

``date`` is the UTC day of ``storeTimestamp``. Topic characters Hive paths cannot hold
(``%`` of RocketMQ's topic alphabet) are %-escaped in the directory name; readers decode
them. Each file holds the data source's columns (``pipeline.columns``) except ``topic``
(it is in the path), in commit log order within a file:

=========================  ==========================  ====================================
column                     Parquet type                meaning
=========================  ==========================  ====================================
commitLogOffset            int64                       where the record starts in the log
size                       int32                       TOTALSIZE, bytes
msgId                      string                      offsetMsgId (store host + offset)
queueId                    int32
queueOffset                int64                       0 for PREPARED and ROLLBACK records
sysFlag                    int32                       docs/format.md §3.3 (compression, tx, v6)
flag                       int32
bodyCRC                    int32                       CRC-32 of the body & 0x7FFFFFFF
bornTimestamp              int64                       epoch ms
storeTimestamp             int64                       epoch ms
bornHost, storeHost        string                      ``getHostAddress():port``
reconsumeTimes             int32
preparedTransactionOffset  int64
keys, tags, uniqKey        string (nullable)           the KEYS, TAGS, UNIQ_KEY properties
properties                 map<string, string>         every property, as stored
body                       binary                      the body as stored (compressed if
                                                       sysFlag bit 0 says so)
store                      string                      the store directory read
brokerName                 string                      the store's broker name (with
                                                       ``broker_names`` only)
=========================  ==========================  ====================================

Several stores (a cluster's writer groups) are exported as one data set: each partition
holds every group's rows of its topic and day, ordered by store, then commit log offset.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.times import iso_time
from rmqstore.pipeline import splits as planning
from rmqstore.pipeline.progress import Progress
from rmqstore.pipeline.source import FORMAT_NAME

DAY_MS = 86_400_000
# Pieces per core for a job's reads (each at most maxPartitionBytes, so a large store is
# cut finer). The planner cuts the data into even pieces, so more pieces per core balance
# nothing and each adds a Spark task's fixed cost (benchmarks/PIPELINE.md, "Partitions per
# core" and the reindex against the single process).
PIECES_PER_CORE = 1


def pieces_for(spark: Any) -> int:
    """How many pieces a job cuts its input into, at least (one wave of tasks)."""
    return PIECES_PER_CORE * int(spark.sparkContext.defaultParallelism)


@dataclass(frozen=True, slots=True)
class ExportSummary:
    rows: int
    partitions: list[tuple[str, str, int]]  # (topic, date, rows)


def read_store(spark: Any, stores: list[str], *, file_size_bytes: int | None = None) -> Any:
    """The data source over ``stores``, cut so every core gets a few pieces."""
    reader = spark.read.format(FORMAT_NAME).option("minPartitions", str(pieces_for(spark)))
    if file_size_bytes:
        reader = reader.option("commitlogFileSize", str(file_size_bytes))
    return reader.load(stores[0] if len(stores) == 1 else stores)


def store_list(store: str | Sequence[str]) -> list[str]:
    """One store directory or several, as a list (a job's ``store`` argument)."""
    return [store] if isinstance(store, str) else list(store)


def with_broker_names(frame: Any, stores: list[str], broker_names: Sequence[str] | None) -> Any:
    """``frame`` with a ``brokerName`` column naming each row's group by its ``store``
    (``broker_names[k]`` is ``stores[k]``'s), or as it is without names."""
    from pyspark.sql import functions as F

    if broker_names is None:
        return frame
    if len(broker_names) != len(stores):
        raise InvalidArgument(f"{len(broker_names)} broker names for {len(stores)} store(s): give one per store")
    names = F.create_map(*[F.lit(part) for pair in zip(stores, broker_names) for part in pair])
    return frame.withColumn("brokerName", names[F.col("store")])


def run(
    spark: Any,
    store: str | Sequence[str],
    out: str,
    *,
    broker_names: Sequence[str] | None = None,
    topic: str | None = None,
    begin_ms: int | None = None,
    end_ms: int | None = None,
    file_size_bytes: int | None = None,
    progress: Progress | None = None,
) -> ExportSummary:
    from pyspark.sql import functions as F

    progress = progress or Progress(spark, enabled=False)
    stores = store_list(store)
    for root in stores:
        planning.store_root(root)
    if os.path.exists(out):
        raise InvalidArgument(f"{out} already exists; export writes a new directory")
    if begin_ms is not None and end_ms is not None and end_ms < begin_ms:
        raise InvalidArgument(f"--end {iso_time(end_ms)} is before --begin {iso_time(begin_ms)}")
    frame = with_broker_names(read_store(spark, stores, file_size_bytes=file_size_bytes), stores, broker_names)
    if topic is not None:
        frame = frame.where(F.col("topic") == topic)
    if begin_ms is not None:
        frame = frame.where(F.col("storeTimestamp") >= begin_ms)
    if end_ms is not None:
        frame = frame.where(F.col("storeTimestamp") <= end_ms)
    frame = frame.withColumn("date", F.expr(f"date_from_unix_date(CAST(floor(storeTimestamp / {DAY_MS}) AS INT))"))
    with progress.phase(f"exporting {', '.join(stores)} to {out}"):
        (
            frame.sortWithinPartitions("topic", "date", "store", "commitLogOffset")
            .write.partitionBy("topic", "date")
            .parquet(out)
        )
    written = spark.read.parquet(out) if _has_data(out) else None
    if written is None:
        return ExportSummary(0, [])
    counts = sorted(
        (row["topic"], str(row["date"]), row["count"]) for row in written.groupBy("topic", "date").count().collect()
    )
    return ExportSummary(sum(count for _, _, count in counts), counts)


def _has_data(out: str) -> bool:
    return any(name.startswith("topic=") for name in os.listdir(out))
