"""A full disk, on a small file system each test mounts (tmpfs, as root): the writer
refuses writes cleanly (RESOURCE_EXHAUSTED, never SIGBUS), keeps serving its status,
takes writes again once space returns without a restart, and the store checks clean at
every step: every acknowledged message is there, no refused one is.

Filled by the writer itself (its next commit log file finds no room) and by another
process (a file written until ENOSPC while the writer runs), under SYNC and ASYNC, with
the disk ratios at 1.0 (only ENOSPC refuses) and at their defaults (the full ratio
refuses first)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest
from conftest import SMALL_FS_BYTES
from support.nodes import Nodes
from support.stores import SIZE_ARGS, SMALL, check_ok, fill
from support.wait import wait_until

from rmqstore.common.codec.checkpoint import FILE_SIZE, decode_checkpoint
from rmqstore.common.files.check import check_store
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.store import StorePaths
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

pytestmark = pytest.mark.crash

COMMITLOG_FILE_SIZE = SMALL.commitlog_file_size_bytes
FS_BYTES = SMALL_FS_BYTES  # 16 commit log files of 64 KiB
BODY_BYTES = 700
BATCH = 8
SENDS_MAX = 400  # bounded: the disk fills long before (64 KiB files, ~6 KiB a batch)
RECOVER_TIMEOUT_S = 10.0
RPC_TIMEOUT_S = 20.0
DISK_CHECK_WAIT_S = 0.3
CHECKPOINT_WITHIN_S = 10.0
RATIOS_OFF = ("--disk-full-ratio", "1.0", "--disk-clean-ratio", "1.0")


class Sender:
    """Sends batches of distinct messages; remembers which were acknowledged and which
    refused, and how."""

    def __init__(self, port: int):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = writer_pb2_grpc.WriterServiceStub(self.channel)
        self.number = 0
        self.acked: list[tuple[messages_pb2.Message, messages_pb2.SendResult]] = []
        self.refused: list[messages_pb2.Message] = []
        self.refusals: list[tuple[grpc.StatusCode, str]] = []

    def send(self, topic: str) -> bool:
        """One batch; True if acknowledged, False if refused (any other outcome fails)."""
        batch = []
        for _ in range(BATCH):
            self.number += 1
            batch.append(
                messages_pb2.Message(
                    topic=topic,
                    body=bytes([self.number % 251]) * BODY_BYTES,
                    keys=[f"k{self.number}"],
                    uniq_key=f"DF{self.number:030X}",
                )
            )
        try:
            response = self.stub.SendBatch(
                writer_pb2.SendBatchRequest(messages=batch), timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError as error:
            self.refused.extend(batch)
            self.refusals.append((error.code(), error.details() or ""))
            return False
        assert len(response.results) == len(batch)
        self.acked.extend(zip(batch, response.results))
        return True

    def status(self) -> writer_pb2.StatusResponse:
        return self.stub.Status(writer_pb2.StatusRequest(), timeout=RPC_TIMEOUT_S)

    def close(self) -> None:
        self.channel.close()


def ballast(mount: Path, name: str, size: int) -> None:
    with open(mount / name, "wb") as handle:
        handle.write(bytes(size))


def assert_store_holds(store: Path, sender: Sender, label: str) -> None:
    """Every acknowledged message is at its acked offset (unless retention deleted its
    commit log file); no refused message is anywhere in the log."""
    log = CommitLog(StorePaths(str(store)).commitlog, COMMITLOG_FILE_SIZE)
    try:
        present = {record.uniq_key: record for record in log.records()}
        retained_from = log.min_offset
    finally:
        log.close()
    for message, result in sender.acked:
        if result.commitlog_offset < retained_from:
            continue  # its file was deleted by retention (default ratios only)
        record = present.get(message.uniq_key)
        assert record is not None, (
            f"{label}: acknowledged {message.uniq_key} is missing"
        )
        assert (record.commitlog_offset, record.queue_offset, record.body) == (
            result.commitlog_offset,
            result.queue_offset,
            message.body,
        ), label
    stored_refused = [m.uniq_key for m in sender.refused if m.uniq_key in present]
    assert stored_refused == [], (
        f"{label}: messages answered as refused are in the store"
    )


@pytest.mark.parametrize("ratios", ["1.0", "default"])
@pytest.mark.parametrize("filler", ["writer", "other"])
@pytest.mark.parametrize("flush", ["sync", "async"])
def test_disk_full(
    small_fs: Path, nodes: Nodes, flush: str, filler: str, ratios: str
) -> None:
    label = f"{flush}, filled by {filler}, ratios {ratios}"
    store = small_fs / "store"
    if filler == "writer":
        # Most of the space is taken before the writer starts; its own files take the rest.
        ballast(small_fs, "ballast", FS_BYTES - 5 * COMMITLOG_FILE_SIZE)
    writer = nodes.start("writer", store, "--flush", flush, *SIZE_ARGS, *(RATIOS_OFF if ratios == "1.0" else ()))
    sender: Sender | None = None
    try:
        sender = Sender(writer.port)
        assert sender.send("Full"), sender.refusals
        if filler == "other":
            fill(small_fs, "ballast")
            if ratios == "default":
                # Waiting past the writer's disk-check interval (0.1 s) is the point: its
                # next append looks at the disk again and finds it above the full ratio.
                time.sleep(DISK_CHECK_WAIT_S)
        for _ in range(SENDS_MAX):
            if not sender.send("Full"):
                break
        refused_before = len(sender.refusals)
        # Full: a new topic needs new files; an existing one may still have room.
        assert not sender.send("FullNew"), (
            f"{label}: a new topic was accepted on a full disk"
        )
        sender.send("Full")
        assert writer.proc.poll() is None, (
            f"{label}: the writer died (exit {writer.proc.returncode})"
        )
        assert refused_before >= (1 if filler == "writer" else 0)
        assert sender.refusals, label
        for code, details in sender.refusals:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (label, code, details)
            assert "disk" in details, (label, details)
        if filler == "other" and ratios == "default":
            assert all(
                "above the full ratio 90%" in details for _, details in sender.refusals
            ), sender.refusals
        if ratios == "1.0":
            assert all(
                "No space left on device" in details for _, details in sender.refusals
            ), sender.refusals
        status = sender.status()
        assert status.commitlog_max_offset > 0
        report = check_store(str(store), SMALL)
        assert report.ok, f"{label}, full: {report.problems[:5]}"

        os.unlink(small_fs / "ballast")
        wait_until(lambda: sender.send("FullNew"), RECOVER_TIMEOUT_S, f"{label}: a write accepted once space returned",
                   interval_s=0.05)  # fmt: skip
        assert sender.send("Full"), sender.refusals[-1]
        assert writer.proc.poll() is None
        writer.stop()
    finally:
        if sender is not None:
            sender.close()
    if ratios == "1.0":
        check_ok(store)
    else:
        assert check_store(str(store), SMALL).ok
    assert_store_holds(store, sender, label)


def test_stop_on_a_full_disk_is_clean(small_fs: Path, nodes: Nodes) -> None:
    """SIGTERM while the disk is full: exit 0, the previous checkpoint kept, check clean."""
    store = small_fs / "store"
    writer = nodes.start("writer", store, "--flush", "sync", *SIZE_ARGS, *RATIOS_OFF)
    sender: Sender | None = None
    try:
        sender = Sender(writer.port)
        assert sender.send("Full"), sender.refusals
        stored_ms = sender.acked[-1][1].store_timestamp_ms

        def checkpointed() -> bytes | None:
            """The checkpoint once a periodic flush has recorded the batch."""
            data = (store / "checkpoint").read_bytes() if (store / "checkpoint").exists() else b""
            if len(data) < FILE_SIZE:
                return None
            recorded = decode_checkpoint(data)
            return data if min(recorded.physic_msg_timestamp_ms, recorded.logics_msg_timestamp_ms) >= stored_ms else None

        checkpoint = wait_until(checkpointed, CHECKPOINT_WITHIN_S, "a periodic flush to checkpoint the batch")
        fill(small_fs, "ballast")
        assert not sender.send("FullNew")
        writer.stop()  # asserts the stopped line and exit code 0
    finally:
        if sender is not None:
            sender.close()
    assert (store / "checkpoint").read_bytes() == checkpoint  # the previous one, whole
    check_ok(store)
    assert_store_holds(store, sender, "stopped while full")
