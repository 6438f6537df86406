"""Commit log records (docs/format.md §3): v1 encode, v1 and v2 decode, and the BLANK filler.

Layout of a record (all big-endian; b and s are the born/store host widths, 8 or 20):

    0   TOTALSIZE                  int32
    4   MAGICCODE                  int32   v1 DAA320A7, v2 DAA320AB, BLANK CBD43194
    8   BODYCRC                    int32   CRC-32 of the body & 0x7FFFFFFF
    12  QUEUEID                    int32
    16  FLAG                       int32
    20  QUEUEOFFSET                int64
    28  PHYSICALOFFSET             int64
    36  SYSFLAG                    int32
    40  BORNTIMESTAMP              int64
    48  BORNHOST                   b       address + int32 port
    48+b STORETIMESTAMP            int64
    56+b STOREHOST                 s
    56+b+s RECONSUMETIMES          int32
    60+b+s PREPAREDTRANSACTIONOFFSET int64
    68+b+s BODYLENGTH              int32   n
    72+b+s BODY                    n bytes
    …   TOPICLENGTH                int8 (v1, signed) / int16 (v2)
    …   TOPIC                      t bytes UTF-8
    …   PROPERTIESLENGTH           int16
    …   PROPERTIES                 p bytes UTF-8

TOTALSIZE = 74 + L + b + s + n + t + p (L = 1 in v1, 2 in v2).
"""

from __future__ import annotations

import functools
import itertools
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from rmqstore.common.codec import properties as props
from rmqstore.common.codec import sysflag
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.speedups import _speedups
from rmqstore.common.errors import Corruption, CrcMismatch, InvalidArgument

MAGIC_V1 = -626843481  # DA A3 20 A7
MAGIC_V2 = -626843477  # DA A3 20 AB
BLANK_MAGIC = -875286124  # CB D4 31 94
END_FILE_MIN_BLANK_LENGTH = 8
TOPIC_LENGTH_MAX_V1 = 127
PROPERTIES_LENGTH_MAX = 32767
INT32_MAX = 2**31 - 1

# Fixed prefix up to and including BORNTIMESTAMP.
_PREFIX = struct.Struct(
    ">i"  # TOTALSIZE
    "i"  # MAGICCODE
    "i"  # BODYCRC
    "i"  # QUEUEID
    "i"  # FLAG
    "q"  # QUEUEOFFSET
    "q"  # PHYSICALOFFSET
    "i"  # SYSFLAG
    "q"  # BORNTIMESTAMP
)
PREFIX_SIZE = _PREFIX.size
assert PREFIX_SIZE == 48
OFFSET_QUEUE_OFFSET = 20
OFFSET_PHYSICAL_OFFSET = 28
OFFSET_SYSFLAG = 36
OFFSET_BORN_HOST = 48

_SIZE_MAGIC = struct.Struct(">ii")
_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


def _middle_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    """BORNHOST … BODYLENGTH for one combination of host widths."""
    born = "16s" if born_v6 else "4s"
    store = "16s" if store_v6 else "4s"
    return struct.Struct(
        ">" + born + "i"  # BORNHOST address, port
        "q"  # STORETIMESTAMP
        + store + "i"  # STOREHOST address, port
        "i"  # RECONSUMETIMES
        "q"  # PREPAREDTRANSACTIONOFFSET
        "i"  # BODYLENGTH
    )


_MIDDLE = {(b, s): _middle_struct(b, s) for b in (False, True) for s in (False, True)}
_FULL_V1 = {
    key: struct.Struct(_PREFIX.format + middle.format[1:]) for key, middle in _MIDDLE.items()
}


def body_crc(body: bytes | memoryview) -> int:
    """UtilAll.crc32: zlib CRC-32 masked to 31 bits; an empty body gives 0."""
    if not body:
        return 0
    return zlib.crc32(body) & 0x7FFFFFFF


def record_size(
    body_len: int, topic_len: int, properties_len: int, *, born_v6: bool, store_v6: bool, version: int = 1
) -> int:
    """calMsgLength: 74 + L + b + s + n + t + p."""
    topic_len_width = 1 if version == 1 else 2
    return (
        74
        + topic_len_width
        + (20 if born_v6 else 8)
        + (20 if store_v6 else 8)
        + max(body_len, 0)
        + topic_len
        + max(properties_len, 0)
    )


