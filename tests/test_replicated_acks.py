"""Under SYNC replication a consumer's acknowledgement is answered once the in-sync
replicas hold the groups' progress that has it: a failover never delivers an acknowledged
message again (docs/replication.md, "Across a failover").

In process: a real Writer, a writer group's primary (``--replication sync --min-insync 2``)
with its RocketMQ 5 gateway, WriterService and ReplicationService on 127.0.0.1, the
groups' progress flushed only every minute; the test is the consumer and the one
follower, so it decides when the follower reports the progress stored."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from google.protobuf import duration_pb2
from support.stores import SMALL

from rmqstore.common.files.consumer_offsets import parse_offsets
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.v1 import (
    messages_pb2,
    replication_pb2,
    replication_pb2_grpc,
    writer_pb2,
    writer_pb2_grpc,
)
from rmqstore.writer.config import WriterConfig
from rmqstore.writer.consumers import ConsumerGroups, parse_state
from rmqstore.writer.replication.group import GroupOptions, Replication
from rmqstore.writer.replication.replica import Replica
from rmqstore.writer.replication.service import ReplicationServicer
from rmqstore.writer.replication.tracker import HOLD_GRACE_MS
from rmqstore.writer.rocketmq5 import MessagingServicer, RouteConfig
from rmqstore.writer.service import WriterServicer
from rmqstore.writer.store import Writer

TOPIC, GROUP = "AckTopic", "readers"
WAIT_S = 10.0
LAG_MAX_MS = 400
FLUSH_INTERVAL_MS = 60_000  # an acknowledgement must not wait for the timer
STILL_S = 0.3


class _Primary:
    def __init__(self, store: Path):
        self.writer = Writer(WriterConfig(store=str(store), sizes=SMALL))
        self.writer.topics.create(TOPIC, 1)
        options = GroupOptions(
            name="g1", replica_id=0, replicas={0: "127.0.0.1:1", 1: "127.0.0.1:2"},
            replication=Replication.SYNC, min_insync=2, replica_lag_max_ms=LAG_MAX_MS,
        )  # fmt: skip
        self.groups = ConsumerGroups(self.writer, self.writer.paths.config, flush_interval_ms=FLUSH_INTERVAL_MS)
        self.replica = Replica(options, self.writer, self.groups)
        self.writer_servicer = WriterServicer(self.writer)
        tracker = self.replica.tracker
        self.writer_servicer.appender.gate = tracker
        self.messaging = MessagingServicer(self.writer, self.writer_servicer.appender, RouteConfig("127.0.0.1", 1), self.groups)
        self.groups.replicated = True
        self.messaging.progress_taken.append(tracker.progress_taken)
        self.messaging.progress_gate = tracker
        self.server = grpc.aio.server()
        self.port = 0

    async def __aenter__(self) -> _Primary:
        self.replica.loop = asyncio.get_running_loop()
        self.replica.become_primary(1)
        self.replica.tracker.start()
        await self.messaging.start_flushing()
        writer_pb2_grpc.add_WriterServiceServicer_to_server(self.writer_servicer, self.server)  # type: ignore[no-untyped-call]  # generated
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.messaging, self.server)  # type: ignore[no-untyped-call]  # generated
        replication_pb2_grpc.add_ReplicationServiceServicer_to_server(ReplicationServicer(self.replica), self.server)  # type: ignore[no-untyped-call]  # generated
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.messaging.end_streams()
        await self.server.stop(None)
        self.replica.tracker.stop()
        self.writer_servicer.close()
        self.writer.close()


class _Follower:
    """Follower 1's stream: it reports every byte stored at once, and the groups' progress
    only up to :attr:`reporting` (the newest it was sent, once that is None)."""

    def __init__(self, primary: _Primary, channel: grpc.aio.Channel):
        self.primary = primary
        self.call = replication_pb2_grpc.ReplicationServiceStub(channel).Replicate()  # type: ignore[no-untyped-call]  # generated
        self.stored = 0
        self.progress: list[tuple[int, dict[str, bytes]]] = []  # (config_version, files) as sent
        self.reporting: int | None = 0
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.call.write(replication_pb2.ReplicateRequest(replica_id=1, group="g1", start_offset=0))
        assert (await self.call.read()).epochs
        self._reader = asyncio.get_running_loop().create_task(self._read())
        async with asyncio.timeout(WAIT_S):
            while self.primary.replica.tracker.in_sync != {1}:
                await asyncio.sleep(0.01)

    async def _read(self) -> None:
        while (response := await self.call.read()) is not grpc.aio.EOF:
            if response.data:
                self.stored = response.offset + len(response.data)
            files = {f.name: f.content for f in response.files}
            if "consumerState.json" in files:
                self.progress.append((response.config_version, files))
            await self.report()

    def newest(self) -> int:
        return max((version for version, _ in self.progress), default=0)

    async def report(self) -> None:
        version = self.newest() if self.reporting is None else min(self.reporting, self.newest())
        await self.call.write(replication_pb2.ReplicateRequest(stored_offset=self.stored, config_version=version))

    def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self.call.cancel()


async def _receive(stub: service_pb2_grpc.MessagingServiceStub) -> v2.Message:
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name=GROUP), message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=1,
        invisible_duration=duration_pb2.Duration(seconds=60), long_polling_timeout=duration_pb2.Duration(seconds=0),
    )  # fmt: skip
    messages = [a.message async for a in stub.ReceiveMessage(request, timeout=WAIT_S) if a.HasField("message")]
    assert len(messages) == 1
    return messages[0]


def _ack_request(message: v2.Message) -> v2s.AckMessageRequest:
    entry = v2s.AckMessageEntry(message_id=message.system_properties.message_id, receipt_handle=message.system_properties.receipt_handle)
    return v2s.AckMessageRequest(group=v2.Resource(name=GROUP), topic=v2.Resource(name=TOPIC), entries=[entry])


def _committed(files: dict[str, bytes]) -> tuple[int, int]:
    """The group's committed offset of queue 0 in the progress files sent: Apache's file's
    and our state file's."""
    table = parse_offsets(files["consumerOffset.json"].decode())
    [queue] = [q for q in parse_state(files["consumerState.json"].decode())["queues"] if q["group"] == GROUP]
    return table[(TOPIC, GROUP)][0], queue["committed"]


