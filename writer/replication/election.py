"""The primary's election through etcd v3 (docs/replication.md: "Election").

The primary holds a lease and, attached to it, the group's key
``/rmqstore/groups/<group>/primary`` (created only if absent: etcd's transaction). Its
epoch is the key's create revision, which etcd makes grow with every term. It keeps the
lease alive every TTL/3, and **stops acknowledging at the time it sent its last
successful keep-alive + TTL - margin**: etcd cannot expire the lease before it received that
keep-alive + TTL, so the old primary is fenced before the key can be granted to another.

The primary writes its in-sync set to ``/rmqstore/groups/<group>/insync`` (without a
lease: it outlives the primary) before it acknowledges anything a replica leaving the set
lacks (writer.replication.tracker: ``persisted_in_sync``). Only a replica named there
campaigns, so a new primary holds every acknowledged record. The set named never shrinks
below --min-insync: while fewer replicas are in sync nothing is acknowledged, so those
named still hold every acknowledged record and stay eligible (Kafka's eligible leader
replicas, KIP-966); a new primary keeps the set it was elected from until --min-insync
replicas are in sync in its own term.

The client is etcd3gw (OpenStack's, maintained): it speaks etcd's HTTP/JSON gateway, which
every etcd v3 serves, so no generated stubs or protobuf version of etcd's own are needed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import etcd3gw
import requests

from rmqstore.common.transport import parse_endpoint
from rmqstore.writer.replication.replica import Replica, Role

log = logging.getLogger("rmqstore.writer.replication")

POLL_S = 0.2
REQUEST_TIMEOUT_S = 1.0
# The primary stops acknowledging this share of the TTL before the lease could expire:
# room for its clock to run slow against etcd's and for the loop to see the deadline.
FENCE_MARGIN_SHARE = 0.2


def primary_key(group: str) -> str:
    return f"/rmqstore/groups/{group}/primary"


def in_sync_key(group: str) -> str:
    return f"/rmqstore/groups/{group}/insync"


class EtcdElection:
    """A replica's election thread: campaigns while no replica holds the key (if it is in
    the in-sync set), follows the holder, keeps its lease alive while primary."""

    def __init__(self, replica: Replica):
        self.replica = replica
        options = replica.options
        self.clients = []
        for member in options.etcd:
            host, port = parse_endpoint(member)
            self.clients.append(etcd3gw.client(host=host, port=port, timeout=REQUEST_TIMEOUT_S))
        self._client_at = 0
        self.key = primary_key(options.name)
        self.in_sync_key = in_sync_key(options.name)
        self.ttl_s = options.lease_ttl_s
        self.margin_s = max(self.ttl_s * FENCE_MARGIN_SHARE, 0.5)
        self._lease: Any = None
        self._published: frozenset[int] | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="election", daemon=True)
        replica.tracker.persisted_in_sync = set()

    @property
    def client(self) -> Any:
        return self.clients[self._client_at % len(self.clients)]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop campaigning and renewing (the lease runs on until :meth:`release`)."""
        self._stopped.set()
        self._thread.join()

    def release(self) -> None:
        """Revoke the lease of a primary whose store is closed: a clean stop hands the
        group over at once rather than after the TTL."""
        if self._lease is None or self.replica.role is not Role.PRIMARY:
            return
        try:
            self._lease.revoke()
        except (etcd3gw.exceptions.Etcd3Exception, requests.RequestException) as error:
            log.info("revoking the lease failed (it expires by itself): %s", error)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                if self.replica.role is Role.PRIMARY:
                    self._keep_leading()
                else:
                    self._follow_or_campaign()
            except (etcd3gw.exceptions.Etcd3Exception, requests.RequestException, ValueError, KeyError) as error:
                log.info("etcd at %s: %s", self.replica.options.etcd[self._client_at % len(self.clients)], error)
                self._client_at += 1
                self._fence_if_due()
            self._stopped.wait(POLL_S)

    def _fence_if_due(self) -> None:
        tracker = self.replica.tracker
        if self.replica.role is Role.PRIMARY and tracker.fence_until is not None and time.monotonic() >= tracker.fence_until:
            log.warning("replica %d lost etcd for its lease's TTL: it steps down", self.replica.options.replica_id)
            self.replica.become_follower(-1)

    def _holder(self) -> int | None:
        found = self.client.get(self.key)
        if not found:
            return None
        return int(json.loads(found[0])["replicaId"])

    def _follow_or_campaign(self) -> None:
        replica = self.replica
        holder = self._holder()
        if holder is not None:
            if holder != replica.options.replica_id:
                replica.become_follower(holder)
            return
        named = self._named_in_sync()
        if named is None and replica.history.last is not None:
            return  # the group had a primary, which named no set: none is known to hold everything
        if named is not None and replica.options.replica_id not in named:
            return
        sent = time.monotonic()  # before the grant: etcd's TTL runs from a moment after it
        lease = self.client.lease(self.ttl_s)
        value = json.dumps({"replicaId": replica.options.replica_id, "endpoint": replica.options.endpoint})
        if not self.client.create(self.key, value, lease=lease):
            lease.revoke()
            return
        found = self.client.get(self.key, metadata=True)
        if not found or int(json.loads(found[0][0])["replicaId"]) != replica.options.replica_id:
            return
        epoch = int(found[0][1]["create_revision"])
        self._lease = lease
        replica.tracker.fence_until = sent + self.ttl_s - self.margin_s
        # The set this replica was elected from stays named (and its members' acknowledgements
        # awaited) until --min-insync replicas are in sync in this term: each of them holds
        # every acknowledged record, since nothing has been acknowledged since.
        if named is None:
            # A new group's first primary: every replica holds all that was acknowledged (nothing).
            named = frozenset(replica.options.replicas)
            self.client.put(self.in_sync_key, json.dumps({"epoch": epoch, "inSync": sorted(named)}))
        replica.tracker.persisted_in_sync = set(named) - {replica.options.replica_id}
        self._published = named
        replica.become_primary(epoch)

    def _named_in_sync(self) -> frozenset[int] | None:
        """The last in-sync set a primary wrote (None: none yet). Only its members campaign
        (any replica, in a group that never had a primary)."""
        found = self.client.get(self.in_sync_key)
        if not found:
            return None
        return frozenset(json.loads(found[0])["inSync"])

    def _keep_leading(self) -> None:
        replica = self.replica
        tracker = replica.tracker
        renewed = tracker.fence_until - (self.ttl_s - self.margin_s) if tracker.fence_until is not None else 0.0
        if time.monotonic() - renewed >= self.ttl_s / 3:
            sent = time.monotonic()
            ttl = self._lease.refresh()
            if ttl <= 0:
                log.warning("replica %d's lease expired: it steps down", replica.options.replica_id)
                replica.become_follower(-1)
                return
            tracker.fence_until = sent + ttl - self.margin_s
        in_sync = frozenset({replica.options.replica_id, *tracker.in_sync})
        if replica.options.waits_for_followers and len(in_sync) < replica.options.min_insync and self._published:
            # Fewer than --min-insync in sync: nothing is acknowledged now, so every replica
            # named still holds every acknowledged record. They stay named, and eligible
            # (Kafka's eligible leader replicas, KIP-966): a primary that dies now leaves the
            # group one to elect.
            return
        if in_sync != self._published:
            self.client.put(self.in_sync_key, json.dumps({"epoch": replica.epoch, "inSync": sorted(in_sync)}))
            self._published = in_sync
            loop = replica.loop
            if loop is not None:
                loop.call_soon_threadsafe(tracker.persist_in_sync, set(in_sync) - {replica.options.replica_id})

