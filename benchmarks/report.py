"""RESULTS.md from a run's JSON: every figure beside SQLite's, the ratio, its target and
whether it is met."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MET = "met"
MISSED = "**MISSED**"
NA = "—"
INPROC_P50_US = 10.0
INPROC_P99_US = 50.0
GRPC_OVER_BARE = 1.2  # a lookup through the node: p50 ≤ 1.2× the bare no-op call + the in-process p50
GRPC_TAIL = 3.0  # and its p99 ≤ 3× its p50
TIME_SEARCH_VS_SQLITE = 2.0
GRPC_TARGET_KINDS = ("key", "uniq_key", "queue_offset", "time_search")
BARE_NAMES = {"threaded": "`grpc.server` (threaded)", "asyncio": "`grpc.aio.server`"}
RSS_LIMIT_MB = 200.0
RSS_FLAT_GROWTH = 1.25  # "flat": the largest size's own memory within 25 % of the smallest's
TARGET_KINDS = ("key", "uniq_key", "queue_offset")
KIND_NAMES = {
    "key": "key (all)",
    "key_order": "key: order id (1 match)",
    "key_hot": "key: hot customer (page of 32)",
    "key_miss": "key: never sent",
    "uniq_key": "UNIQ_KEY",
    "queue_offset": "queue offset",
    "time_search": "time search",
}


def short_count(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def _n(value: float | None, digits: int = 0) -> str:
    if value is None:
        return NA
    return f"{value:,.{digits}f}"


def _x(value: float | None) -> str:
    return NA if value is None else f"{value:,.2f}×"


def _verdict(ok: bool | None) -> str:
    return NA if ok is None else (MET if ok else MISSED)


def _at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _both(*checks: bool | None) -> bool | None:
    return None if any(c is None for c in checks) else all(checks)  # type: ignore[arg-type]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


class Summary:
    """The targets, one line each, for the table at the top."""

    def __init__(self) -> None:
        self.rows: list[list[str]] = []

    def add(self, item: str, target: str, figure: str, ok: bool | None) -> bool | None:
        self.rows.append([item, target, figure, _verdict(ok)])
        return ok


def render(results: dict[str, Any], json_name: Path) -> str:
    summary = Summary()
    body: list[str] = []
    sizes = results["sizes"]
    once = results["once"]
    repeats = results["settings"]["repeats"]
    if any("append" in s for s in sizes.values()):
        body += _append(sizes, summary, repeats)
    if any("grpc_append" in s for s in sizes.values()):
        body += _grpc_append(sizes, summary, repeats)
    if "sync" in once:
        body += _sync(once["sync"], summary, repeats)
    if any("lookups" in s for s in sizes.values()):
        body += _lookups(sizes, summary)
    if "lag" in once:
        body += _lag(once["lag"], summary)
    if any("recovery" in s for s in sizes.values()):
        body += _recovery(sizes, summary)
    if any("rss" in s for s in sizes.values()):
        body += _rss(sizes, summary)
    body += _cross_check(results["cross_check"])
    limits = Path(__file__).with_name("LIMITS.md")
    if limits.exists():
        # The analysis of the missed targets, written once the figures are in, kept apart
        # from the generated tables so that a rerun does not lose it.
        body += ["", limits.read_text(encoding="utf-8").rstrip(), ""]
    head = _head(results, json_name)
    head += ["## Targets", ""] + _table(["item", "target", "this run", "verdict"], summary.rows)
    return "\n".join(head + body)


def _head(results: dict[str, Any], json_name: Path) -> list[str]:
    machine = results["machine"]
    dirty = machine["git_dirty_files"]
    return [
        "# Benchmark results",
        "",
        "Produced by this command, from the repository root:",
        "",
        f"    {results['command']}",
        "",
        f"* date: {machine['date_utc']}; wall time {results['wall_seconds']:,} s; every figure: "
        f"[`{json_name.as_posix()}`]({json_name.as_posix()})",
        f"* machine: {machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB, Linux "
        f"{machine['kernel']}; shared with other work, load average {machine['loadavg_start']} at the start, "
        f"{machine.get('loadavg_end')} at the end",
        f"* software: Python {machine['python']}, SQLite {machine['sqlite']}, grpcio {machine['grpcio']}, "
        f"protobuf {machine['protobuf']}, numpy {machine['numpy']}; " + _code(results, dirty),
        f"* workload: seed {results['settings']['seed']}, {results['settings']['body_bytes']}-byte bodies, sections: "
        f"{', '.join(results['sections'])}",
        "",
        "Each figure stands beside SQLite's from the same run. **× SQLite** says how many times better "
        "rmqstore did (above 1: rmqstore better; for latencies and durations it is SQLite's figure divided by "
        f"rmqstore's). Throughputs are medians of {results['settings']['repeats']} runs; latencies are exact "
        "percentiles of every call. How each figure is taken: `benchmarks/README.md`.",
        "",
    ]


def repeats_of(sizes: dict[str, Any]) -> str:
    """How many re-dispatch runs each size's figures come from ("1" for older results)."""
    counts = {len(s["recovery"]["redispatch"]["reindex"].get("runs_mb_per_s", [0])) for s in sizes.values() if s.get("recovery")}
    return "/".join(str(c) for c in sorted(counts)) or "1"


