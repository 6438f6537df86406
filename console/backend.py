"""What the console's pages show, as plain JSON-able data, fetched from a query node (and,
for the nodes page only, the writer) through rmqstore.v1 gRPC.

The query endpoint may be a proxy in front of several writer groups (cluster mode,
docs/cluster.md): there a queue is (broker name, queue id), every queue call names its
group, and an answer that lacks groups that did not answer says so (``unansweredGroups``,
never ``complete``). From a query node the broker name is empty and nothing changes.

Every page and its ``/api/`` twin are built from one function here, so the HTML and the
JSON cannot disagree. Bad input raises :class:`BadInput` before any call; a node's error
status is mapped to an HTTP status in one table (:data:`HTTP_STATUS`).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from rmqstore.client.shown import message_json, message_rows, pending_due_ms
from rmqstore.common import times
from rmqstore.common.codec import properties as props
from rmqstore.common.codec.consumequeue import SCHEDULE_TOPIC, TIMER_TOPIC
from rmqstore.common.codec.msgid import decode_offset_msg_id
from rmqstore.common.codec.topic import topic_problem
from rmqstore.common.errors import InvalidArgument
from rmqstore.v1 import (
    messages_pb2,
    query_pb2,
    query_pb2_grpc,
    writer_pb2,
    writer_pb2_grpc,
)

PAGE_SIZE_DEFAULT = 50
PAGE_SIZE_MAX = 1000
# A tag filter can empty whole pages of a key's matches: a console page reads at most this
# many node pages before it answers with what it has and a cursor to go on from.
FILTER_PAGES_MAX = 100
ID_LENGTH_MAX = 128
RATE_BUCKETS_MAX = 10_000
RATE_INTERVAL_MIN_MS = 1000
TOPICS_SPARK_BUCKETS = 12
TOPICS_SPARK_INTERVAL_MS = 5 * 60 * 1000
_HEX_ID = re.compile(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}")
_INTERVAL = re.compile(r"(\d+)(ms|s|m|h)?")
_INTERVAL_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1000}
_MS_MAX = 2**63 - 1
# The pending page looks at the scheduled records stored since this long ago: writer
# serve's default --timer-max-delay (Apache's 3 days), beyond which no timer is due, and
# more than the longest delay level (2 h). A writer with a longer --timer-max-delay may
# hold older pending timers, which the page does not list.
PENDING_LOOKBACK_MS = 3 * 24 * 3600 * 1000
RECALL_TAG = "_RECALL_TAG_"  # a recall's marker record (docs/format.md §16)
_BROKER_NAME = re.compile(r"[!-~]{1,127}")  # printable ASCII, no space


class ConsoleError(Exception):
    """An error the page shows inline, with the HTTP status it is served with."""

    status = 500

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadInput(ConsoleError):
    status = 400


class Missing(ConsoleError):
    status = 404


class NodeUnavailable(ConsoleError):
    status = 502


HTTP_STATUS: dict[grpc.StatusCode, type[ConsoleError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: BadInput,
    grpc.StatusCode.NOT_FOUND: Missing,
    grpc.StatusCode.OUT_OF_RANGE: Missing,
}


# What gRPC answers for a method the server does not serve, and the node an endpoint of the
# other kind is (a query endpoint given a writer's port, or the reverse).
METHOD_NOT_FOUND = "Method not found!"
OTHER_NODE = {"query node": "a writer", "writer": "a query node"}


def _from_rpc(error: grpc.RpcError, node: str) -> ConsoleError:
    # grpc ships no types: a failed call's error is also its Call, with code() and details().
    call: Any = error
    code: grpc.StatusCode = call.code()
    details: str = call.details() or ""
    if code == grpc.StatusCode.UNIMPLEMENTED and details == METHOD_NOT_FOUND:
        flag = "--query-endpoint" if node == "query node" else "--writer-endpoint"
        return NodeUnavailable(f"{flag} is not a {node}: it does not serve the {node}'s calls (is it {OTHER_NODE[node]}'s port?)")
    kind = HTTP_STATUS.get(code, NodeUnavailable)
    if kind is NodeUnavailable:
        return NodeUnavailable(f"the node answered {code.name}: {details}")
    return kind(details)


# Input parsing: every field a form or URL can carry.


def parse_time_ms(text: str, name: str) -> int | None:
    """A time in the one syntax every time argument takes (common/times.py); blank: none."""
    if not text.strip():
        return None
    try:
        return times.parse_time_ms(text)
    except InvalidArgument as error:
        raise BadInput(f"{name}: {error}") from None


def parse_int(text: str, name: str, low: int, high: int, default: int | None = None) -> int:
    text = text.strip()
    if not text and default is not None:
        return default
    if not re.fullmatch(r"-?\d+", text):
        raise BadInput(f"{name}: {text!r} is not a whole number")
    value = int(text)
    if not low <= value <= high:
        raise BadInput(f"{name}: {value} is outside [{low}, {high}]")
    return value


def parse_topic(text: str) -> str:
    topic = text.strip()
    if not topic:
        raise BadInput("topic: give a topic")
    problem = topic_problem(topic)
    if problem is not None:
        raise BadInput(f"topic: {problem}")
    return topic


def parse_range(begin_text: str, end_text: str) -> tuple[int | None, int | None]:
    begin = parse_time_ms(begin_text, "begin")
    end = parse_time_ms(end_text, "end")
    if begin is not None and end is not None and end < begin:
        raise BadInput(f"the range is reversed: end {times.iso_time(end)} is before begin {times.iso_time(begin)}")
    return begin, end


def parse_interval_ms(text: str) -> int:
    """``30s``, ``1m``, ``5m``, ``1h``, ``500ms`` or bare seconds."""
    match = _INTERVAL.fullmatch(text.strip() or "1m")
    if match is None:
        raise BadInput(f"interval: {text!r} is not a duration such as 30s, 1m, 5m or 1h")
    value = int(match.group(1)) * _INTERVAL_UNIT_MS[match.group(2)]
    if value < RATE_INTERVAL_MIN_MS:
        raise BadInput(f"interval: {text!r} is shorter than one second")
    return value


def tag_filter(text: str) -> Callable[[str], bool] | None:
    """RocketMQ's tag expression: ``*`` or blank for all, else tags joined by ``||``."""
    wanted = {part.strip() for part in text.split("||")} - {""}
    if not wanted or "*" in wanted:
        return None
    return lambda tags: tags in wanted


