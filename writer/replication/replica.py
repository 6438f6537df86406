"""One replica of a writer group: its role, its epoch history and the primary it knows,
and the moves between roles. A follower refuses writes with an error naming the primary;
a primary takes them, holding each acknowledgement in its tracker (writer.replication.tracker)."""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import Callable

from rmqstore.common.errors import InvalidArgument, NotPrimary
from rmqstore.writer.consumers import ConsumerGroups
from rmqstore.writer.replication.epochs import Epoch, EpochHistory
from rmqstore.writer.replication.group import GroupOptions
from rmqstore.writer.replication.tracker import SyncTracker
from rmqstore.writer.store import Writer

log = logging.getLogger("rmqstore.writer.replication")


class Role(enum.Enum):
    PRIMARY = "primary"
    FOLLOWER = "follower"


class Replica:
    """A replica's state. Moves happen under :attr:`lock`, which a follower also holds
    while it applies the primary's bytes: no replicated byte lands once a move began."""

    def __init__(self, options: GroupOptions, writer: Writer, groups: ConsumerGroups):
        self.options = options
        self.writer = writer
        self.groups = groups
        self.history = EpochHistory(writer.config.store)
        self.tracker = SyncTracker(options, writer)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.role = Role.FOLLOWER
        self.primary_id = -1
        self.loop: asyncio.AbstractEventLoop | None = None
        # Told the primary's endpoint on every move (the RocketMQ 5 routes follow it).
        self.on_primary: list[Callable[[str], None]] = []
        # Told of a move (the follower's stream to an old primary is cancelled).
        self.on_move: list[Callable[[], None]] = []
        self.epoch_changes = 0
        self._refuse(self._not_primary())

    @property
    def epoch(self) -> int:
        last = self.history.last
        return last.epoch if last is not None else 0

    @property
    def primary_endpoint(self) -> str | None:
        return self.options.replicas.get(self.primary_id)

    def end_offset(self) -> int:
        return self.writer.log.write_offset or 0

    def _not_primary(self) -> NotPrimary:
        primary = self.primary_endpoint
        where = f"the primary is replica {self.primary_id} at {primary}" if primary else "no primary is known yet"
        return NotPrimary(
            f"replica {self.options.replica_id} of writer group {self.options.name} is a follower: {where}", primary=primary
        )

    def _refuse(self, refusal: NotPrimary | None) -> None:
        self.writer.refusal = refusal
        tracker, loop = self.tracker, self.loop
        if loop is None:
            tracker.refusal = refusal
        else:
            loop.call_soon_threadsafe(tracker.refuse, refusal)

    def become_primary(self, epoch: int) -> Epoch:
        """Take writes from the end of this replica's log, in a new epoch (written to the
        epoch file before any write is taken)."""
        with self.lock:
            if epoch <= self.epoch:
                raise InvalidArgument(f"epoch {epoch} is not past this replica's epoch {self.epoch}")
            self.writer.dispatch_replicated()  # the epoch starts at the end of a dispatched log
            started = Epoch(epoch, self.end_offset(), self.options.replica_id)
            self.history.append(started)
            self.writer.resume_writing()
            self.groups.lead()
            self.role = Role.PRIMARY
            self.primary_id = self.options.replica_id
            self.epoch_changes += 1
            self._refuse(None)
            self._moved()
        log.warning("replica %d is the primary of writer group %s: epoch %d from offset %d",
                    self.options.replica_id, self.options.name, epoch, started.start_offset)
        return started

    def become_follower(self, primary_id: int) -> None:
        """Refuse writes (naming the primary) and follow ``primary_id`` (-1: not known)."""
        with self.lock:
            if self.role is Role.FOLLOWER and self.primary_id == primary_id:
                return
            was_primary = self.role is Role.PRIMARY
            if was_primary:
                self.epoch_changes += 1
            self.role = Role.FOLLOWER
            self.primary_id = primary_id
            self.groups.follow()
            self._refuse(self._not_primary())
            self._moved()
        if was_primary:
            log.warning("replica %d of writer group %s steps down: the primary is replica %d",
                        self.options.replica_id, self.options.name, primary_id)

    def _moved(self) -> None:
        endpoint = self.primary_endpoint
        if endpoint is not None:
            for listener in self.on_primary:
                listener(endpoint)
        for moved in self.on_move:
            moved()
        self.changed.notify_all()

    def promote_manually(self) -> Epoch:
        """``writer promote`` (a group without etcd): primary in an epoch past every
        reachable replica's."""
        from rmqstore.writer.replication.follower import peer_statuses

        newest = max([self.epoch, *(status.epoch for status in peer_statuses(self).values())])
        return self.become_primary(newest + 1)