def _runs(values: list[float] | None) -> str:
    return ", ".join(_n(v, 1) for v in values) if values else NA


def _code(results: dict[str, Any], dirty: list[str]) -> str:
    commit = results["machine"]["git_commit"]
    code = results.get("code", {})
    compiled = {True: ", codecs compiled (`_speedups`)", False: ", codecs in pure Python"}.get(code.get("compiled_codecs"), "")
    if code.get("snapshot_of_head"):
        return f"rmqstore as committed at {commit} (`--snapshot`: an archive of HEAD, not the working tree){compiled}"
    changes = f" plus uncommitted changes in {', '.join(f'`{d.split()[-1]}`' for d in dirty)}" if dirty else ""
    return f"rmqstore's working tree at {commit}{changes}{compiled}"


def _append(sizes: dict[str, Any], summary: Summary, repeats: int) -> list[str]:
    rows = []
    for size, s in sizes.items():
        a = s.get("append")
        if not a:
            continue
        ok = _both(_at_least(a["msgs_per_s"], 300_000), _at_least(a["ratio"], 15))
        runs = ", ".join(f"{r['msgs_per_s']:,}" for r in a["rmqstore_runs"])
        rows.append([short_count(int(size)), _n(a["msgs_per_s"]), _n(a["commitlog_mb_per_s"], 1), runs,
                     _n(a["sqlite_msgs_per_s"]), _n(a["sqlite_stored_mb_per_s"], 1), _x(a["ratio"]),
                     "≥ 300,000 and ≥ 15×", _verdict(ok)])  # fmt: skip
        summary.add(f"1. in-process append, {short_count(int(size))}", "≥ 300,000 msgs/s and ≥ 15× SQLite",
                    f"{_n(a['msgs_per_s'])} msgs/s, {_x(a['ratio'])}", ok)  # fmt: skip
    return [
        "## 1. In-process append + dispatch (ASYNC flush)",
        "",
        f"`Writer.append` in batches of 1,000, background flushes running; SQLite: WAL, `synchronous=NORMAL`, "
        f"transactions of 1,000. Median of {repeats} runs (each run's figure listed). MB/s: the bytes each "
        "store wrote (rmqstore: commit log records; SQLite: database + WAL).",
        "",
        *_table(["messages", "msgs/s", "commit log MB/s", "runs", "SQLite msgs/s", "SQLite MB/s", "× SQLite",
                 "target", "verdict"], rows),  # fmt: skip
    ]


