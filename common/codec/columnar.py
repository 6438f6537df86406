"""Commit log records decoded in bulk, column by column (docs/format.md §3), for scans.

The rules are :func:`record.decode_record`'s (and ``CommitLog``'s check that a record's
PHYSICALOFFSET is where it lies), applied to many records at once in two steps:

1. :func:`walk` finds record starts by following TOTALSIZE. That is sequential by nature,
   so it is one tight loop over the 8-byte size/magic headers, and it stops at anything
   that is not plainly a record: a BLANK filler, zeros, a bad magic or size, the end of
   the buffer, or the limits it was given.
2. :func:`decode` reads every field of the walked records with numpy. The fixed fields
   come from one gather of each record's head, read through big-endian structured dtypes
   built from ``record.head_struct`` (one per IPv4/IPv6 host combination); body, topic and
   properties are spans (position, length) into a copy of the records' bytes, so callers
   can build columns from buffers without a Python object per record. Each record is
   validated exactly as the per-record decoder does; the columns stop before the first
   record that fails, and ``bad`` says where it starts, so that the per-record reader can
   say what is wrong there (torn tail or corruption).

Properties are split into name/value spans with string2messageProperties' rules, as
:func:`properties.decode_properties` applies them: empty names or values are dropped, a
value may contain 0x01, and a later duplicate name wins (keeping the place of the first).
Names are compared as bytes; a row where two names might be equal takes a per-row path
with the exact dictionary semantics. Texts are spans of raw bytes: for valid UTF-8 they
are what the per-record decoder returns; :func:`decode_text` is its rule for the others.
"""

from __future__ import annotations

import binascii
import enum
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rmqstore.common.codec import sysflag
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.properties import (
    KEYS,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    TAGS,
    UNIQ_KEY,
)
from rmqstore.common.codec.record import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    OFFSET_PHYSICAL_OFFSET,
    OFFSET_SYSFLAG,
    PROPERTIES_LENGTH_MAX,
    body_crc,
    head_struct,
    record_size,
)
from rmqstore.common.codec.speedups import _speedups

# The fields of ``record.head_struct`` (TOTALSIZE … BODYLENGTH), in its order.
_HEAD_FIELDS = (
    "size",
    "magic",
    "body_crc",
    "queue_id",
    "flag",
    "queue_offset",
    "commitlog_offset",
    "sys_flag",
    "born_timestamp_ms",
    "born_ip",
    "born_port",
    "store_timestamp_ms",
    "store_ip",
    "store_port",
    "reconsume_times",
    "prepared_transaction_offset",
    "body_length",
)
_STRUCT_TOKEN = re.compile(r"(\d*)([a-zA-Z])")
_NUMPY_CODES = {"i": ">i4", "q": ">i8"}


def _head_dtype(layout: struct.Struct) -> np.dtype:
    """The numpy record dtype with exactly ``layout``'s bytes (big-endian, no padding)."""
    fmt = layout.format
    assert fmt.startswith(">"), fmt
    fields: list[tuple[str, Any] | tuple[str, Any, tuple[int]]] = []
    names = iter(_HEAD_FIELDS)
    for count, code in _STRUCT_TOKEN.findall(fmt[1:]):
        if code == "s":
            fields.append((next(names), np.uint8, (int(count),)))
        else:
            fields.extend((next(names), _NUMPY_CODES[code]) for _ in range(int(count or 1)))
    assert next(names, None) is None, "every head field named"
    dtype = np.dtype(fields)
    assert dtype.itemsize == layout.size
    return dtype


# Host combinations, numbered born_v6 + 2 * store_v6.
_COMBOS = tuple((bool(number & 1), bool(number & 2)) for number in range(4))
_HEADS = tuple(_head_dtype(head_struct(*combo)) for combo in _COMBOS)
HEAD_BYTES_MAX = max(dtype.itemsize for dtype in _HEADS)
# TOTALSIZE of a record with an empty body, topic and properties, per combination and
# topic-length width (v1: 1 byte, v2: 2).
_EMPTY_SIZE = np.array(
    [[record_size(0, 0, 0, born_v6=b, store_v6=s, version=v) for v in (1, 2)] for b, s in _COMBOS], np.int64
)
_SIZE_MIN = record_size(0, 0, 0, born_v6=False, store_v6=False, version=1)
_SIZE_MAGIC = struct.Struct(">ii")
_INT32 = struct.Struct(">i")
# Properties are searched in rows of a power-of-two width, at least this.
_MATRIX_WIDTH_MIN = 128
_MATRIX_WIDTH_MAX = 1 << PROPERTIES_LENGTH_MAX.bit_length()
# Room after the copied records, so that fixed-width reads near the end stay in bounds.
_PAD_BYTES = max(HEAD_BYTES_MAX, _MATRIX_WIDTH_MAX) + 8
_NAME_SEPARATOR = ord(NAME_VALUE_SEPARATOR)
_PAIR_SEPARATOR = ord(PROPERTY_SEPARATOR)
# Rows with more pairs than this are compared name by name on the per-row path.
_PAIRS_COMPARED_MAX = 32


