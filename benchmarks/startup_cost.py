"""The CPU a process of each kind the test suite starts costs, from exec to exit.

Kinds: a writer, a query node and a proxy, each started (``… serve --port 0``), read to its
serving line and stopped with SIGTERM; and the short commands (``send`` to a writer,
``queryMsgByKey`` through a query node and on the store itself, ``check``, ``--version``)
run to their exit. Each process runs as the tests run them (tests/support/cli.py:
``python -m rmqstore.cli.main``, no OpenTelemetry setting, ``OTEL_SDK_DISABLED=true``);
its CPU is user + system from ``os.wait4``, its wall time from exec to exit.

Given several interpreters (each a virtualenv with rmqstore installed, e.g. the tree before
and after a change), the runs alternate between them and between kinds, in the same order
every round, so that the machine's own pace falls on all of them alike; the last column
is the later interpreter's mean over the first's. Each tree's modules are compiled to
bytecode first, as .ci/run compiles them.

    python benchmarks/startup_cost.py BEFORE/.venv/bin/python AFTER/.venv/bin/python --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SERVING_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
TOPIC = "StartupTopic"
KEY = "startup-key"
# Small files, as the tests' stores have (a 1 GiB commit log file would cost a fresh
# store's first mapping, not the start-up this measures).
SIZE_ARGS = ("--commitlog-file-size", str(1 << 20), "--cq-file-units", "1000", "--index-slots", "100", "--index-entries", "400")


@dataclass(frozen=True)
class Cost:
    cpu_s: float
    wall_s: float


def quiet_env() -> dict[str, str]:
    """The tests' environment for the processes they start (tests/support/cli.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_SDK_DISABLED"] = "true"
    return env


def command(python: str, *args: str) -> list[str]:
    return [python, "-m", "rmqstore.cli.main", *args]


def reap(process: subprocess.Popen[bytes], started: float) -> Cost:
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{process.args} exited {process.returncode}")
    return Cost(usage.ru_utime + usage.ru_stime, time.monotonic() - started)


def short(python: str, *args: str) -> Cost:
    """A command run to its exit."""
    started = time.monotonic()
    process = subprocess.Popen(command(python, *args), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=quiet_env())
    return reap(process, started)


