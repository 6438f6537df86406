"""How a stored message is shown: its JSON form (``--json``, the console's API) and the
fields of mqadmin's queryMsgById (its times in ISO 8601, local time with the offset),
shared by the command line and the console."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.consumequeue import (
    DEFAULT_DELAY_LEVELS,
    HALF_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    deliver_timestamp,
    parse_delay_levels,
)
from rmqstore.common.times import iso_time
from rmqstore.v1 import messages_pb2

_DELAY_LEVELS_MS = parse_delay_levels(DEFAULT_DELAY_LEVELS)


def pending_due_ms(message: messages_pb2.StoredMessage) -> int | None:
    """For a delayed or timed message's scheduled record (docs/format.md §16), the time it
    is released at; None for any other record. A lookup finds such a record only while no
    copy of its message is in its real topic: it is pending (or was recalled)."""
    if message.topic == TIMER_TOPIC:
        due = message.properties.get(props.TIMER_OUT_MS, "")
        return int(due) if due.isascii() and due.isdigit() else None
    if message.topic == SCHEDULE_TOPIC:
        level = message.properties.get(props.DELAY, "")
        if level.isascii() and level.isdigit() and int(level) > 0:
            return deliver_timestamp(min(int(level), max(_DELAY_LEVELS_MS)), message.store_timestamp_ms, _DELAY_LEVELS_MS)
    return None


def message_json(message: messages_pb2.StoredMessage, with_body: bool) -> dict[str, Any]:
    """The message as ``--json`` prints it (``with_body``: the body as text where it is
    UTF-8, and as base64)."""
    document: dict[str, Any] = {
        "commitLogOffset": message.commitlog_offset,
        "msgId": message.offset_msg_id,
        "topic": message.topic,
        "queueId": message.queue_id,
        "queueOffset": message.queue_offset,
        "storeTimestamp": message.store_timestamp_ms,
        "bornTimestamp": message.born_timestamp_ms,
        "bornHost": message.born_host,
        "storeHost": message.store_host,
        "keys": " ".join(message.keys) if message.keys else None,
        "tags": message.tags or None,
        "uniqKey": message.uniq_key or None,
        "properties": dict(sorted(message.properties.items())),
        "bodyLen": len(message.body),
        "bodySha256": hashlib.sha256(message.body).hexdigest(),
    }
    due = pending_due_ms(message)
    if message.topic == HALF_TOPIC:
        # A transaction's half message: found only while no commit put it in its topic.
        document["pendingTransaction"] = True
    if due is not None:
        document["pending"] = True
        document["dueTimestamp"] = due
    if with_body:
        try:
            document["body"] = message.body.decode("utf-8")
        except UnicodeDecodeError:
            document["body"] = None
        document["bodyBase64"] = base64.b64encode(message.body).decode()
    return document


def message_rows(message: messages_pb2.StoredMessage) -> list[tuple[str, object]]:
    """queryMsgById's fields, label and value, in its order (the console shows the same)."""
    return [
        ("OffsetID:", message.offset_msg_id),
        ("Topic:", message.topic),
        ("Tags:", f"[{message.tags}]" if message.tags else "[]"),
        ("Keys:", f"[{' '.join(message.keys)}]" if message.keys else "[]"),
        ("Unique Key:", message.uniq_key),
        ("Queue ID:", message.queue_id),
        ("Queue Offset:", message.queue_offset),
        ("CommitLog Offset:", message.commitlog_offset),
        ("Reconsume Times:", message.reconsume_times),
        ("Born Timestamp:", iso_time(message.born_timestamp_ms, local=True)),
        ("Store Timestamp:", iso_time(message.store_timestamp_ms, local=True)),
        ("Born Host:", message.born_host),
        ("Store Host:", message.store_host),
        ("System Flag:", message.sys_flag),
        ("Properties:", json.dumps(dict(sorted(message.properties.items())), ensure_ascii=False)),
        ("Body Length:", len(message.body)),
        ("Body SHA-256:", hashlib.sha256(message.body).hexdigest()),
        *pending_rows(message),
    ]


def pending_rows(message: messages_pb2.StoredMessage) -> list[tuple[str, object]]:
    due = pending_due_ms(message)
    if message.topic == HALF_TOPIC:
        return [("Pending Transaction:", "a half message, not committed")]
    return [] if due is None else [("Pending Until:", iso_time(due, local=True))]
