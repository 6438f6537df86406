"""A follower's thread: find the primary, agree with its log (truncating durably past the
consistent point), then store the bytes and files it streams, reporting how far it has
stored after each. In a group without etcd the same thread finds the primary by asking
the peers, starts a new group's replica 0 as its primary, and makes a primary step down
when a peer was promoted past its epoch."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable

import grpc

from rmqstore.common.errors import NotPrimary, StoreError
from rmqstore.common.files.broker_config import GROUPS_FILE_NAME, TOPICS_FILE_NAME
from rmqstore.v1 import replication_pb2, replication_pb2_grpc
from rmqstore.writer.replication.epochs import Epoch, consistent_end
from rmqstore.writer.replication.replica import Replica, Role
from rmqstore.writer.replication.service import REPLICATED_FILES

log = logging.getLogger("rmqstore.writer.replication")

STATUS_TIMEOUT_S = 1.0
RETRY_S = 0.2
PEER_CHECK_S = 0.5
# Each channel to a peer connects afresh: grpc's process-wide subchannel pool would hand a
# new channel the backoff of an old one to a replica that was down (and is back now). Its
# HTTP/2 stream window is 8 MiB, not 64 KiB: a chunk (up to CHUNK_BYTES_MAX, one in
# flight) arrives without waiting for window updates (benchmarks/REPLICATION.md:
# `send --file`'s 400 KB chunks).
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1), ("grpc.http2.lookahead_bytes", 8 << 20))


def peer_statuses(replica: Replica) -> dict[int, replication_pb2.ReplicaStatusResponse]:
    """What each reachable peer says of itself."""
    answers = {}
    for replica_id, endpoint in replica.options.peers.items():
        with replica.options.peer_channel(endpoint, CHANNEL_OPTIONS) as channel:
            try:
                answers[replica_id] = replication_pb2_grpc.ReplicationServiceStub(channel).ReplicaStatus(  # type: ignore[no-untyped-call]  # generated
                    replication_pb2.ReplicaStatusRequest(), timeout=STATUS_TIMEOUT_S
                )
            except grpc.RpcError:
                continue
    return answers


def newest_primary(statuses: dict[int, replication_pb2.ReplicaStatusResponse]) -> tuple[int, int] | None:
    """(replica id, epoch) of the peer that is primary in the newest epoch, if any."""
    primaries = [(status.epoch, replica_id) for replica_id, status in statuses.items() if status.role == Role.PRIMARY.value]
    if not primaries:
        return None
    epoch, replica_id = max(primaries)
    return replica_id, epoch


def to_epochs(messages: Iterable[replication_pb2.Epoch]) -> list[Epoch]:
    return [Epoch(e.epoch, e.start_offset, e.primary_id) for e in messages]


class Follower:
    """The replica's replication thread (it runs whatever the role: a primary without
    etcd watches its peers with it)."""

    def __init__(self, replica: Replica, *, manual: bool):
        self.replica = replica
        self.manual = manual
        self._stopped = threading.Event()
        self._call: grpc.Future | None = None
        self._call_lock = threading.Lock()
        self.primary_end_offset = 0
        # The newest consumer-group progress stored from the current stream (its
        # config_version, reported back: the primary's acknowledgements wait for it).
        self.progress_version = 0
        self._thread = threading.Thread(target=self._run, name="replication", daemon=True)
        replica.on_move.append(self.interrupt)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self.interrupt()
        with self.replica.lock:
            self.replica.changed.notify_all()
        self._thread.join()

    def interrupt(self) -> None:
        """End the stream from the current primary (a move, or the stop)."""
        with self._call_lock:
            if self._call is not None:
                self._call.cancel()

    def _run(self) -> None:
        replica = self.replica
        while not self._stopped.is_set():
            try:
                if self.manual:
                    self._check_peers()
                if replica.role is Role.PRIMARY or replica.primary_id < 0:
                    with replica.lock:
                        replica.changed.wait(PEER_CHECK_S)
                    continue
                self._follow(replica.primary_id)
            except (grpc.RpcError, StoreError, OSError) as error:
                if self._stopped.is_set():
                    return
                log.info("replica %d: replication from replica %d stopped: %s", replica.options.replica_id, replica.primary_id, _describe(error))
                if self.manual and isinstance(error, (grpc.RpcError, NotPrimary)):
                    replica.become_follower(-1)  # ask the peers again
                self._stopped.wait(RETRY_S)

    def _check_peers(self) -> None:
        """Without etcd: follow the peer that is primary in the newest epoch; a new group's
        replica 0, or the replica that was primary last, leads when no peer does."""
        replica = self.replica
        if replica.role is Role.FOLLOWER and replica.primary_id >= 0:
            return
        found = newest_primary(peer_statuses(replica))
        if found is not None and (replica.role is Role.FOLLOWER or found[1] > replica.epoch):
            replica.become_follower(found[0])
            return
        if replica.role is Role.FOLLOWER and found is None:
            last = replica.history.last
            if (last is None and replica.options.replica_id == min(replica.options.replicas)) or (
                last is not None and last.primary_id == replica.options.replica_id
            ):
                replica.become_primary(replica.epoch + 1)

    def _follow(self, primary_id: int) -> None:
        replica = self.replica
        options, writer = replica.options, replica.writer
        endpoint = options.replicas[primary_id]
        with options.peer_channel(endpoint, CHANNEL_OPTIONS) as channel:
            stub = replication_pb2_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
            status = stub.ReplicaStatus(replication_pb2.ReplicaStatusRequest(), timeout=STATUS_TIMEOUT_S)
            if status.role != Role.PRIMARY.value:
                raise NotPrimary(f"replica {primary_id} at {endpoint} is not the primary")
            with replica.lock:
                if replica.role is not Role.FOLLOWER or replica.primary_id != primary_id:
                    return
                mine, end = replica.history.epochs, replica.end_offset()
                agreed = consistent_end(mine, to_epochs(status.epochs), end, status.end_offset)
                if agreed < end:
                    log.warning(
                        "replica %d truncates its commit log from %d to %d, where it agrees with the primary (replica %d)",
                        options.replica_id, end, agreed, primary_id,
                    )  # fmt: skip
                    writer.truncate_replica(agreed)
                last = replica.history.last
                first = replication_pb2.ReplicateRequest(
                    replica_id=options.replica_id, group=options.name, start_offset=replica.end_offset()
                )
                if last is not None:
                    first.last_epoch.CopyFrom(replication_pb2.Epoch(epoch=last.epoch, start_offset=last.start_offset, primary_id=last.primary_id))
            acks: queue.SimpleQueue[replication_pb2.ReplicateRequest | None] = queue.SimpleQueue()
            acks.put(first)
            self.progress_version = 0  # a version counts on one primary's stream only
            call = stub.Replicate(iter(acks.get, None))
            with self._call_lock:
                self._call = call
            if replica.role is not Role.FOLLOWER or replica.primary_id != primary_id or self._stopped.is_set():
                call.cancel()
            try:
                for response in call:
                    if not self._apply(primary_id, response, acks):
                        return
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.CANCELLED:
                    raise
            finally:
                acks.put(None)
                with self._call_lock:
                    self._call = None

    def _apply(
        self, primary_id: int, response: replication_pb2.ReplicateResponse, acks: queue.SimpleQueue[replication_pb2.ReplicateRequest | None]
    ) -> bool:
        """Store ``response``, report the offset stored (under the flush policy: fsynced
        under SYNC), then dispatch it; False if this replica no longer follows ``primary_id``.
        The report comes before the dispatch: recovery dispatches from the commit log
        whatever a crash leaves undispatched, and a move waits for the dispatch (the
        lock), so a promoted follower serves with every record dispatched."""
        replica = self.replica
        writer = replica.writer
        with replica.lock:
            if replica.role is not Role.FOLLOWER or replica.primary_id != primary_id:
                self.interrupt()
                return False
            if response.epochs:
                replica.history.replace(to_epochs(response.epochs))
            for file in response.files:
                if file.name in REPLICATED_FILES:
                    replica.groups.write_replicated(file.name, file.content)
                if file.name == TOPICS_FILE_NAME:
                    writer.reload_topics()  # routes answered here name the primary's topics
                if file.name == GROUPS_FILE_NAME:
                    writer.reload_subscription_groups()
            if response.files and response.config_version:
                self.progress_version = max(self.progress_version, response.config_version)
            if response.data:
                writer.write_replicated(response.offset, response.data)
            self.primary_end_offset = response.primary_end_offset
            acks.put(replication_pb2.ReplicateRequest(stored_offset=writer.sync_replicated(), config_version=self.progress_version))
            writer.dispatch_replicated()
        return True


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__
