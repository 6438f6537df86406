"""Delayed and timed messages: Apache's delay levels (SCHEDULE_TOPIC_XXXX, released as
the dev fixture's ScheduleMessageService released them), RocketMQ 5's timed messages
(rmq_sys_wheel_timer) and their recall, in a writer in this process, driven tick by tick
with the clock given; the real-process tests are in test_timers_live.py."""

from __future__ import annotations

import base64
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import CLEAN, FIXTURE_SIZE_ARGS, FIXTURE_SIZES, read_jsonl
from support.cli import run
from support.wait import wait_until

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.consumequeue import SCHEDULE_TOPIC, TIMER_TOPIC, tags_code
from rmqstore.common.codec.record import Record
from rmqstore.common.errors import Corruption, InvalidArgument
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.delay_offsets import (
    parse_delay_offsets,
    read_delay_offsets,
    render_delay_offsets,
)
from rmqstore.common.message_rules import DEFAULT_LIMITS, MessageInput, validate_message
from rmqstore.writer.config import WriterConfig
from rmqstore.writer.schedule import (
    parse_recall_handle,
    recall_handle,
    recall_marker,
)
from rmqstore.writer.store import Writer
from rmqstore.writer.timers import (
    TIMERS_FILE_NAME,
    ScheduledDelivery,
    TimerProgress,
    now_ms,
    read_timer_progress,
)

DUMP = CLEAN.parent / "store-clean-commitlog-dump.jsonl"
FIXTURE_STORE_HOST = "198.51.100.7:10911"
# Apache's delay levels 1-3: 1 s, 5 s, 10 s.
LEVEL_MS = {1: 1000, 2: 5000, 3: 10_000}


def records_from(writer: Writer, start: int) -> list[Record]:
    writer.flush()
    log = CommitLog(writer.paths.commitlog, writer.config.sizes.commitlog_file_size_bytes)
    try:
        return [record for record in log.records() if record.commitlog_offset >= start]
    finally:
        log.close()


def apache_record(offset: int) -> Record:
    log = CommitLog(str(CLEAN / "commitlog"), FIXTURE_SIZES.commitlog_file_size_bytes)
    try:
        return log.read(offset)
    finally:
        log.close()


# What may differ between two releases of one delayed message: when and where it was stored.
PLACE_AND_TIME = ("commitlog_offset", "queue_offset", "store_timestamp_ms")


def comparable(record: Record) -> dict[str, object]:
    fields = {name: getattr(record, name) for name in Record.__dataclass_fields__ if name not in PLACE_AND_TIME}
    fields["properties"] = list(record.properties.items())  # their order on disk too
    return fields


def test_delay_levels_are_released_as_apaches_schedule_message_service_released_them(clean_copy: Path) -> None:
    """The fixture holds seven SCHEDULE_TOPIC_XXXX records and the seven copies Apache's
    ScheduleMessageService appended: ours, released from those records, equal Apache's
    field for field (properties in the same order) but for place and store time, each in
    its real queue; delayOffset.json ends as Apache's did, byte for byte."""
    apache_delay_offsets = (clean_copy / "config" / "delayOffset.json").read_bytes()
    for name in ("delayOffset.json", "delayOffset.json.bak"):
        (clean_copy / "config" / name).unlink()
    dump = read_jsonl(DUMP)
    scheduled = [line for line in dump if line["topic"] == SCHEDULE_TOPIC]
    copies = {line["properties"]["UNIQ_KEY"]: line for line in dump if line["topic"] != SCHEDULE_TOPIC and "REAL_TOPIC" in line["properties"]}
    assert len(scheduled) == len(copies) == 7
    writer = Writer(WriterConfig(store=str(clean_copy), sizes=FIXTURE_SIZES, store_host=FIXTURE_STORE_HOST))
    delivery = ScheduledDelivery(writer)
    try:
        start = writer.log.write_offset or 0
        ends = {(c["topic"], c["queueId"]): writer.queues.get(c["topic"], c["queueId"]).max_offset for c in copies.values()}
        assert delivery.levels.pending() == 7
        delivery.run_once()
        assert delivery.levels.pending() == 0
        delivery.checkpoint()
        ours = records_from(writer, start)
    finally:
        delivery.stop()
        writer.close()
    assert len(ours) == 7
    for record in ours:
        theirs = apache_record(copies[record.properties[props.UNIQ_KEY]]["commitLogOffset"])
        assert comparable(record) == comparable(theirs)
        assert record.size == theirs.size
        key = (record.topic, record.queue_id)
        assert record.queue_offset == ends[key]
        ends[key] += 1
    assert (clean_copy / "config" / "delayOffset.json").read_bytes() == apache_delay_offsets


