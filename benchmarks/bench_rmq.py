"""rmqstore in process: append + dispatch throughput, lookups on a StoreView, and
re-dispatch of a commit log (reindex, and a writer start without queues and index)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workload import KEY_PAGE_SIZE, QuerySets, Workload

APPEND_BATCH = 1000

# A lookup's comparable answer: the uniq keys found in order (+ the complete flag for
# keys), or the queue offset a time search found.
Answer = Any


def append_run(store: Path, workload: Workload, *, keep_times: bool) -> tuple[dict[str, Any], list[int]]:
    """Append the workload in batches of 1,000 to a fresh store through a writer with
    its ASYNC background flushes running, as ``writer serve`` runs it. Only
    ``writer.append`` is timed (building MessageInput objects is the workload's cost).
    Returns the figures and, with ``keep_times``, each message's acked store time."""
    from workload import QUEUES_PER_TOPIC, TOPICS

    from rmqstore.writer.config import FlushPolicy, WriterConfig
    from rmqstore.writer.store import Writer

    shutil.rmtree(store, ignore_errors=True)
    writer = Writer(WriterConfig(store=str(store), flush=FlushPolicy.ASYNC))
    times: list[int] = []
    elapsed_ns = 0
    try:
        for topic in TOPICS:
            writer.topics.create(topic, QUEUES_PER_TOPIC)
        writer.start_background()
        for indexes in workload.batches(APPEND_BATCH):
            batch = workload.message_inputs(indexes)
            started = time.perf_counter_ns()
            results = writer.append(batch)
            elapsed_ns += time.perf_counter_ns() - started
            if keep_times:
                times.extend(r.store_timestamp_ms for r in results)
        log_bytes = (writer.log.write_offset or 0) - writer.log.min_offset
    finally:
        closing = time.perf_counter_ns()
        writer.close()
        close_s = (time.perf_counter_ns() - closing) / 1e9
    seconds = elapsed_ns / 1e9
    return (
        {
            "messages": len(workload),
            "seconds": round(seconds, 3),
            "msgs_per_s": round(len(workload) / seconds),
            "commitlog_bytes": log_bytes,
            "commitlog_mb_per_s": round(log_bytes / seconds / 1e6, 1),
            "body_mb_per_s": round(len(workload) * workload.spec.body_bytes / seconds / 1e6, 1),
            "close_seconds": round(close_s, 3),
        },
        times,
    )


class InProcessLookups:
    """The lookups of the query sets on a read-only StoreView (what a query node runs)."""

    def __init__(self, store: Path):
        from rmqstore.common.files.consumequeue import Boundary
        from rmqstore.query.view import StoreView

        self.view = StoreView(str(store))
        self.boundaries = {"lower": Boundary.LOWER, "upper": Boundary.UPPER}

    def by_key(self, topic: str, key: str) -> Answer:
        page = self.view.by_key(topic, key, page_size=KEY_PAGE_SIZE)
        return tuple(r.uniq_key for r in page.records), page.complete

    def by_uniq_key(self, topic: str, uniq_key: str) -> Answer:
        return tuple(r.uniq_key for r in self.view.by_uniq_key(topic, uniq_key))

    def by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> Answer:
        return (self.view.by_queue_offset(topic, queue_id, queue_offset).uniq_key,)

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int, boundary: str) -> Answer:
        return self.view.search_offset(topic, queue_id, timestamp_ms, self.boundaries[boundary]).offset

    def close(self) -> None:
        self.view.close()


def lookup_calls(target: Any, queries: QuerySets, first_ms: int, last_ms: int) -> dict[str, list[Callable[[], Answer]]]:
    """Each query set as zero-argument calls on ``target`` (an object with by_key,
    by_uniq_key, by_queue_offset and search_offset), so every system is timed alike."""
    return {
        "key": [lambda q=q: target.by_key(q.topic, q.key) for q in queries.keys],
        "uniq_key": [lambda q=q: target.by_uniq_key(q.topic, q.uniq_key) for q in queries.uniq_keys],
        "queue_offset": [
            lambda q=q: target.by_queue_offset(q.topic, q.queue_id, q.queue_offset) for q in queries.offsets
        ],
        "time_search": [
            lambda q=q: target.search_offset(q.topic, q.queue_id, q.timestamp_ms(first_ms, last_ms), q.boundary)
            for q in queries.times
        ],
    }


