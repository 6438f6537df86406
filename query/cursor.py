"""Page cursors: opaque, signed and strictly decoded.

A cursor is 25 bytes in unpadded URL-safe base64 (34 characters)::

    version      1 byte   CURSOR_VERSION
    offset       8 bytes  big-endian; the next page holds matches below this commit log offset
    tag         16 bytes  HMAC-SHA256(store key, version | offset | query), truncated

``query`` is the lookup's kind and parameters, each length-prefixed, so a cursor continues
only the query that issued it. The key is the store's (common.files.cursorkey): every
query node of a store accepts the cursors of the others. Anything that is not exactly such
a string, signed by this key for this query, is InvalidArgument: a client can neither
steer a lookup to an offset it chose nor make the decoder do unbounded work (the input is
length-checked before it is decoded).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct

from rmqstore.common.errors import InvalidArgument

CURSOR_VERSION = 1
OFFSET_MAX = 2**63 - 1
# One struct per layout: the signed head, then the tag.
_HEAD = struct.Struct(">BQ")  # version, offset
TAG_BYTES = 16
CURSOR_BYTES = _HEAD.size + TAG_BYTES
CURSOR_CHARS = (CURSOR_BYTES * 8 + 5) // 6
_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")
_MALFORMED = "the cursor is malformed or belongs to another query"


def query_digest(kind: str, *parts: str | int) -> bytes:
    """The query a cursor belongs to, as the bytes its tag covers."""
    pieces = [kind.encode(), *(str(part).encode("utf-8", "surrogatepass") for part in parts)]
    return b"".join(struct.pack(">I", len(piece)) + piece for piece in pieces)


def _tag(key: bytes, head: bytes, query: bytes) -> bytes:
    return hmac.new(key, head + query, hashlib.sha256).digest()[:TAG_BYTES]


def encode_cursor(key: bytes, offset: int, query: bytes) -> str:
    if not 0 <= offset <= OFFSET_MAX:
        raise ValueError(f"cursor offset {offset} out of range")
    head = _HEAD.pack(CURSOR_VERSION, offset)
    return base64.urlsafe_b64encode(head + _tag(key, head, query)).decode("ascii").rstrip("=")


def decode_cursor(key: bytes, cursor: str, query: bytes) -> int:
    """The offset a cursor carries, or InvalidArgument."""
    if len(cursor) != CURSOR_CHARS or not _ALPHABET.fullmatch(cursor):
        raise InvalidArgument(_MALFORMED)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError):
        raise InvalidArgument(_MALFORMED) from None
    # Base64 lets the last character's unused bits vary: only the canonical spelling is
    # a cursor, so no two strings are the same cursor.
    if len(raw) != CURSOR_BYTES or base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") != cursor:
        raise InvalidArgument(_MALFORMED)
    head, tag = raw[: _HEAD.size], raw[_HEAD.size :]
    version, offset = _HEAD.unpack(head)
    if version != CURSOR_VERSION or offset > OFFSET_MAX or not hmac.compare_digest(tag, _tag(key, head, query)):
        raise InvalidArgument(_MALFORMED)
    return int(offset)
