"""Transactional messages as Apache RocketMQ 5's broker stores and resolves them: pure
functions over a batch's columns and over records, no I/O, no clock (docs/format.md §17).

* A **half message** (TRAN_MSG "true", its producer group in PGROUP; a v2 TRANSACTION
  message gets both from the gateway, as Apache's proxy adds them, PGROUP being the topic):
  TransactionalMessageBridge.parseHalfMessageInner stores it in RMQ_SYS_TRANS_HALF_TOPIC,
  queue 0, with ``__transactionId__`` (its UNIQ_KEY), REAL_TOPIC and REAL_QID added and
  its sysFlag's transaction type reset to NOT (so that it is dispatched to the half
  queue): :func:`to_half`.
* **Commit** (EndTransactionProcessor.endMessageTransaction): the half message in its real
  topic and queue, body, flag, born time and hosts kept, every property kept (REAL_TOPIC,
  REAL_QID and TRAN_MSG are cleared from the map after its propertiesString is built, so
  the stored record keeps them), sysFlag COMMIT and PREPAREDTRANSACTIONOFFSET the half's
  commit log offset: :func:`committed_copy`.
* **Commit or rollback** each write an op record (TransactionalMessageServiceImpl.
  deletePrepareMessage and TransactionalMessageBridge.makeOpMessageInner): in
  RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0, tag "d", body the half's queue offset and ","
  (Apache batches several offsets into one body; rmqstore writes one per resolution),
  properties TAGS and WAIT, born and store host the broker's: :func:`op_message`.
* A **check** (TransactionalMessageServiceImpl.check) appends the half message again with
  TRANSACTION_CHECK_TIMES counted up (renewHalfMessageInner): :func:`renewed_half`; once
  checked ``transactionCheckMax`` times it is moved to TRANS_CHECK_MAX_TIME_TOPIC queue 0
  instead (DefaultTransactionalMessageCheckListener.resolveDiscardMsg): :func:`discarded_copy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.consumequeue import CHECK_MAX_TIME_TOPIC, HALF_TOPIC, OP_TOPIC
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.record import Record
from rmqstore.common.message_rules import MessageInput, is_half_message
from rmqstore.common.sequences import all_equal
from rmqstore.writer.schedule import real_queue, record_copy

HALF_QUEUE_ID = 0
OP_QUEUE_ID = 0
REMOVE_TAG = "d"  # TransactionalMessageUtil.REMOVE_TAG
OFFSET_SEPARATOR = ","  # TransactionalMessageUtil.OFFSET_SEPARATOR
# BrokerConfig's defaults: a half message is first checked once this old (transactionTimeOut),
# the half queue is looked over this often (transactionCheckInterval), and a message checked
# this many times is discarded (transactionCheckMax).
DEFAULT_TRANSACTION_TIMEOUT_MS = 6_000
DEFAULT_CHECK_INTERVAL_MS = 30_000
DEFAULT_CHECK_MAX = 15
# The proxy's transaction data (ProxyConfig.transactionDataExpireMillis, transactionDataMaxNum):
# what EndTransaction resolves a transaction id to, kept this long and this many per id.
TRANSACTION_DATA_EXPIRE_MS = 30_000
TRANSACTION_DATA_MAX = 15


@dataclass(frozen=True)
class TransactionSettings:
    """A writer's transaction check settings (``--transaction-*``)."""

    timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS
    check_max: int = DEFAULT_CHECK_MAX


def half_rows(properties: Sequence[Mapping[str, str]]) -> list[int]:
    """The rows that are half messages: one look at a run of one shared mapping."""
    if not any(properties):
        return []
    if all_equal(properties):
        return list(range(len(properties))) if is_half_message(properties[0]) else []
    return [row for row, mapping in enumerate(properties) if mapping and is_half_message(mapping)]


