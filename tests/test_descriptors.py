"""Descriptors and failures after the append.

* Mapped files hold no descriptor: a store of many queues runs under ``prlimit
  --nofile=1024`` (the writer through gRPC, a restart, ``check``, a query node).
* A process out of descriptors refuses a write that needs a new file (RESOURCE_EXHAUSTED,
  nothing stored) and takes it once descriptors return, without a restart; writes that
  need no new file go on (SYNC included: the commit log's file holds its descriptor).
* A dispatch that fails after the commit log write (here: a second index roll-over in
  one batch on a full disk) keeps the records, publishes none of them, answers
  UNAVAILABLE naming their offsets and the cause, refuses writes meanwhile, and completes
  once space returns.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.nodes import Nodes, ProcessNode
from support.powerloss import recording
from support.stores import SMALL, check_ok, fill, verify_store

from rmqstore.common.errors import OutOfResources, Unavailable
from rmqstore.common.files.progress import read_progress
from rmqstore.common.files.store import StorePaths
from rmqstore.query.view import StoreView
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc
from rmqstore.writer.config import FlushPolicy, WriterConfig
from rmqstore.writer.store import Writer
from rmqstore.writer.validate import MessageInput

SPARE_DESCRIPTORS = (
    24  # left to the process below the limit while the test holds the rest
)
HOG_MAX = 100_000  # bounded: the lowered limit is reached long before


def message(
    topic: str, n: int, *, keys: int = 1, queue_id: int | None = 0
) -> MessageInput:
    return MessageInput(
        topic=topic,
        body=f"body-{n}".encode(),
        keys=[f"k{n}-{i}" for i in range(keys)],
        uniq_key=f"FD{n:030X}",
        queue_id=queue_id,
    )


@pytest.fixture
def writer_factory(tmp_path: Path) -> Iterator[list[Writer]]:
    writers: list[Writer] = []
    yield writers
    for writer in writers:
        writer.close()


def open_writer(
    store: Path, writers: list[Writer], flush: FlushPolicy = FlushPolicy.SYNC
) -> Writer:
    # The disk ratios at 1.0: only a full file system refuses (the tests fill one).
    config = WriterConfig(store=str(store), sizes=SMALL, flush=flush, disk_full_ratio=1.0, disk_clean_ratio=1.0)
    writer = Writer(config)
    writers.append(writer)
    return writer


def hog_descriptors() -> list[int]:
    """Take every descriptor the process may still open (under a limit lowered to a few
    above those open now), as a process flooded with connections would have none left."""
    fds: list[int] = []
    try:
        for _ in range(HOG_MAX):
            fds.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as error:
        assert error.errno == errno.EMFILE, error
    else:
        pytest.fail(f"{HOG_MAX} descriptors opened without EMFILE")
    return fds


@pytest.fixture
def low_nofile() -> Iterator[None]:
    """The soft descriptor limit a few above what the process holds, restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + SPARE_DESCRIPTORS, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_emfile_refuses_new_files_cleanly_and_heals(
    tmp_path: Path, writer_factory: list[Writer], low_nofile: None
) -> None:
    store = tmp_path / "store"
    writer = open_writer(store, writer_factory)
    writer.append([message("Existing", n) for n in range(5)])
    end = writer.log.write_offset
    fds = hog_descriptors()
    try:
        # A new topic needs new consume queue files: refused before the commit log is touched.
        with pytest.raises(OutOfResources) as refused:
            writer.append([message("Newcomer", 100)])
        assert "Too many open files" in str(refused.value)
        assert "the batch was not stored" in str(refused.value)
        assert writer.log.write_offset == end
        # Writes that need no new file go on, SYNC acknowledgement included.
        stored = writer.append([message("Existing", n) for n in range(5, 10)])
        assert [r.queue_offset for r in stored] == [5, 6, 7, 8, 9]
        assert writer.dispatch_pending is None
    finally:
        for fd in fds:
            os.close(fd)
    # Descriptors are back: the same write is taken, without a restart.
    [again] = writer.append([message("Newcomer", 100)])
    assert (again.topic, again.queue_id, again.queue_offset) == ("Newcomer", 0, 0)
    writer.close()
    check_ok(store)
    facts = verify_store(store)
    assert facts.records == 11


