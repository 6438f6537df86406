"""The record schema of the ``rmqstore`` data source, and Arrow batches built from records
decoded in bulk (``codec.columnar``).

Column names are those of Apache's commit log dump (``rmqstore dump commitlog``), with the
same value formats: ``msgId`` is the offsetMsgId, hosts are ``getHostAddress():port``.
``keys``, ``tags`` and ``uniqKey`` repeat the KEYS, TAGS and UNIQ_KEY properties (null when
absent); ``properties`` holds every property as stored; ``store`` is the store directory
the record was read from.

Arrays are built from buffers, never from a Python object per record. With the compiled
codecs, :func:`decode` reads the walked records straight into Arrow's buffers in one pass
(``_speedups.arrow_columns``: every check of ``columnar.decode``, every value of
:func:`arrow_batch`). A batch holding what that pass leaves to the general path (a text
that is not UTF-8, a property name given twice, more than 64 properties) is
decoded by ``columnar.decode``, and its arrays are built from numpy: numbers directly;
body, topic and property texts by one ``take`` over an array whose offsets alternate
between the spans and the gaps of the decoded bytes; hosts by a ``take`` of their few
distinct texts. Text that is not valid UTF-8 (which Arrow refuses) is decoded per row
with the per-record decoder's rules, for that batch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rmqstore.common.codec import columnar
from rmqstore.common.codec import properties as props
from rmqstore.common.codec.columnar import Hosts, RecordColumns, Spans, decode_text
from rmqstore.common.codec.speedups import _speedups

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

# (name, Spark SQL type, nullable): the one declaration of the schema.
FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("commitLogOffset", "bigint", False),
    ("size", "int", False),
    ("msgId", "string", False),
    ("topic", "string", False),
    ("queueId", "int", False),
    ("queueOffset", "bigint", False),
    ("sysFlag", "int", False),
    ("flag", "int", False),
    ("bodyCRC", "int", False),
    ("bornTimestamp", "bigint", False),
    ("storeTimestamp", "bigint", False),
    ("bornHost", "string", False),
    ("storeHost", "string", False),
    ("reconsumeTimes", "int", False),
    ("preparedTransactionOffset", "bigint", False),
    ("keys", "string", True),
    ("tags", "string", True),
    ("uniqKey", "string", True),
    ("properties", "map<string,string>", False),
    ("body", "binary", False),
    ("store", "string", False),
)
COLUMN_NAMES = tuple(name for name, _, _ in FIELDS)
NON_NULL_COLUMNS = frozenset(name for name, _, nullable in FIELDS if not nullable)


def spark_schema() -> StructType:
    from pyspark.sql import types as t

    kinds = {
        "bigint": t.LongType(),
        "int": t.IntegerType(),
        "string": t.StringType(),
        "binary": t.BinaryType(),
        "map<string,string>": t.MapType(t.StringType(), t.StringType()),
    }
    return t.StructType([t.StructField(name, kinds[kind], nullable) for name, kind, nullable in FIELDS])


def arrow_schema() -> pa.Schema:
    """The Arrow schema Spark expects for :func:`spark_schema` (it compares them)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema(), timezone="UTC")


# The numeric columns of ``_speedups.arrow_columns``, in its order.
_FIXED = (
    "commitLogOffset",
    "size",
    "queueId",
    "queueOffset",
    "sysFlag",
    "flag",
    "bodyCRC",
    "bornTimestamp",
    "storeTimestamp",
    "reconsumeTimes",
    "preparedTransactionOffset",
)


@dataclass(frozen=True, slots=True)
class CompiledColumns:
    """Records as ``_speedups.arrow_columns`` read them: Arrow buffers, ``rows`` long,
    ending before the record ``bad`` (an index into the starts) if one failed."""

    rows: int
    bad: int | None
    fixed: dict[str, pa.Buffer]
    msg_id: tuple[pa.Buffer, pa.Buffer]  # offsets, chars
    topic: tuple[pa.Buffer, pa.Buffer]
    born_host: tuple[pa.Buffer, pa.Buffer]
    store_host: tuple[pa.Buffer, pa.Buffer]
    body: tuple[pa.Buffer, pa.Buffer]
    properties: tuple[pa.Buffer, tuple[pa.Buffer, pa.Buffer], tuple[pa.Buffer, pa.Buffer]]
    named: tuple[tuple[pa.Buffer, pa.Buffer, pa.Buffer, int], ...]  # KEYS, TAGS, UNIQ_KEY

    @property
    def commitlog_offset(self) -> np.ndarray:
        return np.frombuffer(self.fixed["commitLogOffset"], np.int64, self.rows)

    @property
    def size(self) -> np.ndarray:
        return np.frombuffer(self.fixed["size"], np.int32, self.rows)


