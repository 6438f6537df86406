"""What an operator meets around the nodes, with real processes: a restart binds its port
at once after a kill, and a store is never deleted or reset while a process holds its lock."""

from __future__ import annotations

import http.client
import socket
from pathlib import Path

import pytest
from conftest import CLEAN, FIXTURE_SIZE_ARGS
from support.cli import console_demo, run, run_cli
from support.http import get
from support.nodes import Nodes
from support.wait import wait_until

from rmqstore.common.files.lockfile import lock_holder
from rmqstore.v1 import messages_pb2, query_pb2, writer_pb2

# Small files: the tests' stores cost the disk little.
SIZE_ARGS = ["--commitlog-file-size", "65536", "--cq-file-units", "50", "--index-slots", "64", "--index-entries", "256"]
RPC_TIMEOUT_S = 30.0


# /proc/net/tcp's state codes of a connection closed on this side first.
CLOSING_STATES = {"05": "FIN-WAIT-2", "06": "TIME-WAIT"}


def closing_on(port: int) -> list[str]:
    """The states of this host's TCP sockets on local port ``port`` that wait out a close
    this side began (what makes a bind without SO_REUSEADDR fail)."""
    states = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] in CLOSING_STATES:
                    states.append(CLOSING_STATES[fields[3]])
    return states


# HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
SETTINGS, ACK = 4, 1


def settled_http2_connection(connection: socket.socket) -> None:
    """Open HTTP/2 on ``connection`` and return once the server has acknowledged its
    SETTINGS: the server has then accepted the connection and read all the client sent. (A
    connection still in the listener's queue is reset when the listener dies, and one with
    bytes unread is reset when its server dies: neither leaves a closing socket.)"""
    connection.sendall(HTTP2_PREFACE)
    received = b""
    while True:
        while len(received) >= 9:
            if received[3] == SETTINGS and received[4] & ACK:
                return
            end = 9 + int.from_bytes(received[:3], "big")
            if len(received) < end:
                break
            received = received[end:]
        chunk = connection.recv(65536)
        assert chunk, "the server closed the connection before acknowledging its SETTINGS"
        received += chunk


def test_a_writer_killed_with_a_client_connected_restarts_on_its_port_at_once(nodes: Nodes, tmp_path: Path) -> None:
    """A writer SIGKILLed while a client is connected leaves the server side of that
    connection in TIME-WAIT on the port; the next writer binds it at once (as a container
    restarted in the same pod's network namespace must), and the client sends again."""
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS)
    port = writer.port
    stub = nodes.writer(writer)
    message = messages_pb2.Message(topic="Orders", body=b"before the kill")
    stub.SendBatch(writer_pb2.SendBatchRequest(messages=[message]), timeout=RPC_TIMEOUT_S)
    # A connection that neither reads nor closes: the kernel acknowledges the killed
    # writer's FIN on it, so the writer's side waits out FIN-WAIT-2 (a minute on Linux) on
    # the port. (The channel's own connection may instead end with a reset when its
    # client closes it with bytes unread, leaving nothing behind.)
    with socket.create_connection(("127.0.0.1", port), timeout=RPC_TIMEOUT_S) as held:
        settled_http2_connection(held)
        writer.kill()
        wait_until(lambda: closing_on(port), RPC_TIMEOUT_S, f"the killed writer's connection to close on port {port}")
        again = nodes.spawn("writer", ["writer", "serve", "--store", str(store), "--port", str(port), *SIZE_ARGS])
        serving = again.wait_serving()
        assert serving["port"] == port
    message = messages_pb2.Message(topic="Orders", body=b"after the restart")
    [result] = stub.SendBatch(writer_pb2.SendBatchRequest(messages=[message]), timeout=RPC_TIMEOUT_S).results
    assert result.queue_offset >= 1
    again.stop()


