"""Shared test fixtures: the Apache-written stores and their geometry, and the harness's
nodes (tests/support)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from support.acl import ACL, Guarded
from support.nodes import Nodes
from support.pki import Pki, make_pki
from support.tmpfs import can_mount, tmpfs

from rmqstore.common.files.store import StoreSizes

# Hypothesis's deadline (200 ms an example by default) times the machine, not the code:
# CI's three workers share two cores with the static checks and other jobs, and a stalled
# example failed a pure function's round trip. No test means a deadline; a profile loaded
# before this one (.ci/sanitize's, which has none) stays.
if settings().deadline is not None:
    settings.register_profile("shared-machine", deadline=None)
    settings.load_profile("shared-machine")

# Every JVM a test starts (Spark's, in this process or in a command's) compiles with the
# quick compiler only: the tests' Spark jobs are small and short, and the optimizing
# compiler's work, which pays off only in long jobs, was about a third of their CPU
# (benchmarks/CI.md, "Seventh round"). A value already set is kept.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")

FIXTURES = Path(__file__).parent / "fixtures" / "rocketmq-4.9.4-dev"
CLEAN = FIXTURES / "store-clean"
CRASHED = FIXTURES / "store-crashed"
# The dev fixture's MessageStoreConfig (fixtures/rocketmq-4.9.4-dev/README.md).
FIXTURE_SIZES = StoreSizes(
    commitlog_file_size_bytes=524288, cq_file_units=200, index_slots=500, index_entries=1500
)
FIXTURE_SIZE_ARGS = ["--index-slots", "500", "--index-entries", "1500"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker (.ci/run: ``-n 3 --dist loadfile --no-loadscope-reorder``,
    which hands out whole modules in collection order), the modules holding a test marked
    slow or spark first, then the rest, each group in pytest's order: the long modules
    start early and the many short ones fill both workers up to the end, instead of a long
    module handed out last running alone on one worker. A module's tests keep their order;
    a run without workers keeps pytest's order."""
    if not hasattr(config, "workerinput"):
        return
    long_modules = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("spark")}
    items.sort(key=lambda item: item.path not in long_modules)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture
def clean_copy(tmp_path: Path) -> Path:
    """A writable copy of the clean Apache store."""
    target = tmp_path / "store"
    shutil.copytree(CLEAN, target)
    for dirpath, _, names in os.walk(target):
        os.chmod(dirpath, 0o755)
        for name in names:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return target


SMALL_FS_BYTES = 1 << 20


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of SMALL_FS_BYTES mounted for the test (a disk that fills up), unmounted
    after it. Mounting needs root, which CI has."""
    if not can_mount():
        pytest.skip("mounting a small file system needs root (CI runs as root)")
    with tmpfs(tmp_path / "fs", SMALL_FS_BYTES) as mount:
        yield mount


MEMORY_FS_BYTES = 2 << 30


@pytest.fixture
def memory_fs(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs (up to MEMORY_FS_BYTES, in memory) for a test whose subject
    is not the disk but which creates and syncs many files: their fsyncs cost nothing
    there. Mounted where the test runs as root (CI does), else the test's tmp_path."""
    if not can_mount():
        yield tmp_path
        return
    with tmpfs(tmp_path / "memory", MEMORY_FS_BYTES) as mount:
        yield mount


@pytest.fixture(autouse=True)
def _node_logging_undone() -> Iterator[None]:
    """A command run in this process (``main([... "serve" ...])``) sets up the nodes' JSON
    log lines for the process; undo it after each test, so that the next test's own
    set-up and pytest's log capture see the loggers as they were."""
    yield
    from rmqstore.service import logs

    if logs._handlers:
        logs.unconfigure_logging()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    """Node processes (writer, query node, console) with their stderr under tmp_path, every
    one still running killed after the test."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    started = Nodes(log_dir)
    yield started
    started.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA, server and client certificates (support/pki.py), one set per module."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Guarded]:
    """A writer and a query node in this process on one store, both under support/acl.py's ACL."""
    acl_path = tmp_path / "acl.yaml"
    acl_path.write_text(ACL)
    started = Guarded(tmp_path / "store", acl_path)
    yield started
    started.close()