def test_dispatch_failing_after_the_append_completes_once_space_returns(
    small_fs: Path,
    writer_factory: list[Writer],
) -> None:
    store = small_fs / "store"
    writer = open_writer(store, writer_factory)
    writer.append([message("Keys", 0)])
    page = os.statvfs(small_fs).f_bsize
    # Room for exactly one more index file: the spare allocated before the batch takes
    # it, so the batch's first index roll-over works and its second meets a full disk.
    index_bytes = (
        -(-os.path.getsize(next(Path(StorePaths(str(store)).index).iterdir())) // page)
        * page
    )
    with open(small_fs / "reserve", "wb") as handle:
        handle.write(bytes(index_bytes))
    fill(small_fs, "ballast")
    os.unlink(small_fs / "reserve")
    before = writer.log.write_offset
    assert before is not None
    # 20 messages of 20 keys and a uniq key: 420 index entries, over two files of 200.
    big = [message("Keys", n, keys=20) for n in range(1, 21)]
    with pytest.raises(Unavailable) as failed:
        writer.append(big)
    text = str(failed.value)
    assert f"the batch is in the commit log at offsets [{before}, " in text
    assert "No space left on device" in text
    assert "its messages become visible once the dispatch completes" in text
    after = writer.log.write_offset
    assert after is not None and after > before
    # Nothing of it is published: a query node sees the store as it was.
    progress = read_progress(writer.config.store)
    assert progress is not None and progress.dispatched_offset == before
    view = StoreView(str(store), SMALL)
    try:
        view.refresh(force=True)
        assert view.by_uniq_key("Keys", big[0].uniq_key) == []
        assert len(view.by_uniq_key("Keys", message("Keys", 0).uniq_key)) == 1
    finally:
        view.close()
    # Writes are refused meanwhile, naming the cause.
    with pytest.raises(Unavailable) as refused:
        writer.append([message("Keys", 50)])
    assert (
        f"writes are refused until the dispatch of commit log [{before}, {after}) failed"
        in str(refused.value)
    )
    assert writer.retry_dispatch() is False
    # Space returns: the next write completes the dispatch first, then is stored.
    os.unlink(small_fs / "ballast")
    [stored] = writer.append([message("Keys", 51)])
    assert stored.commitlog_offset == after and stored.queue_offset == 21
    assert writer.dispatch_pending is None
    progress = read_progress(writer.config.store)
    assert (
        progress is not None and progress.dispatched_offset == writer.log.write_offset
    )
    # Dispatched now: the query node finds the batch.
    view = StoreView(str(store), SMALL)
    try:
        view.refresh(force=True)
        found = view.by_uniq_key("Keys", big[0].uniq_key)
        assert [r.commitlog_offset for r in found] == [before]
    finally:
        view.close()
    writer.close()
    check_ok(store)
    facts = verify_store(store)
    assert (
        facts.records == 22
    )  # the one before, the 20 whose answer named their offsets, the last


SIZE_ARGS = [
    "--commitlog-file-size",
    str(1 << 20),
    "--cq-file-units",
    "50",
    "--index-slots",
    "17",
    "--index-entries",
    "200",
]
SERVE_TIMEOUT_S = 120.0


def serve_under_limit(nodes: Nodes, store: Path, nofile: int) -> ProcessNode:
    # A restart opens every queue first: SERVE_TIMEOUT_S, not the harness's usual wait.
    args = ["writer", "serve", "--store", str(store), "--host", "127.0.0.1", "--port", "0", "--flush", "async", *SIZE_ARGS]
    writer = nodes.spawn("writer", args, prefix=["prlimit", f"--nofile={nofile}", "--"])
    writer.wait_serving(SERVE_TIMEOUT_S)
    return writer


def many_queues(nodes: Nodes, tmp_path: Path, topics: int, queues_per_topic: int) -> None:
    """``topics`` × ``queues_per_topic`` queues, each written, under --nofile=1024. The
    tests give a tmpfs (``memory_fs``): descriptors are the subject, and each new queue
    file's syncs on a shared disk made the 50,000 queues CI's slowest test
    (benchmarks/CI.md)."""
    store = tmp_path / "store"
    writer = serve_under_limit(nodes, store, 1024)
    with grpc.insecure_channel(writer.endpoint) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        for t in range(topics):
            topic = f"Many{t}"
            stub.CreateTopic(
                writer_pb2.CreateTopicRequest(
                    name=topic, queue_count=queues_per_topic
                ),
                timeout=60,
            )
            batch = [
                messages_pb2.Message(
                    topic=topic, queue_id=q, body=b"x", keys=[f"{topic}-{q}"]
                )
                for q in range(queues_per_topic)
            ]
            response = stub.SendBatch(
                writer_pb2.SendBatchRequest(messages=batch), timeout=SERVE_TIMEOUT_S
            )
            assert [(r.queue_id, r.queue_offset) for r in response.results] == [
                (q, 0) for q in range(queues_per_topic)
            ]
        status = stub.Status(writer_pb2.StatusRequest(), timeout=60)
        assert len(status.queues) == topics * queues_per_topic
    writer.stop()
    # A restart opens every queue, under the same limit, and takes a write to each topic.
    writer = serve_under_limit(nodes, store, 1024)
    assert writer.serving["recovered"]["uncleanShutdown"] is False, writer.serving
    with grpc.insecure_channel(writer.endpoint) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        for t in range(topics):
            [result] = stub.SendBatch(
                writer_pb2.SendBatchRequest(
                    messages=[
                        messages_pb2.Message(
                            topic=f"Many{t}", queue_id=0, body=b"y"
                        )
                    ]
                ),
                timeout=60,
            ).results
            assert result.queue_offset == 1
    writer.stop()
    # The store checked by the command, under the same limit (its output names any problem).
    check = subprocess.run(
        [
            "prlimit",
            "--nofile=1024",
            "--",
            sys.executable,
            "-m",
            "rmqstore.cli.main",
            "check",
            str(store),
            *SIZE_ARGS,
        ],
        capture_output=True,
        text=True,
        timeout=SERVE_TIMEOUT_S * 5,
        check=False,
    )
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]


