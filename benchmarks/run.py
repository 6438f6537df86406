"""rmqstore's benchmark suite, with a SQLite baseline measured in the same run.

    python benchmarks/run.py                       # sizes 200,000 and 1,000,000; about 15 minutes
    python benchmarks/run.py --sizes 2000 --repeats 1 --lookups 200 --time-searches 20 --out /tmp/smoke

Writes RESULTS.md (the command at the top) into --out (default: benchmarks/) and every
figure as JSON into --out/results/. Sections (``--only`` picks some):

  append       1. in-process append + dispatch, ASYNC flush: msgs/s, MB/s
  grpc_append  2. the same through the writer's SendStream from another process, acked; and
               `rmqstore send --file` of the workload as JSON Lines, end to end, per --acks mode
  sync         3. SYNC flush, 1/16/64 concurrent producers: msgs/s, p50/p99 ack latency
  lookups      4. lookup latency p50/p99 per kind, in process and through the query node
               (beside a no-op Ping), every answer cross-checked against SQLite's
  lag          5. query-node visibility lag (ack → visible) under load
  recovery     6. restart after SIGKILL (s/GB of commit log), re-dispatch throughput
  rss          7. query-node memory after the query sets, per size

Exit status 1 when any lookup answer disagrees with SQLite (or a time search with the
store's own times): the figures are still written, with the disagreements.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bare_unary  # noqa: E402
import bench_grpc  # noqa: E402
import bench_rmq  # noqa: E402
import ceilings  # noqa: E402
import native_client  # noqa: E402
import report  # noqa: E402
import sqlite_baseline  # noqa: E402
from bench_common import (  # noqa: E402
    Nodes,
    directory_bytes,
    latency_summary,
    load_average,
    machine_facts,
    median_of,
    quiet_env,
    ratio,
    run_client,
)
from workload import (  # noqa: E402
    DEFAULT_SEED,
    QuerySets,
    TimeOracle,
    Workload,
    WorkloadSpec,
    build_query_sets,
)

SNAPSHOT_ENV = "RMQSTORE_BENCH_SNAPSHOT"  # set in the re-executed process: the snapshot's directory
PACKAGES = ("cli", "common", "pipeline", "query", "service", "writer")  # rmqstore.<name> = <name>/
SECTIONS = ("append", "grpc_append", "sync", "lookups", "lag", "recovery", "rss")
SYNC_WORKLOAD_MAX = 20_000  # messages the SYNC producers cycle through
# The SYNC target is judged on producers that each keep one SendStream and wait for every
# ack (as a RocketMQ producer keeps its connection), driven by the C++ client so that the
# load takes little of the machine the writer needs (bench_grpc.sync_run, native_client.py);
# by the Python client when the C++ one is not asked for (--sync-clients python).
HEADLINE_SYNC_CALL = "stream"
LAG_WORKLOAD_MAX = 200_000  # messages the lag section's load client cycles through
MISMATCH_EXAMPLES = 20


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclass
class Context:
    args: argparse.Namespace
    work: Path
    sections: set[str]

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    def spec(self, messages: int) -> WorkloadSpec:
        return WorkloadSpec(messages, self.args.body_bytes, self.args.seed)


@dataclass
class CrossCheck:
    """Every lookup answer compared with its reference; disagreements kept as examples."""

    checked: dict[str, int] = field(default_factory=dict)
    mismatches: dict[str, int] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def compare(self, label: str, queries: list[Any], ours: list[Any], reference: list[Any], reference_name: str) -> None:
        self.checked[label] = self.checked.get(label, 0) + len(queries)
        bad = 0
        for query, answer, expected in zip(queries, ours, reference, strict=True):
            if answer != expected:
                bad += 1
                if len(self.examples) < MISMATCH_EXAMPLES:
                    self.examples.append(
                        {"check": label, "query": repr(query), "rmqstore": repr(answer), reference_name: repr(expected)}
                    )
        self.mismatches[label] = self.mismatches.get(label, 0) + bad

    @property
    def total_mismatches(self) -> int:
        return sum(self.mismatches.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "mismatches": self.mismatches,
            "total_checked": sum(self.checked.values()),
            "total_mismatches": self.total_mismatches,
            "examples": self.examples,
        }


# 1. In-process append


def section_append(ctx: Context, workload: Workload, store: Path, db: Path) -> tuple[dict[str, Any], list[int]]:
    """Alternate rmqstore and SQLite runs (drift on a shared machine hits both alike);
    the last run of each stays for the lookups."""
    measured = "append" in ctx.sections
    repeats = ctx.args.repeats if measured else 1
    ours, theirs = [], []
    times: list[int] = []
    for run in range(repeats):
        figures, times = bench_rmq.append_run(store, workload, keep_times=run == repeats - 1)
        ours.append(figures)
        log(f"  append rmqstore {run + 1}/{repeats}: {figures['msgs_per_s']:,} msgs/s")
        gc.collect()
        theirs.append(sqlite_baseline.load(db, workload))
        log(f"  append SQLite   {run + 1}/{repeats}: {theirs[-1]['msgs_per_s']:,} msgs/s")
        gc.collect()
    rmq = median_of(ours, "msgs_per_s")
    sql = median_of(theirs, "msgs_per_s")
    return (
        {
            "measured": measured,
            "batch": bench_rmq.APPEND_BATCH,
            "rmqstore_runs": ours,
            "sqlite_runs": theirs,
            "msgs_per_s": rmq,
            "commitlog_mb_per_s": median_of(ours, "commitlog_mb_per_s"),
            "sqlite_msgs_per_s": sql,
            "sqlite_stored_mb_per_s": median_of(theirs, "stored_mb_per_s"),
            "ratio": ratio(rmq, sql),
        },
        times,
    )


# 2. gRPC append


def section_grpc_append(ctx: Context, workload: Workload, sqlite_msgs_per_s: float | None) -> dict[str, Any]:
    spec = workload.spec
    runs = []
    for run in range(ctx.args.repeats):
        store = ctx.work / f"grpc-{spec.messages}"
        runs.append(bench_grpc.grpc_append_run(store, spec, ctx.logs, ctx.args.batch))
        shutil.rmtree(store, ignore_errors=True)
        log(f"  gRPC append {run + 1}/{ctx.args.repeats}: {runs[-1]['msgs_per_s']:,} msgs/s acked")
    rmq = median_of(runs, "msgs_per_s")
    return {
        "batch": ctx.args.batch,
        "runs": runs,
        "msgs_per_s": rmq,
        "sqlite_msgs_per_s": sqlite_msgs_per_s,
        "sqlite_note": "SQLite in process (it has no server): the append section's median",
        "ratio": ratio(rmq, sqlite_msgs_per_s),
        "send_file": section_send_file(ctx, workload, sqlite_msgs_per_s),
    }


def section_send_file(ctx: Context, workload: Workload, sqlite_msgs_per_s: float | None) -> dict[str, Any]:
    """`rmqstore send --file` of the workload as JSON Lines into an ASYNC writer, the
    process timed end to end, for each --acks mode."""
    spec = workload.spec
    jsonl = ctx.work / f"send-{spec.messages}.jsonl"
    bench_grpc.write_send_file(workload, jsonl)
    modes: dict[str, Any] = {}
    for acks in bench_grpc.SEND_FILE_ACKS:
        runs = []
        for run in range(ctx.args.repeats):
            store = ctx.work / f"send-file-{spec.messages}"
            runs.append(bench_grpc.send_file_run(store, jsonl, spec.messages, ctx.logs, acks, ctx.args.batch))
            shutil.rmtree(store, ignore_errors=True)
            log(f"  send --file --acks {acks} {run + 1}/{ctx.args.repeats}: {runs[-1]['msgs_per_s']:,} msgs/s end to end")
        rmq = median_of(runs, "msgs_per_s")
        modes[acks] = {"runs": runs, "msgs_per_s": rmq, "ratio": ratio(rmq, sqlite_msgs_per_s)}
    file_bytes = jsonl.stat().st_size
    jsonl.unlink()
    return {"file_bytes": file_bytes, "modes": modes, "sqlite_msgs_per_s": sqlite_msgs_per_s}


# 3. SYNC flush with concurrent producers


def section_sync(ctx: Context) -> dict[str, Any]:
    """Each way of sending (bench_grpc.sync_run) against the writer, the same ways against
    a no-op asyncio server (what Python gRPC allows here with that client), N threads
    appending in process, and SQLite, alternating within each repeat."""
    spec = ctx.spec(min(ctx.args.sizes[0], SYNC_WORKLOAD_MAX))
    workload = Workload(spec)
    counts = ctx.args.sync_producers
    most = max(counts)
    clients = ctx.args.sync_clients
    headline_way = bench_grpc.sync_way(clients[0], HEADLINE_SYNC_CALL)
    requests = {}
    if "cpp" in clients:
        for call in bench_grpc.SYNC_CALLS:
            requests[call] = ctx.work / f"sync-{call}-requests.bin"
            native_client.write_requests(requests[call], workload, call)
    ways = [bench_grpc.sync_way(client, call) for client in clients for call in bench_grpc.SYNC_CALLS]
    ours: dict[str, dict[int, list[dict[str, Any]]]] = {way: {p: [] for p in counts} for way in ways}
    ceiling: dict[str, list[int]] = {way: [] for way in ways}
    inner: dict[int, list[dict[str, Any]]] = {p: [] for p in counts}
    theirs: dict[int, list[dict[str, Any]]] = {p: [] for p in counts}
    for run in range(ctx.args.repeats):
        store = ctx.work / "sync"
        for way, results in bench_grpc.sync_run(store, spec, requests, ctx.logs, counts, ctx.args.sync_seconds, clients).items():
            for result in results:
                ours[way][result["producers"]].append(_sync_figures(result))
        shutil.rmtree(store, ignore_errors=True)
        for client in clients:
            for call in bench_grpc.SYNC_CALLS:
                figures = ceilings.grpc_noop("aio", call, most, ctx.args.sync_seconds, client, requests.get(call))
                ceiling[bench_grpc.sync_way(client, call)].append(figures["messages_per_s"])
        for producers in counts:
            result = bench_rmq.sync_threads_run(store, workload, producers, ctx.args.sync_seconds, warmup_s=0.5)
            inner[producers].append(_sync_figures(result))
        for producers in counts:
            result = sqlite_baseline.sync_producers(
                ctx.work / "sync.db", workload, producers, ctx.args.sync_seconds, warmup_s=0.5
            )
            theirs[producers].append(_sync_figures(result))
        sqlite_baseline.remove_database(ctx.work / "sync.db")
        log(
            f"  SYNC run {run + 1}/{ctx.args.repeats} at {most} producers: "
            + ", ".join(f"{way} {ours[way][most][-1]['msgs_per_s']:,} (no-op {ceiling[way][-1]:,})" for way in ways)
            + f"; in process {inner[most][-1]['msgs_per_s']:,}; SQLite {theirs[most][-1]['msgs_per_s']:,}"
        )
    rows = []
    for producers in counts:
        measured = {way: runs[producers] for way, runs in ours.items() if runs[producers]}
        headline = measured[headline_way]
        rmq = median_of(headline, "msgs_per_s")
        sql = median_of(theirs[producers], "msgs_per_s")
        rows.append(
            {
                "producers": producers,
                "msgs_per_s": rmq,
                "p50_ms": median_of(headline, "p50_ms"),
                "p99_ms": median_of(headline, "p99_ms"),
                "ways": {
                    way: {
                        "msgs_per_s": median_of(runs, "msgs_per_s"),
                        "p50_ms": median_of(runs, "p50_ms"),
                        "p99_ms": median_of(runs, "p99_ms"),
                        "ratio": ratio(median_of(runs, "msgs_per_s"), sql),
                        "runs": runs,
                    }
                    for way, runs in measured.items()
                },
                "in_process_msgs_per_s": median_of(inner[producers], "msgs_per_s"),
                "in_process_ratio": ratio(median_of(inner[producers], "msgs_per_s"), sql),
                "in_process_p50_ms": median_of(inner[producers], "p50_ms"),
                "in_process_p99_ms": median_of(inner[producers], "p99_ms"),
                "sqlite_msgs_per_s": sql,
                "sqlite_p50_ms": median_of(theirs[producers], "p50_ms"),
                "sqlite_p99_ms": median_of(theirs[producers], "p99_ms"),
                "ratio": ratio(rmq, sql),
                "in_process_runs": inner[producers],
                "sqlite_runs": theirs[producers],
            }
        )
    return {
        "seconds_per_run": ctx.args.sync_seconds,
        "warmup_s": 0.5,
        "workload_messages": spec.messages,
        "headline_way": headline_way,
        "clients": list(clients),
        "rows": rows,
        "noop_server": {
            "producers": most,
            "ways": {way: {"msgs_per_s": statistics.median(runs), "runs": runs} for way, runs in ceiling.items()},
        },
    }


def _sync_figures(result: dict[str, Any]) -> dict[str, Any]:
    summary = latency_summary(result.pop("latencies_ns"))
    return {
        "producers": result["producers"],
        "acked": result["acked"],
        "msgs_per_s": round(result["acked"] / result["seconds"]),
        "p50_ms": round(summary["p50_us"] / 1000, 3) if summary["count"] else None,
        "p99_ms": round(summary["p99_us"] / 1000, 3) if summary["count"] else None,
    }


# 4. Lookups (and 7. the query node's memory after them)


def section_lookups(
    ctx: Context, workload: Workload, queries: QuerySets, store: Path, db: Path, store_times: list[int], check: CrossCheck
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    warmup = min(500, ctx.args.lookups)
    ours_oracle = TimeOracle(workload, store_times)
    their_times = [workload.synthetic_store_ms(i) for i in range(len(workload))]
    their_oracle = TimeOracle(workload, their_times)
    size = len(workload)

    sqlite = sqlite_baseline.Lookups(db)
    plans = sqlite.query_plans()
    sql = _run_lookups(sqlite, queries, their_oracle, warmup)
    sqlite.close()
    log("  lookups: SQLite done")

    local = bench_rmq.InProcessLookups(store)
    inproc = _run_lookups(local, queries, ours_oracle, warmup)
    local.close()
    log("  lookups: in process done")

    _cross_check(check, f"{size}/in-process", queries, inproc, sql, ours_oracle)
    check.compare(f"{size}/sqlite/time_search", queries.times, sql["answers"]["time_search"],
                  [their_oracle.answer(q) for q in queries.times], "synthetic-time oracle")  # fmt: skip

    memory = None
    bare = {kind: bare_unary.BareServer(kind) for kind in bare_unary.KINDS}
    try:
        with Nodes(ctx.logs) as nodes:
            query = nodes.start("query", store)
            remote = bench_grpc.GrpcLookups(query.endpoint)
            bare_clients = {kind: bench_grpc.GrpcLookups(server.endpoint) for kind, server in bare.items()}
            floors = {"node": remote.ping, **{kind: client.ping for kind, client in bare_clients.items()}}
            grpc_figures = _run_lookups(remote, queries, ours_oracle, warmup, floors=floors)
            for client in (remote, *bare_clients.values()):
                client.close()
            memory = bench_grpc.query_node_memory(query)
            query.stop()
    finally:
        for server in bare.values():
            server.close()
    log("  lookups: gRPC done")
    _cross_check(check, f"{size}/grpc", queries, grpc_figures, sql, ours_oracle)

    result = {
        "warmup_calls_per_kind": warmup,
        "key_page_size": bench_rmq.KEY_PAGE_SIZE,
        "time_range_ms": {"rmqstore": [ours_oracle.first_ms, ours_oracle.last_ms],
                          "sqlite": [their_oracle.first_ms, their_oracle.last_ms]},  # fmt: skip
        "sqlite_query_plans": plans,
        "in_process": inproc["summary"],
        "grpc": grpc_figures["summary"],
        "ping": grpc_figures["floors"]["node"],
        # The same client's no-op unary call on plain grpcio servers (benchmarks/bare_unary.py),
        # taking turns with the node's Ping after each lookup.
        "bare_unary": {kind: grpc_figures["floors"][kind] for kind in bare_unary.KINDS},
        "sqlite": sql["summary"],
    }
    rss = None
    if "rss" in ctx.sections:
        rss = {"query_node_kib": memory, "sqlite_process_kib": _sqlite_memory(ctx, db, queries),
               "store_bytes": directory_bytes(store)}  # fmt: skip
    return result, rss


def _run_lookups(
    target: Any, queries: QuerySets, oracle: TimeOracle, warmup: int, floors: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Each lookup kind timed call by call; with ``floors`` (no-op calls by name), one of
    them after each lookup, taking turns, each timed too: floors measured under the
    lookups' conditions."""
    calls = bench_rmq.lookup_calls(target, queries, oracle.first_ms, oracle.last_ms)
    answers: dict[str, list[Any]] = {}
    summary: dict[str, Any] = {}
    floor_samples: dict[str, list[int]] = {name: [] for name in floors or {}}
    turns = itertools.cycle(list((floors or {}).items()))
    clock = time.perf_counter_ns

    def floor() -> None:
        name, call = next(turns)
        started = clock()
        call()
        floor_samples[name].append(clock() - started)

    for kind, kind_calls in calls.items():
        latencies, answers[kind], _ = bench_rmq.timed_calls(kind_calls, warmup=warmup, between=floor if floors else None)
        summary[kind] = latency_summary(latencies)
        if kind == "key":
            for sub in ("order", "hot", "miss"):
                picked = [lat for lat, q in zip(latencies, queries.keys) if q.kind == sub]
                summary[f"key_{sub}"] = latency_summary(picked)
    return {"answers": answers, "summary": summary, "floors": {n: latency_summary(v) for n, v in floor_samples.items()}}


