"""A primary paces its followers' streams while its event loop is busy
(``--replica-pace-ms``, writer.replication.service): in process, a real Writer behind a
real ReplicationService on 127.0.0.1, the test as the follower."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import grpc
import pytest
from support.stores import SMALL

from rmqstore.v1 import replication_pb2, replication_pb2_grpc
from rmqstore.writer.config import WriterConfig
from rmqstore.writer.consumers import ConsumerGroups
from rmqstore.writer.replication.group import GroupOptions, Replication
from rmqstore.writer.replication.replica import Replica
from rmqstore.writer.replication.service import PACE_BYTES_MAX, ReplicationServicer
from rmqstore.writer.replication.tracker import LOOP_BUSY_PACED, SyncTracker
from rmqstore.writer.store import Writer
from rmqstore.writer.validate import MessageInput

SENDS = 30
SEND_EVERY_S = 0.01
PACE_MS = 150


def _options(pace_ms: int) -> GroupOptions:
    return GroupOptions(
        name="g1", replica_id=0, replicas={0: "127.0.0.1:1", 1: "127.0.0.1:2"}, replication=Replication.SYNC, replica_pace_ms=pace_ms
    )


async def _chunks(store: Path, *, busy: bool, body_bytes: int = 10) -> tuple[list[tuple[float, int]], float]:
    """(when, records) of each chunk a follower is sent while one message of
    ``body_bytes`` a SEND_EVERY_S is appended, with the primary's loop seen busy all the
    time (its thread's CPU clock running with the wall clock) or never; the follower
    reports each chunk stored at once. And how long the appends took (SENDS *
    SEND_EVERY_S, or more on a loaded machine)."""
    writer = Writer(WriterConfig(store=str(store), sizes=SMALL))
    groups = ConsumerGroups(writer, writer.paths.config)
    replica = Replica(_options(PACE_MS), writer, groups)
    loop = asyncio.get_running_loop()
    replica.loop = loop
    replica.become_primary(1)
    tracker = replica.tracker
    tracker.cpu_clock = time.monotonic if busy else lambda: 0.0
    tracker.start()
    server = grpc.aio.server()
    replication_pb2_grpc.add_ReplicationServiceServicer_to_server(ReplicationServicer(replica), server)  # type: ignore[no-untyped-call]  # generated
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    chunks: list[tuple[float, int]] = []
    sent_s = 0.0
    try:
        await asyncio.sleep(0.2)  # a few ticks: the load is measured
        assert tracker.paced() is busy

        async def send() -> None:
            nonlocal sent_s
            began = loop.time()
            for n in range(SENDS):
                writer.append([MessageInput(topic="PaceTopic", body=(b"m%d-" % n).ljust(body_bytes, b"x"))])
                tracker.appended()
                await asyncio.sleep(SEND_EVERY_S)
            sent_s = loop.time() - began

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = replication_pb2_grpc.ReplicationServiceStub(channel).Replicate()  # type: ignore[no-untyped-call]  # generated
            await call.write(replication_pb2.ReplicateRequest(replica_id=1, group="g1", start_offset=0))
            assert (await call.read()).epochs  # the primary's history comes first
            sending = loop.create_task(send())
            while sum(records for _, records in chunks) < SENDS:
                response = await asyncio.wait_for(call.read(), 10)
                if response.data:
                    end = response.offset + len(response.data)
                    chunks.append((loop.time(), len(list(writer.log.records(response.offset, stop=end)))))
                    await call.write(replication_pb2.ReplicateRequest(stored_offset=end))
            await sending
            call.cancel()
    finally:
        await server.stop(None)
        tracker.stop()
        writer.close()
    return chunks, sent_s


def test_a_busy_primary_sends_a_follower_one_chunk_a_pace(tmp_path: Path) -> None:
    chunks, sent_s = asyncio.run(_chunks(tmp_path / "store", busy=True))
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(chunks)]
    assert all(gap >= PACE_MS / 1000 - 0.005 for gap in gaps), gaps
    # SENDS messages over sent_s, in chunks a pace apart.
    assert len(chunks) <= sent_s / (PACE_MS / 1000) + 2, (chunks, sent_s)
    assert max(records for _, records in chunks) > 1


def test_a_busy_primary_sends_a_follower_its_bytes_once_they_reach_pace_bytes_max(tmp_path: Path) -> None:
    """Records of 8 KiB: once four are waiting the bytes reach PACE_BYTES_MAX (32 KiB),
    long before the pace, and they go at once (a commit log file's end, every 64 KiB
    here, cuts a chunk short)."""
    chunks, _ = asyncio.run(_chunks(tmp_path / "store", busy=True, body_bytes=8 * 1024))
    assert PACE_BYTES_MAX == 32 * 1024
    assert max(records for _, records in chunks) <= 5, chunks
    assert len(chunks) >= SENDS // 5, chunks
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(chunks)]
    assert min(gaps) < PACE_MS / 1000 / 2, gaps


def test_a_primary_with_time_to_spare_sends_each_message_at_once(tmp_path: Path) -> None:
    chunks, _ = asyncio.run(_chunks(tmp_path / "store", busy=False))
    # Without the pace each message goes out as it is appended (a slow machine may join a few).
    assert len(chunks) >= SENDS // 2, chunks
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(chunks)]
    assert min(gaps) < PACE_MS / 1000 / 2, gaps


def test_the_load_is_the_share_of_time_the_loop_spends_on_cpu(tmp_path: Path) -> None:
    """Each tick takes the loop thread's CPU time over the wall time since the last one,
    averaged with what was measured before; paced from LOOP_BUSY_PACED, never with a
    pace of 0."""
    writer = Writer(WriterConfig(store=str(tmp_path / "store"), sizes=SMALL))
    try:
        readings = iter([0.0, 0.0])
        tracker = SyncTracker(_options(10), writer, clock=lambda: 0.0, cpu_clock=lambda: next(readings))
        assert tracker.loop_busy == 0.0 and not tracker.paced()
        tracker.measure_load(0.1, 0.08)  # busy 0.8 of the tick: (0 + 0.8) / 2
        assert tracker.loop_busy == pytest.approx(0.4) and not tracker.paced()
        tracker.measure_load(0.2, 0.16)  # 0.8 again: (0.4 + 0.8) / 2
        assert tracker.loop_busy == pytest.approx(0.6) and tracker.paced()
        tracker.measure_load(0.2, 0.3)  # no time passed: nothing measured
        assert tracker.loop_busy == pytest.approx(0.6)
        tracker.measure_load(0.4, 0.18)  # 0.1 of the last 0.2 s: (0.6 + 0.1) / 2
        assert tracker.loop_busy == pytest.approx(0.35) and not tracker.paced()
        assert LOOP_BUSY_PACED == 0.5
        unpaced = SyncTracker(_options(0), writer, clock=lambda: 0.0, cpu_clock=lambda: 0.0)
        unpaced.loop_busy = 1.0
        assert not unpaced.paced()
    finally:
        writer.close()