def to_half(
    topics: list[str],
    queue_ids: list[int],
    properties: list[Mapping[str, str]],
    rows: list[int],
    uniq_keys: Sequence[str],
) -> tuple[list[str], list[int], list[Mapping[str, str]]]:
    """parseHalfMessageInner on the ``rows`` (REAL_QID naming the queue already assigned)."""
    topics, queue_ids, properties = topics[:], queue_ids[:], properties[:]
    for row in rows:
        mapping = dict(properties[row])
        mapping[props.TRANSACTION_ID] = uniq_keys[row]
        mapping[props.REAL_TOPIC] = topics[row]
        mapping[props.REAL_QID] = str(queue_ids[row])
        topics[row], queue_ids[row] = HALF_TOPIC, HALF_QUEUE_ID
        properties[row] = mapping
    return topics, queue_ids, properties


def committed_copy(half: Record) -> MessageInput | None:
    """endMessageTransaction: the half message in its real topic and queue, with all of its
    stored properties. The writer stores it with sysFlag COMMIT and the half's commit log
    offset as PREPAREDTRANSACTIONOFFSET (Writer.append_released's ``transactions``)."""
    real = real_queue(half)
    if real is None:
        return None
    return record_copy(half, real[0], real[1], half.properties)


def op_message(half_queue_offset: int, store_host: SocketAddress, now_ms: int) -> MessageInput:
    """The op record that marks the half message at ``half_queue_offset`` resolved. Its
    properties are Message(topic, "d", body)'s: TAGS and WAIT ("true"); the UNIQ_KEY
    makeOpMessageInner sets comes after the propertiesString and is not stored."""
    return MessageInput(
        topic=OP_TOPIC,
        body=f"{half_queue_offset}{OFFSET_SEPARATOR}".encode(),
        tags=REMOVE_TAG,
        properties={props.TAGS: REMOVE_TAG, props.WAIT: "true"},
        queue_id=OP_QUEUE_ID,
        born_timestamp_ms=now_ms,
        born_host=store_host,
    )


def op_offsets(body: bytes) -> list[int]:
    """The half queue offsets an op record's body names ("a,b,c,"; Apache's check skips
    what does not parse)."""
    offsets = []
    for part in body.decode("utf-8", "replace").split(OFFSET_SEPARATOR):
        if part.isascii() and part.isdigit():
            offsets.append(int(part))
    return offsets


def check_times(half: Record) -> int:
    """How often the half message was checked (TRANSACTION_CHECK_TIMES; 0 when never)."""
    value = half.properties.get(props.TRANSACTION_CHECK_TIMES, "")
    return int(value) if value.isascii() and value.isdigit() else 0


def renewed_half(half: Record, times: int) -> MessageInput:
    """renewHalfMessageInner: the half message again in the half queue, its check count set."""
    properties = dict(half.properties)
    properties[props.TRANSACTION_CHECK_TIMES] = str(times)
    return record_copy(half, HALF_TOPIC, HALF_QUEUE_ID, properties)


def discarded_copy(half: Record) -> MessageInput:
    """toMessageExtBrokerInner: a half message checked too often, in TRANS_CHECK_MAX_TIME_TOPIC queue 0."""
    return record_copy(half, CHECK_MAX_TIME_TOPIC, 0, half.properties)


def first_check_ms(half: Record, timeout_ms: int) -> int:
    """The age at which the half message is first checked: the transaction timeout, or the
    producer's own CHECK_IMMUNITY_TIME_IN_SECONDS if longer (TransactionalMessageUtil.getImmunityTime)."""
    value = half.properties.get(props.CHECK_IMMUNITY_TIME_IN_SECONDS, "")
    immunity_ms = int(value) * 1000 if value.isascii() and value.isdigit() else 0
    return max(immunity_ms, timeout_ms)


# The transactions' system topics: the writer's own records, never a producer's, queue 0.
TRANSACTION_TOPICS = frozenset({HALF_TOPIC, OP_TOPIC, CHECK_MAX_TIME_TOPIC})