def _cross_check(
    check: CrossCheck, where: str, queries: QuerySets, ours: dict[str, Any], sql: dict[str, Any], oracle: TimeOracle
) -> None:
    for kind, query_list in (("key", queries.keys), ("uniq_key", queries.uniq_keys), ("queue_offset", queries.offsets)):
        check.compare(f"{where}/{kind}", query_list, ours["answers"][kind], sql["answers"][kind], "sqlite")
    check.compare(f"{where}/time_search", queries.times, ours["answers"]["time_search"],
                  [oracle.answer(q) for q in queries.times], "acked-time oracle")  # fmt: skip


def _sqlite_memory(ctx: Context, db: Path, queries: QuerySets) -> dict[str, int]:
    path = ctx.work / "queries.json"
    path.write_text(queries.to_json(), encoding="utf-8")
    result = run_client([str(HERE / "sqlite_baseline.py"), "rss", "--db", str(db), "--queries", str(path)], 1800)
    return result["memory_kib"]


# 5. Visibility lag


def section_lag(ctx: Context) -> dict[str, Any]:
    spec = ctx.spec(min(ctx.args.sizes[0], LAG_WORKLOAD_MAX))
    interval = ctx.args.lag_interval_ms / 1000
    ours = bench_grpc.visibility_lag_run(ctx.work / "lag", spec, ctx.logs, ctx.args.lag_probes, interval, 5.0)
    shutil.rmtree(ctx.work / "lag", ignore_errors=True)
    theirs = sqlite_baseline.visibility_lag(ctx.work / "lag.db", spec, ctx.args.lag_probes, interval, 5.0)
    sqlite_baseline.remove_database(ctx.work / "lag.db")
    rmq = latency_summary(ours.pop("lags_ns"))
    sql = latency_summary(theirs.pop("lags_ns"))
    log(f"  lag: p99 {rmq['p99_us']} µs vs SQLite {sql['p99_us']} µs")
    return {
        "probe_interval_ms": ctx.args.lag_interval_ms,
        "rmqstore": {**ours, "lag": rmq},
        "sqlite": {**theirs, "lag": sql},
        "ratio_p50": ratio(rmq["p50_us"], sql["p50_us"], lower_is_better=True),
        "ratio_p99": ratio(rmq["p99_us"], sql["p99_us"], lower_is_better=True),
    }


