"""The proxy's page cursor: where a key or UNIQ_KEY lookup stands in each writer group,
opaque, signed and strictly decoded (as query.cursor's node cursors are).

A cursor is unpadded URL-safe base64 of::

    version        1 byte   MERGED_CURSOR_VERSION
    group count    2 bytes  big-endian, at most GROUPS_MAX
    per group, in the order the lookup began with:
      name length  2 bytes  then the broker name, UTF-8
      state        1 byte   READING or DONE
      node cursor  1 byte length, then the group's query node cursor (ASCII): the node
                   page the group's next records come from; empty: its newest page
      below        8 bytes  signed; the records of that node page at or above this commit
                   log offset were given already; -1: none of them was
    tag           16 bytes  HMAC-SHA256(proxy key, everything above | query), truncated

``query`` is query.cursor.query_digest of the lookup's kind and parameters, so a cursor
continues only the lookup that issued it. The key is the proxies' (``proxy serve
--cursor-key FILE``; without it, one of this process's own). The tag is checked before
anything else is read, and the input's length before it is decoded: a client can neither
steer a lookup nor make the decoder do unbounded work.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from dataclasses import dataclass

from rmqstore.common.errors import InvalidArgument
from rmqstore.proxy.cluster import GROUPS_MAX

MERGED_CURSOR_VERSION = 1
READING = 0
DONE = 1
BELOW_NONE = -1
TAG_BYTES = 16
NAME_BYTES_MAX = 0xFFFF
NODE_CURSOR_CHARS_MAX = 0xFF
_HEAD = struct.Struct(">BH")  # version, group count
_NAME = struct.Struct(">H")  # name length
_STATE = struct.Struct(">BB")  # state, node cursor length
_BELOW = struct.Struct(">q")  # below
# Longer input is refused before it is decoded (a cursor over GROUPS_MAX groups with
# 64-byte names and 34-character node cursors fits in it many times over).
MERGED_CURSOR_CHARS_MAX = 256 * 1024
_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")
_NODE_CURSOR = re.compile(r"[A-Za-z0-9_-]*")
MALFORMED = "the cursor is malformed or belongs to another query"


@dataclass(frozen=True)
class GroupPosition:
    """Where a lookup stands in one group."""

    group: str
    done: bool = False
    node_cursor: str = ""  # the node page the group's next records come from ("" = the newest)
    below: int = BELOW_NONE  # that page's records at or above this offset were given already


def _tag(key: bytes, body: bytes, query: bytes) -> bytes:
    return hmac.new(key, body + query, hashlib.sha256).digest()[:TAG_BYTES]


def encode_merged_cursor(key: bytes, positions: list[GroupPosition], query: bytes) -> str:
    if not 0 < len(positions) <= GROUPS_MAX:
        raise ValueError(f"{len(positions)} group positions in a cursor")
    pieces = [_HEAD.pack(MERGED_CURSOR_VERSION, len(positions))]
    for position in positions:
        name = position.group.encode("utf-8")
        node_cursor = position.node_cursor.encode("ascii")
        if len(name) > NAME_BYTES_MAX or len(node_cursor) > NODE_CURSOR_CHARS_MAX:
            raise ValueError(
                f"group {position.group}: its name or node cursor is too long for a cursor"
            )
        pieces += [
            _NAME.pack(len(name)),
            name,
            _STATE.pack(DONE if position.done else READING, len(node_cursor)),
        ]
        pieces += [node_cursor, _BELOW.pack(position.below)]
    body = b"".join(pieces)
    return base64.urlsafe_b64encode(body + _tag(key, body, query)).decode("ascii").rstrip("=")


def decode_merged_cursor(key: bytes, cursor: str, query: bytes) -> list[GroupPosition]:
    """The positions a cursor carries, or InvalidArgument (MALFORMED)."""
    if not cursor or len(cursor) > MERGED_CURSOR_CHARS_MAX or not _ALPHABET.fullmatch(cursor):
        raise InvalidArgument(MALFORMED)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError):
        raise InvalidArgument(MALFORMED) from None
    # Only the canonical spelling is a cursor: no two strings are the same cursor.
    if len(raw) <= TAG_BYTES or base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") != cursor:
        raise InvalidArgument(MALFORMED)
    body, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(key, body, query)):
        raise InvalidArgument(MALFORMED)
    try:
        return _positions(body)
    except (struct.error, UnicodeDecodeError, ValueError):
        # Signed by a proxy's key yet not this layout: another version's cursor.
        raise InvalidArgument(MALFORMED) from None


def _positions(body: bytes) -> list[GroupPosition]:
    version, count = _HEAD.unpack_from(body, 0)
    if version != MERGED_CURSOR_VERSION or not 0 < count <= GROUPS_MAX:
        raise ValueError("not a version 1 cursor")
    at = _HEAD.size
    positions = []
    for _ in range(count):
        (name_bytes,) = _NAME.unpack_from(body, at)
        at += _NAME.size
        name = body[at : at + name_bytes].decode("utf-8")
        at += name_bytes
        state, cursor_chars = _STATE.unpack_from(body, at)
        at += _STATE.size
        node_cursor = body[at : at + cursor_chars].decode("ascii")
        at += cursor_chars
        (below,) = _BELOW.unpack_from(body, at)
        at += _BELOW.size
        if (
            state not in (READING, DONE)
            or len(name.encode()) != name_bytes
            or len(node_cursor) != cursor_chars
        ):
            raise ValueError("a group's position is cut short")
        if not _NODE_CURSOR.fullmatch(node_cursor) or below < BELOW_NONE:
            raise ValueError("a group's position is not one")
        positions.append(GroupPosition(name, state == DONE, node_cursor, below))
    if at != len(body) or len({p.group for p in positions}) != count:
        raise ValueError("trailing bytes or a group named twice")
    return positions
