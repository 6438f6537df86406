"""The query node's lookups, on Apache's store and on stores built here, through gRPC."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import CLEAN, FIXTURE_SIZES, FIXTURES, read_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st
from support.inprocess import QueryNode

from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.properties import split_keys
from rmqstore.common.codec.record import Record, encode_record
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.consumequeue import Boundary, ConsumeQueueSet
from rmqstore.common.files.index import IndexFileList
from rmqstore.common.files.store import Dispatcher, StoreSizes
from rmqstore.query.view import OffsetSearch, StoreView
from rmqstore.v1 import query_pb2, query_pb2_grpc

QUERIES = [q for q in read_jsonl(FIXTURES / "queries.jsonl") if q["kind"] == "queryMessage"]
MANIFEST = read_jsonl(FIXTURES / "manifest.jsonl")
COLLIDING = ("AaAa", "BBBB", "AaBB", "BBAa")


@pytest.fixture(scope="module")
def apache() -> Iterator[QueryNode]:
    node = QueryNode(CLEAN, FIXTURE_SIZES)
    yield node
    node.close()


def all_by_key(stub: query_pb2_grpc.QueryServiceStub, page_size: int, **request: object) -> list:
    messages = []
    cursor = ""
    for _ in range(10_000):
        response = stub.QueryByKey(query_pb2.QueryByKeyRequest(page_size=page_size, cursor=cursor, **request))  # type: ignore[arg-type]
        messages.extend(response.messages)
        assert len(response.messages) <= page_size
        if response.complete:
            assert response.cursor == ""
            return messages
        assert len(response.messages) == page_size and response.cursor
        cursor = response.cursor
    raise AssertionError("paging did not end")


def real_matches(topic: str, key: str, begin: int = 0, end: int = 2**63 - 1) -> list[int]:
    """Brute force over Apache's own dump: offsets of records of the topic whose KEYS hold
    the key and whose store time is in range, newest first."""
    offsets = []
    for line in read_jsonl(FIXTURES / "store-clean-commitlog-dump.jsonl"):
        keys = line["properties"].get("KEYS")
        if line["topic"] == topic and key in split_keys(keys) and begin <= line["storeTimestamp"] <= end:
            offsets.append(line["commitLogOffset"])
    return sorted(offsets, reverse=True)


@pytest.mark.parametrize("query", QUERIES, ids=[q["why"] for q in QUERIES])
def test_key_queries_give_apaches_real_matches_and_all_of_them(apache: QueryNode, query: dict) -> None:
    end = min(query["end"], 2**63 - 1)
    request = {"topic": query["topic"], "key": query["key"], "begin_ms": query["begin"], "end_ms": end}
    small_pages = all_by_key(apache.stub, 7, **request)
    one_page = all_by_key(apache.stub, 10_000, **request)
    ours = [m.commitlog_offset for m in one_page]
    assert [m.commitlog_offset for m in small_pages] == ours
    assert ours == real_matches(query["topic"], query["key"], query["begin"], end)
    for message in one_page:
        assert message.topic == query["topic"] and query["key"] in message.keys
        assert query["begin"] <= message.store_timestamp_ms <= end
    # Apache's answer minus its non-matches (hash collisions, other topics, times outside
    # the range) is part of ours; where Apache hit its cap, ours has more.
    apache_real = {
        m["commitLogOffset"]
        for m in query["result.messages"]
        if m["topic"] == query["topic"]
        and query["key"] in split_keys(m["keys"])
        and query["begin"] <= m["storeTimestamp"] <= end
    }
    assert apache_real <= set(ours)


def test_colliding_keys_come_back_only_for_themselves(apache: QueryNode) -> None:
    for key in COLLIDING:
        messages = all_by_key(apache.stub, 1000, topic="TopicTest", key=key)
        assert messages and all(key in m.keys for m in messages)
        assert [m.commitlog_offset for m in messages] == real_matches("TopicTest", key)
    apache_answer = next(q for q in QUERIES if q["key"] == "AaAa")
    assert len(apache_answer["result.messages"]) == 37  # Apache mixes all four keys


def test_more_than_64_matches(apache: QueryNode) -> None:
    messages = all_by_key(apache.stub, 50, topic="OrderTopic", key="order-common")
    assert len(messages) == len(real_matches("OrderTopic", "order-common")) > 64


def test_windowed_queries_are_exact_where_apache_is_not(apache: QueryNode) -> None:
    """Apache's index time is second-rounded: its windowed answers include messages stored
    outside the window. Ours never do."""
    outside = 0
    for query in QUERIES:
        if query["begin"] == 0 and query["end"] >= 2**63 - 1:
            continue
        for m in query["result.messages"]:
            if not query["begin"] <= m["storeTimestamp"] <= query["end"]:
                outside += 1
        messages = all_by_key(apache.stub, 1000, topic=query["topic"], key=query["key"], begin_ms=query["begin"], end_ms=query["end"])
        assert all(query["begin"] <= m.store_timestamp_ms <= query["end"] for m in messages)
    assert outside > 0


def test_every_message_by_uniq_key_and_msg_id(apache: QueryNode) -> None:
    found = 0
    for line in MANIFEST:
        response = apache.stub.QueryByUniqKey(query_pb2.QueryByUniqKeyRequest(topic=line["storedTopic"], uniq_key=line["uniqKey"]))
        assert [m.commitlog_offset for m in response.messages] == [line["commitLogOffset"]]
        by_id = apache.stub.QueryByMsgId(query_pb2.QueryByMsgIdRequest(msg_id=line["msgId"])).message
        assert (by_id.commitlog_offset, by_id.uniq_key) == (line["commitLogOffset"], line["uniqKey"])
        found += 1
    assert found == 2000
    lowercase = apache.stub.QueryByMsgId(query_pb2.QueryByMsgIdRequest(msg_id=MANIFEST[5]["msgId"].lower())).message
    assert lowercase.commitlog_offset == MANIFEST[5]["commitLogOffset"]


def test_ipv6_msg_ids(apache: QueryNode) -> None:
    v6 = [line for line in MANIFEST if len(line["msgId"]) == 56]
    assert len(v6) == 40
    for line in v6:
        message = apache.stub.QueryByMsgId(query_pb2.QueryByMsgIdRequest(msg_id=line["msgId"])).message
        assert message.commitlog_offset == line["commitLogOffset"]
        assert message.store_host == "2001:db8:0:0:0:0:0:7:10911"


def test_every_consume_queue_entry_by_queue_offset(apache: QueryNode) -> None:
    count = 0
    for line in read_jsonl(FIXTURES / "store-clean-consumequeue-dump.jsonl"):
        request = query_pb2.QueryByQueueOffsetRequest(topic=line["topic"], queue_id=line["queueId"], queue_offset=line["queueOffset"])
        message = apache.stub.QueryByQueueOffset(request).message
        assert (message.commitlog_offset, message.size) == (line["commitLogOffset"], line["size"])
        count += 1
    assert count == 1995


def test_pull_and_bounds(apache: QueryNode) -> None:
    bounds = apache.stub.QueueBounds(query_pb2.QueueBoundsRequest(topic="TopicTest", queue_id=3))
    assert (bounds.min_offset, bounds.max_offset) == (0, 190)
    pulled = apache.stub.Pull(query_pb2.PullRequest(topic="TopicTest", queue_id=3, from_offset=185, max_count=100))
    assert [m.queue_offset for m in pulled.messages] == [185, 186, 187, 188, 189]
    assert (pulled.next_offset, pulled.max_offset) == (190, 190)
    small = apache.stub.Pull(query_pb2.PullRequest(topic="TopicTest", queue_id=3, from_offset=0, max_count=100, max_bytes=1))
    assert len(small.messages) == 1 and small.next_offset == 1
    sizes = [m.size for m in apache.stub.Pull(query_pb2.PullRequest(topic="TopicTest", queue_id=3, from_offset=0, max_count=10)).messages]
    budget = sum(sizes[:4])
    capped = apache.stub.Pull(query_pb2.PullRequest(topic="TopicTest", queue_id=3, from_offset=0, max_count=10, max_bytes=budget))
    assert len(capped.messages) == 4
    at_end = apache.stub.Pull(query_pb2.PullRequest(topic="TopicTest", queue_id=3, from_offset=190, max_count=5))
    assert list(at_end.messages) == [] and at_end.next_offset == 190


def test_topics_and_stats(apache: QueryNode) -> None:
    topics = {t.name: [(q.queue_id, q.min_offset, q.max_offset) for q in t.queues] for t in apache.stub.ListTopics(query_pb2.ListQueryTopicsRequest()).topics}
    assert topics["TopicTest"] == [(0, 0, 146), (1, 0, 167), (2, 0, 178), (3, 0, 190)]
    assert sorted(topics) == ["OrderTopic", "Pay_Events-2", "SCHEDULE_TOPIC_XXXX", "TopicTest"]
    stats = apache.stub.Stats(query_pb2.StatsRequest())
    assert (stats.visible_offset, stats.published_offset, stats.lag_bytes) == (2089474, 2089474, 0)
    assert stats.messages == 1995 and not stats.follows_writer
    assert (stats.commitlog_files, stats.index_files) == (4, 4)


def test_ping_answers_empty_and_is_listed_by_reflection(apache: QueryNode) -> None:
    assert apache.stub.Ping(query_pb2.PingRequest()) == query_pb2.PingResponse()
    methods = [m.name for m in query_pb2.DESCRIPTOR.services_by_name["QueryService"].methods]
    assert "Ping" in methods


def test_search_offset_on_every_queue_matches_brute_force(apache: QueryNode) -> None:
    dump = {line["commitLogOffset"]: line["storeTimestamp"] for line in read_jsonl(FIXTURES / "store-clean-commitlog-dump.jsonl")}
    queues: dict[tuple[str, int], list[int]] = {}
    for line in read_jsonl(FIXTURES / "store-clean-consumequeue-dump.jsonl"):
        queues.setdefault((line["topic"], line["queueId"]), []).append(dump[line["commitLogOffset"]])
    checked = 0
    for (topic, queue_id), times in queues.items():
        probes = sorted({t + d for t in times for d in (-1, 0, 1)} | {0, times[0] - 10_000, times[-1] + 10_000})
        for ts in probes[:: max(1, len(probes) // 60)] + [times[0], times[-1]]:
            lower = apache.stub.SearchOffset(query_pb2.SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp_ms=ts))
            upper = apache.stub.SearchOffset(
                query_pb2.SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp_ms=ts, boundary=query_pb2.BOUNDARY_UPPER)
            )
            want_lower = next((i for i, t in enumerate(times) if t >= ts), len(times))
            want_upper = max((i for i, t in enumerate(times) if t <= ts), default=-1)
            assert (lower.offset, lower.found) == (want_lower, want_lower < len(times))
            assert (upper.offset, upper.found) == (want_upper, want_upper >= 0)
            checked += 1
    assert checked > 500


def test_stream_by_time(apache: QueryNode) -> None:
    times = [m.store_timestamp_ms for m in apache.stub.Pull(query_pb2.PullRequest(topic="OrderTopic", queue_id=1, from_offset=0, max_count=1000)).messages]
    begin, end = times[10], times[40]
    streamed = list(apache.stub.StreamByTime(query_pb2.StreamByTimeRequest(topic="OrderTopic", queue_id=1, begin_ms=begin, end_ms=end)))
    want = [i for i, t in enumerate(times) if begin <= t <= end]
    assert [m.queue_offset for m in streamed] == want and len(want) >= 31


BAD = {
    "malformed msgId": ("QueryByMsgId", query_pb2.QueryByMsgIdRequest(msg_id="not-hex"), grpc.StatusCode.INVALID_ARGUMENT, "32 or 56 hex"),
    "msgId of another host": (
        "QueryByMsgId",
        query_pb2.QueryByMsgIdRequest(msg_id="0A00000100002A9F0000000000000000"),
        grpc.StatusCode.NOT_FOUND,
        "stored by 198.51.100.7:10911, not 10.0.0.1:10911",
    ),
    "msgId past the end": (
        "QueryByMsgId",
        query_pb2.QueryByMsgIdRequest(msg_id="C633640700002A9F00000000FFFFFFFF"),
        grpc.StatusCode.NOT_FOUND,
        "outside the visible range",
    ),
    "msgId between records": (
        "QueryByMsgId",
        query_pb2.QueryByMsgIdRequest(msg_id="C633640700002A9F0000000000000001"),
        grpc.StatusCode.NOT_FOUND,
        "no record starts at commit log offset 1",
    ),
    "unknown topic": (
        "QueryByQueueOffset",
        query_pb2.QueryByQueueOffsetRequest(topic="NoSuchTopic", queue_id=0, queue_offset=0),
        grpc.StatusCode.NOT_FOUND,
        "topic NoSuchTopic does not exist",
    ),
    "unknown queue": (
        "QueueBounds",
        query_pb2.QueueBoundsRequest(topic="TopicTest", queue_id=7),
        grpc.StatusCode.NOT_FOUND,
        "topic TopicTest has no queue 7",
    ),
    "invalid topic": ("QueryByKey", query_pb2.QueryByKeyRequest(topic="../x", key="k", page_size=1), grpc.StatusCode.INVALID_ARGUMENT, "outside"),
    "negative queue offset": (
        "QueryByQueueOffset",
        query_pb2.QueryByQueueOffsetRequest(topic="TopicTest", queue_id=0, queue_offset=-1),
        grpc.StatusCode.OUT_OF_RANGE,
        "outside [0, 146)",
    ),
    "huge queue offset": (
        "QueryByQueueOffset",
        query_pb2.QueryByQueueOffsetRequest(topic="TopicTest", queue_id=0, queue_offset=2**62),
        grpc.StatusCode.OUT_OF_RANGE,
        "outside [0, 146)",
    ),
    "pull from past the end": (
        "Pull",
        query_pb2.PullRequest(topic="TopicTest", queue_id=0, from_offset=147, max_count=1),
        grpc.StatusCode.OUT_OF_RANGE,
        "outside [0, 146]",
    ),
    "pull count 0": ("Pull", query_pb2.PullRequest(topic="TopicTest", queue_id=0, max_count=0), grpc.StatusCode.INVALID_ARGUMENT, "max count"),
    "page size 0": ("QueryByKey", query_pb2.QueryByKeyRequest(topic="TopicTest", key="k"), grpc.StatusCode.INVALID_ARGUMENT, "page size must be in [1, 10000], got 0"),
    "page size huge": (
        "QueryByKey",
        query_pb2.QueryByKeyRequest(topic="TopicTest", key="k", page_size=10_001),
        grpc.StatusCode.INVALID_ARGUMENT,
        "got 10001",
    ),
    "end before begin": (
        "QueryByKey",
        query_pb2.QueryByKeyRequest(topic="TopicTest", key="k", page_size=1, begin_ms=10, end_ms=9),
        grpc.StatusCode.INVALID_ARGUMENT,
        "end 9 is before begin 10",
    ),
    "key with a space": ("QueryByKey", query_pb2.QueryByKeyRequest(topic="TopicTest", key="a b", page_size=1), grpc.StatusCode.INVALID_ARGUMENT, "space"),
    "bad cursor": (
        "QueryByKey",
        query_pb2.QueryByKeyRequest(topic="TopicTest", key="k", page_size=1, cursor="garbage"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "cursor",
    ),
    "negative timestamp": (
        "SearchOffset",
        query_pb2.SearchOffsetRequest(topic="TopicTest", queue_id=0, timestamp_ms=-5),
        grpc.StatusCode.INVALID_ARGUMENT,
        "negative",
    ),
    "empty unique key": ("QueryByUniqKey", query_pb2.QueryByUniqKeyRequest(topic="TopicTest"), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_a_clear_error(apache: QueryNode, case: str) -> None:
    method, request, code, text = BAD[case]
    with pytest.raises(grpc.RpcError) as caught:
        getattr(apache.stub, method)(request)
    assert caught.value.code() == code
    assert text in caught.value.details()


def test_time_range_stream_rejects_end_before_begin(apache: QueryNode) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list(apache.stub.StreamByTime(query_pb2.StreamByTimeRequest(topic="TopicTest", queue_id=0, begin_ms=5, end_ms=4)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_cursor_of_another_query_is_refused(apache: QueryNode) -> None:
    first = apache.stub.QueryByKey(query_pb2.QueryByKeyRequest(topic="TopicTest", key="order-common", page_size=2))
    assert not first.complete
    with pytest.raises(grpc.RpcError) as caught:
        apache.stub.QueryByKey(query_pb2.QueryByKeyRequest(topic="TopicTest", key="hot-key-1", page_size=2, cursor=first.cursor))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _build_store(root: Path, times: list[tuple[int, int]]) -> StoreSizes:
    """A store whose queue 0/1 records have the given (queue, store time) in commit log order."""
    sizes = StoreSizes(commitlog_file_size_bytes=4096, cq_file_units=5, index_slots=7, index_entries=20)
    log = CommitLog(str(root / "commitlog"), sizes.commitlog_file_size_bytes, writable=True)
    log.set_write_position(0)
    queues = ConsumeQueueSet(str(root / "consumequeue"), sizes.cq_file_units, writable=True)
    index = IndexFileList(str(root / "index"), sizes.index_slots, sizes.index_entries, writable=True)
    dispatcher = Dispatcher(queues, index)
    next_offset = {0: 0, 1: 0}
    host = SocketAddress.parse("127.0.0.1:10911")
    for n, (queue_id, ts) in enumerate(times):
        record = Record(topic="T", body=b"b" * (n % 30), properties={"KEYS": f"k{n}", "UNIQ_KEY": f"U{n}"}, queue_id=queue_id,
                        queue_offset=next_offset[queue_id], born_host=host, store_host=host, store_timestamp_ms=ts, born_timestamp_ms=ts)
        encoded = bytearray(encode_record(record))
        [record.commitlog_offset] = log.append([encoded], [record.queue_offset])
        record.size = len(encoded)
        dispatcher.dispatch(record)
        next_offset[queue_id] += 1
    log.close()
    queues.close()
    index.close()
    return sizes


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3)), min_size=1, max_size=60),
    probes=st.lists(st.integers(-5, 400), min_size=1, max_size=20),
)
def test_search_offset_property(steps: list[tuple[int, int]], probes: list[int]) -> None:
    """LOWER/UPPER agree with brute force on queues with repeated and gapped store times,
    across consume queue and commit log file boundaries."""
    times = []
    clock = 1000
    for queue_id, gap in steps:
        clock += gap
        times.append((queue_id, clock))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sizes = _build_store(root, times)
        view = StoreView(str(root), sizes)
        try:
            for queue_id in (0, 1):
                queue_times = [t for q, t in times if q == queue_id]
                if not queue_times:
                    continue
                for probe in [1000 + p for p in probes] + queue_times:
                    lower = view.search_offset("T", queue_id, probe, Boundary.LOWER)
                    upper = view.search_offset("T", queue_id, probe, Boundary.UPPER)
                    assert lower.offset == next((i for i, t in enumerate(queue_times) if t >= probe), len(queue_times))
                    assert upper.offset == max((i for i, t in enumerate(queue_times) if t <= probe), default=-1)
        finally:
            view.close()


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3)), min_size=1, max_size=60),
    probes=st.lists(st.integers(-5, 400), min_size=1, max_size=40),
)
def test_offsets_by_time_property(steps: list[tuple[int, int]], probes: list[int]) -> None:
    """OffsetsByTime's one pass (each search bounded by its neighbours' answers) agrees with
    brute force on queues with repeated and gapped store times, across file boundaries."""
    times = []
    clock = 1000
    for queue_id, gap in steps:
        clock += gap
        times.append((queue_id, clock))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sizes = _build_store(root, times)
        view = StoreView(str(root), sizes)
        try:
            edges = sorted(1000 + p for p in probes)
            for queue_id in (0, 1):
                queue_times = [t for q, t in times if q == queue_id]
                if not queue_times:
                    continue
                want = [next((i for i, t in enumerate(queue_times) if t >= edge), len(queue_times)) for edge in edges]
                assert view.offsets_by_time("T", queue_id, edges) == want
        finally:
            view.close()


def test_json_of_a_query_line(apache: QueryNode, capsys: pytest.CaptureFixture[str]) -> None:
    from rmqstore.cli.main import main

    line = MANIFEST[1]
    args = ["queryMsgByUniqueKey", "--endpoint", f"127.0.0.1:{apache.port}", "-t", line["storedTopic"], "-i", line["uniqKey"], "--json"]
    assert main(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert list(document) == [
        "commitLogOffset", "msgId", "topic", "queueId", "queueOffset", "storeTimestamp", "bornTimestamp",
        "bornHost", "storeHost", "keys", "tags", "uniqKey", "properties", "bodyLen", "bodySha256",
    ]
    assert (document["commitLogOffset"], document["keys"], document["bodySha256"]) == (
        line["commitLogOffset"], line["keys"], line["storedBodySha256"])


def _queue_times(topic: str, queue_id: int) -> list[int]:
    """A queue's store times in queue order, from Apache's own dumps of the fixture."""
    dump = {line["commitLogOffset"]: line["storeTimestamp"] for line in read_jsonl(FIXTURES / "store-clean-commitlog-dump.jsonl")}
    units = read_jsonl(FIXTURES / "store-clean-consumequeue-dump.jsonl")
    return [dump[u["commitLogOffset"]] for u in units if (u["topic"], u["queueId"]) == (topic, queue_id)]


def test_list_topics_gives_each_queues_newest_store_time(apache: QueryNode) -> None:
    listed = {t.name: t for t in apache.stub.ListTopics(query_pb2.ListQueryTopicsRequest()).topics}
    for queue in listed["TopicTest"].queues:
        assert queue.newest_store_timestamp_ms == _queue_times("TopicTest", queue.queue_id)[queue.max_offset - 1]


def test_offsets_by_time_count_each_interval_like_brute_force(apache: QueryNode) -> None:
    times = _queue_times("TopicTest", 3)
    first, last = min(times), max(times)
    step = max((last - first) // 7, 1)
    edges = [first + i * step for i in range(8)] + [last + 1]
    response = apache.stub.OffsetsByTime(query_pb2.OffsetsByTimeRequest(topic="TopicTest", queue_id=3, timestamps_ms=edges))
    assert list(response.offsets) == [next((i for i, t in enumerate(times) if t >= edge), len(times)) for edge in edges]
    assert response.offsets[0] == 0 and response.offsets[-1] == len(times)
    counts = [b - a for a, b in zip(response.offsets, response.offsets[1:])]
    assert sum(counts) == len(times) == 190


@pytest.mark.parametrize(
    ("timestamps", "message"),
    [
        ([], "give 1 to 20000 timestamps, got 0"),
        ([5, 4], "the timestamps must be in ascending order"),
        ([-1, 4], "timestamp -1 is negative"),
        (list(range(20_001)), "give 1 to 20000 timestamps, got 20001"),
    ],
)
def test_offsets_by_time_rejects_bad_timestamps(apache: QueryNode, timestamps: list[int], message: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        apache.stub.OffsetsByTime(query_pb2.OffsetsByTimeRequest(topic="TopicTest", queue_id=3, timestamps_ms=timestamps))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == message


def test_offsets_by_time_with_repeated_and_outside_times(apache: QueryNode) -> None:
    times = _queue_times("TopicTest", 0)
    first, last = min(times), max(times)
    middle = sorted(times)[len(times) // 2]
    edges = [0, first - 1, first, middle, middle, middle + 1, last, last + 1, 2**62]
    response = apache.stub.OffsetsByTime(query_pb2.OffsetsByTimeRequest(topic="TopicTest", queue_id=0, timestamps_ms=edges))
    assert list(response.offsets) == [next((i for i, t in enumerate(times) if t >= edge), len(times)) for edge in edges]


def test_time_search_follows_a_live_writer_exactly(tmp_path: Path) -> None:
    """A view searching between a writer's appends: LOWER and UPPER agree with the acks'
    store times at every time, its neighbours, before and after all, as the queue grows
    across consume queue and commit log files (a batch shares one store time: runs of
    equal times); the queue no message went to answers empty."""
    import bisect
    import time

    from rmqstore.common.message_rules import MessageInput
    from rmqstore.writer.config import WriterConfig
    from rmqstore.writer.store import Writer

    sizes = StoreSizes(commitlog_file_size_bytes=64 << 10, cq_file_units=8, index_slots=100, index_entries=400)
    writer = Writer(WriterConfig(store=str(tmp_path), sizes=sizes))
    writer.topics.create("T", 2)
    view = StoreView(str(tmp_path), sizes)
    acked: list[int] = []
    try:
        assert view.search_offset("T", 0, 5, Boundary.LOWER) == OffsetSearch(0, False)
        for batch in range(9):
            acks = writer.append([MessageInput("T", b"b" * 4000, queue_id=0)] * (1 + batch % 4))
            acked += [ack.store_timestamp_ms for ack in acks]
            if batch % 3:
                time.sleep(0.002)
            view.refresh(force=True)
            for probe in sorted({t + d for t in acked for d in (-1, 0, 1)} | {0, 2**62}):
                lower = bisect.bisect_left(acked, probe)
                upper = bisect.bisect_right(acked, probe) - 1
                assert view.search_offset("T", 0, probe, Boundary.LOWER) == OffsetSearch(lower, lower < len(acked))
                assert view.search_offset("T", 0, probe, Boundary.UPPER) == OffsetSearch(upper, upper >= 0)
            edges = [0, acked[0], acked[len(acked) // 2], acked[-1] + 1]
            assert view.offsets_by_time("T", 0, edges) == [bisect.bisect_left(acked, edge) for edge in edges]
            assert view.search_offset("T", 1, acked[0], Boundary.LOWER) == OffsetSearch(0, False)
            assert view.search_offset("T", 1, acked[0], Boundary.UPPER) == OffsetSearch(-1, False)
        assert len(view.log.files) > 1 and len(acked) > 2 * sizes.cq_file_units
    finally:
        view.close()
        writer.close()


def test_queue_times_follow_a_moving_visible_range(tmp_path: Path) -> None:
    """The time index of a queue as its visible range grows, shrinks (a writer restarted
    with less of the log) and loses its first units (retention): it holds exactly the
    store times of the range's units."""
    from rmqstore.query.timeindex import QueueTimes

    times = [(0, 1000 + n // 3) for n in range(23)]
    sizes = _build_store(tmp_path, times)
    log = CommitLog(str(tmp_path / "commitlog"), sizes.commitlog_file_size_bytes)
    queues = ConsumeQueueSet(str(tmp_path / "consumequeue"), sizes.cq_file_units)
    queue = queues.get("T", 0)
    index = QueueTimes()
    try:
        for low, high in [(0, 0), (0, 4), (0, 23), (0, 9), (0, 17), (6, 17), (6, 6), (11, 23), (2, 23), (23, 23)]:
            index.follow(queue, log, low, high)
            assert [index.at(offset) for offset in range(low, high)] == [t for _, t in times[low:high]]
            assert index.first_stored_after(low, high, 1004, False) == max(low, min(high, 12))
    finally:
        queues.close()
        log.close()


def test_a_point_lookup_never_makes_the_loop_wait_for_the_views_lock(apache: QueryNode) -> None:
    """While a thread holds the view's lock (a long Pull would), a point lookup the node
    answers on its event loop goes to a thread instead: Ping still answers at once, and
    the lookup answers once the lock is free."""
    import concurrent.futures
    import time

    line = MANIFEST[1]
    request = query_pb2.QueryByQueueOffsetRequest(topic=line["storedTopic"], queue_id=line["queueId"], queue_offset=line["queueOffset"])
    assert apache.stub.QueryByQueueOffset(request).message.uniq_key == line["uniqKey"]  # answered on the loop
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with apache.view.lock:
            pending = pool.submit(apache.stub.QueryByQueueOffset, request, timeout=30)
            time.sleep(0.3)
            assert not pending.done()
            started = time.monotonic()
            apache.stub.Ping(query_pb2.PingRequest(), timeout=10)
            assert time.monotonic() - started < 2.0  # the loop is free
        assert pending.result().message.uniq_key == line["uniqKey"]


_HOSTS = st.builds(
    SocketAddress,
    st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16)),
    st.integers(-(2**31), 2**31 - 1),
)
_INT32 = st.integers(-(2**31), 2**31 - 1)
_INT64 = st.integers(-(2**63), 2**63 - 1)
_RECORDS = st.builds(
    Record,
    topic=st.text(max_size=20),
    body=st.binary(max_size=40),
    properties=st.dictionaries(st.sampled_from(["KEYS", "TAGS", "UNIQ_KEY", "WAIT", "x"]), st.text(max_size=12), max_size=5),
    queue_id=_INT32,
    flag=_INT32,
    queue_offset=_INT64,
    commitlog_offset=_INT64,
    sys_flag=_INT32,
    born_timestamp_ms=_INT64,
    born_host=_HOSTS,
    store_timestamp_ms=_INT64,
    store_host=_HOSTS,
    reconsume_times=_INT32,
    prepared_transaction_offset=_INT64,
    body_crc=_INT32,
    size=_INT32,
)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(_RECORDS, max_size=6), shared_host=_HOSTS)
def test_an_answers_messages_are_the_bytes_of_every_field_given_plainly(records: list[Record], shared_host: SocketAddress) -> None:
    """The answers are made the cheap way (service.stored_fields: a host's texts once an
    answer, zero numbers left out, the properties filled after): the same bytes as an
    answer made from every field of each message given plainly, the properties too."""
    from rmqstore.common.codec.msgid import offset_msg_id
    from rmqstore.query.service import many_stored_fields, to_stored, with_properties
    from rmqstore.v1 import messages_pb2

    for record in records[::2]:  # records of one host share its SocketAddress, as decoded ones do
        record.store_host = record.born_host = shared_host

    def plainly(record: Record) -> dict[str, object]:
        return dict(
            topic=record.topic, queue_id=record.queue_id, queue_offset=record.queue_offset,
            commitlog_offset=record.commitlog_offset, size=record.size, store_timestamp_ms=record.store_timestamp_ms,
            born_timestamp_ms=record.born_timestamp_ms, born_host=record.born_host.java_text(),
            store_host=record.store_host.java_text(), sys_flag=record.sys_flag, flag=record.flag,
            body_crc=record.body_crc, reconsume_times=record.reconsume_times,
            prepared_transaction_offset=record.prepared_transaction_offset, keys=split_keys(record.keys),
            tags=record.tags or "", uniq_key=record.uniq_key or "", properties=record.properties, body=record.body,
            offset_msg_id=offset_msg_id(record.store_host, record.commitlog_offset),
        )  # fmt: skip

    for record in records:
        assert to_stored(record).SerializeToString() == messages_pb2.StoredMessage(**plainly(record)).SerializeToString()
    page = query_pb2.QueryByKeyResponse(messages=many_stored_fields(records), cursor="c", complete=True)
    with_properties(page.messages, records)
    expected = query_pb2.QueryByKeyResponse(messages=[plainly(record) for record in records], cursor="c", complete=True)
    assert page.SerializeToString() == expected.SerializeToString()