# 6. Recovery


def section_recovery_kill(ctx: Context, spec: WorkloadSpec) -> dict[str, Any]:
    ours = bench_grpc.kill_recovery_run(ctx.work / f"kill-{spec.messages}", spec, ctx.logs, ctx.args.kill_at)
    shutil.rmtree(ctx.work / f"kill-{spec.messages}", ignore_errors=True)
    theirs = _sqlite_kill_recovery(ctx, spec)
    log(f"  recovery after SIGKILL: {ours['restart_seconds']} s for {ours['commitlog_bytes'] / 1e6:.0f} MB")
    return {
        "kill_at": ctx.args.kill_at,
        "rmqstore": ours,
        "sqlite": theirs,
        "ratio": ratio(ours["seconds_per_gb"], theirs["seconds_per_gb"], lower_is_better=True),
    }


def _sqlite_kill_recovery(ctx: Context, spec: WorkloadSpec) -> dict[str, Any]:
    """SQLite loading the workload in a process that is SIGKILLed at the same point;
    then a fresh process opens the database (WAL recovery) and answers one lookup."""
    db = ctx.work / f"kill-{spec.messages}.db"
    threshold = int(spec.messages * ctx.args.kill_at)
    loader = subprocess.Popen(
        [sys.executable, str(HERE / "sqlite_baseline.py"), "kill-load", "--db", str(db), "--messages",
         str(spec.messages), "--body-bytes", str(spec.body_bytes), "--seed", str(spec.seed)],  # fmt: skip
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=quiet_env(),  # fmt: skip
    )
    acked = 0
    try:
        assert loader.stdout is not None
        for line in loader.stdout:
            acked = json.loads(line).get("acked", acked)
            if acked >= threshold:
                break
    finally:
        bench_grpc.sigkill(loader)
        loader.stdout and loader.stdout.close()  # type: ignore[func-returns-value]
    db_bytes = sqlite_baseline.database_bytes(db)
    seconds, opened = _timed_open_check(db)
    empty = ctx.work / "empty.db"
    sqlite_baseline.create_tiny(empty)
    floor_s, _ = _timed_open_check(empty)
    sqlite_baseline.remove_database(empty)
    sqlite_baseline.remove_database(db)
    return {
        "acked_at_kill": acked,
        "database_bytes": db_bytes,
        "messages_after_recovery": opened["messages"],
        "restart_seconds": round(seconds, 3),
        "empty_start_seconds": round(floor_s, 3),
        "seconds_per_gb": round(seconds / (db_bytes / 1e9), 2) if db_bytes else None,
        "net_seconds_per_gb": round(max(seconds - floor_s, 0) / (db_bytes / 1e9), 2) if db_bytes else None,
    }


