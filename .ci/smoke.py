"""The installed ``rmqstore`` command, end to end, as a plain install runs it.

On a new store in a temporary directory, on 127.0.0.1 at ports the kernel picks:
a writer and a query node with an ACL (so the nodes read YAML and the CLI signs); one
message with a binary body sent with ``rmqstore send``; found with ``rmqstore
queryMsgByKey --endpoint`` and compared with the ack field by field and with the body
byte for byte; the web console on the query node serving the same bytes; an unsigned
lookup refused; every process stopped with SIGTERM; ``rmqstore check`` on the store; and,
where the ``pipeline`` extra is not installed, a pipeline job refused in one line naming it.
Any difference ends the run with exit 1, saying what was expected and what came, after
the processes' stderr.

Only the standard library: it runs with the interpreter of the virtualenv under test
(.ci/smoke after `pip install .`, and the Dockerfile's build stage).

Usage: python .ci/smoke.py PATH/TO/rmqstore
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # exec to serving line: imports and an empty store's recovery
LOOKUP_TIMEOUT_S = 30.0  # the query node follows the writer's dispatch (docs/query.md)
STOP_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 60.0
TOPIC = "smoke-orders"
KEYS = "smoke-key-1 smoke-key-2"
TAGS = "TagA"
# Every byte value, so that the body cannot pass through a text path unchanged.
BODY = bytes(range(256)) + "smoke: é ✓".encode()
ACL = """\
users:
  - accessKey: producer
    secretKey: producer-secret
  - accessKey: reader
    secretKey: reader-secret
acls:
  - subject: User:producer
    policies:
      - resource: ["Topic:smoke-*"]
        actions: [Pub]
        decision: Allow
  - subject: User:reader
    policies:
      - resource: ["Topic:smoke-*"]
        actions: [Sub]
        decision: Allow