# Shapes of what the pages show.


# How much of a body a list shows.
BODY_PREVIEW_CHARS = 80
BODY_PREVIEW_HEX_BYTES = 24


def body_preview(body: bytes) -> str:
    """The start of a body on one line: its text, whitespace runs as one space, or, for a
    body that is not UTF-8 (its first bytes), hex; "…" where it goes on."""
    try:
        text = " ".join(body[: BODY_PREVIEW_CHARS * 4].decode("utf-8").split())
    except UnicodeDecodeError as error:
        if error.start < len(body[: BODY_PREVIEW_CHARS * 4]) - 3:  # not a character cut at the end
            shown = body[:BODY_PREVIEW_HEX_BYTES].hex(" ")
            return shown + (" …" if len(body) > BODY_PREVIEW_HEX_BYTES else "")
        text = " ".join(body[: error.start].decode("utf-8").split())
    cut = len(text) > BODY_PREVIEW_CHARS or len(body) > BODY_PREVIEW_CHARS * 4
    return text[:BODY_PREVIEW_CHARS] + ("…" if cut else "")


# A queue: (broker name, queue id); the broker name is empty from a query node.
Queue = tuple[str, int]


def summary(message: messages_pb2.StoredMessage, broker_name: str = "") -> dict[str, Any]:
    return {
        "msgId": message.offset_msg_id,
        "topic": message.topic,
        # The group holding the message when known (a queue read through a proxy); None otherwise.
        "brokerName": broker_name or None,
        "queueId": message.queue_id,
        "queueOffset": message.queue_offset,
        "storeTimestamp": message.store_timestamp_ms,
        "tags": message.tags or None,
        "keys": " ".join(message.keys) if message.keys else None,
        "uniqKey": message.uniq_key or None,
        "bodyLen": len(message.body),
        "bodyPreview": body_preview(message.body),
        # A delayed or timed message not released yet: when it will be (None otherwise).
        "pendingUntil": pending_due_ms(message),
    }


@dataclass(frozen=True)
class Endpoints:
    query: grpc.Channel
    writer: grpc.Channel | None
    timeout_s: float


