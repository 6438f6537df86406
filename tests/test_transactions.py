"""Transactional messages in one writer (real files, no server): the half, op and committed
records field by field as Apache RocketMQ 5's broker writes them (there is no transaction
in the dev fixture: the facts are from Apache's TransactionalMessageBridge,
EndTransactionProcessor and TransactionalMessageServiceImpl, docs/format.md §17), and the
check's rounds, discards and progress across a reopen."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import FIXTURE_SIZES

from rmqstore.common.codec import properties as props
from rmqstore.common.codec import sysflag
from rmqstore.common.codec.consumequeue import CHECK_MAX_TIME_TOPIC, HALF_TOPIC, OP_TOPIC
from rmqstore.common.codec.record import Record
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.message_rules import DEFAULT_LIMITS, MessageInput, validate_message
from rmqstore.writer.config import WriterConfig
from rmqstore.writer.store import Writer
from rmqstore.writer.transaction_check import (
    PROGRESS_FILE_NAME,
    TransactionCheck,
    read_check_progress,
)
from rmqstore.writer.transactions import TransactionSettings
from rmqstore.writer.validate import MessageBatch

TOPIC = "Orders"
STORE_HOST = "198.51.100.7:10911"
BORN_MS = int(time.time() * 1000)


@pytest.fixture
def writer(tmp_path: Path) -> Writer:
    opened = Writer(WriterConfig(store=str(tmp_path / "store"), sizes=FIXTURE_SIZES, store_host=STORE_HOST))
    opened.topics.create(TOPIC, 4)
    yield opened  # type: ignore[misc]
    opened.close()


def records(writer: Writer) -> list[Record]:
    writer.flush()
    log = CommitLog(writer.paths.commitlog, writer.config.sizes.commitlog_file_size_bytes)
    try:
        return list(log.records())
    finally:
        log.close()


def half_message(uniq_key: str, queue_id: int = 2, **extra: str) -> MessageInput:
    """A half message as the gateway hands a v2 TRANSACTION message over (PGROUP the topic)."""
    return MessageInput(
        topic=TOPIC,
        body=f"order {uniq_key}".encode(),
        keys=["order-1"],
        tags="Paid",
        properties={props.TRAN_MSG: "true", props.PGROUP: TOPIC, "shop": "north", **extra},
        queue_id=queue_id,
        uniq_key=uniq_key,
        born_timestamp_ms=BORN_MS,
    )


def test_half_commit_and_op_records_hold_apaches_fields(writer: Writer) -> None:
    sent = writer.append([half_message("A1"), half_message("B2", queue_id=3)])
    assert sent.topics == [HALF_TOPIC, HALF_TOPIC] and sent.queue_ids == [0, 0] and sent.queue_offsets == [0, 1]
    check = TransactionCheck(writer)
    assert check.end(TOPIC, 0, sent.commitlog_offsets[0], commit=True, from_check=False) is None
    assert check.end(TOPIC, 1, sent.commitlog_offsets[1], commit=False, from_check=False) is None
    half_a, half_b, committed, op_a, op_b = records(writer)

    # TransactionalMessageBridge.parseHalfMessageInner: half topic, queue 0, the transaction
    # type reset to NOT (so it has a queue offset), REAL_TOPIC/REAL_QID/__transactionId__ added.
    assert (half_a.topic, half_a.queue_id, half_a.queue_offset) == (HALF_TOPIC, 0, 0)
    assert sysflag.transaction_type(half_a.sys_flag) == sysflag.TRANSACTION_NOT
    assert half_a.prepared_transaction_offset == 0
    assert half_a.properties == {
        props.TRAN_MSG: "true", props.PGROUP: TOPIC, "shop": "north", props.KEYS: "order-1", props.TAGS: "Paid",
        props.UNIQ_KEY: "A1", props.TRANSACTION_ID: "A1", props.REAL_TOPIC: TOPIC, props.REAL_QID: "2",
    }  # fmt: skip
    assert half_b.properties[props.REAL_QID] == "3" and half_b.queue_offset == 1

    # EndTransactionProcessor.endMessageTransaction + resetTransactionValue(COMMIT): the real
    # topic and queue, the same UNIQ_KEY, body, flag, born time and hosts; every property the
    # half had (its propertiesString is built before REAL_TOPIC, REAL_QID and TRAN_MSG are
    # cleared from the map); PREPAREDTRANSACTIONOFFSET the half's commit log offset.
    assert (committed.topic, committed.queue_id, committed.queue_offset) == (TOPIC, 2, 0)
    assert sysflag.transaction_type(committed.sys_flag) == sysflag.TRANSACTION_COMMIT
    assert committed.prepared_transaction_offset == half_a.commitlog_offset
    assert committed.properties == half_a.properties
    assert list(committed.properties) == list(half_a.properties)  # the same bytes, in the same order
    assert (committed.body, committed.flag, committed.born_timestamp_ms, committed.born_host, committed.store_host) == (
        half_a.body, half_a.flag, half_a.born_timestamp_ms, half_a.born_host, half_a.store_host,
    )  # fmt: skip
    assert committed.uniq_key == "A1"

    # deletePrepareMessage + makeOpMessageInner: op topic queue 0, tag "d", body the half's
    # queue offset and ",", sysFlag 0, born and store host the broker's, properties those of
    # Message(topic, "d", body) (TAGS, WAIT), no UNIQ_KEY stored.
    for op, half in ((op_a, half_a), (op_b, half_b)):
        assert (op.topic, op.queue_id, op.body) == (OP_TOPIC, 0, f"{half.queue_offset},".encode())
        assert op.sys_flag & sysflag.TRANSACTION_MASK == 0 and op.prepared_transaction_offset == 0
        assert op.properties == {props.TAGS: "d", props.WAIT: "true"}
        assert op.born_host == op.store_host
    assert (op_a.queue_offset, op_b.queue_offset) == (0, 1)
    # The rollback left no copy in the topic: only A1 is there.
    assert writer.queues.find(TOPIC, 3) is None or writer.queues.find(TOPIC, 3).max_offset == 0  # type: ignore[union-attr]


def test_end_refuses_what_apaches_broker_refuses(writer: Writer) -> None:
    sent = writer.append([half_message("A1"), MessageInput(topic=TOPIC, body=b"plain", queue_id=0)])
    check = TransactionCheck(writer)
    offset = sent.commitlog_offsets[0]
    assert check.end("OtherGroup", 0, offset, commit=True, from_check=False) == "The producer group wrong"
    assert check.end(TOPIC, 7, offset, commit=True, from_check=False) == "The transaction state table offset wrong"
    assert check.end(TOPIC, 0, offset + 1, commit=True, from_check=False) == "Find prepared transaction message failed"
    # A non-transaction message's offset names no half message.
    assert check.end(TOPIC, 0, sent.commitlog_offsets[1], commit=True, from_check=False) == "Find prepared transaction message failed"
    assert [record.topic for record in records(writer)] == [HALF_TOPIC, TOPIC]  # nothing appended


def test_a_half_message_needs_its_producer_group_and_no_schedule() -> None:
    with pytest.raises(InvalidArgument, match="PGROUP"):
        validate_message(MessageInput(topic=TOPIC, body=b"x", properties={props.TRAN_MSG: "true"}), DEFAULT_LIMITS)
    with pytest.raises(InvalidArgument, match="delayed or timed"):
        validate_message(
            MessageInput(topic=TOPIC, body=b"x", properties={props.TRAN_MSG: "true", props.PGROUP: "g", props.DELAY: "2"}),
            DEFAULT_LIMITS,
        )
    # TRAN_MSG other than "true" (Boolean.parseBoolean) is an ordinary message's property.
    assert validate_message(MessageInput(topic=TOPIC, body=b"x", properties={props.TRAN_MSG: "false"}), DEFAULT_LIMITS)


def test_the_check_renews_an_unresolved_half_message_and_discards_it_after_the_maximum(writer: Writer) -> None:
    sent = writer.append([half_message("A1"), half_message("B2")])
    settings = TransactionSettings(timeout_ms=1000, check_interval_ms=100, check_max=3)
    check = TransactionCheck(writer, settings)
    born = BORN_MS
    assert check.check(now=born + 500) == []  # younger than the timeout: not checked
    # B2 is committed before any check: its op record makes the check pass it by.
    assert check.end(TOPIC, 1, sent.commitlog_offsets[1], commit=True, from_check=False) is None
    now = born + 10**9  # long after: every round checks what is left
    asked = []
    for _ in range(3):
        rounds = check.check(now=now)
        asked.append([(c.transaction_id, c.group, c.record.properties[props.TRANSACTION_CHECK_TIMES]) for c in rounds])
    assert asked == [[("A1", TOPIC, "1")], [("A1", TOPIC, "2")], [("A1", TOPIC, "3")]]
    assert check.check(now=now) == []  # checked three times: discarded
    discarded = [record for record in records(writer) if record.topic == CHECK_MAX_TIME_TOPIC]
    assert len(discarded) == 1
    (record,) = discarded
    assert record.queue_id == 0 and record.uniq_key == "A1" and record.properties[props.TRANSACTION_CHECK_TIMES] == "3"
    assert record.properties[props.REAL_TOPIC] == TOPIC and record.body == b"order A1"
    assert check.check(now=now) == []  # nothing left


def test_check_progress_survives_a_reopen_and_answers_come_from_the_renewed_copy(tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer = Writer(WriterConfig(store=str(store), sizes=FIXTURE_SIZES, store_host=STORE_HOST))
    writer.topics.create(TOPIC, 4)
    writer.append([half_message("A1"), half_message("B2")])
    settings = TransactionSettings(timeout_ms=1000, check_interval_ms=100, check_max=15)
    now = BORN_MS + 10**9
    first = TransactionCheck(writer, settings).check(now=now)
    assert [c.half_queue_offset for c in first] == [2, 3]  # the renewed copies
    writer.close()
    assert read_check_progress(str(store / "config")).half_offset == 2
    assert (store / "config" / PROGRESS_FILE_NAME).exists()

    reopened = Writer(WriterConfig(store=str(store), sizes=FIXTURE_SIZES, store_host=STORE_HOST))
    try:
        check = TransactionCheck(reopened, settings)
        # The producer answers the check of A1 (commit) from the renewed copy's offsets.
        a1 = first[0]
        assert check.end(TOPIC, a1.half_queue_offset, a1.commitlog_offset, commit=True, from_check=True) is None
        again = check.check(now=now)
        # A1 is resolved; B2 is asked again (its second check), nothing below halfOffset is.
        assert [(c.transaction_id, c.record.properties[props.TRANSACTION_CHECK_TIMES]) for c in again] == [("B2", "2")]
        committed = [record for record in records(reopened) if record.topic == TOPIC]
        assert [record.uniq_key for record in committed] == ["A1"]
        assert committed[0].prepared_transaction_offset == a1.commitlog_offset
    finally:
        reopened.close()


def test_a_released_batch_of_many_keeps_each_rows_transaction(writer: Writer) -> None:
    """The transaction patch lands on the row it names, past a first row of another size."""
    sent = writer.append([half_message("A1")])
    copy = MessageInput(topic=TOPIC, body=b"y" * 300, properties={props.UNIQ_KEY: "Z9"}, queue_id=1, uniq_key="Z9")
    other = MessageInput(topic=TOPIC, body=b"z", properties={props.UNIQ_KEY: "Z8"}, queue_id=1, uniq_key="Z8")
    writer.append_released(MessageBatch.of([copy, other]), transactions={1: (sysflag.TRANSACTION_COMMIT, sent.commitlog_offsets[0])})
    *_, first, second = records(writer)
    assert (first.sys_flag & sysflag.TRANSACTION_MASK, first.prepared_transaction_offset) == (0, 0)
    assert (second.sys_flag & sysflag.TRANSACTION_MASK, second.prepared_transaction_offset) == (
        sysflag.TRANSACTION_COMMIT, sent.commitlog_offsets[0],
    )  # fmt: skip
