"""The web console (rmqstore console) on a real writer and query node, over HTTP and in a
real headless Chromium (Debian's chromium and chromium-driver, driven by Selenium).

One store per module: known messages in three time groups (so a time range has exact
answers), hostile content in every field a message carries, and invalid UTF-8 patched
into a stored tag and property value (gRPC strings cannot carry it; Apache's broker
stores whatever bytes a client sent).
"""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.cli import quiet_env
from support.http import HTTP_TIMEOUT_S, get
from support.nodes import Nodes, ProcessNode, rss_bytes, send_all
from support.wait import clock_past, wait_until

from rmqstore.common.files.consumer_offsets import write_offsets
from rmqstore.v1 import messages_pb2, query_pb2

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = Path(os.environ.get("RMQSTORE_SCREENSHOTS", ROOT / "test-screenshots"))
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOPIC = "Orders"
HOSTILE_TOPIC = "Hostile"
KEY = "order-1"
# Three groups: two of three messages carry KEY, so it matches 72, past RocketMQ's cap of 64.
GROUP_SIZE = 36
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(2)>'
IMG_NO_SPACE = '"><img/src=x/onerror=alert(3)>'
# Same length as what replaces them in the commit log: the record keeps its layout.
TAG_PLACEHOLDER = b"TAGNOTUTF8X"
KEY_PLACEHOLDER = b"KEYNOTUTF8X"
KEY_INVALID = b"key\xed\xa0\x80\xffxxxx"
TAG_INVALID = b"tag\xff\xfe\xc3(badd"
PROP_PLACEHOLDER = b"PROPNOTUTF8"
PROP_INVALID = b"prop\xc3\x28\xa0\xa1xyz"
BODY_INVALID = SCRIPT.encode() + b" \xff\xfe\x80 " + IMG.encode()
TIME_SYNTAX = (
    "give epoch milliseconds, ISO 8601 (2026-11-29T04:12:00Z; UTC without a zone) "
    "or mqadmin's yyyy-MM-dd#HH:mm:ss:SSS (local time)"
)
CSP = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"


@dataclass
class Store:
    root: Path
    query_endpoint: str
    writer_endpoint: str
    console: ProcessNode
    acks: dict[str, list[messages_pb2.SendResult]] = field(default_factory=dict)
    sent: dict[str, list[messages_pb2.Message]] = field(default_factory=dict)
    window: tuple[int, int] = (0, 0)
    query: Any = None

    @property
    def url(self) -> str:
        return self.console.url


def _orders(group: int, count: int) -> list[messages_pb2.Message]:
    messages = []
    for i in range(count):
        keys = [KEY, f"o-{group}-{i}"] if i % 3 != 2 else [f"o-{group}-{i}"]
        messages.append(
            messages_pb2.Message(
                topic=TOPIC, queue_id=i % 4, keys=keys, tags="paid" if i % 2 else "created",
                body=json.dumps({"group": group, "i": i}).encode(), properties={"group": str(group)},
            )
        )  # fmt: skip
    return messages


def _hostile() -> list[messages_pb2.Message]:
    return [
        messages_pb2.Message(
            topic=HOSTILE_TOPIC, queue_id=0, keys=[SCRIPT.replace(" ", ""), IMG_NO_SPACE], tags=SCRIPT,
            properties={"evil": IMG, SCRIPT: "name"}, body=BODY_INVALID,
        ),
        messages_pb2.Message(
            topic=HOSTILE_TOPIC, queue_id=0, keys=["patched", KEY_PLACEHOLDER.decode()], tags=TAG_PLACEHOLDER.decode(),
            properties={"patched": PROP_PLACEHOLDER.decode()}, body=b"patched",
        ),
    ]  # fmt: skip


def _patch_commitlog(root: Path, placeholder: bytes, replacement: bytes) -> None:
    assert len(placeholder) == len(replacement)
    (log,) = sorted((root / "commitlog").iterdir())[:1]
    with open(log, "r+b") as handle:
        data = handle.read()
        at = data.find(placeholder)
        assert at > 0 and data.find(placeholder, at + 1) == -1, placeholder
        handle.seek(at)
        handle.write(replacement)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    base = tmp_path_factory.mktemp("console")
    (base / "logs").mkdir()
    nodes = Nodes(base / "logs")
    try:
        root = base / "store"
        writer = nodes.start("writer", root)
        query_node = nodes.start("query", root)
        writer_stub = nodes.writer(writer)
        acks: list[messages_pb2.SendResult] = []
        sent: list[messages_pb2.Message] = []
        groups = []
        for group in range(3):
            messages = _orders(group, GROUP_SIZE)
            groups.append(send_all(writer_stub, messages, batch=8))
            acks += groups[-1]
            sent += messages
            clock_past(acks[-1].store_timestamp_ms)  # the groups' store times do not overlap
        hostile = _hostile()
        hostile_acks = send_all(writer_stub, hostile)
        _patch_commitlog(root, TAG_PLACEHOLDER, TAG_INVALID)
        _patch_commitlog(root, PROP_PLACEHOLDER, PROP_INVALID)
        _patch_commitlog(root, KEY_PLACEHOLDER, KEY_INVALID)
        console = nodes.console("--query-endpoint", query_node.endpoint, "--writer-endpoint", writer.endpoint)
        middle = [a.store_timestamp_ms for a in groups[1]]
        assert max(a.store_timestamp_ms for a in groups[0]) < min(middle) and max(middle) < min(a.store_timestamp_ms for a in groups[2])
        yield Store(
            root, query_node.endpoint, writer.endpoint, console,
            acks={TOPIC: acks, HOSTILE_TOPIC: hostile_acks}, sent={TOPIC: sent, HOSTILE_TOPIC: hostile},
            window=(min(middle), max(middle)), query=nodes.query(query_node),
        )  # fmt: skip
    finally:
        nodes.close()


def api(store: Store, name: str, **params: object) -> tuple[int, Any]:
    status, _, body = get(f"{store.url}/api/{name}?{urllib.parse.urlencode(params)}")
    return status, json.loads(body)


def _with_key(store: Store, begin: int, end: int, tags: set[str]) -> list[str]:
    """offsetMsgIds of the sent Orders messages with KEY, stored in [begin, end], tag in tags, newest first."""
    chosen = [
        (ack.commitlog_offset, ack.offset_msg_id)
        for message, ack in zip(store.sent[TOPIC], store.acks[TOPIC])
        if KEY in message.keys and begin <= ack.store_timestamp_ms <= end and message.tags in tags
    ]
    return [msg_id for _, msg_id in sorted(chosen, reverse=True)]


# The JSON API and the pages over HTTP


def test_topics_api_lists_every_topic_with_the_stores_counts(store: Store) -> None:
    status, data = api(store, "topics")
    assert status == 200
    listed = {t.name: t for t in store.query.ListTopics(query_pb2.ListQueryTopicsRequest()).topics}
    assert [t["name"] for t in data["topics"]] == sorted(listed) == [HOSTILE_TOPIC, TOPIC]
    for topic in data["topics"]:
        assert topic["messages"] == len(store.sent[topic["name"]])
        assert topic["newestStoreTimestamp"] == max(a.store_timestamp_ms for a in store.acks[topic["name"]])
        assert [(q["queueId"], q["minOffset"], q["maxOffset"]) for q in topic["queues"]] == [
            (q.queue_id, q.min_offset, q.max_offset) for q in listed[topic["name"]].queues
        ]
        assert sum(topic["recentCounts"]) == len(store.sent[topic["name"]])


