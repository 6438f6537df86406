"""A SendStream appends up to SEND_STREAM_AHEAD requests ahead of its acks, which go back
in order; a request refused mid-stream ends it only after the acks of those before it.

In process: a real Writer and a writer group's primary (its SyncTracker is the group
commit's gate) behind real WriterService and ReplicationService servers on 127.0.0.1,
with the malformed-request guard; the test is the producer and the one follower, so it
decides when the primary may acknowledge (it reports the follower's bytes stored)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from support.stores import SMALL

from rmqstore.service.guard import AsyncMalformedRequestGuard
from rmqstore.v1 import (
    messages_pb2,
    replication_pb2,
    replication_pb2_grpc,
    writer_pb2,
    writer_pb2_grpc,
)
from rmqstore.writer.config import WriterConfig
from rmqstore.writer.consumers import ConsumerGroups
from rmqstore.writer.replication.group import GroupOptions, Replication
from rmqstore.writer.replication.replica import Replica
from rmqstore.writer.replication.service import ReplicationServicer
from rmqstore.writer.service import SEND_STREAM_AHEAD, WriterServicer
from rmqstore.writer.store import Writer

REQUESTS = 10
WAIT_S = 10.0
STILL_S = 0.3  # the primary's end offset unchanged this long: the stream reads no further


def _request(n: int, topic: str = "AheadTopic") -> bytes:
    message = messages_pb2.Message(topic=topic, queue_id=0, body=b"request-%d" % n)
    return writer_pb2.SendBatchRequest(messages=[message]).SerializeToString()


class _Primary:
    """A writer group's primary in this test's loop, acknowledging a send once follower 1
    (the test) reports its bytes stored (``--replication sync --min-insync 2``)."""

    def __init__(self, store: Path):
        self.writer = Writer(WriterConfig(store=str(store), sizes=SMALL))
        options = GroupOptions(
            name="g1", replica_id=0, replicas={0: "127.0.0.1:1", 1: "127.0.0.1:2"}, replication=Replication.SYNC, min_insync=2
        )
        self.replica = Replica(options, self.writer, ConsumerGroups(self.writer, self.writer.paths.config))
        self.writer_servicer = WriterServicer(self.writer)
        self.writer_servicer.appender.gate = self.replica.tracker
        self.server = grpc.aio.server(interceptors=[AsyncMalformedRequestGuard()])
        self.port = 0

    async def __aenter__(self) -> _Primary:
        self.replica.loop = asyncio.get_running_loop()
        self.replica.become_primary(1)
        self.replica.tracker.start()
        writer_pb2_grpc.add_WriterServiceServicer_to_server(self.writer_servicer, self.server)  # type: ignore[no-untyped-call]  # generated
        replication_pb2_grpc.add_ReplicationServiceServicer_to_server(ReplicationServicer(self.replica), self.server)  # type: ignore[no-untyped-call]  # generated
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.server.stop(None)
        self.replica.tracker.stop()
        self.writer_servicer.close()
        self.writer.close()

    def end_offset(self) -> int:
        return self.replica.tracker.end_offset()

    def bodies(self) -> list[bytes]:
        """The bodies of the records appended so far, in commit log order."""
        return [record.body for record in self.writer.log.records(0, stop=self.end_offset())]

    async def settled_end(self) -> int:
        """The primary's end offset once it has not moved for STILL_S."""
        loop = asyncio.get_running_loop()
        seen, since = -1, loop.time()
        deadline = loop.time() + WAIT_S
        while loop.time() < deadline:
            end = self.end_offset()
            if end != seen:
                seen, since = end, loop.time()
            elif end > 0 and loop.time() - since >= STILL_S:
                return end
            await asyncio.sleep(0.02)
        raise AssertionError(f"the primary's end offset never settled (at {seen})")


