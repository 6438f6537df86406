"""The official RocketMQ 5 clients as the tests run them: the Python client in a
virtualenv of its own (``.venv-rmq5``, made by test.sh; ``RMQSTORE_RMQ5_VENV`` names
another) and process of its own (tests/rocketmq5/*.py), and the Node.js clients
(tests/node: test.sh installs Node.js, npm and the packages)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
DRIVERS = TESTS / "rocketmq5"
RMQ5_VENV = Path(os.environ.get("RMQSTORE_RMQ5_VENV", ROOT / ".venv-rmq5"))
# The acceptance size; RMQSTORE_RMQ5_COUNT makes a quicker run (.ci/run: 2,000; a release
# runs the acceptance size).
PYTHON_CLIENT_MESSAGES = int(os.environ.get("RMQSTORE_RMQ5_COUNT", "10000"))
CLIENT_TIMEOUT_S = 600.0


def rmq5_python() -> str:
    python = RMQ5_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"the official Python client's virtualenv {RMQ5_VENV} is missing: test.sh makes it")
    return str(python)


def client_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(home)  # the client writes its log under ~/logs
    return env


def run_python_client(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    home = tmp_path / "client-home"
    home.mkdir(exist_ok=True)
    done = subprocess.run(
        [rmq5_python(), str(DRIVERS / "python_producer.py"), *args],
        capture_output=True,
        timeout=CLIENT_TIMEOUT_S,
        env=client_env(home),
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, f"client failed: {done.stderr.decode(errors='replace')[-3000:]}"
    return [json.loads(line) for line in done.stdout.splitlines()]


# Node.js: the official client and a client of our own contracts, from tests/node.

NODE_DIR = TESTS / "node"
NODE_CLIENT_MESSAGES = 1000


def node_command() -> list[str]:
    if not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir():
        pytest.fail(f"{NODE_DIR}/node_modules is missing: test.sh installs it (npm ci)")
    return ["node"]


def run_node(tmp_path: Path, script: str, *args: str) -> bytes:
    home = tmp_path / "node-home"
    home.mkdir(exist_ok=True)
    done = subprocess.run(
        [*node_command(), str(NODE_DIR / script), *args],
        capture_output=True, timeout=CLIENT_TIMEOUT_S, env=client_env(home), cwd=NODE_DIR, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{script} failed: {done.stderr.decode(errors='replace')[-3000:]}"
    return done.stdout


def make_topics(endpoint: str, topics: dict[str, str], queue_count: int = 4, ca: str | None = None) -> None:
    """Create ``topics`` (name: message type) through the writer at ``endpoint`` (TLS when
    ``ca`` is given), as ``rmqstore updateTopic -t NAME -w 4 -a +message.type=TYPE`` does:
    the RocketMQ 5 gateway answers a route query for an unknown topic NotFound, as
    Apache's proxy does."""
    from rmqstore.client.channels import open_channel
    from rmqstore.v1 import writer_pb2, writer_pb2_grpc

    with open_channel(endpoint, ca=ca) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        for name, message_type in topics.items():
            request = writer_pb2.CreateTopicRequest(name=name, queue_count=queue_count, message_type=message_type)
            stub.CreateTopic(request, timeout=30)
