"""Nodes built from options in the test's own process (writer.node, query.node), as
``writer serve`` and ``query serve`` build them: port 0 reports the bound port, a message
sent to the writer is found through the query node, and a stop is clean (the next start
recovers nothing). Options are checked before the store is touched."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest

from rmqstore.client import QueryClient, WriterClient, connect
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.store import RequestedSizes
from rmqstore.query.node import QueryNode, QueryOptions
from rmqstore.service.listen import ListenOptions, is_loopback
from rmqstore.v1 import messages_pb2, query_pb2
from rmqstore.writer.config import FlushPolicy
from rmqstore.writer.node import WriterNode, WriterOptions

SIZES = RequestedSizes(commitlog_file_size_bytes=65536, cq_file_units=50, index_slots=17, index_entries=200)


def test_a_writer_and_a_query_node_from_options(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with WriterNode.start(WriterOptions(store=str(store), sizes=SIZES, flush=FlushPolicy.SYNC)) as writer:
        assert writer.port > 0 and writer.endpoint == f"127.0.0.1:{writer.port}"
        line = writer.serving_line()
        assert (line["event"], line["service"], line["port"], line["flush"]) == ("serving", "writer", writer.port, "sync")
        # Port 0 without a store host: records carry the port the node serves on.
        assert writer.config.store_host == f"127.0.0.1:{writer.port}"
        assert line["advertise"] == f"127.0.0.1:{writer.port}"
        with WriterClient(connect(writer.endpoint), writer.endpoint) as client:
            sent = client.send(messages_pb2.Message(topic="Wired", body=b"hello", keys=["k1"]))
        with QueryNode.start(QueryOptions(store=str(store), sizes=SIZES)) as query:
            assert query.port > 0 and query.port != writer.port
            assert query.serving_line()["visibleOffset"] == sent.size
            lookups = QueryClient(connect(query.endpoint), 10.0)
            try:
                found = lookups.call("QueryByKey", query_pb2.QueryByKeyRequest(topic="Wired", key="k1", page_size=10))
                assert [m.body for m in found.messages] == [b"hello"]
            finally:
                lookups.close()
        query.stop()  # a second stop does nothing
        lookups = QueryClient(grpc.insecure_channel(query.endpoint), 2.0)
        try:
            with pytest.raises(grpc.RpcError) as stopped:
                lookups.call("Ping", query_pb2.PingRequest())
            assert stopped.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            lookups.close()
    with WriterNode.start(WriterOptions(store=str(store), sizes=SIZES)) as again:
        recovered = again.serving_line()["recovered"]
        assert recovered["uncleanShutdown"] is False and recovered["endOffset"] == sent.size


def test_a_writers_store_is_a_store_before_its_first_message(tmp_path: Path) -> None:
    """A writer that has stored nothing has made neither the commit log's directory nor a
    checkpoint, only its abort file: a query node serves that store (visible offset 0),
    and the writer takes it again after a stop."""
    store = tmp_path / "store"
    with WriterNode.start(WriterOptions(store=str(store), sizes=SIZES)):
        assert not (store / "commitlog").exists() and not (store / "checkpoint").exists()
        with QueryNode.start(QueryOptions(store=str(store), sizes=SIZES)) as query:
            assert query.serving_line()["visibleOffset"] == 0
    with WriterNode.start(WriterOptions(store=str(store), sizes=SIZES)) as again:
        assert again.serving_line()["recovered"]["endOffset"] == 0

def test_options_are_checked_before_the_store_is_created(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidArgument, match=f"--port {port}: cannot listen on 127.0.0.1"):
            WriterNode.start(WriterOptions(store=str(store), listen=ListenOptions(port=port)))
    with pytest.raises(InvalidArgument, match=r"--host 0\.0\.0\.0 is not a loopback address"):
        WriterNode.start(WriterOptions(store=str(store), listen=ListenOptions(host="0.0.0.0")))
    with pytest.raises(InvalidArgument, match="give --tls-cert and --tls-key together"):
        QueryNode.start(QueryOptions(store=str(tmp_path), listen=ListenOptions(tls_cert=str(tmp_path / "cert.pem"))))
    with pytest.raises(InvalidArgument, match=r"--store .*: no such directory"):
        QueryNode.start(QueryOptions(store=str(store)))
    assert not store.exists()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("localhost", True), ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
     ("0.0.0.0", False), ("::", False), ("[::]", False), ("10.0.0.1", False), ("example.com", False)],
)  # fmt: skip
def test_the_loopback_rule_of_every_listener(host: str, loopback: bool) -> None:
    """What a node's --host and the console's --host count as reachable from this machine
    only (service.listen.is_loopback, the one rule both use): IPv6 with or without
    brackets, a name other than localhost never (it may resolve anywhere)."""
    assert is_loopback(host) is loopback