def _grpc_append(sizes: dict[str, Any], summary: Summary, repeats: int) -> list[str]:
    rows = []
    for size, s in sizes.items():
        g = s.get("grpc_append")
        if not g:
            continue
        ok = _at_least(g["msgs_per_s"], 100_000)
        runs = ", ".join(f"{r['msgs_per_s']:,}" for r in g["runs"])
        encode = g["runs"][-1]["client_encode_msgs_per_s"]
        rows.append([short_count(int(size)), _n(g["msgs_per_s"]), runs, _n(encode), _n(g["sqlite_msgs_per_s"]),
                     _x(g["ratio"]), "≥ 100,000", _verdict(ok)])  # fmt: skip
        summary.add(f"2. gRPC append, acked, {short_count(int(size))}", "≥ 100,000 msgs/s",
                    f"{_n(g['msgs_per_s'])} msgs/s", ok)  # fmt: skip
    return [
        "## 2. Append through the writer's gRPC API (SendStream, acked, end to end)",
        "",
        f"A client process streams batches of {next(iter(sizes.values())).get('grpc_append', {}).get('batch', 1000):,} "
        "to `rmqstore writer serve` (ASYNC) over one SendStream; first send → last ack on the client's clock. "
        "The client serializes its batches before the clock starts (its protobuf encoding rate is listed). "
        f"SQLite has no server: its figure is the in-process one of section 1. Median of {repeats} runs.",
        "",
        *_table(["messages", "acked msgs/s", "runs", "client encoding msgs/s", "SQLite msgs/s (in process)",
                 "× SQLite", "target", "verdict"], rows),  # fmt: skip
        *_send_file(sizes, summary, repeats),
    ]


def _send_file(sizes: dict[str, Any], summary: Summary, repeats: int) -> list[str]:
    rows = []
    for size, s in sizes.items():
        f = s.get("grpc_append", {}).get("send_file")
        if not f:
            continue
        for acks, m in f["modes"].items():
            ok = None if m["ratio"] is None else _at_least(m["msgs_per_s"], 150_000) and m["ratio"] >= 5
            runs = ", ".join(f"{r['msgs_per_s']:,}" for r in m["runs"])
            row = [short_count(int(size)), f"`--acks {acks}`", _n(m["msgs_per_s"]), runs, _n(f["sqlite_msgs_per_s"])]
            rows.append([*row, _x(m["ratio"]), "≥ 150,000 and ≥ 5×", _verdict(ok)])
            item = f"2. `send --file --acks {acks}`, end to end, {short_count(int(size))}"
            summary.add(item, "≥ 150,000 msgs/s and ≥ 5× SQLite", f"{_n(m['msgs_per_s'])} msgs/s, {_x(m['ratio'])}", ok)
    if not rows:
        return []
    text = (
        "`rmqstore send --file` of the same workload written as JSON Lines (text bodies of the same size), into a "
        "fresh ASYNC writer, timed from the command's start to its exit: the interpreter starting, the file read "
        "and checked, the requests encoded, sent and acknowledged, the acks written (`all`: every ack a line to a "
        f"file; `summary`: one line; `none`: nothing). Median of {repeats} runs."
    )
    headers = ["messages", "acks", "msgs/s end to end", "runs", "SQLite msgs/s (in process)", "× SQLite", "target", "verdict"]
    return ["", text, "", *_table(headers, rows)]


SYNC_WAYS = {
    "cpp_stream": ("C++", "a SendStream per producer"),
    "cpp_send": ("C++", "a Send per message"),
    "python_stream": ("Python asyncio", "a SendStream per producer"),
    "python_send": ("Python asyncio", "a Send per message"),
}


def _other_clients(sync: dict[str, Any], producers: int) -> str:
    """What the report says of the clients other than the headline's."""
    others = [SYNC_WAYS[f"{client}_stream"][0] for client in sync.get("clients", ("cpp", "python")) if not sync["headline_way"].startswith(client)]
    return f"the {' and '.join(others)} client runs at {producers} producers only. " if others else "no other client ran. "


