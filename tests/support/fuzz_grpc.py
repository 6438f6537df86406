"""The gRPC fuzz tests' parts (tests/test_fuzz_grpc_writer.py, _query.py, _gateway.py, a
module a node so that .ci/run's workers, which take a module each, run them side by side):
Hypothesis strategies for well-formed messages with arbitrary field values (drawn from each
request type's descriptor) and arbitrary bytes; the nodes, in-process, on 127.0.0.1; and the
check that every answer is OK or one of the documented codes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore.rocketmq_v2 import definition_pb2, service_pb2
from rmqstore.v1 import messages_pb2, query_pb2, writer_pb2
from support.inprocess import QueryNode, WriterNode, gateway_node

# Requests a method (the writer's, the query node's and the writer's RocketMQ 5 gateway's):
# 1,000 unless FUZZ_EXAMPLES says otherwise; a release runs 10,000 (README.md, "Set-up").
# What each count costs: benchmarks/CI.md.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1000"))
# Requests a Hypothesis example: its engine's cost an example (seeding, the choice tree,
# mutations) was over half of this test's CPU at one request each (benchmarks/CI.md).
PER_EXAMPLE = 10
RPC_TIMEOUT_S = 10.0
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
# Topics a fuzzed writer call may name: a few, so that the writer's topics and queues stay
# few (a store's descriptor and queue budget is not what this test is about).
TOPICS = st.sampled_from(["TopicA", "TopicB", "", "bad topic", "%RETRY%g", "x" * 128])

_SCALARS: dict[int, Any] = {
    FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_SFIXED32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=True),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True),
    FieldDescriptor.TYPE_STRING: st.text(max_size=80),
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=256),
    FieldDescriptor.TYPE_ENUM: st.integers(-(2**31), 2**31 - 1),
}


def _value(field: FieldDescriptor, depth: int, writer: bool) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return fields_of(field.message_type, depth + 1, writer)
    if writer and field.name in ("topic", "name"):
        return TOPICS
    if writer and field.name == "queue_count":
        return st.integers(-(2**31), 8)
    if field.name in ("topic", "name", "key", "uniq_key", "msg_id"):
        return st.one_of(st.text(max_size=40), st.sampled_from(["TopicA", "k", "AC110001000078308DB1745D00000001"]))
    if field.name in ("queue_id",):
        return st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-2, 8))
    return _SCALARS[field.type]


def fields_of(descriptor: Descriptor, depth: int = 0, writer: bool = False) -> Any:
    """A strategy for dicts of a message's fields (a field absent or set; repeated fields
    and maps of up to three)."""
    if depth > 2:
        return st.just({})
    parts = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            parts[field.name] = st.dictionaries(_value(key, depth, writer), _value(value, depth, writer), max_size=3)
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            parts[field.name] = st.lists(_value(field, depth, writer), max_size=3)
        else:
            parts[field.name] = _value(field, depth, writer)
    return st.fixed_dictionaries({}, optional=parts)


def build(descriptor: Descriptor, message_class: Any, values: dict[str, Any]) -> Any:
    message = message_class()
    _fill(message, values)
    return message


def _fill(message: Any, values: dict[str, Any]) -> None:
    for name, value in values.items():
        field = message.DESCRIPTOR.fields_by_name[name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(message, name).update(value)
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                for item in value:
                    _fill(getattr(message, name).add(), item)
            else:
                getattr(message, name).extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            _fill(getattr(message, name), value)
            getattr(message, name).SetInParent()
        else:
            setattr(message, name, value)


def payloads(method: Any, writer: bool) -> Any:
    """Serialized requests: well-formed with fuzzed values, or arbitrary bytes."""
    message_class = _class_of(method.input_type)
    structured = fields_of(method.input_type, writer=writer).map(
        lambda values: build(method.input_type, message_class, values).SerializeToString()
    )
    return st.one_of(structured, st.binary(max_size=200))


def _class_of(descriptor: Descriptor) -> Any:
    for module in (writer_pb2, query_pb2, messages_pb2, service_pb2, definition_pb2):
        found = getattr(module, descriptor.name, None)
        if found is not None and found.DESCRIPTOR.full_name == descriptor.full_name:
            return found
    raise LookupError(descriptor.full_name)


def call(channel: grpc.Channel, path: str, method: Any, payload: bytes) -> grpc.StatusCode:
    try:
        if method.client_streaming:
            responses = channel.stream_stream(path)(iter([payload, payload]), timeout=RPC_TIMEOUT_S)
            list(responses)
        elif method.server_streaming:
            for _ in zip(range(100), channel.unary_stream(path)(payload, timeout=RPC_TIMEOUT_S)):
                pass
        else:
            channel.unary_unary(path)(payload, timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as error:
        return error.code()  # type: ignore[attr-defined,no-any-return]
    return grpc.StatusCode.OK


# The writer's caps on topics, queues and consumer groups, set low so that fuzzed calls
# meet them (RESOURCE_EXHAUSTED on rmqstore.v1, TOO_MANY_REQUESTS in a v2 status).
CAPS = {"max_topics": 3, "max_queues": 8}
GROUPS_MAX = 3


class Nodes:
    def __init__(self, root: Path):
        self.writer: WriterNode = WriterNode(root / "store", auto_create_queue_count=2, default_queue_count=2, **CAPS)
        self.writer.stub.SendBatch(
            writer_pb2.SendBatchRequest(
                messages=[messages_pb2.Message(topic="TopicA", keys=["k"], body=b"seed") for _ in range(20)]
            ),
            timeout=RPC_TIMEOUT_S,
        )
        self.writer.writer.flush_thoroughly()
        self.query = QueryNode(root / "store")
        self.query_channel = self.query.channel
        # The writer's RocketMQ 5 gateway (apache.rocketmq.v2.MessagingService), on a store of its own.
        # TopicA takes every message type, so that fuzzed sends reach past the topic checks.
        self.gateway = gateway_node(
            root / "gateway-store", topics={"TopicA": (2, "MIXED")}, auto_create_queue_count=2, default_queue_count=2, **CAPS
        )
        self.gateway.messaging.consumers.max_groups = GROUPS_MAX

    def close(self) -> None:
        self.gateway.close()
        self.query.close()
        self.writer.close()


def methods(module: Any) -> list[Any]:
    """``(service, method)`` parameters for every method of a generated module's services,
    each named by its method."""
    return [
        pytest.param(service.full_name, method, id=method.name)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


def fuzz(channel: grpc.Channel, service: str, method: Any, on_writer: bool) -> None:
    """EXAMPLES Hypothesis-generated requests to one method: every answer OK or documented,
    and the arbitrary bytes among them refused as INVALID_ARGUMENT."""
    path = f"/{service}/{method.name}"
    seen: dict[grpc.StatusCode, int] = {}

    @settings(max_examples=-(-EXAMPLES // PER_EXAMPLE), deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(payloads(method, on_writer), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
    def some(batch: list[bytes]) -> None:
        for payload in batch:
            code = call(channel, path, method, payload)
            seen[code] = seen.get(code, 0) + 1
            assert code in DOCUMENTED, f"{path}: {code} for {payload!r}"

    some()
    assert sum(seen.values()) >= EXAMPLES
    assert grpc.StatusCode.INVALID_ARGUMENT in seen  # the arbitrary bytes reached the guard
