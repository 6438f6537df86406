"""How a call to a node is signed, the way RocketMQ 5 clients sign theirs: metadata
``x-mq-date-time`` (``YYYYMMDDTHHMMSSZ``, UTC) and ``authorization: MQv2-HMAC-SHA1
Credential=<accessKey>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of the
date-time under the secret>``. The client signs (client.signing), the node checks
(service.acl); both compute the signature here."""

from __future__ import annotations

import hashlib
import hmac

DATE_TIME_KEY = "x-mq-date-time"
AUTHORIZATION_KEY = "authorization"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"


def signature(secret: bytes, date_time: str) -> str:
    """The hex HMAC-SHA1 of ``date_time`` (as sent in ``x-mq-date-time``) under ``secret``."""
    return hmac.new(secret, date_time.encode(), hashlib.sha1).hexdigest()
