"""The ``rmqstore`` command as the tests run it: as a process (its environment without
OpenTelemetry settings, so nothing leaves 127.0.0.1) or in this process (``main``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rmqstore.cli.main import main

CLI_TIMEOUT_S = 60.0


def rmqstore(*args: str, python: str = sys.executable) -> list[str]:
    """The command line running ``rmqstore args`` with ``python``."""
    return [python, "-m", "rmqstore.cli.main", *args]


def quiet_env(**extra: str) -> dict[str, str]:
    """This process's environment without any OpenTelemetry setting and with the SDK off
    (no exporter: no traffic beyond 127.0.0.1), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_SDK_DISABLED"] = "true"
    env.update(extra)
    return env


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.stdout.splitlines()]


def run_cli(args: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = CLI_TIMEOUT_S) -> CliRun:
    """``rmqstore args`` as a process: its exit code, stdout and stderr."""
    done = subprocess.run(
        rmqstore(*args), capture_output=True, text=True, timeout=timeout_s, check=False,
        env=quiet_env() if env is None else env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return CliRun(done.returncode, done.stdout, done.stderr)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``rmqstore argv`` in this process: its exit code, stdout and stderr."""
    try:
        code = main(list(argv))
    except SystemExit as exit:
        code = int(exit.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


DEMO_START_TIMEOUT_S = 300.0
DEMO_STOP_TIMEOUT_S = 120.0


@dataclass
class ConsoleDemo:
    """``rmqstore demo --console`` running: what it printed up to its ``console: `` line."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    @property
    def console_line(self) -> str:
        return self.lines[-1]

    @property
    def writer_endpoint(self) -> str:
        return next(line for line in self.lines if line.startswith("writer serving on ")).split()[3].rstrip(",")

    def interrupt(self) -> str:
        """Ctrl-C: the demo must exit 0; the rest of its stdout."""
        self.process.send_signal(signal.SIGINT)
        rest, errors = self.process.communicate(timeout=DEMO_STOP_TIMEOUT_S)
        assert self.process.returncode == 0, errors[-2000:]
        return rest


@contextmanager
def console_demo(store: Path, cwd: Path) -> Iterator[ConsoleDemo]:
    """``rmqstore demo --store STORE --console`` as a process, once it shows the console;
    killed on the way out unless the test stopped it (ConsoleDemo.interrupt)."""
    demo = ConsoleDemo(subprocess.Popen(
        rmqstore("demo", "--store", str(store), "--console"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True, cwd=cwd, env=quiet_env(),
    ))  # fmt: skip
    try:
        assert demo.process.stdout is not None
        deadline = time.monotonic() + DEMO_START_TIMEOUT_S
        while not demo.lines or not demo.lines[-1].startswith("console: "):
            assert time.monotonic() < deadline, f"the demo showed no console within {DEMO_START_TIMEOUT_S} s"
            line = demo.process.stdout.readline()
            if not line:
                errors = demo.process.stderr.read() if demo.process.stderr else ""
                raise AssertionError(f"the demo ended before it showed the console: {errors[-2000:]}")
            demo.lines.append(line)
        yield demo
    finally:
        if demo.process.poll() is None:
            demo.process.kill()
            demo.process.communicate(timeout=30)