def test_a_query_node_and_a_console_killed_with_clients_connected_restart_on_their_ports_at_once(nodes: Nodes, tmp_path: Path) -> None:
    """The same for the query node (whose listener is checked as the writer's is) and the
    console (which binds its own socket)."""
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS)
    query = nodes.start("query", store)
    stub = nodes.query(query)
    stub.Stats(query_pb2.StatsRequest(), timeout=RPC_TIMEOUT_S)
    console = nodes.console("--query-endpoint", query.endpoint)
    # A keep-alive connection the test holds open: the killed console's side of it is the
    # one left closing on its port (a connection the server closed after one answer may
    # leave its wait on the client's side instead).
    browser = http.client.HTTPConnection("127.0.0.1", console.port, timeout=RPC_TIMEOUT_S)
    browser.request("GET", "/api/topics")
    answer = browser.getresponse()
    assert answer.status == 200 and answer.read()
    for node, again in (
        (query, ["query", "serve", "--store", str(store), "--port", str(query.port)]),
        (console, ["console", "--query-endpoint", f"127.0.0.1:{query.port}", "--port", str(console.port)]),
    ):
        port = node.port
        node.kill()
        wait_until(lambda port=port: closing_on(port), RPC_TIMEOUT_S, f"the killed {node.service}'s connections to close on port {port}")
        restarted = nodes.spawn(node.service, again)
        assert restarted.wait_serving()["port"] == port
    assert stub.Stats(query_pb2.StatsRequest(), timeout=RPC_TIMEOUT_S).visible_offset == 0
    assert get(f"http://127.0.0.1:{console.port}/api/topics")[0] == 200
    browser.close()
    writer.stop()


# Endpoints: HOST:PORT everywhere, an IPv6 address in brackets; anything else refused by
# the flag that names it, before anything is dialled.

ENDPOINT_FLAGS: list[tuple[list[str], str, list[str]]] = [
    (["send"], "--endpoint", ["-t", "T", "--body", "x"]),
    (["updateTopic"], "--endpoint", ["-t", "T"]),
    *[([lookup], "--endpoint", rest) for lookup, rest in (
        ("queryMsgByKey", ["-t", "T", "-k", "k"]), ("queryMsgByUniqueKey", ["-t", "T", "-i", "x"]),
        ("queryMsgById", ["-i", "x"]), ("queryMsgByOffset", ["-t", "T", "-q", "0", "-o", "0"]),
        ("searchOffset", ["-t", "T", "-q", "0", "--timestamp", "0"]), ("printMsg", ["-t", "T"]),
        ("topicList", []), ("topicStatus", ["-t", "T"]), ("consumerProgress", []),
    )],  # fmt: skip
    (["console"], "--query-endpoint", []),
    (["console", "--query-endpoint", "127.0.0.1:1"], "--writer-endpoint", []),
    (["pipeline", "load", "in.jsonl"], "--endpoint", []),
    (["pipeline", "load", "in.jsonl", "--endpoint", "127.0.0.1:1"], "--query-endpoint", []),
    (["writer", "serve", "--store", "never-made"], "--advertise", []),
]
BAD_ENDPOINTS = {
    "127.0.0.1:99999": "'127.0.0.1:99999' is not HOST:PORT: the port 99999 is outside [1, 65535]",
    "localhost": "'localhost' is not HOST:PORT: no port",
    ":5": "':5' is not HOST:PORT: no host",
    "[::1": "'[::1' is not HOST:PORT: no ] after the IPv6 address",
    "[::1]": "'[::1]' is not HOST:PORT: no port",
    "::1:8081": "'::1:8081' is not HOST:PORT: an IPv6 address goes in brackets, e.g. [::1]:8081",
    "host:0": "'host:0' is not HOST:PORT: the port 0 is outside [1, 65535]",
    "host:http": "'host:http' is not HOST:PORT: the port 'http' is not a number",
    "dns:///host:5": "'dns:///host:5' is not HOST:PORT: 'dns:///host' is not a host name or address",
    "300.1.1.1:5": "'300.1.1.1:5' is not HOST:PORT: '300.1.1.1' is not an IPv4 address",
}


def test_every_endpoint_flag_refuses_what_is_not_host_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command, flag, rest in ENDPOINT_FLAGS:
        name = " ".join(command[:2] if command[0] in ("writer", "pipeline") else command[:1])
        for given, why in BAD_ENDPOINTS.items():
            argv = [*command, flag, given, *rest]
            assert run(capsys, *argv) == (
                2, "", f"rmqstore: error: {name}: argument {flag}: {why} (see rmqstore {name} --help)\n"
            ), argv  # fmt: skip
    assert not (tmp_path / "never-made").exists()