def test_key_search_with_time_range_and_tag_pages_to_the_exact_answer(store: Store) -> None:
    begin, end = store.window
    want = _with_key(store, begin, end, {"paid"})
    assert len(want) == 12
    got: list[str] = []
    cursor = ""
    pages = 0
    for _ in range(20):
        status, data = api(store, "search", mode="key", topic=TOPIC, key=KEY, begin=begin, end=end, tag="paid", pageSize=3, cursor=cursor)
        assert status == 200
        pages += 1
        got += [m["msgId"] for m in data["messages"]]
        assert all(m["tags"] == "paid" for m in data["messages"])
        if data["complete"]:
            assert data["cursor"] == ""
            break
        cursor = data["cursor"]
    assert got == want and pages >= 3
    status, whole = api(store, "search", mode="key", topic=TOPIC, key=KEY, pageSize=1000)
    assert (status, whole["complete"]) == (200, True)
    assert [m["msgId"] for m in whole["messages"]] == _with_key(store, 0, 2**62, {"paid", "created"})
    assert len(whole["messages"]) == 72  # no cap at 64


def test_time_search_pages_every_queue_in_the_range(store: Store) -> None:
    begin, end = store.window
    want = sorted(
        (ack.queue_id, ack.queue_offset) for ack in store.acks[TOPIC] if begin <= ack.store_timestamp_ms <= end
    )
    got: list[tuple[int, int]] = []
    cursor = ""
    for _ in range(20):
        status, data = api(store, "search", mode="time", topic=TOPIC, begin=begin, end=end, pageSize=5, cursor=cursor)
        assert status == 200 and data["inRange"] == len(want) == GROUP_SIZE
        got += [(m["queueId"], m["queueOffset"]) for m in data["messages"]]
        if data["complete"]:
            break
        cursor = data["cursor"]
    assert got == want


def _spellings(epoch_ms: int) -> list[str]:
    """One time written every way a time input takes it (common/times.py)."""
    utc = dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC)
    local = utc.astimezone()
    return [
        str(epoch_ms),
        utc.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        utc.replace(tzinfo=None).isoformat(timespec="milliseconds"),
        utc.astimezone(dt.timezone(dt.timedelta(hours=-5))).isoformat(timespec="milliseconds"),
        local.strftime("%Y-%m-%d#%H:%M:%S:") + f"{epoch_ms % 1000:03d}",
    ]


