"""Crash tests: a real ``rmqstore writer serve`` process is killed with SIGKILL at random
points while a client streams batches to it, then restarted on the same store.

What must hold (the writer's acceptance criteria, docs/design.md §4, docs/writer.md):

* SYNC flush: no acknowledged message is missing after a restart;
* every record kept in the commit log is findable by every lookup kind through the store
  library (UNIQ_KEY and each KEYS part through the index, offsetMsgId, queue offset);
* no duplicate or missing consume queue unit; queue offsets contiguous from 0;
* torn tails are truncated (and zeroed) on restart;
* ASYNC flush: everything kept in the commit log is indexed after a restart. A SIGKILL
  (unlike a power cut) keeps the page cache, so ASYNC loses nothing acknowledged either
  (docs/writer.md, "Flush policies"); that is checked too.

Seeds: one base seed per run, printed as ``seed=...`` (in a failing test's output, or with
``-s``). RMQSTORE_CRASH_SEED=N replays the messages and kill points of a run; each kill's
own seed is derived from the base seed, the test and the cycle, and printed as well.

Besides the random kills, each state a kill was seen to leave (or can leave) at a precise
point is built deterministically and restarted from: a torn tail, a file being created
(hidden temporary file), a record copy stopped before its head was stored, an index entry
whose count was not yet written, a consume queue unit stopped halfway, an index file
without its header.

Known, and worked around here rather than tested (it is a race, not a crash state):
``rmqstore writer serve`` prints its serving line before it installs its SIGTERM/SIGINT
handlers, so a SIGTERM sent as soon as the line is read sometimes kills the writer with
the default action (exit -15, no stopped line, ``abort`` left). ProcessNode.stop (tests/support) waits
until the process catches SIGTERM before sending it.
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.nodes import NodeFailed, Nodes, ProcessNode
from support.stores import SHARED_KEYS, SIZE_ARGS, SMALL, StoreFacts, check_ok, verify_store
from support.wait import wait_until

from rmqstore.common.codec import index as ix
from rmqstore.common.codec.consumequeue import UNIT_SIZE
from rmqstore.common.codec.msgid import decode_offset_msg_id, offset_msg_id
from rmqstore.common.codec.record import encode_blank, patch_offsets
from rmqstore.common.files.commitlog import CommitLog, StopReason
from rmqstore.common.files.index import IndexFileList
from rmqstore.common.files.store import StorePaths
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

pytestmark = pytest.mark.crash

COMMITLOG_FILE_SIZE = SMALL.commitlog_file_size_bytes
CQ_FILE_UNITS = SMALL.cq_file_units
INDEX_SLOTS = SMALL.index_slots
INDEX_ENTRIES = SMALL.index_entries
PAGE = 4096

TOPICS = ("CrashA", "CrashB", "Crash_C-2")
AUTO_QUEUES = 4  # WriterConfig.auto_create_queue_count

STREAM_TIMEOUT_S = 60.0
FIRST_ACK_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 30.0

MAX_MESSAGES_PER_CYCLE = 3000  # the stream stops by itself after this many
MAX_BATCH = 16
WINDOW_BATCHES = 4  # batches in flight before the client waits for an ack
# A cycle's kill comes once this many of its messages are acked (a count drawn per cycle),
# with up to WINDOW_BATCHES batches in flight: a point of the stream that does not depend on
# how fast a loaded machine runs, and enough records over the cycles (at least 800) for every
# file kind to roll (assert_every_file_kind_rolled).
KILL_AFTER_ACKS = (100, 300)

SYNC_KILLS = 12
ASYNC_KILLS = 8
_ENV_SEED = "RMQSTORE_CRASH_SEED"


def base_seed() -> int:
    text = os.environ.get(_ENV_SEED)
    return int(text) if text else random.SystemRandom().randrange(2**32)


def derived_seed(base: int, label: str, cycle: int) -> int:
    return random.Random(f"{base}:{label}:{cycle}").randrange(2**32)


# The writer process


StartWriter = Callable[[Path, str], ProcessNode]


@pytest.fixture
def start_writer(nodes: Nodes) -> StartWriter:
    """Starts writer processes on the crash tests' geometry and waits for their serving
    line; the ``nodes`` fixture kills any left over."""

    def start(store: Path, flush: str) -> ProcessNode:
        return nodes.start("writer", store, "--flush", flush, *SIZE_ARGS)

    return start


# The streaming client


@dataclass(frozen=True)
class Ack:
    cycle: int
    message: messages_pb2.Message
    result: messages_pb2.SendResult


@dataclass
class Streamer:
    """Streams batches through WriterService.SendStream in a thread, with at most
    WINDOW_BATCHES unacknowledged batches, until MAX_MESSAGES_PER_CYCLE or the call
    fails. Records every ack in the order received."""

    port: int
    cycle: int
    seed: int
    uniq_prefix: str
    sent: list[list[messages_pb2.Message]] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    sent_messages: int = 0
    error: grpc.RpcError | None = None
    failure: BaseException | None = None
    completed: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.first_ack = threading.Event()
        self.done = threading.Event()
        self.window = threading.Semaphore(WINDOW_BATCHES)
        self.thread = threading.Thread(target=self._run, name=f"stream-{self.cycle}", daemon=True)

    def start(self) -> Streamer:
        self.thread.start()
        return self

    def _message(self, n: int) -> messages_pb2.Message:
        rng = self.rng
        keys = [f"k-{self.cycle}-{n}"]
        if rng.random() < 0.4:
            keys.append(rng.choice(SHARED_KEYS))
        if rng.random() < 0.3:
            keys.append(f"ключ-{self.cycle}-{n}-é")
        if rng.random() < 0.1:
            keys.append(keys[0])  # a repeated part is indexed twice
        body_kind = rng.random()
        if body_kind < 0.15:
            body = b""
        elif body_kind < 0.9:
            body = rng.randbytes(rng.randrange(1, 600))
        else:
            body = rng.randbytes(rng.randrange(600, 4000))
        message = messages_pb2.Message(
            topic=rng.choice(TOPICS),
            body=body,
            keys=keys,
            tags=rng.choice(["", "TagA", "TagB", "タグ"]),
        )
        if rng.random() < 0.5:
            message.queue_id = rng.randrange(AUTO_QUEUES)
        if rng.random() < 0.2:
            message.uniq_key = f"{self.uniq_prefix}{self.cycle:06X}{n:08X}"
        if rng.random() < 0.1:
            message.properties["origin"] = f"crash-{self.cycle}"
        return message

    def _requests(self) -> Iterator[writer_pb2.SendBatchRequest]:
        n = 0
        while n < MAX_MESSAGES_PER_CYCLE:
            while not self.window.acquire(timeout=0.05):
                if self.done.is_set():
                    return
            if self.done.is_set():
                return
            size = min(self.rng.randint(1, MAX_BATCH), MAX_MESSAGES_PER_CYCLE - n)
            batch = [self._message(n + i) for i in range(size)]
            n += size
            self.sent.append(batch)
            self.sent_messages = n
            yield writer_pb2.SendBatchRequest(messages=batch)

    def _run(self) -> None:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
                stub = writer_pb2_grpc.WriterServiceStub(channel)
                try:
                    for number, response in enumerate(stub.SendStream(self._requests(), timeout=STREAM_TIMEOUT_S)):
                        self._take(number, response)
                        self.window.release()
                        self.first_ack.set()
                    self.completed = True
                except grpc.RpcError as error:
                    self.error = error
        except BaseException as error:  # re-raised by join() in the test's thread
            self.failure = error
        finally:
            self.done.set()

    def _take(self, number: int, response: writer_pb2.SendBatchResponse) -> None:
        batch = self.sent[number]
        assert len(response.results) == len(batch), f"batch {number}: {len(batch)} sent, {len(response.results)} acked"
        for message, result in zip(batch, response.results):
            assert result.topic == message.topic
            if message.HasField("queue_id"):
                assert result.queue_id == message.queue_id
            else:
                assert 0 <= result.queue_id < AUTO_QUEUES
            if message.uniq_key:
                assert result.uniq_key == message.uniq_key
            self.acks.append(Ack(self.cycle, message, result))

    def join(self) -> None:
        self.thread.join(timeout=JOIN_TIMEOUT_S)
        assert not self.thread.is_alive(), f"cycle {self.cycle}: the client did not finish within {JOIN_TIMEOUT_S} s"
        if self.failure is not None:
            raise self.failure


def stream_and_kill(writer: ProcessNode, cycle: int, seed: int, uniq_prefix: str) -> Streamer:
    """Stream to the writer and SIGKILL it once a random number of its messages are acked,
    the stream still in flight; returns the client with its acks."""
    print(f"seed={seed} (cycle {cycle})")
    kill_rng = random.Random(seed ^ 0x5EED)
    streamer = Streamer(writer.port, cycle, seed, uniq_prefix).start()
    if not streamer.first_ack.wait(timeout=FIRST_ACK_TIMEOUT_S):
        streamer.done.set()
        streamer.join()
        pytest.fail(f"seed={seed}: cycle {cycle}: no ack within {FIRST_ACK_TIMEOUT_S} s: {streamer.error}")
    acks_before_kill = kill_rng.randint(*KILL_AFTER_ACKS)
    wait_until(lambda: len(streamer.acks) >= acks_before_kill or streamer.done.is_set(), STREAM_TIMEOUT_S,
               f"cycle {cycle}: {acks_before_kill} acks before the kill", interval_s=0.001)  # fmt: skip
    in_flight = not streamer.done.is_set()
    writer.kill()
    streamer.join()
    assert in_flight and not streamer.completed, (
        f"seed={seed}: cycle {cycle}: the stream finished ({streamer.sent_messages} messages) before the kill"
    )
    assert streamer.error is not None
    assert streamer.error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
        streamer.error
    )
    print(f"  cycle {cycle}: {len(streamer.acks)} of {streamer.sent_messages} sent messages acked before the kill")
    return streamer


# Verification through the store library (read-only)


def assert_acks_stored(root: Path, acks: list[Ack], label: str) -> None:
    """Every acknowledged message is in the commit log at its acked offset, as sent."""
    log = CommitLog(StorePaths(str(root)).commitlog, COMMITLOG_FILE_SIZE)
    try:
        for ack in acks:
            result, message = ack.result, ack.message
            where = f"{label}: cycle {ack.cycle}: ack {result.uniq_key} at commit log offset {result.commitlog_offset}"
            assert decode_offset_msg_id(result.offset_msg_id).commitlog_offset == result.commitlog_offset, where
            record = log.read(result.commitlog_offset)
            assert (record.uniq_key, record.topic, record.queue_id, record.queue_offset, record.size) == (
                result.uniq_key,
                result.topic,
                result.queue_id,
                result.queue_offset,
                result.size,
            ), where
            assert record.store_timestamp_ms == result.store_timestamp_ms, where
            assert record.body == message.body, where
            assert record.keys == (" ".join(message.keys) or None), where
            assert record.tags == (message.tags or None), where
            assert offset_msg_id(record.store_host, record.commitlog_offset) == result.offset_msg_id, where
    finally:
        log.close()


def assert_acks_unique(acks: list[Ack]) -> None:
    offsets = Counter(a.result.commitlog_offset for a in acks)
    assert [o for o, c in offsets.items() if c > 1] == [], "two acks share a commit log offset"
    slots = Counter((a.result.topic, a.result.queue_id, a.result.queue_offset) for a in acks)
    assert [s for s, c in slots.items() if c > 1] == [], "two acks share a (topic, queue id, queue offset)"
    uniq = Counter(a.result.uniq_key for a in acks)
    assert [u for u, c in uniq.items() if c > 1] == [], "two acks share a uniq key"


def assert_every_file_kind_rolled(facts: StoreFacts) -> None:
    assert facts.commitlog_files >= 3, facts
    assert facts.index_files >= 3, facts
    assert facts.most_queue_files >= 2, facts


# The random crash tests


@dataclass
class KillRun:
    acks: list[Ack] = field(default_factory=list)
    kills: int = 0


def run_kill_cycles(start_writer: StartWriter, store: Path, flush: str, kills: int, label: str) -> KillRun:
    """``kills`` cycles of stream + SIGKILL + restart on one store, a clean stop and
    restart in the middle, then a final clean stop."""
    base = base_seed()
    print(f"seed={base} ({label}; {_ENV_SEED}={base} replays it)")
    uniq_prefix = f"{derived_seed(base, label, -1):08X}"
    run = KillRun()
    writer = start_writer(store, flush)
    assert writer.serving["recovered"] == {
        "uncleanShutdown": False,
        "endOffset": 0,
        "stop": "end",
        "redispatchedRecords": 0,
    }
    assert writer.serving["flush"] == flush
    for cycle in range(kills):
        seed = derived_seed(base, label, cycle)
        streamer = stream_and_kill(writer, cycle, seed, uniq_prefix)
        run.kills += 1
        run.acks.extend(streamer.acks)
        try:
            writer = start_writer(store, flush)
        except NodeFailed as error:
            pytest.fail(f"seed={seed}: restart after the kill of cycle {cycle}: {error}")
        recovered = writer.serving["recovered"]
        print(f"  restart after cycle {cycle}: {recovered}")
        assert recovered["uncleanShutdown"] is True, f"seed={seed}: {recovered}"
        assert recovered["stop"] in ("end", "torn"), f"seed={seed}: {recovered}"
        if flush == "sync":
            # Checked at once (the restarted writer idles): nothing acknowledged was lost.
            assert_acks_stored(store, streamer.acks, f"seed={seed}")
        if cycle == kills // 2:
            writer.stop()
            writer = start_writer(store, flush)
            assert writer.serving["recovered"]["uncleanShutdown"] is False
            assert writer.serving["recovered"]["stop"] == "end"
    writer.stop()
    return run


def check_kill_run(store: Path, run: KillRun, label: str) -> StoreFacts:
    """The checks every kill run ends with (the store is stopped cleanly)."""
    check_ok(store)
    facts = verify_store(store)
    print(f"{label}: {run.kills} kills, {len(run.acks)} acks, {facts}")
    assert facts.records >= len(run.acks)
    assert_every_file_kind_rolled(facts)
    return facts


@pytest.mark.slow
def test_sync_flush_survives_sigkill(start_writer: StartWriter, tmp_path: Path) -> None:
    store = tmp_path / "store"
    run = run_kill_cycles(start_writer, store, "sync", SYNC_KILLS, "sync")
    assert run.kills == SYNC_KILLS
    assert len(run.acks) > 0
    assert_acks_unique(run.acks)
    assert_acks_stored(store, run.acks, "sync, after the final clean stop")
    check_kill_run(store, run, "sync")


@pytest.mark.slow
def test_async_flush_survives_sigkill(start_writer: StartWriter, tmp_path: Path) -> None:
    store = tmp_path / "store"
    run = run_kill_cycles(start_writer, store, "async", ASYNC_KILLS, "async")
    assert run.kills == ASYNC_KILLS
    assert len(run.acks) > 0
    check_kill_run(store, run, "async")
    # A SIGKILL keeps the page cache: what the writer wrote before acking survives it.
    assert_acks_unique(run.acks)
    assert_acks_stored(store, run.acks, "async, after the final clean stop")


# Torn tails and the states a SIGKILL leaves at precise points (deterministic)


def send_all(port: int, messages: list[messages_pb2.Message], batch: int = 10) -> list[messages_pb2.SendResult]:
    def batches() -> Iterator[writer_pb2.SendBatchRequest]:
        for start in range(0, len(messages), batch):
            yield writer_pb2.SendBatchRequest(messages=messages[start : start + batch])

    results: list[messages_pb2.SendResult] = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        for response in stub.SendStream(batches(), timeout=STREAM_TIMEOUT_S):
            results.extend(response.results)
    assert len(results) == len(messages)
    return results


def written_store(start_writer: StartWriter, store: Path, messages: list[messages_pb2.Message]) -> list[Ack]:
    """A store holding ``messages``, written by a writer that then stopped cleanly."""
    writer = start_writer(store, "sync")
    results = send_all(writer.port, messages)
    writer.stop()
    return [Ack(0, message, result) for message, result in zip(messages, results)]


def mark_unclean(store: Path) -> None:
    """What a killed writer leaves: the abort marker."""
    Path(StorePaths(str(store)).abort).touch()


def restart_and_verify(start_writer: StartWriter, store: Path, acks: list[Ack], label: str) -> ProcessNode:
    """Restart after a (simulated) kill: the writer must serve, say the shutdown was
    unclean, stop cleanly, and leave a store where everything checks out."""
    writer = start_writer(store, "sync")
    assert writer.serving["recovered"]["uncleanShutdown"] is True
    writer.stop()
    check_ok(store)
    verify_store(store)
    assert_acks_stored(store, acks, label)
    return writer


def plain_messages(count: int, topic: str = "Repro", first: int = 0, **fields: Any) -> list[messages_pb2.Message]:
    """Messages with explicit uniq keys and no KEYS: one index entry each, the same bytes
    every run."""
    return [
        messages_pb2.Message(
            topic=topic, body=bytes([i % 251 + 1]) * (i * 37 % 700), tags="TagA", uniq_key=f"AB{i:030X}", **fields
        )
        for i in range(first, first + count)
    ]


@pytest.mark.parametrize("shape", ["header-only", "half-record"])
def test_torn_tail_is_truncated_on_restart(start_writer: StartWriter, tmp_path: Path, shape: str) -> None:
    """An interrupted last write (a record's first bytes, then zeros, its last byte zero)
    is cut and zeroed on restart; nothing before it changes."""
    store = tmp_path / "store"
    messages = [
        messages_pb2.Message(topic=TOPICS[i % 3], body=bytes([i % 251]) * (i * 7 % 900), keys=[f"torn-{i}"], tags="T")
        for i in range(120)
    ]
    acks = written_store(start_writer, store, messages)
    log_dir = StorePaths(str(store)).commitlog
    log = CommitLog(log_dir, COMMITLOG_FILE_SIZE)
    try:
        stop = log.scan()
        last = log.read(acks[-1].result.commitlog_offset)
        mapped = log.files.find(last.commitlog_offset)
        assert mapped is not None
        at = last.commitlog_offset - mapped.start_offset
        last_bytes = bytes(mapped.buf[at : at + last.size])
        path = Path(log_dir) / mapped.name
        file_start = mapped.start_offset
    finally:
        log.close()
    end = stop.end_offset
    assert (stop.reason, end) == (StopReason.END, last.next_offset)
    position = end - file_start
    # The torn record claims the last record's size: it fits in the file (the scan trusts a
    # size only if it does) and its last byte is zero (it was interrupted).
    assert position + last.size + 8 <= COMMITLOG_FILE_SIZE, "layout changed: no room for the torn record"
    garbage = last_bytes[:40] if shape == "header-only" else last_bytes[: last.size // 2]
    with open(path, "r+b") as handle:
        handle.seek(position)
        assert handle.read(last.size) == bytes(last.size)
        handle.seek(position)
        handle.write(garbage)

    writer = start_writer(store, "sync")
    # The last record is re-dispatched: the index's end offset is its start (idempotent).
    assert writer.serving["recovered"] == {
        "uncleanShutdown": False,
        "endOffset": end,
        "stop": "torn",
        "redispatchedRecords": 1,
    }
    writer.stop()

    with open(path, "rb") as handle:
        handle.seek(position)
        assert handle.read(last.size) == bytes(last.size), "the torn bytes were not zeroed"
    check_ok(store)
    facts = verify_store(store)
    assert (facts.records, facts.end_offset) == (len(messages), end)
    assert_acks_stored(store, acks, f"torn tail ({shape})")


@pytest.mark.parametrize("left", ["empty-hidden", "sized-hidden", "empty-named"])
@pytest.mark.parametrize("kind", ["commitlog", "consumequeue", "index"])
def test_restart_after_a_kill_while_creating_a_file(
    start_writer: StartWriter, tmp_path: Path, kind: str, left: str
) -> None:
    """MappedFile.create sizes a new file under a hidden name, then renames it into place:
    a kill before the rename leaves only the hidden file, empty or sized. A writer that
    created files in place (before that change; seen after random kills, when the writer
    then refused to start: "... is 0 bytes; files here must be exactly N"), like Apache's
    broker, can leave an empty file under the final name. The writer starts, and creates
    the file when it needs it."""
    store = tmp_path / "store"
    paths = StorePaths(str(store))
    if kind == "commitlog":
        acks = written_store(start_writer, store, plain_messages(60))
        # A record did not fit: the BLANK closes the last file, the next one is being made.
        log = CommitLog(paths.commitlog, COMMITLOG_FILE_SIZE)
        try:
            end = log.scan().end_offset
            last = log.files.last
            assert last is not None
            last_name, next_start = last.name, last.end_offset
        finally:
            log.close()
        position = end % COMMITLOG_FILE_SIZE
        assert position > 0
        with open(Path(paths.commitlog) / last_name, "r+b") as handle:
            handle.seek(position)
            handle.write(encode_blank(COMMITLOG_FILE_SIZE - position))
        directory, name, size = Path(paths.commitlog), f"{next_start:020d}", COMMITLOG_FILE_SIZE
        more = plain_messages(60, first=60)
    elif kind == "consumequeue":
        # The queue's first file is full; its second one is being made.
        acks = written_store(start_writer, store, plain_messages(CQ_FILE_UNITS, queue_id=0))
        directory = Path(paths.consumequeue) / "Repro" / "0"
        name, size = f"{CQ_FILE_UNITS * UNIT_SIZE:020d}", CQ_FILE_UNITS * UNIT_SIZE
        more = plain_messages(5, first=CQ_FILE_UNITS, queue_id=0)
    else:
        # One index entry per record: 199 fill the first file; the next one is being made.
        acks = written_store(start_writer, store, plain_messages(INDEX_ENTRIES - 1))
        directory = Path(paths.index)
        # (Hidden names are not index files: the writer allocates the next one ahead.)
        [first_name] = [name for name in os.listdir(directory) if not name.startswith(".")]
        header = ix.decode_header((directory / first_name).read_bytes())
        assert header.index_count == INDEX_ENTRIES
        name, size = ix.file_name(header.end_timestamp_ms + 1), ix.file_size(INDEX_SLOTS, INDEX_ENTRIES)
        more = plain_messages(5, first=INDEX_ENTRIES - 1)
    temp = directory / f".{name}.creating"
    if left == "empty-named":
        (directory / name).write_bytes(b"")
    else:
        temp.write_bytes(b"" if left == "empty-hidden" else bytes(size))
    mark_unclean(store)

    writer = start_writer(store, "sync")
    assert writer.serving["recovered"]["uncleanShutdown"] is True
    acks += [Ack(1, m, r) for m, r in zip(more, send_all(writer.port, more))]
    writer.stop()
    check_ok(store)
    verify_store(store)
    assert_acks_stored(store, acks, f"after a kill while creating a {kind} file")
    if kind != "index":  # an index file is named by the time of its first record: a new name
        assert (directory / name).stat().st_size == size
        assert not temp.exists()
    else:
        assert not (directory / name).exists() or (directory / name).stat().st_size == size


def test_restart_after_a_kill_mid_record_copy(start_writer: StartWriter, tmp_path: Path) -> None:
    """The state seen after random kills: a new (never acknowledged, dispatched or
    published) record whose first 16 bytes are still zero while its bytes up to the next
    page boundary were stored (a memcpy stores in no fixed order). Before the fix the
    writer refused to start ("zeros ... where a record should start, with data after
    them": corruption). It is an interrupted write, so a torn tail: cut and zeroed."""
    store = tmp_path / "store"
    # The last record is larger than a page, so its copy straddles a page boundary.
    big = messages_pb2.Message(topic="Repro", body=b"\xab" * 6000, tags="TagA", uniq_key="CD" + "0" * 30)
    acks = written_store(start_writer, store, [*plain_messages(39), big])
    log_dir = StorePaths(str(store)).commitlog
    log = CommitLog(log_dir, COMMITLOG_FILE_SIZE)
    try:
        end = log.scan().end_offset
        last = log.read(acks[-1].result.commitlog_offset)
        mapped = log.files.find(last.commitlog_offset)
        assert mapped is not None
        at = last.commitlog_offset - mapped.start_offset
        partial = bytearray(mapped.buf[at : at + last.size])
        path = Path(log_dir) / mapped.name
    finally:
        log.close()
    position = end % COMMITLOG_FILE_SIZE
    assert position + len(partial) + 8 <= COMMITLOG_FILE_SIZE
    patch_offsets(partial, 0, queue_offset=last.queue_offset + 1, commitlog_offset=end)
    to_page = PAGE - position % PAGE
    assert 16 < to_page < len(partial), "layout changed: the copied record must straddle a page boundary"
    partial[:16] = bytes(16)
    partial[to_page:] = bytes(len(partial) - to_page)
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(partial)
    mark_unclean(store)
    writer = restart_and_verify(start_writer, store, acks, "after a record copy interrupted before its head")
    assert (writer.serving["recovered"]["stop"], writer.serving["recovered"]["endOffset"]) == ("torn", end)
    with open(path, "rb") as handle:
        handle.seek(position)
        assert handle.read(len(partial)) == bytes(len(partial))


def test_restart_after_a_kill_between_index_slot_and_count(start_writer: StartWriter, tmp_path: Path) -> None:
    """The state a SIGKILL leaves inside IndexFile.put_key after the entry and the slot
    were written but not yet the header's indexCount (nor endPhyOffset after it). Seen
    after random kills: the entry was reused with prevIndex = itself and the slot's older
    chain orphaned (unreachable entries, keys not found)."""
    store = tmp_path / "store"
    acks = written_store(start_writer, store, plain_messages(60))
    index_dir = Path(StorePaths(str(store)).index)
    [name] = os.listdir(index_dir)
    path = index_dir / name
    data = bytearray(path.read_bytes())
    header = ix.decode_header(data)
    last = header.index_count - 1
    entry = ix.decode_entry(data, ix.entry_position(INDEX_SLOTS, last))
    previous = ix.decode_entry(data, ix.entry_position(INDEX_SLOTS, last - 1))
    assert entry.phy_offset == acks[-1].result.commitlog_offset
    assert entry.prev_index > 0, "layout changed: the last key's slot must hold an older chain"
    data[: ix.HEADER_SIZE] = ix.encode_header(replace(header, index_count=last, end_phy_offset=previous.phy_offset))
    path.write_bytes(bytes(data))
    mark_unclean(store)
    restart_and_verify(start_writer, store, acks, "after a kill inside put_key")


def test_restart_after_a_kill_mid_unit_write(start_writer: StartWriter, tmp_path: Path) -> None:
    """The state seen after random kills: the last consume queue unit has its offset and
    size but not the low half of its tagsCode (the unit's last 4 bytes). Re-dispatch must
    rewrite it, not skip the queue offset because something is there."""
    store = tmp_path / "store"
    acks = written_store(start_writer, store, plain_messages(30, queue_id=1))
    last = acks[-1].result
    path = Path(StorePaths(str(store)).consumequeue) / "Repro" / "1" / f"{0:020d}"
    data = bytearray(path.read_bytes())
    unit_end = (last.queue_offset + 1) * UNIT_SIZE
    assert data[unit_end - 4 : unit_end] != bytes(4), "the tags code must have a non-zero low half"
    data[unit_end - 4 : unit_end] = bytes(4)
    path.write_bytes(bytes(data))
    mark_unclean(store)
    restart_and_verify(start_writer, store, acks, "after a torn consume queue unit")


def test_restart_after_a_kill_before_an_index_header_is_written(start_writer: StartWriter, tmp_path: Path) -> None:
    """An all-zero newest index file (no entries, no header: what a writer killed after
    sizing a new index file but before writing its header left, seen after random kills
    before index files were made under a hidden name). Before the fix recovery took its
    endPhyOffset 0 as the end of the index and re-indexed the whole log into it: every
    entry twice, and restarts slow in proportion to the log. The restart must not re-index
    what the other files hold."""
    store = tmp_path / "store"
    acks = written_store(start_writer, store, plain_messages(INDEX_ENTRIES + 50))  # two index files
    index_dir = Path(StorePaths(str(store)).index)
    names = sorted(os.listdir(index_dir))
    assert len(names) == 2
    last_header = ix.decode_header((index_dir / names[-1]).read_bytes())
    new_name = ix.file_name(last_header.end_timestamp_ms + 1)
    assert new_name > names[-1]
    (index_dir / new_name).write_bytes(bytes(ix.file_size(INDEX_SLOTS, INDEX_ENTRIES)))
    mark_unclean(store)

    writer = restart_and_verify(start_writer, store, acks, "after an index file without header")
    # Like a clean restart: only the last record (the index's end) is re-dispatched.
    assert writer.serving["recovered"]["redispatchedRecords"] == 1, writer.serving
    index = IndexFileList(str(index_dir), INDEX_SLOTS, INDEX_ENTRIES)
    try:
        for ack in acks:
            found = list(index.candidates(ack.result.topic, ack.result.uniq_key))
            assert found.count(ack.result.commitlog_offset) == 1, (ack.result.uniq_key, found)
    finally:
        index.close()