async def _follower(primary: _Primary, channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:  # type: ignore[type-arg]
    """Follower 1's stream, once the primary counts it in sync (sends are taken)."""
    call = replication_pb2_grpc.ReplicationServiceStub(channel).Replicate()  # type: ignore[no-untyped-call]  # generated
    await call.write(replication_pb2.ReplicateRequest(replica_id=1, group="g1", start_offset=0))
    assert (await call.read()).epochs  # the primary's history comes first
    async with asyncio.timeout(WAIT_S):
        while primary.replica.tracker.in_sync != {1}:
            await asyncio.sleep(0.01)
    return call


async def _produce(channel: grpc.aio.Channel, requests: list[bytes], acks: list[writer_pb2.SendBatchResponse]) -> grpc.StatusCode:
    """Stream ``requests`` (serialized), collecting the acks; the stream's status code."""
    call = channel.stream_stream("/rmqstore.v1.WriterService/SendStream", response_deserializer=writer_pb2.SendBatchResponse.FromString)

    async def sending() -> AsyncIterator[bytes]:
        for request in requests:
            yield request

    stream = call(sending(), timeout=WAIT_S * 3)
    async for ack in stream:
        acks.append(ack)
    return await stream.code()  # type: ignore[no-any-return]


async def _ahead(store: Path) -> tuple[list[int], list[int], list[writer_pb2.SendBatchResponse], list[bytes]]:
    """Send REQUESTS one-message requests while the follower reports nothing: how many
    records the primary has appended each time it stops reading, with the follower then
    reporting them stored, and how many acks the producer had then; the acks; the bodies
    in the commit log."""
    async with _Primary(store) as primary, grpc.aio.insecure_channel(f"127.0.0.1:{primary.port}") as channel:
        follower = await _follower(primary, channel)
        acks: list[writer_pb2.SendBatchResponse] = []
        producing = asyncio.get_running_loop().create_task(_produce(channel, [_request(n) for n in range(REQUESTS)], acks))
        appended_while_held = []
        acked_while_held = []
        while not producing.done():
            end = await primary.settled_end()
            appended_while_held.append(len(primary.bodies()))
            acked_while_held.append(len(acks))
            if appended_while_held[-1] == REQUESTS:
                break
            await follower.write(replication_pb2.ReplicateRequest(stored_offset=end))
            await asyncio.sleep(0)
        await follower.write(replication_pb2.ReplicateRequest(stored_offset=primary.end_offset()))
        assert await asyncio.wait_for(producing, WAIT_S) == grpc.StatusCode.OK
        follower.cancel()
        return appended_while_held, acked_while_held, acks, primary.bodies()


def test_a_stream_appends_its_requests_ahead_of_their_acks(tmp_path: Path) -> None:
    """With no ack possible, the primary appends exactly SEND_STREAM_AHEAD requests and
    reads no further; each confirmation lets the stream go on; every ack comes back in
    order, naming its own record."""
    appended, acked, acks, bodies = asyncio.run(_ahead(tmp_path / "store"))
    assert SEND_STREAM_AHEAD == 4
    # Four appended, none acknowledged; the follower confirms them: four acks, four more
    # read and appended; then the last two.
    assert appended == [4, 8, 10]
    assert acked == [0, 4, 8]
    assert bodies == [b"request-%d" % n for n in range(REQUESTS)]
    results = [result for ack in acks for result in ack.results]
    assert [r.commitlog_offset for r in results] == sorted(r.commitlog_offset for r in results)
    assert [r.queue_offset for r in results] == list(range(REQUESTS))


async def _refused(store: Path, bad: bytes) -> tuple[grpc.StatusCode, str, list[int], list[bytes]]:
    """Three good requests, then ``bad``, then a good one, while the follower reports
    nothing until the stream has stopped reading: the status, the acked queue offsets and
    the bodies appended."""
    async with _Primary(store) as primary, grpc.aio.insecure_channel(f"127.0.0.1:{primary.port}") as channel:
        follower = await _follower(primary, channel)
        call = channel.stream_stream("/rmqstore.v1.WriterService/SendStream", response_deserializer=writer_pb2.SendBatchResponse.FromString)
        requests = [_request(0), _request(1), _request(2), bad, _request(4)]

        async def sending() -> AsyncIterator[bytes]:
            for request in requests:
                yield request

        stream = call(sending(), timeout=WAIT_S * 3)
        acked: list[int] = []

        async def read() -> None:
            async for ack in stream:
                acked.extend(result.queue_offset for result in ack.results)

        reading = asyncio.get_running_loop().create_task(read())
        end = await primary.settled_end()
        # The bad request was read while its elders wait for the follower: nothing is
        # answered yet, and nothing past it is read.
        assert not acked and not reading.done()
        await follower.write(replication_pb2.ReplicateRequest(stored_offset=end))
        with pytest.raises(grpc.aio.AioRpcError):
            await asyncio.wait_for(reading, WAIT_S)
        follower.cancel()
        return await stream.code(), await stream.details(), acked, primary.bodies()


@pytest.mark.parametrize(
    ("bad", "code", "details"),
    [
        (b"\x80", grpc.StatusCode.INVALID_ARGUMENT, "malformed request: the bytes do not parse as rmqstore.v1.SendBatchRequest"),
        (
            _request(3, topic="bad topic"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "the topic 'bad topic' contains characters outside [%|a-zA-Z0-9_-]",
        ),
    ],
    ids=["malformed", "invalid-topic"],
)
def test_a_refused_request_ends_the_stream_after_the_acks_before_it(
    tmp_path: Path, bad: bytes, code: grpc.StatusCode, details: str
) -> None:
    status, text, acked, bodies = asyncio.run(_refused(tmp_path / "store", bad))
    assert status == code
    assert text == details
    assert acked == [0, 1, 2]
    assert bodies == [b"request-0", b"request-1", b"request-2"]


async def _report_then_garbage(store: Path) -> tuple[grpc.StatusCode, str]:
    """A follower whose second report does not parse: the primary's Replicate stream,
    which reads reports in a task of its own, ends with the guard's status."""
    async with _Primary(store) as primary, grpc.aio.insecure_channel(f"127.0.0.1:{primary.port}") as channel:
        call = channel.stream_stream("/rmqstore.v1.ReplicationService/Replicate", response_deserializer=replication_pb2.ReplicateResponse.FromString)
        stream = call(timeout=WAIT_S)
        await stream.write(replication_pb2.ReplicateRequest(replica_id=1, group="g1", start_offset=0).SerializeToString())
        assert (await stream.read()).epochs
        await stream.write(replication_pb2.ReplicateRequest(stored_offset=0).SerializeToString())
        await stream.write(b"\x0a\x05ab")
        with contextlib.suppress(grpc.aio.AioRpcError):  # how the stream ends is checked below
            while await stream.read() is not grpc.aio.EOF:
                pass
        return await stream.code(), await stream.details()


def test_a_follower_report_that_does_not_parse_ends_its_stream_with_invalid_argument(tmp_path: Path) -> None:
    assert asyncio.run(_report_then_garbage(tmp_path / "store")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "malformed request: the bytes do not parse as rmqstore.v1.ReplicateRequest",
    )
