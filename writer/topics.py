"""The writer's topic table, in Apache RocketMQ 5's ``config/topics.json``
(common/files/broker_config.py): each topic's queue count and message type.

rmqstore keeps one queue count per topic (the larger of Apache's read and write counts).
A topic's message type is its ``message.type`` attribute (NORMAL when absent, as Apache
reads it); the RocketMQ 5 gateway routes and checks sends by it.

A store written by an earlier rmqstore holds ``config/rmqstore-topics.json`` instead (a
magic, a version, the topics and a CRC-32 of their canonical JSON): it is read once, its
topics written to ``topics.json`` as MIXED (they accepted NORMAL and FIFO messages; MIXED
is Apache's only type that still accepts both), then removed. Topics that only exist as
consume queue directories (a store written by Apache's broker without its config) are
picked up with queue count = highest queue id + 1.

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
from rmqstore.common.files import broker_config
from rmqstore.common.files.broker_config import MESSAGE_TYPE_ATTRIBUTE, MESSAGE_TYPES, Entry
from rmqstore.common.files.mapped import fsync_directory, makedirs_durable

LEGACY_FILE_NAME = "rmqstore-topics.json"
LEGACY_MAGIC = "rmqstore-topics"
LEGACY_VERSION = 1
MIGRATED_MESSAGE_TYPE = "MIXED"
QUEUE_COUNT_MAX = 1024


def _canonical(topics: dict[str, int]) -> bytes:
    return json.dumps(sorted(topics.items()), separators=(",", ":")).encode()


def check_message_type(message_type: str) -> None:
    if message_type not in MESSAGE_TYPES:
        raise InvalidArgument(f"message.type {message_type!r} is not one of {', '.join(MESSAGE_TYPES)}")


class TopicTable:
    """The writer's topics, their queue counts and message types. ``max_topics`` and
    ``max_queues`` (in all) cap what :meth:`create` makes; a store that already holds more
    (the caps lowered since) keeps them and makes none."""

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
        self.path = os.path.join(config_dir, broker_config.TOPICS_FILE_NAME)
        self.legacy_path = os.path.join(config_dir, LEGACY_FILE_NAME)
        self._lock = threading.Lock()
        self.document: Entry = {}
        self.configs: dict[str, Entry] = {}
        changed = self._load()
        for topic, queue_id in discovered:
            entry = self.configs.get(topic)
            if entry is None:
                self.configs[topic] = broker_config.new_topic_config(topic, queue_id + 1)
                changed = True
            elif broker_config.topic_queue_count(entry) <= queue_id:
                entry["readQueueNums"] = entry["writeQueueNums"] = queue_id + 1
                changed = True
        # The hot lookups (every send asks a topic's count and type) read these.
        self.topics: dict[str, int] = {n: broker_config.topic_queue_count(e) for n, e in self.configs.items()}
        self.types: dict[str, str] = {n: broker_config.topic_message_type(e) for n, e in self.configs.items()}
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
        with contextlib.suppress(FileNotFoundError):
            # Migrated (now or by a start that stopped before removing it).
            os.unlink(self.legacy_path)
            fsync_directory(self.config_dir)

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

    def _load(self) -> bool:
        """Fill the table from topics.json, or from the legacy file; True when the table
        must be written (migrated)."""
        read = broker_config.read_table(self.config_dir, broker_config.TOPICS_FILE_NAME, broker_config.TOPICS_TABLE, "topicName")
        if read is not None:
            self.configs, self.document = read
            return False
        for name, count in self._load_legacy().items():
            entry = broker_config.new_topic_config(name, count)
            entry["attributes"] = {MESSAGE_TYPE_ATTRIBUTE: MIGRATED_MESSAGE_TYPE}
            self.configs[name] = entry
        return bool(self.configs)

    def _load_legacy(self) -> dict[str, int]:
        try:
            with open(self.legacy_path, encoding="utf-8") as handle:
                document = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise Corruption(f"{self.legacy_path} is not readable JSON: {error}", path=self.legacy_path) from None
        if not isinstance(document, dict) or document.get("magic") != LEGACY_MAGIC or document.get("version") != LEGACY_VERSION:
            raise Corruption(f"{self.legacy_path} is not a version-{LEGACY_VERSION} rmqstore topic table", path=self.legacy_path)
        topics = {str(name): int(count) for name, count in document.get("topics", {}).items()}
        if document.get("crc32") != zlib.crc32(_canonical(topics)):
            raise Corruption(f"{self.legacy_path} fails its checksum", path=self.legacy_path)
        return topics

    def _save(self) -> None:
        document = dict(self.document)
        document[broker_config.TOPICS_TABLE] = dict(sorted(self.configs.items()))
        document["dataVersion"] = broker_config.next_data_version(self.document)
        broker_config.write_table(self.config_dir, broker_config.TOPICS_FILE_NAME, document)
        self.document = document

    def queue_count(self, topic: str) -> int | None:
        return self.topics.get(topic)

    def message_type(self, topic: str) -> str | None:
        """The topic's message type (NORMAL, FIFO, DELAY, TRANSACTION or MIXED), None for
        a topic the writer does not have."""
        return self.types.get(topic)

    def create(self, topic: str, queue_count: int, message_type: str | None = None) -> bool:
        """Create or grow a topic, and set its message type when one is given; returns
        False if nothing changed. Queue counts never shrink: queues that hold messages stay
        addressable."""
        validate_topic(topic)
        if not 1 <= queue_count <= QUEUE_COUNT_MAX:
            raise InvalidArgument(f"queue count must be in [1, {QUEUE_COUNT_MAX}], got {queue_count}")
        if message_type is not None:
            check_message_type(message_type)
        with self._lock:
            current = self.topics.get(topic, 0)
            retype = message_type is not None and self.types.get(topic) != message_type
            if current >= queue_count and not retype:
                return False
            if not current and self.max_topics is not None and len(self.topics) >= self.max_topics:
                raise LimitReached(
                    f"the writer holds {len(self.topics)} topics, its limit (--max-topics {self.max_topics}): "
                    f"topic {topic} is not created"
                )
            count = max(current, queue_count)
            queues = sum(self.topics.values()) - current + count
            if count > current and self.max_queues is not None and queues > self.max_queues:
                raise LimitReached(
                    f"topic {topic} with {queue_count} queues would make {queues} queues in all, past the writer's "
                    f"limit (--max-queues {self.max_queues})"
                )
            self._make_queue_dirs(topic, count)
            entry = dict(self.configs.get(topic) or broker_config.new_topic_config(topic, count))
            entry["readQueueNums"] = max(int(entry["readQueueNums"]), count)
            entry["writeQueueNums"] = max(int(entry["writeQueueNums"]), count)
            if message_type is not None:
                entry["attributes"] = {**(entry.get("attributes") or {}), MESSAGE_TYPE_ATTRIBUTE: message_type}
            previous = self.configs.get(topic)
            self.configs[topic] = entry
            try:
                self._save()
            except BaseException:
                if previous is None:
                    del self.configs[topic]
                else:
                    self.configs[topic] = previous
                raise
            self.topics[topic] = count
            self.types[topic] = broker_config.topic_message_type(entry)
            return True

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.topics)

    def types_snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self.types)