def test_time_inputs_take_the_one_syntax_and_pages_show_and_link_iso_8601(store: Store) -> None:
    begin, end = store.window
    _, want = api(store, "search", mode="time", topic=TOPIC, begin=begin, end=end, pageSize=1000)
    _, lower = api(store, "search", mode="timeoffset", topic=TOPIC, queue=0, timestamp=end, boundary="UPPER")
    for begin_text, end_text in zip(_spellings(begin), _spellings(end)):
        assert api(store, "search", mode="time", topic=TOPIC, begin=begin_text, end=end_text, pageSize=1000) == (200, want)
        status, data = api(store, "search", mode="timeoffset", topic=TOPIC, queue=0, timestamp=end_text, boundary="UPPER")
        assert (status, data["offset"]) == (200, lower["offset"])
    # JSON keeps epoch ms; a page shows ISO 8601 and links with it.
    assert want["messages"][0]["storeTimestamp"] == min(a.store_timestamp_ms for a in store.acks[TOPIC] if begin <= a.store_timestamp_ms)
    newest = max(a.store_timestamp_ms for a in store.acks[TOPIC])
    status, _, page = get(store.url + "/topics")
    html = page.decode()
    iso_newest = dt.datetime.fromtimestamp(newest / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    iso_hour_before = dt.datetime.fromtimestamp((newest - 3_600_000) / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    link = (f"/search?mode=time&amp;topic={TOPIC}&amp;begin={urllib.parse.quote(iso_hour_before)}"
            f"&amp;end={urllib.parse.quote(iso_newest)}")  # fmt: skip
    assert status == 200 and f"<td>{iso_newest}</td>" in html and link in html
    status, _, page = get(store.url + link.replace("&amp;", "&"))
    assert status == 200 and f'value="{iso_newest}"' in page.decode()


def test_id_search_recognises_offset_msg_id_and_uniq_key(store: Store) -> None:
    ack = store.acks[TOPIC][5]
    status, data = api(store, "search", mode="id", id=ack.offset_msg_id)
    assert status == 200
    assert [(m["msgId"], m["matchedAs"]) for m in data["messages"]] == [(ack.offset_msg_id, "offsetMsgId")]
    for topic in ("", TOPIC):
        status, data = api(store, "search", mode="id", id=ack.uniq_key, topic=topic)
        assert status == 200
        assert [(m["msgId"], m["uniqKey"], m["matchedAs"]) for m in data["messages"]] == [(ack.offset_msg_id, ack.uniq_key, "UNIQ_KEY")]
    status, data = api(store, "search", mode="id", id=ack.uniq_key, topic=HOSTILE_TOPIC)
    assert (status, data) == (404, {"error": f"no message has id {ack.uniq_key} in topic {HOSTILE_TOPIC}"})


def test_message_api_equals_query_msg_by_id_json(store: Store) -> None:
    ack = store.acks[TOPIC][7]
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "queryMsgById", "--endpoint", store.query_endpoint, "-i", ack.offset_msg_id,
         "--json", "--body"],
        check=False, capture_output=True, text=True, timeout=60, env=quiet_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    status, data = api(store, "message", id=ack.offset_msg_id)
    assert status == 200
    assert data["message"] == json.loads(done.stdout)
    fields = dict(data["fields"])
    assert fields["OffsetID"] == ack.offset_msg_id and fields["Topic"] == TOPIC
    assert data["msgIdDecoded"] == {"storeHost": fields["Store Host"], "commitLogOffset": ack.commitlog_offset}
    assert (data["previousOffset"], data["nextOffset"]) == (ack.queue_offset - 1, ack.queue_offset + 1)
    status, by_offset = api(store, "message", topic=TOPIC, queue=ack.queue_id, offset=ack.queue_offset)
    assert (status, by_offset) == (200, data)


def test_rate_counts_sum_to_the_ranges_messages(store: Store) -> None:
    begin, end = store.window
    status, data = api(store, "rate", topic=TOPIC, begin=begin - 5000, end=end + 1, interval="1s")
    assert status == 200
    want = sum(1 for a in store.acks[TOPIC] if begin - 5000 <= a.store_timestamp_ms < end + 1)
    assert data["total"] == sum(data["counts"]) == want
    assert sum(q["total"] for q in data["queues"]) == want
    assert len(data["counts"]) == len(data["starts"]) == 6


def test_time_to_offset_lower_and_upper(store: Store) -> None:
    begin, end = store.window
    acks = sorted((a.queue_offset, a.store_timestamp_ms) for a in store.acks[TOPIC] if a.queue_id == 1)
    for boundary, time_ms in (("LOWER", begin), ("UPPER", end), ("lower", end + 1), ("UPPER", 1)):
        status, data = api(store, "search", mode="timeoffset", topic=TOPIC, queue=1, timestamp=time_ms, boundary=boundary)
        assert status == 200
        if boundary.upper() == "LOWER":
            want = next((o for o, t in acks if t >= time_ms), len(acks))
        else:
            want = max((o for o, t in acks if t <= time_ms), default=-1)
        assert (data["boundary"], data["offset"], data["found"]) == (boundary.upper(), want, 0 <= want < len(acks))
    status, _, page = get(f"{store.url}/search?mode=timeoffset&topic={TOPIC}&queue=1&timestamp={begin}&boundary=LOWER")
    want = next(o for o, t in acks if t >= begin)
    assert status == 200 and f'<strong class="offset">{want}</strong>' in page.decode()
    assert f'href="/message?topic={TOPIC}&amp;queue=1&amp;offset={want}"' in page.decode()


def test_detail_shows_the_body_as_pretty_json_and_hex(store: Store) -> None:
    ack = store.acks[TOPIC][4]
    body = store.sent[TOPIC][4].body
    _, _, page = get(f"{store.url}/message?id={ack.offset_msg_id}&view=json")
    pretty = json.dumps(json.loads(body), indent=2).replace('"', "&#34;")
    assert f'<pre id="body" class="body">{pretty}</pre>' in page.decode()
    _, _, page = get(f"{store.url}/message?id={ack.offset_msg_id}&view=hex")
    assert f"00000000  {body[:16].hex(' ')}" in page.decode()
    assert f'href="/message/body?topic={TOPIC}&amp;queue={ack.queue_id}&amp;offset={ack.queue_offset}"' in page.decode()


def test_nodes_api_shows_query_and_writer(store: Store) -> None:
    status, data = api(store, "nodes")
    assert status == 200
    stats = store.query.Stats(query_pb2.StatsRequest())
    assert data["query"]["messages"] == stats.messages == 3 * GROUP_SIZE + 2
    assert data["query"]["store"] == str(store.root)
    assert data["writer"]["store"] == str(store.root) and data["writer"]["flushPolicy"] in ("sync", "async")


def test_groups_api_and_page_show_consumer_progress(store: Store) -> None:
    """The group list, one group's rows (as consumerProgress prints them) and the errors
    of the query node as the console's: an unknown group 404, a bad name 400."""
    write_offsets(str(store.root / "config"), {(TOPIC, "billing"): {0: 1}, (HOSTILE_TOPIC, "audit"): {0: 0}})
    ends = {
        q.queue_id: q.max_offset
        for t in store.query.ListTopics(query_pb2.ListQueryTopicsRequest()).topics
        if t.name == TOPIC
        for q in t.queues
    }
    rows = [{"topic": TOPIC, "queueId": q, "brokerOffset": end, "consumerOffset": 1 if q == 0 else 0,
             "diff": end - (1 if q == 0 else 0), "pastEnd": False} for q, end in sorted(ends.items())]  # fmt: skip
    total = sum(r["diff"] for r in rows)
    assert api(store, "groups") == (200, {"groups": [
        {"group": "audit", "topics": [HOSTILE_TOPIC], "diffTotal": len(store.sent[HOSTILE_TOPIC])},
        {"group": "billing", "topics": [TOPIC], "diffTotal": total},
    ]})  # fmt: skip
    assert api(store, "groups", group="billing") == (200, {"group": "billing", "brokerName": "rmqstore-0", "queues": rows, "diffTotal": total})
    assert api(store, "groups", group="nobody") == (404, {"error": "consumer group nobody has no offsets in this store"})
    assert api(store, "groups", group="a/b") == (400, {"error": "the consumer group 'a/b' contains characters outside [%|a-zA-Z0-9_-]"})
    status, _, body = get(f"{store.url}/groups?group=billing")
    assert status == 200
    assert f'<span id="diff-total">{total}</span>' in body.decode()
    assert body.decode().count("<tr data-queue=") == len(rows)
    assert "past the queue's end" not in body.decode()
    # An offset past its queue's end (a power cut under --flush async, a restored backup) is flagged.
    write_offsets(str(store.root / "config"), {(TOPIC, "billing"): {0: ends[0] + 5}, (HOSTILE_TOPIC, "audit"): {0: 0}})
    status, data = api(store, "groups", group="billing")
    assert status == 200 and data["queues"][0]["pastEnd"] is True and data["queues"][0]["diff"] == 0
    assert "past the queue's end" in get(f"{store.url}/groups?group=billing")[2].decode()
    status, _, body = get(f"{store.url}/groups?group=nobody")
    assert status == 404 and "consumer group nobody has no offsets in this store" in body.decode()
    status, _, body = get(f"{store.url}/groups")
    assert status == 200 and body.decode().count("<tr data-group=") == 2


def test_pages_carry_the_csp_and_answer_shareable_urls(store: Store) -> None:
    ack = store.acks[TOPIC][0]
    for path in ("/topics", f"/search?mode=key&topic={TOPIC}&key={KEY}", f"/message?id={ack.offset_msg_id}", f"/rate?topic={TOPIC}",
                 "/nodes", "/groups", "/api/topics", "/static/console.css", "/nope"):  # fmt: skip
        status, headers, body = get(store.url + path)
        assert status == (404 if path == "/nope" else 200), path
        assert headers["content-security-policy"] == CSP
        assert headers["x-content-type-options"] == "nosniff"
        assert re.fullmatch(r"app;dur=\d+\.\d{3}", headers["server-timing"])
        if path.startswith(("/topics", "/search", "/message", "/rate", "/nodes", "/groups")):
            assert b"<script" not in body.lower()
    status, headers, body = get(f"{store.url}/message/body?id={ack.offset_msg_id}")
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    assert headers["content-disposition"] == f'attachment; filename="{TOPIC}-{ack.queue_id}-{ack.queue_offset}.bin"'
    assert body == store.sent[TOPIC][0].body


def test_hostile_content_is_shown_as_text_in_every_field(store: Store) -> None:
    first, patched = store.acks[HOSTILE_TOPIC]
    pages = [
        f"/message?id={first.offset_msg_id}",
        f"/message?id={first.offset_msg_id}&view=hex",
        f"/message?id={patched.offset_msg_id}",
        f"/search?mode=time&topic={HOSTILE_TOPIC}&begin=0&end={patched.store_timestamp_ms}",
        f"/search?mode=id&id={first.uniq_key}",
        f"/search?mode=key&topic={HOSTILE_TOPIC}&key={urllib.parse.quote(IMG_NO_SPACE)}",
    ]
    for path in pages:
        status, _, body = get(store.url + path)
        assert status == 200, path
        html = body.decode("utf-8")
        assert "<script" not in html.lower() and "<img" not in html.lower(), path
    _, _, detail = get(store.url + pages[0])
    html = detail.decode()
    for text in (SCRIPT, IMG, IMG_NO_SPACE):
        escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;")
        assert escaped in html, text
    assert "The body is not UTF-8 text" in html
    _, _, hexed = get(store.url + pages[1])
    assert "3c 73 63 72 69 70 74 3e" in hexed.decode() and " ff fe 80 " in hexed.decode()
    status, data = api(store, "message", id=patched.offset_msg_id)
    assert status == 200
    assert data["message"]["tags"] == TAG_INVALID.decode("utf-8", "replace")
    assert data["message"]["properties"]["patched"] == PROP_INVALID.decode("utf-8", "replace")
    assert data["message"]["keys"] == "patched " + KEY_INVALID.decode("utf-8", "replace")
    _, _, patched_page = get(store.url + pages[2])
    assert f"<td class=\"mono\">[{TAG_INVALID.decode('utf-8', 'replace')}]</td>" in patched_page.decode()
    assert f"<td class=\"mono\">{PROP_INVALID.decode('utf-8', 'replace')}</td>" in patched_page.decode()


BAD_INPUTS = [
    ("mode=key&topic=&key=k", 400, "topic: give a topic"),
    ("mode=key&topic=Orders&key=", 400, "key: give a key"),
    ("mode=key&topic=Orders&key=a%20b", 400, "key: a key holds no space (KEYS are split on spaces)"),
    ("mode=key&topic=Orders&key=k&begin=20&end=10", 400,
     "the range is reversed: end 1970-01-01T00:00:00.010Z is before begin 1970-01-01T00:00:00.020Z"),
    ("mode=key&topic=Orders&key=k&begin=yesterday", 400, f"begin: 'yesterday' is not a time: {TIME_SYNTAX}"),
    ("mode=key&topic=Orders&key=k&cursor=garbage", 400, "the cursor is malformed or belongs to another query"),
    ("mode=key&topic=NoSuchTopic&key=k", 404, "topic NoSuchTopic does not exist in this store"),
    ("mode=key&topic=bad%20topic&key=k", 400, None),
    ("mode=key&topic=Orders&key=k&pageSize=0", 400, "pageSize: 0 is outside [1, 1000]"),
    ("mode=time&topic=Orders&begin=2026-01-02T00:00:00&end=2026-01-01T00:00:00", 400,
     "the range is reversed: end 2026-01-01T00:00:00.000Z is before begin 2026-01-02T00:00:00.000Z"),
    ("mode=time&topic=Orders&begin=1", 400, "a time search needs both begin and end"),
    ("mode=time&topic=NoSuchTopic&begin=1&end=2", 404, "topic NoSuchTopic does not exist in this store"),
    ("mode=time&topic=Orders&begin=1&end=2&cursor=x", 400, "cursor: 'x' is not a time search cursor"),
    ("mode=id&id=", 400, "id: give an offsetMsgId or a UNIQ_KEY"),
    ("mode=id&id=has%20space", 400, None),
    ("mode=id&id=" + "A" * 129, 400, None),
    ("mode=id&id=0123456789ABCDEF0123456789ABCDEF", 404, "no message has id 0123456789ABCDEF0123456789ABCDEF in any topic"),
    ("mode=id&id=ABC&topic=NoSuchTopic", 404, "topic NoSuchTopic does not exist in this store"),
    ("mode=offset&topic=Orders&queue=x&offset=0", 400, "queue: 'x' is not a whole number"),
    ("mode=offset&topic=Orders&queue=0&offset=-1", 400, "offset: -1 is outside [0, 9223372036854775807]"),
    ("mode=offset&topic=Orders&queue=0&offset=999", 404, "queue offset 999 of Orders/0 is outside [0, 27)"),
    ("mode=offset&topic=Orders&queue=77&offset=0", 404, "topic Orders has no queue 77 in this store"),
    ("mode=timeoffset&topic=Orders&queue=0&timestamp=", 400, "timestamp: give a time"),
    ("mode=timeoffset&topic=Orders&queue=0&timestamp=5&boundary=MIDDLE", 400, "boundary: 'MIDDLE' is neither LOWER nor UPPER"),
    ("mode=timeoffset&topic=NoSuchTopic&queue=0&timestamp=5", 404, "topic NoSuchTopic does not exist in this store"),
    ("mode=nonsense", 400, "mode: 'nonsense' is not one of time, key, id, offset, timeoffset"),
    ("mode=key&topic=Orders&key=k&begin=99999999999999999999999", 400, "begin: '99999999999999999999999' is past the largest time, 9223372036854775807 ms"),
    ("mode=key&topic=Orders&key=k&begin=1969-12-31T00:00:00", 400, "begin: '1969-12-31T00:00:00' is before 1970-01-01T00:00:00Z, the earliest time"),
    ("mode=time&topic=Orders&begin=-5&end=3", 400, f"begin: '-5' is not a time: {TIME_SYNTAX}"),
    ("mode=key&topic=%E2%82%AC&key=k", 400, "topic: the topic '€' contains characters outside [%|a-zA-Z0-9_-]"),
]


@pytest.mark.parametrize(("query", "status", "message"), BAD_INPUTS)
def test_bad_search_input_gets_an_inline_error_and_a_4xx(store: Store, query: str, status: int, message: str | None) -> None:
    got, _, body = get(f"{store.url}/search?{query}")
    assert got == status
    html = body.decode()
    shown = re.search(r'<p class="error" role="alert" id="error">(.*?)</p>', html, re.DOTALL)
    assert shown is not None, html[:500]
    api_status, _, api_body = get(f"{store.url}/api/search?{query}")
    assert api_status == status
    error = json.loads(api_body)["error"]
    if message is not None:
        assert error == message
    assert shown.group(1) == error.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;").replace("'", "&#39;")
    assert get(store.url + "/healthz")[:1] == (200,)


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/message?id=xyz", 400, "id: 'xyz' is not an offsetMsgId (32 or 56 hex characters)"),
        ("/message?id=7F00000100002A9F00000000FFFFFFFF", 404, None),
        ("/message?topic=Orders&queue=0", 400, "offset: '' is not a whole number"),
        ("/message?topic=Orders&queue=0&offset=0&view=pdf", 400, "view: 'pdf' is not one of text, json, hex"),
        ("/rate?topic=Orders&interval=fast", 400, "interval: 'fast' is not a duration such as 30s, 1m, 5m or 1h"),
        ("/rate?topic=Orders&interval=100ms", 400, "interval: '100ms' is shorter than one second"),
        ("/rate?topic=Orders&begin=10&end=5", 400, "the range is reversed: end 1970-01-01T00:00:00.005Z is before begin 1970-01-01T00:00:00.010Z"),
        ("/rate?topic=Orders&begin=0&end=86400000000&interval=1s", 400,
         "86400000 intervals: at most 10000; choose a longer interval or a shorter range"),
        ("/rate?topic=NoSuchTopic", 404, "topic NoSuchTopic does not exist in this store"),
    ],
)
def test_bad_page_input_gets_an_inline_error_and_a_4xx(store: Store, path: str, status: int, message: str | None) -> None:
    got, _, body = get(store.url + path)
    assert got == status
    shown = re.search(r'<p class="error" role="alert" id="error">(.*?)</p>', body.decode(), re.DOTALL)
    assert shown is not None
    if message is not None:
        assert shown.group(1) == message.replace("'", "&#39;")
    assert get(store.url + "/healthz")[:1] == (200,)


