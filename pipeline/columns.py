"""The record schema of the ``rmqstore`` data source, and Arrow batches built from records
decoded in bulk (``codec.columnar``).

Column names are those of Apache's commit log dump (``rmqstore dump commitlog``), with the
same value formats: ``msgId`` is the offsetMsgId, hosts are ``getHostAddress():port``.
``keys``, ``tags`` and ``uniqKey`` repeat the KEYS, TAGS and UNIQ_KEY properties (null when
absent); ``properties`` holds every property as stored; ``store`` is the store directory
the record was read from.

Arrays are built from buffers, never from a Python object per record, through pyarrow's
public API. ``columnar.decode`` decodes a batch of walked records into numpy columns and
spans of the log's bytes (its loops are the codecs' compiled ones: the walk, the CRCs, the
properties' split); numbers become arrays directly; body, topic and property texts are
copied out by one ``take`` over an array whose offsets alternate between the spans and
the gaps of the decoded bytes; hosts by a ``take`` of their few distinct texts. Text that
is not valid UTF-8 (which Arrow refuses) is decoded per row with the per-record decoder's
rules, for that batch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.columnar import Hosts, RecordColumns, Spans, decode_text

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


def arrow_batch(decoded: RecordColumns, store: str, schema: pa.Schema) -> pa.RecordBatch:
    """The records ``columnar.decode`` decoded as one batch of ``schema`` (:func:`arrow_schema`)."""
    import pyarrow as pa

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