def _timed_open_check(db: Path) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter_ns()
    result = run_client([str(HERE / "sqlite_baseline.py"), "open-check", "--db", str(db)], 600)
    return (time.perf_counter_ns() - started) / 1e9, result


def section_redispatch(ctx: Context, workload: Workload, store: Path, db: Path) -> dict[str, Any]:
    """Each re-dispatch and SQLite's index rebuild, repeated (taking turns); the run with
    the median rate stands for each, with every run's rate listed."""
    reindexed, restarted, sqlite_runs = [], [], []
    for run in range(ctx.args.repeats):
        reindexed.append(bench_rmq.reindex_run(store, ctx.work / "reindex-out"))
        restarted.append(bench_rmq.writer_redispatch_run(store))
        sqlite_s = sqlite_baseline.rebuild_indexes(db)
        sqlite_runs.append({"seconds": round(sqlite_s, 3), "msgs_per_s": round(len(workload) / sqlite_s)})
        log(f"  re-dispatch {run + 1}/{ctx.args.repeats}: {reindexed[-1]['mb_per_s']} MB/s (reindex), "
            f"{restarted[-1]['mb_per_s']} MB/s (writer start), SQLite index rebuild {sqlite_runs[-1]['msgs_per_s']:,} msgs/s")  # fmt: skip
    reindex_median, restart_median, sqlite_median = (_median_run(runs, "msgs_per_s") for runs in (reindexed, restarted, sqlite_runs))
    return {
        "reindex": {**reindex_median, "runs_mb_per_s": [r["mb_per_s"] for r in reindexed]},
        "writer_start": {**restart_median, "runs_mb_per_s": [r["mb_per_s"] for r in restarted]},
        "sqlite_index_rebuild": {**sqlite_median, "runs_msgs_per_s": [r["msgs_per_s"] for r in sqlite_runs],
                                 "database_bytes": sqlite_baseline.database_bytes(db)},  # fmt: skip
        "ratio": ratio(reindex_median["msgs_per_s"], sqlite_median["msgs_per_s"]),
    }


