"""The benchmark suite (benchmarks/run.py) at a smoke size, so its code cannot rot.

It runs every section as a subprocess into tmp_path (servers on 127.0.0.1 only, killed by
the suite itself; the subprocess is killed if it overruns), the SYNC section with the
Python client alone (the C++ one is the full benchmark's, built when it is asked for), and
checks that what it wrote holds together: every section present, every count the
workload's, every rate the count over the time measured, every median that of its runs,
every ratio the quotient of the figures it compares, the tables of RESULTS.md the figures
of the JSON, and the cross-check of every lookup answer against SQLite without a
disagreement. It asserts no timing: the machine is shared and the figures are not the
point.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "benchmarks" / "run.py"
SIZE = 2000
LOOKUPS = 200
TIME_SEARCHES = 20
PRODUCERS = [1, 4]
TIMEOUT_S = 240
# The whole suite's sections, one after another: about a minute on a quiet machine, over
# four at load 20 (CI's clean-clone runs beside other jobs), where 240 s cut it short.
# A guard against a hang, not a bound on its speed.
SMOKE_TIMEOUT_S = 900
SYNC_SECONDS = 0.5
LOOKUP_KINDS = ("key", "key_order", "key_hot", "key_miss", "uniq_key", "queue_offset", "time_search")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, list[str]]:
    out = tmp_path_factory.mktemp("bench-out")
    work = tmp_path_factory.mktemp("bench-work")
    args = [
        "--sizes", str(SIZE), "--repeats", "1", "--lookups", str(LOOKUPS), "--time-searches", str(TIME_SEARCHES),
        "--sync-producers", *map(str, PRODUCERS), "--sync-seconds", str(SYNC_SECONDS), "--sync-clients", "python",
        "--lag-probes", "10",
        "--out", str(out), "--work", str(work),
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(RUN), *args], cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"benchmarks/run.py failed ({done.returncode}):\n{done.stderr[-5000:]}"
    results = sorted((out / "results").glob("*.json"))
    assert len(results) == 1, results
    return json.loads(results[0].read_text(encoding="utf-8")), (out / "RESULTS.md").read_text(encoding="utf-8"), args


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and value > 0


def _rate_of(run: dict[str, Any], count: str) -> None:
    """``run``'s msgs/s is its ``count`` over its seconds (rounded to the millisecond)."""
    messages, seconds = run[count], run["seconds"]
    assert seconds > 0 and messages / (seconds + 0.0005) - 1 <= run["msgs_per_s"] <= messages / (seconds - 0.0005) + 1, run


def _median_of(figures: dict[str, Any], runs: list[dict[str, Any]], key: str = "msgs_per_s") -> None:
    assert figures[key] == statistics.median(run[key] for run in runs), (key, figures)


def _ratio(value: Any, ours: float, theirs: float) -> None:
    assert value == round(ours / theirs, 2), (value, ours, theirs)


@pytest.mark.slow
def test_every_section_is_present(smoke: tuple[dict[str, Any], str, list[str]]) -> None:
    results, _, _ = smoke
    assert results["sections"] == ["append", "grpc_append", "sync", "lookups", "lag", "recovery", "rss"]
    assert list(results["sizes"]) == [str(SIZE)]
    size = results["sizes"][str(SIZE)]
    assert {"append", "grpc_append", "lookups", "recovery", "rss"} <= set(size)
    assert {"sync", "lag"} <= set(results["once"])
    assert results["machine"]["cores"] >= 1 and results["machine"]["sqlite"]


