"""A writer group replica's gauges (docs/observability.md, Metrics; read when the SDK
collects), carrying the group and the replica's id."""

from __future__ import annotations

from rmqstore.service.metrics import gauge
from rmqstore.writer.replication.follower import Follower
from rmqstore.writer.replication.replica import Replica, Role


def _lag_bytes(replica: Replica, follower: Follower) -> int:
    """A follower's bytes behind its primary; a primary's furthest connected follower's."""
    if replica.role is Role.FOLLOWER:
        return max(follower.primary_end_offset - replica.end_offset(), 0)
    tracker = replica.tracker
    end = tracker.end_offset()
    return max((end - s.stored_offset for s in tracker.followers.values() if s.connected), default=0)


def _lag_ms(replica: Replica) -> int:
    tracker = replica.tracker
    if replica.role is Role.FOLLOWER:
        return 0
    return max((tracker.lag_ms(s) for s in tracker.followers.values() if s.connected), default=0)


def watch_replica(replica: Replica, follower: Follower) -> None:
    attributes: dict[str, str | int] = {"rmqstore.group": replica.options.name, "rmqstore.replica": replica.options.replica_id}
    gauge("rmqstore.replication.lag", "By", "a follower's bytes behind its primary; on a primary, its furthest follower's").watch(
        replica, attributes, lambda r: _lag_bytes(r, follower)
    )
    gauge("rmqstore.replication.lag.time", "ms", "on a primary: its furthest follower's time since it was caught up").watch(
        replica, attributes, _lag_ms
    )
    gauge("rmqstore.replication.in_sync", "{replica}", "on a primary: the replicas in sync, itself included (0 on a follower)").watch(
        replica, attributes, lambda r: len(r.tracker.in_sync) + 1 if r.role is Role.PRIMARY else 0
    )
    gauge("rmqstore.replication.epoch", "1", "the replica's epoch").watch(replica, attributes, lambda r: r.epoch)
    gauge(
        "rmqstore.replication.loop.busy", "1", "on a primary: the share of time its event loop is on CPU (from 0.5 its followers are paced)"
    ).watch(replica, attributes, lambda r: round(r.tracker.loop_busy, 3) if r.role is Role.PRIMARY else 0.0)
    gauge("rmqstore.replication.role_changes", "{change}", "moves to primary or to follower since the start").watch(
        replica, attributes, lambda r: r.epoch_changes
    )