def _median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is the median (the lower middle one of an even count)."""
    ranked = sorted(runs, key=lambda r: r[key])
    return ranked[(len(ranked) - 1) // 2]


# One size


def run_size(ctx: Context, size: int, check: CrossCheck) -> dict[str, Any]:
    log(f"size {size:,}: generating the workload")
    started = time.perf_counter()
    workload = Workload(ctx.spec(size))
    queries = build_query_sets(
        workload,
        key_lookups=ctx.args.lookups,
        uniq_lookups=ctx.args.lookups,
        offset_lookups=ctx.args.lookups,
        time_searches=ctx.args.time_searches,
    )
    # The workload's millions of objects live as long as the size's sections: out of the
    # garbage collector's sight, so its passes cost what the code under test allocates,
    # not what the harness holds.
    gc.collect()
    gc.freeze()
    result: dict[str, Any] = {
        "messages": size,
        "workload_seconds": round(time.perf_counter() - started, 2),
        "queries": {"key": len(queries.keys), "uniq_key": len(queries.uniq_keys),
                    "queue_offset": len(queries.offsets), "time_search": len(queries.times),
                    "key_kinds": {k: sum(q.kind == k for q in queries.keys) for k in ("order", "hot", "miss")}},  # fmt: skip
    }
    store = ctx.work / f"store-{size}"
    db = ctx.work / f"sqlite-{size}.db"
    store_times: list[int] = []
    needs_store = bool(ctx.sections & {"append", "lookups", "rss", "recovery"})
    sqlite_msgs_per_s = None
    if needs_store:
        append, store_times = section_append(ctx, workload, store, db)
        sqlite_msgs_per_s = append["sqlite_msgs_per_s"]
        if append["measured"]:
            result["append"] = append
    if "grpc_append" in ctx.sections:
        result["grpc_append"] = section_grpc_append(ctx, workload, sqlite_msgs_per_s)
    if ctx.sections & {"lookups", "rss"}:
        lookups, rss = section_lookups(ctx, workload, queries, store, db, store_times, check)
        if "lookups" in ctx.sections:
            result["lookups"] = lookups
        if rss is not None:
            result["rss"] = rss
    if "recovery" in ctx.sections:
        result["recovery"] = {
            "after_sigkill": section_recovery_kill(ctx, ctx.spec(size)),
            "redispatch": section_redispatch(ctx, workload, store, db),
        }
    shutil.rmtree(store, ignore_errors=True)
    sqlite_baseline.remove_database(db)
    gc.unfreeze()
    return result


# Main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000], help="messages per store")
    parser.add_argument("--body-bytes", type=int, default=256, help="body size (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each throughput figure (median reported)")
    parser.add_argument("--lookups", type=int, default=10_000, help="key, UNIQ_KEY and queue-offset lookups each")
    parser.add_argument("--time-searches", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--batch", type=int, default=1000, help="messages per gRPC batch (default 1000)")
    parser.add_argument("--sync-producers", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--sync-seconds", type=float, default=5.0, help="measured window per SYNC run")
    parser.add_argument(
        "--sync-clients", nargs="+", choices=bench_grpc.SYNC_CLIENTS, default=list(bench_grpc.SYNC_CLIENTS),
        help="the SYNC section's clients, the first the one its target is judged on, run at every producer count "
        "(the others at the largest): cpp (built here, needs libgrpc++-dev) and python (default: both)",
    )
    parser.add_argument("--lag-probes", type=int, default=500)
    parser.add_argument("--lag-interval-ms", type=float, default=20.0, help="pause between lag probes")
    parser.add_argument("--kill-at", type=float, default=0.9, help="SIGKILL once this share of the load is acked")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION", help=f"some of: {' '.join(SECTIONS)}")
    parser.add_argument("--out", type=Path, default=HERE, help="RESULTS.md and results/*.json go here (default benchmarks/)")
    parser.add_argument("--work", type=Path, help="scratch directory for stores (default: a new one under /tmp)")
    parser.add_argument("--keep-work", action="store_true", help="keep the scratch directory (logs, stores)")
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="measure the committed HEAD (an archive of it, imported instead of the working tree), "
        "so uncommitted edits neither leak into nor break the run",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.lookups < 1 or args.time_searches < 1 or min(args.sizes) < 100:
        parser.error("repeats, lookups and time searches must be ≥ 1 and sizes ≥ 100")
    return args


def command_line(argv: list[str]) -> str:
    try:
        script = str(Path(sys.argv[0]).resolve().relative_to(REPO))
    except ValueError:
        script = sys.argv[0]
    return shlex.join(["python", script, *argv])


_BUILD_SPEEDUPS = """
from pathlib import Path

