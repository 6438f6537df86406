"""ReplicationService (protos/rmqstore/v1/replication.proto) on the writer's asyncio
server: a primary streams its commit log and config files to each follower; every
replica answers for its role; a group without etcd is failed over by Promote."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import grpc

from rmqstore.common.codec import columnar
from rmqstore.common.codec.columnar import WalkEnd
from rmqstore.common.errors import Corruption, InvalidArgument, OutOfRange
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.service.errors import StreamRefusal, abort_with_async, mapped_async
from rmqstore.v1 import replication_pb2, replication_pb2_grpc
from rmqstore.writer.replication.epochs import Epoch, consistent_end
from rmqstore.writer.replication.replica import Replica, Role

SERVICE_NAME = "rmqstore.v1.ReplicationService"
CHUNK_BYTES_MAX = 1024 * 1024
# Messages sent to a follower and not yet acknowledged, at most: while one is out, what
# the primary appends gathers into the next, so a follower's writes and fsyncs come in
# batches as large as the load makes them. One: a round costs both sides CPU per message
# sent, not per byte, and with two out the messages were half as large for the same
# acknowledgements (benchmarks/REPLICATION.md: 0.54x against 0.40x of a single node).
IN_FLIGHT_MAX = 1
IDLE_WAIT_S = 0.05
# Under load (SyncTracker.paced) a follower is sent at most one chunk every
# --replica-pace-ms: what is appended within that time of its last chunk waits and goes
# with its next. A round (a chunk out, its report back) costs both sides CPU per chunk,
# not per byte, and a follower that stores a chunk quickly would otherwise be sent more,
# smaller ones (benchmarks/REPLICATION.md: 64 one-message producers). Otherwise a chunk
# goes as soon as the follower is free, and so does one of PACE_BYTES_MAX or more (its
# round's cost is already small per byte: batches, as send --file's, are not held).
PACE_BYTES_MAX = 32 * 1024
FILES_CHECK_S = 0.2
# The files of config/ a follower takes from its primary: the consumer groups' progress
# (Apache's and ours), the topics and the groups' configuration (Apache's topics.json and
# subscriptionGroup.json), the scheduled messages' release progress and the transactions'
# check progress.
REPLICATED_FILES = (
    "consumerOffset.json", "consumerState.json", "topics.json", "subscriptionGroup.json", "delayOffset.json",
    "rmqstore-timers.json", "rmqstore-transactions.json",
)
# The consumer groups' progress: each snapshot's two files (writer.consumers), sent from
# memory as the primary's flush writes them, together, with the count of acknowledgements
# they hold (config_version); the rest when their files change.
PROGRESS_FILES = REPLICATED_FILES[:2]


def chunk_end(log: CommitLog, offset: int, end: int) -> int:
    """Where the bytes sent from ``offset`` stop: a record boundary at most about
    CHUNK_BYTES_MAX on, never past ``end`` (a record boundary) nor across a file (a
    file's BLANK is sent with the records before it)."""
    mapped = log.files.find(offset)
    if mapped is None:
        raise OutOfRange(f"commit log offset {offset} is not in this replica's log (retention deleted it?)")
    base = mapped.start_offset
    stop = min(end, mapped.end_offset)
    found = columnar.walk(mapped.buf, offset - base, stop=stop - base, rows_max=1 << 20, bytes_max=CHUNK_BYTES_MAX)
    if found.end is WalkEnd.BLANK:
        return mapped.end_offset
    if found.position > offset - base:
        return base + found.position
    raise Corruption(f"no record at commit log offset {offset} below the published end {end}", offset=offset)


def epoch_messages(epochs: list[Epoch]) -> list[replication_pb2.Epoch]:
    return [replication_pb2.Epoch(epoch=e.epoch, start_offset=e.start_offset, primary_id=e.primary_id) for e in epochs]


class ReplicationServicer(replication_pb2_grpc.ReplicationServiceServicer):
    def __init__(self, replica: Replica):
        self.replica = replica

    async def Replicate(
        self, request_iterator: AsyncIterator[replication_pb2.ReplicateRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[replication_pb2.ReplicateResponse]:
        replica = self.replica
        options, tracker, writer = replica.options, replica.tracker, replica.writer
        requests = request_iterator.__aiter__()
        first = await requests.__anext__()
        if first.group != options.name or first.replica_id not in options.peers:
            await abort_with_async(context, InvalidArgument(
                f"replica {first.replica_id} of group {first.group!r} is not a follower of this group ({options.name})"
            ))
            return
        if replica.role is not Role.PRIMARY:
            await abort_with_async(context, replica._not_primary())
            return
        history = replica.history.epochs
        theirs = [Epoch(first.last_epoch.epoch, first.last_epoch.start_offset, first.last_epoch.primary_id)] if first.HasField("last_epoch") else []
        start = first.start_offset
        if consistent_end(theirs, history, start, tracker.end_offset()) != start:
            await abort_with_async(context, InvalidArgument(
                f"replica {first.replica_id}'s log (to {start}, epoch {theirs[-1].epoch if theirs else 0}) is not a prefix "
                "of the primary's: it must truncate first"
            ))
            return
        if start < writer.log.min_offset:
            await abort_with_async(context, OutOfRange(f"offset {start} is below the primary's oldest ({writer.log.min_offset})"))
            return
        state = tracker.attach(first.replica_id, start)

        async def read_acks() -> None:
            async for request in requests:
                tracker.stored(state, request.stored_offset, request.config_version)

        loop = asyncio.get_running_loop()
        reader = loop.create_task(read_acks())
        sent_files: dict[str, tuple[int, int]] = {}
        files_checked = 0.0
        groups = replica.groups
        progress_sent = -1  # the groups' snapshots (ConsumerGroups.snapshots) sent so far
        pace_s = options.replica_pace_ms / 1000
        sent_at = loop.time() - pace_s  # when the last chunk was sent
        try:
            yield replication_pb2.ReplicateResponse(epochs=epoch_messages(history), primary_end_offset=tracker.end_offset())
            offset = start
            while replica.role is Role.PRIMARY and not reader.done():
                now = loop.time()
                end = tracker.end_offset()
                sendable = offset < end and len(state.in_flight) < IN_FLIGHT_MAX
                files: list[replication_pb2.ConfigFile] = []
                version = 0
                if groups.snapshots > progress_sent:
                    # An acknowledgement may wait for it: not held back by the pace.
                    progress_sent = groups.snapshots
                    version, files = self._progress_files()
                if not files and sendable and end - offset < PACE_BYTES_MAX and now < sent_at + pace_s and tracker.paced():
                    state.wake.clear()  # a group commit wakes it: the bytes may reach PACE_BYTES_MAX
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(sent_at + pace_s - now):
                            await state.wake.wait()
                    continue
                if now - files_checked >= FILES_CHECK_S:
                    files_checked = now
                    files += self._changed_files(sent_files)
                if sendable:
                    stop = chunk_end(writer.log, offset, end)
                    mapped = writer.log.files.find(offset)
                    assert mapped is not None
                    data = bytes(mapped.buf[offset - mapped.start_offset : stop - mapped.start_offset])
                    tracker.sent(state, stop)
                    sent_at = now
                    yield replication_pb2.ReplicateResponse(
                        offset=offset, data=data, primary_end_offset=end, files=files, config_version=version
                    )
                    offset = stop
                elif files:
                    yield replication_pb2.ReplicateResponse(offset=offset, primary_end_offset=end, files=files, config_version=version)
                else:
                    state.wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(IDLE_WAIT_S):  # a timer (wait_for would make a task a wait)
                            await state.wake.wait()
            refusal = reader.exception() if reader.done() and not reader.cancelled() else None
            if isinstance(refusal, StreamRefusal):  # a report that does not parse (service.guard)
                raise refusal
        finally:
            reader.cancel()
            tracker.detach(state)

    def _progress_files(self) -> tuple[int, list[replication_pb2.ConfigFile]]:
        """The consumer groups' newest snapshot (its count, its two files); before the
        first since this replica started, the files as they are (no flush has run, so
        none is being written)."""
        groups = self.replica.groups
        if groups.last_snapshot is not None:
            version, offsets, state = groups.last_snapshot
            contents = dict(zip(PROGRESS_FILES, (offsets, state), strict=True))
        else:
            version, contents = groups.snapshot_version, {}
            for name in PROGRESS_FILES:
                with contextlib.suppress(FileNotFoundError), open(os.path.join(groups.config_dir, name), "rb") as handle:
                    contents[name] = handle.read()
        return version, [replication_pb2.ConfigFile(name=name, content=content) for name, content in contents.items()]

    def _changed_files(self, sent: dict[str, tuple[int, int]]) -> list[replication_pb2.ConfigFile]:
        """The files of REPLICATED_FILES but the progress (sent after each flush) changed
        since ``sent`` names them."""
        config = self.replica.writer.paths.config
        changed = []
        for name in REPLICATED_FILES[len(PROGRESS_FILES):]:
            path = os.path.join(config, name)
            try:
                stat = os.stat(path)
                seen = (stat.st_mtime_ns, stat.st_size)
                if sent.get(name) == seen:
                    continue
                with open(path, "rb") as handle:
                    content = handle.read()
            except FileNotFoundError:
                continue
            sent[name] = seen
            changed.append(replication_pb2.ConfigFile(name=name, content=content))
        return changed

    @mapped_async
    async def ReplicaStatus(
        self, request: replication_pb2.ReplicaStatusRequest, context: grpc.aio.ServicerContext
    ) -> replication_pb2.ReplicaStatusResponse:
        replica = self.replica
        options, tracker = replica.options, replica.tracker
        followers = []
        if replica.role is Role.PRIMARY:
            end = tracker.end_offset()
            for state in tracker.followers.values():
                followers.append(replication_pb2.FollowerStatus(
                    replica_id=state.replica_id,
                    connected=state.connected,
                    stored_offset=state.stored_offset,
                    lag_bytes=max(end - state.stored_offset, 0),
                    lag_ms=tracker.lag_ms(state),
                    in_sync=state.replica_id in tracker.in_sync,
                ))  # fmt: skip
        return replication_pb2.ReplicaStatusResponse(
            group=options.name,
            replica_id=options.replica_id,
            role=replica.role.value,
            epoch=replica.epoch,
            end_offset=replica.end_offset(),
            primary_id=replica.primary_id,
            primary_endpoint=replica.primary_endpoint or "",
            replicas=options.replicas,
            followers=followers,
            replication=options.replication.value,
            min_insync=options.min_insync,
            epochs=epoch_messages(replica.history.epochs),
        )

    @mapped_async
    async def Promote(self, request: replication_pb2.PromoteRequest, context: grpc.aio.ServicerContext) -> replication_pb2.PromoteResponse:
        replica = self.replica
        if replica.options.etcd:
            raise InvalidArgument(f"writer group {replica.options.name} elects its primary through etcd: promote is for a group without --etcd")
        if replica.role is Role.PRIMARY:
            return replication_pb2.PromoteResponse(epoch=replica.epoch, start_offset=replica.history.epochs[-1].start_offset)
        promoted = await asyncio.get_running_loop().run_in_executor(None, replica.promote_manually)
        return replication_pb2.PromoteResponse(epoch=promoted.epoch, start_offset=promoted.start_offset)
