"""Hypothesis-driven sequences of calls against a query node under an ACL, with limits
drawn for each sequence: held streams of two users, their unary lookups, health Watch
streams that need no credentials, and streams read to their end. Every call is admitted or
refused exactly as docs/security.md states the node's limits (the node's streams, the
streams without credentials, and each principal's streams and calls in flight), with the
documented message and reason, and a finished stream gives its slot back."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support.acl import ACL, SECRETS
from support.inprocess import QueryNode, WriterNode

from rmqstore.client.signing import signing_channel
from rmqstore.service.errors import REASON_KEY
from rmqstore.service.limits import CallLimits, ServerLimits
from rmqstore.service.listen import ListenOptions
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc, writer_pb2

# Sequences of calls, each against a node of its own (about a second each): 25 in CI, 250
# for a release (FUZZ_EXAMPLES=10000).
SEQUENCES = max(10, int(os.environ.get("FUZZ_EXAMPLES", "1000")) // 40)
RPC_TIMEOUT_S = 30.0
USERS = ("reader", "local")
# Records of TopicA's queue 0: more than flow control lets a stream send unread (the
# callers' channels do not grow their window), so a stream whose caller reads one record
# stays open.
RECORDS = 1000
FIXED_WINDOW = [("grpc.http2.bdp_probe", 0)]
STREAM = query_pb2.StreamByTimeRequest(topic="TopicA", queue_id=0, begin_ms=0, end_ms=2**62)
BOUNDS = query_pb2.QueueBoundsRequest(topic="TopicA", queue_id=0)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("limits")
    writer = WriterNode(root / "store")
    try:
        batch = [messages_pb2.Message(topic="TopicA", queue_id=0, body=b"s" * 1024) for _ in range(RECORDS)]
        writer.stub.SendBatch(writer_pb2.SendBatchRequest(messages=batch), timeout=RPC_TIMEOUT_S)
        writer.writer.flush_thoroughly()
    finally:
        writer.close()
    (root / "acl.yaml").write_text(ACL)
    return root


def refusal(call: Any) -> tuple[str, str] | None:
    """None when ``call()`` is answered; (reason, message) when it is RESOURCE_EXHAUSTED."""
    try:
        call()
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (error.code(), error.details())  # type: ignore[attr-defined]
        reasons = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
        return reasons[REASON_KEY], error.details()  # type: ignore[attr-defined]
    return None


class Limits(RuleBasedStateMachine):
    """The node's counts as docs/security.md states them, beside the node."""

    root: Path

    def __init__(self) -> None:
        super().__init__()
        self.node: QueryNode | None = None
        self.channels: list[grpc.Channel] = []
        self.held: list[tuple[str, Any]] = []  # (user, an open StreamByTime)
        self.watches: list[Any] = []
        self.watches_tried = 0

    @initialize(
        streams=st.integers(1, 5), unauthenticated=st.integers(1, 3), principal_streams=st.integers(1, 4),
        principal_calls=st.integers(1, 4),
    )  # fmt: skip
    def start(self, streams: int, unauthenticated: int, principal_streams: int, principal_calls: int) -> None:
        self.limits = CallLimits(streams, unauthenticated, principal_streams, principal_calls)
        self.node = QueryNode(
            self.root / "store", listen=ListenOptions(acl=str(self.root / "acl.yaml")), limits=ServerLimits(calls=self.limits)
        )
        self.stubs = {}
        for user in USERS:
            channel = grpc.insecure_channel(self.node.endpoint, options=FIXED_WINDOW)
            self.channels.append(channel)
            self.stubs[user] = query_pb2_grpc.QueryServiceStub(signing_channel(channel, user, SECRETS[user]))
        anonymous = grpc.insecure_channel(self.node.endpoint)
        self.channels.append(anonymous)
        self.health = health_pb2_grpc.HealthStub(anonymous)

    def streams_of(self, user: str) -> int:
        return sum(1 for holder, _ in self.held if holder == user)

    def expected_for_stream(self, user: str) -> tuple[str, str] | None:
        limits = self.limits
        if len(self.held) >= limits.streams_max:
            return "TooManyStreams", f"{limits.streams_max} streams are open, this node's limit: retry later"
        if self.streams_of(user) >= limits.principal_streams_max:
            return "TooManyStreams", f"User:{user} has {limits.principal_streams_max} streams open, the limit of one caller: retry later"
        return self.expected_for_call(user)

    def expected_for_call(self, user: str) -> tuple[str, str] | None:
        if self.streams_of(user) >= self.limits.principal_calls_max:
            return "TooManyCalls", f"User:{user} has {self.limits.principal_calls_max} calls in flight, the limit of one caller: retry later"
        return None

    @rule(user=st.sampled_from(USERS))
    def open_stream(self, user: str) -> None:
        expected = self.expected_for_stream(user)
        call = self.stubs[user].StreamByTime(STREAM, timeout=RPC_TIMEOUT_S)
        first: list[Any] = []
        got = refusal(lambda: first.append(next(call)))
        assert got == expected, (got, expected)
        if expected is None:
            assert first[0].topic == "TopicA" and first[0].queue_offset == 0
            self.held.append((user, call))

    @rule(user=st.sampled_from(USERS))
    def lookup(self, user: str) -> None:
        answers: list[Any] = []
        expected = self.expected_for_call(user)
        assert refusal(lambda: answers.append(self.stubs[user].QueueBounds(BOUNDS, timeout=RPC_TIMEOUT_S))) == expected
        if expected is None:
            assert answers[0].max_offset == RECORDS

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def finish_stream(self, data: st.DataObject) -> None:
        """Reads a held stream to its end: the node counts it out before the caller sees the end."""
        _, call = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        assert 1 + sum(1 for _ in call) == RECORDS

    @precondition(lambda self: self.watches_tried <= self.limits.unauthenticated_streams_max + 1)
    @rule()
    def watch(self) -> None:
        self.watches_tried += 1
        allowed = self.limits.unauthenticated_streams_max
        expected = None
        if len(self.watches) >= allowed:
            expected = ("TooManyStreams", f"{allowed} streams without credentials (health Watch) are open, this node's limit for them: retry later")
        call = self.health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
        first: list[Any] = []
        assert refusal(lambda: first.append(next(call))) == expected
        if expected is None:
            assert first[0].status == health_pb2.HealthCheckResponse.SERVING
            self.watches.append(call)

    @invariant()
    def health_checks_answer(self) -> None:
        """Streams at their limits take nothing from a unary call without credentials."""
        if self.node is not None:
            answer = self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

    def teardown(self) -> None:
        for _, call in self.held:
            call.cancel()
        for call in self.watches:
            call.cancel()
        for channel in self.channels:
            channel.close()
        if self.node is not None:
            self.node.close()


@pytest.mark.slow
def test_fuzzed_call_sequences_meet_the_documented_limits(store: Path) -> None:
    Limits.root = store
    run_state_machine_as_test(
        Limits,
        settings=settings(
            max_examples=SEQUENCES, stateful_step_count=12, deadline=None, database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )  # fmt: skip
