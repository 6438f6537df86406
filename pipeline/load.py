"""``rmqstore pipeline load``: a dataset of messages sent to a writer, idempotent on UNIQ_KEY.

Input: Parquet in the export layout (``pipeline.export``; only ``topic`` and ``body`` are
required), or JSON Lines in the ``rmqstore send --file`` format. A message is identified by
(topic, UNIQ_KEY); one without a UNIQ_KEY gets one derived from its content (the first 16
bytes of a SHA-256 over it, in hex), so the same input always has the same keys.

The writer has no "do you hold this?" call, so the loader asks the store instead, in one of
two ways:

* **store** (default): the writer's store directory, read-only — the path the writer's
  Status reports, or ``--target-store`` when it is mounted elsewhere. The loader asks the
  writer to flush, reads the (topic, UNIQ_KEY) pairs the store holds with the rmqstore data
  source, and sends only the rest (an anti-join). A Spark task that is retried after a
  failure checks each of its messages first with a read-only ``StoreView`` lookup, so
  batches a failed attempt got stored are not sent again;
* **query** (``--query-endpoint``): every message is checked with the query node's
  ``QueryByUniqKey`` just before it is sent (slower: one lookup per message).

So a run that fails part-way can simply be run again: what was stored is skipped. Within
one input, a (topic, UNIQ_KEY) that repeats is sent once (its first occurrence). What this
cannot prevent: two loads of overlapping data running at the same time.

Messages are sent from the executors through ``SendStream`` in batches (default 1,000
messages or 8 MiB), each as the request's columns. Queue ids are kept by default (topics the writer lacks are created
with enough queues); ``--queue-ids auto`` lets the writer choose. Properties the writer
sets itself or refuses (KEYS, TAGS, UNIQ_KEY, DELAY, REAL_TOPIC, CLUSTER, ...) are not
carried; KEYS are re-joined by single spaces. Records the writer cannot store — in topics
producers may not send to (SCHEDULE_TOPIC_XXXX, ...) or with compressed bodies (the
writer has no compression flag) — stop the load unless ``--skip-unsendable`` is given.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from rmqstore.client.columns import batch_request
from rmqstore.client.jsonl import message_from_json
from rmqstore.common import errors
from rmqstore.common.codec import properties as props
from rmqstore.common.codec import sysflag
from rmqstore.common.codec.topic import NOT_ALLOWED_SEND_TOPICS
from rmqstore.common.errors import InvalidArgument, StoreError
from rmqstore.common.files.directories import existing_store
from rmqstore.common.files.store import StorePaths, StoreSizes, resolve_sizes
from rmqstore.pipeline.export import read_store
from rmqstore.pipeline.progress import Progress
from rmqstore.query.view import StoreView
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc, writer_pb2, writer_pb2_grpc
from rmqstore.writer.validate import RESERVED_PROPERTIES, SCHEDULING_PROPERTIES

BATCH_MESSAGES_DEFAULT = 1000
BATCH_BYTES_MAX = 8 * 1024 * 1024
GRPC_MESSAGE_BYTES_MAX = 64 * 1024 * 1024  # the nodes' own limit (service/server.py)
STATUS_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 600.0
UNIQ_KEY_HEX_CHARS = 32
MESSAGE_SCHEMA = (
    "topic string, queueId int, body binary, keys string, tags string, properties map<string,string>, "
    "uniqKey string, flag int, bornTimestamp bigint, bornHost string, sysFlag int, inputOrder bigint"
)
SEND_RESULT_SCHEMA = "sent bigint, alreadyStored bigint"


class NodeUnreachable(StoreError):
    """The writer or the query node does not answer."""

    retriable = True


@dataclass(frozen=True, slots=True)
class LoadSummary:
    input_messages: int
    unsendable_skipped: int
    repeated_in_input: int
    already_stored: int
    sent: int
    skipped_at_send: int
    dedupe: str


def _grpc_error(error: Any, endpoint: str, what: str) -> StoreError:
    """A gRPC failure as the store error it stands for, in one line."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    if code is None or code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        name = code.name if code is not None else "ERROR"
        return NodeUnreachable(f"{what} at {endpoint} is unreachable ({name}: {details})")
    kinds: dict[grpc.StatusCode, type[StoreError]] = {
        grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
        grpc.StatusCode.NOT_FOUND: errors.NotFound,
        grpc.StatusCode.RESOURCE_EXHAUSTED: errors.StoreFull,
        grpc.StatusCode.DATA_LOSS: errors.Corruption,
    }
    return kinds.get(code, StoreError)(f"{what} at {endpoint} refused: {code.name}: {details}")


