"""Topics and consumer groups in Apache RocketMQ 5's own files, ``config/topics.json`` and
``config/subscriptionGroup.json`` (docs/format.md §1.1).

Apache's broker keeps them through ConfigManager: fastjson, pretty-printed with tabs, the
previous file kept as ``.bak`` and read when the main one is missing or does not decode.

- ``topics.json`` is TopicConfigManager's TopicConfigSerializeWrapper:
  ``{"dataVersion": {...}, "topicConfigTable": {name: TopicConfig}}``; a TopicConfig has
  ``topicName``, ``readQueueNums``, ``writeQueueNums``, ``perm``, ``topicFilterType``,
  ``topicSysFlag``, ``order`` and ``attributes``, whose ``"message.type"`` (TopicAttributes,
  5.x) is the topic's message type; a topic without it is NORMAL (TopicConfig.getTopicMessageType).
- ``subscriptionGroup.json`` is SubscriptionGroupManager itself: ``{"dataVersion": {...},
  "forbiddenTable": {}, "subscriptionGroupTable": {name: SubscriptionGroupConfig}}``.

Entries are kept as the JSON objects read, so fields rmqstore does not use (a topic's
perm, a group's retry policy, Apache's system topics) survive a round trip through
rmqstore: a store moved between rmqstore and Apache keeps them.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from rmqstore.common.errors import Corruption
from rmqstore.common.files.config_file import read_keeping_backup, replace_keeping_backup

TOPICS_FILE_NAME = "topics.json"
GROUPS_FILE_NAME = "subscriptionGroup.json"
TOPICS_TABLE = "topicConfigTable"
GROUPS_TABLE = "subscriptionGroupTable"

# TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE and TopicMessageType's values.
MESSAGE_TYPE_ATTRIBUTE = "message.type"
NORMAL = "NORMAL"
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
PERM_READ_WRITE = 6  # PermName.PERM_READ | PermName.PERM_WRITE

Entry = dict[str, Any]


def new_topic_config(topic: str, queue_count: int) -> Entry:
    """A TopicConfig as Apache's broker writes one made by updateTopic without options."""
    return {
        "attributes": {},
        "order": False,
        "perm": PERM_READ_WRITE,
        "readQueueNums": queue_count,
        "topicFilterType": "SINGLE_TAG",
        "topicName": topic,
        "topicSysFlag": 0,
        "writeQueueNums": queue_count,
    }


def new_group_config(group: str) -> Entry:
    """A SubscriptionGroupConfig with Apache's defaults."""
    return {
        "attributes": {},
        "brokerId": 0,
        "consumeBroadcastEnable": True,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeMessageOrderly": False,
        "consumeTimeoutMinute": 15,
        "groupName": group,
        "groupRetryPolicy": {"type": "CUSTOMIZED"},
        "groupSysFlag": 0,
        "notifyConsumerIdsChangedEnable": True,
        "retryMaxTimes": 16,
        "retryQueueNums": 1,
        "whichBrokerWhenConsumeSlowly": 1,
    }


def topic_queue_count(entry: Entry) -> int:
    """rmqstore keeps one queue count per topic: every queue that can be read or written."""
    return max(int(entry.get("readQueueNums", 0)), int(entry.get("writeQueueNums", 0)))


def topic_message_type(entry: Entry) -> str:
    attributes = entry.get("attributes") or {}
    return str(attributes.get(MESSAGE_TYPE_ATTRIBUTE) or NORMAL)


def group_orderly(entry: Entry) -> bool:
    return entry.get("consumeMessageOrderly") is True


def _int_field(entry: Any, field: str) -> bool:
    value = entry.get(field)
    return isinstance(value, int) and not isinstance(value, bool)


def parse_table(text: str, table_key: str, name_field: str, *, path: str) -> tuple[dict[str, Entry], Entry]:
    """The entries and the whole document of one of the two files; Corruption naming what
    does not fit."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise Corruption(f"{path} is not readable JSON: {error}", path=path) from None
    if not isinstance(document, dict):
        raise Corruption(f"{path} is not an object with a {table_key}", path=path)
    raw = document.get(table_key) or {}
    if not isinstance(raw, dict):
        raise Corruption(f"{path}: {table_key} is not an object", path=path)
    for name, entry in raw.items():
        if not isinstance(entry, dict) or entry.get(name_field, name) != name:
            raise Corruption(f"{path}: {table_key}[{name!r}] is not an object named {name!r}", path=path)
        if table_key == TOPICS_TABLE:
            if not (_int_field(entry, "readQueueNums") and _int_field(entry, "writeQueueNums")):
                raise Corruption(f"{path}: topic {name}: readQueueNums and writeQueueNums must be integers", path=path)
            attributes = entry.get("attributes")
            if attributes is not None and not isinstance(attributes, dict):
                raise Corruption(f"{path}: topic {name}: attributes is not an object", path=path)
            if topic_message_type(entry) not in (*MESSAGE_TYPES, "UNSPECIFIED"):
                raise Corruption(f"{path}: topic {name}: message.type {topic_message_type(entry)!r} is not a TopicMessageType", path=path)
    return dict(raw), document


def read_table(config_dir: str, file_name: str, table_key: str, name_field: str) -> tuple[dict[str, Entry], Entry] | None:
    """The file's entries and document: None when neither it nor its ``.bak`` exists; the
    ``.bak`` when the main file is missing or does not decode (as Apache's ConfigManager
    reads); Corruption when neither decodes."""
    return read_keeping_backup(
        os.path.join(config_dir, file_name), lambda text, candidate: parse_table(text, table_key, name_field, path=candidate)
    )


def next_data_version(document: Entry) -> Entry:
    """DataVersion.nextVersion: the time of the change and one more in the counter."""
    previous = document.get("dataVersion")
    counter = previous.get("counter", 0) if isinstance(previous, dict) else 0
    state = previous.get("stateVersion", 0) if isinstance(previous, dict) else 0
    return {"counter": int(counter) + 1, "stateVersion": state, "timestamp": int(time.time() * 1000)}


def render(document: Entry) -> str:
    """fastjson's pretty layout as Apache writes these files: tabs, sorted keys."""
    return json.dumps(document, indent="\t", separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def write_table(config_dir: str, file_name: str, document: Entry) -> None:
    """Replace the file atomically (temporary file, fsync, rename, fsync of the directory),
    keeping the previous one as ``.bak`` as Apache's broker does."""
    replace_keeping_backup(config_dir, os.path.join(config_dir, file_name), render(document))


def read_topic_types(config_dir: str) -> dict[str, str]:
    """Each topic's message type as ``topics.json`` holds it ({} without the file): for
    readers of the store (query nodes), which show the type and never write the file."""
    read = read_table(config_dir, TOPICS_FILE_NAME, TOPICS_TABLE, "topicName")
    return {name: topic_message_type(entry) for name, entry in read[0].items()} if read else {}