def _sync(sync: dict[str, Any], summary: Summary, repeats: int) -> list[str]:
    noop = sync["noop_server"]
    rows = []
    for r in sync["rows"]:
        producers = r["producers"]
        target = producers == 64
        for way, (client, call) in SYNC_WAYS.items():
            figures = r["ways"].get(way)
            if figures is None:
                continue
            headline = way == sync["headline_way"]
            ok = _at_least(figures["msgs_per_s"], 20_000) if target else None
            ceiling = noop["ways"][way]["msgs_per_s"] if producers == noop["producers"] else None
            rows.append([str(producers), client, call, _n(figures["msgs_per_s"]), _n(figures["p50_ms"], 2),
                         _n(figures["p99_ms"], 2), _n(ceiling), _share(figures["msgs_per_s"], ceiling),
                         _x(figures["ratio"]),
                         _verdict(ok) + ("" if headline or ok is None else " (not the target's)")])  # fmt: skip
            if target:
                summary.add(
                    f"3. SYNC flush, 64 producers, through gRPC ({client} client, {call})"
                    + ("" if headline else "; for reference"),
                    "≥ 20,000 msgs/s",
                    f"{_n(figures['msgs_per_s'])} msgs/s" + (f"; {_share(figures['msgs_per_s'], ceiling)} of a no-op server's" if ceiling else ""),
                    ok if headline else None,
                )  # fmt: skip
        rows.append([str(producers), "in process", "group commit, a task per producer", _n(r["in_process_msgs_per_s"]),
                     _n(r["in_process_p50_ms"], 2), _n(r["in_process_p99_ms"], 2), NA, NA,
                     _x(r["in_process_ratio"]), NA])  # fmt: skip
        rows.append([str(producers), "SQLite", "a transaction per message", _n(r["sqlite_msgs_per_s"]),
                     _n(r["sqlite_p50_ms"], 2), _n(r["sqlite_p99_ms"], 2), NA, NA, NA, NA])  # fmt: skip
        if target:
            summary.add(
                "3. SYNC flush, 64 producers, in process (the group commit without gRPC)",
                "≥ 20,000 msgs/s",
                f"{_n(r['in_process_msgs_per_s'])} msgs/s",
                _at_least(r["in_process_msgs_per_s"], 20_000),
            )
    return [
        "## 3. SYNC flush with concurrent producers (group commit)",
        "",
        f"`rmqstore writer serve --flush sync`, loaded from another process by N producers, each sending one "
        f"message and waiting for its ack before the next: with a `SendStream` per producer carrying one message "
        f"per request (as a RocketMQ producer keeps its connection), or with a `Send` call per message. Two clients: "
        f"C++ (`benchmarks/native/sync_client.cc`: every producer on one channel, driven by one thread, about a "
        f"third of a core at 20,000 acks a second) and Python asyncio (`grpc_clients.py sync`: about a whole core "
        f"at the same rate, on a machine of two). The target is judged on the "
        f"{SYNC_WAYS[sync['headline_way']][0]} client's streams (`{sync['headline_way']}`), run at every producer "
        f"count; {_other_clients(sync, noop['producers'])}\"No-op "
        f"server\": the same client and call against an asyncio gRPC server that acks each message without "
        f"storing it (`benchmarks/ceilings.py`), in the same run: what Python gRPC allows here with that client. "
        f"\"In process\": N tasks on one event loop each appending one message at a time through the writer's "
        f"group commit (`GroupAppender`, SYNC flush) without gRPC. SQLite: WAL, `synchronous=FULL`, N threads "
        f"each committing one message per transaction through one connection behind a lock. {sync['seconds_per_run']} s measured after a "
        f"{sync['warmup_s']} s warm-up; median of {repeats} runs.",
        "",
        *_table(["producers", "client", "call", "msgs/s", "p50 ack ms", "p99 ack ms", "no-op server msgs/s",
                 "share of no-op", "× SQLite", "verdict (≥ 20,000 at 64)"], rows),  # fmt: skip
    ]