def test_times_past_the_calendar_are_shown_as_numbers(store: Store) -> None:
    top = 2**63 - 1
    status, _, page = get(f"{store.url}/search?mode=timeoffset&topic={TOPIC}&queue=0&timestamp={top}&boundary=UPPER")
    assert status == 200 and f"at {top} ms:" in page.decode()
    assert f'<strong class="offset">{GROUP_SIZE * 3 // 4 - 1}</strong>' in page.decode()


def test_unknown_api_and_page_are_404_not_500(store: Store) -> None:
    assert api(store, "nothing") == (404, {"error": "no API named nothing"})
    status, _, body = get(store.url + "/no/such/page")
    assert status == 404 and "no page at /no/such/page" in body.decode()


# Listening and authentication


def _console(args: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rmqstore.cli.main", "console", *args], check=False, capture_output=True, text=True,
                          timeout=timeout_s, env=quiet_env(), stdin=subprocess.DEVNULL)  # fmt: skip


def test_non_loopback_listening_needs_a_users_file_or_no_auth(store: Store, tmp_path: Path) -> None:
    done = _console(["--query-endpoint", store.query_endpoint, "--host", "0.0.0.0", "--port", "0"])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "rmqstore: error: --host 0.0.0.0 is not a loopback address: give --users FILE (rmqstore console-passwd makes one) "
        "or, to serve without passwords, --no-auth\n"
    )
    bad = tmp_path / "users"
    bad.write_text("alice:plaintext\n")
    done = _console(["--query-endpoint", store.query_endpoint, "--host", "0.0.0.0", "--users", str(bad)])
    assert done.returncode == 2
    assert done.stderr == f"rmqstore: error: users file {bad}, line 1: expected name:$argon2id$... (make one with rmqstore console-passwd)\n"
    done = _console(["--query-endpoint", store.query_endpoint, "--users", str(tmp_path / "missing")])
    assert (done.returncode, done.stderr) == (2, f"rmqstore: error: users file {tmp_path / 'missing'}: No such file or directory\n")
    done = _console(["--query-endpoint", store.query_endpoint, "--users", str(bad), "--no-auth"])
    assert (done.returncode, done.stderr) == (2, "rmqstore: error: give --users FILE or --no-auth, not both\n")
    empty = tmp_path / "empty"
    empty.write_text("# nobody yet\n")
    done = _console(["--query-endpoint", store.query_endpoint, "--users", str(empty)])
    assert (done.returncode, done.stderr) == (2, f"rmqstore: error: users file {empty} holds no user\n")