class WalkEnd(enum.Enum):
    STOP = "stop"  # the next record starts at or past ``stop``
    LIMIT = "limit"  # rows or bytes limit reached: walk on from ``position``
    BLANK = "blank"  # a BLANK filler at ``position``: the rest of the file holds no record
    OTHER = "other"  # no record at ``position`` (zeros, a bad header, the buffer's end)


@dataclass(frozen=True, slots=True)
class Walk:
    starts: np.ndarray  # int64 positions of consecutive records in the buffer
    position: int  # where the walk ended: the next record, the BLANK or the bad bytes
    end: WalkEnd


def walk(buf: bytes | bytearray | memoryview, position: int, *, stop: int, rows_max: int, bytes_max: int) -> Walk:
    """Record starts from ``position`` (a record start) on, before ``stop``: at most
    ``rows_max`` records, and none starting ``bytes_max`` or more past ``position``.

    A header passes if its magic is v1 or v2 and its size is at least the smallest
    record's and fits the buffer; :func:`decode` checks the rest.
    """
    unpack = _SIZE_MAGIC.unpack_from
    size_end = len(buf)
    limit = min(stop, position + bytes_max, size_end - _SIZE_MAGIC.size + 1)
    if _speedups is not None:
        found, position = _speedups.walk_starts(buf, position, limit, rows_max)
        starts = np.frombuffer(found, np.int64)
    else:
        listed = []
        for _ in range(rows_max):
            if position >= limit:
                break
            size, magic = unpack(buf, position)
            if (magic != MAGIC_V1 and magic != MAGIC_V2) or size < _SIZE_MIN or position + size > size_end:
                break
            listed.append(position)
            position += size
        starts = np.array(listed, np.int64)
    if position >= stop:
        return Walk(starts, position, WalkEnd.STOP)
    if position + _SIZE_MAGIC.size <= size_end:
        size, magic = unpack(buf, position)
        if magic == BLANK_MAGIC:
            return Walk(starts, position, WalkEnd.BLANK)
        if (magic == MAGIC_V1 or magic == MAGIC_V2) and size >= _SIZE_MIN and position + size <= size_end:
            return Walk(starts, position, WalkEnd.LIMIT)
    return Walk(starts, position, WalkEnd.OTHER)


@dataclass(frozen=True, slots=True)
class Spans:
    """Byte ranges of ``RecordColumns.data``, one per row (or per property pair)."""

    at: np.ndarray  # int64 positions
    length: np.ndarray  # int64 lengths


@dataclass(frozen=True, slots=True)
class Hosts:
    """A host column as ``SocketAddress.java_text`` of each distinct address."""

    texts: list[str]
    index: np.ndarray  # int64: the row's text in ``texts``


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """Decoded records, one array entry per record, in commit log order."""

    data: np.ndarray  # uint8: the records' bytes; every span points into it
    commitlog_offset: np.ndarray  # int64
    size: np.ndarray  # int32
    queue_id: np.ndarray  # int32
    flag: np.ndarray  # int32
    queue_offset: np.ndarray  # int64
    sys_flag: np.ndarray  # int32
    born_timestamp_ms: np.ndarray  # int64
    store_timestamp_ms: np.ndarray  # int64
    reconsume_times: np.ndarray  # int32
    prepared_transaction_offset: np.ndarray  # int64
    body_crc: np.ndarray  # int32, as stored
    version: np.ndarray  # int8: 1 or 2
    born_host: Hosts
    store_host: Hosts
    msg_id_ends: np.ndarray  # int64, rows + 1: offsetMsgId i is msg_id_chars[ends[i]:ends[i+1]]
    msg_id_chars: np.ndarray  # uint8: uppercase hex
    body: Spans
    topic: Spans
    properties: Spans  # the raw PROPERTIES bytes
    pair_ends: np.ndarray  # int64, rows + 1: row i holds pairs pair_ends[i]:pair_ends[i+1]
    names: Spans  # per pair, in dictionary order (first occurrence of each name)
    values: Spans  # per pair: the value of the last occurrence
    keys: np.ndarray  # int64 per row: the pair holding KEYS, or -1
    tags: np.ndarray  # int64 per row: the pair holding TAGS, or -1
    uniq_key: np.ndarray  # int64 per row: the pair holding UNIQ_KEY, or -1
    bad: int | None  # index in the walked starts of the first record that failed, if any

    @property
    def rows(self) -> int:
        return len(self.commitlog_offset)


