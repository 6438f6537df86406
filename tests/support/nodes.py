"""Nodes as real processes: ``rmqstore writer serve``, ``query serve`` and ``console``,
each on 127.0.0.1 port 0, its first stdout line (the serving line) read for its port, its
stderr kept in a file of the test's own, and stopped (SIGTERM, its stopped line and exit
code 0 checked) or killed in teardown.

Every process runs with tracing off (quiet_env: no traffic beyond 127.0.0.1) unless the
test gives its own environment; every wait is bounded."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from rmqstore.v1 import messages_pb2, query_pb2_grpc, writer_pb2, writer_pb2_grpc
from support.cli import quiet_env, rmqstore
from support.wait import wait_until

SERVING_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
STDERR_TAIL_CHARS = 4000
STREAM_TIMEOUT_S = 90.0


class NodeFailed(AssertionError):
    """A node process did not start, stop or answer as it must; its stderr is in the message."""


def rss_bytes(pid: int) -> int:
    """A running process's resident set size (``VmRSS`` of /proc/PID/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def sigterm_caught(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (/proc/PID/status SigCgt)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            caught = next(int(line.split()[1], 16) for line in handle if line.startswith("SigCgt:"))
    except (FileNotFoundError, ProcessLookupError):
        return False
    return bool(caught & (1 << (signal.SIGTERM - 1)))