def _share(value: float | None, ceiling: float | None) -> str:
    """``41%``: a figure as a share of the no-op server's in the same run."""
    if value is None or not ceiling:
        return NA
    return f"{100 * value / ceiling:.0f}%"


def _lookups(sizes: dict[str, Any], summary: Summary) -> list[str]:
    lines = [
        "## 4. Lookup latency",
        "",
        "Each call timed alone. In process: `StoreView` (what a query node runs) against SQLite's indexed "
        "queries in the same process. Through gRPC: one client calling `rmqstore query serve`; after every "
        "lookup one no-op unary call, taking turns between the node's own `Ping` and the `Ping` of a bare "
        "`grpc.server` (threaded) and a bare `grpc.aio.server` (benchmarks/bare_unary.py: no interceptor, "
        "no store), each on its own channel of the same client. A lookup through the node is read against "
        "the cheaper of the two bare calls plus the lookup's own in-process p50. A key lookup asks for the "
        "newest 32 matches (hot customer keys have hundreds). Time searches resolve against each store's own "
        "time range.",
        "",
    ]
    for size, s in sizes.items():
        lk = s.get("lookups")
        if not lk:
            continue
        label = short_count(int(size))
        rows = []
        for kind in KIND_NAMES:
            ours, theirs = lk["in_process"][kind], lk["sqlite"][kind]
            ok = None
            if kind in TARGET_KINDS:
                ok = _both(_at_most(ours["p50_us"], INPROC_P50_US), _at_most(ours["p99_us"], INPROC_P99_US))
                summary.add(f"4. in-process {KIND_NAMES[kind]} lookup, {label}", "p50 ≤ 10 µs, p99 ≤ 50 µs",
                            f"p50 {_n(ours['p50_us'], 1)} µs, p99 {_n(ours['p99_us'], 1)} µs", ok)  # fmt: skip
            if kind == "time_search":
                ok = _at_least(_ratio_low(ours["p50_us"], theirs["p50_us"]), TIME_SEARCH_VS_SQLITE)
                summary.add(f"4. in-process time search, {label}", "p50 ≥ 2× SQLite's",
                            f"{_x(_ratio_low(ours['p50_us'], theirs['p50_us']))} SQLite (p50 {_n(ours['p50_us'], 1)} µs)",
                            ok)  # fmt: skip
            target = "p50 ≤ 10, p99 ≤ 50" if kind in TARGET_KINDS else "≥ 2× SQLite" if kind == "time_search" else NA
            rows.append([KIND_NAMES[kind], _n(ours["count"]), _n(ours["p50_us"], 1), _n(ours["p99_us"], 1),
                         _n(theirs["p50_us"], 1), _n(theirs["p99_us"], 1),
                         _x(_ratio_low(ours["p50_us"], theirs["p50_us"])), target, _verdict(ok)])  # fmt: skip
        lines += [f"### {label} messages, in process (µs)", ""]
        lines += _table(["lookup", "calls", "p50", "p99", "SQLite p50", "SQLite p99", "× SQLite (p50)", "target",
                         "verdict"], rows)  # fmt: skip
        lines += _through_grpc(lk, label, summary)
    return lines


