"""How a call to a node is signed, the way RocketMQ 5 clients sign theirs: metadata
``x-mq-date-time`` (``YYYYMMDDTHHMMSSZ``, UTC) and ``authorization: MQv2-HMAC-SHA1
Credential=<accessKey>, SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1 of the
date-time under the secret>``. The client signs (client.signing, and a proxy toward its
nodes), the node checks (service.acl); both compute the signature here."""

from __future__ import annotations

import hashlib
import hmac
import time

DATE_TIME_KEY = "x-mq-date-time"
AUTHORIZATION_KEY = "authorization"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"


def signature(secret: bytes, date_time: str) -> str:
    """The hex HMAC-SHA1 of ``date_time`` (as sent in ``x-mq-date-time``) under ``secret``."""
    return hmac.new(secret, date_time.encode(), hashlib.sha1).hexdigest()


def sign(access_key: str, secret_key: str, now_s: float | None = None) -> list[tuple[str, str]]:
    """The metadata that signs one call."""
    date_time = time.strftime(DATE_TIME_FORMAT, time.gmtime(time.time() if now_s is None else now_s))
    return [
        (DATE_TIME_KEY, date_time),
        (
            AUTHORIZATION_KEY,
            f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME_KEY}, Signature={signature(secret_key.encode(), date_time)}",
        ),
    ]