@pytest.mark.slow
def test_throughput_figures_are_those_of_their_runs(smoke: tuple[dict[str, Any], str, list[str]]) -> None:
    results, _, _ = smoke
    size = results["sizes"][str(SIZE)]
    append = size["append"]
    assert len(append["rmqstore_runs"]) == len(append["sqlite_runs"]) == 1
    for run in (*append["rmqstore_runs"], *append["sqlite_runs"]):
        assert run["messages"] == SIZE
        _rate_of(run, "messages")
    _median_of(append, append["rmqstore_runs"])
    sqlite = statistics.median(run["msgs_per_s"] for run in append["sqlite_runs"])
    assert append["sqlite_msgs_per_s"] == sqlite
    _ratio(append["ratio"], append["msgs_per_s"], sqlite)
    grpc_append = size["grpc_append"]
    for run in grpc_append["runs"]:
        assert (run["sent"], run["acked"], run["error"]) == (SIZE, SIZE, None)
        _rate_of(run, "acked")
    _median_of(grpc_append, grpc_append["runs"])
    assert grpc_append["sqlite_msgs_per_s"] == sqlite
    _ratio(grpc_append["ratio"], grpc_append["msgs_per_s"], sqlite)
    send_file = grpc_append["send_file"]
    assert list(send_file["modes"]) == ["all", "summary", "none"] and send_file["file_bytes"] > SIZE * 256
    assert send_file["sqlite_msgs_per_s"] == sqlite
    for acks, mode in send_file["modes"].items():
        assert len(mode["runs"]) == 1
        for run in mode["runs"]:
            assert (run["acks"], run["messages"]) == (acks, SIZE)
            _rate_of(run, "messages")
        _median_of(mode, mode["runs"])
        _ratio(mode["ratio"], mode["msgs_per_s"], sqlite)


@pytest.mark.slow
def test_sync_figures_are_those_of_their_runs(smoke: tuple[dict[str, Any], str, list[str]]) -> None:
    results, markdown, _ = smoke
    sync = results["once"]["sync"]
    assert (sync["clients"], sync["headline_way"], sync["seconds_per_run"]) == (["python"], "python_stream", SYNC_SECONDS)
    rows = sync["rows"]
    assert [row["producers"] for row in rows] == PRODUCERS
    ways = {"python_stream", "python_send"}  # the only client, at every producer count
    for row in rows:
        assert set(row["ways"]) == ways
        for figures in (*row["ways"].values(), {"runs": row["in_process_runs"]}, {"runs": row["sqlite_runs"]}):
            assert len(figures["runs"]) == 1
            for run in figures["runs"]:
                assert run["producers"] == row["producers"] and run["acked"] > 0
                assert run["msgs_per_s"] == round(run["acked"] / SYNC_SECONDS), run
                assert run["p50_ms"] <= run["p99_ms"]
        sqlite = statistics.median(run["msgs_per_s"] for run in row["sqlite_runs"])
        assert row["sqlite_msgs_per_s"] == sqlite
        for figures in row["ways"].values():
            for key in ("msgs_per_s", "p50_ms", "p99_ms"):
                _median_of(figures, figures["runs"], key)
            _ratio(figures["ratio"], figures["msgs_per_s"], sqlite)
        headline = row["ways"][sync["headline_way"]]
        assert (row["msgs_per_s"], row["p50_ms"], row["p99_ms"]) == (headline["msgs_per_s"], headline["p50_ms"], headline["p99_ms"])
        _ratio(row["ratio"], row["msgs_per_s"], sqlite)
        assert row["in_process_msgs_per_s"] == statistics.median(run["msgs_per_s"] for run in row["in_process_runs"])
        _ratio(row["in_process_ratio"], row["in_process_msgs_per_s"], sqlite)
        for way, call in (("python_stream", "a SendStream per producer"), ("python_send", "a Send per message")):
            figures = row["ways"][way]
            line = f"| {row['producers']} | Python asyncio | {call} | {figures['msgs_per_s']:,.0f} | {figures['p50_ms']:.2f} | {figures['p99_ms']:.2f} |"
            assert line in markdown, line
    noop = sync["noop_server"]
    assert noop["producers"] == max(PRODUCERS) and set(noop["ways"]) == ways
    for figures in noop["ways"].values():
        assert len(figures["runs"]) == 1 and figures["msgs_per_s"] == statistics.median(figures["runs"]) > 0
    assert "judged on the Python asyncio client's streams (`python_stream`)" in markdown


