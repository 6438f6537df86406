"""A real etcd v3 (Debian's etcd-server) on 127.0.0.1, free ports, its data in the test's
directory: a writer group's election (tests/test_replication.py)."""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from rmqstore.service.listen import free_port
from support.wait import wait_until

START_TIMEOUT_S = 30.0


class Etcd:
    """One etcd member, started at once and killed by :meth:`close`."""

    def __init__(self, root: Path):
        binary = shutil.which("etcd")
        if binary is None:
            raise AssertionError("etcd is not installed: test.sh installs Debian's etcd-server")
        self.client_port = free_port("127.0.0.1")
        peer_port = free_port("127.0.0.1")
        client_url, peer_url = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{peer_port}"
        self._log = open(root / "etcd.log", "wb")
        self.proc = subprocess.Popen(
            [
                binary, "--name", "test", "--data-dir", str(root / "etcd-data"),
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"test={peer_url}", "--log-level", "warn",
            ],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
        )  # fmt: skip
        wait_until(self._healthy, START_TIMEOUT_S, "etcd to serve")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"etcd exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as answer:
                return b'"true"' in answer.read()
        except (urllib.error.URLError, OSError):
            return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._log.close()