# The smallest record of each version (IPv4 hosts, empty body, topic and properties);
# an IPv6 host adds 12 bytes.
_MINIMUM_SIZE = {version: record_size(0, 0, 0, born_v6=False, store_v6=False, version=version) for version in (1, 2)}
assert record_size(0, 0, 0, born_v6=True, store_v6=True) == _MINIMUM_SIZE[1] + 24
_DEFAULT_HOST = SocketAddress(b"\x00\x00\x00\x00", 0)
# Records name few distinct hosts (one store host, the producers' addresses): decoding
# shares one immutable SocketAddress per host instead of building one per record.
_address = functools.lru_cache(maxsize=4096)(SocketAddress)


@dataclass(slots=True)
class Record:
    """One commit log message, decoded. Names follow docs/format.md with units last."""

    topic: str
    body: bytes = b""
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    commitlog_offset: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: SocketAddress = _DEFAULT_HOST
    store_timestamp_ms: int = 0
    store_host: SocketAddress = _DEFAULT_HOST
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0
    size: int = 0
    version: int = 1

    @property
    def keys(self) -> str | None:
        return self.properties.get(props.KEYS)

    @property
    def tags(self) -> str | None:
        return self.properties.get(props.TAGS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(props.UNIQ_KEY)

    @property
    def transaction_type(self) -> int:
        return sysflag.transaction_type(self.sys_flag)

    @property
    def next_offset(self) -> int:
        return self.commitlog_offset + self.size


assert tuple(Record.__dataclass_fields__) == (
    "topic", "body", "properties", "queue_id", "flag", "queue_offset", "commitlog_offset", "sys_flag",
    "born_timestamp_ms", "born_host", "store_timestamp_ms", "store_host", "reconsume_times",
    "prepared_transaction_offset", "body_crc", "size", "version",
), "decode_record builds records positionally"


@dataclass(frozen=True, slots=True)
class Blank:
    """The END_OF_FILE filler: the rest of the file, from this offset, holds no record."""

    commitlog_offset: int
    size: int


def store_timestamp_at(buf: bytes | bytearray | memoryview, pos: int) -> int | None:
    """STORETIMESTAMP of the v1/v2 record at ``pos``, read from its header alone (after
    BORNHOST, whose width the sysFlag gives); None if no record header starts there."""
    if pos + _SIZE_MAGIC.size > len(buf):
        return None
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        return None
    (sys_flag,) = _INT32.unpack_from(buf, pos + OFFSET_SYSFLAG)
    at = pos + OFFSET_BORN_HOST + (20 if sys_flag & sysflag.BORNHOST_V6 else 8)
    if at + 8 > pos + size or at + 8 > len(buf):
        return None
    (born_timestamp_ms,) = _INT64.unpack_from(buf, at)
    return int(born_timestamp_ms)


def encode_blank(size: int) -> bytes:
    """The 8 bytes written at the end of a full file: int32 remaining size, BLANK magic."""
    return _SIZE_MAGIC.pack(size, BLANK_MAGIC)


def host_flags(born_host: SocketAddress, store_host: SocketAddress) -> int:
    return (sysflag.BORNHOST_V6 if born_host.is_v6 else 0) | (
        sysflag.STOREHOST_V6 if store_host.is_v6 else 0
    )


def encode_record(record: Record, *, properties_bytes: bytes | None = None) -> bytes:
    """Encode as a v1 record (MessageExtEncoder.encode) with the record's own offsets.

    The IPv6 sysFlag bits are derived from the hosts, and the body CRC from the body, so
    the result always validates. ``properties_bytes`` lets a caller pass pre-encoded
    properties (the batch path); otherwise ``record.properties`` is encoded in its order.
    """
    topic_bytes = record.topic.encode("utf-8")
    if len(topic_bytes) > TOPIC_LENGTH_MAX_V1:
        raise InvalidArgument(
            f"topic is {len(topic_bytes)} bytes; a v1 record holds at most {TOPIC_LENGTH_MAX_V1}"
        )
    if properties_bytes is None:
        properties_bytes = props.encode_properties(record.properties)
    if len(properties_bytes) > PROPERTIES_LENGTH_MAX:
        raise InvalidArgument(
            f"properties are {len(properties_bytes)} bytes; at most {PROPERTIES_LENGTH_MAX}"
        )
    born, store = record.born_host, record.store_host
    sys_flag = (record.sys_flag & ~(sysflag.BORNHOST_V6 | sysflag.STOREHOST_V6)) | host_flags(
        born, store
    )
    body = record.body
    tail = encode_tail(topic_bytes, properties_bytes)
    size = record_size(len(body), len(topic_bytes), len(properties_bytes), born_v6=born.is_v6, store_v6=store.is_v6)
    head = encode_head(
        size,
        body_crc(body),
        record.queue_id,
        record.flag,
        record.queue_offset,
        record.commitlog_offset,
        sys_flag,
        record.born_timestamp_ms,
        born,
        record.store_timestamp_ms,
        store,
        record.reconsume_times,
        record.prepared_transaction_offset,
        len(body),
    )
    return b"".join((head, body, tail))


@functools.lru_cache(maxsize=1024)
def _topic_field(topic: str) -> bytes:
    """TOPICLENGTH and TOPIC of a v1 record."""
    data = topic.encode("utf-8")
    return len(data).to_bytes(1, "big") + data


def encode_records(
    first_offset: int,
    queue_ids: list[int],
    flags: list[int],
    queue_offsets: list[int],
    born_timestamps_ms: Sequence[int | None],
    born_hosts: list[SocketAddress],
    bodies: list[bytes],
    topics: list[str],
    properties: list[bytes],
    store_timestamp_ms: int,
    store_host: SocketAddress,
    now_ms: int,
) -> tuple[bytes, list[int]]:
    """The v1 records of a writer's batch, joined, and each one's size: the bytes of
    :func:`encode_record` for each message, laid out one after another from
    ``first_offset`` (their PHYSICALOFFSETs). A born timestamp of 0 or None becomes
    ``now_ms``; RECONSUMETIMES and PREPAREDTRANSACTIONOFFSET are 0 and the sysFlag holds
    only the host widths. The caller has validated the lengths (a topic of at most 127
    UTF-8 bytes, properties of at most 32,767)."""
    store_v6 = store_host.is_v6
    store_flag = sysflag.STOREHOST_V6 if store_v6 else 0
    tails = [_topic_field(topic) + len(p).to_bytes(2, "big") + p for topic, p in zip(topics, properties)]
    # A tail is TOPICLENGTH (1) + topic + PROPERTIESLENGTH (2) + properties.
    fixed = record_size(0, 0, 0, born_v6=False, store_v6=store_v6) - 3
    born_v6 = [born.is_v6 for born in born_hosts]
    sizes = [fixed + len(body) + len(tail) + (12 if v6 else 0) for body, tail, v6 in zip(bodies, tails, born_v6)]
    offsets = itertools.accumulate(sizes, initial=first_offset)
    heads = [
        _FULL_V1[(v6, store_v6)].pack(
            size, MAGIC_V1, body_crc(body), queue_id, flag, queue_offset, offset,
            store_flag | (sysflag.BORNHOST_V6 if v6 else 0), born_ts or now_ms, born.ip, born.port,
            store_timestamp_ms, store_host.ip, store_host.port, 0, 0, len(body),
        )
        for v6, size, queue_id, flag, queue_offset, offset, born_ts, born, body in zip(
            born_v6, sizes, queue_ids, flags, queue_offsets, offsets, born_timestamps_ms, born_hosts, bodies,
        )
    ]  # fmt: skip
    return b"".join(part for parts in zip(heads, bodies, tails) for part in parts), sizes


def set_physical_offsets(records: bytes, sizes: list[int], offsets: list[int]) -> bytearray:
    """Records joined by :func:`encode_records`, with the PHYSICALOFFSETs ``offsets`` (a
    layout that starts a new file part-way through the batch)."""
    patched = bytearray(records)
    position = 0
    for size, offset in zip(sizes, offsets):
        _INT64.pack_into(patched, position + OFFSET_PHYSICAL_OFFSET, offset)
        position += size
    return patched


def set_transaction(records: bytearray, position: int, transaction_type: int, prepared_offset: int) -> None:
    """Give the record at ``position`` of joined records a transaction type (its sysFlag's
    TRANSACTION bits) and PREPAREDTRANSACTIONOFFSET: a committed transaction's copy, which
    names its half message's commit log offset (EndTransactionProcessor). Neither field is
    under a CRC."""
    (flags,) = _INT32.unpack_from(records, position + OFFSET_SYSFLAG)
    _INT32.pack_into(records, position + OFFSET_SYSFLAG, (flags & ~sysflag.TRANSACTION_MASK) | transaction_type)
    hosts = (20 if flags & sysflag.BORNHOST_V6 else 8) + (20 if flags & sysflag.STOREHOST_V6 else 8)
    _INT64.pack_into(records, position + OFFSET_BORN_HOST + hosts + 8 + 4, prepared_offset)


def encode_head(
    size: int,
    crc: int,
    queue_id: int,
    flag: int,
    queue_offset: int,
    commitlog_offset: int,
    sys_flag: int,
    born_timestamp_ms: int,
    born: SocketAddress,
    store_timestamp_ms: int,
    store: SocketAddress,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body_length: int,
) -> bytes:
    """TOTALSIZE … BODYLENGTH of a v1 record; the batch path of the writer calls it
    directly with the fields it has, :func:`encode_record` with a record's."""
    return _FULL_V1[(len(born.ip) == 16, len(store.ip) == 16)].pack(
        size,
        MAGIC_V1,
        crc,
        queue_id,
        flag,
        queue_offset,
        commitlog_offset,
        sys_flag,
        born_timestamp_ms,
        born.ip,
        born.port,
        store_timestamp_ms,
        store.ip,
        store.port,
        reconsume_times,
        prepared_transaction_offset,
        body_length,
    )


def head_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    """The struct of TOTALSIZE … BODYLENGTH for these host widths (the argument order of
    :func:`encode_head`, hosts as address and port): the bulk decoder reads heads with it."""
    return _FULL_V1[(born_v6, store_v6)]


def encode_tail(topic_bytes: bytes, properties_bytes: bytes) -> bytes:
    """TOPICLENGTH … PROPERTIES of a v1 record (what follows the body)."""
    return b"".join((_INT8.pack(len(topic_bytes)), topic_bytes, _INT16.pack(len(properties_bytes)), properties_bytes))


def patch_offsets(buf: bytearray | memoryview, pos: int, *, queue_offset: int, commitlog_offset: int) -> None:
    """Set QUEUEOFFSET and PHYSICALOFFSET of an encoded record in place."""
    _INT64.pack_into(buf, pos + OFFSET_QUEUE_OFFSET, queue_offset)
    _INT64.pack_into(buf, pos + OFFSET_PHYSICAL_OFFSET, commitlog_offset)


def decode_record(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    commitlog_offset: int | None = None,
    check_crc: bool = True,
    limit: int | None = None,
) -> Record | Blank | None:
    """Decode the record at ``buf[pos:]``; never reads at or past ``limit`` (default len(buf)).

    Returns a :class:`Record`, a :class:`Blank` filler, or None where the bytes are zero
    (size 0 and magic 0: the end of the written data). Anything else raises
    :class:`Corruption` (or :class:`CrcMismatch`) naming the commit log offset, which is
    ``commitlog_offset`` if given, else ``pos``.
    """
    end = len(buf) if limit is None else limit
    if _speedups is not None:
        record: Record | Blank | None = _speedups.decode_record(buf, pos, check_crc, end)
        if record is not None:
            return record
    return _decode_record(buf, pos, pos if commitlog_offset is None else commitlog_offset, check_crc, end)


def _decode_record(
    buf: bytes | bytearray | memoryview, pos: int, at: int, check_crc: bool, end: int
) -> Record | Blank | None:
    """The definition of :func:`decode_record`, and its every outcome other than a good
    record, which the compiled path hands back here."""
    if pos + 8 > end:
        if not any(bytes(buf[pos:end])):
            return None
        raise Corruption(f"truncated record header at commit log offset {at}", offset=at)
    total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return Blank(at, total)
    if magic not in (MAGIC_V1, MAGIC_V2):
        if total == 0 and magic == 0:
            return None
        raise Corruption(f"bad magic code {magic & 0xFFFFFFFF:08X} at commit log offset {at}", offset=at)
    version = 1 if magic == MAGIC_V1 else 2
    minimum = _MINIMUM_SIZE[version]
    if total < minimum or pos + total > end:
        raise Corruption(
            f"bad record size {total} at commit log offset {at} "
            f"({end - pos} bytes left in the file, a record is at least {minimum})",
            offset=at,
        )
    record_end = pos + total
    # Both versions share the head (TOTALSIZE … BODYLENGTH); the sysFlag sets its host
    # widths, and then the whole head comes in one unpack.
    (sys_flag,) = _INT32.unpack_from(buf, pos + OFFSET_SYSFLAG)
    born_v6 = bool(sys_flag & sysflag.BORNHOST_V6)
    store_v6 = bool(sys_flag & sysflag.STOREHOST_V6)
    head = _FULL_V1[(born_v6, store_v6)]
    cursor = pos + head.size
    if cursor > record_end:
        raise Corruption(f"record at commit log offset {at} is shorter than its header", offset=at)
    (
        _, _, stored_crc, queue_id, flag, queue_offset, physical_offset, _, born_ts,
        born_ip, born_port, store_ts, store_ip, store_port, reconsume_times, prepared_offset, body_len,
    ) = head.unpack_from(buf, pos)  # fmt: skip
    topic_len_width = 1 if version == 1 else 2
    if body_len < 0 or cursor + body_len + topic_len_width > record_end:
        raise Corruption(f"bad body length {body_len} at commit log offset {at}", offset=at)
    body = bytes(buf[cursor : cursor + body_len])
    cursor += body_len
    if version == 1:
        (topic_len,) = _INT8.unpack_from(buf, cursor)
    else:
        (topic_len,) = _INT16.unpack_from(buf, cursor)
    cursor += topic_len_width
    if topic_len < 0 or cursor + topic_len + 2 > record_end:
        raise Corruption(f"bad topic length {topic_len} at commit log offset {at}", offset=at)
    topic = bytes(buf[cursor : cursor + topic_len]).decode("utf-8", "replace")
    cursor += topic_len
    (properties_len,) = _INT16.unpack_from(buf, cursor)
    cursor += 2
    if properties_len < 0 or cursor + properties_len > record_end:
        raise Corruption(f"bad properties length {properties_len} at commit log offset {at}", offset=at)
    properties = props.decode_properties(buf[cursor : cursor + properties_len])
    expected = minimum + (12 if born_v6 else 0) + (12 if store_v6 else 0) + body_len + topic_len + properties_len
    if total != expected:
        raise Corruption(
            f"record size {total} at commit log offset {at} disagrees with its fields ({expected})",
            offset=at,
        )
    if check_crc and body_len > 0:
        computed = body_crc(body)
        if computed != stored_crc:
            raise CrcMismatch(offset=at, stored=stored_crc, computed=computed)
    # Positional, in Record's field order: keywords cost more than the rest of a lookup's
    # decoding of the fixed fields.
    return Record(
        topic,
        body,
        properties,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_ts,
        _address(born_ip, born_port),
        store_ts,
        _address(store_ip, store_port),
        reconsume_times,
        prepared_offset,
        stored_crc,
        total,
        version,
    )


# The compiled paths, where the extension is built (every install builds it): the same
# results, pinned by tests/test_speedups.py against the Python definitions above.
python_encode_records = encode_records
if _speedups is not None:
    # With Record's fields, in order, as its slots and nothing more to its __init__, the
    # compiled decoder fills a record's slots in place rather than calling __init__.
    _plain_record = not hasattr(Record, "__post_init__") and "__slots__" in Record.__dict__
    _speedups.configure(Record, _address, tuple(f.name for f in fields(Record)) if _plain_record else None)
    encode_records = _speedups.encode_records