class ProcessNode:
    """``rmqstore <command…>`` as a subprocess whose first stdout line is its serving line
    (writer serve, query serve, console). ``service`` is the name its serving and stopped
    lines give; ``prefix`` runs it under another command (``prlimit …  --``)."""

    def __init__(
        self,
        service: str,
        args: Sequence[str],
        stderr_path: Path,
        *,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        python: str = sys.executable,
        popen_options: dict[str, Any] | None = None,
    ):
        self.service = service
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")
        try:
            self.proc = subprocess.Popen(
                [*prefix, *rmqstore(*args, python=python)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=quiet_env() if env is None else env,
                **(popen_options or {}),
            )
        except BaseException:
            self._stderr.close()
            raise
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_stdout, name=f"{stderr_path.stem}-stdout", daemon=True)
        self._reader.start()
        self.serving: dict[str, Any] = {}

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def stderr_text(self) -> str:
        """The end of what the process wrote to stderr so far."""
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-STDERR_TAIL_CHARS:]

    def next_line(self, timeout_s: float, what: str) -> bytes | None:
        """The process's next stdout line (None once it closed stdout), within ``timeout_s``."""
        try:
            return self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise NodeFailed(f"{self.service} printed no {what} line within {timeout_s} s; stderr:\n{self.stderr_text()}") from None

    def wait_serving(self, timeout_s: float = SERVING_TIMEOUT_S) -> dict[str, Any]:
        """Its serving line, parsed; fails with its stderr if it exits or stays silent."""
        line = self.next_line(timeout_s, "serving")
        if line is None:
            code = self.proc.wait(timeout=STOP_TIMEOUT_S)
            raise NodeFailed(f"{self.service} exited (code {code}) before serving; stderr:\n{self.stderr_text()}")
        event = json.loads(line)
        assert event["event"] == "serving" and event["service"] == self.service, event
        assert isinstance(event["port"], int) and event["port"] > 0, event
        self.serving = event
        return event

    @property
    def port(self) -> int:
        return int(self.serving["port"])

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The console's address."""
        return f"http://{self.endpoint}"

    def wait_until_sigterm_is_caught(self) -> None:
        """A node prints its serving line before it installs its SIGTERM handler, so a
        SIGTERM sent at once could end it uncleanly: wait, bounded, until it is caught."""

        def caught() -> bool:
            if self.proc.poll() is not None:
                raise NodeFailed(f"{self.service} exited (code {self.proc.returncode}); stderr:\n{self.stderr_text()}")
            return sigterm_caught(self.proc.pid)

        wait_until(caught, STOP_TIMEOUT_S, f"{self.service} to catch SIGTERM", interval_s=0.002)

    def stop(self) -> None:
        """SIGTERM: a clean stop that says so (its stopped line), exit code 0."""
        self.wait_until_sigterm_is_caught()
        self.proc.send_signal(signal.SIGTERM)
        self.wait_stopped()

    def wait_stopped(self) -> None:
        """The rest of a clean stop already asked for: the stopped line, then exit code 0."""
        while True:
            line = self.next_line(STOP_TIMEOUT_S, "stopped")
            assert line is not None, f"{self.service} exited without its stopped line; stderr:\n{self.stderr_text()}"
            if json.loads(line).get("event") == "stopped":
                break
        assert json.loads(line) == {"event": "stopped", "service": self.service}, line
        code = self.proc.wait(timeout=STOP_TIMEOUT_S)
        assert code == 0, f"{self.service} exit code {code}; stderr:\n{self.stderr_text()}"
        self.cleanup()

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.proc.send_signal(signal.SIGKILL)
        code = self.proc.wait(timeout=STOP_TIMEOUT_S)
        assert code == -signal.SIGKILL, f"{self.service} exit code {code}; stderr:\n{self.stderr_text()}"
        self.cleanup()

    def cleanup(self) -> None:
        """Teardown: kill it if it still runs, and close every handle."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._reader.join(timeout=STOP_TIMEOUT_S)
        assert not self._reader.is_alive(), f"{self.service}'s stdout stayed open after it exited"
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        if not self._stderr.closed:
            self._stderr.close()


class Nodes:
    """The node processes of one test (the ``nodes`` fixture), their stderr in
    ``log_dir``; every one still running is killed, and every channel closed, by close()."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[ProcessNode] = []
        self.channels: list[grpc.Channel] = []

    def spawn(self, service: str, args: Sequence[str], **options: Any) -> ProcessNode:
        """A node process, not yet waited for (its serving line is the test's to read)."""
        node = ProcessNode(service, args, self.log_dir / f"{service}-{len(self.started)}.stderr", **options)
        self.started.append(node)
        return node

    def start(self, kind: str, store: Path, *extra: str, **options: Any) -> ProcessNode:
        """``rmqstore <kind> serve --store STORE`` on 127.0.0.1 port 0, once serving."""
        node = self.spawn(kind, [kind, "serve", "--store", str(store), "--host", "127.0.0.1", "--port", "0", *extra], **options)
        node.wait_serving()
        return node

    def console(self, *args: str, **options: Any) -> ProcessNode:
        """``rmqstore console`` on 127.0.0.1 port 0, once serving."""
        node = self.spawn("console", ["console", "--port", "0", *args], **options)
        node.wait_serving()
        return node

    def channel(self, node: ProcessNode) -> grpc.Channel:
        channel = grpc.insecure_channel(node.endpoint)
        self.channels.append(channel)
        return channel

    def query(self, node: ProcessNode) -> query_pb2_grpc.QueryServiceStub:
        return query_pb2_grpc.QueryServiceStub(self.channel(node))

    def writer(self, node: ProcessNode) -> writer_pb2_grpc.WriterServiceStub:
        return writer_pb2_grpc.WriterServiceStub(self.channel(node))

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        for node in self.started:
            node.cleanup()


def send_all(stub: writer_pb2_grpc.WriterServiceStub, messages: list[messages_pb2.Message], batch: int = 20) -> list[messages_pb2.SendResult]:
    def batches() -> Iterator[writer_pb2.SendBatchRequest]:
        for start in range(0, len(messages), batch):
            yield writer_pb2.SendBatchRequest(messages=messages[start : start + batch])

    results = [r for response in stub.SendStream(batches(), timeout=STREAM_TIMEOUT_S) for r in response.results]
    assert len(results) == len(messages)
    return results
