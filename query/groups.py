"""Consumer groups' progress as a query node reports it, read-only.

The writer keeps each group's next offset per queue in ``config/consumerOffset.json``
(common.files.consumer_offsets, Apache RocketMQ 4.9's layout) and replaces the file
atomically. A query node reads it again only when it changed: every lookup compares the
file's (and its ``.bak``'s) inode, modification time and size with what it last read,
two stat calls, so a replaced file is seen by the next lookup and an unchanged one costs
no parsing.

A group's lag on a queue is the queue's max offset (one past its newest visible message,
what mqadmin calls the broker offset) minus the group's offset; 0 when the group's offset
is past the end (a store whose queue was truncated), so totals never shrink by a negative.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmqstore.common.codec.topic import topic_problem
from rmqstore.common.errors import InvalidArgument, NotFound
from rmqstore.common.files import consumer_offsets
from rmqstore.common.files.consumer_offsets import OffsetTable

if TYPE_CHECKING:  # the command line imports this module for its default, not the view
    from rmqstore.query.view import StoreView

# What the writer reports as its broker name unless told otherwise (writer serve
# --broker-name); a query node of a store says the same unless told otherwise.
BROKER_NAME_DEFAULT = "rmqstore-0"
# RocketMQ's group names: the topic charset, at most 255 characters (its Validators).
GROUP_LENGTH_MAX = 255
_GROUP = re.compile(r"[%|a-zA-Z0-9_-]+")

# (inode, mtime ns, size) of a file, None when it is missing.
_FileState = tuple[int, int, int] | None


def group_problem(group: str) -> str | None:
    """Why ``group`` cannot name a consumer group, or None."""
    if not group:
        return "the consumer group is blank"
    if len(group) > GROUP_LENGTH_MAX:
        return f"the consumer group is {len(group)} characters; at most {GROUP_LENGTH_MAX} are allowed"
    if not _GROUP.fullmatch(group):
        return f"the consumer group {group!r} contains characters outside [%|a-zA-Z0-9_-]"
    return None


def _state(path: str) -> _FileState:
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size)


class GroupOffsets:
    """The store's consumerOffset.json, parsed once per change of the file. Thread-safe."""

    def __init__(self, config_dir: str):
        self.path = consumer_offsets.path_in(config_dir)
        self.config_dir = config_dir
        self._lock = threading.Lock()
        self._seen: tuple[_FileState, _FileState] | None = None
        self._table: OffsetTable = {}
        self.reads = 0  # times the file was parsed: tests check an unchanged file is not

    def table(self) -> OffsetTable:
        """The current table; Corruption when neither the file nor its .bak decodes."""
        with self._lock:
            states = (_state(self.path), _state(self.path + ".bak"))
            if states != self._seen:
                table = consumer_offsets.read_offsets(self.config_dir)
                # Remembered only once parsed: a damaged file is reported again next time.
                self._table, self._seen = table, states
                self.reads += 1
            return self._table


@dataclass(frozen=True, slots=True)
class QueueLag:
    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int

    @property
    def lag(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)


def group_topics(table: OffsetTable) -> dict[str, list[str]]:
    """Group → the topics it has offsets for, both sorted."""
    found: dict[str, set[str]] = {}
    for topic, group in table:
        found.setdefault(group, set()).add(topic)
    return {group: sorted(topics) for group, topics in sorted(found.items())}


def group_lag(view: StoreView, table: OffsetTable, group: str, topic: str = "") -> list[QueueLag]:
    """Per queue of each topic the group has offsets for (only ``topic`` when given): every
    queue the store has and every queue the file names, by topic then queue id."""
    problem = group_problem(group)
    if problem is not None:
        raise InvalidArgument(problem)
    topics = sorted(t for t, g in table if g == group)
    if not topics:
        raise NotFound(f"consumer group {group} has no offsets in this store")
    if topic:
        topic_issue = topic_problem(topic)
        if topic_issue is not None:
            raise InvalidArgument(topic_issue)
        if topic not in topics:
            raise NotFound(f"consumer group {group} has no offsets for topic {topic}")
        topics = [topic]
    return queue_lags(view, table, group, topics)


def queue_lags(view: StoreView, table: OffsetTable, group: str, topics: list[str]) -> list[QueueLag]:
    """The rows of :func:`group_lag` for topics the group has offsets for, unchecked."""
    on_disk = view.topics()
    rows = []
    for name in topics:
        offsets = table[(name, group)]
        for queue_id in sorted(set(on_disk.get(name, [])) | set(offsets)):
            # A queue the file names but the store has no files for (never written to) ends at 0.
            broker_offset = view.queue_bounds(name, queue_id)[1] if queue_id in on_disk.get(name, []) else 0
            # A negative offset (Apache's -1, none yet) reads as 0, as the broker reports it.
            rows.append(QueueLag(name, queue_id, broker_offset, max(offsets.get(queue_id, 0), 0)))
    return rows
