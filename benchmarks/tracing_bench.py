"""What tracing costs: ``rmqstore send --file`` against a fresh ASYNC writer with tracing
off (no ``OTEL_*`` variable) and on (both the command and the writer exporting over OTLP
to a receiver in this process, on 127.0.0.1), alternating, ROUNDS times, at one message
a request (``--batch-size 1``) and at 1,000. The traced runs sample with the SDK's default
sampler (parent-based, always on: every span kept), or with the one ``--sampler NAME[:ARG]``
names (``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG``, for the command and the
writer alike).

The figures are measured in the same run: the command's wall time from its start to its
exit, traced over untraced (targets: at most 1.15 at one message a request, 1.05 at
1,000), and the writer's CPU time (user + system) for the same sends. Each round is a
pair, untraced then traced; the figure judged against the target is the median of the
pairs' ratios (a pair's two runs are seconds apart, so a shared machine's slow minutes
fall on both), with its interquartile range; the ratio of the medians is given too.

A run at 1,000 messages a request takes well under a second, and other tenants' load
moves one such run by tens of percent: R rounds would not tell 1.05 from 1.15. So a
batch size is run for at least R rounds and until its untraced runs add up to
MIN_SECONDS (at most MAX_ROUNDS rounds).

    python benchmarks/tracing_bench.py [--messages N] [--rounds R] [--min-seconds S]
                                       [--max-rounds M] [--sampler NAME[:ARG]]
                                       [--out benchmarks/TRACING.md]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_common import Nodes, load_average, machine_facts, quiet_env  # noqa: E402

TARGETS = {1: 1.15, 1000: 1.05}
TIMEOUT_S = 3600.0


class Receiver:
    """An OTLP/gRPC receiver that counts the spans it is sent and keeps nothing else."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.metrics.v1 import (
            metrics_service_pb2,
            metrics_service_pb2_grpc,
        )
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        receiver = self
        self.spans = 0
        self.lock = threading.Lock()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                with receiver.lock:
                    receiver.spans += sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def env(self, sampler: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        if sampler:
            name, _, argument = sampler.partition(":")
            env["OTEL_TRACES_SAMPLER"] = name
            if argument:
                env["OTEL_TRACES_SAMPLER_ARG"] = argument
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{self.port}",
            OTEL_EXPORTER_OTLP_INSECURE="true",
            # Traces only: the metrics' cost is not this measure's.
            OTEL_METRICS_EXPORTER="none",
        )
        return env


def write_messages(path: Path, count: int) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(
            json.dumps({"topic": f"Traced{i % 4}", "body": f"message {i:08d} " + "x" * 100, "keys": [f"k{i}"], "tags": "T"}) + "\n"
            for i in range(count)
        )


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_bytecode(env: dict[str, str]) -> dict[str, str]:
    """The command runs from compiled modules, as an installed package does (pip compiles
    them): a shell's PYTHONDONTWRITEBYTECODE would have it compile every module it loads
    on every run, the traced run's more."""
    return {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}