from setuptools import Extension, setup
setup(
    name="rmqstore-snapshot",
    script_args=["build_ext", "--inplace", "--quiet"],
    ext_modules=[Extension("rmqstore.common.codec._speedups",
                           sorted(str(p) for p in Path("rmqstore/common/codec/speedups_c").glob("*.c")),
                           libraries=["z"], extra_compile_args=["-O2", "-fvisibility=hidden"])],
)
"""


def exec_in_snapshot(argv: list[str]) -> None:
    """Archive HEAD's packages into a fresh directory as an ``rmqstore`` package (with the
    compiled protos of the install) and re-run this command with it first on PYTHONPATH;
    the servers and clients it starts inherit the environment."""
    import os

    target = Path(tempfile.mkdtemp(prefix="rmqstore-bench-snapshot-"))
    package = target / "rmqstore"
    package.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD", *PACKAGES], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(package)], input=archive, check=True)
    shutil.copytree(REPO / "protos" / "gen" / "rmqstore" / "v1", package / "v1")
    (package / "__init__.py").write_text('"""rmqstore as committed at HEAD, for benchmarks/run.py --snapshot."""\n')
    # The codecs' C extension, built from HEAD's source as every install builds it.
    subprocess.run([sys.executable, "-c", _BUILD_SPEEDUPS], cwd=target, check=True, capture_output=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH", "")) if p)
    env[SNAPSHOT_ENV] = str(target)
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


def code_under_test() -> dict[str, Any]:
    """Which rmqstore this process imports (and its servers and clients with it)."""
    import os

    import rmqstore.writer.store
    from rmqstore.common.codec.speedups import _speedups

    snapshot = os.environ.get(SNAPSHOT_ENV)
    imported = Path(rmqstore.writer.store.__file__).resolve()
    if snapshot and not imported.is_relative_to(Path(snapshot).resolve()):
        raise SystemExit(f"--snapshot: rmqstore was imported from {imported}, not from the snapshot {snapshot}")
    if snapshot and _speedups is not None and not Path(_speedups.__file__).resolve().is_relative_to(Path(snapshot).resolve()):
        raise SystemExit(f"--snapshot: the C extension was imported from {_speedups.__file__}, not from the snapshot")
    return {
        "snapshot_of_head": bool(snapshot),
        "imported_from": str(imported.parent.parent),
        # False: the codecs ran their Python definitions (RMQSTORE_PURE_PYTHON=1, or no build).
        "compiled_codecs": _speedups is not None,
    }


def main(argv: list[str] | None = None) -> int:
    import os

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.snapshot and SNAPSHOT_ENV not in os.environ:
        exec_in_snapshot(argv)
    snapshot = os.environ.get(SNAPSHOT_ENV)
    sections = set(args.only or SECTIONS)
    if "sync" in sections and "cpp" in args.sync_clients:
        try:
            native_client.build()  # before anything runs: a missing library is said at once
        except native_client.NativeClientUnavailable as error:
            raise SystemExit(f"benchmarks/run.py: section sync needs the C++ SYNC client: {error}") from None
    work = args.work or Path(tempfile.mkdtemp(prefix="rmqstore-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(args, work, sections)
    check = CrossCheck()
    results: dict[str, Any] = {
        "command": command_line(argv),
        "machine": machine_facts(REPO),
        "code": code_under_test(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "sections": sorted(sections, key=SECTIONS.index),
        "sizes": {},
        "once": {},
    }
    started = time.perf_counter()
    try:
        if "sync" in sections:
            log("SYNC producers")
            results["once"]["sync"] = section_sync(ctx)
        if "lag" in sections:
            log("visibility lag")
            results["once"]["lag"] = section_lag(ctx)
        for size in args.sizes:
            results["sizes"][str(size)] = run_size(ctx, size, check)
            gc.collect()
    finally:
        if not args.keep_work and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
        if snapshot:
            shutil.rmtree(snapshot, ignore_errors=True)
    results["cross_check"] = check.as_json()
    results["machine"]["loadavg_end"] = load_average()
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    json_path, md_path = write_outputs(args.out, results)
    log(f"wrote {md_path} and {json_path}")
    if check.total_mismatches:
        print(f"CROSS-CHECK FAILED: {check.total_mismatches} lookup answers disagree: {check.mismatches}", file=sys.stderr)
        for example in check.examples:
            print(f"  {example}", file=sys.stderr)
        return 1
    return 0


def write_outputs(out: Path, results: dict[str, Any]) -> tuple[Path, Path]:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%MZ")
    sizes = "-".join(report.short_count(int(s)) for s in results["sizes"]) or "once"
    json_path = out / "results" / f"{stamp}-{sizes}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    md_path = out / "RESULTS.md"
    md_path.write_text(report.render(results, json_path.relative_to(out)), encoding="utf-8")
    return json_path, md_path


if __name__ == "__main__":
    sys.exit(main())
