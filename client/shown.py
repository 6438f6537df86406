"""How a stored message is shown: its JSON form (``--json``, the console's API) and the
fields of mqadmin's queryMsgById (its times in ISO 8601, local time with the offset),
shared by the command line and the console."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from rmqstore.common.times import iso_time
from rmqstore.v1 import messages_pb2


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
        "keys": " ".join(message.keys) if message.keys else None,
        "tags": message.tags or None,
        "uniqKey": message.uniq_key or None,
        "properties": dict(sorted(message.properties.items())),
        "bodyLen": len(message.body),
        "bodySha256": hashlib.sha256(message.body).hexdigest(),
    }
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
    ]
