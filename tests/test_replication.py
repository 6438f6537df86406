"""Writer groups (docs/replication.md): real writer processes on 127.0.0.1 replicating one
store; followers' commit logs, consume queues and index files byte for byte the
primary's; acknowledgements held for the in-sync replicas; failover and rejoin."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import functools
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.cli import quiet_env, run_cli
from support.etcd import Etcd
from support.nodes import Nodes, ProcessNode
from support.rmq5 import make_topics, run_python_client
from support.wait import wait_until

from rmqstore.common.files.commitlog import CommitLog
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.listen import free_port
from rmqstore.v1 import (
    messages_pb2,
    query_pb2,
    query_pb2_grpc,
    replication_pb2,
    replication_pb2_grpc,
    writer_pb2,
    writer_pb2_grpc,
)
from rmqstore.writer.consumers import _MAC_BYTES

# Small files: the test crosses commit log, consume queue and index file boundaries.
SIZES = ("--commitlog-file-size", str(256 * 1024), "--cq-file-units", "2000", "--index-slots", "100", "--index-entries", "4000")


class Group:
    """The replicas of one writer group, as processes, each with its own store."""

    def __init__(self, nodes: Nodes, root: Path, count: int, *extra: str, name: str = "g1", env: dict[str, str] | None = None):
        self.env = env
        self.nodes = nodes
        self.root = root
        self.extra = extra
        self.name = name
        self.ports = {k: free_port("127.0.0.1") for k in range(count)}
        self.replicas = ",".join(f"{k}=127.0.0.1:{p}" for k, p in self.ports.items())
        self.procs: dict[int, ProcessNode] = {}

    def store(self, replica_id: int) -> Path:
        return self.root / f"replica-{replica_id}"

    def start(self, *replica_ids: int) -> None:
        """Start these replicas at once (processes start in parallel), each once serving."""
        for replica_id in replica_ids:
            self.procs[replica_id] = self.nodes.spawn("writer", [
                "writer", "serve", "--store", str(self.store(replica_id)), "--host", "127.0.0.1",
                "--port", str(self.ports[replica_id]), "--group", self.name, "--replica-id", str(replica_id),
                "--replicas", self.replicas, *SIZES, *self.extra,
            ], env=self.env)  # fmt: skip
        for replica_id in replica_ids:
            self.procs[replica_id].wait_serving()

    def stop(self, *replica_ids: int) -> None:
        """SIGTERM to these replicas at once; each stops cleanly."""
        for replica_id in replica_ids:
            self.procs[replica_id].wait_until_sigterm_is_caught()
            self.procs[replica_id].proc.send_signal(signal.SIGTERM)
        for replica_id in replica_ids:
            self.procs[replica_id].wait_stopped()

    def stub(self, replica_id: int) -> replication_pb2_grpc.ReplicationServiceStub:
        # A channel of its own (no backoff inherited from a channel to a replica that was down).
        channel = grpc.insecure_channel(f"127.0.0.1:{self.ports[replica_id]}", options=(("grpc.use_local_subchannel_pool", 1),))
        self.nodes.channels.append(channel)
        return replication_pb2_grpc.ReplicationServiceStub(channel)

    def status(self, replica_id: int) -> replication_pb2.ReplicaStatusResponse:
        return self.stub(replica_id).ReplicaStatus(replication_pb2.ReplicaStatusRequest(), timeout=5)

    def primary(self) -> int:
        def found() -> int | None:
            for k in self.procs:
                try:
                    status = self.status(k)
                except grpc.RpcError:
                    continue
                if status.role == "primary":
                    return k + 1
            return None

        return wait_until(found, 30, "a primary") - 1

    def in_sync(self, primary: int, count: int) -> None:
        def enough() -> bool:
            status = self.status(primary)
            return sum(f.in_sync for f in status.followers) >= count

        wait_until(enough, 30, f"{count} followers in sync")


def _has_topics(store: Path, *topics: str) -> bool:
    """Whether the store's topic table (config/topics.json, Apache's) names ``topics``."""
    table = store / "config" / "topics.json"
    return table.exists() and set(topics) <= set(json.loads(table.read_text())["topicConfigTable"])


def _file_bytes(root: Path) -> dict[str, bytes]:
    """The commit log, consume queue and index files of a store, by relative path."""
    files = {}
    for part in ("commitlog", "consumequeue", "index"):
        for path in sorted((root / part).rglob("*")):
            if path.is_file():
                files[str(path.relative_to(root))] = path.read_bytes()
    return files


def _assert_identical_over_common_length(stores: list[Path]) -> None:
    reference = _file_bytes(stores[0])
    assert any(name.startswith("commitlog") for name in reference)
    for other in stores[1:]:
        theirs = _file_bytes(other)
        assert set(theirs) == set(reference), (other, set(theirs) ^ set(reference))
        for name, data in reference.items():
            common = min(len(data), len(theirs[name]))
            assert theirs[name][:common] == data[:common], f"{other}/{name} differs"


def _produce(endpoint: str, producer: int, count: int, batch: int) -> list[tuple[str, int]]:
    """Send ``count`` messages in batches; the acked (uniq key, commit log offset) pairs."""
    from rmqstore.v1 import writer_pb2_grpc

    acked = []
    with grpc.insecure_channel(endpoint) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        for start in range(0, count, batch):
            messages = [
                messages_pb2.Message(topic=f"T{(producer + i) % 3}", body=os.urandom(64 + (i % 5) * 40), keys=[f"p{producer}-{start + i}"])
                for i in range(batch)
            ]
            response = stub.SendBatch(writer_pb2.SendBatchRequest(messages=messages), timeout=30)
            acked += [(r.uniq_key, r.commitlog_offset) for r in response.results]
    return acked


def test_a_sync_group_replicates_byte_for_byte(nodes: Nodes, tmp_path: Path) -> None:
    prometheus = {**quiet_env(), "OTEL_SDK_DISABLED": "false", "OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    group = Group(nodes, tmp_path, 3, "--replication", "sync", "--min-insync", "2", "--flush", "sync", "--metrics-port", "0", env=prometheus)
    group.start(0, 1, 2)
    primary = group.primary()
    assert primary == 0  # a new group's lowest id leads without etcd
    group.in_sync(primary, 2)
    endpoint = f"127.0.0.1:{group.ports[primary]}"
    # The official RocketMQ 5 Python client, given a follower's endpoint only, among the
    # producers: the follower's routes send it to the primary.
    make_topics(endpoint, {"Orders": "NORMAL", "Carts": "FIFO"})
    follower = next(k for k in range(3) if k != primary)
    wait_until(lambda: _has_topics(group.store(follower), "Orders", "Carts"), 30, "the topics on the follower")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        official = pool.submit(run_python_client, tmp_path, "send", f"127.0.0.1:{group.ports[follower]}", "Orders", "Carts", "400")
        sent = list(pool.map(lambda p: _produce(endpoint, p, 33_200, 100), range(3)))
        lines = official.result()
    acked = [pair for part in sent for pair in part]
    assert len(acked) == 99_600  # and the official client's 400: 100,000 messages from four producers
    assert len(lines) == 400  # every receipt OK (the driver stops at the first error)

    # A follower refuses writes, naming the primary.
    with pytest.raises(grpc.RpcError) as refused:
        _produce(f"127.0.0.1:{group.ports[follower]}", 9, 1, 1)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert endpoint in (refused.value.details() or "")
    channel = grpc.insecure_channel(f"127.0.0.1:{group.ports[follower]}")
    nodes.channels.append(channel)
    with pytest.raises(grpc.RpcError) as refused:
        writer_pb2_grpc.WriterServiceStub(channel).CreateTopic(writer_pb2.CreateTopicRequest(name="New", queue_count=2))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # A follower's routes name the follower itself, which forwards RocketMQ 5 calls to the
    # primary, for a topic the group has; one it lacks is NotFound, as on the primary (no
    # route creates a topic).
    messaging = service_pb2_grpc.MessagingServiceStub(channel)
    route = messaging.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="T1")), timeout=5)
    assert route.status.code == v2.OK
    assert {(a.host, a.port) for q in route.message_queues for a in q.broker.endpoints.addresses} == {("127.0.0.1", group.ports[follower])}
    forwarded = messaging.SendMessage(v2s.SendMessageRequest(messages=[v2.Message(
        topic=v2.Resource(name="T1"), body=b"through a follower",
        system_properties=v2.SystemProperties(message_id="ForwardedByAFollower1", body_encoding=v2.IDENTITY, message_type=v2.NORMAL),
    )]), timeout=10)  # fmt: skip
    assert forwarded.status.code == v2.OK, forwarded.status
    forwarded_id = forwarded.entries[0].message_id
    # A call already forwarded once is served where it lands: the follower's own refusal,
    # naming the primary (no call passes to and fro between replicas that disagree).
    again = messaging.SendMessage(v2s.SendMessageRequest(messages=[v2.Message(
        topic=v2.Resource(name="T1"), body=b"forwarded before",
        system_properties=v2.SystemProperties(message_id="ForwardedTwice1", body_encoding=v2.IDENTITY, message_type=v2.NORMAL),
    )]), timeout=10, metadata=(("x-rmqstore-forwarded-by", "9"),))  # fmt: skip
    assert again.status.code == v2.HA_NOT_AVAILABLE and endpoint in again.status.message, again.status
    missing = messaging.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="NotYet")), timeout=5)
    assert missing.status.code == v2.TOPIC_NOT_FOUND

    end = group.status(primary).end_offset
    wait_until(lambda: all(group.status(k).end_offset == end for k in range(3)), 30, "the followers to catch up")
    status = group.status(primary)
    assert [(f.replica_id, f.in_sync, f.lag_bytes) for f in status.followers] == [(k, True, 0) for k in range(3) if k != primary]
    # A query node serves from a follower's files, live (reads scale across replicas).
    query = nodes.start("query", group.store(follower), *SIZES)
    with grpc.insecure_channel(query.endpoint) as channel:
        page = query_pb2_grpc.QueryServiceStub(channel).QueryByKey(query_pb2.QueryByKeyRequest(topic="T1", key="p0-1", page_size=10), timeout=10)
    assert [m.uniq_key for m in page.messages] == [acked[1][0]]
    query.stop()
    # The gauges: the primary's in-sync count and lag, every replica's epoch.
    with urllib.request.urlopen(f"http://127.0.0.1:{group.procs[primary].serving['metricsPort']}/metrics", timeout=10) as page:
        scraped = {(s.name, s.labels.get("rmqstore_replica")): s.value for f in text_string_to_metric_families(page.read().decode()) for s in f.samples}
    assert scraped[("rmqstore_replication_in_sync", str(primary))] == 3
    assert scraped[("rmqstore_replication_lag_bytes", str(primary))] == 0
    assert scraped[("rmqstore_replication_epoch", str(primary))] == 1
    assert 0.0 < scraped[("rmqstore_replication_loop_busy", str(primary))] < 1.0  # the loop's share on CPU, measured
    group.stop(0, 1, 2)
    _assert_identical_over_common_length([group.store(k) for k in range(3)])
    for k in range(3):
        checked = run_cli(["check", str(group.store(k))])
        assert checked.returncode == 0, checked.stdout + checked.stderr
        log = CommitLog(str(group.store(k) / "commitlog"), 256 * 1024)
        try:
            official_keys = {r.uniq_key for r in log.records() if r.topic in ("Orders", "Carts")}
            assert forwarded_id in {r.uniq_key for r in log.records() if r.topic == "T1"}
            assert len(official_keys) == 400 and {line["message_id"] for line in lines} <= official_keys
            for uniq_key, offset in acked:
                assert log.read(offset).uniq_key == uniq_key
        finally:
            log.close()


def _replicas(endpoints: str) -> dict[str, Any]:
    shown = run_cli(["replicas", "--endpoint", endpoints, "--json"])
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)  # type: ignore[no-any-return]


def test_manual_failover_truncates_the_old_primarys_unreplicated_tail(nodes: Nodes, tmp_path: Path) -> None:
    """ASYNC, no etcd: the primary acknowledges 60 sends its followers never got, and dies;
    replica 1 is promoted and takes 40 more; the old primary rejoins as a follower and
    cuts exactly those 60 (the loss ASYNC allows: past the new primary's end at the
    switch), durably, and the three stores agree byte for byte."""
    group = Group(nodes, tmp_path, 3, "--replication", "async")
    group.start(0, 1, 2)
    assert group.primary() == 0
    group.in_sync(0, 2)
    first = _produce(f"127.0.0.1:{group.ports[0]}", 0, 100, 10)
    switch = group.status(0).end_offset
    wait_until(lambda: all(group.status(k).end_offset == switch for k in (1, 2)), 30, "the followers to catch up")
    group.stop(1, 2)
    lost = _produce(f"127.0.0.1:{group.ports[0]}", 1, 60, 10)  # acknowledged by the primary alone
    assert min(offset for _, offset in lost) == switch
    group.procs[0].kill()
    group.start(1, 2)
    # Neither follower leads on its own: the last primary was replica 0.
    assert all(group.status(k).role == "follower" for k in (1, 2))
    promoted = run_cli(["writer", "promote", "--endpoint", f"127.0.0.1:{group.ports[1]}"])
    assert promoted.returncode == 0, promoted.stderr
    assert json.loads(promoted.stdout)["startOffset"] == switch
    after = _produce(f"127.0.0.1:{group.ports[1]}", 2, 40, 10)
    assert min(offset for _, offset in after) == switch
    # The CLI given every replica finds the primary.
    every = ",".join(f"127.0.0.1:{p}" for p in group.ports.values())
    cli_send = run_cli(["send", "--endpoint", every, "-t", "T0", "--body", "via the list"])
    assert cli_send.returncode == 0, cli_send.stderr
    after += [(json.loads(cli_send.stdout)["uniqKey"], json.loads(cli_send.stdout)["commitLogOffset"])]
    group.start(0)
    end = group.status(1).end_offset
    wait_until(lambda: all(group.status(k).end_offset == end for k in (0, 2)), 30, "the old primary to rejoin")
    shown = _replicas(",".join(f"127.0.0.1:{p}" for p in group.ports.values()))
    assert [(r["id"], r["role"], r["endOffset"], r["inSync"]) for r in shown["replicas"]] == [
        (0, "follower", end, True), (1, "primary", end, True), (2, "follower", end, True)
    ]
    assert {r["epoch"] for r in shown["replicas"]} == {2}
    group.stop(0, 1, 2)
    _assert_identical_over_common_length([group.store(k) for k in range(3)])
    for k in range(3):
        checked = run_cli(["check", str(group.store(k))])
        assert checked.returncode == 0, checked.stdout + checked.stderr
    # Every acknowledged send but the 60 is where it was acknowledged, on every replica;
    # the 60 are nowhere.
    for k in range(3):
        log = CommitLog(str(group.store(k) / "commitlog"), 256 * 1024)
        stored = {record.uniq_key for record in log.records()}
        for uniq_key, offset in first + after:
            assert log.read(offset).uniq_key == uniq_key
        assert not stored & {uniq_key for uniq_key, _ in lost}
        log.close()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    server = Etcd(tmp_path)
    try:
        yield server
    finally:
        server.close()


class Producer(threading.Thread):
    """Sends batches to whichever replica is primary until stopped, recording every
    acknowledged (commit log offset → uniq key) and when each ack came."""

    def __init__(self, group: Group, number: int, batch: int = 20):
        super().__init__(name=f"producer-{number}", daemon=True)
        self.group, self.number, self.batch = group, number, batch
        self.acked: dict[int, str] = {}
        self.ack_times: list[float] = []
        self.stopped = threading.Event()
        self.refused = 0

    def run(self) -> None:
        from rmqstore.v1 import writer_pb2_grpc

        endpoints = [f"127.0.0.1:{p}" for p in self.group.ports.values()]
        channels = {e: grpc.insecure_channel(e, options=(("grpc.use_local_subchannel_pool", 1),)) for e in endpoints}
        at = 0
        sent = 0
        try:
            while not self.stopped.is_set():
                endpoint = endpoints[at % len(endpoints)]
                messages = [
                    messages_pb2.Message(topic="Failover", body=os.urandom(100), keys=[f"p{self.number}-{sent + i}"])
                    for i in range(self.batch)
                ]
                sent += self.batch
                try:
                    response = writer_pb2_grpc.WriterServiceStub(channels[endpoint]).SendBatch(
                        writer_pb2.SendBatchRequest(messages=messages), timeout=5
                    )
                except grpc.RpcError:
                    self.refused += 1
                    at += 1  # the next replica: a follower or a dead one answers nothing useful
                    time.sleep(0.05)
                    continue
                now = time.monotonic()
                for result in response.results:
                    assert self.acked.setdefault(result.commitlog_offset, result.uniq_key) == result.uniq_key
                    self.ack_times.append(now)
        finally:
            for channel in channels.values():
                channel.close()


def test_killing_the_primary_loses_no_acknowledged_message(nodes: Nodes, tmp_path: Path, etcd: Etcd) -> None:
    """Three replicas, SYNC, --min-insync 2, elected through a real etcd: the primary is
    SIGKILLed under load from two producers, another in-sync replica is elected, the old
    one restarts and rejoins. Every acknowledged message is at its acknowledged offset on
    every replica, no offset was acknowledged for two messages, and every store is
    check-clean and identical over their common length."""
    group = Group(
        nodes, tmp_path, 3, "--replication", "sync", "--min-insync", "2", "--flush", "sync",
        "--etcd", etcd.endpoint, "--lease-ttl-s", "2", "--replica-lag-max-ms", "1000",
    )  # fmt: skip
    group.start(0, 1, 2)
    first = group.primary()
    group.in_sync(first, 2)
    producers = [Producer(group, n) for n in range(2)]
    for producer in producers:
        producer.start()
    wait_until(lambda: all(len(p.acked) >= 500 for p in producers), 60, "acks before the kill")
    killed_at = time.monotonic()
    group.procs[first].kill()
    survivors = [k for k in range(3) if k != first]

    def new_primary() -> int | None:
        for k in survivors:
            with contextlib.suppress(grpc.RpcError):
                if group.status(k).role == "primary":
                    return k + 1
        return None

    second = wait_until(new_primary, 30, "a new primary") - 1
    wait_until(lambda: all(any(t > killed_at for t in p.ack_times) for p in producers), 30, "acks after the failover")
    failover_s = min(t for p in producers for t in p.ack_times if t > killed_at) - killed_at
    group.start(first)
    wait_until(lambda: group.status(first).role == "follower" and group.status(first).primary_id == second, 30, "the old primary to follow")
    count_before_stop = sum(len(p.acked) for p in producers)
    wait_until(lambda: sum(len(p.acked) for p in producers) >= count_before_stop + 200, 30, "acks after the rejoin")

    # A partition as the primary sees it: SIGSTOP longer than its lease. Another in-sync
    # replica is elected; the stopped one, continued, acknowledges nothing more (its
    # answers to the sends it held are refusals) and rejoins as a follower.
    group.in_sync(second, 2)
    group.procs[second].proc.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        survivors = [k for k in range(3) if k != second]
        third = wait_until(new_primary, 30, "a primary elected past the stopped one") - 1
        wait_until(lambda: all(any(t > stopped_at for t in p.ack_times) for p in producers), 30, "acks from the new primary")
    finally:
        group.procs[second].proc.send_signal(signal.SIGCONT)
    wait_until(lambda: group.status(second).role == "follower" and group.status(second).primary_id == third, 30, "the stopped primary to step down")
    count_before_stop = sum(len(p.acked) for p in producers)
    wait_until(lambda: sum(len(p.acked) for p in producers) >= count_before_stop + 200, 30, "acks after the partition")
    second = third
    for producer in producers:
        producer.stopped.set()
    for producer in producers:
        producer.join(30)
    end = group.status(second).end_offset
    wait_until(lambda: all(group.status(k).end_offset == end for k in range(3)), 30, "every replica to catch up")
    epochs = {group.status(k).epoch for k in range(3)}
    assert len(epochs) == 1 and group.status(second).epochs[-1].primary_id == second
    group.stop(0, 1, 2)
    acked: dict[int, str] = {}
    for producer in producers:
        for offset, uniq_key in producer.acked.items():
            assert acked.setdefault(offset, uniq_key) == uniq_key, f"offset {offset} acknowledged for two messages"
    for k in range(3):
        log = CommitLog(str(group.store(k) / "commitlog"), 256 * 1024)
        try:
            for offset, uniq_key in acked.items():
                assert log.read(offset).uniq_key == uniq_key, f"replica {k}: the message acked at {offset} is lost"
        finally:
            log.close()
        checked = run_cli(["check", str(group.store(k))])
        assert checked.returncode == 0, checked.stdout + checked.stderr
    _assert_identical_over_common_length([group.store(k) for k in range(3)])
    print(f"failover: {failover_s:.2f} s from the kill to the first acknowledged send; {len(acked)} acked")


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--replica-id", "1", "--replicas", "0=127.0.0.1:1,1=127.0.0.1:2"], "belong to a writer group: give --group too"),
        (["--group", "g1", "--replica-id", "0"], "--group needs --replica-id and --replicas"),
        (["--group", "g1", "--replica-id", "5", "--replicas", "0=127.0.0.1:1,1=127.0.0.1:2"], "--replica-id 5 is not in --replicas"),
        (["--group", "g1", "--replica-id", "0", "--replicas", "0=127.0.0.1:1", "--min-insync", "2"], "--min-insync 2"),
        (["--group", "g1", "--replica-id", "0", "--replicas", "0=127.0.0.1:1,0=127.0.0.1:2"], "names replica 0 twice"),
        (["--group", "g1", "--replica-id", "0", "--replicas", "0=nowhere"], "--replicas:"),
        (["--group", "g/1", "--replica-id", "0", "--replicas", "0=127.0.0.1:1"], "--group 'g/1'"),
        (["--group", "g1", "--replica-id", "0", "--replicas", "0=127.0.0.1:1", "--replica-pace-ms", "1001"], "--replica-pace-ms: 1001 is outside [0, 1000]"),
    ],
)
def test_bad_group_flags_are_refused_before_anything_is_made(tmp_path: Path, flags: list[str], words: str) -> None:
    store = tmp_path / "store"
    done = run_cli(["writer", "serve", "--store", str(store), "--port", "0", *flags])
    assert done.returncode == 2, done.stderr
    assert words in done.stderr, done.stderr
    assert not store.exists()


def test_consistent_end_is_the_end_of_the_newest_shared_epoch() -> None:
    from rmqstore.writer.replication.epochs import Epoch, consistent_end

    primary = [Epoch(1, 0, 0), Epoch(5, 1000, 1), Epoch(9, 3000, 2)]
    # A former primary of epoch 5 that wrote past where epoch 9 began: cut at 3000.
    assert consistent_end([Epoch(1, 0, 0), Epoch(5, 1000, 1)], primary, 4500, 6000) == 3000
    # A follower behind the switch keeps all it has.
    assert consistent_end([Epoch(1, 0, 0), Epoch(5, 1000, 1)], primary, 2000, 6000) == 2000
    # One whose epoch 5 began elsewhere shares only epoch 1: cut where epoch 5 began.
    assert consistent_end([Epoch(1, 0, 0), Epoch(5, 1200, 0)], primary, 4500, 6000) == 1000
    # Nothing shared: everything goes; a new group (no epochs anywhere) keeps its log.
    assert consistent_end([Epoch(2, 0, 1)], primary, 4500, 6000) == 0
    assert consistent_end([], [], 700, 900) == 700
    # Already in the primary's newest epoch: up to the primary's end.
    assert consistent_end(primary, primary, 7000, 6000) == 6000


# Acceptance 5: the official clients across failovers. Each failover costs about 10 s
# here (a 2 s lease, a replica's restart and its return to the in-sync set);
# RMQSTORE_CLIENT_FAILOVERS sets the count for a quicker run by hand.
CLIENT_FAILOVERS = int(os.environ.get("RMQSTORE_CLIENT_FAILOVERS", "10"))
# Progress each client shows between failovers.
CLIENT_PROGRESS = 20


def _place(handle: str) -> tuple[str, int, int]:
    """The topic, queue and offset of a receipt handle's message: the writer's handle is the
    base64 of ``version group topic queue offset nonce`` and its MAC (writer.consumers),
    read here without the check."""
    raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    _, _, topic, queue_id, offset, _ = raw[:-_MAC_BYTES].decode().split(" ")
    return topic, int(queue_id), int(offset)


class ClientProcess:
    """An official client's process, its JSON lines read from the file it writes."""

    def __init__(self, tmp_path: Path, name: str, command: list[str], cwd: Path):
        from support.rmq5 import client_env

        home = tmp_path / f"{name}-home"
        home.mkdir()
        self.out_path = tmp_path / f"{name}.out"
        self.err_path = tmp_path / f"{name}.err"
        self.name = name
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(command, stdout=out, stderr=err, env=client_env(home), cwd=cwd)

    def lines(self) -> list[dict[str, Any]]:
        text = self.out_path.read_text()
        return [json.loads(line) for line in text.splitlines()[: text.count("\n")] if line]

    def count(self, field: str) -> int:
        return sum(1 for line in self.lines() if field in line)

    def wait(self, timeout_s: float) -> list[dict[str, Any]]:
        code = self.proc.wait(timeout=timeout_s)
        assert code == 0, f"{self.name} exited {code}: {self.err_path.read_text()[-3000:]}"
        return self.lines()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _another_primary(group: Group, old: int) -> bool:
    for k in group.procs:
        if k != old:
            with contextlib.suppress(grpc.RpcError):
                if group.status(k).role == "primary":
                    return True
    return False