class Backend:
    """The console's one client of the nodes; thread-safe (gRPC stubs are)."""

    def __init__(self, endpoints: Endpoints):
        self.query: Any = query_pb2_grpc.QueryServiceStub(endpoints.query)  # type: ignore[no-untyped-call]
        self.writer: Any = None
        if endpoints.writer is not None:
            self.writer = writer_pb2_grpc.WriterServiceStub(endpoints.writer)  # type: ignore[no-untyped-call]
        self.timeout_s = endpoints.timeout_s

    def _call(self, method: Callable[..., Any], request: Any, node: str = "query node") -> Any:
        try:
            return method(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            raise _from_rpc(error, node) from None

    def ping(self) -> None:
        self._call(self.query.Ping, query_pb2.PingRequest())

    # Topics

    def _listed(self) -> Any:
        return self._call(self.query.ListTopics, query_pb2.ListQueryTopicsRequest())

    def topics(self, now_ms: int) -> dict[str, Any]:
        answer = self._listed()
        listed = answer.topics
        spark_edges = [now_ms - (TOPICS_SPARK_BUCKETS - i) * TOPICS_SPARK_INTERVAL_MS for i in range(TOPICS_SPARK_BUCKETS + 1)]
        topics = []
        for topic in listed:
            queues = [
                {
                    "brokerName": q.broker_name or None,
                    "queueId": q.queue_id,
                    "minOffset": q.min_offset,
                    "maxOffset": q.max_offset,
                    "messages": q.max_offset - q.min_offset,
                    "newestStoreTimestamp": q.newest_store_timestamp_ms or None,
                }
                for q in topic.queues
            ]
            newest = [q["newestStoreTimestamp"] for q in queues if q["newestStoreTimestamp"]]
            topics.append(
                {
                    "name": topic.name,
                    "messages": sum(q["messages"] for q in queues),
                    "newestStoreTimestamp": max(newest) if newest else None,
                    "queues": queues,
                    "recentCounts": self._counts(topic.name, [(q.broker_name, q.queue_id) for q in topic.queues], spark_edges)[0],
                }
            )
        return {"topics": topics, "recentIntervalMs": TOPICS_SPARK_INTERVAL_MS, "recentEnd": now_ms,
                "unansweredGroups": list(answer.unanswered_groups)}  # fmt: skip

    def _topic_queues(self, topic: str) -> tuple[list[Queue], list[str]]:
        """The topic's queues, sorted, and the groups that did not answer (their queues are
        missing). A topic that only a silent group holds cannot be told from no topic."""
        answer = self._listed()
        for listed in answer.topics:
            if listed.name == topic:
                return sorted((q.broker_name, q.queue_id) for q in listed.queues), list(answer.unanswered_groups)
        missing = list(answer.unanswered_groups)
        if missing:
            raise Missing(f"topic {topic} is in no group that answered (did not answer: {', '.join(missing)})")
        raise Missing(f"topic {topic} does not exist in this store")

    def _counts(self, topic: str, queues: list[Queue], edges: list[int]) -> tuple[list[int], dict[Queue, list[int]]]:
        """Messages per interval [edges[i], edges[i+1]) for the topic and for each queue,
        from the first offset stored at or after each edge: no message is read."""
        per_queue: dict[Queue, list[int]] = {}
        for broker_name, queue_id in queues:
            request = query_pb2.OffsetsByTimeRequest(topic=topic, queue_id=queue_id, timestamps_ms=edges, broker_name=broker_name)
            offsets = list(self._call(self.query.OffsetsByTime, request).offsets)
            per_queue[(broker_name, queue_id)] = [later - earlier for earlier, later in itertools.pairwise(offsets)]
        total = [sum(column) for column in zip(*per_queue.values())] if per_queue else [0] * (len(edges) - 1)
        return total, per_queue

    # Rate

    def rate(self, params: dict[str, str], now_ms: int) -> dict[str, Any]:
        topic = parse_topic(params.get("topic", ""))
        interval_ms = parse_interval_ms(params.get("interval", ""))
        begin, end = parse_range(params.get("begin", ""), params.get("end", ""))
        end = now_ms if end is None else end
        begin = end - 3_600_000 if begin is None else begin
        if end <= begin:
            raise BadInput(f"the range is empty: end {times.iso_time(end)} is not after begin {times.iso_time(begin)}")
        buckets = -(-(end - begin) // interval_ms)
        if buckets > RATE_BUCKETS_MAX:
            raise BadInput(f"{buckets} intervals: at most {RATE_BUCKETS_MAX}; choose a longer interval or a shorter range")
        edges = [begin + i * interval_ms for i in range(buckets)] + [end]
        queues, unanswered = self._topic_queues(topic)
        total, per_queue = self._counts(topic, queues, edges)
        return {
            "topic": topic,
            "begin": begin,
            "end": end,
            "intervalMs": interval_ms,
            "starts": edges[:-1],
            "counts": total,
            "total": sum(total),
            "queues": [
                {"brokerName": broker or None, "queueId": q, "counts": counts, "total": sum(counts)}
                for (broker, q), counts in per_queue.items()
            ],
            "unansweredGroups": unanswered,
        }

    # Pending delayed and timed messages

    def pending(self, params: dict[str, str], now_ms: int) -> dict[str, Any]:
        """Scheduled records not due yet (rmq_sys_wheel_timer's timed messages, then
        SCHEDULE_TOPIC_XXXX's delay levels), stored within PENDING_LOOKBACK_MS, in queue
        order; the cursor is ``queue:offset`` over that list of queues (0 the timer queue, 1-18
        the levels). A recall seen in the same scan marks its message recalled (a recall's
        marker follows its message: one past the scan's end is not seen)."""
        page_size = parse_int(params.get("pageSize", ""), "pageSize", 1, PAGE_SIZE_MAX, PAGE_SIZE_DEFAULT)
        start_index, start_offset = _time_cursor(params.get("cursor", ""))
        listed = {t.name: {q.queue_id for q in t.queues} for t in self._call(self.query.ListTopics, query_pb2.ListQueryTopicsRequest()).topics}
        scheduled = [(TIMER_TOPIC, 0)] + [(SCHEDULE_TOPIC, level - 1) for level in range(1, 19)]
        found: list[tuple[messages_pb2.StoredMessage, int]] = []
        recalls: set[str] = set()
        next_cursor = ""
        pulls = 0
        for index, (topic, queue_id) in enumerate(scheduled):
            if index < start_index or queue_id not in listed.get(topic, set()):
                continue
            first = self._search_offset(topic, ("", queue_id), now_ms - PENDING_LOOKBACK_MS, query_pb2.BOUNDARY_LOWER).offset
            offset = max(first, start_offset) if index == start_index else first
            while not next_cursor:
                if len(found) >= page_size or pulls >= FILTER_PAGES_MAX:
                    next_cursor = f"{index}:{offset}"
                    break
                pulls += 1
                request = query_pb2.PullRequest(topic=topic, queue_id=queue_id, from_offset=offset, max_count=page_size)
                pulled = self._call(self.query.Pull, request)
                for message in pulled.messages:
                    if len(found) >= page_size:
                        next_cursor = f"{index}:{message.queue_offset}"
                        break
                    due = pending_due_ms(message)
                    if message.tags == RECALL_TAG:
                        recalls.add(message.properties.get(props.TIMER_DEL_UNIQKEY, ""))
                    elif due is not None and due > now_ms:
                        found.append((message, due))
                if next_cursor or not pulled.messages or pulled.next_offset <= offset:
                    break
                offset = pulled.next_offset
            if next_cursor:
                break
        rows = []
        for message, due in found:
            real_topic = message.properties.get(props.REAL_TOPIC, "")
            row = summary(message)
            row.update(
                realTopic=real_topic,
                dueAt=due,
                delayLevel=message.queue_id + 1 if message.topic == SCHEDULE_TOPIC else None,
                recalled=f"{real_topic}+{message.uniq_key}" in recalls,
            )
            rows.append(row)
        return {"messages": rows, "cursor": next_cursor, "complete": not next_cursor, "now": now_ms}

    # Search

    def search(self, params: dict[str, str]) -> dict[str, Any]:
        mode = params.get("mode", "")
        handlers: dict[str, Callable[[dict[str, str]], dict[str, Any]]] = {
            "time": self._by_time,
            "key": self._by_key,
            "id": self._by_id,
            "offset": self._by_offset,
            "timeoffset": self._time_offset,
        }
        if mode not in handlers:
            raise BadInput(f"mode: {mode!r} is not one of {', '.join(handlers)}")
        return {"mode": mode, **handlers[mode](params)}

    def _by_key(self, params: dict[str, str]) -> dict[str, Any]:
        topic = parse_topic(params.get("topic", ""))
        key = params.get("key", "").strip()
        if not key:
            raise BadInput("key: give a key")
        if " " in key:
            raise BadInput("key: a key holds no space (KEYS are split on spaces)")
        begin, end = parse_range(params.get("begin", ""), params.get("end", ""))
        page_size = parse_int(params.get("pageSize", ""), "pageSize", 1, PAGE_SIZE_MAX, PAGE_SIZE_DEFAULT)
        keep = tag_filter(params.get("tag", ""))
        cursor = params.get("cursor", "")
        found: list[messages_pb2.StoredMessage] = []
        complete = False
        unanswered: set[str] = set()
        for _ in range(FILTER_PAGES_MAX):
            request = query_pb2.QueryByKeyRequest(topic=topic, key=key, page_size=page_size, cursor=cursor)
            if begin is not None:
                request.begin_ms = begin
            if end is not None:
                request.end_ms = end
            response = self._call(self.query.QueryByKey, request)
            found += [m for m in response.messages if keep is None or keep(m.tags)]
            cursor, complete = response.cursor, response.complete
            unanswered.update(response.unanswered_groups)
            if complete or len(found) >= page_size:
                break
        if not found and not params.get("cursor"):
            self._topic_queues(topic)  # an unknown topic says so, rather than "no match"
        return {"messages": [summary(m) for m in found], "cursor": "" if complete else cursor, "complete": complete,
                "unansweredGroups": sorted(unanswered)}  # fmt: skip

    def _by_time(self, params: dict[str, str]) -> dict[str, Any]:
        """A topic's messages stored in [begin, end], queue by queue, in queue order; the
        cursor is ``queue:offset`` (``broker/queue:offset`` through a proxy), where the next
        page starts."""
        topic = parse_topic(params.get("topic", ""))
        begin, end = parse_range(params.get("begin", ""), params.get("end", ""))
        if begin is None or end is None:
            raise BadInput("a time search needs both begin and end")
        page_size = parse_int(params.get("pageSize", ""), "pageSize", 1, PAGE_SIZE_MAX, PAGE_SIZE_DEFAULT)
        keep = tag_filter(params.get("tag", ""))
        start_queue, start_offset = _queue_cursor(params.get("cursor", ""))
        queues, unanswered = self._topic_queues(topic)
        found: list[tuple[messages_pb2.StoredMessage, str]] = []
        in_range = 0
        next_cursor = ""
        for queue in queues:
            broker_name, queue_id = queue
            first = self._search_offset(topic, queue, begin, query_pb2.BOUNDARY_LOWER).offset
            last = self._search_offset(topic, queue, end, query_pb2.BOUNDARY_UPPER).offset
            in_range += max(last - first + 1, 0)
            if queue < start_queue or next_cursor:
                continue
            offset = max(first, start_offset) if queue == start_queue else first
            for _ in range(FILTER_PAGES_MAX):
                if offset > last:
                    break
                if len(found) >= page_size:
                    next_cursor = _time_cursor_text(queue, offset)
                    break
                want = min(page_size - len(found), last - offset + 1)
                request = query_pb2.PullRequest(topic=topic, queue_id=queue_id, from_offset=offset, max_count=want, broker_name=broker_name)
                pulled = self._call(self.query.Pull, request)
                if not pulled.messages:
                    break
                found += [(m, broker_name) for m in pulled.messages if keep is None or keep(m.tags)]
                offset = pulled.next_offset
            else:
                next_cursor = _time_cursor_text(queue, offset)
        return {
            "messages": [summary(m, broker_name) for m, broker_name in found],
            "cursor": next_cursor,
            "complete": not next_cursor and not unanswered,
            "inRange": in_range,
            "unansweredGroups": unanswered,
        }

    def _search_offset(self, topic: str, queue: Queue, timestamp_ms: int, boundary: int) -> Any:
        request = query_pb2.SearchOffsetRequest(
            topic=topic, queue_id=queue[1], timestamp_ms=timestamp_ms, boundary=boundary, broker_name=queue[0]  # type: ignore[arg-type]
        )
        return self._call(self.query.SearchOffset, request)

    def _by_id(self, params: dict[str, str]) -> dict[str, Any]:
        """An offsetMsgId and a UNIQ_KEY can look alike (32 hex characters each for IPv4):
        a hex id of either length is looked up both ways, anything else as a UNIQ_KEY."""
        msg_id = params.get("id", "").strip()
        if not msg_id:
            raise BadInput("id: give an offsetMsgId or a UNIQ_KEY")
        if len(msg_id) > ID_LENGTH_MAX or not msg_id.isprintable() or " " in msg_id:
            raise BadInput(f"id: {msg_id[:ID_LENGTH_MAX]!r} is not a message id (printable, no spaces, at most {ID_LENGTH_MAX} characters)")
        topic_text = params.get("topic", "").strip()
        matches: list[dict[str, Any]] = []
        if _HEX_ID.fullmatch(msg_id):
            try:
                found = self._call(self.query.QueryByMsgId, query_pb2.QueryByMsgIdRequest(msg_id=msg_id)).message
            except (Missing, BadInput):
                found = None
            if found is not None and found.offset_msg_id.upper() == msg_id.upper():
                matches.append({**summary(found), "matchedAs": "offsetMsgId"})
        unanswered: set[str] = set()
        if topic_text:
            topics = [parse_topic(topic_text)]
            unanswered.update(self._topic_queues(topics[0])[1])
        else:
            listed = self._listed()
            topics = [t.name for t in listed.topics]
            unanswered.update(listed.unanswered_groups)
        for topic in topics:
            response = self._call(self.query.QueryByUniqKey, query_pb2.QueryByUniqKeyRequest(topic=topic, uniq_key=msg_id))
            matches += [{**summary(m), "matchedAs": "UNIQ_KEY"} for m in response.messages]
            unanswered.update(response.unanswered_groups)
        if not matches:
            where = f"topic {topic_text}" if topic_text else "any topic"
            silent = f" (groups that did not answer: {', '.join(sorted(unanswered))})" if unanswered else ""
            raise Missing(f"no message has id {msg_id} in {where}{silent}")
        return {"messages": matches, "complete": not unanswered, "cursor": "", "unansweredGroups": sorted(unanswered)}

    def _by_offset(self, params: dict[str, str]) -> dict[str, Any]:
        topic = parse_topic(params.get("topic", ""))
        queue_id = parse_int(params.get("queue", ""), "queue", 0, 2**31 - 1)
        offset = parse_int(params.get("offset", ""), "offset", 0, _MS_MAX)
        broker_name = parse_broker(params.get("broker", ""))
        request = query_pb2.QueryByQueueOffsetRequest(topic=topic, queue_id=queue_id, queue_offset=offset, broker_name=broker_name)
        found = self._call(self.query.QueryByQueueOffset, request).message
        return {"messages": [summary(found, broker_name)], "complete": True, "cursor": ""}

    def _time_offset(self, params: dict[str, str]) -> dict[str, Any]:
        topic = parse_topic(params.get("topic", ""))
        queue_id = parse_int(params.get("queue", ""), "queue", 0, 2**31 - 1)
        timestamp = parse_time_ms(params.get("timestamp", ""), "timestamp")
        if timestamp is None:
            raise BadInput("timestamp: give a time")
        boundary = params.get("boundary", "LOWER").strip().upper() or "LOWER"
        if boundary not in ("LOWER", "UPPER"):
            raise BadInput(f"boundary: {boundary!r} is neither LOWER nor UPPER")
        code = query_pb2.BOUNDARY_UPPER if boundary == "UPPER" else query_pb2.BOUNDARY_LOWER
        broker_name = parse_broker(params.get("broker", ""))
        result = self._search_offset(topic, (broker_name, queue_id), timestamp, code)
        return {"topic": topic, "brokerName": broker_name or None, "queueId": queue_id, "timestamp": timestamp,
                "boundary": boundary, "offset": result.offset, "found": result.found}  # fmt: skip

    # Message detail

    def message(self, params: dict[str, str]) -> tuple[dict[str, Any], messages_pb2.StoredMessage]:
        """The message by offsetMsgId (``id``) or by ``topic``, ``queue``, ``offset`` (and
        ``broker``, the group, through a proxy fronting several)."""
        msg_id = params.get("id", "").strip()
        broker_name = parse_broker(params.get("broker", ""))
        if msg_id:
            if not _HEX_ID.fullmatch(msg_id):
                raise BadInput(f"id: {msg_id[:ID_LENGTH_MAX]!r} is not an offsetMsgId (32 or 56 hex characters)")
            found = self._call(self.query.QueryByMsgId, query_pb2.QueryByMsgIdRequest(msg_id=msg_id)).message
            if not broker_name:
                broker_name = self._group_of(found)
        else:
            topic = parse_topic(params.get("topic", ""))
            queue_id = parse_int(params.get("queue", ""), "queue", 0, 2**31 - 1)
            offset = parse_int(params.get("offset", ""), "offset", 0, _MS_MAX)
            request = query_pb2.QueryByQueueOffsetRequest(topic=topic, queue_id=queue_id, queue_offset=offset, broker_name=broker_name)
            found = self._call(self.query.QueryByQueueOffset, request).message
        bounds_request = query_pb2.QueueBoundsRequest(topic=found.topic, queue_id=found.queue_id, broker_name=broker_name)
        bounds = self._call(self.query.QueueBounds, bounds_request)
        try:
            decoded = decode_offset_msg_id(found.offset_msg_id)
        except InvalidArgument:
            decoded = None
        detail = {
            "brokerName": broker_name or None,
            "message": message_json(found, with_body=True),
            "fields": [[label.rstrip(":"), value] for label, value in message_rows(found)],
            "msgIdDecoded": None if decoded is None else {
                "storeHost": decoded.store_host.java_text(), "commitLogOffset": decoded.commitlog_offset,
            },
            "previousOffset": found.queue_offset - 1 if found.queue_offset - 1 >= bounds.min_offset else None,
            "nextOffset": found.queue_offset + 1 if found.queue_offset + 1 < bounds.max_offset else None,
        }  # fmt: skip
        return detail, found

    def _group_of(self, found: messages_pb2.StoredMessage) -> str:
        """The group (broker name) of a message found by id: the one whose queue holds it at
        its offset. Empty from a query node (its queues carry no broker name)."""
        queues, _ = self._topic_queues(found.topic)
        for broker_name, queue_id in queues:
            if not broker_name or queue_id != found.queue_id:
                continue
            request = query_pb2.QueryByQueueOffsetRequest(
                topic=found.topic, queue_id=queue_id, queue_offset=found.queue_offset, broker_name=broker_name
            )
            try:
                there = self._call(self.query.QueryByQueueOffset, request).message
            except Missing:
                continue
            if there.offset_msg_id == found.offset_msg_id:
                return broker_name
        return ""

    # Consumer groups

    def groups(self, params: dict[str, str]) -> dict[str, Any]:
        """Without ``group``: every group of the store's consumerOffset.json and its total
        lag. With it: the group's rows (only ``topic``'s when given), as consumerProgress
        prints them. The query node checks the names (400) and knows the groups (404)."""
        group = params.get("group", "").strip()
        if not group:
            answer = self._call(self.query.ListGroups, query_pb2.ListGroupsRequest())
            shown = {"groups": [{"group": g.group, "topics": list(g.topics), "diffTotal": g.lag_total} for g in answer.groups]}
            return shown | _unanswered(answer)
        request = query_pb2.GroupLagRequest(group=group, topic=params.get("topic", "").strip())
        lag = self._call(self.query.GroupLag, request)
        queues = [
            {
                "topic": q.topic,
                # Through a proxy only: the group holding the queue.
                **({"brokerName": q.broker_name} if q.broker_name else {}),
                "queueId": q.queue_id,
                "brokerOffset": q.broker_offset,
                "consumerOffset": q.consumer_offset,
                "diff": q.lag,
                # The group would skip what the queue receives up to its offset (the writer corrects it at start).
                "pastEnd": q.consumer_offset > q.broker_offset,
            }
            for q in lag.queues
        ]
        return {"group": lag.group, "brokerName": lag.broker_name, "queues": queues, "diffTotal": lag.lag_total} | _unanswered(lag)

    # Nodes

    def nodes(self) -> dict[str, Any]:
        try:
            stats = self.query.Stats(query_pb2.StatsRequest(), timeout=self.timeout_s)
        except grpc.RpcError as error:
            call: Any = error
            if call.code() == grpc.StatusCode.UNIMPLEMENTED and call.details() != METHOD_NOT_FOUND:
                proxy = self._proxy_groups()
                return {"query": None, "proxy": proxy, "writer": self._writer_status(), "unansweredGroups": proxy["unansweredGroups"]}
            raise _from_rpc(error, "query node") from None
        query = {
            "store": stats.store,
            "commitlogMinOffset": stats.commitlog_min_offset,
            "visibleOffset": stats.visible_offset,
            "publishedOffset": stats.published_offset,
            "lagBytes": stats.lag_bytes,
            "refreshedAgoMs": round(stats.refreshed_ago_ms, 3),
            "messages": stats.messages,
            "commitlogFiles": stats.commitlog_files,
            "indexFiles": stats.index_files,
            "followsWriter": stats.follows_writer,
        }
        return {"query": query, "proxy": None, "writer": self._writer_status()}

    def _proxy_groups(self) -> dict[str, Any]:
        """What a proxy tells of its writer groups: Stats describes one store, so a proxy
        does not serve it; the groups are the broker names its topics' queues carry and
        the ones that did not answer (a group holding no topic yet is not seen)."""
        answer = self._listed()
        queues: dict[str, int] = {}
        for topic in answer.topics:
            for q in topic.queues:
                queues[q.broker_name] = queues.get(q.broker_name, 0) + 1
        groups = [{"name": name, "answered": True, "queues": count} for name, count in sorted(queues.items())]
        groups += [{"name": name, "answered": False, "queues": None} for name in sorted(answer.unanswered_groups)]
        return {"groups": groups, "unansweredGroups": list(answer.unanswered_groups)}

    def _writer_status(self) -> dict[str, Any] | None:
        writer: dict[str, Any] | None = None
        if self.writer is not None:
            try:
                status = self._call(self.writer.Status, writer_pb2.StatusRequest(), node="writer")
                writer = {
                    "store": status.store,
                    "commitlogMinOffset": status.commitlog_min_offset,
                    "commitlogMaxOffset": status.commitlog_max_offset,
                    "dispatchedOffset": status.dispatched_offset,
                    "flushedOffset": status.flushed_offset,
                    "flushPolicy": status.flush_policy,
                    "diskUsedRatio": round(status.disk_used_ratio, 4),
                    "queues": len(status.queues),
                }
            except ConsoleError as error:
                writer = {"error": error.message}
        return writer


def _unanswered(answer: Any) -> dict[str, list[str]]:
    """The groups page's answers keep their shape from a query node; through a proxy
    they add the groups that did not answer."""
    return {"unansweredGroups": list(answer.unanswered_groups)} if answer.unanswered_groups else {}


def parse_broker(text: str) -> str:
    """A writer group's broker name (through a proxy); blank: none, as from a query node."""
    broker_name = text.strip()
    if broker_name and not _BROKER_NAME.fullmatch(broker_name):
        raise BadInput(f"broker: {broker_name[:64]!r} is not a broker name (printable, no spaces, at most 127 characters)")
    return broker_name


def _time_cursor(cursor: str) -> tuple[int, int]:
    if not cursor:
        return 0, 0
    match = re.fullmatch(r"(\d{1,10}):(\d{1,19})", cursor)
    if match is None:
        raise BadInput(f"cursor: {cursor[:64]!r} is not a time search cursor")
    return int(match.group(1)), int(match.group(2))


def _queue_cursor(cursor: str) -> tuple[Queue, int]:
    if not cursor:
        return ("", 0), 0
    match = re.fullmatch(r"(?:([!-~]{1,127})/)?(\d{1,10}):(\d{1,19})", cursor)
    if match is None:
        raise BadInput(f"cursor: {cursor[:64]!r} is not a time search cursor")
    return (match.group(1) or "", int(match.group(2))), int(match.group(3))


def _time_cursor_text(queue: Queue, offset: int) -> str:
    broker_name, queue_id = queue
    return f"{broker_name}/{queue_id}:{offset}" if broker_name else f"{queue_id}:{offset}"


def body_views(body: bytes) -> dict[str, str | None]:
    """The body as text (if it is UTF-8), as pretty JSON (if it parses), and as hex."""
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    pretty = None
    if text is not None:
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = None
    hex_rows = "\n".join(
        f"{i:08x}  {body[i:i + 16].hex(' '):<47}  " + "".join(chr(b) if 32 <= b < 127 else "." for b in body[i:i + 16])
        for i in range(0, len(body), 16)
    )
    return {"text": text, "json": pretty, "hex": hex_rows, "base64": base64.b64encode(body).decode()}
