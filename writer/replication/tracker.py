"""The primary's view of its followers: how far each has stored, which are in sync, and
the acknowledgements held until the in-sync replicas have the bytes (a GroupAppender's
gate). Everything here runs on the server's event loop.

A follower is in sync while it is connected and was caught up (it had stored everything
the primary had when its last bytes were read for it) within ``--replica-lag-max-ms``:
Kafka's rule. Under SYNC replication a record is acknowledged once every in-sync replica
holds it and the in-sync replicas, the primary included, are at least ``--min-insync``;
with fewer, sends are refused (:class:`NotInSync`). A follower that falls behind leaves
the set, so it holds acknowledgements back for at most that long.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rmqstore.common.errors import NotInSync, NotPrimary, StoreError
from rmqstore.writer.replication.group import GroupOptions
from rmqstore.writer.store import Writer

TICK_S = 0.05
# A held acknowledgement is refused once it has waited this long past the lag bound.
HOLD_GRACE_MS = 1000
# The followers' streams are paced (--replica-pace-ms) while the loop's thread is on CPU
# this share of the time or more: the primary's loop is then what bounds the group
# (benchmarks/REPLICATION.md), and each round it saves is CPU for more requests.
LOOP_BUSY_PACED = 0.5


@dataclass
class FollowerState:
    replica_id: int
    connected: bool = False
    stored_offset: int = 0
    caught_up_at: float = 0.0  # monotonic: when it last held all the primary had
    # Bytes sent, not yet acknowledged: their end → (the primary's end, monotonic time) when read.
    in_flight: dict[int, tuple[int, float]] = field(default_factory=dict)
    # The newest consumer-group progress it holds (a ConsumerGroups snapshot's count, as
    # sent on its stream): a consumer's acknowledgement waits for it (hold_progress).
    progress_version: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class SyncTracker:
    """The followers of a primary and its held acknowledgements (writer.group_commit.AckGate)."""

    def __init__(
        self,
        options: GroupOptions,
        writer: Writer,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ):
        self.options = options
        self.writer = writer
        self.clock = clock
        self.followers: dict[int, FollowerState] = {k: FollowerState(k) for k in options.peers}
        self.in_sync: set[int] = set()
        # Held acknowledgements: (commit log end, consumer progress version, deadline, release).
        self._held: list[tuple[int, int, float, Callable[[BaseException | None], None]]] = []
        # Why this replica takes no writes (not the primary), None while it is the primary.
        self.refusal: StoreError | None = None
        self._ticking: asyncio.TimerHandle | None = None
        self.in_sync_changes = 0
        # The share of the time the loop's thread spends on CPU (smoothed over the
        # ticks): the load that paces the followers' streams.
        self.cpu_clock = cpu_clock
        self.loop_busy = 0.0
        self._ticked, self._ticked_cpu = clock(), cpu_clock()
        # With etcd (writer.replication.election): the monotonic time this primary stops
        # acknowledging unless its lease is renewed, and the in-sync set last written
        # there (followers only). A follower dropped from the set here keeps holding
        # acknowledgements back until etcd no longer names it: it may be elected.
        self.fence_until: float | None = None
        self.persisted_in_sync: set[int] | None = None

    def start(self) -> None:
        """On the loop: the ticks start, and the load is measured on this thread."""
        self._ticked, self._ticked_cpu = self.clock(), self.cpu_clock()
        self._ticking = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def stop(self) -> None:
        if self._ticking is not None:
            self._ticking.cancel()

    # The primary's end

    def end_offset(self) -> int:
        last = self.writer.publisher.last
        return last.dispatched_offset if last is not None else 0

    # Followers

    def attach(self, replica_id: int, start_offset: int) -> FollowerState:
        state = self.followers[replica_id]
        state.connected = True
        state.stored_offset = start_offset
        state.progress_version = 0
        state.in_flight.clear()
        self._caught_up(state, self.clock())
        return state

    def detach(self, state: FollowerState) -> None:
        state.connected = False
        state.in_flight.clear()
        self._refresh()

    def sent(self, state: FollowerState, end: int) -> None:
        state.in_flight[end] = (self.end_offset(), self.clock())

    def stored(self, state: FollowerState, offset: int, progress_version: int = 0) -> None:
        state.stored_offset = max(state.stored_offset, offset)
        state.progress_version = max(state.progress_version, progress_version)
        for end in [e for e in state.in_flight if e <= offset]:
            primary_end, read_at = state.in_flight.pop(end)
            if offset >= primary_end:
                state.caught_up_at = max(state.caught_up_at, read_at)
        self._caught_up(state, self.clock())
        self._refresh()
        self._release()
        state.wake.set()  # room for the next bytes

    def _caught_up(self, state: FollowerState, now: float) -> None:
        if state.stored_offset >= self.end_offset():
            state.caught_up_at = now

    def lag_ms(self, state: FollowerState) -> int:
        if not state.connected:
            return -1
        if state.stored_offset >= self.end_offset():
            return 0
        return int((self.clock() - state.caught_up_at) * 1000)

    def _refresh(self) -> None:
        now = self.clock()
        lag_max_s = self.options.replica_lag_max_ms / 1000
        in_sync = set()
        for state in self.followers.values():
            if state.connected:
                self._caught_up(state, now)
                if now - state.caught_up_at <= lag_max_s:
                    in_sync.add(state.replica_id)
        if in_sync != self.in_sync:
            self.in_sync = in_sync
            self.in_sync_changes += 1

    def _tick(self) -> None:
        self._refresh()
        self._release()
        now = self.clock()
        self.measure_load(now, self.cpu_clock())
        if self._held and self._held[0][2] <= now:  # held in the order of their deadlines
            expired = [h for h in self._held if h[2] <= now]
            self._held = [h for h in self._held if h[2] > now]
            error = NotInSync(
                f"not acknowledged: fewer than --min-insync {self.options.min_insync} replicas stored it within "
                f"{self.options.replica_lag_max_ms + HOLD_GRACE_MS} ms (in sync: {self.in_sync_text()})"
            )
            for *_, release in expired:
                release(error)
        self._ticking = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def measure_load(self, now: float, cpu: float) -> None:
        """Take the loop thread's CPU time ``cpu`` at ``now`` (on the loop, each tick)."""
        if now > self._ticked:
            busy = (cpu - self._ticked_cpu) / (now - self._ticked)
            self.loop_busy = (self.loop_busy + busy) / 2
            self._ticked, self._ticked_cpu = now, cpu

    def paced(self) -> bool:
        """Whether a follower is sent at most one chunk every ``--replica-pace-ms``: while
        the loop is busy LOOP_BUSY_PACED of the time or more. Rounds cost the loop CPU
        per chunk, not per byte; a loop with time to spare sends each follower its bytes
        as soon as it is free."""
        return self.options.replica_pace_ms > 0 and self.loop_busy >= LOOP_BUSY_PACED

    def in_sync_text(self) -> str:
        return ", ".join(str(k) for k in sorted({self.options.replica_id, *self.in_sync}))

    # The gate (writer.group_commit.AckGate)

    def _fenced(self) -> NotPrimary | None:
        if self.fence_until is not None and self.clock() >= self.fence_until:
            return NotPrimary(
                f"replica {self.options.replica_id} could not renew its etcd lease in time: it acknowledges nothing "
                "until it knows whether it is still the primary"
            )
        return None

    def persist_in_sync(self, followers: set[int]) -> None:
        """etcd now names these followers in sync (on the loop)."""
        self.persisted_in_sync = followers
        self._release()

    def check_writable(self) -> None:
        if self.refusal is not None:
            raise self.refusal
        fenced = self._fenced()
        if fenced is not None:
            raise fenced
        if self.options.waits_for_followers and len(self.in_sync) + 1 < self.options.min_insync:
            raise NotInSync(
                f"sends are refused: {len(self.in_sync) + 1} of the group's replicas are in sync "
                f"({self.in_sync_text()}), fewer than --min-insync {self.options.min_insync}"
            )

    def appended(self) -> None:
        """New bytes: a follower with nothing in flight is sent them now (or at the
        pace: :meth:`paced`); one waiting for its last bytes' acknowledgement is woken
        by it (:meth:`stored`), not by every group commit meanwhile."""
        for state in self.followers.values():
            if state.connected and not state.in_flight:
                state.wake.set()

    def progress_taken(self) -> None:
        """A snapshot of the consumer groups' progress was taken: every follower's stream
        sends it now."""
        for state in self.followers.values():
            if state.connected:
                state.wake.set()

    def confirmed_offset(self) -> int:
        """Below this the commit log may be acknowledged: every in-sync follower holds it
        (-1 while fewer than --min-insync replicas are in sync)."""
        if len(self.in_sync) + 1 < self.options.min_insync:
            return -1
        members = self.in_sync | (self.persisted_in_sync or set())
        return min((self.followers[k].stored_offset for k in members), default=self.end_offset())

    def confirmed_progress(self) -> int:
        """The consumer-group progress every in-sync follower holds (-1 while fewer than
        --min-insync replicas are in sync): as :meth:`confirmed_offset`."""
        if len(self.in_sync) + 1 < self.options.min_insync:
            return -1
        members = self.in_sync | (self.persisted_in_sync or set())
        return min((self.followers[k].progress_version for k in members), default=sys.maxsize)

    def _confirmed(self, end_offset: int, progress_version: int) -> bool:
        return self.confirmed_offset() >= end_offset and (progress_version == 0 or self.confirmed_progress() >= progress_version)

    def hold(self, end_offset: int, release: Callable[[BaseException | None], None], progress_version: int = 0) -> None:
        refusal = self.refusal or self._fenced()
        if refusal is not None:
            release(refusal)
        elif not self.options.waits_for_followers or self._confirmed(end_offset, progress_version):
            release(None)
        else:
            deadline = self.clock() + (self.options.replica_lag_max_ms + HOLD_GRACE_MS) / 1000
            self._held.append((end_offset, progress_version, deadline, release))

    def hold_progress(self, version: int, release: Callable[[BaseException | None], None]) -> None:
        """A consumer's acknowledgement (writer.rocketmq5.ProgressGate): held until the
        in-sync replicas hold the groups' progress of ``version`` and the commit log to its
        end now (a message acknowledged is on every replica that may be elected)."""
        self.hold(self.end_offset(), release, version)

    def _release(self) -> None:
        if not self._held:
            return
        fenced = self._fenced()
        if fenced is not None:
            self.refuse_held(fenced)
            return
        confirmed, progress = self.confirmed_offset(), self.confirmed_progress()
        done = [h for h in self._held if h[0] <= confirmed and h[1] <= progress]
        if done:
            self._held = [h for h in self._held if not (h[0] <= confirmed and h[1] <= progress)]
            for *_, release in done:
                release(None)

    def refuse(self, refusal: StoreError | None) -> None:
        """Take no writes (``refusal`` says why) or take them again (None); what is held
        is refused."""
        self.refusal = refusal
        if refusal is not None:
            self.refuse_held(refusal)

    def refuse_held(self, refusal: StoreError) -> None:
        held, self._held = self._held, []
        for *_, release in held:
            release(refusal)
