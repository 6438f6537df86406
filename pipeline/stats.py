"""``rmqstore pipeline stats``: what a store holds, per topic and queue, and how full and
how deeply chained its index files are.

Per topic and per queue: records, store-time range, bytes (records and bodies), queue
offset range, key cardinality (distinct KEYS parts); per topic the hottest keys. Per index
file: entries used and fill, slots used, and the chain lengths a lookup walks (a chain
starts at a slot and links each entry to the previous entry of that slot).

Several stores (a cluster's writer groups, each with its broker name when given) are read
as one data set: topics and their hottest keys count every group's messages; queues stay
per group (queue 0 of broker-a is not queue 0 of broker-b), each naming its store and
broker name, and so do index files; ``stores`` has each group's totals.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from rmqstore.common.codec import index as ix
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.index import IndexFile
from rmqstore.common.files.store import StorePaths, StoreSizes
from rmqstore.common.times import iso_time
from rmqstore.pipeline import splits as planning
from rmqstore.pipeline.export import read_store, store_list
from rmqstore.pipeline.progress import Progress

TOP_KEYS_DEFAULT = 5
# Chain-length histogram buckets: (label, lowest length, highest length).
CHAIN_BUCKETS = (("1", 1, 1), ("2", 2, 2), ("3-4", 3, 4), ("5-8", 5, 8), ("9-16", 9, 16), (">16", 17, 2**31))


def index_file_stats(path: str, slots: int, entries: int) -> dict[str, Any]:
    """Fill and chain lengths of one index file, read-only."""
    index_file = IndexFile.open(path, slots, entries, writable=False)
    try:
        header = index_file.header
        used = max(header.index_count, 1) - 1
        buf = index_file.mapped.buf
        depth = [0] * (used + 1)  # chain length from entry n back to its slot's first entry
        first = ix.entry_position(slots, 1)
        for number, (_, _, _, prev) in enumerate(ix.ENTRY.iter_unpack(buf[first : first + used * ix.ENTRY_SIZE]), start=1):
            depth[number] = depth[prev] + 1 if 0 < prev < number else 1
        lengths = []
        for (head,) in ix.SLOT.iter_unpack(buf[ix.HEADER_SIZE : ix.HEADER_SIZE + slots * ix.SLOT_SIZE]):
            if 0 < head <= used:
                lengths.append(depth[head])
    finally:
        index_file.close()
    lengths.sort()
    histogram = {label: 0 for label, _, _ in CHAIN_BUCKETS}
    for length in lengths:
        for label, low, high in CHAIN_BUCKETS:
            if low <= length <= high:
                histogram[label] += 1
                break
    return {
        "file": os.path.basename(path),
        "entries": used,
        "fill": used / (entries - 1),
        "slotsUsed": len(lengths),
        "slotFill": len(lengths) / slots,
        "hashSlotCount": header.hash_slot_count,
        "beginTimestamp": header.begin_timestamp_ms,
        "endTimestamp": header.end_timestamp_ms,
        "chainMax": lengths[-1] if lengths else 0,
        "chainMean": sum(lengths) / len(lengths) if lengths else 0.0,
        "chainP99": lengths[min(len(lengths) - 1, len(lengths) * 99 // 100)] if lengths else 0,
        "chainHistogram": histogram,
    }


def run(
    spark: Any,
    store: str | Sequence[str],
    sizes: StoreSizes,
    *,
    top: int = TOP_KEYS_DEFAULT,
    broker_names: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The report over one store or several (``broker_names[k]`` naming ``store[k]``'s group)."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    progress = progress or Progress(spark, enabled=False)
    stores = store_list(store)
    for root in stores:
        planning.store_root(root)
    if broker_names is not None and len(broker_names) != len(stores):
        raise InvalidArgument(f"{len(broker_names)} broker names for {len(stores)} store(s): give one per store")
    frame = read_store(spark, stores, file_size_bytes=sizes.commitlog_file_size_bytes)
    base = frame.select(
        "store",
        "topic",
        "queueId",
        "queueOffset",
        "storeTimestamp",
        "size",
        F.length("body").alias("bodyBytes"),
        "keys",
    ).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        measures = [
            F.count(F.lit(1)).alias("messages"),
            F.sum("size").alias("bytes"),
            F.sum("bodyBytes").alias("bodyBytes"),
            F.min("storeTimestamp").alias("beginTimestamp"),
            F.max("storeTimestamp").alias("endTimestamp"),
        ]
        keys = base.select("store", "topic", "queueId", F.explode(F.split("keys", " ")).alias("key")).where(F.col("key") != "")
        queue = ["store", "topic", "queueId"]  # a queue is one group's
        with progress.phase(f"reading {', '.join(stores)}"):
            queue_rows = (
                base.groupBy(*queue)
                .agg(*measures, F.min("queueOffset").alias("minQueueOffset"), F.max("queueOffset").alias("maxQueueOffset"))
                .join(keys.groupBy(*queue).agg(F.countDistinct("key").alias("distinctKeys")), queue, "left")
                .collect()
            )
        with progress.phase("counting keys"):
            topic_rows = (
                base.groupBy("topic")
                .agg(*measures)
                .join(keys.groupBy("topic").agg(F.countDistinct("key").alias("distinctKeys")), ["topic"], "left")
                .collect()
            )
            ranked = keys.groupBy("topic", "key").agg(F.count(F.lit(1)).alias("messages"))
            order = Window.partitionBy("topic").orderBy(F.desc("messages"), F.asc("key"))
            hot_rows = ranked.withColumn("rank", F.row_number().over(order)).where(F.col("rank") <= top).collect()
    finally:
        base.unpersist()
    paths: list[tuple[str, str]] = []  # (store, index file)
    for root in stores:
        index_dir = StorePaths(root).index
        names = sorted(n for n in os.listdir(index_dir) if ix.is_file_name(n)) if os.path.isdir(index_dir) else []
        paths.extend((root, os.path.join(index_dir, name)) for name in names)
    slots, entries = sizes.index_slots, sizes.index_entries
    index_files: list[dict[str, Any]] = []
    if paths:
        with progress.phase(f"walking {len(paths)} index file(s)"):
            walked = spark.sparkContext.parallelize([path for _, path in paths], len(paths)).map(lambda path: index_file_stats(path, slots, entries)).collect()
        index_files = [{"store": root, **item} for (root, _), item in zip(paths, walked)]
    return _report(stores, broker_names, queue_rows, topic_rows, hot_rows, index_files, sizes)


def _report(
    stores: list[str],
    broker_names: Sequence[str] | None,
    queue_rows: list[Any],
    topic_rows: list[Any],
    hot_rows: list[Any],
    index_files: list[dict[str, Any]],
    sizes: StoreSizes,
) -> dict[str, Any]:
    """The report. With one store and no broker name it is what it has always been; with
    several (or a broker name) queues and index files name their store and broker name,
    and ``stores`` holds each store's totals."""
    cluster = len(stores) > 1 or broker_names is not None
    position = {root: k for k, root in enumerate(stores)}
    brokers: dict[str, str | None] = {root: None for root in stores}
    if broker_names is not None:
        brokers.update(zip(stores, broker_names))
    queues: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(queue_rows, key=lambda r: (r["topic"], position[r["store"]], r["queueId"])):
        entry = row.asDict()
        topic = entry.pop("topic")
        root = entry.pop("store")
        if cluster:
            entry = {"store": root, "brokerName": brokers[root], **entry}
        entry["distinctKeys"] = entry["distinctKeys"] or 0
        queues.setdefault(topic, []).append(entry)
    for item in index_files:
        root = item.pop("store")
        if cluster:
            item.update({"store": root, "brokerName": brokers[root]})
    hottest: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(hot_rows, key=lambda r: (r["topic"], r["rank"])):
        hottest.setdefault(row["topic"], []).append({"key": row["key"], "messages": row["messages"]})
    topics = []
    for row in sorted(topic_rows, key=lambda r: r["topic"]):
        entry = row.asDict()
        entry["distinctKeys"] = entry["distinctKeys"] or 0
        entry["hottestKeys"] = hottest.get(row["topic"], [])
        entry["queues"] = queues.get(row["topic"], [])
        topics.append(entry)
    report: dict[str, Any] = {"store": stores[0]} if len(stores) == 1 else {}
    report.update(_totals(topics))
    if cluster:
        report["stores"] = [
            {"store": root, "brokerName": brokers[root], **_totals([r.asDict() for r in queue_rows if r["store"] == root])}
            for root in stores
        ]
    report["topics"] = topics
    report["index"] = {"slots": sizes.index_slots, "entries": sizes.index_entries, "files": index_files}
    return report