@pytest.mark.slow
def test_official_clients_keep_working_across_failovers(nodes: Nodes, tmp_path: Path, etcd: Etcd) -> None:
    """Three replicas, SYNC, --min-insync 2, a real etcd. The official Python producer and
    SimpleConsumer, given every replica (``H:P;H:P;H:P``), and the official Node.js
    producer, given one replica (its client dials a single address), run while the primary
    is SIGKILLed and restarted CLIENT_FAILOVERS times, each time whichever replica leads.
    Every acknowledged send is in the final primary's log and reaches the consumer; the
    consumer's acknowledgements carry over: under SYNC an acknowledgement is answered once
    the in-sync replicas hold it, so no message comes again after its ack was answered OK."""
    from support.rmq5 import NODE_DIR, node_command, rmq5_python

    group = Group(
        nodes, tmp_path, 3, "--replication", "sync", "--min-insync", "2", "--flush", "sync",
        "--etcd", etcd.endpoint, "--lease-ttl-s", "2", "--replica-lag-max-ms", "1000", "--consumer-min-invisible", "3",
    )  # fmt: skip
    group.start(0, 1, 2)
    primary = group.primary()
    group.in_sync(primary, 2)
    make_topics(f"127.0.0.1:{group.ports[primary]}", {"PyOrders": "NORMAL", "NodeOrders": "NORMAL"})
    wait_until(lambda: all(_has_topics(group.store(k), "PyOrders", "NodeOrders") for k in range(3)), 30, "the topics on every replica")
    every = ";".join(f"127.0.0.1:{p}" for p in group.ports.values())
    stop_producers, stop_consumer = tmp_path / "stop-producers", tmp_path / "stop-consumer"
    drivers = Path(__file__).resolve().parent / "rocketmq5" / "failover_clients.py"
    python = rmq5_python()
    clients = [
        ClientProcess(tmp_path, "python-producer", [python, str(drivers), "produce", every, "PyOrders", str(stop_producers)], tmp_path),
        ClientProcess(
            tmp_path, "node-producer",
            [*node_command(), str(NODE_DIR / "failover_producer.js"), f"127.0.0.1:{group.ports[2]}", "NodeOrders", str(stop_producers)], NODE_DIR,
        ),  # fmt: skip
        ClientProcess(tmp_path, "consumer", [python, str(drivers), "consume", every, "Readers", "PyOrders,NodeOrders", str(stop_consumer)], tmp_path),
    ]
    producers, consumer = clients[:2], clients[2]
    kills: list[float] = []
    try:

        def progressed(marks: list[int]) -> bool:
            for client in clients:
                assert client.proc.poll() is None, f"{client.name} exited: {client.err_path.read_text()[-3000:]}"
            return all(c.count("message_id") >= m + CLIENT_PROGRESS for c, m in zip(clients, marks, strict=True))

        for _ in range(CLIENT_FAILOVERS):
            marks = [c.count("message_id") for c in clients]
            wait_until(lambda marks=marks: progressed(marks), 120, "every client to make progress", 0.2)  # type: ignore[misc]
            primary = group.primary()
            kills.append(time.time())
            group.procs[primary].kill()
            wait_until(functools.partial(_another_primary, group, primary), 30, "a new primary")
            group.start(primary)
            group.in_sync(group.primary(), 2)
        marks = [c.count("message_id") for c in clients]
        wait_until(lambda: progressed(marks), 120, "every client to make progress after the last failover", 0.2)
        stop_producers.touch()
        sent = [line for p in producers for line in p.wait(60)]
        stop_consumer.touch()
        received = consumer.wait(120)
    finally:
        stop_producers.touch()
        stop_consumer.touch()
        for client in clients:
            client.kill()
    acked = {line["message_id"]: line for line in sent if "message_id" in line}
    assert len(acked) == sum(1 for line in sent if "message_id" in line)
    failed_sends = sum(1 for line in sent if "error" in line)
    # No acknowledged send lost: each reached the consumer and is in the final log.
    # Deliveries and acks count by the record (topic, queue, queue offset, message id): a
    # send the client tried again after a failover may be stored twice under one message
    # id, and a record the old primary appended and lost in a failover (never acknowledged
    # to its producer) may have been delivered, its offset then taken by another message.
    Key = tuple[str, int, int, str]
    deliveries: dict[Key, list[dict[str, Any]]] = {}
    acks: dict[Key, list[float]] = {}
    ack_failed: set[Key] = set()
    for line in received:
        if "body" in line:
            deliveries.setdefault((*_place(line["handle"]), line["message_id"]), []).append(line)
        elif line.get("acked"):
            acks.setdefault((*_place(line["handle"]), line["message_id"]), []).append(line["t"])
        elif "ack_error" in line:
            ack_failed.add((*_place(line["handle"]), line["message_id"]))
    # Acknowledgements are answered OK while the group is whole (the followers report the
    # consumer progress they hold): some before the first kill.
    assert any(min(times) < kills[0] for times in acks.values()), "no acknowledgement answered OK before the first failover"
    missing = set(acked) - {key[3] for key in deliveries}
    assert not missing, f"{len(missing)} acknowledged sends never delivered, e.g. {sorted(missing)[:5]}"
    final = group.primary()
    group.stop(0, 1, 2)
    log = CommitLog(str(group.store(final) / "commitlog"), 256 * 1024)
    try:
        stored: set[Key] = {(r.topic, r.queue_id, r.queue_offset, r.uniq_key or "") for r in log.records()}
    finally:
        log.close()
    assert set(acked) <= {key[3] for key in stored}
    # A message whose acknowledgement was answered OK is in the final log: the ack waited
    # for the replicas to hold the log to the primary's end.
    acked_lost = set(acks) - stored
    assert not acked_lost, f"{len(acked_lost)} messages acknowledged OK by the consumer are not in the final log: {sorted(acked_lost)[:5]}"
    # Every message in the final log that was delivered was acknowledged OK in the end, or
    # its acknowledgement failed in a failover: then the ack may have been taken (the
    # replicas held it, the answer was lost with the primary), or the message comes again.
    unacked = (set(deliveries) & stored) - set(acks) - ack_failed
    assert not unacked, f"{len(unacked)} messages delivered and never acknowledged, e.g. {sorted(unacked)[:5]}"
    # Progress carried over: no message is delivered again after its acknowledgement was
    # answered OK, whatever replica answered it and whichever was elected next.
    redelivered_after_ack = {
        key: ([d["t"] for d in deliveries[key]], min(times))
        for key, times in acks.items()
        if any(d["t"] > min(times) for d in deliveries[key])
    }
    assert not redelivered_after_ack, (
        f"{len(redelivered_after_ack)} messages delivered again after an acknowledgement answered OK "
        f"(record: (deliveries, first ack)): {dict(list(redelivered_after_ack.items())[:5])}; kills at {kills}"
    )
    for k in range(3):
        checked = run_cli(["check", str(group.store(k))])
        assert checked.returncode == 0, checked.stdout + checked.stderr
    print(
        f"{CLIENT_FAILOVERS} failovers: {len(acked)} sends acknowledged ({failed_sends} failed and were sent anew), "
        f"{len(deliveries)} messages delivered {sum(len(d) for d in deliveries.values())} times "
        f"({len(set(deliveries) - stored)} of them lost with an old primary's unacknowledged tail), "
        f"{sum(1 for line in received if 'ack_error' in line)} acknowledgements refused"
    )


