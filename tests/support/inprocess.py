"""Nodes in the test's own process, built by rmqstore.writer.node and rmqstore.query.node
from their options as ``writer serve`` and ``query serve`` build them, on 127.0.0.1 port 0.
A test reaches into them (the Writer, the StoreView, the interceptors' counts), which a
process node does not allow."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import grpc

from rmqstore.client.channels import open_channel
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.store import RequestedSizes, StoreSizes
from rmqstore.query import node as query_node
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.v1 import query_pb2_grpc, writer_pb2_grpc
from rmqstore.writer import node as writer_node
from support.stores import GATEWAY_SIZES, SMALL

# The store host a test's records carry, whichever port its node serves on: two nodes
# given the same messages store the same bytes.
STORE_HOST = "127.0.0.1:10911"


def requested(sizes: StoreSizes) -> RequestedSizes:
    return RequestedSizes(**dataclasses.asdict(sizes))


class WriterNode:
    """A writer node in this process. ``options`` are WriterOptions' fields; unlike
    ``writer serve``'s defaults, the store host is STORE_HOST and the periodic flushes and
    retention are off (``background``): a test flushes and runs retention itself."""

    def __init__(self, store: Path, *, sizes: StoreSizes = SMALL, **options: Any):
        self.store = store
        options = {"store_host": STORE_HOST, "background": False, **options}
        self.node = writer_node.WriterNode.start(writer_node.WriterOptions(store=str(store), sizes=requested(sizes), **options))
        self.writer = self.node.writer
        self.servicer = self.node.servicer
        self.messaging = self.node.messaging
        self.serving = self.node.serving
        self.port = self.node.port
        self.health_port = self.node.health_port
        self.endpoint = self.node.endpoint
        # Plaintext nodes only: a TLS node's test opens its channel with its certificates.
        self.channel = grpc.insecure_channel(self.endpoint) if self.node.listen.tls_cert is None else None
        self.stub = writer_pb2_grpc.WriterServiceStub(self.channel) if self.channel is not None else None
        self.v2 = service_pb2_grpc.MessagingServiceStub(self.channel) if self.channel is not None else None

    def records(self) -> list[Any]:
        """Every record in the commit log, after a flush."""
        self.writer.flush_thoroughly()
        log = CommitLog(str(self.store / "commitlog"), self.writer.config.sizes.commitlog_file_size_bytes)
        try:
            return list(log.records())
        finally:
            log.close()

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.node.stop(0)  # open calls are cut short, as the test ends


def gateway_node(store: Path, topics: dict[str, tuple[int, str]] | None = None, **options: Any) -> WriterNode:
    """A writer as the RocketMQ 5 tests use it: 1 MiB commit log files, advertising
    writer.example:8081 as broker-a, receives as short as 1 s invisible (Apache's 10 s
    minimum makes tests of redelivery slow), with ``topics`` (name: queue count, message
    type) made as updateTopic makes them (the gateway creates none). ``options`` are
    WriterNode's."""
    defaults = {"sizes": GATEWAY_SIZES, "advertise": "writer.example:8081", "broker_name": "broker-a", "consumer_min_invisible_ms": 1000}
    node = WriterNode(store, **{**defaults, **options})
    for name, (queue_count, message_type) in (topics or {}).items():
        node.writer.topics.create(name, queue_count, message_type)
    return node


class QueryNode:
    """A query node in this process over ``root``. ``options`` are QueryOptions' fields."""

    def __init__(self, root: Path, sizes: StoreSizes = SMALL, **options: Any):
        self.node = query_node.QueryNode.start(query_node.QueryOptions(store=str(root), sizes=requested(sizes), **options))
        self.view = self.node.view
        self.serving = self.node.serving
        self.port = self.node.port
        self.endpoint = self.node.endpoint
        self.channel = open_channel(self.endpoint)  # as the CLI opens it
        self.stub = query_pb2_grpc.QueryServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.node.stop(0)  # open calls are cut short, as the test ends