"""
PRODUCER = ["--access-key", "producer", "--secret-key", "producer-secret"]
READER = ["--access-key", "reader", "--secret-key", "reader-secret"]
# A small store: its files get their disk blocks when created, and RocketMQ's default
# sizes would take 1.4 GB.
SIZES = ["--commitlog-file-size", "1048576", "--cq-file-units", "1000", "--index-slots", "1000", "--index-entries", "4000"]


class SmokeFailed(Exception):
    pass


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise SmokeFailed(what)


class Process:
    """One serving ``rmqstore`` process: its serving line (its first line on stdout), its
    stderr in a file."""

    def __init__(self, role: str, command: list[str], workdir: Path) -> None:
        self.role = role
        self.stderr_path = workdir / f"{role}.stderr"
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr)
        self.serving: dict[str, Any] = {}

    def wait_serving(self) -> None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        line = b""
        while b"\n" not in line:
            left_s = deadline - time.monotonic()
            expect(left_s > 0, f"{self.role}: no serving line within {START_TIMEOUT_S:.0f} s")
            ready, _, _ = select.select([self.process.stdout], [], [], left_s)
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 4096)
                if not chunk:
                    raise SmokeFailed(f"{self.role}: exited with {self.process.wait()} before serving")
                line += chunk
        self.serving = json.loads(line.split(b"\n", 1)[0])
        expect(self.serving.get("event") == "serving", f"{self.role}: the first line is not a serving line: {self.serving}")
        expect(self.serving.get("service") == self.role, f"{self.role}: the serving line names {self.serving.get('service')!r}")

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.serving['port']}"

    def stop(self) -> int | None:
        """SIGTERM, then the exit code (None: it did not stop in time and was killed)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                return None
        return self.process.returncode

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def run(rmqstore: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([rmqstore, *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)


def succeeded(result: subprocess.CompletedProcess[str]) -> str:
    expect(result.returncode == 0, f"`rmqstore {' '.join(result.args[1:])}` exited {result.returncode}: {result.stderr.strip()}")
    return str(result.stdout)


def lookup(rmqstore: str, query: Process) -> list[dict[str, Any]]:
    """queryMsgByKey through the query node, until it has the message (exit 3: not yet)."""
    deadline = time.monotonic() + LOOKUP_TIMEOUT_S
    while True:
        found = run(rmqstore, "queryMsgByKey", "--endpoint", query.endpoint, "-t", TOPIC, "-k", "smoke-key-2", "--json", "--body", *READER)
        if found.returncode == 0:
            return [json.loads(line) for line in found.stdout.splitlines() if line]
        expect(found.returncode == 3, f"queryMsgByKey exited {found.returncode}: {found.stderr.strip()}")
        expect(time.monotonic() < deadline, f"queryMsgByKey: the message is not found after {LOOKUP_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def check_found(message: dict[str, Any], ack: dict[str, Any]) -> None:
    for field in ("topic", "queueId", "queueOffset", "commitLogOffset", "uniqKey", "storeTimestamp"):
        expect(message[field] == ack[field], f"queryMsgByKey: {field} is {message[field]!r}, the ack said {ack[field]!r}")
    expect(message["msgId"] == ack["offsetMsgId"], f"queryMsgByKey: msgId {message['msgId']}, the ack said {ack['offsetMsgId']}")
    expect(message["keys"] == KEYS, f"queryMsgByKey: keys {message['keys']!r}, sent {KEYS!r}")
    expect(message["tags"] == TAGS, f"queryMsgByKey: tags {message['tags']!r}, sent {TAGS!r}")
    body = base64.b64decode(message["bodyBase64"])
    expect(body == BODY, f"queryMsgByKey: the body is not the {len(BODY)} bytes sent: {body!r}")
    expect(message["bodyLen"] == len(BODY), f"queryMsgByKey: bodyLen {message['bodyLen']}, sent {len(BODY)}")
    expect(message["bodySha256"] == hashlib.sha256(BODY).hexdigest(), "queryMsgByKey: bodySha256 is not the body's")


def http_get(console: Process, path: str) -> bytes:
    try:
        with urllib.request.urlopen(f"http://{console.endpoint}{path}", timeout=COMMAND_TIMEOUT_S) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as error:
        raise SmokeFailed(f"console: GET {path}: HTTP {error.code}: {error.read()[:500]!r}") from None


def check_pipeline_without_extra(rmqstore: str, store: Path) -> None:
    if importlib.util.find_spec("pyspark") is not None:
        return  # this virtualenv has the extra: a job would start Spark
    job = run(rmqstore, "pipeline", "stats", str(store))
    expect(job.returncode == 2 and "rmqstore[pipeline]" in job.stderr, f"pipeline stats without the extra: exit {job.returncode}: {job.stderr.strip()}")
    expect("Traceback" not in job.stderr, f"pipeline stats without the extra: a traceback: {job.stderr.strip()}")


def smoke(rmqstore: str, workdir: Path) -> None:
    store = workdir / "store"
    acl = workdir / "acl.yaml"
    acl.write_text(ACL)
    acl.chmod(0o600)
    body_file = workdir / "body.bin"
    body_file.write_bytes(BODY)
    processes: list[Process] = []

    def start(role: str, *args: str) -> Process:
        processes.append(Process(role, [rmqstore, *args, "--host", HOST, "--port", "0"], workdir))
        processes[-1].wait_serving()
        return processes[-1]

    try:
        writer = start("writer", "writer", "serve", "--store", str(store), "--acl", str(acl), *SIZES)
        query = start("query", "query", "serve", "--store", str(store), "--acl", str(acl), *SIZES)
        for node in (writer, query):
            expect(node.serving.get("acl") is True, f"{node.role}: the serving line does not say the ACL is on: {node.serving}")

        sent = run(rmqstore, "send", "--endpoint", writer.endpoint, "-t", TOPIC, "-k", KEYS, "--tags", TAGS, "--body-file", str(body_file), *PRODUCER)
        ack = json.loads(succeeded(sent))
        found = lookup(rmqstore, query)
        expect(len(found) == 1, f"queryMsgByKey: {len(found)} messages, expected 1: {found}")
        check_found(found[0], ack)

        console = start("console", "console", "--query-endpoint", query.endpoint, "--writer-endpoint", writer.endpoint, *READER)
        at = f"topic={TOPIC}&queue={ack['queueId']}&offset={ack['queueOffset']}"
        expect(http_get(console, f"/message/body?{at}") == BODY, "console: /message/body is not the body sent")
        page = http_get(console, f"/message?{at}").decode()
        expect(KEYS in page and ack["uniqKey"] in page, "console: the message's page shows neither its keys nor its uniqKey")

        unsigned = run(rmqstore, "queryMsgByKey", "--endpoint", query.endpoint, "-t", TOPIC, "-k", "smoke-key-2")
        expect(unsigned.returncode not in (0, 3), f"an unsigned lookup was answered (exit {unsigned.returncode}): no ACL")
        expect("UNAUTHENTICATED" in unsigned.stderr, f"an unsigned lookup failed, but not as unsigned: {unsigned.stderr.strip()}")

        for process in reversed(processes):
            code = process.stop()
            expect(code == 0, f"{process.role}: exit {code} after SIGTERM, expected 0 (a clean stop)")
        succeeded(run(rmqstore, "check", "--store", str(store), *SIZES))
        check_pipeline_without_extra(rmqstore, store)
    except BaseException:
        for process in reversed(processes):
            process.stop()
            print(f"--- {process.role} stderr ---\n{process.stderr()}", file=sys.stderr)
        raise


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} PATH/TO/rmqstore", file=sys.stderr)
        return 2
    # Stopped from outside (.ci/run ending early): stop the processes started, as on a failure.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with tempfile.TemporaryDirectory(prefix="rmqstore-smoke-") as workdir:
        try:
            smoke(argv[1], Path(workdir))
        except SmokeFailed as failure:
            print(f"smoke: FAILED: {failure}", file=sys.stderr)
            return 1
    print("smoke: a writer, a query node and the console served; the message sent was found, byte for byte")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