@pytest.mark.slow
def test_latency_sections_are_complete(smoke: tuple[dict[str, Any], str, list[str]]) -> None:
    results, _, _ = smoke
    lookups = results["sizes"][str(SIZE)]["lookups"]
    for where in ("in_process", "grpc", "sqlite"):
        for kind in LOOKUP_KINDS:
            summary = lookups[where][kind]
            expected = TIME_SEARCHES if kind == "time_search" else None
            if kind in ("key", "uniq_key", "queue_offset"):
                expected = LOOKUPS
            if expected is not None:
                assert summary["count"] == expected, (where, kind)
            assert summary["count"] == 0 or summary["p50_us"] <= summary["p99_us"], (where, kind)
    floors = [lookups["ping"], *(lookups["bare_unary"][kind] for kind in ("threaded", "asyncio"))]
    assert sum(floor["count"] for floor in floors) == 3 * LOOKUPS + TIME_SEARCHES  # one after each lookup, in turn
    assert all(floor["count"] > 0 and floor["p50_us"] <= floor["p99_us"] for floor in floors)
    assert all("USING" in plan and "INDEX" in plan for plan in lookups["sqlite_query_plans"].values())
    lag = results["once"]["lag"]
    assert lag["rmqstore"]["lag"]["count"] + lag["rmqstore"]["timeouts"] == 10
    assert lag["sqlite"]["lag"]["count"] == 10


@pytest.mark.slow
def test_recovery_and_memory_figures(smoke: tuple[dict[str, Any], str, list[str]]) -> None:
    results, _, _ = smoke
    size = results["sizes"][str(SIZE)]
    kill = size["recovery"]["after_sigkill"]
    assert kill["rmqstore"]["recovered"]["uncleanShutdown"] is True
    assert kill["rmqstore"]["acked_at_kill"] >= SIZE * 0.9
    assert _positive(kill["rmqstore"]["restart_seconds"]) and _positive(kill["sqlite"]["restart_seconds"])
    assert kill["sqlite"]["messages_after_recovery"] >= kill["sqlite"]["acked_at_kill"]
    redispatch = size["recovery"]["redispatch"]
    assert redispatch["reindex"]["records"] == SIZE == redispatch["writer_start"]["records"]
    assert _positive(redispatch["reindex"]["mb_per_s"]) and _positive(redispatch["sqlite_index_rebuild"]["msgs_per_s"])
    rss = size["rss"]
    for key in ("VmRSS", "RssAnon", "RssFile"):
        assert _positive(rss["query_node_kib"][key]) and key in rss["sqlite_process_kib"]


@pytest.mark.slow
def test_cross_check_agreed_on_every_lookup(smoke: tuple[dict[str, Any], str, list[str]]) -> None:
    results, _, _ = smoke
    check = results["cross_check"]
    assert check["total_mismatches"] == 0, check["examples"]
    expected = {}
    for where in ("in-process", "grpc"):
        for kind in ("key", "uniq_key", "queue_offset"):
            expected[f"{SIZE}/{where}/{kind}"] = LOOKUPS
        expected[f"{SIZE}/{where}/time_search"] = TIME_SEARCHES
    expected[f"{SIZE}/sqlite/time_search"] = TIME_SEARCHES
    assert check["checked"] == expected


@pytest.mark.slow
def test_results_md_names_the_command(smoke: tuple[dict[str, Any], str, list[str]]) -> None:
    results, markdown, _ = smoke
    assert results["command"].startswith("python benchmarks/run.py ")
    assert results["command"] in markdown
    assert "--sizes 2000" in results["command"]
    for heading in ("## Targets", "## 1. ", "## 2. ", "## 3. ", "## 4. ", "## 5. ", "## 6. ", "## 7. ",
                    "## Cross-check"):  # fmt: skip
        assert heading in markdown
    assert "All 1,260 answers agree." in markdown
    assert "| `--acks summary` |" in markdown and "`send --file --acks all`, end to end" in markdown
    most = results["once"]["sync"]["rows"][-1]
    assert f"| {most['producers']} | Python asyncio | a SendStream per producer | {most['msgs_per_s']:,.0f} |" in markdown


