"""An ACL with a user per kind of rule, and a writer and query node in this process under
it (the ``guarded`` fixture); how a refusal reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from rmqstore.client.signing import signing_channel
from rmqstore.service.errors import REASON_KEY
from rmqstore.service.listen import ListenOptions
from rmqstore.v1 import query_pb2_grpc, writer_pb2_grpc
from support.inprocess import QueryNode, WriterNode

ACL = """
users:
  - accessKey: ops
    secretKey: ops-secret-1
    userType: Super
  - accessKey: orders
    secretKey: orders-secret-1
  - accessKey: reader
    secretKey: reader-secret-1
  - accessKey: remote
    secretKey: remote-secret-1
  - accessKey: local
    secretKey: local-secret-1
acls:
  - subject: User:orders
    policies:
      - resource: ["Topic:orders-*"]
        actions: [Pub, Sub, Create]
        decision: Allow
      - resource: Topic:orders-secret
        actions: [Pub, Sub]
        decision: Deny
  - subject: User:reader
    policies:
      - resource: ["Topic:*", "Cluster"]
        actions: [Sub, Get, List]
  - subject: User:remote
    policies:
      - resource: ["Topic:*"]
        actions: [Sub]
        sourceIps: ["10.0.0.0/8"]
  - subject: User:local
    policies:
      - resource: ["Topic:*"]
        actions: [Sub]
        sourceIps: ["127.0.0.1/32", "::1/128"]
"""
SECRETS = {"ops": "ops-secret-1", "orders": "orders-secret-1", "reader": "reader-secret-1", "remote": "remote-secret-1", "local": "local-secret-1"}


class Guarded:
    """A writer and a query node of one store, in this process, both under the ACL."""

    def __init__(self, root: Path, acl_path: Path):
        listen = ListenOptions(acl=str(acl_path))
        self.writer_node = WriterNode(root, listen=listen)
        self.writer = self.writer_node.writer
        self.writer_serving = self.writer_node.serving
        try:
            self.query_node = QueryNode(root, listen=listen)
        except BaseException:
            self.writer_node.close()
            raise
        self.view = self.query_node.view
        self.query_serving = self.query_node.serving
        self.channels: list[grpc.Channel] = []

    def _channel(self, port: int, user: str | None) -> grpc.Channel:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.channels.append(channel)
        return channel if user is None else signing_channel(channel, user, SECRETS[user])

    def writer_as(self, user: str | None) -> writer_pb2_grpc.WriterServiceStub:
        return writer_pb2_grpc.WriterServiceStub(self._channel(self.writer_serving.port, user))

    def query_as(self, user: str | None) -> query_pb2_grpc.QueryServiceStub:
        return query_pb2_grpc.QueryServiceStub(self._channel(self.query_serving.port, user))

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        self.query_node.close()
        self.writer_node.close()


def status_of(call: Any) -> tuple[grpc.StatusCode, str, str | None]:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    error: Any = raised.value
    return error.code(), error.details(), dict(error.trailing_metadata() or ()).get(REASON_KEY)


def denied(subject: str, action: str, resource: str) -> tuple[grpc.StatusCode, str, str]:
    return grpc.StatusCode.PERMISSION_DENIED, f"{subject} may not {action} {resource}", "Denied"
