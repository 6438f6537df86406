"""A consume queue's disk use follows its data, not its file size (issue 40, finding 7):
a real writer process on a tmpfs of its own, 20,000 queues each given one 1-byte message,
the store's files then counted by their blocks. The files keep RocketMQ's size and bytes
(docs/format.md): only the blocks of their holes are not allocated."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.nodes import Nodes
from support.tmpfs import can_mount, tmpfs

from rmqstore.common.codec import consumequeue as cq
from rmqstore.common.files.consumequeue import ConsumeQueue
from rmqstore.v1 import messages_pb2, writer_pb2

TOPICS = 20
QUEUES_PER_TOPIC = 1000
DISK_USE_MAX_BYTES = 100 * 1000 * 1000
FS_BYTES = 512 << 20
RPC_TIMEOUT_S = 120.0
# Small commit log and index files: the subject is what grows with the queues.
SIZE_ARGS = ["--commitlog-file-size", str(16 << 20), "--index-slots", "5000", "--index-entries", "40000"]


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of FS_BYTES: a volume the test owns, which a store reserving 6 MB per
    queue would fill after about 80 queues."""
    if not can_mount():
        pytest.skip("mounting a file system needs root (CI runs as root)")
    with tmpfs(tmp_path / "volume", FS_BYTES) as mount:
        yield mount


def blocks_bytes(root: Path) -> int:
    """The disk the files under ``root`` take (their allocated blocks)."""
    return sum(os.stat(os.path.join(path, name)).st_blocks * 512 for path, _, names in os.walk(root) for name in names)


@pytest.mark.slow
def test_twenty_thousand_queues_of_one_byte_take_under_100_mb(nodes: Nodes, volume: Path) -> None:
    store = volume / "store"
    writer = nodes.start("writer", store, *SIZE_ARGS)
    stub = nodes.writer(writer)
    for t in range(TOPICS):
        topic = f"Many{t}"
        stub.CreateTopic(writer_pb2.CreateTopicRequest(name=topic, queue_count=QUEUES_PER_TOPIC), timeout=RPC_TIMEOUT_S)
        batch = [messages_pb2.Message(topic=topic, queue_id=q, body=b"x") for q in range(QUEUES_PER_TOPIC)]
        results = stub.SendBatch(writer_pb2.SendBatchRequest(messages=batch), timeout=RPC_TIMEOUT_S).results
        assert [r.queue_offset for r in results] == [0] * QUEUES_PER_TOPIC
    writer.stop()
    queues = blocks_bytes(store / "consumequeue")
    whole = blocks_bytes(store)
    print(f"{TOPICS * QUEUES_PER_TOPIC} queues: consume queues {queues / 1e6:.1f} MB, the whole store {whole / 1e6:.1f} MB")
    assert queues < DISK_USE_MAX_BYTES
    assert whole < DISK_USE_MAX_BYTES + (16 << 20) + (2 << 20)  # and the one commit log file and index file
    # Each file keeps RocketMQ's size, its unit where a reader looks for it.
    sample = ConsumeQueue(str(store / "consumequeue"), "Many7", 999)
    try:
        (mapped,) = sample.files
        assert os.path.getsize(mapped.path) == cq.DEFAULT_FILE_UNITS * cq.UNIT_SIZE
        ((offset, unit),) = sample.units()
        assert offset == 0 and unit.size > 0 and unit.commitlog_offset >= 0
    finally:
        sample.close()