def test_the_key_floor_probe_reads_the_pages_by_key_gives(tmp_path: Path) -> None:
    """benchmarks/key_floor.py at a smoke size: every hot page it reads with the compiled
    calls alone is the page StoreView.by_key answers, and each part is timed once per
    hot lookup."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "key_floor.py"), "--size", "5000", "--lookups", "400", "--work", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["size"] == 5000 and result["hot_lookups"] > 50
    assert result["pages_agree"] == result["hot_lookups"]
    for part in ("walk", "reads", "walk_and_reads", "records", "by_key"):
        assert result[part]["count"] == result["hot_lookups"] and _positive(result[part]["p96_us"]), part
    assert not (tmp_path / "store").exists()  # the store is removed, the directory given is kept


def test_the_front_probe_stores_what_both_designs_acked() -> None:
    """benchmarks/front_probe.py at a smoke size: the writer and the fronts prototype each
    acked messages from every producer, and each store holds at least as many records as
    were acked (both really append and fsync; neither is a no-op)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "front_probe.py"), "--rounds", "1", "--seconds", "0.5"],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert (result["fronts"], result["clients"], result["producers"]) == (2, 2, 64)
    for design in ("writer", "fronts"):
        (rate,) = result["acked_per_s"][design]
        (stored,) = result["stored_records"][design]
        assert rate > 0 and stored >= rate * result["seconds"] - 1, (design, rate, stored)
    assert result["fronts_to_writer"] == round(result["median"]["fronts"] / result["median"]["writer"], 2)


@pytest.mark.slow
def test_console_benchmark_runs_at_a_smoke_size(tmp_path: Path) -> None:
    """benchmarks/console_bench.py end to end on a small store: every figure and verdict
    written, CONSOLE.md naming the command. No timing is asserted."""
    out = tmp_path / "out"
    args = ["--messages", "3000", "--repeats", "5", "--chart-repeats", "2", "--warmup", "1",
            "--work", str(tmp_path / "work"), "--out", str(out)]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "console_bench.py"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    (result_file,) = (out / "results").glob("console-*-3000.json")
    result = json.loads(result_file.read_text(encoding="utf-8"))
    assert set(result["figures"]) == {"key_page", "key_grpc", "detail_page", "detail_grpc", "rate_page", "rate_grpc", "rate_dense_grpc"}
    assert all(f["n"] == (2 if name.startswith("rate") else 5) and _positive(f["p50_ms"]) for name, f in result["figures"].items())
    assert set(result["verdicts"]) == {"key", "detail", "rate", "rate_dense_estimate"}
    assert result["rate"]["intervals"] == 1440 and result["rate"]["queues"] == 8
    assert 1 <= result["key"]["first_page"] <= 50
    assert result["command"] == "python benchmarks/console_bench.py " + " ".join(args)
    report = (out / "CONSOLE.md").read_text(encoding="utf-8")
    assert f"`{result['command']}`" in report and "| key search page (50) |" in report
    assert not (tmp_path / "work" / "console-store").exists()