def _channel(endpoint: str, options: list[tuple[str, int]] | None = None) -> grpc.Channel:
    """A plaintext channel to a node, its calls signed when the environment holds an
    access key and a secret key (RMQSTORE_ACCESS_KEY, RMQSTORE_SECRET_KEY; docs/security.md):
    a local Spark's executors inherit the driver's environment."""
    from rmqstore.client.signing import signing_channel

    channel = grpc.insecure_channel(endpoint, options=options)
    access_key, secret_key = os.environ.get("RMQSTORE_ACCESS_KEY"), os.environ.get("RMQSTORE_SECRET_KEY")
    if access_key and secret_key:
        return signing_channel(channel, access_key, secret_key)
    return channel


def writer_status(endpoint: str) -> Any:
    with _channel(endpoint) as channel:
        try:
            return writer_pb2_grpc.WriterServiceStub(channel).Status(writer_pb2.StatusRequest(), timeout=STATUS_TIMEOUT_S)  # type: ignore[no-untyped-call]  # generated, untyped
        except grpc.RpcError as error:
            raise _grpc_error(error, endpoint, "the writer") from None


def _writer_call(endpoint: str, method: str, request: Any) -> Any:
    with _channel(endpoint) as channel:
        try:
            return getattr(writer_pb2_grpc.WriterServiceStub(channel), method)(request, timeout=SEND_TIMEOUT_S)  # type: ignore[no-untyped-call]  # generated, untyped
        except grpc.RpcError as error:
            raise _grpc_error(error, endpoint, "the writer") from None


def _check_query_node(endpoint: str) -> None:
    with _channel(endpoint) as channel:
        try:
            query_pb2_grpc.QueryServiceStub(channel).Stats(query_pb2.StatsRequest(), timeout=STATUS_TIMEOUT_S)  # type: ignore[no-untyped-call]  # generated, untyped
        except grpc.RpcError as error:
            raise _grpc_error(error, endpoint, "the query node") from None


# Reading the input


def _derived_uniq_key() -> Any:
    """SQL for a UNIQ_KEY derived from a message's content: the same input, the same key."""
    from pyspark.sql import functions as F

    content = F.to_json(
        F.struct(
            "topic",
            F.base64("body").alias("body"),
            "keys",
            "tags",
            F.coalesce(F.col("properties"), F.create_map()).alias("properties"),
            "flag",
            "bornTimestamp",
            "bornHost",
        )
    )
    return F.upper(F.substring(F.sha2(content, 256), 1, UNIQ_KEY_HEX_CHARS))


def read_parquet(spark: Any, path: str) -> Any:
    from pyspark.sql import functions as F

    frame = spark.read.parquet(path)
    present = set(frame.columns)
    missing = {"topic", "body"} - present
    if missing:
        raise InvalidArgument(f"{path} lacks column(s) {sorted(missing)}: a message needs at least topic and body")
    defaults = {
        "queueId": "int",
        "keys": "string",
        "tags": "string",
        "properties": "map<string,string>",
        "uniqKey": "string",
        "flag": "int",
        "bornTimestamp": "bigint",
        "bornHost": "string",
        "sysFlag": "int",
    }
    columns = [F.col("topic").cast("string"), F.col("body").cast("binary")]
    for name, kind in defaults.items():
        columns.append((F.col(name) if name in present else F.lit(None)).cast(kind).alias(name))
    order = F.col("commitLogOffset") if "commitLogOffset" in present else F.monotonically_increasing_id()
    return frame.select(*columns, order.cast("bigint").alias("inputOrder"))