def test_delay_offsets_file_reads_and_writes_apaches_layout() -> None:
    text = (CLEAN / "config" / "delayOffset.json").read_text()
    assert parse_delay_offsets(text) == {1: 4, 2: 3}
    assert render_delay_offsets({2: 3, 1: 4}) == text
    assert parse_delay_offsets('{"offsetTable":{"3":7}}') == {3: 7}
    for bad in ("{", '{"offsetTable":{x:1}}', '{"offsetTable":{1:-1}}', '{"offsetTable":[]}'):
        with pytest.raises(Corruption):
            parse_delay_offsets(bad)


@pytest.fixture
def writer(tmp_path: Path) -> Writer:
    opened = Writer(WriterConfig(store=str(tmp_path / "store"), sizes=FIXTURE_SIZES, timer_max_delay_ms=3_600_000))
    yield opened  # type: ignore[misc]
    opened.close()


def send(writer: Writer, *messages: MessageInput) -> list[tuple[str, int, int]]:
    results = writer.append(list(messages))
    return [(r.topic, r.queue_id, r.queue_offset) for r in results]


def test_a_delay_level_is_stored_in_the_schedule_topic_and_released_when_due(writer: Writer) -> None:
    """Levels 1-3 as Apache 4.9 stores them (queue level − 1, REAL_TOPIC, REAL_QID, the
    unit's tagsCode the deliver time), released no earlier than due, each once, with the
    properties Apache's copies have; a level past the last is the last (DELAY rewritten)."""
    writer.topics.create("Orders", 4)
    placed = send(
        writer,
        *(
            MessageInput("Orders", f"level {level}".encode(), keys=["k1", "k2"], tags="paid", properties={"DELAY": str(level), "a": "b"}, queue_id=2)
            for level in (1, 2, 3)
        ),
        MessageInput("Orders", b"late", properties={"DELAY": "25"}, queue_id=1),
        MessageInput("Orders", b"now", properties={"DELAY": "0"}, queue_id=1),
    )
    assert placed[:4] == [(SCHEDULE_TOPIC, 0, 0), (SCHEDULE_TOPIC, 1, 0), (SCHEDULE_TOPIC, 2, 0), (SCHEDULE_TOPIC, 17, 0)]
    assert placed[4] == ("Orders", 1, 0)  # level 0: an ordinary message
    stored = records_from(writer, 0)
    for level, record in zip((1, 2, 3), stored):
        assert record.properties == {
            "a": "b", "KEYS": "k1 k2", "TAGS": "paid", "UNIQ_KEY": record.uniq_key, "DELAY": str(level),
            "REAL_TOPIC": "Orders", "REAL_QID": "2",
        }  # fmt: skip
        assert list(record.properties) == list(props.broker_order(record.properties))
        unit = writer.queues.get(SCHEDULE_TOPIC, level - 1).read(0)
        assert unit is not None and unit.tags_code == record.store_timestamp_ms + LEVEL_MS[level]
    assert stored[3].properties["DELAY"] == "18"
    stored_at = stored[0].store_timestamp_ms
    delivery = ScheduledDelivery(writer)
    end = writer.log.write_offset or 0
    assert delivery.run_once(stored_at + 999) == stored_at + 1000
    assert records_from(writer, end) == []
    delivery.run_once(stored_at + 5000)
    released = records_from(writer, end)
    assert [r.body for r in released] == [b"level 1", b"level 2"]
    delivery.run_once(stored_at + 5000)  # each once
    delivery.run_once(stored_at + 10_000)
    released = records_from(writer, end)
    assert [r.body for r in released] == [b"level 1", b"level 2", b"level 3"]
    for level, record, original in zip((1, 2, 3), released, stored):
        assert (record.topic, record.queue_id) == ("Orders", 2)
        assert list(record.properties.items()) == list(original.properties.items())
        assert (record.born_timestamp_ms, record.born_host, record.body) == (original.born_timestamp_ms, original.born_host, original.body)
        unit = writer.queues.get("Orders", 2).read(level - 1)
        assert unit is not None and unit.tags_code == tags_code("paid")
    delivery.checkpoint()
    assert read_delay_offsets(writer.paths.config) == {1: 1, 2: 1, 3: 1}