def test_the_rocketmq5_benchmark_measures_both_senders(tmp_path: Path) -> None:
    """benchmarks/rocketmq5_bench.py at a smoke size: the official Python client, our own
    Send and our own callers of v2 SendMessage each deliver every message, and the ratios
    are theirs of the medians. An earlier report's hand-written analysis is kept below the
    new figures."""
    out = tmp_path / "ROCKETMQ5.md"
    out.write_text("# old figures\n\n## What bounds the figure\n\nkept as written\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "rocketmq5_bench.py"), "--messages", "200", "--rounds", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["messages"], result["concurrency"], result["rounds"]) == (200, 64, 1)
    medians = result["median_msgs_per_s"]
    assert medians["official_python_client"] > 0 and medians["own_send"] > 0 and medians["own_callers_v2"] > 0
    assert abs(result["client_to_own_send"] - medians["official_python_client"] / medians["own_send"]) < 0.011
    assert abs(result["own_callers_v2_to_own_send"] - medians["own_callers_v2"] / medians["own_send"]) < 0.011
    assert result["client_to_own_send_by_round"] == [result["client_to_own_send"]]  # one round: its own pair
    assert result["met"] == (result["client_to_own_send"] >= 0.8)
    report = out.read_text()
    assert "python benchmarks/rocketmq5_bench.py --messages 200" in report
    assert "# old figures" not in report
    assert report.endswith("|\n\n## What bounds the figure\n\nkept as written\n")


def test_the_cluster_benchmark_measures_both_ways(tmp_path: Path) -> None:
    """benchmarks/cluster_bench.py at a smoke size: our own v2 callers deliver every
    message directly and through a proxy, each process's CPU is counted, and the report's
    figures are its medians'; the hand-written analysis below them is kept."""
    out = tmp_path / "CLUSTER.md"
    out.write_text("# old figures\n\n## What bounds the figure\n\nkept as written\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "cluster_bench.py"), "--messages", "100", "--rounds", "1", "--concurrency", "8",
         "--rates", "200", "--batch-sizes", "1", "16", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    medians = result["medians"]
    assert medians["direct"]["msgs_per_s"] > 0 and medians["proxy"]["msgs_per_s"] > 0
    assert medians["proxy"]["proxy_cpu_us_per_message"] > 0
    assert [r["messages"] for r in result["runs"]["proxy"]] == [100]
    assert result["met"] == (medians["proxy"]["writer_cpu_us_per_message"] <= 50)
    # The paced ways send every message at the rate asked, each way.
    assert [r["messages"] for r in result["runs"]["proxy 200/s"]] == [100] and result["runs"]["direct 200/s"][0]["offered_rate"] == 200
    assert medians["proxy 200/s"]["proxy_cpu_us_per_message"] > 0
    costs = result["batch_costs"]
    assert set(costs["sizes"]) == {"1", "16"} and costs["sizes"]["16"]["writer_us_per_batch"] > 0
    assert costs["sizes"]["1"]["floor_us_per_batch"] > 0  # the bare grpc stream's, same batches
    report = out.read_text()
    assert "python benchmarks/cluster_bench.py --messages 100" in report and "# old figures" not in report
    assert "| proxy 200/s |" in report and "µs a batch +" in report
    assert report.endswith("\n## What bounds the figure\n\nkept as written\n")


def test_the_consume_floor_acknowledges_every_message_both_ways(tmp_path: Path) -> None:
    """benchmarks/consume_floor.py at a smoke size: each way receives and acknowledges
    every stored message, with the calls its way makes (one AckMessage a received batch,
    or one a message), and the medians are its rounds'."""
    out = tmp_path / "floor.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "consume_floor.py"), "--messages", "96", "--batch", "32", "--threads", "2",
         "--rounds", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["command"] == "python benchmarks/consume_floor.py --messages 96 --batch 32 --threads 2 --rounds 1 --out " + str(out)
    (only,) = result["rounds"]
    batched, single = only["batch_acks"], only["one_ack_a_message"]
    assert batched["acknowledged"] == single["acknowledged"] == 96
    assert single["acks"] == 96 and single["receives"] >= 3  # at most 32 a receive
    assert 3 <= batched["acks"] <= batched["receives"]  # one call a batch received, empty ones aside
    assert result["batch_acks_writer_cpu_us_per_message_median"] == batched["writer_cpu_us_per_message"] > 0
    assert result["one_ack_a_message_writer_cpu_us_per_message_median"] == single["writer_cpu_us_per_message"] > 0


def test_queue_count_latency_smoke(tmp_path: Path) -> None:
    """benchmarks/queue_count_latency.py at a smoke size: it runs and writes its figures."""
    out = tmp_path / "latency.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "queue_count_latency.py"), "--queues", "50", "--seconds", "0.3", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["queues"] == 50 and "queue_count_latency.py --queues 50" in result["command"]
    for side in ("baseline_4_queues", "with_idle_queues"):
        assert result[side]["requests"] > 0 and 0 < result[side]["p50_ms"] <= result[side]["p99_ms"]
    assert result["p50_ratio"] > 0 and result["p99_ratio"] > 0


def test_the_metrics_cost_probe_times_every_variant() -> None:
    """benchmarks/metrics_cost.py at a smoke size: the three servers (no metrics layer,
    metrics off, metrics on) answered every call and the ratios are those of the medians."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "metrics_cost.py"), "--rounds", "1", "--calls", "30"],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["command"] == "benchmarks/metrics_cost.py --rounds 1 --calls 30"
    assert sorted(result["calls"]) == ["Ping", "QueueBounds", "key page of 8", "one-message Send"]
    for row in result["calls"].values():
        assert all(row[f"{kind}_p{q}_us"] > 0 for kind in ("without", "off", "on") for q in (50, 99))
        assert row["p50_ratio_off_to_without"] == round(row["off_p50_us"] / row["without_p50_us"], 3)
        assert row["p50_ratio_on_to_without"] == round(row["on_p50_us"] / row["without_p50_us"], 3)


@pytest.mark.slow
def test_the_consumer_benchmark_measures_both_queues(tmp_path: Path) -> None:
    """benchmarks/consumer_bench.py at a smoke size: the official Python SimpleConsumer, our
    own v2 caller, the SQLite queue and the peers (Redis Streams, NATS JetStream, real servers)
    each consume every stored message once, the paced producers' messages all arrive with a
    latency each, and the ratios are theirs. No timing is asserted."""
    out = tmp_path / "CONSUMERS.md"
    out.write_text("# old figures\n\n## What bounds the figures\n\nkept as written\n")
    args = ["--messages", "300", "--rates", "200", "--seconds", "1", "--own-v2-consumers", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "consumer_bench.py"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rates = result["receive_ack"]
    assert (rates["rmqstore"]["messages"], rates["rmqstore"]["duplicates"]) == (300, 0)
    assert rates["rmqstore"]["consumer_cpu_us_per_message"] > 0 and rates["rmqstore"]["writer_cpu_us_per_message"] > 0
    assert (rates["rmqstore_own_v2"]["messages"], rates["rmqstore_own_v2"]["duplicates"]) == (300, 0)
    assert result["own_v2_rate_ratio"] == round(rates["rmqstore_own_v2"]["msgs_per_s"] / rates["sqlite"]["msgs_per_s"], 2)
    assert (rates["sqlite"]["messages"], rates["sqlite_full"]["messages"]) == (300, 300)
    assert result["rate_ratio"] == round(rates["rmqstore"]["msgs_per_s"] / rates["sqlite"]["msgs_per_s"], 2)
    assert result["rate_met"] == (result["rate_ratio"] >= 5.0)
    own = rates["rmqstore_own_v2"]
    # The floor: the same caller against a bare grpc.aio server streaming the same answers.
    assert (rates["bare_v2"]["messages"], rates["bare_v2"]["duplicates"]) == (300, 0)
    assert rates["bare_v2"]["server_cpu_us_per_message"] > 0
    assert sorted(result["peers"]) == ["nats-ack-all", "nats-explicit", "redis"]
    for peer, figures in result["peers"].items():
        assert (figures["messages"], figures["duplicates"]) == (300, 0), peer
        # A C server's CPU for 300 messages can be under one clock tick (10 ms) of /proc's
        # count: measured, never negative; the Python consumer's always shows.
        assert figures["server_cpu_us_per_message"] >= 0 and figures["consumer_cpu_us_per_message"] > 0, peer
        ratios = result["peer_ratios"][peer]
        assert ratios["msgs_per_s_ratio"] == round(own["msgs_per_s"] / figures["msgs_per_s"], 2), peer
        server_cpu = figures["server_cpu_us_per_message"]
        # No ratio to a CPU read as 0: the report says None rather than dividing by it.
        expected = round(own["writer_cpu_us_per_message"] / server_cpu, 2) if server_cpu else None
        assert ratios["server_cpu_ratio"] == expected, peer
    [run] = result["latency"]
    assert run["rate"] == 200
    for system in ("rmqstore", "rmqstore_own_v2", "sqlite"):
        latency = run[system]
        assert (latency["sent"], latency["received"], latency["duplicates"]) == (200, 200, 0), system
        assert 0 <= latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"], system
        if system != "sqlite":
            assert latency["writer_cores"] > 0 and latency["consumers_cores"] > 0, system
    assert result["p99_met"] == (run["rmqstore"]["p99_ms"] <= 50.0)
    assert result["own_v2_p99_met"] == (run["rmqstore_own_v2"]["p99_ms"] <= 50.0)
    report = out.read_text()
    assert report.startswith("# RocketMQ 5 consumers") and "`python benchmarks/consumer_bench.py --messages 300" in report
    assert "(benchmarks/bare_receive.py, no store)" in report and "(target ≤ 20 µs:" in report
    assert "## Beside the servers users would pick instead" in report and "| Redis Streams, redis-py" in report
    assert "# old figures" not in report and report.endswith("\n## What bounds the figures\n\nkept as written\n")
    [saved] = (tmp_path / "results").glob("consumers-*-300.json")
    assert json.loads(saved.read_text()) == result


def test_the_tracing_benchmark_measures_both_ways(tmp_path: Path) -> None:
    """benchmarks/tracing_bench.py at a smoke size: each batch size timed traced and not,
    past its one round until the untraced runs add up to --min-seconds (never here) or
    --max-rounds; the traced runs' spans received, the report naming the command and the
    targets."""
    out = tmp_path / "TRACING.md"
    args = ["--messages", "200", "--rounds", "1", "--min-seconds", "1e9", "--max-rounds", "2", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "tracing_bench.py"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["command"] == "python benchmarks/tracing_bench.py " + " ".join(args)
    assert set(result["batches"]) == {"1", "1000"}
    for batch, figures in result["batches"].items():
        assert len(figures["runs"]["off"]) == len(figures["runs"]["on"]) == figures["rounds"] == 2, batch
        assert _positive(figures["wall_ratio"]) and figures["target"] == {"1": 1.15, "1000": 1.05}[batch]
        # Two pairs: the paired figure is the mean of their ratios, its quartiles a
        # quarter of the way in from each (interpolated within the pairs' ratios).
        ratios = sorted(on["seconds"] / off["seconds"] for off, on in zip(figures["runs"]["off"], figures["runs"]["on"]))
        assert figures["paired_wall_ratio"] == round(sum(ratios) / 2, 3), batch
        low, high = (ratios[0] * 3 + ratios[1]) / 4, (ratios[0] + ratios[1] * 3) / 4
        assert figures["paired_wall_ratio_iqr"] == [round(low, 3), round(high, 3)], batch
        assert figures["met"] == (sum(ratios) / 2 <= figures["target"]), batch
        # The command's CPU time: it loads Python and gRPC whether traced or not.
        assert figures["off"]["command_cpu_s"] > 0 and _positive(figures["command_cpu_ratio"]), batch
    # batch 1: a span per request on the client, an append span per group on the
    # writer, and the stream's spans; batch 1,000: one request.
    assert result["spans_received"] >= 2 * (200 + 2 + 3)
    report = out.read_text(encoding="utf-8")
    assert "python benchmarks/tracing_bench.py --messages 200" in report and "≤ 1.15" in report and "≤ 1.05" in report
    assert "| command CPU on/off |" in report and "| wall on/off, paired (IQR) |" in report


def test_the_intake_probe_measures_the_writers_cpu_per_message() -> None:
    """benchmarks/intake_probe.py at a smoke size, its writer run by two interpreters
    (the same one twice) alternately: every message acked in every round, and the figures
    printed agree with each other."""
    python = sys.executable
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "intake_probe.py"), "--batches", "3", "--rounds", "1",
         "--python", python, "--python", python],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["command"] == f"benchmarks/intake_probe.py --batches 3 --rounds 1 --python {python} --python {python}"
    assert [r["python"] for r in result["rounds"]] == [python, python]
    for row in result["rounds"]:
        assert row["messages"] == 3000
        assert row["writer_cpu_s"] >= 0 and row["msgs_per_s"] > 0
        assert row["writer_cpu_us_per_msg"] == round(row["writer_cpu_s"] / 3000 * 1e6, 3)
    assert list(result["medians"]) == [python]


def test_the_intake_probe_sends_each_writer_its_own_request_shape() -> None:
    """--shape: one writer takes the messages as Message objects, the other as
    SendBatchRequest.columns; every message acked by each (the probe checks), each
    labelled with its shape."""
    python = sys.executable
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "intake_probe.py"), "--batches", "2", "--rounds", "1",
         "--python", python, "--python", python, "--shape", "messages", "--shape", "columns"],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert [r["python"] for r in result["rounds"]] == [f"{python} messages", f"{python} columns"]
    assert [r["messages"] for r in result["rounds"]] == [2000, 2000]
    assert list(result["cpu_per_msg_vs_first"]) == [f"{python} messages", f"{python} columns"]


def test_the_failover_soak_runs_at_a_smoke_size(tmp_path: Path) -> None:
    """benchmarks/failover_soak.py with one SIGKILL and one SIGSTOP of the primary (a 2 s
    lease): both done, nothing acknowledged lost or acknowledged twice, every replica
    check-clean, a failover time for each kind."""
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "failover_soak.py"), "--kills", "1", "--stops", "1", "--lease-ttl-s", "2",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["done"] == {"kills": 1, "stops": 1} == result["asked"]
    assert result["acked_messages"] > 0 and result["offsets_acked_for_two_messages"] == 0
    assert result["acked_lost_on_replica"] == {"0": 0, "1": 0, "2": 0}
    assert result["check_exit_codes"] == {"0": 0, "1": 0, "2": 0}
    times = result["expiry_to_first_ack_s"]
    assert times["kill_p50"] is not None and times["stop_p50"] is not None


def test_the_transactions_benchmark_measures_both_paths() -> None:
    """benchmarks/transactions_bench.py at a smoke size: a normal send and a committed
    transaction each cost the writer some CPU, and the ratio is theirs of the medians."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "transactions_bench.py"), "--messages", "40", "--rounds", "1", "--threads", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    medians = result["median_cpu_us_per_message"]
    assert medians["normal"] > 0 and medians["committed_transaction"] > 0
    assert result["ratio"] == round(medians["committed_transaction"] / medians["normal"], 2)
    assert [len(result["rounds"][kind]) for kind in ("normal", "committed_transaction")] == [1, 1]


def test_the_proxy_lookups_benchmark_times_each_lookup_both_ways() -> None:
    """benchmarks/proxy_lookups_bench.py at a smoke size: each kind of lookup timed as
    many times directly and through the proxy, with its p50 ratio."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "proxy_lookups_bench.py"), "--groups", "2", "--messages", "20",
         "--lookups", "5", "--page", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert sorted(result["kinds"]) == ["key (one match)", "key, first page of 10", "message id"]
    for kind in result["kinds"].values():
        assert kind["direct"]["count"] == kind["proxy"]["count"] == 5
        assert kind["p50_ratio"] == round(kind["proxy"]["p50_us"] / kind["direct"]["p50_us"], 2)