def timed_calls(
    calls: list[Callable[[], Answer]], *, warmup: int, between: Callable[[], Any] | None = None
) -> tuple[list[int], list[Answer], list[int]]:
    """Run each call once, timing it alone (perf_counter_ns). The first ``warmup`` calls
    run once more beforehand, untimed. ``between`` (e.g. a no-op RPC) runs after each call,
    timed too, so a floor is measured under the same conditions."""
    for call in calls[:warmup]:
        _quietly(call)
    latencies: list[int] = []
    answers: list[Answer] = []
    floor: list[int] = []
    clock = time.perf_counter_ns
    for call in calls:
        started = clock()
        try:
            answer = call()
        except Exception as error:  # an error is an answer too: the cross-check reports it
            answer = ("error", type(error).__name__, str(error)[:200])
        latencies.append(clock() - started)
        answers.append(answer)
        if between is not None:
            started = clock()
            between()
            floor.append(clock() - started)
    return latencies, answers, floor


def _quietly(call: Callable[[], Answer]) -> None:
    try:
        call()
    except Exception:
        pass


def reindex_run(store: Path, out: Path) -> dict[str, Any]:
    """Re-dispatch: rebuild consumequeue/ and index/ from the commit log with the code
    ``rmqstore reindex`` runs (common/files/store.py: reindex)."""
    from rmqstore.common.files.store import reindex, resolve_sizes

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    sizes = resolve_sizes(str(store))
    started = time.perf_counter_ns()
    result = reindex(str(store), str(out), sizes)
    seconds = (time.perf_counter_ns() - started) / 1e9
    shutil.rmtree(out, ignore_errors=True)
    log_bytes = result.stop.end_offset
    return {
        "how": "common.files.store.reindex (rmqstore reindex)",
        "records": result.records,
        "commitlog_bytes": log_bytes,
        "seconds": round(seconds, 3),
        "mb_per_s": round(log_bytes / seconds / 1e6, 1),
        "msgs_per_s": round(result.records / seconds),
    }


def writer_redispatch_run(store: Path) -> dict[str, Any]:
    """Re-dispatch by recovery: remove consumequeue/ and index/ of a cleanly stopped
    store and time a writer start (it re-dispatches every record), then stop it."""
    from rmqstore.common.files.store import StorePaths
    from rmqstore.writer.config import WriterConfig
    from rmqstore.writer.store import Writer

    paths = StorePaths(str(store))
    shutil.rmtree(paths.consumequeue)
    shutil.rmtree(paths.index)
    started = time.perf_counter_ns()
    writer = Writer(WriterConfig(store=str(store)))
    seconds = (time.perf_counter_ns() - started) / 1e9
    report = writer.recovery
    log_bytes = report.stop.end_offset - report.redispatch_from
    writer.close()
    return {
        "how": "Writer start with consumequeue/ and index/ removed (recovery re-dispatch)",
        "records": report.redispatched_records,
        "commitlog_bytes": log_bytes,
        "seconds": round(seconds, 3),
        "mb_per_s": round(log_bytes / seconds / 1e6, 1),
        "msgs_per_s": round(report.redispatched_records / seconds),
    }


def sync_threads_run(store: Path, workload: Workload, producers: int, seconds: float, warmup_s: float) -> dict[str, Any]:
    """SYNC flush in process: ``producers`` tasks on one event loop each appending one
    message at a time through the writer's group commit (GroupAppender, as its service
    runs it) and waiting for its fsync: the group commit without gRPC in the way. Counts
    the acks of the ``seconds`` after ``warmup_s``."""
    import asyncio

    from workload import QUEUES_PER_TOPIC, TOPICS

    from rmqstore.writer.config import FlushPolicy, WriterConfig
    from rmqstore.writer.group_commit import GroupAppender
    from rmqstore.writer.metrics import WriterMetrics
    from rmqstore.writer.store import Writer
    from rmqstore.writer.validate import MessageBatch

    shutil.rmtree(store, ignore_errors=True)
    writer = Writer(WriterConfig(store=str(store), flush=FlushPolicy.SYNC))
    for topic in TOPICS:
        writer.topics.create(topic, QUEUES_PER_TOPIC)
    appender = GroupAppender(writer, WriterMetrics(writer))
    batches = [MessageBatch.of([message]) for message in workload.message_inputs(range(len(workload)))]
    start = time.perf_counter() + warmup_s
    stop = start + seconds
    latencies: list[list[int]] = [[] for _ in range(producers)]

    async def produce(number: int) -> None:
        position = number
        while (now := time.perf_counter()) < stop:
            began = time.perf_counter_ns()
            await appender.append(batches[position % len(batches)], None, lambda results: results)
            if now >= start:
                latencies[number].append(time.perf_counter_ns() - began)
            position += producers

    async def run() -> None:
        await asyncio.gather(*(produce(n) for n in range(producers)))

    try:
        asyncio.run(run())
    finally:
        appender.close()
        writer.close()
        shutil.rmtree(store, ignore_errors=True)
    measured = [ns for per_thread in latencies for ns in per_thread]
    return {"producers": producers, "acked": len(measured), "seconds": seconds, "latencies_ns": measured}