def one_run(work: Path, jsonl: Path, batch: int, env: dict[str, str]) -> dict[str, float]:
    env = with_bytecode(env)
    store = work / f"store-{time.monotonic_ns()}"
    with Nodes(work / "logs") as nodes:
        writer = nodes.start("writer", store, "--flush", "async", env=env)
        command = [sys.executable, "-m", "rmqstore.cli.main", "send", "--endpoint", writer.endpoint,
                   "--file", str(jsonl), "--acks", "none", "--batch-size", str(batch)]  # fmt: skip
        cpu_before = cpu_seconds(writer.proc.pid)
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, timeout=TIMEOUT_S, check=False)
        seconds = time.perf_counter() - started
        cpu = cpu_seconds(writer.proc.pid) - cpu_before
        # The command is the only child that ends meanwhile: its user + system time.
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        command_cpu = (children.ru_utime - children_before.ru_utime) + (children.ru_stime - children_before.ru_stime)
        writer.stop()
    # Each store preallocates its files (a GiB and more): one at a time on the disk.
    shutil.rmtree(store, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"rmqstore send failed ({done.returncode}): {done.stderr.decode(errors='replace')}")
    return {"seconds": seconds, "writer_cpu_s": cpu, "command_cpu_s": command_cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=30.0)
    parser.add_argument("--max-rounds", type=int, default=40)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 1000])
    parser.add_argument("--sampler", help="OTEL_TRACES_SAMPLER[:OTEL_TRACES_SAMPLER_ARG] of the traced runs (default: the SDK's)")
    parser.add_argument("--out", type=Path, default=HERE / "TRACING.md")
    args = parser.parse_args()
    command = "python benchmarks/tracing_bench.py " + " ".join(sys.argv[1:])
    compileall.compile_dir(REPO, quiet=1, rx=re.compile(r"/(\.venv[^/]*|node_modules|\.git)/"))
    receiver = Receiver()
    results: dict[str, Any] = {"command": command.strip(), "messages": args.messages, "rounds": args.rounds,
                               "min_seconds": args.min_seconds, "max_rounds": args.max_rounds, "sampler": args.sampler, "batches": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="tracing-bench-") as temp:
            work = Path(temp)
            jsonl = work / "messages.jsonl"
            write_messages(jsonl, args.messages)
            for batch in args.batches:
                runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
                while len(runs["off"]) < args.rounds or (
                    sum(r["seconds"] for r in runs["off"]) < args.min_seconds and len(runs["off"]) < args.max_rounds
                ):
                    runs["off"].append(one_run(work, jsonl, batch, quiet_env()))
                    runs["on"].append(one_run(work, jsonl, batch, receiver.env(args.sampler)))
                measures = ("seconds", "writer_cpu_s", "command_cpu_s")
                off = {k: statistics.median(r[k] for r in runs["off"]) for k in measures}
                on = {k: statistics.median(r[k] for r in runs["on"]) for k in measures}
                paired = [b["seconds"] / a["seconds"] for a, b in zip(runs["off"], runs["on"])]
                wall = statistics.median(paired)
                quartiles = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) > 1 else [wall, wall, wall]
                results["batches"][str(batch)] = {
                    "off": off, "on": on, "runs": runs, "rounds": len(paired),
                    "paired_wall_ratio": round(wall, 3),
                    "paired_wall_ratio_iqr": [round(quartiles[0], 3), round(quartiles[2], 3)],
                    "wall_ratio": round(on["seconds"] / off["seconds"], 3),
                    "writer_cpu_ratio": round(on["writer_cpu_s"] / off["writer_cpu_s"], 3) if off["writer_cpu_s"] else None,
                    "command_cpu_ratio": round(on["command_cpu_s"] / off["command_cpu_s"], 3) if off["command_cpu_s"] else None,
                    # The targets are for always-on sampling: another sampler's runs are not judged.
                    "target": None if args.sampler else TARGETS.get(batch),
                    "met": None if args.sampler or batch not in TARGETS else wall <= TARGETS[batch],
                }  # fmt: skip
            # Every traced run's spans reached the receiver (a few are in flight at most).
            results["spans_received"] = receiver.spans
    finally:
        receiver.server.stop(None)
    results["machine"] = machine_facts(REPO)
    results["load_average"] = load_average()
    args.out.write_text(report(results), encoding="utf-8")
    print(json.dumps({k: v for k, v in results.items() if k != "machine"}, default=str))


def sampler_text(sampler: str | None) -> str:
    if not sampler:
        return "the SDK's default sampler: parent-based, always on"
    name, _, argument = sampler.partition(":")
    return f"OTEL_TRACES_SAMPLER={name}" + (f", OTEL_TRACES_SAMPLER_ARG={argument}" if argument else "")


def report(results: dict[str, Any]) -> str:
    lines = [
        "# What tracing costs",
        "",
        f"Measured by `{results['command']}`: {results['messages']:,} messages sent with `rmqstore send --file`",
        f"to a fresh ASYNC writer, tracing off and on alternating, at least {results['rounds']} rounds and until the",
        f"untraced runs add up to {results['min_seconds']:g} s (at most {results['max_rounds']} rounds); medians. A round is a",
        "pair, untraced then traced: the figure judged against the target is the median of the pairs'",
        "ratios, with its interquartile range (a shared machine's slow minutes fall on both runs of a pair).",
        f"Traced means the command and the writer both export over OTLP ({sampler_text(results['sampler'])}) to a receiver",
        "on 127.0.0.1. Wall time is the command's, from its start to its exit; CPU time (user +",
        "system) is the writer's during the command, and the command's own. The command runs from",
        "compiled modules (the package is byte-compiled first), as an installed package does.",
        "",
        "| messages a request | rounds | wall off (s) | wall on (s) | wall on/off, paired (IQR) | target | met | "
        "ratio of medians | writer CPU on/off | command CPU on/off |",
        "|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|",
    ]
    for batch, figures in results["batches"].items():
        target = figures["target"]
        lines.append(
            f"| {int(batch):,} | {figures['rounds']} | {figures['off']['seconds']:.3f} | {figures['on']['seconds']:.3f} | "
            f"{figures['paired_wall_ratio']:.3f} ({figures['paired_wall_ratio_iqr'][0]:.3f}-{figures['paired_wall_ratio_iqr'][1]:.3f}) | "
            f"{'' if target is None else f'≤ {target}'} | {'' if figures['met'] is None else ('yes' if figures['met'] else 'no')} | "
            f"{figures['wall_ratio']:.3f} | {figures['writer_cpu_ratio']} | {figures['command_cpu_ratio']} |"
        )
    lines += ["", f"Spans received: {results['spans_received']:,}. Load average at the end: {results['load_average']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
