"""The writer's topic table: names and queue counts, in a file of our own.

``config/rmqstore-topics.json`` holds a magic, a version, the topics and a CRC-32 of their
canonical JSON; it is replaced atomically (temp file, fsync, rename, fsync directory).
Topics that only exist as consume queue directories (a store written by Apache's broker)
are picked up with queue count = highest queue id + 1.

Every queue of a topic in the table has its consume queue directory, made (durably) before
the table names the topic or its new count: a query node, which lists topics and queues
from those directories, shows a topic created by ``updateTopic`` at once, with all its
queues, before any message arrives; and a crash between the two leaves directories the
next start picks up as the same topic.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import zlib

from rmqstore.common.codec.topic import validate_topic
from rmqstore.common.errors import Corruption, InvalidArgument, LimitReached
from rmqstore.common.files.mapped import fsync_directory, makedirs_durable

FILE_NAME = "rmqstore-topics.json"
MAGIC = "rmqstore-topics"
VERSION = 1
QUEUE_COUNT_MAX = 1024


def _canonical(topics: dict[str, int]) -> bytes:
    return json.dumps(sorted(topics.items()), separators=(",", ":")).encode()


class TopicTable:
    """The writer's topics and their queue counts. ``max_topics`` and ``max_queues`` (in
    all) cap what :meth:`create` makes; a store that already holds more (the caps lowered
    since) keeps them and makes none."""

    def __init__(
        self,
        config_dir: str,
        consumequeue_dir: str,
        discovered: list[tuple[str, int]],
        *,
        max_topics: int | None = None,
        max_queues: int | None = None,
    ):
        self.max_topics = max_topics
        self.max_queues = max_queues
        self.config_dir = config_dir
        self.consumequeue_dir = consumequeue_dir
        self.path = os.path.join(config_dir, FILE_NAME)
        self._lock = threading.Lock()
        self.topics: dict[str, int] = self._load()
        changed = False
        for topic, queue_id in discovered:
            if self.topics.get(topic, 0) <= queue_id:
                self.topics[topic] = queue_id + 1
                changed = True
        # A table written before its topics had every queue's directory (or a directory
        # removed by hand): the missing ones.
        on_disk: dict[str, set[int]] = {}
        for topic, queue_id in discovered:
            on_disk.setdefault(topic, set()).add(queue_id)
        for topic, count in self.topics.items():
            if len(on_disk.get(topic, ())) < count:
                self._make_queue_dirs(topic, count)
        if changed:
            self._save()

    def _make_queue_dirs(self, topic: str, queue_count: int) -> None:
        """The consume queue directories of queues 0 … ``queue_count`` − 1 that are
        missing, each parent synced once."""
        topic_dir = os.path.join(self.consumequeue_dir, topic)
        makedirs_durable(topic_dir)
        made = False
        for queue_id in range(queue_count):
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.join(topic_dir, str(queue_id)))
                made = True
        if made:
            fsync_directory(topic_dir)

    def _load(self) -> dict[str, int]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                document = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise Corruption(f"{self.path} is not readable JSON: {error}", path=self.path) from None
        if not isinstance(document, dict) or document.get("magic") != MAGIC or document.get("version") != VERSION:
            raise Corruption(f"{self.path} is not a version-{VERSION} rmqstore topic table", path=self.path)
        topics = {str(name): int(count) for name, count in document.get("topics", {}).items()}
        if document.get("crc32") != zlib.crc32(_canonical(topics)):
            raise Corruption(f"{self.path} fails its checksum", path=self.path)
        return topics

    def _save(self) -> None:
        makedirs_durable(self.config_dir)
        document = {
            "magic": MAGIC,
            "version": VERSION,
            "topics": dict(sorted(self.topics.items())),
            "crc32": zlib.crc32(_canonical(self.topics)),
        }
        temp = self.path + ".tmp"
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, self.path)
        fsync_directory(self.config_dir)

    def queue_count(self, topic: str) -> int | None:
        return self.topics.get(topic)

    def create(self, topic: str, queue_count: int) -> bool:
        """Create or grow a topic; returns False if it already had that many queues.
        Queue counts never shrink: queues that hold messages stay addressable."""
        validate_topic(topic)
        if not 1 <= queue_count <= QUEUE_COUNT_MAX:
            raise InvalidArgument(f"queue count must be in [1, {QUEUE_COUNT_MAX}], got {queue_count}")
        with self._lock:
            current = self.topics.get(topic, 0)
            if current >= queue_count:
                return False
            if not current and self.max_topics is not None and len(self.topics) >= self.max_topics:
                raise LimitReached(
                    f"the writer holds {len(self.topics)} topics, its limit (--max-topics {self.max_topics}): "
                    f"topic {topic} is not created"
                )
            queues = sum(self.topics.values()) - current + queue_count
            if self.max_queues is not None and queues > self.max_queues:
                raise LimitReached(
                    f"topic {topic} with {queue_count} queues would make {queues} queues in all, past the writer's "
                    f"limit (--max-queues {self.max_queues})"
                )
            self._make_queue_dirs(topic, queue_count)
            self.topics[topic] = queue_count
            self._save()
            return True

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.topics)
