"""``rmqstore demo``: the main job — a writer and a query node on a local store, sample
messages, and each kind of lookup, as a user would run them."""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any

from rmqstore.cli import exits
from rmqstore.common.errors import InvalidArgument
from rmqstore.service.stopping import stop_requested, wait_for_stop

START_TIMEOUT_S = 60.0
# The demo recreates its store on every run; it deletes a directory only when this file of
# its own says a previous demo made it, so that a mistyped --store never costs a user data.
DEMO_MARKER = ".rmqstore-demo"
STOP_TIMEOUT_S = 30.0
# The demo's store on small files: every file is allocated at its full size, and RocketMQ's
# defaults (a 1 GiB commit log file, 420 MB index files: README, Sizes) would take 1.4 GB of
# disk for seven messages. The writer records the sizes; the query node and check read them.
DEMO_SIZE_ARGS = (
    "--commitlog-file-size", str(1 << 20), "--cq-file-units", "1000", "--index-slots", "1000", "--index-entries", "4000",
)  # fmt: skip


def _rmqstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "rmqstore.cli.main", *args]


class Node:
    """A node process whose first stdout line says it serves."""

    def __init__(self, name: str, args: list[str]):
        self.name = name
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=lambda: lines.put(self.process.stdout.readline()), daemon=True).start()  # type: ignore[union-attr]
        try:
            first = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            self.stop()
            raise RuntimeError(f"the {name} did not start within {START_TIMEOUT_S:.0f} s") from None
        if not first:
            self.process.wait(timeout=STOP_TIMEOUT_S)
            raise RuntimeError(f"the {name} exited with status {self.process.returncode}")
        self.serving: dict[str, Any] = json.loads(first)
        self.endpoint = f"127.0.0.1:{self.serving['port']}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _show(title: str, *args: str) -> str:
    print(f"\n$ rmqstore {shlex.join(args)}    # {title}", flush=True)
    done = subprocess.run(_rmqstore(*args), capture_output=True, text=True, timeout=120)
    sys.stdout.write(done.stdout)
    if done.stderr:
        sys.stdout.write(done.stderr)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"rmqstore {shlex.join(args)} failed with status {done.returncode}")
    return done.stdout


SAMPLES: list[dict[str, Any]] = [
    {"topic": "Orders", "body": "order 42 created", "keys": ["order-42", "customer-7"], "tags": "created", "queueId": 0},
    {"topic": "Orders", "body": "order 43 created", "keys": ["order-43", "customer-7"], "tags": "created", "queueId": 1},
    {"topic": "Orders", "body": "order 42 paid", "keys": ["order-42", "customer-7"], "tags": "paid", "queueId": 0},
    {"topic": "Orders", "body": "order 44 created", "keys": ["order-44", "customer-9"], "tags": "created", "queueId": 2},
    {"topic": "Orders", "body": "order 42 shipped", "keys": ["order-42"], "tags": "shipped", "queueId": 0},
    {"topic": "Payments", "body": "payment for 42", "keys": ["pay-1", "order-42"], "tags": "card", "uniqKey": "PAYMENT0001"},
    {"topic": "Payments", "body": "paiement : 43 €", "keys": ["pay-2", "订单-43"], "tags": "sepa"},
]


def prepare_store(store: str) -> None:
    """Empty ``store`` for a new demo run, or refuse: only a missing or empty directory, or
    one a previous demo marked as its own and no process holds the lock of (an earlier
    demo still running), is (re)created."""
    from rmqstore.common.files.lockfile import LOCK_FILE, holding_store_lock

    if os.path.lexists(store):
        if not os.path.isdir(store) or os.path.islink(store):
            raise InvalidArgument(f"--store {store} exists and is not a directory; give a new or empty directory")
        if os.listdir(store):
            if not os.path.isfile(os.path.join(store, DEMO_MARKER)):
                raise InvalidArgument(
                    f"--store {store} is not empty and is not a demo store (no {DEMO_MARKER} file); "
                    "nothing was deleted: give a new or empty directory"
                )
            # Held while deleting: a writer starting meanwhile is refused. The lock file
            # goes last, still held.
            with holding_store_lock(store, "--store", create=True, refused="nothing was deleted"):
                for entry in os.scandir(store):
                    if entry.name == LOCK_FILE:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
                os.unlink(os.path.join(store, LOCK_FILE))
    os.makedirs(store, exist_ok=True)
    with open(os.path.join(store, DEMO_MARKER), "w", encoding="utf-8") as handle:
        handle.write("made by rmqstore demo; the next demo run on this directory deletes it\n")