def _through_grpc(lk: dict[str, Any], label: str, summary: Summary) -> list[str]:
    """The lookups through the node against the cheaper bare no-op unary call of the same
    run: (p50 − the in-process p50) / the bare p50 ≤ 1.2, and p99 ≤ 3× p50."""
    ping, bares = lk["ping"], lk.get("bare_unary", {})
    bare_p50s = [f["p50_us"] for f in bares.values() if f.get("p50_us")]
    bare = min(bare_p50s) if bare_p50s else None
    rows = []
    for kind in KIND_NAMES:
        ours = lk["grpc"][kind]
        inproc = lk["in_process"][kind]["p50_us"]
        over = round((ours["p50_us"] - inproc) / bare, 2) if bare and ours["p50_us"] and inproc is not None else None
        tail = round(ours["p99_us"] / ours["p50_us"], 2) if ours["p50_us"] else None
        vs_ping = round(ours["p50_us"] / ping["p50_us"], 2) if ours["p50_us"] and ping["p50_us"] else None
        ok = None
        if kind in GRPC_TARGET_KINDS:
            ok = _both(_at_most(over, GRPC_OVER_BARE), _at_most(tail, GRPC_TAIL))
            summary.add(f"4. gRPC {KIND_NAMES[kind]} lookup, {label}", "p50 ≤ 1.2× bare no-op + in-process p50; p99 ≤ 3× p50",
                        f"{_x(over)} bare ({_n(ours['p50_us'], 0)} µs), p99 {_x(tail)} p50", ok)  # fmt: skip
        rows.append([KIND_NAMES[kind], _n(ours["p50_us"], 0), _n(ours["p99_us"], 0), _x(tail), _n(inproc, 1), _x(over),
                     _x(vs_ping), "≤ 1.2×, p99 ≤ 3× p50" if kind in GRPC_TARGET_KINDS else NA, _verdict(ok)])  # fmt: skip
    rows.append(["the node's Ping (no-op)", _n(ping["p50_us"], 0), _n(ping["p99_us"], 0), NA, NA,
                 _x(round(ping["p50_us"] / bare, 2) if bare and ping["p50_us"] else None), "1.00×", NA, NA])  # fmt: skip
    for name, floor in bares.items():
        rows.append([f"no-op, bare {BARE_NAMES.get(name, name)}", _n(floor["p50_us"], 0), _n(floor["p99_us"], 0), NA, NA,
                     _x(round(floor["p50_us"] / bare, 2) if bare and floor["p50_us"] else None), NA, NA, NA])  # fmt: skip
    lines = [f"### {label} messages, through gRPC (µs)", ""]
    lines += _table(["lookup", "p50", "p99", "p99 / p50", "in-process p50", "(p50 − in-process) / bare p50",
                     "p50 / Ping p50", "target", "verdict"], rows)  # fmt: skip
    return lines


def _ratio_low(ours: float | None, theirs: float | None) -> float | None:
    if not ours or not theirs:
        return None
    return round(theirs / ours, 2)


def _lag(lag: dict[str, Any], summary: Summary) -> list[str]:
    ours, theirs = lag["rmqstore"], lag["sqlite"]
    ms = lambda us: None if us is None else us / 1000  # noqa: E731
    ok = _both(_at_most(ms(ours["lag"]["p99_us"]), 50.0), ours["timeouts"] == 0)
    summary.add("5. visibility lag under load", "p99 ≤ 50 ms", f"p99 {_n(ms(ours['lag']['p99_us']), 2)} ms", ok)
    load = ours["load"]
    return [
        "## 5. Query-node visibility lag under load (ack → visible)",
        "",
        f"A writer and a query node on one store; a client process streams batches of 1,000 "
        f"({_n(load.get('msgs_per_s'))} msgs/s acked meanwhile) while this process sends {ours['probes']} single "
        f"messages ({lag['probe_interval_ms']} ms apart) and polls `QueryByUniqKey` until each is found. SQLite: "
        f"a loader process commits transactions of 1,000 ({_n(theirs['load'].get('msgs_per_s'))} msgs/s "
        "meanwhile) while this process commits single messages and polls for each through a second connection.",
        "",
        *_table(["", "p50 ms", "p99 ms", "max ms", "timeouts (5 s)", "target", "verdict"], [
            ["rmqstore", _n(ms(ours["lag"]["p50_us"]), 2), _n(ms(ours["lag"]["p99_us"]), 2),
             _n(ms(ours["lag"]["max_us"]), 2), str(ours["timeouts"]), "p99 ≤ 50 ms", _verdict(ok)],
            ["SQLite", _n(ms(theirs["lag"]["p50_us"]), 3), _n(ms(theirs["lag"]["p99_us"]), 3),
             _n(ms(theirs["lag"]["max_us"]), 3), str(theirs["timeouts"]), NA, NA],
            ["× SQLite", _x(lag["ratio_p50"]), _x(lag["ratio_p99"]), NA, NA, NA, NA],
        ]),  # fmt: skip
    ]


