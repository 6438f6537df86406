"""``spark.read.format("rmqstore").load(STORE)``: a PySpark data source over commit logs.

One partition per commit log file; larger files are cut at record starts (``pipeline.splits``
says how cuts are found and checked). Each partition decodes its range in bulk with the
store library's columnar decoder (``common.files.scan``: ``codec.columnar``, with
``CommitLog.records``' recovery contract where the records end) and returns Arrow batches
built from its buffers (``pipeline.columns``).

Options:

* ``path`` or several paths (``load([a, b])``): store directories (each holds commitlog/);
* ``commitlogFileSize``: bytes per commit log file (default: the files' own size);
* ``maxPartitionBytes``: cut files larger than this (default 256 MiB);
* ``minPartitions``: with fewer files than this, cut their data into about this many
  pieces (default 1; the jobs pass one per core);
* ``checkCrc``: verify body CRCs (default true);
* ``batchRows``: records per Arrow batch (default 8192; batches also stop at 32 MiB).

Pushed-down filters (Spark applies the others after the read): ``topic`` = / IN, and
``storeTimestamp`` and ``commitLogOffset`` = < <= > >=. Time and offset filters drop whole
files and pieces before reading (a time filter walks the headers of each file to learn its
exact time range); every pushed filter is then applied to each record exactly.

A torn tail ends the data, as in ``rmqstore dump``; corruption fails the read, naming its
commit log offset. Filtered reads validate only what they read.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.commitlog import CommitLog, StopReason
from rmqstore.common.files.scan import ColumnScan
from rmqstore.common.files.store import StorePaths
from rmqstore.pipeline import columns, splits
from rmqstore.pipeline.splits import TIME_MAX_MS, TIME_MIN_MS, Split, TimeRange

ALL_TIMES = TimeRange()

FORMAT_NAME = "rmqstore"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
# Records per Arrow batch. Spark's JVM copies every row of a batch out of Arrow; batches of
# a few MB keep that copy in cache (benchmarks/PIPELINE.md has the figures).
BATCH_ROWS_DEFAULT = 8192


def register(spark: Any) -> None:
    """Make ``format("rmqstore")`` available in a session (and let it take filters)."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(RmqstoreDataSource)


@dataclass(frozen=True, slots=True)
class RowFilter:
    """The pushed filters, ANDed: a topic set, and inclusive store-time and offset bounds."""

    topics: frozenset[str] | None = None
    times: TimeRange = ALL_TIMES
    offset_min: int = TIME_MIN_MS
    offset_max: int = TIME_MAX_MS

    @property
    def is_all(self) -> bool:
        return self.topics is None and self.times.is_all and self.offset_min <= TIME_MIN_MS and self.offset_max >= TIME_MAX_MS

    @property
    def is_empty(self) -> bool:
        return (self.topics is not None and not self.topics) or self.times.is_empty or self.offset_min > self.offset_max

    def apply(self, batch: Any) -> Any:
        """The rows of an Arrow batch of the source's schema that the filter keeps."""
        import pyarrow as pa
        import pyarrow.compute as pc

        times = batch.column("storeTimestamp")
        offsets = batch.column("commitLogOffset")
        keep = pc.and_(
            pc.and_(pc.greater_equal(times, self.times.begin_ms), pc.less_equal(times, self.times.end_ms)),
            pc.and_(pc.greater_equal(offsets, self.offset_min), pc.less_equal(offsets, self.offset_max)),
        )
        if self.topics is not None:
            keep = pc.and_(keep, pc.is_in(batch.column("topic"), value_set=pa.array(sorted(self.topics), pa.string())))
        return batch.filter(keep)


def _bound(current: tuple[int, int], item: Filter) -> tuple[int, int] | None:
    """Narrow inclusive bounds by one comparison with an integer, or None if it is not one."""
    value = getattr(item, "value", None)
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    low, high = current
    if isinstance(item, EqualTo):
        return max(low, value), min(high, value)
    if isinstance(item, GreaterThan):
        return max(low, value + 1), high
    if isinstance(item, GreaterThanOrEqual):
        return max(low, value), high
    if isinstance(item, LessThan):
        return low, min(high, value - 1)
    if isinstance(item, LessThanOrEqual):
        return low, min(high, value)
    return None


def push(filters: Sequence[Filter], current: RowFilter = RowFilter()) -> tuple[RowFilter, list[Filter]]:
    """Split Spark's filters into what the source applies and what Spark must still apply."""
    topics = current.topics
    times = (current.times.begin_ms, current.times.end_ms)
    offsets = (current.offset_min, current.offset_max)
    rest: list[Filter] = []
    for item in filters:
        path: tuple[str, ...] = getattr(item, "attribute", ())
        column = path[0] if len(path) == 1 else None
        if isinstance(item, IsNotNull) and column in columns.NON_NULL_COLUMNS:
            continue  # always true
        if column == "topic" and isinstance(item, EqualTo) and isinstance(item.value, str):
            topics = frozenset({item.value}) if topics is None else topics & {item.value}
            continue
        if column == "topic" and isinstance(item, In) and all(isinstance(v, str) for v in item.value):
            values = frozenset(item.value)
            topics = values if topics is None else topics & values
            continue
        if column in ("storeTimestamp", "commitLogOffset"):
            narrowed = _bound(times if column == "storeTimestamp" else offsets, item)
            if narrowed is not None:
                if column == "storeTimestamp":
                    times = narrowed
                else:
                    offsets = narrowed
                continue
        rest.append(item)
    return RowFilter(topics, TimeRange(*times), *offsets), rest


