"""The record schema of the ``rmqstore`` data source, and Arrow batches built from records.

Column names are those of Apache's commit log dump (``rmqstore dump commitlog``), with the
same value formats: ``msgId`` is the offsetMsgId, hosts are ``getHostAddress():port``.
``keys``, ``tags`` and ``uniqKey`` repeat the KEYS, TAGS and UNIQ_KEY properties (null when
absent); ``properties`` holds every property as stored; ``store`` is the store directory
the record was read from.

Batches are built column by column: one pass over the decoded records appends plain Python
values to one list per column, then each list becomes an Arrow array in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import offset_msg_id
from rmqstore.common.codec.record import Record

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

BATCH_ROWS_MAX = 32_768
BATCH_BYTES_MAX = 32 * 1024 * 1024
_HOST_CACHE_MAX = 65_536


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


class _HostText:
    """``SocketAddress.java_text`` memoized: a store has few distinct hosts, and formatting
    one costs more than decoding the rest of the record."""

    def __init__(self) -> None:
        self._known: dict[tuple[bytes, int], str] = {}

    def __call__(self, address: SocketAddress) -> str:
        key = (address.ip, address.port)
        text = self._known.get(key)
        if text is None:
            if len(self._known) >= _HOST_CACHE_MAX:
                self._known.clear()
            text = self._known[key] = address.java_text()
        return text


def record_batches(
    records: Iterable[Record],
    store: str,
    schema: pa.Schema,
    *,
    accept: Callable[[Record], bool] | None = None,
    batch_rows: int = BATCH_ROWS_MAX,
    batch_bytes: int = BATCH_BYTES_MAX,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of ``schema`` (:func:`arrow_schema`) holding the records ``accept``
    keeps, at most ``batch_rows`` rows or about ``batch_bytes`` of bodies each."""
    import pyarrow as pa

    host_text = _HostText()
    records = iter(records)
    while True:
        offset: list[int] = []
        size: list[int] = []
        msg_id: list[str] = []
        topic: list[str] = []
        queue_id: list[int] = []
        queue_offset: list[int] = []
        sys_flag: list[int] = []
        flag: list[int] = []
        body_crc: list[int] = []
        born_ts: list[int] = []
        store_ts: list[int] = []
        born_host: list[str] = []
        store_host: list[str] = []
        reconsume: list[int] = []
        prepared: list[int] = []
        keys: list[str | None] = []
        tags: list[str | None] = []
        uniq: list[str | None] = []
        property_ends: list[int] = [0]
        property_names: list[str] = []
        property_values: list[str] = []
        body: list[bytes] = []
        body_total = 0
        for record in records:
            if accept is not None and not accept(record):
                continue
            properties = record.properties
            offset.append(record.commitlog_offset)
            size.append(record.size)
            msg_id.append(offset_msg_id(record.store_host, record.commitlog_offset))
            topic.append(record.topic)
            queue_id.append(record.queue_id)
            queue_offset.append(record.queue_offset)
            sys_flag.append(record.sys_flag)
            flag.append(record.flag)
            body_crc.append(record.body_crc)
            born_ts.append(record.born_timestamp_ms)
            store_ts.append(record.store_timestamp_ms)
            born_host.append(host_text(record.born_host))
            store_host.append(host_text(record.store_host))
            reconsume.append(record.reconsume_times)
            prepared.append(record.prepared_transaction_offset)
            keys.append(properties.get(props.KEYS))
            tags.append(properties.get(props.TAGS))
            uniq.append(properties.get(props.UNIQ_KEY))
            property_names.extend(properties)
            property_values.extend(properties.values())
            property_ends.append(len(property_names))
            body.append(record.body)
            body_total += len(record.body)
            if len(offset) >= batch_rows or body_total >= batch_bytes:
                break
        if not offset:
            return
        columns = {
            "commitLogOffset": offset,
            "size": size,
            "msgId": msg_id,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": queue_offset,
            "sysFlag": sys_flag,
            "flag": flag,
            "bodyCRC": body_crc,
            "bornTimestamp": born_ts,
            "storeTimestamp": store_ts,
            "bornHost": born_host,
            "storeHost": store_host,
            "reconsumeTimes": reconsume,
            "preparedTransactionOffset": prepared,
            "keys": keys,
            "tags": tags,
            "uniqKey": uniq,
            "body": body,
        }
        arrays = []
        for column in schema:
            if column.name == "properties":
                arrays.append(
                    pa.MapArray.from_arrays(
                        pa.array(property_ends, pa.int32()),
                        pa.array(property_names, pa.string()),
                        pa.array(property_values, pa.string()),
                        type=column.type,
                    )
                )
            elif column.name == "store":
                arrays.append(pa.array([store] * len(offset), column.type))
            else:
                arrays.append(pa.array(columns[column.name], column.type))
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
        if len(offset) < batch_rows and body_total < batch_bytes:
            return