def _totals(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """Messages, bytes and store-time range over topics' or queues' measures."""
    begins = [g["beginTimestamp"] for g in groups]
    ends = [g["endTimestamp"] for g in groups]
    return {
        "messages": sum(g["messages"] for g in groups),
        "bytes": sum(g["bytes"] for g in groups),
        "bodyBytes": sum(g["bodyBytes"] for g in groups),
        "beginTimestamp": min(begins) if begins else None,
        "endTimestamp": max(ends) if ends else None,
    }


def _store_label(item: dict[str, Any]) -> str:
    return f"{item['store']} ({item['brokerName']})" if item["brokerName"] else item["store"]


def _time(epoch_ms: int | None) -> str:
    return "-" if epoch_ms is None else iso_time(epoch_ms)


def render(report: dict[str, Any]) -> str:
    """The report as tables for a terminal (times in ISO 8601, UTC; ``--json`` keeps epoch ms)."""
    stores = report.get("stores")
    if stores is None:
        where = [f"store     {report['store']}"]
    else:
        where = [f"stores    {', '.join(_store_label(item) for item in stores)}"]
    lines = [
        *where,
        f"messages  {report['messages']:,} ({report['bytes']:,} B in records, {report['bodyBytes']:,} B of bodies)",
        f"times     [{_time(report['beginTimestamp'])}, {_time(report['endTimestamp'])}]",
        "",
    ]
    header = (
        f"{'topic/queue':<40} {'messages':>10} {'bytes':>14} {'keys':>9}  "
        f"{'first store time':<24}  {'last store time':<24}  offsets"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for topic in report["topics"]:
        lines.append(
            f"{topic['topic'][:40]:<40} {topic['messages']:>10,} {topic['bytes']:>14,} {topic['distinctKeys']:>9,}  "
            f"{_time(topic['beginTimestamp']):<24}  {_time(topic['endTimestamp']):<24}"
        )
        for queue in topic["queues"]:
            group = f"{queue.get('brokerName') or queue['store']}/" if "store" in queue else ""
            name = f"  {topic['topic'][:30]}/{group}{queue['queueId']}"
            lines.append(
                f"{name:<40} {queue['messages']:>10,} {queue['bytes']:>14,} {queue['distinctKeys']:>9,}  "
                f"{_time(queue['beginTimestamp']):<24}  {_time(queue['endTimestamp']):<24}  [{queue['minQueueOffset']}, {queue['maxQueueOffset']}]"
            )
    lines.append("")
    lines.append("hottest keys")
    for topic in report["topics"]:
        hot = ", ".join(f"{item['key']} ({item['messages']:,})" for item in topic["hottestKeys"]) or "-"
        lines.append(f"  {topic['topic']}: {hot}")
    index = report["index"]
    lines.append("")
    lines.append(f"index files ({len(index['files'])}; {index['slots']:,} slots, {index['entries']:,} entries each)")
    if index["files"]:
        header = f"  {'file':<20} {'entries':>10} {'fill':>7} {'slots used':>11} {'chain max':>9} {'mean':>6} {'p99':>5}"
        lines.append(header)
        for item in index["files"]:
            group = f"{item.get('brokerName') or item['store']}/" if "store" in item else ""
            lines.append(
                f"  {group + item['file']:<20} {item['entries']:>10,} {item['fill']:>7.1%} {item['slotsUsed']:>11,} "
                f"{item['chainMax']:>9} {item['chainMean']:>6.2f} {item['chainP99']:>5}"
            )
    return "\n".join(lines)