async def _scenario(store: Path) -> dict[str, object]:
    seen: dict[str, object] = {}
    async with _Primary(store) as primary, grpc.aio.insecure_channel(f"127.0.0.1:{primary.port}") as channel:
        follower = _Follower(primary, channel)
        await follower.start()
        producer = writer_pb2_grpc.WriterServiceStub(channel)
        consumer = service_pb2_grpc.MessagingServiceStub(channel)
        for n in range(2):
            message = messages_pb2.Message(topic=TOPIC, queue_id=0, body=b"m%d" % n)
            await producer.Send(writer_pb2.SendRequest(message=message), timeout=WAIT_S)
        loop = asyncio.get_running_loop()

        # 1. The first message's ack: the progress holding it goes to the follower at once
        # (not at the minute's flush), and the answer waits for the follower's report.
        first = await _receive(consumer)
        started = loop.time()
        acking = asyncio.ensure_future(consumer.AckMessage(_ack_request(first), timeout=WAIT_S))
        async with asyncio.timeout(WAIT_S):
            while not follower.progress or follower.newest() < primary.groups.version:
                await asyncio.sleep(0.01)
        seen["sent_after_s"] = loop.time() - started
        seen["sent_committed"] = _committed(follower.progress[-1][1])
        await asyncio.sleep(STILL_S)
        seen["answered_before_report"] = acking.done()
        follower.reporting = None
        await follower.report()
        answer = await asyncio.wait_for(acking, WAIT_S)
        seen["first"] = (answer.status.code, [e.status.code for e in answer.entries])

        # 2. The second message's ack, the follower never reporting it: refused once the
        # hold runs out, with the status a send gets; taken again later, it is answered OK.
        second = await _receive(consumer)
        follower.reporting = follower.newest()
        started = loop.time()
        answer = await consumer.AckMessage(_ack_request(second), timeout=WAIT_S)
        seen["refused_after_s"] = loop.time() - started
        seen["refused"] = (answer.status.code, answer.entries[0].status.code, answer.entries[0].status.message)
        follower.reporting = None
        await follower.report()
        answer = await consumer.AckMessage(_ack_request(second), timeout=WAIT_S)
        seen["again"] = (answer.status.code, answer.entries[0].status.code)
        seen["final_committed"] = _committed(follower.progress[-1][1])
        follower.stop()
    return seen


def test_an_acknowledgement_is_answered_once_the_follower_holds_it(tmp_path: Path) -> None:
    seen = asyncio.run(_scenario(tmp_path / "store"))
    # Sent on the acknowledgement, not at the flush interval (60 s).
    assert seen["sent_after_s"] < WAIT_S  # type: ignore[operator]
    # The files sent commit the first message (offset 1), in both files alike.
    assert seen["sent_committed"] == (1, 1)
    assert seen["answered_before_report"] is False
    assert seen["first"] == (v2.OK, [v2.OK])
    # Refused after --replica-lag-max-ms + HOLD_GRACE_MS, with HA_NOT_AVAILABLE and why.
    code, entry_code, message = seen["refused"]  # type: ignore[misc]
    assert (code, entry_code) == (v2.HA_NOT_AVAILABLE, v2.HA_NOT_AVAILABLE)
    assert message == (
        f"not acknowledged: fewer than --min-insync 2 replicas stored it within {LAG_MAX_MS + HOLD_GRACE_MS} ms (in sync: 0, 1)"
    )
    assert (LAG_MAX_MS + HOLD_GRACE_MS) / 1000 <= seen["refused_after_s"] < WAIT_S  # type: ignore[operator]
    assert seen["again"] == (v2.OK, v2.OK)
    assert seen["final_committed"] == (2, 2)