def read_json(spark: Any, path: str) -> Any:
    """JSON Lines as ``rmqstore send --file`` takes them, parsed by the send tool's own
    parser; errors name the line (counted across the input's files, in order)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    schema = to_arrow_schema(_parse_datatype_string(MESSAGE_SCHEMA), timezone="UTC")  # type: ignore[arg-type]

    def parse(batches: Iterator[Any]) -> Iterator[Any]:
        yield from _parse_json_batches(batches, schema)

    numbered = spark.sparkContext.textFile(path).zipWithIndex().map(lambda pair: (pair[0], pair[1] + 1))
    lines = spark.createDataFrame(numbered, "value string, inputOrder bigint")
    return lines.where(F.trim("value") != "").mapInArrow(parse, MESSAGE_SCHEMA)


def _parse_json_batches(batches: Iterator[Any], schema: Any) -> Iterator[Any]:
    import pyarrow as pa

    for batch in batches:
        rows: dict[str, list[Any]] = {name: [] for name in schema.names}
        for text, order in zip(batch.column("value").to_pylist(), batch.column("inputOrder").to_pylist()):
            where = f"line {order}"
            try:
                document = json.loads(text)
            except json.JSONDecodeError as error:
                # Python counts lines and columns in the one line it was given: its column.
                raise InvalidArgument(f"{where}, column {error.colno}: not JSON: {error.msg}") from None
            message = message_from_json(order, document)
            rows["topic"].append(message.topic)
            rows["queueId"].append(message.queue_id if message.HasField("queue_id") else None)
            rows["body"].append(message.body)
            rows["keys"].append(props.KEY_SEPARATOR.join(message.keys) or None)
            rows["tags"].append(message.tags or None)
            rows["properties"].append(list(message.properties.items()))
            rows["uniqKey"].append(message.uniq_key or None)
            rows["flag"].append(message.flag)
            rows["bornTimestamp"].append(message.born_timestamp_ms)
            rows["bornHost"].append(message.born_host or None)
            rows["sysFlag"].append(0)
            rows["inputOrder"].append(order)
        yield pa.RecordBatch.from_arrays([pa.array(rows[name], field.type) for name, field in zip(schema.names, schema)], schema=schema)


# Sending


def to_message(row: dict[str, Any], keep_queue_id: bool) -> Any:
    """A stored (or exported) message as the writer takes it."""
    pairs = row.get("properties") or []
    items = pairs.items() if isinstance(pairs, dict) else pairs
    message = messages_pb2.Message(
        topic=row["topic"],
        body=row.get("body") or b"",
        keys=props.split_keys(row.get("keys")),
        tags=row.get("tags") or "",
        properties={name: value for name, value in items if value and name not in RESERVED_PROPERTIES and name not in SCHEDULING_PROPERTIES and name != props.TRAN_MSG},
        uniq_key=row["uniqKey"],
        flag=row.get("flag") or 0,
        born_timestamp_ms=row.get("bornTimestamp") or 0,
        born_host=row.get("bornHost") or "",
    )
    if keep_queue_id and row.get("queueId") is not None:
        message.queue_id = row["queueId"]
    return message


class StoreChecker:
    """Which messages a store already holds, by read-only lookups (task retries)."""

    def __init__(self, root: str, sizes: StoreSizes | None = None):
        self.view = StoreView(root, sizes)

    def stored(self, messages: list[Any]) -> list[bool]:
        return [bool(self.view.by_uniq_key(m.topic, m.uniq_key)) for m in messages]

    def close(self) -> None:
        self.view.close()


class QueryChecker:
    """Which messages a query node already finds by UNIQ_KEY."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.channel = _channel(endpoint)
        self.stub = query_pb2_grpc.QueryServiceStub(self.channel)  # type: ignore[no-untyped-call]  # generated, untyped

    def stored(self, messages: list[Any]) -> list[bool]:
        calls = [
            self.stub.QueryByUniqKey.future(query_pb2.QueryByUniqKeyRequest(topic=m.topic, uniq_key=m.uniq_key), timeout=SEND_TIMEOUT_S)
            for m in messages
        ]
        try:
            return [bool(call.result().messages) for call in calls]
        except grpc.RpcError as error:
            raise _grpc_error(error, self.endpoint, "the query node") from None

    def close(self) -> None:
        self.channel.close()


