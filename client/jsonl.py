"""``rmqstore send --file``'s message format: one JSON object a line (README, "send"), read
by the send tool and by ``rmqstore pipeline load --format json``."""

from __future__ import annotations

import base64
from typing import Any

from rmqstore.common.errors import InvalidArgument
from rmqstore.v1 import messages_pb2

# A queue id is a Java int.
QUEUE_ID_MAX = 2**31 - 1
# The fields a line may have.
FIELDS = frozenset({"topic", "body", "bodyBase64", "keys", "tags", "queueId", "properties", "uniqKey"})


def message_from_json(line_number: int, document: Any) -> messages_pb2.Message:
    """One ``rmqstore send --file`` JSON line as a Message; errors name the line (the
    send tool and ``pipeline load --format json`` share this parser)."""
    where = f"line {line_number}"
    if not isinstance(document, dict):
        raise InvalidArgument(f"{where}: expected a JSON object")
    unknown = set(document) - FIELDS
    if unknown:
        raise InvalidArgument(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(FIELDS)}")
    if not isinstance(document.get("topic"), str):
        raise InvalidArgument(f"{where}: topic (a string) is required")
    if "body" in document and "bodyBase64" in document:
        raise InvalidArgument(f"{where}: give body or bodyBase64, not both")
    if "bodyBase64" in document:
        try:
            body = base64.b64decode(document["bodyBase64"], validate=True)
        except (ValueError, TypeError) as error:
            raise InvalidArgument(f"{where}: bodyBase64 is not base64: {error}") from None
    else:
        text = document.get("body", "")
        if not isinstance(text, str):
            raise InvalidArgument(f"{where}: body must be a string (use bodyBase64 for bytes)")
        body = text.encode("utf-8")
    keys = document.get("keys", [])
    if isinstance(keys, str):
        keys = keys.split()
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise InvalidArgument(f"{where}: keys must be a string or a list of strings")
    properties = document.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(v, str) for v in properties.values()):
        raise InvalidArgument(f"{where}: properties must be an object of strings")
    for field in ("tags", "uniqKey"):
        if document.get(field) is not None and not isinstance(document[field], str):
            raise InvalidArgument(f"{where}: {field} must be a string")
    message = messages_pb2.Message(
        topic=document["topic"],
        body=body,
        keys=keys,
        tags=document.get("tags") or "",
        properties=properties,
        uniq_key=document.get("uniqKey") or "",
    )
    queue_id = document.get("queueId")
    if queue_id is not None:
        if not isinstance(queue_id, int) or isinstance(queue_id, bool):
            raise InvalidArgument(f"{where}: queueId must be an integer")
        if not 0 <= queue_id <= QUEUE_ID_MAX:
            raise InvalidArgument(f"{where}: queueId {queue_id} is outside [0, {QUEUE_ID_MAX}]")
        message.queue_id = queue_id
    if "body" not in document and "bodyBase64" not in document:
        # As send -t refuses a message without --body: an empty body is said, not implied.
        raise InvalidArgument(f'{where}: give the body: body (text) or bodyBase64 (bytes) ("body": "" sends an empty one)')
    return message