def test_store_host_is_an_address_and_host_a_host(capsys: pytest.CaptureFixture[str]) -> None:
    serve = ["writer", "serve", "--store", "never-made"]
    usage = "(see rmqstore writer serve --help)"
    assert run(capsys, *serve, "--store-host", "writer:10911") == (
        2, "", f"rmqstore: error: writer serve: argument --store-host: 'writer:10911' is not IP:PORT: 'writer' is not an IP address {usage}\n"
    )  # fmt: skip
    assert run(capsys, *serve, "--store-host", "10.0.0.1:70000")[2].startswith(
        "rmqstore: error: writer serve: argument --store-host: '10.0.0.1:70000' is not HOST:PORT: the port 70000 is outside [1, 65535]"
    )
    for command in (["writer", "serve", "--store", "x"], ["query", "serve", "--store", "x"], ["console", "--query-endpoint", "h:1"]):
        name = " ".join(command[:2]) if command[0] != "console" else "console"
        assert run(capsys, *command, "--host", "127.0.0.1:8081") == (
            2, "", f"rmqstore: error: {name}: argument --host: '127.0.0.1:8081' is not a host: give the address alone "
            f"(the port has a flag of its own) (see rmqstore {name} --help)\n",
        )  # fmt: skip
    assert run(capsys, "console", "--query-endpoint", "h:1", "--port", "70000") == (
        2, "", "rmqstore: error: console: argument --port: 70000 is outside [0, 65535] (a TCP port) (see rmqstore console --help)\n"
    )  # fmt: skip


def test_an_ipv6_node_is_reached_at_its_bracketed_endpoint(nodes: Nodes, tmp_path: Path) -> None:
    """Nodes listen on an IPv6 host given bare or in brackets; the writer advertises it in
    brackets, and every client command reaches it as [::1]:PORT."""
    store = tmp_path / "store"
    writer = nodes.spawn("writer", ["writer", "serve", "--store", str(store), "--host", "::1", "--port", "0", *SIZE_ARGS])
    assert writer.wait_serving()["advertise"] == f"[::1]:{writer.port}"
    query = nodes.spawn("query", ["query", "serve", "--store", str(store), "--host", "[::1]", "--port", "0"])
    query.wait_serving()
    sent = run_cli(["send", "--endpoint", f"[::1]:{writer.port}", "-t", "Orders", "--body", "over IPv6"])
    assert sent.returncode == 0, sent.stderr
    listed = run_cli(["topicList", "--endpoint", f"[::1]:{query.port}"])
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "Orders  NORMAL\n", "")
    writer.stop()


# A path that is not a store: refused by whatever reads a store, never an empty answer.

STORE_READERS: list[list[str]] = [
    ["dump", "commitlog", "{dir}"],
    ["dump", "consumequeue", "--store", "{dir}"],
    ["reindex", "{dir}", "--out", "{out}"],
    ["inspect", "{dir}"],
    ["check", "--store", "{dir}"],
    ["queryMsgByKey", "--store", "{dir}", "-t", "T", "-k", "k"],
    ["queryMsgByUniqueKey", "--store", "{dir}", "-t", "T", "-i", "x"],
    ["queryMsgById", "--store", "{dir}", "-i", "x"],
    ["queryMsgByOffset", "--store", "{dir}", "-t", "T", "-q", "0", "-o", "0"],
    ["searchOffset", "--store", "{dir}", "-t", "T", "-q", "0", "--timestamp", "0"],
    ["printMsg", "--store", "{dir}", "-t", "T"],
    ["topicList", "--store", "{dir}"],
    ["topicStatus", "--store", "{dir}", "-t", "T"],
    ["consumerProgress", "--store", "{dir}"],
    ["pipeline", "reindex", "{dir}", "--out", "{out}"],
    ["pipeline", "export", "--store", "{dir}", "--out", "{out}"],
    ["pipeline", "stats", "{dir}"],
]


def test_every_command_that_reads_a_store_refuses_a_directory_that_is_not_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty directory and one of a user's own, given where a store is read: exit 2,
    one line saying it is not a store directory, nothing printed or written (the issue:
    topicList printed nothing, check said "ok: 0 records", both exit 0). The user's
    directory through the command's process, the empty one in this process."""
    empty, mine = tmp_path / "empty", tmp_path / "mine"
    empty.mkdir()
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    out = tmp_path / "out"
    for directory in (empty, mine):
        for argv in STORE_READERS:
            given = [a.format(dir=directory, out=out) for a in argv]
            if directory == mine:
                done = run_cli(given)
                answer = (done.returncode, done.stdout, done.stderr)
            else:
                answer = run(capsys, *given)
            option = "--store" if "--store" in argv else "store directory"
            assert answer == (
                2, "", f"rmqstore: error: {option} {directory}: not a store directory (it has neither commitlog/ nor checkpoint)\n"
            ), argv  # fmt: skip
    # A query node: an empty directory is a store to come (it follows the writer that makes
    # it); one holding anything else is refused.
    done = run_cli(["query", "serve", "--store", str(mine), "--port", "0"])
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"rmqstore: error: --store {mine}: not a store directory (it has neither commitlog/ nor checkpoint)\n"
    )  # fmt: skip
    done = run_cli(["pipeline", "load", str(mine / "notes.txt"), "--endpoint", "127.0.0.1:1", "--target-store", str(mine)])
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"rmqstore: error: --target-store {mine}: not a store directory (it has neither commitlog/ nor checkpoint)\n"
    )  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "mine"]
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and not any(empty.iterdir())


