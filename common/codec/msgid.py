"""Message ids (docs/format.md §5): the offsetMsgId and the client's UNIQ_KEY."""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass

from rmqstore.common.codec.hosts import PORT_MAX, SocketAddress
from rmqstore.common.errors import InvalidArgument

_PORT_OFFSET = struct.Struct(">iq")
_UNIQ_TAIL = struct.Struct(
    ">H"  # pid, low 16 bits
    "i"  # class-loader identity hash
    "I"  # ms since the start of the producer's local month (read unsigned: it wraps)
    "H"  # counter, low 16 bits
)
UNIQ_TAIL_SIZE = _UNIQ_TAIL.size
assert UNIQ_TAIL_SIZE == 12
_HEX = frozenset("0123456789abcdefABCDEF")


def _unhex(text: str, what: str) -> bytes:
    if len(text) % 2 or not _HEX.issuperset(text):
        raise InvalidArgument(f"{what} {text!r} is not an even-length hex string")
    return bytes.fromhex(text)


def offset_msg_id(store_host: SocketAddress, commitlog_offset: int) -> str:
    """createMessageId: store ip, int32 port, int64 offset, uppercase hex (32 or 56 chars)."""
    return (store_host.ip + _PORT_OFFSET.pack(store_host.port, commitlog_offset)).hex().upper()


MSG_ID_OFFSET_DIGITS = 16  # the commit log offset ends every offsetMsgId


def offset_msg_id_prefix(store_host: SocketAddress) -> str:
    """What every :func:`offset_msg_id` of one store host starts with: its ip and port."""
    return store_host.ip.hex().upper() + f"{store_host.port & 0xFFFFFFFF:08X}"


def offset_msg_id_tail(commitlog_offset: int) -> str:
    """What ends an :func:`offset_msg_id`: the commit log offset, after the host's prefix."""
    return f"{commitlog_offset & 0xFFFFFFFFFFFFFFFF:0{MSG_ID_OFFSET_DIGITS}X}"


def offset_msg_ids(store_host: SocketAddress, commitlog_offsets: list[int]) -> list[str]:
    """:func:`offset_msg_id` of many offsets of one store host."""
    prefix = offset_msg_id_prefix(store_host)
    return [f"{prefix}{offset & 0xFFFFFFFFFFFFFFFF:0{MSG_ID_OFFSET_DIGITS}X}" for offset in commitlog_offsets]


@dataclass(frozen=True, slots=True)
class OffsetMsgId:
    store_host: SocketAddress
    commitlog_offset: int


def decode_offset_msg_id(msg_id: str) -> OffsetMsgId:
    """decodeMessageId: exactly 32 hex chars is IPv4, 56 is IPv6; lowercase accepted."""
    if len(msg_id) == 32:
        ip_len = 4
    elif len(msg_id) == 56:
        ip_len = 16
    else:
        raise InvalidArgument(f"offset msgId must be 32 or 56 hex characters, got {len(msg_id)}")
    raw = _unhex(msg_id, "offset msgId")
    port, offset = _PORT_OFFSET.unpack_from(raw, ip_len)
    if not 0 <= port <= PORT_MAX:
        raise InvalidArgument(f"offset msgId {msg_id} holds port {port}, out of range")
    if offset < 0:
        raise InvalidArgument(f"offset msgId {msg_id} holds a negative commit log offset")
    return OffsetMsgId(SocketAddress(raw[:ip_len], port), offset)


@dataclass(frozen=True, slots=True)
class UniqKey:
    """The fields of a MessageClientIDSetter id."""

    ip: bytes
    pid: int
    class_loader_hash: int
    time_since_month_ms: int
    counter: int


def encode_uniq_key(key: UniqKey) -> str:
    if len(key.ip) not in (4, 16):
        raise InvalidArgument(f"uniq key ip must be 4 or 16 bytes, got {len(key.ip)}")
    tail = _UNIQ_TAIL.pack(
        key.pid & 0xFFFF,
        key.class_loader_hash,
        key.time_since_month_ms & 0xFFFFFFFF,
        key.counter & 0xFFFF,
    )
    return (key.ip + tail).hex().upper()


def decode_uniq_key(uniq_key: str) -> UniqKey:
    """The ip is the bytes before the last 12; the time field is unsigned (it wraps)."""
    raw = _unhex(uniq_key, "UNIQ_KEY")
    if len(raw) not in (16, 28):
        raise InvalidArgument(f"UNIQ_KEY must be 16 or 28 bytes, got {len(raw)}")
    pid, loader_hash, time_ms, counter = _UNIQ_TAIL.unpack_from(raw, len(raw) - UNIQ_TAIL_SIZE)
    return UniqKey(raw[: len(raw) - UNIQ_TAIL_SIZE], pid, loader_hash, time_ms, counter)


def month_start_ms(now_ms: int, zone: dt.tzinfo) -> int:
    """Epoch ms of the start of the local month (in ``zone``) containing ``now_ms``."""
    local = dt.datetime.fromtimestamp(now_ms / 1000, zone)
    start = dt.datetime(local.year, local.month, 1, tzinfo=zone)
    return int(start.timestamp()) * 1000


def previous_month_start_ms(month_start: int, zone: dt.tzinfo) -> int:
    local = dt.datetime.fromtimestamp(month_start / 1000, zone)
    year, month = (local.year, local.month - 1) if local.month > 1 else (local.year - 1, 12)
    return int(dt.datetime(year, month, 1, tzinfo=zone).timestamp()) * 1000


def next_month_start_ms(month_start: int, zone: dt.tzinfo) -> int:
    local = dt.datetime.fromtimestamp(month_start / 1000, zone)
    year, month = (local.year, local.month + 1) if local.month < 12 else (local.year + 1, 1)
    return int(dt.datetime(year, month, 1, tzinfo=zone).timestamp()) * 1000


def uniq_key_time_field(now_ms: int, month_start: int) -> int:
    """The id's time field; a clock stepped back by up to 1,000,000 ms writes 0."""
    span = now_ms - month_start
    if -1_000_000 < span < 0:
        return 0
    return span & 0xFFFFFFFF


def nearly_time_from_id(uniq_key: str, now_ms: int, zone: dt.tzinfo) -> int:
    """getNearlyTimeFromID: the reader's month start plus the id's (unsigned) time field,
    one month earlier if that lands at or after ``now_ms``. Zone-dependent by design of the
    reference (docs/format.md §15 flaw 4); rmqstore never uses it to bound a lookup."""
    span = decode_uniq_key(uniq_key).time_since_month_ms
    start = month_start_ms(now_ms, zone)
    if start + span >= now_ms:
        start = previous_month_start_ms(start, zone)
    return start + span