def decode_text(data: np.ndarray, at: int, length: int) -> str:
    """A text field as the per-record decoder reads it (UTF-8, bad bytes replaced)."""
    return data[at : at + length].tobytes().decode("utf-8", "replace")


def decode(
    buf: bytes | bytearray | memoryview,
    starts: np.ndarray | Sequence[int],
    *,
    base_offset: int,
    check_crc: bool = True,
) -> RecordColumns:
    """The records at ``starts`` (consecutive, as :func:`walk` gives them) of ``buf``,
    whose first byte is at commit log offset ``base_offset``. The records' bytes are
    copied (the result holds no view of ``buf``). Columns end before the first record
    that does not decode, or whose PHYSICALOFFSET is not its own offset, or (with
    ``check_crc``) whose non-empty body fails its CRC."""
    if len(starts) == 0:
        raise ValueError("decode needs at least one record start")
    first, last = int(starts[0]), int(starts[-1])
    (last_size,) = _INT32.unpack_from(buf, last)
    length = last + last_size - first
    data = np.zeros(length + _PAD_BYTES, np.uint8)
    data[:length] = np.frombuffer(buf, np.uint8, length, first)
    position = np.asarray(starts, np.int64) - first
    heads = np.lib.stride_tricks.sliding_window_view(data, HEAD_BYTES_MAX)[position]
    fields = _HeadFields(heads)

    size = fields.pick("size")
    magic = fields.pick("magic")
    body_length = fields.pick("body_length").astype(np.int64)
    version = np.where(magic == MAGIC_V2, 2, 1).astype(np.int8)
    topic_length_width = version.astype(np.int64)
    body_at = position + fields.head_bytes
    topic_length_at = body_at + body_length
    topic_length = np.where(
        version == 2,
        _int16_at(data, topic_length_at),
        _read(data, _clip(data, topic_length_at), ">i1"),
    ).astype(np.int64)
    topic_at = topic_length_at + topic_length_width
    properties_length_at = topic_at + topic_length
    properties_length = _int16_at(data, properties_length_at).astype(np.int64)
    expected = _EMPTY_SIZE[fields.combo, version - 1] + body_length + topic_length + properties_length
    commitlog_offset = fields.pick("commitlog_offset")
    good = (
        (body_length >= 0)
        & (topic_length >= 0)
        & (properties_length >= 0)
        & (size == expected)
        & (commitlog_offset == base_offset + first + position)
    )
    bad = _first_false(good)
    count = len(starts) if bad is None else bad
    stored_crc = fields.pick("body_crc")
    if check_crc:
        mismatch = _first_crc_mismatch(data, body_at[:count], body_length[:count], stored_crc[:count])
        if mismatch is not None:
            bad = count = mismatch

    keep = slice(0, count)
    properties = Spans(properties_length_at[keep] + 2, properties_length[keep])
    pair_ends, names, values, named = _pairs(data, properties)
    born_host, store_host = fields.hosts(keep)
    msg_id_ends, msg_id_chars = fields.msg_ids(keep)
    return RecordColumns(
        data=data,
        commitlog_offset=commitlog_offset[keep],
        size=size[keep],
        queue_id=fields.pick("queue_id")[keep],
        flag=fields.pick("flag")[keep],
        queue_offset=fields.pick("queue_offset")[keep],
        sys_flag=fields.sys_flag[keep],
        born_timestamp_ms=fields.pick("born_timestamp_ms")[keep],
        store_timestamp_ms=fields.pick("store_timestamp_ms")[keep],
        reconsume_times=fields.pick("reconsume_times")[keep],
        prepared_transaction_offset=fields.pick("prepared_transaction_offset")[keep],
        body_crc=stored_crc[keep],
        version=version[keep],
        born_host=born_host,
        store_host=store_host,
        msg_id_ends=msg_id_ends,
        msg_id_chars=msg_id_chars,
        body=Spans(body_at[keep], body_length[keep]),
        topic=Spans(topic_at[keep], topic_length[keep]),
        properties=properties,
        pair_ends=pair_ends,
        names=names,
        values=values,
        keys=named[KEYS],
        tags=named[TAGS],
        uniq_key=named[UNIQ_KEY],
        bad=bad,
    )


