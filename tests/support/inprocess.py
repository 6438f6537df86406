"""Nodes in the test's own process, served as ``writer serve`` and ``query serve`` serve
them: the writer's WriterService and RocketMQ 5 MessagingService sharing one group commit,
the query node's asyncio servicer, each on grpc's asyncio server (AsyncServing) on
127.0.0.1 port 0. A test reaches into them (the Writer, the StoreView, the interceptors'
counts), which a process node does not allow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from rmqstore.client.channels import open_channel
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.store import StoreSizes
from rmqstore.query.service import SERVICE_NAME as QUERY_SERVICE
from rmqstore.query.service import AsyncQueryServicer
from rmqstore.query.view import StoreView
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.acl import Acl
from rmqstore.service.limits import CallLimits
from rmqstore.service.server import AsyncServing
from rmqstore.v1 import query_pb2_grpc, writer_pb2_grpc
from rmqstore.writer.config import WriterConfig
from rmqstore.writer.rocketmq5 import SERVICE_NAME as MESSAGING_SERVICE
from rmqstore.writer.rocketmq5 import MessagingServicer, RouteConfig
from rmqstore.writer.rocketmq5 import acl_rules as messaging_acl_rules
from rmqstore.writer.service import SERVICE_NAME as WRITER_SERVICE
from rmqstore.writer.service import WriterServicer
from rmqstore.writer.store import Writer
from support.stores import GATEWAY_SIZES, SMALL


class WriterNode:
    """A writer node in this process. ``route`` is what MessagingService hands clients
    (default: this node's own port, as ``writer serve`` without --advertise);
    ``overrides`` are WriterConfig's fields."""

    def __init__(
        self,
        store: Path,
        *,
        sizes: StoreSizes = SMALL,
        route: RouteConfig | None = None,
        credentials: grpc.ServerCredentials | None = None,
        health_port: int | None = None,
        acl: Acl | None = None,
        stalled_write_s: float | None = None,
        **overrides: Any,
    ):
        self.store = store
        self.writer = Writer(WriterConfig(store=str(store), sizes=sizes, **overrides))
        self.servicer = WriterServicer(self.writer, **({} if stalled_write_s is None else {"stalled_write_s": stalled_write_s}))
        self.messaging = MessagingServicer(self.writer, self.servicer.appender, route or RouteConfig("127.0.0.1", 1))

        def register(server: grpc.aio.Server) -> None:
            writer_pb2_grpc.add_WriterServiceServicer_to_server(self.servicer, server)
            service_pb2_grpc.add_MessagingServiceServicer_to_server(self.messaging, server)

        try:
            self.serving = AsyncServing(
                register, [WRITER_SERVICE, MESSAGING_SERVICE], host="127.0.0.1", port=0, credentials=credentials,
                health_port=health_port, acl=acl, acl_rules=messaging_acl_rules(self.writer),
            )  # fmt: skip
        except BaseException:
            self.servicer.close()
            self.writer.close()
            raise
        if route is None:
            self.messaging.route = RouteConfig("127.0.0.1", self.serving.port)
        self.port = self.serving.port
        self.health_port = self.serving.health_port
        self.endpoint = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.endpoint) if credentials is None else None
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
        self.serving.call(self.messaging.end_streams())
        self.serving.stop(None)
        self.servicer.close()
        self.writer.close()


def gateway_node(store: Path, **options: Any) -> WriterNode:
    """A writer as the RocketMQ 5 tests use it: 1 MiB commit log files, advertising
    writer.example:8081 as broker-a. ``options`` are WriterNode's."""
    return WriterNode(store, **{"sizes": GATEWAY_SIZES, "route": RouteConfig("writer.example", 8081, "broker-a"), **options})


class QueryNode:
    """A query node in this process over ``root``. ``view_options`` are StoreView's."""

    def __init__(
        self,
        root: Path,
        sizes: StoreSizes = SMALL,
        *,
        stalled_write_s: float | None = None,
        limits: CallLimits | None = None,
        acl: Acl | None = None,
        **view_options: Any,
    ):
        self.view = StoreView(str(root), sizes, **view_options)
        servicer_options = {} if stalled_write_s is None else {"stalled_write_s": stalled_write_s}
        serving_options: dict[str, Any] = {} if limits is None else {"limits": limits}
        try:
            self.serving = AsyncServing(
                lambda s: query_pb2_grpc.add_QueryServiceServicer_to_server(AsyncQueryServicer(self.view, **servicer_options), s),
                [QUERY_SERVICE], host="127.0.0.1", port=0, credentials=None, health_port=None, acl=acl, **serving_options,
            )  # fmt: skip
        except BaseException:
            self.view.close()
            raise
        self.port = self.serving.port
        self.endpoint = f"127.0.0.1:{self.port}"
        self.channel = open_channel(self.endpoint)  # as the CLI opens it
        self.stub = query_pb2_grpc.QueryServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.serving.stop(None)
        self.view.close()