GROUP_ACL = """
users:
  - accessKey: app
    secretKey: app-secret-1
acls:
  - subject: User:app
    policies:
      - resource: ["Topic:*"]
        actions: [Pub, Sub, Create]
  - subject: "Cert:rmqstore test client"
    policies:
      - resource: Cluster
        actions: [Get, Update]
"""


def test_replicas_dial_each_other_over_mutual_tls_under_an_acl(nodes: Nodes, tmp_path: Path) -> None:
    """Every replica serves mutual TLS under an ACL; they replicate to each other over TLS,
    presenting the certificate --replica-tls-cert names (the ACL allows its subject the
    Cluster), and a follower forwards a signed RocketMQ 5 send to the primary over TLS,
    where the client's own signature is checked."""
    from support.pki import make_pki

    from rmqstore.client.channels import open_channel
    from rmqstore.client.signing import signing_channel

    pki = make_pki(tmp_path)
    acl = tmp_path / "acl.yaml"
    acl.write_text(GROUP_ACL)
    tls = [
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca),
        "--replica-tls-ca", str(pki.ca), "--replica-tls-cert", str(pki.client_cert), "--replica-tls-key", str(pki.client_key),
        "--acl", str(acl), "--health-port", "0",
    ]  # fmt: skip
    group = Group(nodes, tmp_path, 3, "--replication", "sync", "--min-insync", "2", *tls)
    group.start(0, 1, 2)

    def channel(replica_id: int) -> grpc.Channel:
        opened = open_channel(f"127.0.0.1:{group.ports[replica_id]}", ca=str(pki.ca), client_cert=str(pki.client_cert), client_key=str(pki.client_key))
        nodes.channels.append(opened)
        return opened

    def status(replica_id: int) -> replication_pb2.ReplicaStatusResponse:
        return replication_pb2_grpc.ReplicationServiceStub(channel(replica_id)).ReplicaStatus(replication_pb2.ReplicaStatusRequest(), timeout=5)

    wait_until(lambda: sum(f.in_sync for f in status(0).followers) == 2, 60, "both followers in sync over TLS")
    app = signing_channel(channel(0), "app", "app-secret-1")
    messages = [messages_pb2.Message(topic="Secured", body=f"m{i}".encode(), keys=[f"k{i}"]) for i in range(50)]
    sent = writer_pb2_grpc.WriterServiceStub(app).SendBatch(writer_pb2.SendBatchRequest(messages=messages), timeout=30)
    assert len(sent.results) == 50
    # A follower forwards a signed RocketMQ 5 send; the primary checks the client's signature.
    forwarded = service_pb2_grpc.MessagingServiceStub(signing_channel(channel(1), "app", "app-secret-1")).SendMessage(
        v2s.SendMessageRequest(messages=[v2.Message(
            topic=v2.Resource(name="Secured"), body=b"through a follower",
            system_properties=v2.SystemProperties(message_id="SecuredForward1", body_encoding=v2.IDENTITY, message_type=v2.NORMAL),
        )]), timeout=10,
    )  # fmt: skip
    assert forwarded.status.code == v2.OK, forwarded.status
    unsigned = service_pb2_grpc.MessagingServiceStub(channel(1)).SendMessage(
        v2s.SendMessageRequest(messages=[v2.Message(
            topic=v2.Resource(name="Secured"), body=b"as the replica's certificate",
            system_properties=v2.SystemProperties(message_id="SecuredForward2", body_encoding=v2.IDENTITY, message_type=v2.NORMAL),
        )]), timeout=10,
    )  # fmt: skip
    assert unsigned.status.code == v2.FORBIDDEN, unsigned.status  # that subject may not Pub
    end = status(0).end_offset
    wait_until(lambda: all(status(k).end_offset == end for k in range(3)), 30, "the followers to catch up")
    group.stop(0, 1, 2)
    _assert_identical_over_common_length([group.store(k) for k in range(3)])


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--tls-cert", "c", "--tls-key", "k"], "needs --replica-tls-ca"),
        (["--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", "a", "--replica-tls-ca", "a"], "needs --replica-tls-cert"),
        (["--replica-tls-ca", "a"], "--replica-tls-* need --tls-cert"),
        (["--acl", "acl.yaml"], "--acl in a writer group needs mutual TLS"),
        (["--tls-cert", "c", "--tls-key", "k", "--replica-tls-ca", "a", "--acl", "acl.yaml"], "--acl in a writer group needs mutual TLS"),
        (["--replica-tls-cert", "c"], "go together"),
    ],
)
def test_replica_tls_flags_are_checked_before_anything_is_made(tmp_path: Path, flags: list[str], words: str) -> None:
    store = tmp_path / "store"
    group = ["--group", "g1", "--replica-id", "0", "--replicas", "0=127.0.0.1:1,1=127.0.0.1:2"]
    done = run_cli(["writer", "serve", "--store", str(store), "--port", "0", *group, *flags])
    assert done.returncode == 2, done.stderr
    assert words in done.stderr, done.stderr
    assert not store.exists()