def send_rows(
    rows: Iterator[dict[str, Any]],
    endpoint: str,
    *,
    keep_queue_ids: bool,
    checker: Any | None,
    batch_messages: int = BATCH_MESSAGES_DEFAULT,
) -> tuple[int, int]:
    """Send ``rows`` in order, in batches, skipping what ``checker`` says is stored.
    Returns (sent, already stored)."""
    skipped = 0
    acked = 0

    def unheld(batch: list[Any]) -> Iterator[Any]:
        nonlocal skipped
        if checker is not None and batch:
            kept = [message for message, held in zip(batch, checker.stored(batch)) if not held]
            skipped += len(batch) - len(kept)
            batch = kept
        if batch:
            yield batch_request(batch)

    def batches() -> Iterator[Any]:
        pending: list[Any] = []
        size = 0
        for row in rows:
            message = to_message(row, keep_queue_ids)
            pending.append(message)
            size += len(message.body) + 256
            if len(pending) >= batch_messages or size >= BATCH_BYTES_MAX:
                yield from unheld(pending)
                pending, size = [], 0
        yield from unheld(pending)

    limits = [("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX), ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX)]
    with _channel(endpoint, options=limits) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, untyped
        try:
            for response in stub.SendStream(batches(), timeout=SEND_TIMEOUT_S):
                acked += len(response.results)
        except grpc.RpcError as error:
            raise _grpc_error(error, endpoint, "the writer") from None
    return acked, skipped


# The job


def _dedupe_mode(endpoint: str, status: Any, target_store: str | None, query_endpoint: str | None) -> tuple[str, str | None]:
    if query_endpoint:
        _check_query_node(query_endpoint)
        return "query", None
    if target_store:
        existing_store(target_store, "--target-store")
    root = target_store or status.store
    if not root or not os.path.isdir(root):
        raise InvalidArgument(
            f"cannot tell which messages the writer at {endpoint} already holds: its store {root or '(unknown)'} "
            "is not readable here; pass --target-store DIR (the writer's store as mounted here) or "
            "--query-endpoint HOST:PORT"
        )
    return "store", root


def _ensure_topics(endpoint: str, needed: dict[str, int]) -> None:
    """Create the topics the data needs with enough queues for its queue ids."""

    existing = {topic.name: topic.queue_count for topic in _writer_call(endpoint, "ListTopics", writer_pb2.ListTopicsRequest()).topics}
    for topic, count in sorted(needed.items()):
        have = existing.get(topic)
        if have is None:
            _writer_call(endpoint, "CreateTopic", writer_pb2.CreateTopicRequest(name=topic, queue_count=count))
        elif have < count:
            raise InvalidArgument(
                f"topic {topic} has {have} queues on the writer, but the data uses queue ids up to {count - 1}; "
                "create it with more queues, or load with --queue-ids auto"
            )


def run(
    spark: Any,
    input_path: str,
    endpoint: str,
    *,
    input_format: str = "parquet",
    target_store: str | None = None,
    query_endpoint: str | None = None,
    queue_ids: str = "keep",
    skip_unsendable: bool = False,
    batch_messages: int = BATCH_MESSAGES_DEFAULT,
    index_slots: int | None = None,
    index_entries: int | None = None,
    progress: Progress | None = None,
) -> LoadSummary:
    """``index_slots``/``index_entries``: the target store's index geometry (RocketMQ's
    default unless given), for the lookups of retried tasks."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F


    progress = progress or Progress(spark, enabled=False)
    if not os.path.exists(input_path):
        raise errors.NotFound(f"{input_path}: no such input")
    if input_format not in ("parquet", "json"):
        raise InvalidArgument(f"--format must be parquet or json, got {input_format}")
    if queue_ids not in ("keep", "auto"):
        raise InvalidArgument(f"--queue-ids must be keep or auto, got {queue_ids}")
    if not 1 <= batch_messages <= 10_000:
        raise InvalidArgument(f"--batch-messages must be in [1, 10000], got {batch_messages}")
    status = writer_status(endpoint)
    mode, root = _dedupe_mode(endpoint, status, target_store, query_endpoint)
    keep = queue_ids == "keep"
    frame = read_parquet(spark, input_path) if input_format == "parquet" else read_json(spark, input_path)
    frame = frame.withColumn("uniqKey", F.coalesce(F.expr("nullif(uniqKey, '')"), _derived_uniq_key()))
    unsendable = F.col("topic").isin(sorted(NOT_ALLOWED_SEND_TOPICS)) | (
        (F.coalesce(F.col("sysFlag"), F.lit(0)).bitwiseAND(sysflag.COMPRESSED)) != 0
    )
    frame = frame.withColumn("unsendable", unsendable).persist(StorageLevel.MEMORY_AND_DISK)
    cached = [frame]
    try:
        with progress.phase(f"reading {input_path}"):
            totals = frame.agg(F.count(F.lit(1)).alias("all"), F.sum(F.col("unsendable").cast("int")).alias("bad")).first()
        input_messages, bad = totals["all"], totals["bad"] or 0
        if bad and not skip_unsendable:
            raise InvalidArgument(
                f"{bad} of {input_messages} messages cannot be stored by a writer (a topic producers may not send "
                "to, or a compressed body); pass --skip-unsendable to load the others"
            )
        order = Window.partitionBy("topic", "uniqKey").orderBy("inputOrder")
        unique = (
            frame.where(~F.col("unsendable"))
            .withColumn("occurrence", F.row_number().over(order))
            .where(F.col("occurrence") == 1)
            .drop("occurrence", "unsendable")
        )
        todo = unique
        if mode == "store":
            assert root is not None
            _writer_call(endpoint, "Flush", writer_pb2.FlushRequest())
            if os.path.isdir(StorePaths(root).commitlog) and os.listdir(StorePaths(root).commitlog):
                held = read_store(spark, [root]).where(F.col("uniqKey").isNotNull()).select("topic", "uniqKey").distinct()
                todo = unique.join(held, ["topic", "uniqKey"], "left_anti")
        todo = todo.persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(todo)
        with progress.phase("finding what the writer already holds"):
            unique_count = unique.count()
            todo_count = todo.count()
        if keep:
            with_ids = unique.where(F.col("queueId").isNotNull())
            needed = {
                row["topic"]: row["queues"]
                for row in with_ids.groupBy("topic").agg((F.max("queueId") + 1).alias("queues")).collect()
            }
            _ensure_topics(endpoint, needed)
            ordered = todo.repartition("topic", "queueId").sortWithinPartitions("topic", "queueId", "inputOrder")
        else:
            ordered = todo.repartition("topic").sortWithinPartitions("topic", "inputOrder")
        check_root = root
        check_sizes = resolve_sizes(root, index_slots=index_slots, index_entries=index_entries) if root else None

        def send(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa
            from pyspark import TaskContext

            context = TaskContext.get()
            retried = context is not None and context.attemptNumber() > 0
            checker: Any = None
            if mode == "query":
                assert query_endpoint is not None
                checker = QueryChecker(query_endpoint)
            elif retried:
                assert check_root is not None
                checker = StoreChecker(check_root, check_sizes)
            try:
                rows = (row for batch in batches for row in batch.to_pylist())
                sent, skipped = send_rows(rows, endpoint, keep_queue_ids=keep, checker=checker, batch_messages=batch_messages)
            finally:
                if checker is not None:
                    checker.close()
            yield pa.RecordBatch.from_pydict({"sent": pa.array([sent], pa.int64()), "alreadyStored": pa.array([skipped], pa.int64())})

        with progress.phase(f"sending {todo_count:,} message(s) to {endpoint}"):
            results = ordered.mapInArrow(send, SEND_RESULT_SCHEMA).collect()
    finally:
        for item in cached:
            item.unpersist()
    return LoadSummary(
        input_messages=input_messages,
        unsendable_skipped=bad,
        repeated_in_input=input_messages - bad - unique_count,
        already_stored=unique_count - todo_count,
        sent=sum(row["sent"] for row in results),
        skipped_at_send=sum(row["alreadyStored"] for row in results),
        dedupe=mode,
    )
