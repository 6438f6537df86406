"""What an operator meets around the nodes, with real processes: a restart binds its port
at once after a kill, and a store is never deleted or reset while a process holds its lock."""

from __future__ import annotations

from pathlib import Path

from support.http import get
from support.nodes import Nodes
from support.wait import wait_until

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
    writer.kill()
    # The server's side of the connection waits out FIN-WAIT-2, then TIME-WAIT (a minute
    # on Linux), on the port.
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
    assert get(console.url + "/api/topics")[0] == 200
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
    writer.stop()
