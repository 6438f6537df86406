"""The command line an operator trusts: one error line and a code from the exit table for
every failure, the same through a node and on a directory; mqadmin's commands; the
geometry file; ``send``'s flags. A real writer and query node serve the module's store."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from conftest import CLEAN, FIXTURE_SIZE_ARGS
from support.cli import rmqstore, run
from support.nodes import Nodes, ProcessNode
from support.pki import make_pki
from support.stores import copy_live_store

from rmqstore.cli.main import build_parser, main
from rmqstore.common.codec import index as ix
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.geometry import FILE_NAME as GEOMETRY_FILE
from rmqstore.common.files.geometry import (
    Geometry,
    infer_index_geometry,
    record_geometry,
)

# Sizes unlike RocketMQ's defaults and, for the index, unlike its 1:4 ratio: only the
# writer's geometry file can tell them to a tool.
SIZE_ARGS = ["--commitlog-file-size", "65536", "--cq-file-units", "50", "--index-slots", "64", "--index-entries", "200"]
TOPIC = "Orders"
MESSAGES = [
    {"topic": TOPIC, "body": f"order {n}", "keys": [f"order-{n}", "shared"], "tags": "created", "queueId": n % 2}
    for n in range(6)
]


@dataclass
class Cluster:
    store: Path
    writer: ProcessNode
    query: ProcessNode
    acks: list[dict[str, object]]

    def where(self) -> dict[str, list[str]]:
        """The two places a lookup runs: a node, and the directory (no size flags: the
        writer's geometry file gives them)."""
        return {"endpoint": ["--endpoint", self.query.endpoint], "store": ["--store", str(self.store)]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cli")
    store = root / "store"
    (root / "logs").mkdir()
    nodes = Nodes(root / "logs")
    try:
        writer = nodes.start("writer", store, "--flush", "sync", *SIZE_ARGS)
        lines = root / "messages.jsonl"
        lines.write_text("".join(json.dumps(m) + "\n" for m in MESSAGES), encoding="utf-8")
        done = subprocess.run(
            rmqstore("send", "--endpoint", writer.endpoint, "--file", str(lines)), capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        acks = [json.loads(line) for line in done.stdout.splitlines()]
        # The query node is given no size flags either.
        query = nodes.start("query", store)
        yield Cluster(store, writer, query, acks)
        query.stop()
        writer.stop()
    finally:
        nodes.close()


# The exit table, one test per row, each the same through a node and on the directory.


def both(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    results = {place: run(capsys, *argv, *args) for place, args in cluster.where().items()}
    assert results["endpoint"] == results["store"], argv
    return results["endpoint"]


def test_exit_0_success(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = both(cluster, capsys, "queryMsgByOffset", "-t", TOPIC, "-i", "1", "-o", "0", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["msgId"] == cluster.acks[1]["offsetMsgId"]


def test_exit_1_the_data_disagrees(clean_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (clean_copy / "index" / "20261122030252879").unlink()
    code, out, err = run(capsys, "check", str(clean_copy), *FIXTURE_SIZE_ARGS)
    assert code == 1 and err == ""
    assert out.splitlines()[0].startswith("FAIL: ")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["queryMsgByKey", "-t", TOPIC], "queryMsgByKey: the following arguments are required: -k/--key (see rmqstore queryMsgByKey --help)"),
        (["queryMsgByOffset", "-t", TOPIC, "-i", "0", "-o", "99999999999999999999"],
         ("queryMsgByOffset: argument -o/--offset: 99999999999999999999 is outside [0, 9223372036854775807] (an offset) "
          "(see rmqstore queryMsgByOffset --help)")),
        (["queryMsgByKey", "-t", "no topic", "-k", "k"], "INVALID_ARGUMENT: the topic 'no topic' contains characters outside [%|a-zA-Z0-9_-]"),
    ],
    ids=["missing-flag", "number-out-of-range", "bad-topic"],
)
def test_exit_2_usage(cluster: Cluster, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = both(cluster, capsys, *argv)
    assert (code, out, err) == (2, "", f"rmqstore: error: {message}\n")


@pytest.mark.parametrize("place", ["positional", "flag"])
def test_exit_2_missing_or_unreadable_store(tmp_path: Path, capsys: pytest.CaptureFixture[str], place: str) -> None:
    missing, a_file = tmp_path / "nowhere", tmp_path / "f"
    a_file.write_text("x")
    for command in (["check"], ["inspect"], ["dump", "commitlog"], ["dump", "consumequeue"], ["reindex", "--out", str(tmp_path / "o")]):
        for path, why in ((missing, "no such directory"), (a_file, "not a directory")):
            where = [str(path)] if place == "positional" else ["--store", str(path)]
            option = "store directory" if place == "positional" else "--store"
            assert run(capsys, *command, *where) == (2, "", f"rmqstore: error: {option} {path}: {why}\n"), command
    for lookup in (["queryMsgByKey", "-t", "T", "-k", "k"], ["topicList"]):
        assert run(capsys, *lookup, "--store", str(a_file)) == (2, "", f"rmqstore: error: --store {a_file}: not a directory\n")
    assert not (tmp_path / "o").exists()


def test_exit_2_wrong_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    queue_file = CLEAN / "consumequeue" / "OrderTopic" / "0" / "00000000000000000000"
    assert run(capsys, "check", str(CLEAN), *FIXTURE_SIZE_ARGS, "--cq-file-units", "100") == (
        2,
        "",
        f"rmqstore: error: consume queue file {queue_file} is 4000 bytes, but 100 units make 2000; pass the store's --cq-file-units\n",
    )
    index_file = CLEAN / "index" / "20261122030251622"
    for command in (["check"], ["inspect"], ["reindex", "--out", "/nonexistent/out"]):
        assert run(capsys, *command, str(CLEAN)) == (
            2,
            "",
            (
                f"rmqstore: error: index file {index_file} is 32040 bytes, but 5000000 slots and 20000000 entries make "
                "420000040; pass the store's --index-slots and --index-entries\n"
            ),
        )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["queryMsgByKey", "-t", "Nope", "-k", "shared"], "topic Nope does not exist in this store"),
        (["queryMsgByUniqueKey", "-t", "Nope", "-i", "ABC"], "topic Nope does not exist in this store"),
        (["topicStatus", "-t", "Nope"], "topic Nope does not exist in this store"),
        (["printMsg", "-t", "Nope"], "topic Nope does not exist in this store"),
        (["queryMsgByOffset", "-t", "Nope", "-i", "0", "-o", "0"], "NOT_FOUND: topic Nope does not exist in this store"),
        (["queryMsgByOffset", "-t", TOPIC, "-i", "9", "-o", "0"], f"NOT_FOUND: topic {TOPIC} has no queue 9 in this store"),
        (["queryMsgByOffset", "-t", TOPIC, "-i", "0", "-o", "99"], f"OUT_OF_RANGE: queue offset 99 of {TOPIC}/0 is outside [0, 3)"),
        (["searchOffset", "-t", TOPIC, "-q", "7", "--timestamp", "0"], f"NOT_FOUND: topic {TOPIC} has no queue 7 in this store"),
    ],
    ids=["key-topic", "uniq-topic", "status-topic", "print-topic", "offset-topic", "queue", "offset", "search-queue"],
)
def test_exit_3_not_found(cluster: Cluster, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert both(cluster, capsys, *argv) == (3, "", f"rmqstore: error: {message}\n")


def test_exit_3_unknown_ids(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    uniq = "7F000001000000000000000000000000"
    assert both(cluster, capsys, "queryMsgByUniqueKey", "-t", TOPIC, "-i", uniq) == (
        3, "", f"rmqstore: error: NOT_FOUND: no message with unique key {uniq} in topic {TOPIC}\n"
    )
    code, out, err = both(cluster, capsys, "queryMsgById", "-i", str(cluster.acks[0]["offsetMsgId"])[:-4] + "FFFF")
    assert (code, out) == (3, "") and err.startswith("rmqstore: error: NOT_FOUND: no message with msgId ") and err.count("\n") == 1


def test_exit_4_a_stop_that_stalls_ends_with_every_threads_stack() -> None:
    """The watchdog a node arms when told to stop: a stop still running when it fires
    (here a thread that never returns) ends the process with exit 4, after one log line
    and the stack of every thread, the stalled one included."""
    program = (
        "import threading, time\n"
        "from rmqstore.service.logs import configure_logging\n"
        "from rmqstore.service.stopping import stop_watchdog\n"
        "configure_logging('rmqstore-writer')\n"
        "def a_close_that_never_returns():\n"
        "    threading.Event().wait()\n"
        "stop_watchdog('writer', 0.5)\n"
        "a_close_that_never_returns()\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 4 and time.monotonic() - started < 30
    [said] = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert said["message"] == "the writer did not stop within 0.5 s of being told to: every thread's stack follows; exiting with 4"
    assert said["level"] == "ERROR" and said["logger"] == "rmqstore.stop"
    assert 'line 6 in a_close_that_never_returns' in done.stderr and "Current thread" in done.stderr
    assert done.stdout == ""


def test_a_stop_signal_ends_the_wait_and_its_handler_takes_no_lock() -> None:
    """SIGTERM, sent from another thread (the kernel hands it to any thread), ends the
    main thread's wait; its handler, run in the main thread, returns even twice over
    (SIGINT after SIGTERM). The handler takes no lock: setting a threading.Event
    there hung a node whose signal came while the main thread held the event's lock
    inside its wait (benchmarks/CI.md, "Ninth round")."""
    program = (
        "import os, signal, threading, time\n"
        "from rmqstore.service.stopping import stop_requested, wait_for_stop\n"
        "stopping = stop_requested()\n"
        "threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
        "started = time.monotonic()\n"
        "wait_for_stop(stopping)\n"
        "print(round(time.monotonic() - started, 3))\n"
        "signal.raise_signal(signal.SIGINT)\n"
        "again = stop_requested()\n"
        "again.request()\n"
        "again.request()\n"
        "wait_for_stop(again)\n"
        "print('done')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    waited_s, said = done.stdout.split()
    assert 0.25 <= float(waited_s) < 5 and said == "done"


def test_an_empty_answer_in_a_known_topic_is_success(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = both(cluster, capsys, "queryMsgByKey", "-t", TOPIC, "-k", "no-such-key")
    assert (code, err) == (0, "") and out.split() == ["#Message", "ID", "#QID", "#Offset"]


# Every command with a representative bad input: one line, a code from the table, no traceback.

BAD_INPUTS: dict[str, list[str]] = {
    "dump commitlog": ["dump", "commitlog", "{missing}"],
    "dump consumequeue": ["dump", "consumequeue", "{file}"],
    "reindex": ["reindex", "{empty}", "--out", "{tmp}/out"],
    "inspect": ["inspect", "{file}"],
    "check": ["check", "{missing}"],
    "writer serve": ["writer", "serve", "--store", "{file}"],
    "send": ["send", "--endpoint", "{writer}", "-t", "T", "--body", "x", "-q", "99999999999"],
    "query serve": ["query", "serve", "--store", "{missing}"],
    "queryMsgByKey": ["queryMsgByKey", "--store", "{store}", "-t", "T", "-k", "k", "--begin", "99999999999999999999"],
    "queryMsgByUniqueKey": ["queryMsgByUniqueKey", "--endpoint", "{query}", "-t", "bad topic", "-i", "x"],
    "queryMsgById": ["queryMsgById", "--store", "{store}", "-i", "ZZ"],
    "queryMsgByOffset": ["queryMsgByOffset", "--endpoint", "{query}", "-t", "T", "-q", "99999999999", "-o", "0"],
    "searchOffset": ["searchOffset", "--store", "{store}", "-t", "T", "-q", "0", "--timestamp", "99999999999999999999"],
    "printMsg": ["printMsg", "--endpoint", "{query}", "-t", "T", "-e", "99999999999999999999"],
    "topicList": ["topicList", "--endpoint", "{query}", "--store", "{store}"],
    "topicStatus": ["topicStatus", "--store", "{file}", "-t", "T"],
    "consumerProgress": ["consumerProgress", "--endpoint", "{query}", "-g", "no-such-group"],
    "updateTopic": ["updateTopic", "--endpoint", "{writer}", "-t", "T", "-r", "2", "-w", "4"],
    "updateSubGroup": ["updateSubGroup", "--endpoint", "{writer}", "-g", "bad group"],
    "demo": ["demo", "--store", "{tmp}"],
    "console": ["console", "--query-endpoint", "{query}", "--users", "{missing}", "--port", "0"],
    "proxy serve": ["proxy", "serve", "--cluster", "{missing}"],
    "replicas": ["replicas", "--endpoint", "{writer}"],
    "writer promote": ["writer", "promote", "--endpoint", "{writer}"],
    "console-passwd": ["console-passwd", "--users", "{tmp}/users", "--user", "a:b"],
    "pipeline reindex": ["pipeline", "reindex", "{missing}", "--out", "{tmp}/out"],
    "pipeline export": ["pipeline", "export", "{missing}", "--out", "{tmp}/out"],
    "pipeline load": ["pipeline", "load", "{missing}", "--endpoint", "{writer}", "--batch-messages", "0"],
    "pipeline stats": ["pipeline", "stats", "{file}"],
}


def _leaf_commands() -> set[str]:
    names = set()

    def walk(parser: object, prefix: str) -> None:
        actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]  # type: ignore[attr-defined]
        if not actions:
            names.add(prefix)
            return
        for name, child in actions[0].choices.items():
            walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return names


def test_every_command_refuses_a_bad_input_in_one_line(cluster: Cluster, tmp_path: Path) -> None:
    assert set(BAD_INPUTS) == _leaf_commands()
    (tmp_path / "notes.txt").write_text("keep")
    (tmp_path / "f").write_text("x")
    (tmp_path / "empty").mkdir()
    fill = {
        "missing": str(tmp_path / "nowhere"),
        "file": str(tmp_path / "f"),
        "empty": str(tmp_path / "empty"),
        "tmp": str(tmp_path),
        "store": str(cluster.store),
        "writer": cluster.writer.endpoint,
        "query": cluster.query.endpoint,
    }
    for command, argv in BAD_INPUTS.items():
        # (stdin empty: console-passwd reads the password from it before anything else)
        done = subprocess.run(rmqstore(*(a.format(**fill) for a in argv)), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode in (2, 3), (command, done)
        assert "Traceback" not in done.stderr, command
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("rmqstore: error: "), (command, done.stderr)
        assert done.stdout == "", command
    assert (tmp_path / "notes.txt").read_text() == "keep"
    assert not (tmp_path / "users").exists()


# Every path and endpoint argument of every command, each given a bad value: the exact exit
# code and first line. The table is checked against the parser, so that a new command or
# argument cannot go without its line; it runs in this process (console-passwd, which reads
# its password from stdin first, as a process), the table above runs each command's process.

PATH_ARGUMENTS = {
    "dir", "store", "store_flag", "out", "target_store", "input", "users", "acl", "body_file", "file",
    "tls_cert", "tls_key", "tls_client_ca", "tls_ca", "tls_client_cert", "tls_client_key", "cluster",
}  # fmt: skip
ENDPOINT_ARGUMENTS = {
    "endpoint", "query_endpoint", "writer_endpoint", "advertise", "store_host", "host", "port", "health_port",
    "metrics_port", "console_port", "etcd", "replicas",
}  # fmt: skip
LOOKUPS = {
    "queryMsgByKey": ["-t", "T", "-k", "k"], "queryMsgByUniqueKey": ["-t", "T", "-i", "x"], "queryMsgById": ["-i", "x"],
    "queryMsgByOffset": ["-t", "T", "-q", "0", "-o", "0"], "searchOffset": ["-t", "T", "-q", "0", "--timestamp", "0"],
    "printMsg": ["-t", "T"], "topicList": [], "topicStatus": ["-t", "T"], "consumerProgress": [],
}  # fmt: skip
NOT_A_STORE = "not a store directory (it has neither commitlog/ nor checkpoint)"
NO_FILE = "cannot read: No such file or directory"


def _path_and_endpoint_arguments() -> set[tuple[str, str]]:
    found = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not actions:
            found.update((prefix, a.dest) for a in parser._actions if a.dest in PATH_ARGUMENTS | ENDPOINT_ARGUMENTS)
            return
        for name, child in actions[0].choices.items():
            walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return found


def _bad_arguments(d: dict[str, str]) -> dict[tuple[str, str], tuple[list[str], int, str]]:
    """(command, argument) → (argv, exit code, first line of stderr), for the paths in ``d``."""

    def usage(command: str, flag: str, why: str) -> tuple[int, str]:
        return 2, f"rmqstore: error: {command}: argument {flag}: {why} (see rmqstore {command} --help)"

    def error(line: str, code: int = 2) -> tuple[int, str]:
        return code, f"rmqstore: error: {line}"

    no_port = "'localhost' is not HOST:PORT: no port"
    big_port = "70000 is outside [0, 65535] (a TCP port)"
    with_port = "'127.0.0.1:80' is not a host: give the address alone (the port has a flag of its own)"
    empty, notes, missing, clean = d["empty"], d["notes"], d["missing"], d["clean"]
    table: dict[tuple[str, str], tuple[list[str], tuple[int, str]]] = {}
    for tool in ("dump commitlog", "dump consumequeue", "reindex", "inspect", "check"):
        out = ["--out", d["tmp"] + "/out"] if tool == "reindex" else []
        table[(tool, "dir")] = ([*tool.split(), empty, *out], error(f"store directory {empty}: {NOT_A_STORE}"))
        table[(tool, "store_flag")] = ([*tool.split(), "--store", missing, *out], error(f"--store {missing}: no such directory"))
    table[("reindex", "out")] = (["reindex", *clean, "--out", d["file"]], error(f"--out {d['file']}: not a directory"))
    for job in ("pipeline reindex", "pipeline export", "pipeline stats"):
        out = [] if job == "pipeline stats" else ["--out", d["tmp"] + "/out"]
        table[(job, "store")] = ([*job.split(), empty, *out], error(f"store directory {empty}: {NOT_A_STORE}"))
        table[(job, "store_flag")] = ([*job.split(), "--store", d["file"], *out], error(f"--store {d['file']}: not a directory"))
    table[("pipeline reindex", "out")] = (["pipeline", "reindex", *clean, "--out", d["file"]], error(f"--out {d['file']}: not a directory"))
    table[("pipeline export", "out")] = (
        ["pipeline", "export", clean[0], "--out", notes], error(f"--out {notes} already exists; export writes a new directory")
    )
    load = ["pipeline", "load", d["file"], "--endpoint", "127.0.0.1:1"]
    table[("pipeline load", "input")] = (["pipeline", "load", missing, "--endpoint", "127.0.0.1:1"], error(f"{missing}: no such input"))
    table[("pipeline load", "endpoint")] = (["pipeline", "load", d["file"], "--endpoint", "localhost"], usage("pipeline load", "--endpoint", no_port))
    table[("pipeline load", "query_endpoint")] = ([*load, "--query-endpoint", "localhost"], usage("pipeline load", "--query-endpoint", no_port))
    table[("pipeline load", "target_store")] = ([*load, "--target-store", empty], error(f"--target-store {empty}: {NOT_A_STORE}"))
    # The servers.
    for node in ("writer serve", "query serve"):
        serve = [*node.split(), "--store", d["tmp"] + "/never-made"]
        if node == "writer serve":
            why = f"{NOT_A_STORE} and not empty; give a new or empty directory, or --init to make a store in it beside what it holds"
        else:
            why = NOT_A_STORE
        table[(node, "store")] = ([*node.split(), "--store", notes], error(f"--store {notes}: {why}"))
        table[(node, "host")] = ([*serve, "--host", "127.0.0.1:80"], usage(node, "--host", with_port))
        for flag in ("--port", "--health-port", "--metrics-port"):
            table[(node, flag[2:].replace("-", "_"))] = ([*serve, flag, "70000"], usage(node, flag, big_port))
        table[(node, "acl")] = ([*serve, "--acl", missing], error(f"--acl {missing}: {NO_FILE}"))
        table[(node, "tls_cert")] = ([*serve, "--tls-cert", missing, "--tls-key", d["key"]], error(f"--tls-cert {missing}: {NO_FILE}"))
        table[(node, "tls_key")] = ([*serve, "--tls-cert", d["cert"], "--tls-key", missing], error(f"--tls-key {missing}: {NO_FILE}"))
        table[(node, "tls_client_ca")] = (
            [*serve, "--tls-cert", d["cert"], "--tls-key", d["key"], "--tls-client-ca", missing], error(f"--tls-client-ca {missing}: {NO_FILE}")
        )
    writer = ["writer", "serve", "--store", d["tmp"] + "/never-made"]
    table[("writer serve", "store_host")] = (
        [*writer, "--store-host", "writer:1"], usage("writer serve", "--store-host", "'writer:1' is not IP:PORT: 'writer' is not an IP address")
    )
    table[("writer serve", "advertise")] = ([*writer, "--advertise", "localhost"], usage("writer serve", "--advertise", no_port))
    table[("writer serve", "etcd")] = ([*writer, "--etcd", "127.0.0.1:2379,localhost"], usage("writer serve", "--etcd", no_port))
    group = [*writer, "--group", "g", "--replica-id", "0"]
    table[("writer serve", "replicas")] = ([*group, "--replicas", "0=localhost"], error("--replicas: 'localhost' is not HOST:PORT: no port"))
    proxy = ["proxy", "serve", "--cluster", missing]
    table[("proxy serve", "cluster")] = (proxy, error(f"--cluster {missing}: No such file or directory"))
    table[("proxy serve", "host")] = ([*proxy, "--host", "127.0.0.1:80"], usage("proxy serve", "--host", with_port))
    table[("proxy serve", "port")] = ([*proxy, "--port", "70000"], usage("proxy serve", "--port", big_port))
    table[("proxy serve", "advertise")] = ([*proxy, "--advertise", "127.0.0.1:1,localhost"], usage("proxy serve", "--advertise", no_port))
    fronting = ["proxy", "serve", "--cluster", d["cluster"]]
    for flag in ("--health-port", "--metrics-port"):
        table[("proxy serve", flag[2:].replace("-", "_"))] = ([*fronting, flag, "70000"], usage("proxy serve", flag, big_port))
    table[("proxy serve", "acl")] = ([*fronting, "--acl", missing], error(f"--acl {missing}: {NO_FILE}"))
    table[("proxy serve", "tls_cert")] = ([*fronting, "--tls-cert", missing, "--tls-key", d["key"]], error(f"--tls-cert {missing}: {NO_FILE}"))
    table[("proxy serve", "tls_key")] = ([*fronting, "--tls-cert", d["cert"], "--tls-key", missing], error(f"--tls-key {missing}: {NO_FILE}"))
    table[("proxy serve", "tls_client_ca")] = (
        [*fronting, "--tls-cert", d["cert"], "--tls-key", d["key"], "--tls-client-ca", missing], error(f"--tls-client-ca {missing}: {NO_FILE}")
    )
    # The clients: an endpoint, and the TLS files of the channel to it.
    clients = {name: ([name], rest) for name, rest in LOOKUPS.items()}
    clients["send"] = (["send"], ["-t", "T", "--body", "x"])
    clients["updateTopic"] = (["updateTopic"], ["-t", "T"])
    clients["updateSubGroup"] = (["updateSubGroup"], ["-g", "G"])
    clients["replicas"] = (["replicas"], [])
    clients["writer promote"] = (["writer", "promote"], [])
    clients["console"] = (["console", "--port", "0"], [])
    for name, (command, rest) in clients.items():
        flag = "--query-endpoint" if name == "console" else "--endpoint"
        at = [*command, flag, "127.0.0.1:1", *rest]
        table[(name, flag[2:].replace("-", "_"))] = ([*command, flag, "localhost", *rest], usage(name, flag, no_port))
        table[(name, "tls_ca")] = ([*at, "--tls-ca", missing], error(f"--tls-ca {missing}: {NO_FILE}"))
        table[(name, "tls_client_cert")] = (
            [*at, "--tls-client-cert", missing, "--tls-client-key", d["key"]], error(f"--tls-client-cert {missing}: {NO_FILE}")
        )
        table[(name, "tls_client_key")] = (
            [*at, "--tls-client-cert", d["cert"], "--tls-client-key", missing], error(f"--tls-client-key {missing}: {NO_FILE}")
        )
    for name, rest in LOOKUPS.items():
        table[(name, "store")] = ([name, "--store", empty, *rest], error(f"--store {empty}: {NOT_A_STORE}"))
    table[("send", "body_file")] = (
        ["send", "--endpoint", "127.0.0.1:1", "-t", "T", "--body-file", missing], error(f"--body-file {missing}: No such file or directory")
    )
    table[("send", "file")] = (["send", "--endpoint", "127.0.0.1:1", "--file", empty], error(f"--file {empty}: is a directory, not a JSONL file"))
    console = ["console", "--query-endpoint", "127.0.0.1:1"]
    table[("console", "writer_endpoint")] = ([*console, "--writer-endpoint", "localhost"], usage("console", "--writer-endpoint", no_port))
    table[("console", "host")] = ([*console, "--host", "127.0.0.1:80"], usage("console", "--host", with_port))
    table[("console", "port")] = ([*console, "--port", "70000"], usage("console", "--port", big_port))
    table[("console", "users")] = ([*console, "--port", "0", "--users", missing], error(f"users file {missing}: No such file or directory"))
    table[("console-passwd", "users")] = (
        ["console-passwd", "--users", missing + "/users", "--user", "a"], error(f"users file {missing}/users: no such directory {missing}")
    )
    table[("demo", "store")] = (["demo", "--store", d["file"]], error(f"--store {d['file']} exists and is not a directory; give a new or empty directory"))
    table[("demo", "console_port")] = (["demo", "--console-port", "70000"], usage("demo", "--console-port", big_port))
    return {key: (argv, *expected) for key, (argv, expected) in table.items()}


def test_every_path_and_endpoint_argument_refuses_a_bad_value_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("keep me")
    (tmp_path / "f").write_text("x")
    (tmp_path / "cluster.yaml").write_text("groups:\n  - name: broker-a\n    writers: [\"127.0.0.1:1\"]\n")
    paths = {
        "empty": str(tmp_path / "empty"), "notes": str(tmp_path / "notes"), "missing": str(tmp_path / "nowhere"),
        "file": str(tmp_path / "f"), "tmp": str(tmp_path), "clean": [str(CLEAN), *FIXTURE_SIZE_ARGS],
        "cert": str(pki.server_cert), "key": str(pki.server_key), "cluster": str(tmp_path / "cluster.yaml"),
    }  # fmt: skip
    table = _bad_arguments(paths)  # type: ignore[arg-type]
    assert set(table) == _path_and_endpoint_arguments()
    for (command, argument), (argv, code, line) in table.items():
        if command == "console-passwd":
            done = subprocess.run(rmqstore(*argv), input="a password\n", capture_output=True, text=True, timeout=120, check=False)
            answer = (done.returncode, done.stdout, done.stderr.splitlines()[:1])
        else:
            got, out, err = run(capsys, *argv)
            answer = (got, out, err.splitlines()[:1])
        assert answer == (code, "", [line]), (command, argument, argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "empty", "f", "notes", "pki"]
    assert [p.name for p in (tmp_path / "notes").iterdir()] == ["notes.txt"] and not any((tmp_path / "empty").iterdir())


TIME_SYNTAX = (
    "give epoch milliseconds, ISO 8601 (2026-11-29T04:12:00Z; UTC without a zone) "
    "or mqadmin's yyyy-MM-dd#HH:mm:ss:SSS (local time)"
)


# Every time argument of every command: the one syntax (common/times.py), and for what it
# cannot read the same exit code and first line, naming the flag.
TIME_ARGUMENTS: dict[str, tuple[list[str], list[str]]] = {
    # command: (the command with everything but the time, the time's flags)
    "queryMsgByKey": (["queryMsgByKey", "--store", "{store}", "-t", TOPIC, "-k", "k"], ["--begin", "--end"]),
    "searchOffset": (["searchOffset", "--store", "{store}", "-t", TOPIC, "-q", "0"], ["--timestamp"]),
    "printMsg": (["printMsg", "--endpoint", "{query}", "-t", TOPIC], ["-b/--begin", "-e/--end"]),
    "pipeline export": (["pipeline", "export", "{store}", "--out", "{tmp}/out", "--topic", TOPIC], ["--begin", "--end"]),
}
BAD_TIMES = {
    "yesterday": f"'yesterday' is not a time: {TIME_SYNTAX}",
    "2026-11-31": f"'2026-11-31' is not a time: {TIME_SYNTAX}",
    "2026-11-29#25:00:00:000": f"'2026-11-29#25:00:00:000' is not a time: {TIME_SYNTAX}",
    "-5": f"'-5' is not a time: {TIME_SYNTAX}",
    "1969-12-31T23:59:59Z": "'1969-12-31T23:59:59Z' is before 1970-01-01T00:00:00Z, the earliest time",
    "99999999999999999999": "'99999999999999999999' is past the largest time, 9223372036854775807 ms",
}


def test_every_time_argument_refuses_what_it_cannot_read_in_one_line(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rmqstore.cli import exits

    # Every argument that takes a time takes it through the one parser, and is listed here.
    timed = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{prefix} {name}".strip())
            elif action.type is exits.time_ms or action.metavar == "TIME" or action.dest in ("begin", "end", "timestamp"):
                assert action.type is exits.time_ms, (prefix, action.option_strings)
                timed.add((prefix, "/".join(action.option_strings)))

    walk(build_parser(), "")
    assert timed == {(command, flag) for command, (_, flags) in TIME_ARGUMENTS.items() for flag in flags}
    fill = {"store": str(cluster.store), "query": cluster.query.endpoint, "tmp": str(tmp_path)}
    bad = list(BAD_TIMES.items())
    for command, (argv, flags) in TIME_ARGUMENTS.items():
        for flag in flags:
            given = [a.format(**fill) for a in argv] + [flag.split("/")[-1]]
            for text, why in bad:
                line = f"rmqstore: error: {command}: argument {flag}: {why} (see rmqstore {command} --help)"
                assert run(capsys, *given, text) == (2, "", line + "\n"), (command, flag, text)
            # And as a process, one bad time a flag in turn.
            text, why = bad[0]
            bad.append(bad.pop(0))
            done = subprocess.run(rmqstore(*given, text), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                                  check=False)  # fmt: skip
            assert (done.returncode, done.stdout) == (2, ""), (command, flag, text, done)
            assert done.stderr.splitlines()[0] == f"rmqstore: error: {command}: argument {flag}: {why} (see rmqstore {command} --help)"
    assert not (tmp_path / "out").exists()


def test_numbers_a_node_cannot_use_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    serve = ["writer", "serve", "--store", str(tmp_path / "store")]
    for flag, value, why in (
        ("--disk-full-ratio", "7", "7 is outside [0, 1] (a share of the disk)"),
        ("--disk-clean-ratio", "-0.1", "-0.1 is outside [0, 1] (a share of the disk)"),
        ("--flush-interval-ms", "-1", "-1 is outside [1, 2147483647] (a count of at least 1)"),
        ("--retention-hours", "-3", "-3 is outside [0, 1e+09] (hours)"),
        ("--large-answer-rate", "-1", "-1 is outside [0, 1048576] (MiB a second, 0 for no limit)"),
        ("--large-answer-rate", "1.5", "'1.5' is not a whole number"),
    ):
        assert run(capsys, *serve, flag, value) == (
            2, "", f"rmqstore: error: writer serve: argument {flag}: {why} (see rmqstore writer serve --help)\n"
        )
    assert run(capsys, "send", "--endpoint", "127.0.0.1:1", "-t", "T", "--body", "x", "--timeout", "-5") == (
        2, "", "rmqstore: error: send: argument --timeout: -5 is outside (0, 1e+09] (seconds) (see rmqstore send --help)\n"
    )
    assert not (tmp_path / "store").exists()


def test_usage_errors_name_flags_not_internal_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "writer") == (2, "", "rmqstore: error: writer: the following arguments are required: serve|promote (see rmqstore writer --help)\n")
    assert run(capsys, "dump") == (
        2, "", "rmqstore: error: dump: the following arguments are required: commitlog|consumequeue (see rmqstore dump --help)\n"
    )
    assert run(capsys, "pipeline")[2] == "rmqstore: error: pipeline: the following arguments are required: JOB (see rmqstore pipeline --help)\n"


def test_every_lookup_flag_has_help() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices  # type: ignore[attr-defined]
    for name in ("queryMsgByKey", "queryMsgByUniqueKey", "queryMsgById", "queryMsgByOffset", "searchOffset", "printMsg",
                 "topicList", "topicStatus", "consumerProgress", "updateTopic", "updateSubGroup", "send"):  # fmt: skip
        for action in commands[name]._actions:
            assert action.help, (name, action.option_strings)
    search = {o for a in commands["searchOffset"]._actions for o in a.option_strings}
    assert "--body" not in search and "--json" in search
    writer_serve = commands["writer"]._actions[-1].choices["serve"]
    helps = {o: a.help for a in writer_serve._actions for o in a.option_strings}
    assert "(default 0.75)" in helps["--disk-clean-ratio"] and "(default 0.90)" in helps["--disk-full-ratio"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    assert run(capsys, "--version") == (0, f"rmqstore {metadata.version('rmqstore')}\n", "")


# send


def test_send_refuses_bad_files_and_flags_naming_them(cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = ["send", "--endpoint", cluster.writer.endpoint]
    non_utf8 = tmp_path / "latin1.jsonl"
    non_utf8.write_bytes(b'{"topic": "T", "body": "a"}\n{"topic": "T", "body": "caf\xe9"}\n')
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text("".join(json.dumps({"topic": "T", "body": "x"}) + "\n" for _ in range(4)) + '{"topic": "T", "body": "", "keys": ["a b"]}\n')
    cases = [
        ([*w, "--file", str(tmp_path / "nope.jsonl")], f"--file {tmp_path / 'nope.jsonl'}: No such file or directory"),
        ([*w, "--file", str(tmp_path)], f"--file {tmp_path}: is a directory, not a JSONL file"),
        ([*w, "--file", str(non_utf8)], f"--file {non_utf8}: line 2 is not UTF-8 (invalid continuation byte at byte 55)"),
        ([*w, "--file", str(bad_line), "--batch-size", "2"], "line 5: key 'a b' contains a space; KEYS are space-separated"),
        ([*w, "--file", str(bad_line), "-t", "T", "--body", "x"], "-t, --body describe one message; with --file every line gives its own"),
        ([*w, "-t", "T"], "give the body: --body TEXT or --body-file F (--body '' sends an empty one)"),
        ([*w, "-t", "T", "--body", "x", "--body-file", str(non_utf8)], "give --body or --body-file, not both"),
        ([*w, "-t", "T", "--body-file", str(tmp_path / "nope")], f"--body-file {tmp_path / 'nope'}: No such file or directory"),
        ([*w, "--file", str(bad_line), "--batch-size", "0"],
         "send: argument --batch-size: 0 is outside [1, 2147483647] (a count of at least 1) (see rmqstore send --help)"),
        ([*w, "-t", "T", "--body", "x", "-q", "-1"],
         "send: argument -q/--queue: -1 is outside [0, 2147483647] (a queue id) (see rmqstore send --help)"),
    ]
    for argv, message in cases:
        assert run(capsys, *argv) == (2, "", f"rmqstore: error: {message}\n"), argv
    # A field of the wrong type or range is the line's error too, never a traceback.
    wrong = tmp_path / "wrong.jsonl"
    for line, message in (
        ('{"topic": "T", "tags": 5}', "line 1: tags must be a string"),
        ('{"topic": "T", "uniqKey": 7}', "line 1: uniqKey must be a string"),
        ('{"topic": "T", "queueId": true}', "line 1: queueId must be an integer"),
        ('{"topic": "T", "queueId": 99999999999}', "line 1: queueId 99999999999 is outside [0, 2147483647]"),
        ('{"topic": "T"} {"topic": "U"}', "line 1, column 16: not JSON: unexpected content after document"),
        ('{"topic": "T", "body": "x", "bodyBase64": "AA=="}', "line 1: give body or bodyBase64, not both"),
    ):
        wrong.write_text(line + "\n")
        assert run(capsys, *w, "--file", str(wrong)) == (2, "", f"rmqstore: error: {message}\n"), line


def test_send_body_file_and_acks(cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = bytes(range(256))
    (tmp_path / "body.bin").write_bytes(body)
    w = ["send", "--endpoint", cluster.writer.endpoint]
    code, out, err = run(capsys, *w, "-t", "Blobs", "--body-file", str(tmp_path / "body.bin"))
    assert (code, err) == (0, "")
    ack = json.loads(out)
    code, out, _ = run(capsys, "queryMsgById", "--endpoint", cluster.query.endpoint, "-i", ack["offsetMsgId"], "--json", "--body")
    assert code == 0 and json.loads(out)["bodyBase64"] == "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmqq6ytrq+wsbKztLW2t7i5uru8vb6/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/w=="
    lines = tmp_path / "five.jsonl"
    lines.write_text("".join(json.dumps({"topic": "Acks", "body": str(n)}) + "\n" for n in range(5)))
    code, out, err = run(capsys, *w, "--file", str(lines), "--acks", "summary", "--batch-size", "2")
    summary = json.loads(out)
    assert (code, err, set(summary), summary["sent"], summary["acked"]) == (0, "", {"sent", "acked", "seconds", "msgsPerSecond"}, 5, 5)
    assert run(capsys, *w, "--file", str(lines), "--acks", "none") == (0, "", "")
    code, out, _ = run(capsys, *w, "--file", str(lines))
    assert code == 0 and [json.loads(line)["topic"] for line in out.splitlines()] == ["Acks"] * 5


def _on_a_terminal(argv: list[str], stdout_too: bool) -> tuple[int, str, str]:
    """Run rmqstore with stderr (and stdout, if asked) on a pseudo-terminal: its exit code,
    what the terminal showed, and stdout when that was a pipe."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            rmqstore(*argv), stdout=terminal if stdout_too else subprocess.PIPE, stderr=terminal, text=True
        )
        os.close(terminal)
        seen = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # the terminal's other end closed
                    break
                if not chunk:
                    break
                seen += chunk
            elif process.poll() is not None:
                break
        code = process.wait(timeout=60)
        piped = ""
        if process.stdout is not None:
            with process.stdout:
                piped = process.stdout.read()
    finally:
        os.close(controller)
    return code, seen.decode().replace("\r\n", "\n"), piped


def test_send_shows_progress_and_a_summary_on_a_terminal(cluster: Cluster, tmp_path: Path) -> None:
    lines = tmp_path / "three.jsonl"
    lines.write_text("".join(json.dumps({"topic": "Tty", "body": str(n)}) + "\n" for n in range(3)))
    send = ["send", "--endpoint", cluster.writer.endpoint, "--file", str(lines)]
    code, shown, piped = _on_a_terminal([*send, "--acks", "none"], stdout_too=False)
    assert (code, piped) == (0, "")
    assert "\rsent 3, acked 3 (100%), " in shown  # the progress line
    final = shown.split("\r")[-1]
    assert final.startswith("sent 3, acked 3 in ") and final.endswith(" msgs/s\n"), shown
    # Acks printed to the same terminal: no line rewritten under them, the summary after.
    code, shown, _ = _on_a_terminal(send, stdout_too=True)
    assert code == 0 and "(100%)" not in shown
    printed = shown.split("\n")
    assert [json.loads(line)["topic"] for line in printed[:3]] == ["Tty"] * 3
    assert printed[3].lstrip("\r").startswith("sent 3, acked 3 in ") and printed[4:] == [""]


def test_ctrl_c_during_send_is_one_line(cluster: Cluster, tmp_path: Path) -> None:
    lines = tmp_path / "many.jsonl"
    # A message a request, many of them: the send outlasts any delay before the signal
    # (at 50 a request, a fast send of 60,000 could end before a loaded machine ran this
    # process again to send it).
    lines.write_text("".join(json.dumps({"topic": "Interrupted", "body": "x" * 10}) + "\n" for _ in range(200_000)))
    # Two CI runs (of dozens) saw the send print its line and then not exit within 60 s;
    # it never happened here. faulthandler in the child: a hang is answered with SIGABRT,
    # which prints every thread's stack into the failure.
    process = subprocess.Popen(
        rmqstore("send", "--endpoint", cluster.writer.endpoint, "--file", str(lines), "--batch-size", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline()  # sending has begun
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, stacks = process.communicate(timeout=30)
            raise AssertionError(f"the interrupted send did not exit within 60 s; its threads then:\n{stacks[-12000:]}") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # A held exit is forced after EXIT_GRACE_S (rmqstore.cli.main.run), with every thread's
    # stack on stderr under PYTHONFAULTHANDLER: they show here.
    assert len(err.splitlines()) == 1, f"the interrupted send's exit was held; its threads then:\n{err[-12000:]}"
    assert process.returncode == 130
    [line] = err.splitlines()
    assert line.startswith("rmqstore: error: interrupted: ") and " of 200000 messages acknowledged" in line


HELD_EXIT = """
import threading
import rmqstore.cli.main as cli

cli.EXIT_GRACE_S = 0.5

def held():
    threading.Thread(target=threading.Event().wait, name="holds-the-exit").start()
    return 3

cli.main = held
cli.run()
"""


@pytest.mark.parametrize("stacks", [False, True], ids=["quiet", "faulthandler"])
def test_an_exit_held_by_a_thread_is_forced_after_the_grace_with_the_commands_code(stacks: bool) -> None:
    """A thread that never ends holds the interpreter's exit: run() ends the process
    EXIT_GRACE_S after main() returned, with main()'s code (without it, the subprocess
    would time out); with PYTHONFAULTHANDLER, the stacks of the threads show what held it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    if stacks:
        env["PYTHONFAULTHANDLER"] = "1"
    done = subprocess.run([sys.executable, "-c", HELD_EXIT], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3
    assert done.stdout == ""
    if stacks:
        assert "(most recent call first)" in done.stderr and " in wait" in done.stderr, done.stderr
    else:
        assert done.stderr == ""


# Nodes: ports, store host, the lock


def test_a_taken_port_is_one_line_and_creates_nothing(cluster: Cluster, tmp_path: Path) -> None:
    port = cluster.query.endpoint.rsplit(":", 1)[1]
    for kind, store in (("writer", tmp_path / "new"), ("query", cluster.store)):
        done = subprocess.run(rmqstore(kind, "serve", "--store", str(store), "--port", port), capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == (
            f"rmqstore: error: --port {port}: cannot listen on 127.0.0.1 (Address already in use); is another process using it?\n"
        )
    assert not (tmp_path / "new").exists()


def test_port_0_records_the_port_served_on(cluster: Cluster) -> None:
    port = int(cluster.writer.endpoint.rsplit(":", 1)[1])
    assert cluster.writer.serving["port"] == port
    assert all(str(ack["offsetMsgId"])[8:16] == f"{port:08X}" for ack in cluster.acks)


def test_inspect_tells_a_live_writer_from_an_unclean_exit(cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", str(cluster.store))
    assert code == 0
    assert "abort marker present (a writer is running)" in out and "lock file    held by a running writer" in out
    copy = tmp_path / "copy"
    copy_live_store(cluster.store, copy)  # the abort marker, without the writer: an unclean exit
    code, out, _ = run(capsys, "inspect", str(copy))
    assert "abort marker present (last exit was unclean)" in out and "lock file    present, not held (no writer running)" in out


# mqadmin's commands


def test_query_by_offset_takes_the_queue_as_i_or_q(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    with_i = both(cluster, capsys, "queryMsgByOffset", "-t", TOPIC, "-i", "0", "-o", "2", "--json")
    with_q = both(cluster, capsys, "queryMsgByOffset", "-t", TOPIC, "-q", "0", "-o", "2", "--json")
    assert with_i == with_q and json.loads(with_i[1])["msgId"] == cluster.acks[4]["offsetMsgId"]


def _mqadmin_time(epoch_ms: int) -> str:
    moment = dt.datetime.fromtimestamp(epoch_ms / 1000)
    return moment.strftime("%Y-%m-%d#%H:%M:%S:") + f"{epoch_ms % 1000:03d}"


def test_print_msg_covers_every_queue_with_mqadmin_dates(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    stamps = [int(str(a["storeTimestamp"])) for a in cluster.acks]
    code, out, _ = both(cluster, capsys, "printMsg", "-t", TOPIC, "--json")
    by_queue = sorted(cluster.acks, key=lambda a: (a["queueId"], a["queueOffset"]))
    assert code == 0 and [json.loads(line)["msgId"] for line in out.splitlines()] == [a["offsetMsgId"] for a in by_queue]
    begin, end = _mqadmin_time(min(stamps)), _mqadmin_time(max(stamps))
    assert both(cluster, capsys, "printMsg", "-t", TOPIC, "-b", begin, "-e", end, "--json") == (code, out, "")
    assert both(cluster, capsys, "printMsg", "-t", TOPIC, "-b", str(min(stamps)), "-e", str(max(stamps)), "--json") == (code, out, "")
    code, out, _ = both(cluster, capsys, "printMsg", "-t", TOPIC, "-q", "1", "--json")
    assert [json.loads(line)["queueId"] for line in out.splitlines()] == [1, 1, 1]
    assert run(capsys, "printMsg", "--store", str(cluster.store), "-t", TOPIC, "-b", "2024-13-01#00:00:00:000") == (
        2, "", (f"rmqstore: error: printMsg: argument -b/--begin: '2024-13-01#00:00:00:000' is not a time: {TIME_SYNTAX} "
                "(see rmqstore printMsg --help)\n"),
    )


def _spellings(epoch_ms: int) -> list[str]:
    """One time written every way a time argument takes it."""
    utc = dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC)
    plus_one = utc.astimezone(dt.timezone(dt.timedelta(hours=1)))
    return [
        str(epoch_ms),
        utc.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        utc.replace(tzinfo=None).isoformat(timespec="milliseconds"),
        plus_one.isoformat(sep=" ", timespec="milliseconds"),
        _mqadmin_time(epoch_ms),
    ]


def test_every_time_argument_takes_one_syntax_and_times_print_as_iso_8601(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    stamps = sorted(int(str(a["storeTimestamp"])) for a in cluster.acks)
    first, last = stamps[0], stamps[-1]
    everything = both(cluster, capsys, "queryMsgByKey", "-t", TOPIC, "-k", "shared")
    printed = both(cluster, capsys, "printMsg", "-t", TOPIC, "--json")
    lower = both(cluster, capsys, "searchOffset", "-t", TOPIC, "-q", "0", "--timestamp", str(last), "--json")
    assert everything[0] == printed[0] == lower[0] == 0 and len(everything[1].splitlines()) == 7
    for begin, end, at in zip(_spellings(first), _spellings(last), _spellings(last)):
        assert both(cluster, capsys, "queryMsgByKey", "-t", TOPIC, "-k", "shared", "--begin", begin, "--end", end) == everything, begin
        assert both(cluster, capsys, "printMsg", "-t", TOPIC, "-b", begin, "-e", end, "--json") == printed, begin
        assert both(cluster, capsys, "searchOffset", "-t", TOPIC, "-q", "0", "--timestamp", at, "--json") == lower, at
    # A date alone is its midnight (UTC): the day after the messages holds none of them.
    day_after = (dt.datetime.fromtimestamp(last / 1000, dt.UTC).date() + dt.timedelta(days=1)).isoformat()
    code, out, _ = both(cluster, capsys, "queryMsgByKey", "-t", TOPIC, "-k", "shared", "--begin", day_after)
    assert (code, out.splitlines()[1:]) == (0, [])
    # Printed for people as ISO 8601 (local time with its offset), which reads back as given.
    code, out, _ = both(cluster, capsys, "queryMsgByOffset", "-t", TOPIC, "-i", "1", "-o", "0")
    store_time = next(line.split("Store Timestamp:", 1)[1].strip() for line in out.splitlines() if line.startswith("Store Timestamp:"))
    ack = next(a for a in cluster.acks if a["queueId"] == 1 and a["queueOffset"] == 0)
    expected = dt.datetime.fromtimestamp(int(str(ack["storeTimestamp"])) / 1000).astimezone().isoformat(timespec="milliseconds")
    assert code == 0 and store_time == expected, out
    code, out, _ = both(cluster, capsys, "searchOffset", "-t", TOPIC, "-q", "1", "--timestamp", store_time, "--json")
    assert (code, json.loads(out)) == (0, {"offset": 0, "found": True})
    code, out, _ = both(cluster, capsys, "topicStatus", "-t", TOPIC)
    newest = max(int(str(a["storeTimestamp"])) for a in cluster.acks if a["queueId"] == 0)
    assert out.splitlines()[1].split()[3] == dt.datetime.fromtimestamp(newest / 1000).astimezone().isoformat(timespec="milliseconds")


def test_update_topic_topic_list_and_topic_status(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    update = ["updateTopic", "--endpoint", cluster.writer.endpoint, "-t", "Fresh"]
    assert run(capsys, *update, "-r", "3", "-w", "3") == (
        0, '{"topic": "Fresh", "queueCount": 3, "messageType": "NORMAL", "changed": true}\n', ""
    )
    assert run(capsys, *update, "-w", "3") == (0, '{"topic": "Fresh", "queueCount": 3, "messageType": "NORMAL", "changed": false}\n', "")
    # mqadmin's -a: the message type; without -w an existing topic keeps its queues.
    assert run(capsys, *update, "-a", "+message.type=FIFO") == (
        0, '{"topic": "Fresh", "queueCount": 3, "messageType": "FIFO", "changed": true}\n', ""
    )
    for attributes, problem in (
        ("+message.type=ORDERED", "-a +message.type=ORDERED: message.type must be one of NORMAL, FIFO, DELAY, TRANSACTION, MIXED"),
        ("+queue.type=BatchCQ", "-a +queue.type=BatchCQ: rmqstore keeps one topic attribute, set as "
         "+message.type=NORMAL|FIFO|DELAY|TRANSACTION|MIXED"),
        ("-message.type", "-a -message.type: rmqstore keeps one topic attribute, set as +message.type=NORMAL|FIFO|DELAY|TRANSACTION|MIXED"),
        ("+message.type=FIFO,+message.type=NORMAL", "-a +message.type=FIFO,+message.type=NORMAL: message.type is given twice"),
    ):  # fmt: skip
        assert run(capsys, *update, f"--attributes={attributes}") == (2, "", f"rmqstore: error: {problem}\n")
    assert run(capsys, *update, "-r", "2", "-w", "3") == (
        2, "", "rmqstore: error: -r 2 and -w 3 differ; rmqstore keeps one queue count per topic\n"
    )
    code, out, _ = both(cluster, capsys, "topicList")
    # Each topic and its message type (a topic made by a v1 send is NORMAL).
    assert code == 0 and f"{TOPIC}  NORMAL" in out.splitlines() and "Fresh  FIFO" in out.splitlines()
    code, out, _ = both(cluster, capsys, "topicList", "--json")
    assert code == 0 and "Fresh" in json.loads(out)
    code, out, _ = both(cluster, capsys, "topicStatus", "-t", TOPIC, "--json")
    last = {q: max(int(str(a["storeTimestamp"])) for a in cluster.acks if a["queueId"] == q) for q in (0, 1)}
    # The topic was made by its first send, with the 4 queues a send makes: all are shown.
    assert (code, json.loads(out)) == (0, [
        {"queueId": 0, "minOffset": 0, "maxOffset": 3, "lastUpdateTimestamp": last[0]},
        {"queueId": 1, "minOffset": 0, "maxOffset": 3, "lastUpdateTimestamp": last[1]},
        *({"queueId": q, "minOffset": 0, "maxOffset": 0, "lastUpdateTimestamp": 0} for q in range(2, 4)),
    ])  # fmt: skip
    code, out, _ = both(cluster, capsys, "topicStatus", "-t", TOPIC)
    assert out.splitlines()[0].split() == ["#QID", "#Min", "Offset", "#Max", "Offset", "#Last", "Updated"]
    assert out.splitlines()[1].split()[:3] == ["0", "0", "3"]
    assert out.splitlines()[-1] == "#Message Type  NORMAL"
    code, out, _ = both(cluster, capsys, "topicStatus", "-t", "Fresh")
    assert out.splitlines()[-1] == "#Message Type  FIFO"


def test_update_sub_group_with_mqadmins_flags(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    update = ["updateSubGroup", "--endpoint", cluster.writer.endpoint]
    assert run(capsys, *update, "-g", "Billing", "-o", "true") == (
        0, '{"groupName": "Billing", "consumeMessageOrderly": true, "changed": true}\n', ""
    )
    assert run(capsys, *update, "--groupName", "Billing") == (
        0, '{"groupName": "Billing", "consumeMessageOrderly": true, "changed": false}\n', ""
    )
    assert run(capsys, *update, "-g", "Billing", "--consumeMessageOrderly", "false") == (
        0, '{"groupName": "Billing", "consumeMessageOrderly": false, "changed": true}\n', ""
    )
    code, _, err = run(capsys, *update, "-g", "Billing", "-o", "yes")
    assert code == 2 and "argument -o/--consume-orderly/--consumeMessageOrderly: 'yes' is not true or false" in err
    code, _, err = run(capsys, *update, "-g", "no/such")
    assert code == 2 and err.startswith("rmqstore: error: INVALID_ARGUMENT: consumer group 'no/such' must be 1-")


def test_update_topic_makes_a_topic_every_lookup_shows_at_once_with_all_its_queues(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the query node and on the directory alike: the topic and each of its queues
    are there before any message, stay there after one queue is written, grow with the
    count; a smaller count says that counts never shrink."""
    update = ["updateTopic", "--endpoint", cluster.writer.endpoint, "-t", "Created"]

    def status() -> list[tuple[int, int, int]]:
        code, out, err = both(cluster, capsys, "topicStatus", "-t", "Created", "--json")
        assert (code, err) == (0, "")
        return [(q["queueId"], q["minOffset"], q["maxOffset"]) for q in json.loads(out)]

    assert run(capsys, *update, "-w", "4") == (0, '{"topic": "Created", "queueCount": 4, "messageType": "NORMAL", "changed": true}\n', "")
    code, out, _ = both(cluster, capsys, "topicList")
    assert code == 0 and "Created  NORMAL" in out.splitlines()
    assert status() == [(q, 0, 0) for q in range(4)]
    code, out, _ = both(cluster, capsys, "topicStatus", "-t", "Created")
    assert [line.split() for line in out.splitlines()[1:-1]] == [[str(q), "0", "0"] for q in range(4)]
    assert both(cluster, capsys, "printMsg", "-t", "Created") == (0, "", "")
    sent = subprocess.run(rmqstore("send", "--endpoint", cluster.writer.endpoint, "-t", "Created", "-q", "2", "--body", "x"),
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    assert status() == [(0, 0, 0), (1, 0, 0), (2, 0, 1), (3, 0, 0)]
    assert run(capsys, *update, "-w", "6") == (0, '{"topic": "Created", "queueCount": 6, "messageType": "NORMAL", "changed": true}\n', "")
    assert status() == [(0, 0, 0), (1, 0, 0), (2, 0, 1), (3, 0, 0), (4, 0, 0), (5, 0, 0)]
    code, out, err = run(capsys, *update, "-w", "2")
    assert (code, err) == (0, "") and json.loads(out) == {
        "topic": "Created", "queueCount": 6, "messageType": "NORMAL", "changed": False,
        "note": "queue counts never shrink: Created keeps its 6 queues (their messages stay addressable)",
    }  # fmt: skip
    assert len(status()) == 6


def test_a_newcomers_smaller_stumbles_each_get_a_clear_answer(cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39's smaller things, as processes: a node of the other kind named; a JSON line
    without a body refused as send -t without one is; one line and column in a JSON error;
    a bare rmqstore; --help's exit codes; a body file refused by its size before it is
    read; --body without --json refused; a msgId between records not found."""
    writer, query = cluster.writer.endpoint, cluster.query.endpoint

    def cli(*argv: str) -> tuple[int, str, str]:
        done = subprocess.run(rmqstore(*argv), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False)
        return done.returncode, done.stdout, done.stderr

    not_a_writer = f"{query} is not a writer: it does not serve the writer's calls (is it a query node's port?)"
    assert cli("send", "--endpoint", query, "-t", TOPIC, "--body", "x") == (2, "", f"rmqstore: error: UNIMPLEMENTED: {not_a_writer}\n")
    assert cli("updateTopic", "--endpoint", query, "-t", TOPIC) == (2, "", f"rmqstore: error: UNIMPLEMENTED: {not_a_writer}\n")
    not_a_query_node = f"{writer} is not a query node: it does not serve the query node's calls (is it a writer's port?)"
    assert cli("topicList", "--endpoint", writer) == (2, "", f"rmqstore: error: UNIMPLEMENTED: {not_a_query_node}\n")
    assert cli("queryMsgByKey", "--endpoint", writer, "-t", TOPIC, "-k", "k") == (
        2, "", f"rmqstore: error: UNIMPLEMENTED: {not_a_query_node}\n"
    )
    # No body is no message, in a file as on the command line.
    bodiless = tmp_path / "bodiless.jsonl"
    bodiless.write_text('{"topic": "Orders", "body": "x"}\n{"topic": "Orders"}\n')
    assert cli("send", "--endpoint", writer, "--file", str(bodiless)) == (
        2, "", 'rmqstore: error: line 2: give the body: body (text) or bodyBase64 (bytes) ("body": "" sends an empty one)\n'
    )
    assert cli("send", "--endpoint", writer, "-t", TOPIC) == (
        2, "", "rmqstore: error: give the body: --body TEXT or --body-file F (--body '' sends an empty one)\n"
    )
    # The file's line, and the column in it.
    bodiless.write_text('{"topic": "Orders", "body": "x"}\n{"topic": "T", "body": ""} {"topic": "U"}\n')
    assert cli("send", "--endpoint", writer, "--file", str(bodiless)) == (
        2, "", "rmqstore: error: line 2, column 28: not JSON: unexpected content after document\n"
    )
    assert cli() == (2, "", "rmqstore: error: the following arguments are required: COMMAND (see rmqstore --help)\n")
    code, out, _ = cli("--help")
    assert code == 0 and "4 a node's stop stalled (every thread's stack on stderr); 130 interrupted" in " ".join(out.split())
    # 200 MB of body file: refused by its size, never read (the process stays small).
    big = tmp_path / "big.bin"
    with open(big, "wb") as handle:
        handle.truncate(200 * 1024 * 1024)
    # In this process, its allocations traced: a child's peak RSS (wait4, RUSAGE_CHILDREN)
    # counts the copy of this process it was forked from before its exec.
    out_text, err_text = io.StringIO(), io.StringIO()
    tracemalloc.start()
    try:
        with contextlib.redirect_stdout(out_text), contextlib.redirect_stderr(err_text):
            code = main(["send", "--endpoint", writer, "-t", TOPIC, "--body-file", str(big)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (code, out_text.getvalue()) == (2, "")
    assert err_text.getvalue() == f"rmqstore: error: --body-file {big}: the body is 209715200 bytes; at most 4194304 allowed\n"
    assert peak < 16 * 1024 * 1024  # bytes allocated at most at once: no 200 MB read
    # --body only means something with --json.
    for where in cluster.where().values():
        assert cli("queryMsgByKey", *where, "-t", TOPIC, "-k", "shared", "--body") == (
            2, "", "rmqstore: error: --body adds the body to --json output: give --json too\n"
        )
    # A msgId between two records names no message: NOT_FOUND, exit 3 (docs/query.md).
    first = str(cluster.acks[0]["offsetMsgId"])
    inside = first[:-16] + f"{int(first[-16:], 16) + 4:016X}"
    for where in cluster.where().values():
        code, out, err = cli("queryMsgById", *where, "-i", inside)
        assert (code, out) == (3, "") and err.startswith(f"rmqstore: error: NOT_FOUND: no message with msgId {inside}: "), err


# The geometry file


def test_the_writer_records_its_geometry_and_tools_read_it(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads((cluster.store / "config" / GEOMETRY_FILE).read_text())
    assert {k: v for k, v in document.items() if k != "crc32"} == {
        "magic": "rmqstore-geometry", "version": 1, "commitLogFileSize": 65536, "cqFileUnits": 50, "indexSlots": 64, "indexEntries": 200,
    }  # fmt: skip
    code, out, _ = run(capsys, "inspect", str(cluster.store), "--json")
    assert json.loads(out)["sizes"] == {"commitlogFileSize": 65536, "cqFileUnits": 50, "indexSlots": 64, "indexEntries": 200}
    # A flag still wins: and here it disagrees with the files.
    code, out, err = run(capsys, "inspect", str(cluster.store), "--index-entries", "300")
    assert code == 2 and "64 slots and 300 entries make" in err


def test_a_writer_refuses_other_sizes_than_its_store_was_made_with(cluster: Cluster, tmp_path: Path) -> None:
    store = tmp_path / "store"
    copy_live_store(cluster.store, store, "lock")
    done = subprocess.run(rmqstore("writer", "serve", "--store", str(store), "--cq-file-units", "60"), capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("rmqstore: error: consume queue file ") and done.stderr.endswith(
        "is 1000 bytes, but 60 units make 1200; pass the store's --cq-file-units\n"
    )
    # Before any file holds a unit, the recorded geometry alone refuses other sizes.
    config = store / "config"
    with pytest.raises(InvalidArgument) as refused:
        record_geometry(str(config), Geometry(65536, 60, 64, 200))
    assert str(refused.value) == (
        f"the store was made with another geometry ({config / GEOMETRY_FILE}): cqFileUnits 60 (recorded 50); "
        "drop the size options or give the recorded ones"
    )
    record_geometry(str(config), Geometry(65536, 50, 64, 200))  # the same: nothing to do


def test_index_geometry_is_inferred_at_one_slot_to_four_entries(nodes: Nodes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert infer_index_geometry(ix.file_size(5_000_000, 20_000_000)) == (5_000_000, 20_000_000)
    assert infer_index_geometry(ix.file_size(100, 400)) == (100, 400)
    assert infer_index_geometry(ix.file_size(500, 1500)) is None  # the fixture's 1:3 needs its flags
    store = tmp_path / "store"
    writer = nodes.start("writer", store, "--index-slots", "100", "--index-entries", "400")
    try:
        assert run(capsys, "send", "--endpoint", writer.endpoint, "-t", "T", "-k", "k", "--body", "b")[0] == 0
    finally:
        writer.stop()
    (store / "config" / GEOMETRY_FILE).unlink()  # as Apache's broker leaves a store
    code, out, _ = run(capsys, "inspect", str(store), "--json")
    assert code == 0 and json.loads(out)["sizes"]["indexSlots"] == 100 and json.loads(out)["sizes"]["indexEntries"] == 400
    assert run(capsys, "check", str(store))[:2] == (0, "ok: 1 records, 1 consume queue units and 2 index keys agree\n")


def test_send_file_acks_name_what_the_store_holds(cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The ack lines are JSON objects of the ack fields in order, each naming the message
    the store holds, whatever fields the lines use (all on the one path)."""
    lines = tmp_path / "mixed.jsonl"
    documents = [
        {"topic": "Mixed", "body": "plain", "keys": ["a", "b"], "tags": "t", "queueId": 1},
        {"topic": "Mixed", "bodyBase64": "AAE=", "keys": "c d"},
        {"topic": "Mixed", "body": "with properties", "properties": {"color": "blue"}, "uniqKey": "ABCDEF0123456789"},
    ]
    lines.write_text("".join(json.dumps(d) + "\n" for d in documents) + "\n")
    for batch_size in ("1", "1000"):
        code, out, err = run(capsys, "send", "--endpoint", cluster.writer.endpoint, "--file", str(lines), "--batch-size", batch_size)
        assert (code, err) == (0, "")
        acks = out.splitlines()
        # Each line is one JSON object as orjson writes it (no spaces), the fields in order.
        assert len(acks) == 3 and all(line == orjson.dumps(json.loads(line)).decode() for line in acks)
        for line in acks:
            ack = json.loads(line)
            assert list(ack) == ["offsetMsgId", "uniqKey", "topic", "queueId", "queueOffset", "commitLogOffset", "storeTimestamp"]
            code, out, _ = run(capsys, "queryMsgById", "--endpoint", cluster.query.endpoint, "-i", ack["offsetMsgId"], "--json", "--body")
            stored = json.loads(out)
            assert (stored["topic"], stored["queueId"], stored["queueOffset"], stored["uniqKey"]) == (
                "Mixed", ack["queueId"], ack["queueOffset"], ack["uniqKey"]
            )
            assert stored["storeTimestamp"] == ack["storeTimestamp"] and stored["commitLogOffset"] == ack["commitLogOffset"]
        assert json.loads(acks[0])["queueId"] == 1
        assert json.loads(acks[2])["uniqKey"] == "ABCDEF0123456789"


def test_tools_and_jobs_take_the_store_as_dir_or_store_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    positional = run(capsys, "check", str(CLEAN), *FIXTURE_SIZE_ARGS)
    assert positional[0] == 0 and positional == run(capsys, "check", "--store", str(CLEAN), *FIXTURE_SIZE_ARGS)
    assert run(capsys, "check", str(CLEAN), "--store", str(tmp_path)) == (
        2, "", f"rmqstore: error: two store directories given ({CLEAN} and --store {tmp_path}); give one\n"
    )
    assert run(capsys, "inspect") == (2, "", "rmqstore: error: give the store directory: DIR or --store DIR\n")
    for job in ("stats", "reindex", "export"):
        out = [] if job == "stats" else ["--out", str(tmp_path / "out")]
        assert run(capsys, "pipeline", job, *out) == (2, "", "rmqstore: error: give the store directory: DIR or --store DIR\n")
        assert run(capsys, "pipeline", job, "--store", str(tmp_path / "nowhere"), *out) == (
            2, "", f"rmqstore: error: --store {tmp_path / 'nowhere'}: no such directory\n"
        )


def test_a_batch_the_writer_refuses_mid_file_is_one_line_saying_what_was_stored(
    nodes: Nodes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rule only the writer knows (here: no topic is created on the fly) refuses the
    second batch; the first one's acks are printed, and the one error line says so."""
    writer = nodes.start("writer", tmp_path / "store", "--no-auto-create")
    try:
        assert run(capsys, "updateTopic", "--endpoint", writer.endpoint, "-t", "Known", "-w", "2")[0] == 0
        lines = tmp_path / "four.jsonl"
        lines.write_text("".join(json.dumps({"topic": t, "body": "x"}) + "\n" for t in ("Known", "Known", "Known", "Unknown")))
        code, out, err = run(capsys, "send", "--endpoint", writer.endpoint, "--file", str(lines), "--batch-size", "3")
    finally:
        writer.stop()
    assert code == 3
    assert [json.loads(line)["topic"] for line in out.splitlines()] == ["Known"] * 3
    [line] = err.splitlines()
    assert line.startswith("rmqstore: error: NOT_FOUND: ") and "Unknown" in line
    assert line.endswith(" (3 of 4 messages were acknowledged before it)")


def test_reindex_refuses_an_empty_store_and_an_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A store a writer opened and never wrote to: its checkpoint, no commit log file.
    (tmp_path / "empty" / "commitlog").mkdir(parents=True)
    (tmp_path / "f").write_text("x")
    assert run(capsys, "reindex", str(tmp_path / "empty"), "--out", str(tmp_path / "out")) == (
        2, "", f"rmqstore: error: store directory {tmp_path / 'empty'}: no commit log files under commitlog/, nothing to reindex\n"
    )
    assert run(capsys, "reindex", str(CLEAN), *FIXTURE_SIZE_ARGS, "--out", str(tmp_path / "f")) == (
        2, "", f"rmqstore: error: --out {tmp_path / 'f'}: not a directory\n"
    )
    assert not (tmp_path / "out").exists() and (tmp_path / "f").read_text() == "x"


def test_a_command_line_registers_only_its_commands_module() -> None:
    """The table of which module registers which command is what the modules register, in
    the help's order; a named command's parser is the whole parser's for that command."""
    import importlib

    from rmqstore.cli import exits
    from rmqstore.cli.main import COMMAND_MODULES

    listed = []
    for name, commands in COMMAND_MODULES.items():
        parser = exits.Parser(prog="rmqstore")
        registered = parser.add_subparsers(dest="command")
        importlib.import_module(f"rmqstore.cli.{name}").register(registered)
        assert tuple(registered.choices) == commands, name
        listed += commands
    whole = build_parser()
    [top] = [action for action in whole._actions if isinstance(action, argparse._SubParsersAction)]
    assert list(top.choices) == listed
    for command in listed:
        [alone] = [a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction)]
        assert alone.choices[command].format_help() == top.choices[command].format_help(), command
    code = "import sys\nfrom rmqstore.cli import main\nmain.build_parser('send')\nprint(sorted(m for m in sys.modules if m.startswith('rmqstore.cli.')))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "['rmqstore.cli.exits', 'rmqstore.cli.main', 'rmqstore.cli.store_tools', 'rmqstore.cli.writer_tools']\n"