class _HeadFields:
    """The heads of a batch of records read through the dtype of each record's host
    combination; a batch usually has one combination, and then needs no masking."""

    def __init__(self, heads: np.ndarray):
        self.heads = heads
        rows = len(heads)
        flags = np.ndarray((rows,), ">i4", heads, OFFSET_SYSFLAG, (HEAD_BYTES_MAX,))
        self.sys_flag = flags.astype(np.int32)
        self.combo = ((self.sys_flag & sysflag.BORNHOST_V6) != 0) + 2 * ((self.sys_flag & sysflag.STOREHOST_V6) != 0)
        present = np.unique(self.combo)
        self.views = {int(k): np.ndarray((rows,), _HEADS[k], heads, 0, (HEAD_BYTES_MAX,)) for k in present}
        self.masks = {k: (slice(None) if len(present) == 1 else self.combo == k) for k in self.views}
        self.head_bytes = np.array([dtype.itemsize for dtype in _HEADS], np.int64)[self.combo]

    def pick(self, name: str) -> np.ndarray:
        """One numeric field in native byte order."""
        result: np.ndarray | None = None
        for k, view in self.views.items():
            column = view[name]
            if result is None:
                result = column.astype(column.dtype.newbyteorder("="))
            else:
                mask = self.masks[k]
                result[mask] = column[mask]
        assert result is not None
        return result

    def _host_keys(self, side: str, keep: slice) -> np.ndarray:
        """Per row: IPv6 flag, address (16 bytes, an IPv4 one left-aligned), port bytes."""
        rows = len(self.heads[keep])
        keys = np.zeros((rows, 21), np.uint8)
        for k, view in self.views.items():
            mask = self.masks[k]
            address = view[f"{side}_ip"][keep]
            port = np.ascontiguousarray(view[f"{side}_port"][keep]).view(np.uint8).reshape(rows, 4)
            width = address.shape[1]
            if isinstance(mask, slice):
                keys[:, 0] = width == 16
                keys[:, 1 : 1 + width] = address
                keys[:, 17:] = port
            else:
                mask = mask[keep]
                keys[mask, 0] = width == 16
                keys[mask, 1 : 1 + width] = address[mask]
                keys[mask, 17:] = port[mask]
        return keys

    def hosts(self, keep: slice) -> tuple[Hosts, Hosts]:
        return _hosts(self._host_keys("born", keep)), _hosts(self._host_keys("store", keep))

    def msg_ids(self, keep: slice) -> tuple[np.ndarray, np.ndarray]:
        """offsetMsgId text: the store host's bytes (address, port) and PHYSICALOFFSET, in
        uppercase hex (msgid.offset_msg_id), as one char buffer with row ends."""
        heads = self.heads[keep]
        rows = len(heads)
        store_v6 = (self.combo[keep] & 2) != 0
        widths = np.where(store_v6, 2 * (16 + 4 + 8), 2 * (4 + 4 + 8))
        ends = np.zeros(rows + 1, np.int64)
        np.cumsum(widths, out=ends[1:])
        chars = np.empty(int(ends[-1]), np.uint8)
        combo = self.combo[keep]
        for k in self.views:
            rows_here = np.flatnonzero(combo == k)
            if not len(rows_here):
                continue
            store_at = _field_offset(_HEADS[k], "store_ip")
            store_end = _field_offset(_HEADS[k], "store_port") + 4
            raw = np.concatenate(
                (
                    heads[rows_here, store_at:store_end],
                    heads[rows_here, OFFSET_PHYSICAL_OFFSET : OFFSET_PHYSICAL_OFFSET + 8],
                ),
                axis=1,
            )
            text = np.frombuffer(binascii.hexlify(raw.tobytes()).upper(), np.uint8).reshape(len(rows_here), -1)
            if len(rows_here) == rows:
                chars = text.ravel()
            else:
                chars[ends[rows_here][:, None] + np.arange(text.shape[1])] = text
        return ends, chars


