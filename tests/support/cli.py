"""The ``rmqstore`` command as the tests run it: as a process (its environment without
OpenTelemetry settings, so nothing leaves 127.0.0.1) or in this process (``main``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
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