def serving(python: str, *args: str) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    """A node started and read to its serving line (its first stdout line)."""
    process = subprocess.Popen(command(python, *args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=quiet_env())
    assert process.stdout is not None
    # Bounded by the node's own start: one that fails exits, closing its stdout.
    line = process.stdout.readline()
    if not line:
        process.kill()
        raise SystemExit(f"{args} ended before its serving line")
    return process, json.loads(line)


def stopped(process: subprocess.Popen[bytes]) -> bool:
    """SIGTERM, then its stdout read to the end: False if it did not end in STOP_TIMEOUT_S
    (the process is then killed)."""
    process.send_signal(signal.SIGTERM)
    assert process.stdout is not None
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while (left_s := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([process.stdout], [], [], left_s)
        if ready and not os.read(process.stdout.fileno(), 65536):
            return True
    process.kill()
    return False


def node(python: str, *args: str) -> Cost:
    """A node started, read to its serving line and stopped with SIGTERM."""
    started = time.monotonic()
    process, _ = serving(python, *args)
    if not stopped(process):
        raise SystemExit(f"{args} did not stop within {STOP_TIMEOUT_S} s of SIGTERM")
    return reap(process, started)


@dataclass
class Fixture:
    """A store holding one keyed message, its writer (for ``send``) and a query node on it
    (for lookups through a node) left serving, and a cluster file naming them (for the
    proxy)."""

    store: Path
    writer_endpoint: str
    query_endpoint: str
    cluster: Path
    processes: list[subprocess.Popen[bytes]]


# The package's folders (rmqstore.<name>), compiled to bytecode before any run, as .ci/run
# compiles them: under PYTHONDONTWRITEBYTECODE a stale or missing .pyc is compiled again
# by every process, and the figures would be the compiler's.
PACKAGES = ("common", "cli", "client", "writer", "query", "pipeline", "service", "console", "proxy", "v1", "rocketmq_v2")
COMPILE = (
    "import compileall, importlib, sys\n"
    "for name in sys.argv[1:]:\n"
    "    for folder in importlib.import_module('rmqstore.' + name).__path__:\n"
    "        assert compileall.compile_dir(folder, quiet=1), folder\n"
)


def compile_tree(python: str) -> None:
    subprocess.run([python, "-c", COMPILE, *PACKAGES], check=True, env=quiet_env())


def fixture(python: str, work: Path) -> Fixture:
    store = work / "store"
    writer, line = serving(python, "writer", "serve", "--store", str(store), "--port", "0", *SIZE_ARGS)
    writer_endpoint = f"127.0.0.1:{line['port']}"
    subprocess.run(command(python, "send", "--endpoint", writer_endpoint, "-t", TOPIC, "-k", KEY, "--body", "x"), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=quiet_env())
    query, line = serving(python, "query", "serve", "--store", str(store), "--port", "0", *SIZE_ARGS)
    query_endpoint = f"127.0.0.1:{line['port']}"
    cluster = work / "cluster.yaml"
    cluster.write_text(f'groups:\n  - name: rmqstore-0\n    writers: ["{writer_endpoint}"]\n    queries: ["{query_endpoint}"]\n')
    return Fixture(store, writer_endpoint, query_endpoint, cluster, [writer, query])


def kinds(python: str, work: Path, at: Fixture) -> dict[str, Callable[[], Cost]]:
    fresh = iter(range(1_000_000))
    store = str(at.store)
    return {
        "writer serve (new store)": lambda: node(python, "writer", "serve", "--store", str(work / f"w{next(fresh)}"), "--port", "0", *SIZE_ARGS),
        "query serve": lambda: node(python, "query", "serve", "--store", store, "--port", "0", *SIZE_ARGS),
        "proxy serve": lambda: node(python, "proxy", "serve", "--cluster", str(at.cluster), "--port", "0"),
        "send (one message)": lambda: short(python, "send", "--endpoint", at.writer_endpoint, "-t", TOPIC, "--body", "y", "--acks", "none"),
        "queryMsgByKey --endpoint": lambda: short(python, "queryMsgByKey", "--endpoint", at.query_endpoint, "-t", TOPIC, "-k", KEY),
        "queryMsgByKey --store": lambda: short(python, "queryMsgByKey", "--store", store, "-t", TOPIC, "-k", KEY, *SIZE_ARGS),
        "check": lambda: short(python, "check", store, *SIZE_ARGS),
        "--version": lambda: short(python, "--version"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pythons", nargs="+", help="interpreters of virtualenvs with rmqstore installed")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    costs: dict[tuple[str, str], list[Cost]] = {}
    with tempfile.TemporaryDirectory(prefix="startup-cost-") as tmp:
        serving_nodes: list[subprocess.Popen[bytes]] = []
        runs: list[tuple[str, dict[str, Callable[[], Cost]]]] = []
        try:
            for index, python in enumerate(args.pythons):
                work = Path(tmp) / str(index)
                work.mkdir()
                compile_tree(python)
                at = fixture(python, work)
                serving_nodes += at.processes
                runs.append((python, kinds(python, work, at)))
            for _ in range(args.rounds):
                for python, measured in runs:
                    for kind, run in measured.items():
                        costs.setdefault((kind, python), []).append(run())
        finally:
            for process in serving_nodes:
                if not stopped(process):
                    print(f"{process.args} did not stop within {STOP_TIMEOUT_S} s of SIGTERM: killed", file=sys.stderr)
                process.wait()
    pythons = args.pythons
    print(f"mean of {args.rounds} runs each, CPU (user+sys) and wall, seconds")
    print("| kind | " + " | ".join(f"CPU {i}, wall {i}" for i in range(len(pythons))) + (" | CPU last/first |" if len(pythons) > 1 else " |"))
    for kind in runs[0][1]:
        means = [(statistics.fmean(c.cpu_s for c in costs[kind, p]), statistics.fmean(c.wall_s for c in costs[kind, p])) for p in pythons]
        cells = " | ".join(f"{cpu:.3f}, {wall:.3f}" for cpu, wall in means)
        ratio = f" | {means[-1][0] / means[0][0]:.2f} |" if len(pythons) > 1 else " |"
        print(f"| {kind} | {cells}{ratio}")
    for index, python in enumerate(pythons):
        print(f"{index}: {python}", file=sys.stderr)


if __name__ == "__main__":
    main()
