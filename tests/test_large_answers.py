"""Large RocketMQ 5 answers are paced (``writer serve --large-answer-rate``): the token
bucket's bound, drawn by Hypothesis against a clock of the test's, and a real writer
process whose large receive and pull wait their turn while a small one does not."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from google.protobuf import duration_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from support.nodes import Nodes

from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.v1 import messages_pb2, writer_pb2
from rmqstore.writer.rocketmq5 import INLINE_READ_BYTES_MAX, LargeAnswers

RPC_TIMEOUT_S = 60.0
MIB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=300, deadline=None)
@given(
    rate=st.integers(1, 64 * MIB),
    calls=st.lists(st.tuples(st.floats(0, 3, allow_nan=False), st.integers(1, 16 * MIB)), min_size=1, max_size=40),
)
def test_paced_reads_never_pass_the_rate_plus_one_seconds_worth(rate: int, calls: list[tuple[float, int]]) -> None:
    """Over any stretch of time from one read to a later one, the bytes read (each at the
    moment its wait ends) are at most the rate times the stretch plus one second's worth,
    or plus the first read's own bytes where it is larger; reads are in the order asked;
    a read of a second's worth once the bucket has refilled does not wait."""
    clock = Clock()
    bucket = LargeAnswers(rate, clock)
    reads: list[tuple[float, int]] = []  # (the moment it reads, its bytes)
    for advance_s, size in calls:
        clock.now += advance_s
        wait_s = bucket.reserve(size)
        assert wait_s >= 0
        reads.append((clock.now + wait_s, size))
    assert reads == sorted(reads, key=lambda read: read[0])
    for first in range(len(reads)):
        taken = 0
        for last in range(first, len(reads)):
            taken += reads[last][1]
            stretch_s = reads[last][0] - reads[first][0]
            assert taken <= rate * stretch_s + max(rate, reads[first][1]) + 1e-6 * rate, (first, last)
    # Refilled: the last read's moment, plus a full second, has passed.
    clock.now = max(moment for moment, _ in reads) + 1.0
    assert bucket.reserve(rate) < 1e-9  # (but for rounding)


def test_unpaced_reads_never_wait() -> None:
    clock = Clock()
    bucket = LargeAnswers(0, clock)
    assert [bucket.reserve(size) for size in (16 * MIB, 16 * MIB, 1)] == [0.0, 0.0, 0.0]


def test_a_read_cancelled_while_it_waits_gives_its_bytes_back() -> None:
    """A call whose deadline passes (or whose client goes) while it waits its turn read
    nothing: the bytes it took are the next read's."""
    clock = Clock()
    bucket = LargeAnswers(MIB, clock)

    async def cancelled_then_another() -> float:
        waiting = asyncio.ensure_future(bucket.read(3 * MIB, _never_read))
        await asyncio.sleep(0.01)  # the read is waiting out its 2 s of debt
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            pass
        return bucket.reserve(MIB)

    assert asyncio.run(cancelled_then_another()) == 0.0  # the second's worth it took is back


async def _never_read() -> None:
    raise AssertionError("a cancelled read must not read")


def test_a_paced_bucket_waits_its_debt_out() -> None:
    clock = Clock()
    bucket = LargeAnswers(2 * MIB, clock)
    assert bucket.reserve(2 * MIB) == 0.0  # a second's worth at once
    assert bucket.reserve(3 * MIB) == 1.5  # then 3 MiB of debt at 2 MiB a second
    clock.now += 0.5
    assert bucket.reserve(MIB) == 1.5  # 2 MiB of debt left, then 1 more
    clock.now += 10.0
    assert bucket.reserve(MIB) == 0.0  # refilled, to a second's worth at most


BODY_BYTES = MIB
MESSAGES = 4
RATE_MIB = 1  # the writer's --large-answer-rate: a 4 MiB answer waits 3 s past the first second's worth


def _body(n: int) -> bytes:
    return bytes([n]) * BODY_BYTES


def test_large_answers_wait_for_the_rate_and_small_ones_do_not(nodes: Nodes, tmp_path: Path) -> None:
    writer = nodes.start("writer", tmp_path / "store", "--large-answer-rate", str(RATE_MIB))
    producer = nodes.writer(writer)
    for name in ("Big", "Small"):
        producer.CreateTopic(writer_pb2.CreateTopicRequest(name=name, queue_count=1), timeout=RPC_TIMEOUT_S)
    for n in range(MESSAGES):
        producer.Send(writer_pb2.SendRequest(message=messages_pb2.Message(topic="Big", queue_id=0, body=_body(n))), timeout=RPC_TIMEOUT_S)
    producer.Send(writer_pb2.SendRequest(message=messages_pb2.Message(topic="Small", queue_id=0, body=b"small")), timeout=RPC_TIMEOUT_S)
    assert MESSAGES * BODY_BYTES > INLINE_READ_BYTES_MAX  # the answers below are large ones
    stub = service_pb2_grpc.MessagingServiceStub(nodes.channel(writer))
    everything = v2.FilterExpression(type=v2.TAG, expression="*")

    def receive(topic: str, batch: int) -> list[bytes]:
        request = v2s.ReceiveMessageRequest(
            group=v2.Resource(name="readers"), message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
            filter_expression=everything, batch_size=batch, invisible_duration=duration_pb2.Duration(seconds=60),
            long_polling_timeout=duration_pb2.Duration(seconds=0),
        )  # fmt: skip
        return [a.message.body for a in stub.ReceiveMessage(request, timeout=RPC_TIMEOUT_S) if a.HasField("message")]

    def pull(topic: str, batch: int) -> list[bytes]:
        request = v2s.PullMessageRequest(
            group=v2.Resource(name="pullers"), message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
            offset=0, batch_size=batch, filter_expression=everything,
        )  # fmt: skip
        return [a.message.body for a in stub.PullMessage(request, timeout=RPC_TIMEOUT_S) if a.HasField("message")]

    for large in (receive, pull):
        got: list[bytes] = []
        started = time.monotonic()
        reader = threading.Thread(target=lambda: got.extend(large("Big", MESSAGES)))  # noqa: B023  # joined below
        reader.start()
        time.sleep(0.3)
        # A small answer takes no part in the pace: it comes while the large one waits.
        assert receive("Small", 1) if large is receive else pull("Small", 1)
        small_done_s = time.monotonic() - started
        reader.join(RPC_TIMEOUT_S)
        large_s = time.monotonic() - started
        assert got == [_body(n) for n in range(MESSAGES)], large.__name__
        # 4 MiB at 1 MiB a second: the bucket's second's worth at once, 3 s for the rest
        # (the pull's, after the receive's: its debt, and 4 s for its own).
        assert large_s >= 2.9, (large.__name__, large_s)
        assert small_done_s < large_s, (large.__name__, small_done_s, large_s)