class SplitPartition(InputPartition):
    """One partition: a split of one commit log file."""

    def __init__(self, split: Split):
        super().__init__(split)
        self.split = split


def _option_int(options: Any, name: str, default: int | None) -> int | None:
    text = options.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(f"option {name} must be an integer, got {text!r}") from None


def _option_bool(options: Any, name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    lowered = str(text).strip().lower()
    if lowered not in ("true", "false"):
        raise InvalidArgument(f"option {name} must be true or false, got {text!r}")
    return lowered == "true"


def store_paths(options: Any) -> list[str]:
    if options.get("paths"):
        found = json.loads(options["paths"])
    elif options.get("path"):
        found = [options["path"]]
    else:
        found = []
    if not found:
        raise InvalidArgument('give the store directory: spark.read.format("rmqstore").load(STORE)')
    return [str(path) for path in found]


class RmqstoreDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return columns.spark_schema()

    def reader(self, schema: StructType) -> RmqstoreReader:
        return RmqstoreReader(self.options, schema)


class RmqstoreReader(DataSourceReader):
    def __init__(self, options: Any, schema: StructType):
        if [field.name for field in schema.fields] != list(columns.COLUMN_NAMES):
            raise InvalidArgument(f"the rmqstore source has a fixed schema: {', '.join(columns.COLUMN_NAMES)}")
        self.roots = store_paths(options)
        for root in self.roots:
            splits.store_root(root)
        self.file_size_bytes = _option_int(options, "commitlogFileSize", None)
        self.max_partition_bytes = _option_int(options, "maxPartitionBytes", splits.DEFAULT_MAX_PARTITION_BYTES)
        self.min_partitions = _option_int(options, "minPartitions", 1)
        self.check_crc = _option_bool(options, "checkCrc", True)
        batch_rows = _option_int(options, "batchRows", BATCH_ROWS_DEFAULT)
        if batch_rows is None or batch_rows < 1:
            raise InvalidArgument(f"option batchRows must be at least 1, got {batch_rows}")
        self.batch_rows = batch_rows
        self.filter = RowFilter()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.filter, rest = push(filters, self.filter)
        return rest

    def splits(self) -> list[Split]:
        if self.filter.is_empty:
            return []
        offsets = None
        if self.filter.offset_min > TIME_MIN_MS or self.filter.offset_max < TIME_MAX_MS:
            offsets = (max(self.filter.offset_min, 0), min(self.filter.offset_max, TIME_MAX_MS - 1) + 1)
        assert self.max_partition_bytes is not None and self.min_partitions is not None
        return splits.plan(
            self.roots,
            file_size_bytes=self.file_size_bytes,
            max_partition_bytes=self.max_partition_bytes,
            min_partitions=self.min_partitions,
            times=self.filter.times,
            offsets=offsets,
        )

    def partitions(self) -> list[InputPartition]:
        return [SplitPartition(split) for split in self.splits()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        _freeze_loaded_objects()
        if not isinstance(partition, SplitPartition):
            return iter(())  # Spark's placeholder when there are no splits
        return read_split(partition.split, self.filter, check_crc=self.check_crc, batch_rows=self.batch_rows)


_frozen = False


def _freeze_loaded_objects() -> None:
    """Take the objects alive in this Python worker out of later garbage collections, once
    per process. Spark's daemon-forked workers run a full ``gc.collect()`` after every task
    (pyspark/daemon.py); with pyspark, pyarrow and numpy loaded that walks every object of
    those modules, for each task of a scan (its cost: benchmarks/PIPELINE.md, "No full
    garbage collection"). They are the loaded modules' objects, as long-lived as the
    process; the task's own are collected as before."""
    global _frozen
    if not _frozen:
        gc.freeze()
        _frozen = True


def read_split(
    split: Split, row_filter: RowFilter = RowFilter(), *, check_crc: bool = True, batch_rows: int = BATCH_ROWS_DEFAULT
) -> Iterator[Any]:
    """Arrow batches of the records in ``split`` that ``row_filter`` keeps. Corruption in
    the split raises; a torn tail or the end of the log ends it."""
    log = CommitLog(StorePaths(split.store).commitlog, split.file_size_bytes)
    try:
        scan = ColumnScan(log, split.start, split.stop, check_crc=check_crc, batch_rows=batch_rows)
        schema = columns.arrow_schema()
        last_end = split.start
        for decoded in scan:
            last_end = int(decoded.commitlog_offset[-1]) + int(decoded.size[-1])
            batch = columns.arrow_batch(decoded, split.store, schema)
            if not row_filter.is_all:
                batch = row_filter.apply(batch)
            if batch.num_rows:
                yield batch
        splits.check_cut(split, last_end)
        if scan.stop is not None and scan.stop.reason is StopReason.CORRUPT:
            assert scan.stop.error is not None
            raise scan.stop.error
    finally:
        log.close()