def test_a_store_a_writer_opened_is_a_store_to_every_reader(nodes: Nodes, tmp_path: Path) -> None:
    """What makes a store is what a writer writes on opening one: a store never written to
    is read as an empty store, not refused."""
    store = tmp_path / "store"
    nodes.start("writer", store, *SIZE_ARGS).stop()
    assert not (store / "commitlog").exists()
    done = run_cli(["topicList", "--store", str(store)])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    done = run_cli(["check", str(store)])
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok: 0 records, 0 consume queue units and 0 index keys agree\n", "")


def test_writer_serve_refuses_a_directory_of_other_files_unless_told_to_init(nodes: Nodes, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    done = run_cli(["writer", "serve", "--store", str(mine), "--port", "0"])
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"rmqstore: error: --store {mine}: not a store directory (it has neither commitlog/ nor checkpoint) and not empty; "
        "give a new or empty directory, or --init to make a store in it beside what it holds\n",
    )  # fmt: skip
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    # Told to, it makes its store there, beside the user's file; from then on it is a store.
    nodes.start("writer", mine, "--init", *SIZE_ARGS).stop()
    assert (mine / "notes.txt").read_text() == "keep me" and (mine / "checkpoint").exists()
    nodes.start("writer", mine, *SIZE_ARGS).stop()
    # An empty directory, and a missing one, as before.
    empty = tmp_path / "empty"
    empty.mkdir()
    nodes.start("writer", empty, *SIZE_ARGS).stop()
    nodes.start("writer", tmp_path / "new" / "store", *SIZE_ARGS).stop()
    assert (empty / "checkpoint").exists() and (tmp_path / "new" / "store" / "checkpoint").exists()


# No store is deleted or reset while a process holds its lock.


def test_a_demo_refuses_the_store_of_a_demo_still_running_and_deletes_nothing(tmp_path: Path) -> None:
    """The issue's case: `rmqstore demo --console --store D` running, a second demo on D
    (`bash run.sh D`) is refused while the first one's writer holds D's lock; the first
    goes on serving and ends cleanly, its store whole."""
    store = tmp_path / "demo"
    with console_demo(store, tmp_path) as first:
        before = sorted(str(p.relative_to(store)) for p in store.rglob("*"))
        log = store / "commitlog" / "00000000000000000000"
        log_bytes = log.read_bytes()
        second = run_cli(["demo", "--store", str(store)])
        assert (second.returncode, second.stdout) == (2, "")
        assert second.stderr == (
            f"rmqstore: error: --store {store}: a running writer (pid {_writer_pid(store)}) holds the store's lock "
            f"({store / 'lock'}); stop it first: nothing was deleted\n"
        )
        assert sorted(str(p.relative_to(store)) for p in store.rglob("*")) == before and log.read_bytes() == log_bytes
        # The first demo's writer still stores what it acknowledges.
        sent = run_cli(["send", "--endpoint", first.writer_endpoint, "-t", "Orders", "--body", "after the refusal"])
        assert sent.returncode == 0, sent.stderr
        assert "ok: 8 records, 8 consume queue units and 21 index keys agree" in first.interrupt()


def _writer_pid(store: Path) -> int:
    holder = lock_holder(str(store / "lock"))
    assert holder is not None
    return holder


def test_reindex_refuses_an_out_a_writer_runs_on(nodes: Nodes, tmp_path: Path) -> None:
    """`reindex --out` (and the pipeline's) rewrites a store's queues and index: never
    under a running writer, even one whose store has none yet."""
    store = tmp_path / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS)
    for command in (["reindex"], ["pipeline", "reindex"]):
        done = run_cli([*command, str(CLEAN), *FIXTURE_SIZE_ARGS, "--out", str(store)])
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr == (
            f"rmqstore: error: --out {store}: a running writer (pid {writer.proc.pid}) holds the store's lock "
            f"({store / 'lock'}); stop it first: nothing was written\n"
        )
    assert not (store / "consumequeue").exists() and not (store / "index").exists()
    writer.stop()
    # With the writer stopped, the same command writes its output there.
    done = run_cli(["reindex", str(CLEAN), *FIXTURE_SIZE_ARGS, "--out", str(store)])
    assert done.returncode == 0, done.stderr
    assert (store / "consumequeue").is_dir() and (store / "index").is_dir()