def _recovery(sizes: dict[str, Any], summary: Summary) -> list[str]:
    kill_rows, redispatch_rows = [], []
    for size, s in sizes.items():
        rec = s.get("recovery")
        if not rec:
            continue
        label = short_count(int(size))
        k = rec["after_sigkill"]
        ours, theirs = k["rmqstore"], k["sqlite"]
        kill_rows.append([label, _n(ours["commitlog_bytes"] / 1e6), _n(ours["recovered"]["redispatchedRecords"]),
                          _n(ours["restart_seconds"], 2), _n(ours["empty_start_seconds"], 2),
                          _n(ours["seconds_per_gb"], 2), _n(ours["net_seconds_per_gb"], 2),
                          _n(theirs["database_bytes"] / 1e6), _n(theirs["restart_seconds"], 2),
                          _n(theirs["seconds_per_gb"], 2), _x(k["ratio"])])  # fmt: skip
        r = rec["redispatch"]
        ok = _at_least(r["reindex"]["mb_per_s"], 200)
        summary.add(f"6. re-dispatch, {label}", "≥ 200 MB/s of commit log", f"{_n(r['reindex']['mb_per_s'], 1)} MB/s", ok)
        redispatch_rows.append([label, _n(r["reindex"]["mb_per_s"], 1), _runs(r["reindex"].get("runs_mb_per_s")),
                                _n(r["reindex"]["msgs_per_s"]),
                                _n(r["writer_start"]["mb_per_s"], 1), _n(r["writer_start"]["msgs_per_s"]),
                                _n(r["sqlite_index_rebuild"]["msgs_per_s"]), _x(r["ratio"]), "≥ 200 MB/s",
                                _verdict(ok)])  # fmt: skip
    return [
        "## 6. Recovery",
        "",
        "**After SIGKILL.** The stream client loads a fresh `writer serve`; once "
        f"{next(iter(sizes.values()))['recovery']['after_sigkill']['kill_at']:.0%} of the workload is acked the "
        "writer gets SIGKILL, and a new `writer serve` on the store is timed from its start to its serving line "
        "(recovery, re-dispatch of what the queues and index lacked, gRPC server up). The same start on an empty "
        "store is the floor (interpreter, imports); *net* subtracts it. SQLite: a process loading the workload "
        "is SIGKILLed at the same point, then a new process opens the database (WAL recovery) and answers one "
        "lookup.",
        "",
        *_table(["messages", "commit log MB", "re-dispatched records", "restart s", "empty-store start s", "s/GB",
                 "net s/GB", "SQLite MB", "SQLite restart s", "SQLite s/GB", "× SQLite (s/GB)"], kill_rows),  # fmt: skip
        "**Re-dispatch throughput.** The whole commit log re-dispatched into new consume queues and index files "
        "by `common.files.store.reindex` (the code `rmqstore reindex` runs; the target is judged on it), and by "
        "a writer start on the same store after its `consumequeue/` and `index/` were removed (recovery "
        "re-dispatch). SQLite's counterpart: dropping and re-creating its four indexes. Runs of each: "
        f"{repeats_of(sizes)}, taking turns; the median run is shown (every reindex run listed).",
        "",
        *_table(["messages", "reindex MB/s", "runs (MB/s)", "reindex msgs/s", "writer start MB/s", "writer start msgs/s",
                 "SQLite index rebuild msgs/s", "× SQLite (msgs/s)", "target", "verdict"], redispatch_rows),  # fmt: skip
    ]