@pytest.mark.parametrize(
    ("user", "password", "message"),
    [
        ("alice", "\n", "the password is empty"),
        ("al:ice", "pw\n", "user name 'al:ice': 1-64 printable characters, no ':' and no outer spaces"),
        (" alice", "pw\n", "user name ' alice': 1-64 printable characters, no ':' and no outer spaces"),
    ],
)
def test_console_passwd_refuses_bad_users_and_writes_nothing(tmp_path: Path, user: str, password: str, message: str) -> None:
    users = tmp_path / "users"
    done = subprocess.run([sys.executable, "-m", "rmqstore.cli.main", "console-passwd", "--users", str(users), "--user", user],
                          check=False, input=password, capture_output=True, text=True, timeout=60, env=quiet_env())  # fmt: skip
    assert (done.returncode, done.stderr) == (2, f"rmqstore: error: {message}\n")
    assert not users.exists() and list(tmp_path.iterdir()) == []


def test_users_file_guards_every_page_but_the_probes(store: Store, nodes: Nodes, tmp_path: Path) -> None:
    users = tmp_path / "users"
    made = subprocess.run([sys.executable, "-m", "rmqstore.cli.main", "console-passwd", "--users", str(users), "--user", "alice"],
                          input="s3cret pass\n", capture_output=True, text=True, timeout=60, env=quiet_env())  # fmt: skip
    assert made.returncode == 0, made.stderr
    line = users.read_text()
    assert line.startswith("alice:$argon2id$") and "s3cret" not in line
    assert users.stat().st_mode & 0o777 == 0o600
    console = nodes.console("--query-endpoint", store.query_endpoint, "--users", str(users))
    try:
        assert console.serving["auth"] == "users"
        status, headers, _ = get(console.url + "/topics")
        assert status == 401 and headers["www-authenticate"] == 'Basic realm="rmqstore console", charset="UTF-8"'
        assert get(console.url + "/api/topics", ("alice", "wrong"))[0] == 401
        assert get(console.url + "/api/topics", ("bob", "s3cret pass"))[0] == 401
        assert get(console.url + "/api/topics", ("alice", "s3cret pass"))[0] == 200
        assert get(console.url + "/healthz")[:1] == (200,)
        assert get(console.url + "/readyz")[0] == 200
    finally:
        console.stop()


def _get_from(url: str, source: str, host: str | None = None, auth: tuple[str, str] | None = None) -> tuple[int, bytes, float]:
    """A GET from the loopback address ``source`` (the console tells clients apart by
    address), with ``host`` as the Host header; its status, body and seconds taken."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=HTTP_TIMEOUT_S, source_address=(source, 0))
    headers = {"Host": host or parsed.netloc}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    started = time.perf_counter()
    try:
        connection.request("GET", parsed.path + (f"?{parsed.query}" if parsed.query else ""), headers=headers)
        response = connection.getresponse()
        return response.status, response.read(), time.perf_counter() - started
    finally:
        connection.close()


def test_a_request_naming_another_host_is_refused_dns_rebinding(store: Store) -> None:
    """A loopback console without a password, reached by a page of attacker.example whose
    name now resolves to 127.0.0.1: the browser sends Host: attacker.example. Refused
    (400) before any data is read; the console's own names are served; probes answer."""
    ack = store.acks[TOPIC][0]
    url = f"{store.url}/api/message?id={ack.offset_msg_id}"
    status, body, _ = _get_from(url, "127.0.0.1", host="attacker.example")
    assert (status, body) == (400, b"Invalid host header")
    assert _get_from(url, "127.0.0.1", host=f"attacker.example:{store.console.port}")[0] == 400
    for host in (f"127.0.0.1:{store.console.port}", f"localhost:{store.console.port}", "localhost"):
        assert _get_from(url, "127.0.0.1", host=host)[0] == 200, host
    assert _get_from(f"{store.url}/healthz", "127.0.0.1", host="attacker.example")[0] == 200
    assert store.console.serving["allowedHosts"] == ["localhost", "127.0.0.1", "[::1]"]


def test_allowed_host_adds_a_name_and_a_wildcard_listener_without_it_takes_any(store: Store, nodes: Nodes) -> None:
    console = nodes.console("--query-endpoint", store.query_endpoint, "--allowed-host", "console.example")
    try:
        assert _get_from(console.url + "/api/topics", "127.0.0.1", host="console.example")[0] == 200
        assert _get_from(console.url + "/api/topics", "127.0.0.1", host="attacker.example")[0] == 400
    finally:
        console.stop()
    open_console = nodes.console("--query-endpoint", store.query_endpoint, "--host", "0.0.0.0", "--no-auth")
    try:
        assert open_console.serving["allowedHosts"] == ["*"]
        assert _get_from(open_console.url + "/api/topics", "127.0.0.1", host="any.example")[0] == 200
    finally:
        open_console.stop()


def test_password_checks_are_bounded_and_cost_the_same_for_unknown_users(store: Store, nodes: Nodes, tmp_path: Path) -> None:
    """60 wrong passwords at once for a real user: a few Argon2 checks run (64 MiB each),
    the rest are refused at once (429), so memory stays bounded, and a valid login from
    another address is served at once after. A name the users file does not hold takes as
    long to refuse as a wrong password of one it does: timing tells no name apart."""
    users = tmp_path / "users"
    made = subprocess.run([sys.executable, "-m", "rmqstore.cli.main", "console-passwd", "--users", str(users), "--user", "alice"],
                          input="s3cret pass\n", capture_output=True, text=True, timeout=60, env=quiet_env())  # fmt: skip
    assert made.returncode == 0, made.stderr
    made = subprocess.run([sys.executable, "-m", "rmqstore.cli.main", "console-passwd", "--users", str(users), "--user", "bob"],
                          input="bob's pass\n", capture_output=True, text=True, timeout=60, env=quiet_env())  # fmt: skip
    assert made.returncode == 0, made.stderr
    console = nodes.console("--query-endpoint", store.query_endpoint, "--users", str(users))
    try:
        url = console.url + "/api/topics"
        assert _get_from(url, "127.0.0.5", auth=("alice", "s3cret pass"))[0] == 200  # warm: the first check's allocations
        baseline = rss_bytes(console.proc.pid)
        peak = [baseline]
        flooding = threading.Event()

        def sample() -> None:
            while flooding.is_set():
                peak[0] = max(peak[0], rss_bytes(console.proc.pid))
                time.sleep(0.01)

        flood_started = time.monotonic()
        flooding.set()
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            with ThreadPoolExecutor(60) as pool:
                statuses = list(pool.map(lambda n: _get_from(url, "127.0.0.1", auth=("alice", f"guess {n}"))[0], range(60)))
        finally:
            flooding.clear()
            sampler.join()
        assert set(statuses) <= {401, 429} and statuses.count(429) >= 40, sorted(statuses)
        assert peak[0] - baseline < 256 * 1024 * 1024, (baseline, peak[0])
        # The address spends its failures (10 in a burst, then one every 6 s: a loaded
        # machine's slow checks earn it a few more), then it is refused without a check...
        more = []
        while len(more) < 20 and (not more or more[-1] != 429):
            more.append(_get_from(url, "127.0.0.1", auth=("alice", f"more {len(more)}"))[0])
        earned = 10 + (time.monotonic() - flood_started) / 6
        assert more[-1] == 429 and statuses.count(401) + more.count(401) <= earned + 1, (statuses.count(401), more, earned)
        # ...while a login already proven stays good, and another address logs in at once.
        assert _get_from(url, "127.0.0.1", auth=("alice", "s3cret pass"))[0] == 200
        status, _, took_s = _get_from(url, "127.0.0.2", auth=("bob", "bob's pass"))
        assert status == 200 and took_s < 10.0, (status, took_s)

        # Known and unknown names in turn, so that a change in the machine's load while
        # they are timed weighs on both medians alike (each address stays under its 10
        # failures).
        known, unknown = [], []
        for n in range(7):
            known.append(_get_from(url, "127.0.0.3", auth=("alice", f"wrong {n}"))[2])
            unknown.append(_get_from(url, "127.0.0.4", auth=(f"nobody{n}", "wrong"))[2])
        assert 0.5 < statistics.median(unknown) / statistics.median(known) < 2.0, (known, unknown)
    finally:
        console.stop()