def test_a_primary_that_dies_while_its_followers_lag_leaves_one_to_elect(nodes: Nodes, tmp_path: Path, etcd: Etcd) -> None:
    """SYNC, --min-insync 2: both followers stall (SIGSTOP) until the primary counts none in
    sync, and the primary is SIGKILLed. Nothing was acknowledged since the followers fell
    out, so both still hold every acknowledged record: they stay named in etcd, and one is
    elected once they run again (a set that shrank to the dead primary would leave the
    group without a primary until it came back)."""
    group = Group(
        nodes, tmp_path, 3, "--replication", "sync", "--min-insync", "2",
        "--etcd", etcd.endpoint, "--lease-ttl-s", "2", "--replica-lag-max-ms", "500",
    )  # fmt: skip
    group.start(0, 1, 2)
    primary = group.primary()
    group.in_sync(primary, 2)
    acked = _produce(f"127.0.0.1:{group.ports[primary]}", 0, 200, 20)
    followers = [k for k in range(3) if k != primary]
    for k in followers:
        group.procs[k].proc.send_signal(signal.SIGSTOP)
    try:
        # A send the stalled followers never take: held, then refused once they fall out.
        with pytest.raises(grpc.RpcError) as refused:
            _produce(f"127.0.0.1:{group.ports[primary]}", 1, 1, 1)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        wait_until(lambda: not any(f.in_sync for f in group.status(primary).followers), 30, "no follower in sync", 0.1)
        time.sleep(0.5)  # a few of the primary's polls: the set named in etcd is what it keeps
        group.procs[primary].kill()
    finally:
        for k in followers:
            group.procs[k].proc.send_signal(signal.SIGCONT)
    wait_until(functools.partial(_another_primary, group, primary), 30, "a follower elected")
    second = next(k for k in followers if group.status(k).role == "primary")
    group.in_sync(second, 1)
    after = _produce(f"127.0.0.1:{group.ports[second]}", 2, 100, 20)
    group.stop(*followers)
    log = CommitLog(str(group.store(second) / "commitlog"), 256 * 1024)
    try:
        for uniq_key, offset in acked + after:
            assert log.read(offset).uniq_key == uniq_key
    finally:
        log.close()