def _allocate(size: int) -> pa.Buffer:
    """A buffer from Arrow's memory pool, which keeps freed memory for the next batch:
    fresh memory faults in page by page, which took half the compiled pass's time."""
    import pyarrow as pa

    return pa.allocate_buffer(size)


def decode(
    buf: object, starts: np.ndarray, *, base_offset: int, check_crc: bool = True
) -> CompiledColumns | RecordColumns:
    """``columnar.decode``'s records, as :func:`arrow_batch` takes them: read by the
    compiled pass where it can, by ``columnar.decode`` otherwise (same rows, same ``bad``)."""
    if _speedups is not None:
        found = _speedups.arrow_columns(buf, np.ascontiguousarray(starts, np.int64), base_offset, check_crc, _allocate)
        if found is not None:
            rows, bad, fixed, *texts = found
            return CompiledColumns(rows, None if bad < 0 else bad, dict(zip(_FIXED, fixed)), *texts)
    return columnar.decode(buf, starts, base_offset=base_offset, check_crc=check_crc)  # type: ignore[arg-type]


def arrow_batch(decoded: CompiledColumns | RecordColumns, store: str, schema: pa.Schema) -> pa.RecordBatch:
    """The decoded records as one batch of ``schema`` (:func:`arrow_schema`)."""
    import pyarrow as pa

    if isinstance(decoded, CompiledColumns):
        return _compiled_batch(decoded, store, schema)
    rows = decoded.rows
    data = pa.py_buffer(decoded.data)
    try:
        texts = _Texts(
            _spans(data, decoded.topic, pa.string()),
            _spans(data, decoded.names, pa.string()),
            _spans(data, decoded.values, pa.string()),
            decoded.pair_ends,
            decoded.keys,
            decoded.tags,
            decoded.uniq_key,
        )
    except pa.ArrowInvalid:  # not UTF-8: Arrow refuses it, the per-record decoder replaces
        texts = _texts_per_row(decoded)
    columns = {
        "commitLogOffset": decoded.commitlog_offset,
        "size": decoded.size,
        "msgId": pa.StringArray.from_buffers(
            rows, pa.py_buffer(decoded.msg_id_ends.astype(np.int32)), pa.py_buffer(decoded.msg_id_chars)
        ),
        "topic": texts.topic,
        "queueId": decoded.queue_id,
        "queueOffset": decoded.queue_offset,
        "sysFlag": decoded.sys_flag,
        "flag": decoded.flag,
        "bodyCRC": decoded.body_crc,
        "bornTimestamp": decoded.born_timestamp_ms,
        "storeTimestamp": decoded.store_timestamp_ms,
        "bornHost": _hosts(decoded.born_host),
        "storeHost": _hosts(decoded.store_host),
        "reconsumeTimes": decoded.reconsume_times,
        "preparedTransactionOffset": decoded.prepared_transaction_offset,
        "keys": _property(texts.values, texts.keys),
        "tags": _property(texts.values, texts.tags),
        "uniqKey": _property(texts.values, texts.uniq_key),
        "body": _spans(data, decoded.body, pa.binary()),
        "store": _repeated(store, rows),
    }
    arrays = []
    for column in schema:
        if column.name == "properties":
            pair_ends = pa.array(texts.pair_ends.astype(np.int32))
            arrays.append(pa.MapArray.from_arrays(pair_ends, texts.names, texts.values, type=column.type))
        else:
            arrays.append(pa.array(columns[column.name], column.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _compiled_batch(decoded: CompiledColumns, store: str, schema: pa.Schema) -> pa.RecordBatch:
    import pyarrow as pa

    rows = decoded.rows

    def texts(
        kind: pa.DataType, count: int, offsets: pa.Buffer, chars: pa.Buffer, validity: pa.Buffer | None = None, nulls: int = 0
    ) -> pa.Array:
        return pa.Array.from_buffers(kind, count, [validity if nulls else None, offsets, chars], null_count=nulls)

    pair_ends, names, values = decoded.properties
    pairs = int(np.frombuffer(pair_ends, np.int32, rows + 1)[rows])
    keys_of, tags_of, uniq_of = (
        texts(pa.string(), rows, offsets, chars, validity, nulls) for validity, offsets, chars, nulls in decoded.named
    )
    columns = {
        "msgId": texts(pa.string(), rows, *decoded.msg_id),
        "topic": texts(pa.string(), rows, *decoded.topic),
        "bornHost": texts(pa.string(), rows, *decoded.born_host),
        "storeHost": texts(pa.string(), rows, *decoded.store_host),
        "keys": keys_of,
        "tags": tags_of,
        "uniqKey": uniq_of,
        "body": texts(pa.binary(), rows, *decoded.body),
        "store": _repeated(store, rows),
    }
    arrays = []
    for column in schema:
        if column.name in decoded.fixed:
            arrays.append(pa.Array.from_buffers(column.type, rows, [None, decoded.fixed[column.name]]))
        elif column.name == "properties":
            offsets = pa.Array.from_buffers(pa.int32(), rows + 1, [None, pair_ends])
            arrays.append(
                pa.MapArray.from_arrays(
                    offsets, texts(pa.string(), pairs, *names), texts(pa.string(), pairs, *values), type=column.type
                )
            )
        else:
            arrays.append(columns[column.name])
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@dataclass(frozen=True, slots=True)
class _Texts:
    """The text columns of a batch: topics, property names and values (all pairs), and
    per row its pairs (as ends) and the pair holding KEYS, TAGS, UNIQ_KEY (or -1)."""

    topic: pa.Array
    names: pa.Array
    values: pa.Array
    pair_ends: np.ndarray
    keys: np.ndarray
    tags: np.ndarray
    uniq_key: np.ndarray


def _spans(data: pa.Buffer, spans: Spans, kind: pa.DataType) -> pa.Array:
    """The spans of ``data`` as one contiguous array: an array over ``data`` whose offsets
    alternate span starts and ends holds span i at 2i (and the gaps between at the odd
    places), and a ``take`` of the even places copies the spans out in C++."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count = len(spans.at)
    if not count:
        return pa.array([], kind)
    bounds = np.empty(2 * count, np.int32)
    bounds[0::2] = spans.at
    bounds[1::2] = spans.at + spans.length
    gapped = pa.BinaryArray.from_buffers(pa.binary(), 2 * count - 1, [None, pa.py_buffer(bounds), data])
    taken = pc.take(gapped, pa.array(np.arange(0, 2 * count, 2, dtype=np.int32)))
    return taken if kind == pa.binary() else taken.cast(kind)


def _texts_per_row(decoded: RecordColumns) -> _Texts:
    """Topic and properties decoded record by record (``properties.decode_properties``):
    the exact rules for bytes that are not UTF-8."""
    import pyarrow as pa

    data = decoded.data
    names: list[str] = []
    values: list[str] = []
    ends = [0]
    keys, tags, uniq = (np.full(decoded.rows, -1, np.int64) for _ in range(3))
    for row in range(decoded.rows):
        at, length = int(decoded.properties.at[row]), int(decoded.properties.length[row])
        found = props.decode_properties(data[at : at + length].tobytes())
        for name, column in ((props.KEYS, keys), (props.TAGS, tags), (props.UNIQ_KEY, uniq)):
            if name in found:
                column[row] = len(names) + list(found).index(name)
        names.extend(found)
        values.extend(found.values())
        ends.append(len(names))
    topic = [decode_text(data, int(at), int(length)) for at, length in zip(decoded.topic.at, decoded.topic.length)]
    return _Texts(
        pa.array(topic, pa.string()),
        pa.array(names, pa.string()),
        pa.array(values, pa.string()),
        np.asarray(ends, np.int64),
        keys,
        tags,
        uniq,
    )


def _property(values: pa.Array, pair: np.ndarray) -> pa.Array:
    """Per row the value of the pair ``pair`` names, null where it is -1."""
    import pyarrow as pa

    return values.take(pa.array(pair, mask=pair < 0))


def _hosts(hosts: Hosts) -> pa.Array:
    import pyarrow as pa

    return pa.array(hosts.texts, pa.string()).take(pa.array(hosts.index))


def _repeated(text: str, rows: int) -> pa.Array:
    import pyarrow as pa

    encoded = text.encode("utf-8")
    ends = np.arange(0, (rows + 1) * len(encoded), len(encoded), dtype=np.int32)[: rows + 1]
    return pa.StringArray.from_buffers(rows, pa.py_buffer(ends), pa.py_buffer(encoded * rows))