def _field_offset(dtype: np.dtype, name: str) -> int:
    assert dtype.fields is not None
    return int(dtype.fields[name][1])


def _hosts(keys: np.ndarray) -> Hosts:
    """Distinct addresses formatted once each: a store has few hosts."""
    if not len(keys) or (keys == keys[0]).all():
        distinct, index = keys[:1], np.zeros(len(keys), np.int64)
    else:
        packed = np.ascontiguousarray(keys).view(np.dtype((np.void, keys.shape[1]))).ravel()
        _, first, index = np.unique(packed, return_index=True, return_inverse=True)
        distinct = keys[first]
    texts = []
    for key in distinct:
        width = 16 if key[0] else 4
        port = int.from_bytes(key[17:].tobytes(), "big", signed=True)
        texts.append(SocketAddress(key[1 : 1 + width].tobytes(), port).java_text())
    return Hosts(texts, index.astype(np.int64).ravel())


def _clip(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Positions kept inside ``data``: fields of a bad record may point anywhere; such a
    record fails validation whatever is read for it."""
    return np.clip(at, 0, len(data) - 2)


def _int16_at(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _read(data, _clip(data, at), ">i2")


def _first_false(flags: np.ndarray) -> int | None:
    if flags.all():
        return None
    return int(np.argmin(flags))


def _first_crc_mismatch(data: np.ndarray, at: np.ndarray, length: np.ndarray, stored: np.ndarray) -> int | None:
    """The first row whose non-empty body's CRC differs from the stored one (§3.5)."""
    if _speedups is not None:
        crcs = _speedups.body_crcs(
            np.ascontiguousarray(data), np.ascontiguousarray(at, np.int64), np.ascontiguousarray(length, np.int64)
        )
        computed = np.frombuffer(crcs, np.int64)
    else:
        view = data.data
        bodies = map(view.__getitem__, map(slice, at.tolist(), (at + length).tolist()))
        computed = np.fromiter(map(body_crc, bodies), np.int64, len(at))
    return _first_false((length == 0) | (computed == stored))


def _read(data: np.ndarray, at: np.ndarray, dtype: str) -> np.ndarray:
    """The ``dtype`` value starting at each position (unaligned reads), in native order."""
    width = np.dtype(dtype).itemsize
    words = np.ndarray((len(data) - width + 1,), dtype, data, 0, (1,))
    return words[at].astype(np.dtype(dtype).newbyteorder("="))


def _prefix_words(data: np.ndarray, at: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The first (up to) 8 bytes of each span as a big-endian integer: the whole span
    when it is at most 8 bytes long."""
    return _read(data, at, ">u8") >> (8 * (8 - np.minimum(length, 8))).astype(np.uint64)


def _separators(data: np.ndarray, properties: Spans) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every 0x01 and 0x02 inside the properties spans, in position order: its row, its
    position and the byte. Each row's span is read into a matrix row of a power-of-two
    width, so that the search touches the properties only (and rows own their hits)."""
    lengths = properties.length
    widths = np.left_shift(1, np.ceil(np.log2(np.maximum(lengths, _MATRIX_WIDTH_MIN))).astype(np.int64))
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    classes = np.unique(widths)
    for width in classes.tolist():
        rows = np.arange(len(lengths)) if len(classes) == 1 else np.flatnonzero(widths == width)
        at = properties.at[rows]
        matrix = np.lib.stride_tricks.sliding_window_view(data, width)[at]
        # 0x01 and 0x02 become 0 and 1: the only bytes below 2 (0x00 wraps to 0xFF).
        matrix -= 1
        row_in, column = np.divmod(np.flatnonzero(matrix < 2), width)
        inside = column < lengths[rows][row_in]
        row_in, column = row_in[inside], column[inside]
        found.append((rows[row_in], at[row_in] + column, matrix[row_in, column] + 1))
    row, position, byte = (np.concatenate(parts) for parts in zip(*found))
    if len(found) > 1:
        order = np.argsort(position, kind="stable")
        row, position, byte = row[order], position[order], byte[order]
    return row, position, byte


def _pairs(data: np.ndarray, properties: Spans) -> tuple[np.ndarray, Spans, Spans, dict[str, np.ndarray]]:
    """string2messageProperties over every row: per-row pair counts (as ends), name and
    value spans, and for KEYS, TAGS and UNIQ_KEY the pair holding each per row."""
    rows = len(properties.at)
    if not rows:
        none = np.zeros(0, np.int64)
        return np.zeros(1, np.int64), Spans(none, none), Spans(none, none), {KEYS: none, TAGS: none, UNIQ_KEY: none}
    if _speedups is not None:
        return _compiled_pairs(data, properties)
    row, position, byte = _separators(data, properties)
    # Segments: each non-empty span cut at every 0x02, numbered in position order.
    cuts = byte == _PAIR_SEPARATOR
    cut_row, cut_at = row[cuts], position[cuts]
    cuts_per_row = np.bincount(cut_row, minlength=rows)
    filled = properties.length > 0
    segments_per_row = filled + cuts_per_row
    first_segment = np.zeros(rows, np.int64)
    np.cumsum(segments_per_row[:-1], out=first_segment[1:])
    cuts_before_row = first_segment - np.cumsum(filled) + filled
    cut_rank = np.arange(len(cut_at)) - cuts_before_row[cut_row]
    segments = int(segments_per_row.sum())
    seg_start = np.empty(segments, np.int64)
    seg_end = np.empty(segments, np.int64)
    seg_start[first_segment[filled]] = properties.at[filled]
    seg_start[first_segment[cut_row] + cut_rank + 1] = cut_at + 1
    seg_end[first_segment[cut_row] + cut_rank] = cut_at
    seg_end[(first_segment + segments_per_row - 1)[filled]] = (properties.at + properties.length)[filled]
    seg_row = np.repeat(np.arange(rows), segments_per_row)
    # A pair: the first 0x01 of the segment lies after its first byte and before its last.
    splits = ~cuts
    split_at = position[splits]
    split_row = row[splits]
    cuts_before = np.cumsum(cuts)[splits]  # 0x02s before each 0x01, over all rows
    split_segment = first_segment[split_row] + cuts_before - cuts_before_row[split_row]
    first_split = np.ones(len(split_segment), bool)
    first_split[1:] = split_segment[1:] != split_segment[:-1]
    cut = np.full(segments, -1, np.int64)
    cut[split_segment[first_split]] = split_at[first_split]
    is_pair = (cut > seg_start) & (cut < seg_end - 1)
    pair_row = seg_row[is_pair]
    cut, seg_start, seg_end = cut[is_pair], seg_start[is_pair], seg_end[is_pair]
    names = Spans(seg_start, cut - seg_start)
    values = Spans(cut + 1, seg_end - cut - 1)
    prefix = _prefix_words(data, names.at, names.length)
    repeated = _rows_with_repeated_names(rows, data, pair_row, names, prefix, data[names.at + names.length - 1])
    if len(repeated):
        pair_row, names, values = _dedupe(data, repeated, pair_row, names, values)
        prefix = _prefix_words(data, names.at, names.length)
    pair_ends = np.zeros(rows + 1, np.int64)
    np.cumsum(np.bincount(pair_row, minlength=rows), out=pair_ends[1:])
    return pair_ends, names, values, _named(rows, pair_row, names, prefix)


def _compiled_pairs(data: np.ndarray, properties: Spans) -> tuple[np.ndarray, Spans, Spans, dict[str, np.ndarray]]:
    """:func:`_pairs` by the compiled scan, which finds the pairs and the rows whose names
    may repeat; those rows get the dictionary's rules here, as in :func:`_pairs`."""
    assert _speedups is not None, "called only where the extension is loaded"
    found = _speedups.property_pairs(
        np.ascontiguousarray(data),
        np.ascontiguousarray(properties.at, np.int64),
        np.ascontiguousarray(properties.length, np.int64),
    )
    pair_ends, name_at, name_length, value_at, value_length, keys, tags, uniq_key, repeated = (
        np.frombuffer(column, np.int64) for column in found
    )
    names, values = Spans(name_at, name_length), Spans(value_at, value_length)
    if not len(repeated):
        return pair_ends, names, values, {KEYS: keys, TAGS: tags, UNIQ_KEY: uniq_key}
    rows = len(properties.at)
    pair_row = np.repeat(np.arange(rows), np.diff(pair_ends))
    pair_row, names, values = _dedupe(data, repeated, pair_row, names, values)
    pair_ends = np.zeros(rows + 1, np.int64)
    np.cumsum(np.bincount(pair_row, minlength=rows), out=pair_ends[1:])
    prefix = _prefix_words(data, names.at, names.length)
    return pair_ends, names, values, _named(rows, pair_row, names, prefix)


def _named(rows: int, pair_row: np.ndarray, names: Spans, prefix: np.ndarray) -> dict[str, np.ndarray]:
    """For KEYS, TAGS and UNIQ_KEY, the pair holding each per row (-1 where none does);
    each row names each at most once."""
    named = {}
    for name in (KEYS, TAGS, UNIQ_KEY):
        wanted = name.encode()
        assert len(wanted) <= 8, "compared through the 8-byte prefix"
        holder = np.flatnonzero((names.length == len(wanted)) & (prefix == int.from_bytes(wanted, "big")))
        column = np.full(rows, -1, np.int64)
        column[pair_row[holder]] = holder
        named[name] = column
    return named


def _rows_with_repeated_names(
    rows: int, data: np.ndarray, pair_row: np.ndarray, names: Spans, prefix: np.ndarray, last_byte: np.ndarray
) -> np.ndarray:
    """Rows where two names may be equal: same length, first 8 bytes and last byte (a
    superset of the rows with a repeated name), or more pairs than are compared, or a
    name that is not ASCII among two or more (different bytes that are not UTF-8 decode to
    the same text, as U+FFFD, and the per-record decoder keeps one of them)."""
    fingerprint = prefix ^ (last_byte.astype(np.uint64) << np.uint64(56)) ^ (names.length.astype(np.uint64) << np.uint64(32))
    counts = np.bincount(pair_row, minlength=rows)
    suspects = [np.flatnonzero(counts > _PAIRS_COMPARED_MAX)]
    non_ascii = _non_ascii(data, names, prefix)
    if non_ascii.any():
        suspects.append(pair_row[non_ascii & (counts[pair_row] > 1)])
    for distance in range(1, min(int(counts.max(initial=0)), _PAIRS_COMPARED_MAX + 1)):
        same = (pair_row[distance:] == pair_row[:-distance]) & (fingerprint[distance:] == fingerprint[:-distance])
        if same.any():
            suspects.append(pair_row[distance:][same])
    return np.unique(np.concatenate(suspects))


def _non_ascii(data: np.ndarray, names: Spans, prefix: np.ndarray) -> np.ndarray:
    """Whether each name has a byte above 0x7F: its first 8 bytes from ``prefix``, the
    rest of the longer names read here."""
    found = (prefix & np.uint64(0x8080808080808080)) != 0
    longer = np.flatnonzero(names.length > 8)
    if len(longer):
        rest = names.length[longer] - 8
        starts = np.cumsum(rest) - rest
        where = np.repeat(names.at[longer] + 8 - starts, rest) + np.arange(int(rest.sum()), dtype=np.int64)
        found[longer] |= np.logical_or.reduceat(data[where] >= 0x80, starts)
    return found


def _dedupe(
    data: np.ndarray, repeated: np.ndarray, pair_row: np.ndarray, names: Spans, values: Spans
) -> tuple[np.ndarray, Spans, Spans]:
    """The pairs of ``repeated`` rows with the dictionary semantics of the per-record
    decoder: names decoded as it decodes them, the first place and the last value."""
    ends = np.searchsorted(pair_row, np.concatenate((repeated, repeated + 1)))
    low, high = ends[: len(repeated)], ends[len(repeated) :]
    rows, name_at, name_length, value_at, value_length = [], [], [], [], []
    for row, first, last in zip(repeated.tolist(), low.tolist(), high.tolist()):
        kept: dict[str, tuple[int, int]] = {}
        for pair in range(first, last):
            name = decode_text(data, int(names.at[pair]), int(names.length[pair]))
            kept[name] = (kept[name][0] if name in kept else pair, pair)
        for name_pair, value_pair in kept.values():
            rows.append(row)
            name_at.append(names.at[name_pair])
            name_length.append(names.length[name_pair])
            value_at.append(values.at[value_pair])
            value_length.append(values.length[value_pair])
    others = ~np.isin(pair_row, repeated)
    merged_row = np.concatenate((pair_row[others], np.asarray(rows, np.int64)))
    order = np.argsort(merged_row, kind="stable")

    def merged(column: np.ndarray, extra: list[int]) -> np.ndarray:
        return np.concatenate((column[others], np.asarray(extra, np.int64)))[order]

    return (
        merged_row[order],
        Spans(merged(names.at, name_at), merged(names.length, name_length)),
        Spans(merged(values.at, value_at), merged(values.length, value_length)),
    )
