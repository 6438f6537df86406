"""The web console's server time beside the gRPC call each page makes, on the benchmark
workload's store.

Three pages, each measured against its baseline in the same run, alternating call by
call (drift on a shared machine hits both alike):

* a key search page of up to 50 messages (``/search?mode=key…&pageSize=50``, the HTML
  page) beside ``QueryByKey`` with page size 50 alone;
* a message detail page (``/message?id=…``) beside ``QueryByMsgId`` alone;
* a 24 h rate chart at 1-minute intervals (``/rate?…&interval=1m``, 1,440 bars per queue
  and for the topic) beside the ``OffsetsByTime`` calls it makes, alone.

A page's server time is the console's own ``Server-Timing: app`` header: from the request's
arrival to the response's first byte, HTTP parsing and the socket excluded. The gRPC times
are client round trips from this process. Targets: pages ≤ 2 × the gRPC call + 5 ms, the
chart ≤ 200 ms.

    python benchmarks/console_bench.py                      # 1M messages (builds the store)
    python benchmarks/console_bench.py --messages 200000    # a smaller store
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import Nodes, machine_facts, quiet_env
from bench_rmq import append_run
from workload import TOPICS, Workload, WorkloadSpec

from rmqstore.v1 import query_pb2, query_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
PAGE_SIZE = 50
DAY_MS = 24 * 3600 * 1000
MINUTE_MS = 60_000
HTTP_TIMEOUT_S = 60.0
START_TIMEOUT_S = 60.0


def _server_ms(url: str) -> float:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
        timing = response.headers["Server-Timing"]
    return float(timing.split("dur=")[1])


def _grpc_ms(call: Any, request: Any) -> float:
    started = time.perf_counter_ns()
    call(request, timeout=HTTP_TIMEOUT_S)
    return (time.perf_counter_ns() - started) / 1e6


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 3),
        "n": len(ordered),
    }


def _start_console(query_endpoint: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "rmqstore.cli.main", "console", "--query-endpoint", query_endpoint, "--port", "0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(log, "wb"), env=quiet_env(),
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"the console did not start: {log.read_text(errors='replace')[-2000:]}")
    return process, f"http://127.0.0.1:{json.loads(line)['port']}"


def _hottest_key(workload: Workload) -> tuple[str, str, int]:
    counts = collections.Counter((workload.topic(i), key) for i in range(len(workload)) for key in workload.keys[i])
    (topic, key), count = counts.most_common(1)[0]
    return topic, key, count


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    store = work / "console-store"
    workload = Workload(WorkloadSpec(args.messages))
    built = time.perf_counter()
    if not (store / "commitlog").exists() or not args.reuse:
        append_run(store, workload, keep_times=False)
    build_s = time.perf_counter() - built
    topic, key, key_count = _hottest_key(workload)
    nodes = Nodes(work / "logs")
    console = None
    try:
        query = nodes.start("query", store)
        channel = grpc.insecure_channel(query.endpoint)
        stub = query_pb2_grpc.QueryServiceStub(channel)  # type: ignore[no-untyped-call]
        console, url = _start_console(query.endpoint, work / "logs" / "console.stderr")
        listed = {t.name: t for t in stub.ListTopics(query_pb2.ListQueryTopicsRequest()).topics}
        newest = max(q.newest_store_timestamp_ms for q in listed[TOPICS[0]].queues)
        key_request = query_pb2.QueryByKeyRequest(topic=topic, key=key, page_size=PAGE_SIZE)
        first_page = stub.QueryByKey(key_request)
        msg_id = first_page.messages[0].offset_msg_id
        end = newest + 1
        begin = end - DAY_MS
        edges = [begin + i * MINUTE_MS for i in range(DAY_MS // MINUTE_MS)] + [end]
        rate_requests = [
            query_pb2.OffsetsByTimeRequest(topic=TOPICS[0], queue_id=q.queue_id, timestamps_ms=edges) for q in listed[TOPICS[0]].queues
        ]
        # The store was written in a short time, so most of a day's edges lie outside its
        # data and need no search. The same number of edges spread over the data's own span
        # makes every edge a real search: what a store written over a whole day costs.
        oldest = min(q.newest_store_timestamp_ms for q in listed[TOPICS[0]].queues)
        first_ms = stub.QueryByQueueOffset(query_pb2.QueryByQueueOffsetRequest(topic=TOPICS[0], queue_id=0, queue_offset=0)).message.store_timestamp_ms
        span_ms = max(oldest - first_ms, 1)
        dense = [first_ms + span_ms * i // (len(edges) - 1) for i in range(len(edges))]
        dense_requests = [
            query_pb2.OffsetsByTimeRequest(topic=TOPICS[0], queue_id=q.queue_id, timestamps_ms=dense) for q in listed[TOPICS[0]].queues
        ]
        key_page = f"{url}/search?" + urllib.parse.urlencode({"mode": "key", "topic": topic, "key": key, "pageSize": PAGE_SIZE})
        detail_page = f"{url}/message?id={msg_id}"
        rate_page = f"{url}/rate?" + urllib.parse.urlencode({"topic": TOPICS[0], "begin": begin, "end": end, "interval": "1m"})
        for _ in range(args.warmup):
            for page in (key_page, detail_page, rate_page):
                _server_ms(page)
            stub.QueryByKey(key_request)
        samples: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(args.repeats):
            samples["key_page"].append(_server_ms(key_page))
            samples["key_grpc"].append(_grpc_ms(stub.QueryByKey, key_request))
            samples["detail_page"].append(_server_ms(detail_page))
            samples["detail_grpc"].append(_grpc_ms(stub.QueryByMsgId, query_pb2.QueryByMsgIdRequest(msg_id=msg_id)))
        for _ in range(args.chart_repeats):
            samples["rate_page"].append(_server_ms(rate_page))
            samples["rate_grpc"].append(sum(_grpc_ms(stub.OffsetsByTime, r) for r in rate_requests))
            samples["rate_dense_grpc"].append(sum(_grpc_ms(stub.OffsetsByTime, r) for r in dense_requests))
        channel.close()
    finally:
        if console is not None:
            console.terminate()
            console.wait(timeout=30)
            if console.stdout is not None:
                console.stdout.close()
        for node in nodes.started:
            node.stop()
        if not args.keep:
            shutil.rmtree(store, ignore_errors=True)
    figures = {name: _summary(values) for name, values in samples.items()}
    verdicts = {}
    for page in ("key", "detail"):
        page_ms, grpc_ms = figures[f"{page}_page"]["p50_ms"], figures[f"{page}_grpc"]["p50_ms"]
        verdicts[page] = {
            "ratio_to_grpc": round(page_ms / grpc_ms, 2),
            "target_ms": round(2 * grpc_ms + 5, 3),
            "met": page_ms <= 2 * grpc_ms + 5,
        }
    # A day of data at one-minute edges: the page's own work (rate_page - rate_grpc) on
    # top of every edge searched.
    dense_page_ms = figures["rate_dense_grpc"]["p50_ms"] + figures["rate_page"]["p50_ms"] - figures["rate_grpc"]["p50_ms"]
    verdicts["rate_dense_estimate"] = {"page_ms": round(dense_page_ms, 3), "target_ms": 200.0, "met": dense_page_ms <= 200.0}
    verdicts["rate"] = {
        "ratio_to_grpc": round(figures["rate_page"]["p50_ms"] / figures["rate_grpc"]["p50_ms"], 2),
        "target_ms": 200.0,
        "met": figures["rate_page"]["p50_ms"] <= 200.0,
    }
    return {
        "command": "python benchmarks/console_bench.py " + " ".join(sys.argv[1:]),
        "messages": args.messages,
        "store_build_s": round(build_s, 1),
        "key": {"topic": topic, "key": key, "matches": key_count, "page_size": PAGE_SIZE,
                "first_page": len(first_page.messages)},
        "rate": {"topic": TOPICS[0], "queues": len(rate_requests), "intervals": len(edges) - 1,
                 "data_span_ms": span_ms},
        "figures": figures,
        "verdicts": verdicts,
        "machine": machine_facts(REPO),
    }  # fmt: skip


def report(result: dict[str, Any]) -> str:
    f, v = result["figures"], result["verdicts"]
    rows = [
        ("key search page (50)", "key_page", "key_grpc", "QueryByKey", v["key"]),
        ("message detail page", "detail_page", "detail_grpc", "QueryByMsgId", v["detail"]),
        (f"24 h rate chart, 1 min ({result['rate']['queues']} queues)", "rate_page", "rate_grpc", "OffsetsByTime × queues", v["rate"]),
    ]
    lines = [
        "# The console's server time beside its gRPC calls",
        "",
        f"`{result['command']}` on a store of {result['messages']:,} benchmark-workload messages "
        f"(commit {result['machine']['git_commit']}, load average at start {result['machine']['loadavg_start']}). Page times are the console's Server-Timing; "
        "gRPC times are client round trips; medians (p90) in ms, alternating call by call.",
        "",
        "| page | page ms | baseline | baseline ms | ratio | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, page, base, base_name, verdict in rows:
        lines.append(
            f"| {label} | {f[page]['p50_ms']} ({f[page]['p90_ms']}) | {base_name} | {f[base]['p50_ms']} ({f[base]['p90_ms']}) "
            f"| {verdict['ratio_to_grpc']}× | ≤ {verdict['target_ms']} ms | {'yes' if verdict['met'] else 'no'} |"
        )
    dense = v["rate_dense_estimate"]
    lines += [
        "",
        f"The store's messages were written within {result['rate']['data_span_ms'] / 1000:.1f} s, so most of the day's "
        "edges fall outside its data and cost no search. The same 1,441 edges spread over the data's span "
        f"make every edge a search: `OffsetsByTime` × queues then takes {f['rate_dense_grpc']['p50_ms']} ms "
        f"({f['rate_dense_grpc']['p90_ms']}), and the page, with its own work added, would take about {dense['page_ms']} ms "
        f"(target ≤ 200 ms: {'met' if dense['met'] else 'missed'}).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=200, help="samples per key and detail page and per gRPC call")
    parser.add_argument("--chart-repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--work", default="/tmp/rmqstore-console-bench", help="scratch directory (the store)")
    parser.add_argument("--out", default=str(REPO / "benchmarks"), help="where CONSOLE.md and results/console-*.json go")
    parser.add_argument("--keep", action="store_true", help="keep the store in --work")
    parser.add_argument("--reuse", action="store_true", help="use a store already in --work")
    args = parser.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    result = run(args)
    out = Path(args.out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%MZ")
    (out / "results" / f"console-{stamp}-{args.messages}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (out / "CONSOLE.md").write_text(report(result), encoding="utf-8")
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