def test_readyz_says_when_the_query_node_is_gone(nodes: Nodes) -> None:
    console = nodes.console("--query-endpoint", "127.0.0.1:1", "--timeout", "2")
    try:
        status, _, body = get(console.url + "/readyz")
        assert status == 503 and body.startswith(b"query node: the node answered UNAVAILABLE")
        status, _, body = get(console.url + "/topics")
        assert status == 502 and b"the node answered UNAVAILABLE" in body
        assert get(console.url + "/healthz")[:1] == (200,)
    finally:
        console.stop()


def test_an_endpoint_of_the_other_kind_of_node_is_named(store: Store, nodes: Nodes) -> None:
    """A query endpoint given a writer's port, or a writer endpoint a query node's: the
    page says which, not UNIMPLEMENTED: Method not found!"""
    console = nodes.console("--query-endpoint", store.writer_endpoint, "--writer-endpoint", store.query_endpoint)
    try:
        status, _, body = get(console.url + "/api/topics")
        assert (status, json.loads(body)) == (502, {
            "error": "--query-endpoint is not a query node: it does not serve the query node's calls (is it a writer's port?)"
        })  # fmt: skip
    finally:
        console.stop()
    console = nodes.console("--query-endpoint", store.query_endpoint, "--writer-endpoint", store.query_endpoint)
    try:
        status, _, body = get(console.url + "/api/nodes")
        assert status == 200 and json.loads(body)["writer"] == {
            "error": "--writer-endpoint is not a writer: it does not serve the writer's calls (is it a query node's port?)"
        }
    finally:
        console.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_sigterm_and_ctrl_c_stop_the_console_as_docs_console_md_says(store: Store, nodes: Nodes, signum: int) -> None:
    """docs/console.md: SIGTERM or Ctrl-C (SIGINT, as a terminal sends it) stops it with its
    stopped line and exit 0 — right after its serving line, with no wait for a handler, and
    with an open keep-alive connection that has been answered."""
    for ready in ("at once", "after a page"):
        console = nodes.console("--query-endpoint", store.query_endpoint)
        connection = http.client.HTTPConnection("127.0.0.1", console.port, timeout=HTTP_TIMEOUT_S)
        try:
            if ready == "after a page":
                connection.request("GET", "/topics")
                response = connection.getresponse()
                assert response.status == 200 and response.read()
            console.proc.send_signal(signum)
            console.wait_stopped()
            assert console.stderr_text() == "", (ready, console.stderr_text())
        finally:
            connection.close()


# In a real browser: Debian's chromium through chromedriver (test.sh installs both)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1000",
        # Nothing but the console: no background traffic of the browser's own.
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
        "--disable-default-apps", "--disable-domain-reliability", "--disable-breakpad",
    ):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(HTTP_TIMEOUT_S)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def _requested_urls(driver: Any) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        event = json.loads(entry["message"])["message"]
        if event["method"] == "Network.requestWillBeSent":
            urls.append(event["params"]["request"]["url"])
    return urls


def _click_and_wait(driver: Any, element: Any) -> None:
    """Click what navigates, and wait until the next page has replaced this one."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, HTTP_TIMEOUT_S).until(lambda _: _gone(page))
    WebDriverWait(driver, HTTP_TIMEOUT_S).until(lambda d: d.find_elements(By.TAG_NAME, "footer"))


def _gone(element: Any) -> bool:
    """Whether ``element``'s page has been replaced. Selenium's ``staleness_of`` knows only
    the stale-element error; ChromeDriver also answers a node of a page being replaced with
    an "unknown error" saying the node does not belong to the document (seen once in CI)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if "does not belong to the document" in str(error):
            return True
        raise
    return False


def _submit(driver: Any, form_id: str, values: dict[str, str]) -> None:
    from selenium.webdriver.common.by import By

    form = driver.find_element(By.ID, form_id)
    # A page with results shows the forms folded: unfold this one as a user would.
    for fold in driver.find_elements(By.ID, "fold-" + form_id.removeprefix("form-")):
        if fold.get_attribute("open") is None:
            fold.find_element(By.TAG_NAME, "summary").click()
    for name, value in values.items():
        box = form.find_element(By.NAME, name)
        box.clear()
        box.send_keys(value)
    _click_and_wait(driver, form.find_element(By.CSS_SELECTOR, "button[type=submit]"))


def _table(driver: Any, table_id: str) -> dict[str, str]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tr")
    return {row.find_element(By.TAG_NAME, "th").text: row.find_element(By.TAG_NAME, "td").text for row in rows}


def _shot(driver: Any, name: str) -> None:
    driver.save_screenshot(str(SCREENSHOTS / f"console-{name}.png"))