def test_scheduling_properties_must_be_whole_numbers() -> None:
    for name in ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS"):
        for bad in ("-1", "1.5", "x", "1" * 19, "١"):
            with pytest.raises(InvalidArgument, match=f"property {name} is"):
                validate_message(MessageInput("T", b"x", properties={name: bad}), DEFAULT_LIMITS)
        validate_message(MessageInput("T", b"x", properties={name: "12"}), DEFAULT_LIMITS)
    for reserved in ("TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "REAL_TOPIC"):
        with pytest.raises(InvalidArgument, match="reserved"):
            validate_message(MessageInput("T", b"x", properties={reserved: "1"}), DEFAULT_LIMITS)


def timed(topic: str, body: bytes, due_ms: int, **fields: object) -> MessageInput:
    return MessageInput(topic, body, properties={props.TIMER_DELIVER_MS: str(due_ms)}, **fields)  # type: ignore[arg-type]


def test_a_timed_message_waits_in_the_timer_topic_and_is_released_once_when_due(writer: Writer) -> None:
    writer.topics.create("Orders", 2)
    now = now_ms()
    placed = send(writer, timed("Orders", b"t1", now + 60_000, queue_id=1, tags="x"), timed("Orders", b"past", now - 1, queue_id=1))
    assert placed == [(TIMER_TOPIC, 0, 0), ("Orders", 1, 0)]  # a time already come: ordinary
    [pending, ordinary] = records_from(writer, 0)
    due = now + 60_000
    assert pending.properties[props.TIMER_OUT_MS] == str(due)
    assert (pending.properties[props.REAL_TOPIC], pending.properties[props.REAL_QID]) == ("Orders", "1")
    unit = writer.queues.get(TIMER_TOPIC, 0).read(0)
    assert unit is not None and unit.tags_code == due
    assert ordinary.properties[props.TIMER_DELIVER_MS] == str(now - 1)
    delivery = ScheduledDelivery(writer)
    end = writer.log.write_offset or 0
    assert delivery.run_once(due - 1) == due
    assert delivery.wheel.pending_count == 1
    assert records_from(writer, end) == []
    delivery.run_once(due)
    delivery.run_once(due + 5)
    [released] = records_from(writer, end)
    assert (released.topic, released.queue_id, released.queue_offset, released.body) == ("Orders", 1, 1, b"t1")
    assert released.uniq_key == pending.uniq_key
    assert (released.properties[props.REAL_TOPIC], released.properties[props.REAL_QID]) == ("Orders", "1")
    assert released.properties[props.TIMER_OUT_MS] == str(due)
    assert released.properties[props.TIMER_ENQUEUE_MS] == str(pending.store_timestamp_ms)
    assert released.properties[props.TIMER_DEQUEUE_MS] == str(due)
    assert delivery.wheel.pending_count == 0


def test_a_delivery_time_beyond_the_maximum_delay_is_refused(writer: Writer) -> None:
    with pytest.raises(InvalidArgument, match="at most 3600000 ms"):
        writer.append([timed("Orders", b"x", now_ms() + 3_700_000)])
    with pytest.raises(InvalidArgument, match="at most 3600000 ms"):
        writer.append([MessageInput("Orders", b"x", properties={props.TIMER_DELAY_SEC: "3700"})])
    assert writer.log.write_offset == 0


def test_pending_timers_survive_a_reopen_and_released_ones_are_not_released_again(tmp_path: Path) -> None:
    config = WriterConfig(store=str(tmp_path / "store"), sizes=FIXTURE_SIZES)
    writer = Writer(config)
    now = now_ms()
    send(writer, *(timed("Orders", f"m{i}".encode(), now + 10_000 + i * 1000) for i in range(6)))
    delivery = ScheduledDelivery(writer)
    delivery.run_once(now + 12_000)  # m0..m2 released
    delivery.checkpoint(now + 12_000)
    end = writer.log.write_offset or 0
    writer.close()  # as after a crash: the thread's stop never ran
    progress = json.loads((tmp_path / "store" / "config" / TIMERS_FILE_NAME).read_text())
    assert progress["releasedUpToMs"] == now + 12_000 and progress["registeredEnd"] == 6 and progress["pendingFrom"] == 3
    writer = Writer(config)
    try:
        delivery = ScheduledDelivery(writer)
        assert delivery.wheel.pending_count == 3
        delivery.run_once(now + 20_000)
        assert [r.body for r in records_from(writer, end)] == [b"m3", b"m4", b"m5"]
    finally:
        writer.close()


def test_a_damaged_timers_file_is_set_aside_and_every_timer_is_pending_again(tmp_path: Path) -> None:
    config = WriterConfig(store=str(tmp_path / "store"), sizes=FIXTURE_SIZES)
    writer = Writer(config)
    now = now_ms()
    send(writer, timed("Orders", b"m", now + 10_000))
    (tmp_path / "store" / "config" / TIMERS_FILE_NAME).write_text(TimerProgress(now + 20_000, 1, 1).render().replace("1", "2", 1))
    try:
        delivery = ScheduledDelivery(writer)
        assert delivery.wheel.pending_count == 1  # none lost
        assert list((tmp_path / "store" / "config").glob(TIMERS_FILE_NAME + ".corrupt-*"))
    finally:
        writer.close()


def test_a_recalled_message_is_never_released(writer: Writer) -> None:
    now = now_ms()
    results = writer.append([timed("Orders", b"keep", now + 5000), timed("Orders", b"recall", now + 5000)])
    handle = recall_handle("Orders", "broker-a", now + 5000, results[1].uniq_key)
    raw = base64.urlsafe_b64decode(handle).decode()
    assert raw == f"v1 Orders broker-a {now + 5001} {results[1].uniq_key}"  # Apache 5.3's handle
    parsed = parse_recall_handle(handle)
    writer.append_released(writer_batch(recall_marker(parsed, now)), schedule=True)
    delivery = ScheduledDelivery(writer)
    end = writer.log.write_offset or 0
    delivery.run_once(now + 6000)
    assert [r.body for r in records_from(writer, end)] == [b"keep"]
    assert delivery.wheel.pending_count == 0
    for bad in ("", "djE=", "!!!", "é", *(base64.urlsafe_b64encode(raw).decode() for raw in (b"v2 a b 1 c", b"v1 a b 1 c\x01d"))):
        with pytest.raises(InvalidArgument, match="recall handle is invalid"):
            parse_recall_handle(bad)
    late = parse_recall_handle(recall_handle("Orders", "broker-a", now - 10, "X"))
    with pytest.raises(InvalidArgument, match="recall failed, timestamp invalid"):
        writer.append_released(writer_batch(recall_marker(late, now)), schedule=True)


def writer_batch(message: MessageInput):  # type: ignore[no-untyped-def]
    from rmqstore.writer.validate import MessageBatch

    return MessageBatch.of([message])


def test_each_tick_releases_exactly_the_timers_due_by_then_across_full_buckets(writer: Writer) -> None:
    """A second's bucket of 1,500 timers sent out of due order and a later second's 300:
    a tick releases every timer due by its time and no other, at most RELEASE_BATCH_MAX
    (1,024) a tick, the earliest-sent first when capped; every timer is released once, and
    the wheel's pending start is the lowest queue offset still pending."""
    writer.topics.create("Orders", 1)
    base = (now_ms() // 1000 + 100) * 1000
    dues = [base + (i * 7919) % 1000 for i in range(1500)] + [base + 1000 + (i * 31) % 1000 for i in range(300)]
    for start in range(0, len(dues), 300):
        send(writer, *(timed("Orders", str(i).encode(), dues[i]) for i in range(start, start + 300)))
    delivery = ScheduledDelivery(writer)
    wheel = delivery.wheel
    released: list[int] = []

    def tick(now: int) -> list[int]:
        end = writer.log.write_offset or 0
        delivery.run_once(now)
        copies = records_from(writer, end)
        assert all(copy.properties[props.TIMER_DEQUEUE_MS] == str(now) for copy in copies)
        numbers = [int(copy.body) for copy in copies]
        assert [dues[n] for n in numbers] == sorted(dues[n] for n in numbers)  # due order within a tick
        released.extend(numbers)
        return numbers

    assert tick(base - 1) == []
    first = tick(base + 499)
    assert sorted(first) == [i for i, due in enumerate(dues) if due <= base + 499]
    assert wheel.pending_count == len(dues) - len(first)
    assert wheel.pending_from() == min(i for i, due in enumerate(dues) if due > base + 499)
    # Everything is due by now: the rest of the first second (751) and the second one
    # (300) pass the cap, so the tick takes the first second's rest, then the second's
    # earliest-sent, up to 1,024 in all; the next tick the remaining 27.
    rest = 1500 - len(first)
    capped = tick(base + 5000)
    assert len(capped) == 1024
    assert sorted(capped) == sorted(set(range(1500)) - set(first)) + list(range(1500, 1500 + 1024 - rest))
    assert wheel.pending_from() == 1500 + 1024 - rest
    assert sorted(tick(base + 5000)) == list(range(1500 + 1024 - rest, 1800))
    assert tick(base + 6000) == [] and wheel.pending_count == 0
    assert sorted(released) == list(range(len(dues)))


def test_a_thousand_pending_timers_take_a_few_dozen_bytes_each(writer: Writer) -> None:
    now = now_ms()
    for start in range(0, 1000, 250):
        writer.append([timed("Orders", b"x" * 100, now + 100_000 + (i % 60) * 1000) for i in range(start, start + 250)])
    delivery = ScheduledDelivery(writer)
    assert delivery.wheel.pending_count == 1000
    assert delivery.wheel.memory_entries_bytes() <= 1000 * 4 * 8 * 2  # four int64 each, array slack


def test_the_progress_is_written_behind_the_releases_so_a_slow_flush_holds_none_back(writer: Writer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The running delivery writes its progress on a thread of its own, after a flush:
    while that flush waits (a busy disk, here held until the test lets it go), a timer
    comes due and is released on time; the progress written once the flush returns covers
    it."""
    writer.topics.create("Orders", 1)
    flushing, flush_may_go = threading.Event(), threading.Event()
    flush = writer.flush

    def held_flush(*args: Any, **kwargs: Any) -> int:
        flushing.set()
        flush_may_go.wait(30)
        return flush(*args, **kwargs)

    monkeypatch.setattr(writer, "flush", held_flush)
    due = now_ms() + 300
    [pending] = writer.append([timed("Orders", b"due while the disk is busy", due)])
    assert pending.topic == TIMER_TOPIC
    progress_file = Path(writer.paths.config) / TIMERS_FILE_NAME
    delivery = ScheduledDelivery(writer, checkpoint_interval_ms=50).start()
    try:
        wait_until(flushing.is_set, 10, "the first checkpoint's flush")
        wait_until(lambda: writer.queues.get("Orders", 0).max_offset == 1, 10, "the timer released while the flush waits")
        released_ms = now_ms()
        assert not progress_file.exists()  # the first progress waits for its flush
        flush_may_go.set()

        def covered() -> bool:
            return progress_file.exists() and read_timer_progress(writer.paths.config).released_up_to_ms >= due

        wait_until(covered, 10, "the progress covering the release")
    finally:
        flush_may_go.set()
        delivery.stop()
    assert due <= released_ms
    [copy] = records_from(writer, pending.commitlog_offset + 1)
    assert (copy.topic, copy.body) == ("Orders", b"due while the disk is busy")


def test_an_idle_delivery_sleeps_until_a_scheduled_message_is_stored(writer: Writer) -> None:
    """With nothing scheduled the running delivery sleeps until its next checkpoint (an
    hour here) rather than waking every tick; storing a timed message or a delayed one
    wakes it, so each is released when due, not an hour later."""
    writer.topics.create("Orders", 1)
    delivery = ScheduledDelivery(writer, checkpoint_interval_ms=3_600_000).start()
    try:
        wakes: list[None] = []
        writer.scheduled_listeners.append(lambda: wakes.append(None))
        writer.append([MessageInput("Orders", b"plain")])
        assert wakes == []  # an ordinary message wakes nobody
        writer.append([timed("Orders", b"timed", now_ms() + 200)])
        assert len(wakes) == 1
        wait_until(lambda: writer.queues.get("Orders", 0).max_offset == 2, 10, "the timed message released")
        level = {props.DELAY: "1"}  # level 1: 1 s
        writer.append([MessageInput("Orders", b"delayed", properties=level)])  # type: ignore[arg-type]
        assert len(wakes) == 2
        wait_until(lambda: writer.queues.get("Orders", 0).max_offset == 3, 10, "the delayed message released")
    finally:
        delivery.stop()
    assert [r.body for r in records_from(writer, 0) if r.topic == "Orders"] == [b"plain", b"timed", b"delayed"]


def test_a_store_without_timers_opens_without_them(tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(CLEAN, store)
    writer = Writer(WriterConfig(store=str(store), sizes=FIXTURE_SIZES, store_host=FIXTURE_STORE_HOST))
    try:
        delivery = ScheduledDelivery(writer)
        assert delivery.wheel.pending_count == 0 and delivery.levels.pending() == 0
        assert delivery.run_once() is None
    finally:
        writer.close()


def test_lookups_show_a_pending_message_with_its_due_time_then_its_released_copy(
    writer: Writer, capsys: pytest.CaptureFixture[str]
) -> None:
    now = now_ms()
    [timer] = writer.append([timed("Orders", b"later", now + 60_000)])
    [level] = writer.append([MessageInput("Orders", b"level 2", properties={"DELAY": "2"})])
    writer.flush_thoroughly()
    store = ["--store", writer.config.store, *FIXTURE_SIZE_ARGS]

    def shown(uniq_key: str) -> dict[str, object]:
        code, out, err = run(capsys, "queryMsgByUniqueKey", "-t", "Orders", "-i", uniq_key, "--json", *store)
        assert code == 0, err
        [line] = out.splitlines()
        return json.loads(line)  # type: ignore[no-any-return]

    pending = shown(timer.uniq_key)
    assert (pending["topic"], pending["pending"], pending["dueTimestamp"]) == (TIMER_TOPIC, True, now + 60_000)
    delayed = shown(level.uniq_key)
    assert (delayed["topic"], delayed["pending"], delayed["dueTimestamp"]) == (SCHEDULE_TOPIC, True, level.store_timestamp_ms + 5000)
    code, out, _ = run(capsys, "queryMsgByUniqueKey", "-t", "Orders", "-i", timer.uniq_key, *store)
    assert code == 0 and "Pending Until:" in out
    delivery = ScheduledDelivery(writer)
    delivery.run_once(now + 60_000)
    writer.flush_thoroughly()
    released = shown(timer.uniq_key)
    assert released["topic"] == "Orders" and "pending" not in released
    assert shown(level.uniq_key)["topic"] == "Orders"


def test_check_and_reindex_agree_with_the_scheduled_units(writer: Writer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The units' deliver and due times follow from the records (docs/format.md §16):
    check finds the writer's queues equal to its own dispatch, and reindex writes the
    same units, byte for byte."""
    now = now_ms()
    writer.append([timed("Orders", b"t", now + 60_000), MessageInput("Orders", b"d", properties={"DELAY": "3"})])
    marker = recall_marker(parse_recall_handle(recall_handle("Orders", "b", now + 60_000, "X1")), now)
    writer.append_released(writer_batch(marker), schedule=True)
    ScheduledDelivery(writer).run_once(now + 10)
    writer.flush_thoroughly()
    store = Path(writer.config.store)
    code, _, err = run(capsys, "check", str(store), *FIXTURE_SIZE_ARGS)
    assert code == 0, err
    out = tmp_path / "reindexed"
    code, _, err = run(capsys, "reindex", str(store), "--out", str(out), *FIXTURE_SIZE_ARGS)
    assert code == 0, err
    for queue in ("rmq_sys_wheel_timer/0", "SCHEDULE_TOPIC_XXXX/2"):
        ours = b"".join(p.read_bytes() for p in sorted((store / "consumequeue" / queue).iterdir()))
        rebuilt = b"".join(p.read_bytes() for p in sorted((out / "consumequeue" / queue).iterdir()))
        assert ours.rstrip(b"\0") == rebuilt.rstrip(b"\0") != b""
