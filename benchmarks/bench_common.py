"""What every benchmark section shares: percentiles, medians, machine facts, process
memory, and the ``rmqstore … serve`` processes the gRPC sections start."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SERVING_TIMEOUT_S = 120.0  # a writer recovering a large store before it serves
STOP_TIMEOUT_S = 60.0


# Figures


def latency_summary(samples_ns: Sequence[int]) -> dict[str, Any]:
    """p50/p99 (exact, inclusive quantiles) and mean of per-call latencies, in µs."""
    if not samples_ns:
        return {"count": 0, "p50_us": None, "p99_us": None, "mean_us": None, "max_us": None}
    us = [s / 1000 for s in samples_ns]
    if len(us) == 1:
        p50 = p99 = us[0]
    else:
        cuts = statistics.quantiles(us, n=100, method="inclusive")
        p50, p99 = cuts[49], cuts[98]
    return {
        "count": len(us),
        "p50_us": round(p50, 2),
        "p99_us": round(p99, 2),
        "mean_us": round(statistics.fmean(us), 2),
        "max_us": round(max(us), 2),
    }


def closed_loop(call: Callable[[int], object], count: int, concurrency: int, what: str) -> tuple[float, list[int]]:
    """``call(n)`` for each n below ``count``, from ``concurrency`` threads that each wait
    for their call before taking the next number: the seconds it all took and each call's
    latency (ns). A call that raises stops every thread; then RuntimeError names ``what``
    and the first failure."""
    next_n = iter(range(count))
    lock = threading.Lock()
    latencies_ns: list[int] = []
    failures: list[BaseException] = []

    def caller() -> None:
        mine: list[int] = []
        while not failures:
            with lock:
                n = next(next_n, None)
            if n is None:
                break
            started = time.perf_counter_ns()
            try:
                call(n)
            except Exception as error:  # reported below, whatever it is
                failures.append(error)
                break
            mine.append(time.perf_counter_ns() - started)
        with lock:
            latencies_ns.extend(mine)

    seconds = in_threads(caller, concurrency)
    if failures:
        raise RuntimeError(f"{len(failures)} {what} failed, first: {failures[0]!r}")
    return seconds, latencies_ns


def in_threads(target: Callable[[], object], count: int) -> float:
    """``target`` run by ``count`` threads at once; the seconds until the last ended."""
    threads = [threading.Thread(target=target) for _ in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def median_of(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def ratio(ours: float | None, theirs: float | None, *, lower_is_better: bool = False) -> float | None:
    """How many times better rmqstore is than SQLite (> 1: rmqstore better)."""
    if not ours or not theirs:
        return None
    return round(theirs / ours if lower_is_better else ours / theirs, 2)


# Machine and process facts


def machine_facts(repo: Path) -> dict[str, Any]:
    import sqlite3

    import google.protobuf
    import grpc
    import numpy

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10, check=False)
            return done.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "grpcio": grpc.__version__,
        "protobuf": google.protobuf.__version__,
        "numpy": numpy.__version__,
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty_files": dirty.splitlines(),
        "loadavg_start": load_average(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def process_memory(pid: int) -> dict[str, int]:
    """Resident memory of a process from /proc/PID/status, in KiB. Mapped store files
    count in RssFile (page cache the kernel can drop), the heap in RssAnon."""
    wanted = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name in wanted:
                found[name] = int(value.split()[0])
    return found


def directory_bytes(path: Path) -> int:
    """Bytes actually allocated under a directory (store files are sparse)."""
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


# Server processes


def quiet_env() -> dict[str, str]:
    """No tracing exporter: no traffic beyond 127.0.0.1, no exporter cost in the figures."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_SDK_DISABLED"] = "true"
    return env


class NodeFailed(RuntimeError):
    pass


class Node:
    """A ``rmqstore writer serve`` or ``rmqstore query serve`` process on 127.0.0.1."""

    def __init__(
        self, kind: str, store: Path, log_dir: Path, *extra: str, env: dict[str, str] | None = None, python: str | None = None
    ):
        self.kind = kind
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = log_dir / f"{kind}-{time.monotonic_ns()}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.started_ns = time.perf_counter_ns()
        self.proc = subprocess.Popen(
            [python or sys.executable, "-m", "rmqstore.cli.main", kind, "serve", "--store", str(store),
             "--host", "127.0.0.1", "--port", "0", *extra],  # fmt: skip
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=quiet_env() if env is None else env,
        )
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        self.serving: dict[str, Any] = {}
        self.serving_ns = 0

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def stderr_tail(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-3000:]

    def wait_serving(self, timeout_s: float = SERVING_TIMEOUT_S) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise NodeFailed(f"{self.kind} did not serve within {timeout_s} s:\n{self.stderr_tail()}") from None
        if line is None:
            raise NodeFailed(f"{self.kind} exited (code {self.proc.wait(10)}) before serving:\n{self.stderr_tail()}")
        self.serving_ns = time.perf_counter_ns()
        self.serving = json.loads(line)
        if self.serving.get("event") != "serving":
            raise NodeFailed(f"{self.kind} printed {line!r} instead of its serving line")
        return self.serving

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.serving['port']}"

    @property
    def seconds_to_serving(self) -> float:
        return (self.serving_ns - self.started_ns) / 1e9

    def _wait_until_sigterm_is_caught(self) -> None:
        """A SIGTERM before the handler is installed would kill the node uncleanly."""
        bit = 1 << (signal.SIGTERM - 1)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as handle:
                caught = next(int(line.split()[1], 16) for line in handle if line.startswith("SigCgt:"))
            if caught & bit:
                return
            time.sleep(0.005)

    def stop(self) -> None:
        """SIGTERM and wait for a clean exit (final flush, checkpoint)."""
        if self.proc.poll() is None:
            self._wait_until_sigterm_is_caught()
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
                raise NodeFailed(f"{self.kind} did not stop within {STOP_TIMEOUT_S} s") from None
            if code != 0:
                raise NodeFailed(f"{self.kind} exited with code {code}:\n{self.stderr_tail()}")
        self.close()

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._reader.join(timeout=10)
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        if not self._stderr.closed:
            self._stderr.close()


class Nodes:
    """Every node a section starts; all are killed on exit, whatever happened."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[Node] = []

    def start(
        self, kind: str, store: Path, *extra: str, env: dict[str, str] | None = None, python: str | None = None
    ) -> Node:
        """A node serving; ``env`` replaces the untraced environment (e.g. to trace it),
        ``python`` the interpreter that runs it (another tree's, to compare the two)."""
        node = Node(kind, store, self.log_dir, *extra, env=env, python=python)
        self.started.append(node)
        node.wait_serving()
        return node

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc: object) -> None:
        for node in self.started:
            node.close()


def run_client(args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run a benchmark client process (benchmarks/grpc_clients.py or sqlite_baseline.py);
    it prints one JSON document last."""
    here = Path(__file__).parent
    done = subprocess.run(
        [sys.executable, *args], check=False, cwd=here, capture_output=True, text=True, timeout=timeout_s, env=quiet_env()
    )
    if done.returncode != 0:
        raise RuntimeError(f"client {args[:2]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