def test_2000_queues_under_nofile_1024(nodes: Nodes, memory_fs: Path) -> None:
    """Twice as many queues as the limit has descriptors (1,004 queues broke the writer
    when each mapped file held one)."""
    many_queues(nodes, memory_fs, 2, 1000)


@pytest.mark.slow
def test_50000_queues_under_nofile_1024(nodes: Nodes, memory_fs: Path) -> None:
    many_queues(nodes, memory_fs, 50, 1000)


def test_checkpoint_write_on_a_full_disk_keeps_the_previous_one(small_fs: Path) -> None:
    from rmqstore.common.codec.checkpoint import Checkpoint
    from rmqstore.common.files.checkpoint import read_checkpoint, write_checkpoint

    path = str(small_fs / "checkpoint")
    first = Checkpoint(1700000000123, 1700000000000, 0)
    write_checkpoint(path, first)
    fill(small_fs, "ballast")
    with pytest.raises(OSError) as full:
        write_checkpoint(path, Checkpoint(1700000000999, 1700000000500, 1700000000001))
    assert full.value.errno == errno.ENOSPC
    assert read_checkpoint(path) == first
    assert os.path.getsize(path) == 4096
    assert sorted(os.listdir(small_fs)) == ["ballast", "checkpoint"]  # no temporary file left


def test_periodic_flush_syncs_only_files_written_since_the_last(tmp_path: Path, writer_factory: list[Writer]) -> None:
    store = tmp_path / "store"
    writer = open_writer(store, writer_factory, FlushPolicy.ASYNC)
    writer.topics.create("Wide", 200)
    writer.append([message("Wide", q, queue_id=q) for q in range(200)])
    writer.flush_thoroughly()
    writer.append([message("Wide", 1000, queue_id=7)])
    with recording(str(store)) as recorder:
        writer.flush_thoroughly()
    # The commit log file, queue Wide/7's file, the index file, progress, and the
    # checkpoint (its file and its directory): not the 199 queues left untouched.
    assert recorder.syncs == 6, recorder.syncs
    with recording(str(store)) as recorder:
        writer.flush_thoroughly()
    assert recorder.syncs == 3, recorder.syncs  # nothing written: progress and the checkpoint (file, directory)


def test_mapped_files_hold_no_descriptor(tmp_path: Path) -> None:
    from rmqstore.common.files.mapped import MappedFile

    before = len(os.listdir("/proc/self/fd"))
    files = [MappedFile.create(str(tmp_path / f"{n:020d}"), 8192, n * 8192) for n in range(300)]
    try:
        assert len(os.listdir("/proc/self/fd")) == before
        files[5].write(10, b"abc")
        assert bytes(files[5].buf[10:13]) == b"abc"
        view = files[5].buf[10:13]
    finally:
        for mapped in files:
            mapped.close()
    assert bytes(view) == b"abc"  # a view that outlives close stays readable: unmapped after it
    with pytest.raises(ValueError):
        files[5].release()
    reopened = MappedFile(str(tmp_path / f"{5:020d}"), 8192, 5 * 8192, writable=False)
    assert bytes(reopened.buf[10:13]) == b"abc"
    reopened.close()


def test_read_descriptors_stay_within_their_budget(tmp_path: Path) -> None:
    """Reads through the file keep descriptors open for the next read, but no more than
    the budget: a node reading many commit log files does not run out."""
    from rmqstore.common.files.mapped import MappedFile, ReadDescriptors

    budget = ReadDescriptors(8)
    files = [MappedFile.create(str(tmp_path / f"{n:020d}"), 8192, n * 8192) for n in range(40)]
    try:
        for n, mapped in enumerate(files):
            mapped.write(0, n.to_bytes(4, "big"))
        before = len(os.listdir("/proc/self/fd"))
        for n, mapped in enumerate(files):
            with budget.using(mapped) as fd:
                assert os.pread(fd, 4, 0) == n.to_bytes(4, "big")
            assert len(budget) <= 8
        assert len(os.listdir("/proc/self/fd")) == before + 8
        # In use at once: more than the budget, each read seeing its own file.
        with budget.using(files[0]) as a, budget.using(files[1]) as b:
            assert (os.pread(a, 4, 0), os.pread(b, 4, 0)) == (b"\0\0\0\0", b"\0\0\0\1")
        for mapped in files:
            budget.discard(mapped)
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        for mapped in files:
            mapped.close()