def cmd_demo(args: argparse.Namespace) -> int:
    store = os.path.abspath(args.store)
    prepare_store(store)
    print(f"store directory: {store}")
    # --init: the store directory holds the demo's marker file, and no store yet.
    writer = Node("writer", _rmqstore("writer", "serve", "--store", store, "--init", "--port", "0", "--flush", "sync", *DEMO_SIZE_ARGS))
    nodes = [writer]
    try:
        query = Node("query node", _rmqstore("query", "serve", "--store", store, "--port", "0"))
        nodes.append(query)
        print(f"writer serving on {writer.endpoint}, query node on {query.endpoint}")
        acks = []
        for sample in SAMPLES[:5]:
            sent = _show(
                "send one message",
                "send", "--endpoint", writer.endpoint, "-t", sample["topic"], "-k", " ".join(sample["keys"]),
                "--tags", sample["tags"], "--body", sample["body"], "-q", str(sample["queueId"]),
            )
            acks.append(json.loads(sent))
        samples = store + "-samples.jsonl"
        with open(samples, "w", encoding="utf-8") as handle:
            for sample in SAMPLES[5:]:
                handle.write(json.dumps(sample, ensure_ascii=False) + "\n")
        _show("send messages from a JSONL file", "send", "--endpoint", writer.endpoint, "--file", samples)
        os.unlink(samples)
        q = ["--endpoint", query.endpoint]
        first, paid = acks[0], acks[2]
        _show("where are order 42's messages? (newest first)", "queryMsgByKey", *q, "-t", "Orders", "-k", "order-42")
        _show("the same, as JSON, within a time range", "queryMsgByKey", *q, "-t", "Orders", "-k", "order-42",
              "--begin", str(paid["storeTimestamp"]), "--end", str(acks[4]["storeTimestamp"]), "--json")
        _show("by unique key (client message id)", "queryMsgByUniqueKey", *q, "-t", "Payments", "-i", "PAYMENT0001")
        _show("by offset message id", "queryMsgById", *q, "-i", first["offsetMsgId"])
        _show("by queue offset", "queryMsgByOffset", *q, "-t", "Orders", "-q", "0", "-o", "1", "--json")
        _show("first offset of queue 0 stored at or after the 'paid' message", "searchOffset", *q, "-t", "Orders", "-q", "0",
              "--timestamp", str(paid["storeTimestamp"]), "--boundary", "lower")
        _show("last offset stored at or before it", "searchOffset", *q, "-t", "Orders", "-q", "0",
              "--timestamp", str(paid["storeTimestamp"]), "--boundary", "upper")
        _show("queue 0 between two times", "printMsg", *q, "-t", "Orders", "-q", "0",
              "--begin", str(first["storeTimestamp"]), "--end", str(acks[4]["storeTimestamp"]), "--json")
        console = Node("console", _rmqstore("console", "--query-endpoint", query.endpoint, "--writer-endpoint", writer.endpoint,
                                            "--port", str(args.console_port)))  # fmt: skip
        nodes.append(console)
        url = console.serving["url"]
        if args.console:
            print(f"\nconsole: {url}    (Ctrl-C stops the console and both nodes)", flush=True)
            _wait_for_interrupt()
    finally:
        for node in reversed(nodes):
            node.stop()
    _show("after the nodes stopped: do commit log, queues and index agree?", "check", store)
    print(f"\nconsole: {url} (stopped with the nodes; `rmqstore demo --console` keeps it up until Ctrl-C)")
    return 0


def _wait_for_interrupt() -> None:
    """Until SIGINT or SIGTERM (as a node waits: a handler that takes no lock); the nodes, in
    the same process group, see a terminal's Ctrl-C too."""
    wait_for_stop(stop_requested())


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    demo = commands.add_parser("demo", help="run a writer and a query node on a local store and show each lookup")
    demo.add_argument("--store", default="demo-store", help="store directory: new, empty, or made by an earlier demo run (then recreated) (default ./demo-store)")
    demo.add_argument("--console", action="store_true", help="keep the web console (and the nodes) up until Ctrl-C")
    demo.add_argument("--console-port", type=exits.port, default=0, help="the console's port (default 0: any free port, printed)")
    demo.set_defaults(handler=cmd_demo)