def _rss(sizes: dict[str, Any], summary: Summary) -> list[str]:
    rows = []
    totals, anons = [], []
    for size, s in sizes.items():
        rss = s.get("rss")
        if not rss:
            continue
        label = short_count(int(size))
        q, sq = rss["query_node_kib"], rss["sqlite_process_kib"]
        total_mb = q["VmRSS"] / 1024
        # Judged on the peak: the RSS at the end depends on how long ago the node's last
        # periodic trim was; the peak is what the node needed over all the query sets.
        peak_mb = q.get("VmHWM", q["VmRSS"]) / 1024
        totals.append(peak_mb)
        anons.append(q["RssAnon"] / 1024)
        ok = _at_most(peak_mb, RSS_LIMIT_MB)
        summary.add(f"7. query-node RSS (peak), {label}", "≤ 200 MB", f"{_n(peak_mb, 1)} MB", ok)
        rows.append([label, _n(rss["store_bytes"] / 1e6), _n(total_mb, 1), _n(q["RssAnon"] / 1024, 1),
                     _n(q["RssFile"] / 1024, 1), _n(q.get("VmHWM", 0) / 1024, 1), _n(sq["VmRSS"] / 1024, 1),
                     _n(sq["RssAnon"] / 1024, 1), _x(_ratio_low(total_mb, sq["VmRSS"] / 1024)), "≤ 200 MB",
                     _verdict(ok)])  # fmt: skip
    if len(anons) > 1:
        # Flat: the node's own memory does not grow with the store. Its mapped store pages
        # (RssFile) are page cache held to the mapped-page budget (96 MiB): a small store's
        # working set stays below it, a large one's reaches it, so the peaks differ by up
        # to the budget without anything growing (LIMITS.md).
        growth = anons[-1] / anons[0]
        summary.add("7. query-node memory flat as the store grows (RssAnon)", f"largest ≤ {RSS_FLAT_GROWTH}× smallest size's",
                    f"{growth:.2f}× (peak {totals[-1] / totals[0]:.2f}×)", growth <= RSS_FLAT_GROWTH)  # fmt: skip
    return [
        "## 7. Query-node memory after the query sets",
        "",
        "`/proc/PID/status` of `rmqstore query serve` after it answered the gRPC query sets of section 4. "
        "Mapped store files count in RSS as RssFile (page cache the kernel can reclaim); RssAnon is the "
        "process's own memory. The targets are judged on the peak (VmHWM): the RSS at the end depends on "
        "when the node last dropped its mapped pages (every 5 s and past its budget). SQLite: a Python "
        "process that ran the same query sets on the database.",
        "",
        *_table(["messages", "store on disk MB", "VmRSS MB", "RssAnon MB", "RssFile MB", "peak (VmHWM) MB",
                 "SQLite VmRSS MB", "SQLite RssAnon MB", "× SQLite (VmRSS)", "target", "verdict"], rows),  # fmt: skip
    ]


def _cross_check(check: dict[str, Any]) -> list[str]:
    rows = [[label, _n(count), _n(check["mismatches"].get(label, 0))] for label, count in check["checked"].items()]
    verdict = (
        f"**{check['total_mismatches']:,} answers disagree** (examples in the JSON)."
        if check["total_mismatches"]
        else f"All {check['total_checked']:,} answers agree."
    )
    return [
        "## Cross-check of every lookup answer",
        "",
        "Key, UNIQ_KEY and queue-offset answers (the UNIQ_KEYs found, in order, and for keys whether the page "
        "is complete) compared with SQLite's; time searches compared with an oracle built from each store's "
        "own store times (rmqstore: the acked ones; SQLite: the synthetic ones). " + verdict,
        "",
        *_table(["store size / path / lookup", "checked", "mismatches"], rows),
    ]