def test_browser_finds_messages_on_every_page(store: Store, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get_log("performance")
    # Topics: every topic with its message count.
    driver.get(store.url + "/topics")
    rows = driver.find_elements(By.CSS_SELECTOR, "#topics tr[data-topic]")
    assert {r.get_attribute("data-topic"): int(r.find_element(By.CSS_SELECTOR, ".count").text) for r in rows} == {
        TOPIC: len(store.sent[TOPIC]), HOSTILE_TOPIC: len(store.sent[HOSTILE_TOPIC])
    }
    _shot(driver, "topics")
    # Each topic's links open a page that answers.
    for link in driver.find_elements(By.CSS_SELECTOR, "#topics tr[data-topic] a"):
        status, _, _ = get(link.get_attribute("href"))
        assert status == 200, link.get_attribute("href")
    # A key with a time range and a tag, three per page, paged to the end.
    begin, end = store.window
    driver.get(store.url + "/search")
    _submit(driver, "form-key", {"topic": TOPIC, "key": KEY, "begin": str(begin), "end": str(end), "tag": "paid", "pageSize": "3"})
    found: list[str] = []
    for _ in range(10):
        found += [r.get_attribute("data-msgid") for r in driver.find_elements(By.CSS_SELECTOR, "#messages tr.message")]
        nexts = driver.find_elements(By.ID, "next-page")
        if not nexts:
            break
        _click_and_wait(driver, nexts[0])
    assert found == _with_key(store, begin, end, {"paid"}), driver.current_url
    assert driver.find_element(By.ID, "complete").text == "complete"
    _submit(driver, "form-key", {"topic": TOPIC, "key": KEY, "begin": str(begin), "end": str(end), "tag": "paid", "pageSize": ""})
    _shot(driver, "search")
    # By offsetMsgId, then by UNIQ_KEY without a topic.
    ack = store.acks[TOPIC][9]
    for given, matched in ((ack.offset_msg_id, "offsetMsgId"), (ack.uniq_key, "UNIQ_KEY")):
        _submit(driver, "form-id", {"id": given, "topic": ""})
        (row,) = driver.find_elements(By.CSS_SELECTOR, "#messages tr.message")
        assert row.get_attribute("data-msgid") == ack.offset_msg_id and matched in row.text
    # Its detail page equals queryMsgById --json.
    _click_and_wait(driver, driver.find_element(By.CSS_SELECTOR, "#messages a.detail"))
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "queryMsgById", "--endpoint", store.query_endpoint, "-i", ack.offset_msg_id, "--json"],
        check=False, capture_output=True, text=True, timeout=60, env=quiet_env(),
    )  # fmt: skip
    want = json.loads(done.stdout)
    fields = _table(driver, "fields")
    assert (fields["OffsetID"], fields["Topic"], fields["Unique Key"]) == (want["msgId"], want["topic"], want["uniqKey"])
    assert (int(fields["Queue ID"]), int(fields["Queue Offset"]), int(fields["CommitLog Offset"])) == (
        want["queueId"], want["queueOffset"], want["commitLogOffset"]
    )
    assert (fields["Keys"], fields["Tags"]) == (f"[{want['keys']}]", f"[{want['tags']}]")
    assert (int(fields["Body Length"]), fields["Body SHA-256"]) == (want["bodyLen"], want["bodySha256"])
    assert _table(driver, "properties") == want["properties"]
    assert _table(driver, "decoded")["Commit log offset"] == str(want["commitLogOffset"])
    assert json.loads(driver.find_element(By.ID, "body").text) == json.loads(store.sent[TOPIC][9].body)
    _shot(driver, "message")
    # Next and previous in its queue.
    _click_and_wait(driver, driver.find_element(By.ID, "next"))
    assert int(_table(driver, "fields")["Queue Offset"]) == ack.queue_offset + 1
    _click_and_wait(driver, driver.find_element(By.ID, "previous"))
    _click_and_wait(driver, driver.find_element(By.ID, "previous"))
    assert int(_table(driver, "fields")["Queue Offset"]) == ack.queue_offset - 1
    # The rate chart's bars sum to the range's messages.
    driver.get(store.url + "/rate")
    lo, hi = begin - 2000, end + 2000
    _submit(driver, "form-rate", {"topic": TOPIC, "begin": str(lo), "end": str(hi), "interval": "1s"})
    bars = driver.find_elements(By.CSS_SELECTOR, "#chart-topic rect")
    want_count = sum(1 for a in store.acks[TOPIC] if lo <= a.store_timestamp_ms < hi)
    assert sum(int(b.get_attribute("data-count")) for b in bars) == want_count == int(driver.find_element(By.ID, "rate-total").text)
    # Empty intervals draw no bar.
    assert 0 < len(bars) <= -(-(hi - lo) // 1000) and all(int(b.get_attribute("data-count")) > 0 for b in bars)
    _shot(driver, "rate")
    driver.get(store.url + "/nodes")
    assert _table(driver, "query-node")["messages"] == str(len(store.sent[TOPIC]) + len(store.sent[HOSTILE_TOPIC]))
    assert _table(driver, "writer-node")["store"] == str(store.root)
    _shot(driver, "nodes")
    # Every request the pages made went to the console itself, and none broke its CSP.
    urls = _requested_urls(driver)
    assert urls and all(u.startswith(store.url + "/") for u in urls), [u for u in urls if not u.startswith(store.url)]
    assert [e for e in driver.get_log("browser") if "Content Security Policy" in e["message"]] == []


def test_browser_search_shows_results_first_with_previews_and_both_ids(store: Store, browser: Any) -> None:
    """The results come first, the forms folded under them; each row shows the client's
    message id (UNIQ_KEY) beside the offsetMsgId and the start of its body."""
    from selenium.webdriver.common.by import By

    driver = browser
    begin, end = store.window
    driver.get(f"{store.url}/search?mode=time&topic={TOPIC}&begin={begin}&end={end}&pageSize=10")
    results = driver.find_element(By.ID, "results")
    forms = driver.find_element(By.ID, "forms")
    rows = driver.find_elements(By.CSS_SELECTOR, "#messages tr.message")
    assert len(rows) == 10
    # Right under the page's heading (they began some 650 px down, under five forms).
    assert results.location["y"] < 200 and forms.location["y"] > rows[-1].location["y"]
    folds = driver.find_elements(By.CSS_SELECTOR, "#forms details")
    assert len(folds) == 5 and all(f.get_attribute("open") is None for f in folds)
    assert not driver.find_element(By.CSS_SELECTOR, "#form-key input[name=key]").is_displayed()
    by_id = {ack.offset_msg_id: (ack, message) for ack, message in zip(store.acks[TOPIC], store.sent[TOPIC])}
    for row in rows:
        ack, message = by_id[row.get_attribute("data-msgid")]
        assert row.find_element(By.CSS_SELECTOR, "td.uniq").text == ack.uniq_key != ""
        assert row.find_element(By.CSS_SELECTOR, "a.detail").text == ack.offset_msg_id
        assert row.find_element(By.CSS_SELECTOR, "td.preview").text == message.body.decode()
    headers = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#messages thead th")]
    assert headers[:2] == ["Message id (UNIQ_KEY)", "offsetMsgId"] and "Body" in headers
    # Unfolding a form and searching again.
    _submit(driver, "form-id", {"id": store.acks[TOPIC][3].uniq_key, "topic": ""})
    (row,) = driver.find_elements(By.CSS_SELECTOR, "#messages tr.message")
    assert row.find_element(By.CSS_SELECTOR, "td.uniq").text == store.acks[TOPIC][3].uniq_key
    # A body that is not UTF-8 previews as hex; one that is, as text, cut with "…".
    driver.get(f"{store.url}/search?mode=key&topic={HOSTILE_TOPIC}&key=patched")
    assert [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#messages td.preview")] == ["patched"]
    driver.get(f"{store.url}/search?mode=time&topic={HOSTILE_TOPIC}&begin=0&end={store.acks[HOSTILE_TOPIC][1].store_timestamp_ms}")
    previews = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#messages td.preview")]
    assert previews == [BODY_INVALID[:24].hex(" ") + " …", "patched"]
    assert driver.find_elements(By.TAG_NAME, "script") == [] and driver.find_elements(By.TAG_NAME, "img") == []


def test_browser_shows_hostile_content_as_text(store: Store, browser: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get_log("performance")
    first, patched = store.acks[HOSTILE_TOPIC]
    driver.get(f"{store.url}/message?id={first.offset_msg_id}")
    fields = _table(driver, "fields")
    assert fields["Tags"] == f"[{SCRIPT}]"
    assert fields["Keys"] == f"[{SCRIPT.replace(' ', '')} {IMG_NO_SPACE}]"
    properties = _table(driver, "properties")
    assert (properties["evil"], properties[SCRIPT]) == (IMG, "name")
    assert driver.find_elements(By.TAG_NAME, "script") == [] and driver.find_elements(By.TAG_NAME, "img") == []
    driver.get(f"{store.url}/search?mode=time&topic={HOSTILE_TOPIC}&begin=0&end={patched.store_timestamp_ms}")
    tags = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#messages td.tags")]
    assert tags == [SCRIPT, TAG_INVALID.decode("utf-8", "replace")]
    driver.get(f"{store.url}/message?id={first.offset_msg_id}&view=hex")
    assert " ff fe 80 " in driver.find_element(By.ID, "body").text
    _shot(driver, "hostile")
    with pytest.raises(NoAlertPresentException):
        _ = driver.switch_to.alert.text
    assert all(u.startswith(store.url + "/") for u in _requested_urls(driver))


def test_browser_bad_input_shows_inline_errors_and_the_console_goes_on(store: Store, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    cases = [
        ("form-time", {"topic": TOPIC, "begin": "20", "end": "10"}, "the range is reversed: end 1970-01-01T00:00:00.010Z is before begin 1970-01-01T00:00:00.020Z"),
        ("form-key", {"topic": "NoSuchTopic", "key": "k"}, "topic NoSuchTopic does not exist in this store"),
        ("form-id", {"id": "has space"}, "id: 'has space' is not a message id (printable, no spaces, at most 128 characters)"),
        ("form-offset", {"topic": TOPIC, "queue": "0", "offset": "x"}, "offset: 'x' is not a whole number"),
        ("form-timeoffset", {"topic": TOPIC, "queue": "0", "timestamp": "noon"},
         f"timestamp: 'noon' is not a time: {TIME_SYNTAX}"),
    ]  # fmt: skip
    for form, values, message in cases:
        driver.get(store.url + "/search")
        _submit(driver, form, values)
        assert driver.find_element(By.ID, "error").text == message
    driver.get(store.url + "/rate")
    _submit(driver, "form-rate", {"topic": TOPIC, "interval": "soon"})
    assert driver.find_element(By.ID, "error").text == "interval: 'soon' is not a duration such as 30s, 1m, 5m or 1h"
    driver.get(store.url + "/topics")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#topics tr[data-topic]")) == 2


def test_pending_page_and_api_list_scheduled_messages_not_due_paged_recalls_marked(nodes: Nodes, tmp_path: Path, browser: Any) -> None:
    """Issue 37: the console shows pending delayed and timed messages (topic, message id,
    keys, due time), paged; a recalled one is marked; one already released is not listed."""
    from selenium.webdriver.common.by import By

    from rmqstore.common.times import iso_time
    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s
    from rmqstore.rocketmq_v2 import service_pb2_grpc
    from rmqstore.v1 import writer_pb2

    root = tmp_path / "store"
    writer = nodes.start("writer", root)
    query_node = nodes.start("query", root)
    console = nodes.console("--query-endpoint", query_node.endpoint, "--writer-endpoint", writer.endpoint)
    writer_stub = nodes.writer(writer)
    writer_stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Later", queue_count=2, message_type="MIXED"), timeout=30)
    now = int(time.time() * 1000)
    soon = now + 1500
    timed = [
        messages_pb2.Message(topic="Later", keys=[f"order-{n}"], body=f"timed {n}".encode(),
                             properties={"TIMER_DELIVER_MS": str(now + 3_600_000 + n * 1000)})
        for n in range(3)
    ]  # fmt: skip
    soon_message = messages_pb2.Message(topic="Later", keys=["soon"], body=b"soon", properties={"TIMER_DELIVER_MS": str(soon)})
    level = messages_pb2.Message(topic="Later", keys=["level"], tags="L", body=b"level 18", properties={"DELAY": "18"})
    acks = send_all(writer_stub, [*timed, soon_message, level])
    # One more through RocketMQ 5, recalled by its receipt's handle.
    gateway = service_pb2_grpc.MessagingServiceStub(nodes.channel(writer))
    recalled_message = v2.Message(
        topic=v2.Resource(name="Later"), body=b"recalled",
        system_properties=v2.SystemProperties(message_id="01ABCDEF0123456789ABCDEF0123456789", message_type=v2.DELAY, keys=["recalled"],
                                              delivery_timestamp={"seconds": now // 1000 + 7200}),
    )  # fmt: skip
    sent = gateway.SendMessage(v2s.SendMessageRequest(messages=[recalled_message]), timeout=30)
    assert sent.status.code == v2.OK, sent
    request = v2s.RecallMessageRequest(topic=v2.Resource(name="Later"), recall_handle=sent.entries[0].recall_handle)
    assert gateway.RecallMessage(request, timeout=30).status.code == v2.OK
    store = Store(root, query_node.endpoint, writer.endpoint, console)
    time.sleep(max(0.0, (soon + 1000) / 1000 - time.time()))  # released by now: no longer pending

    def listed() -> list[dict[str, Any]] | None:
        status, data = api(store, "pending")
        assert status == 200, data
        return data["messages"] if len(data["messages"]) == 5 and data["complete"] else None

    rows = wait_until(listed, 30, "the five pending messages on the console")
    expected = [(a.uniq_key, m.keys[0], int(m.properties["TIMER_DELIVER_MS"]), None) for a, m in zip(acks, timed)]
    expected.append(("01ABCDEF0123456789ABCDEF0123456789", "recalled", (now // 1000 + 7200) * 1000, None))
    expected.append((acks[4].uniq_key, "level", acks[4].store_timestamp_ms + 7_200_000, 18))
    assert [(r["uniqKey"], r["keys"], r["dueAt"], r["delayLevel"]) for r in rows] == expected
    assert {r["realTopic"] for r in rows} == {"Later"}
    assert [r["recalled"] for r in rows] == [False, False, False, True, False]
    # Paged: two a page, the cursor going on where the last page stopped.
    seen: list[str] = []
    cursor = ""
    for _ in range(5):
        status, page = api(store, "pending", pageSize=2, cursor=cursor)
        assert status == 200 and len(page["messages"]) <= 2
        seen += [r["uniqKey"] for r in page["messages"]]
        cursor = page["cursor"]
        if page["complete"]:
            break
    assert seen == [r["uniqKey"] for r in rows]
    for params, message in (
        ({"pageSize": 0}, "pageSize: 0 is outside [1, 1000]"),
        ({"cursor": "x"}, "cursor: 'x' is not a time search cursor"),
    ):
        assert api(store, "pending", **params) == (400, {"error": message})
    # In the browser: the rows, the recalled one marked, and the next page's link.
    driver = browser
    driver.get(f"{console.url}/pending?pageSize=3")
    shown = driver.find_elements(By.CSS_SELECTOR, "#pending tr.message")
    assert [row.get_attribute("data-msgid") for row in shown] == [r["uniqKey"] for r in rows[:3]]
    assert [row.find_element(By.CSS_SELECTOR, "td.topic").text for row in shown] == ["Later"] * 3
    assert shown[0].find_element(By.CSS_SELECTOR, "td.keys").text == "order-0"
    assert shown[0].find_element(By.CSS_SELECTOR, "td.due").text == iso_time(rows[0]["dueAt"])
    _click_and_wait(driver, driver.find_element(By.ID, "next-page"))
    shown = driver.find_elements(By.CSS_SELECTOR, "#pending tr.message")
    assert [row.get_attribute("data-msgid") for row in shown] == [r["uniqKey"] for r in rows[3:]]
    assert "recalled" in (shown[0].get_attribute("class") or "") and shown[0].find_element(By.CSS_SELECTOR, "span.recalled").text == "recalled"
    assert driver.find_elements(By.ID, "next-page") == []
