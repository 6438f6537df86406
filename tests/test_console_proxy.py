"""The console in front of a proxy (cluster mode, docs/cluster.md) of two writer groups,
every node a real process on 127.0.0.1: the same pages and JSON APIs as against a query
node, each queue with its group's broker name, and a group that does not answer named on
every page it leaves partial."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.http import get
from support.nodes import Nodes, ProcessNode, send_all
from support.rmq5 import make_topics
from support.wait import wait_until
from test_console import _click_and_wait, _submit, _table, browser  # noqa: F401 (browser: the fixture)
from test_proxy_lookups import Group, cluster_yaml, start_group, start_proxy

from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc

GROUPS = ("broker-a", "broker-b")
TOPIC = "TopicConsole"
SHARED_KEY = "shared"
PER_GROUP = 12
QUEUES = 2


@dataclass
class Cluster:
    groups: dict[str, Group]
    console: ProcessNode

    def api(self, name: str, **params: object) -> tuple[int, Any]:
        status, _, body = get(f"{self.console.url}/api/{name}?{urllib.parse.urlencode(params)}")
        return status, json.loads(body)

    def page(self, path: str) -> tuple[int, str]:
        status, _, body = get(self.console.url + path)
        return status, body.decode()

    def every_sent(self) -> list[tuple[str, messages_pb2.SendResult]]:
        return [(g.name, ack) for g in self.groups.values() for ack in g.sent]


def wait_caught_up(direct: query_pb2_grpc.QueryServiceStub) -> None:
    request = query_pb2.QueryByKeyRequest(topic=TOPIC, key=SHARED_KEY, page_size=100)
    wait_until(lambda: len(direct.QueryByKey(request).messages) == PER_GROUP, 30, "the query node to catch up")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("console-proxy")
    (root / "logs").mkdir()
    nodes = Nodes(root / "logs")
    try:
        groups = {}
        for name in GROUPS:
            writer, query = start_group(nodes, root, name)
            make_topics(writer.endpoint, {TOPIC: "NORMAL"}, queue_count=QUEUES)
            messages = [
                messages_pb2.Message(topic=TOPIC, queue_id=i % QUEUES, keys=[SHARED_KEY, f"{name}-{i}"], tags="TagA",
                                     body=f"{name} {i}".encode())  # fmt: skip
                for i in range(PER_GROUP)
            ]
            groups[name] = Group(name, root / name, writer, query, send_all(nodes.writer(writer), messages, batch=4))
            wait_caught_up(nodes.query(query))
        cluster_file = root / "cluster.yaml"
        cluster_file.write_text(cluster_yaml(groups))
        proxy = start_proxy(nodes, cluster_file, root / "cursor.key")
        yield Cluster(groups, nodes.console("--query-endpoint", proxy.endpoint, "--timeout", "5"))
    finally:
        nodes.close()


def test_topics_and_rate_show_every_groups_queues_under_their_broker_names(cluster: Cluster) -> None:
    status, data = cluster.api("topics")
    assert status == 200 and data["unansweredGroups"] == []
    (topic,) = [t for t in data["topics"] if t["name"] == TOPIC]
    assert sorted((q["brokerName"], q["queueId"], q["messages"]) for q in topic["queues"]) == [
        (name, q, PER_GROUP // QUEUES) for name in GROUPS for q in range(QUEUES)
    ]
    assert topic["messages"] == sum(topic["recentCounts"]) == len(GROUPS) * PER_GROUP
    status, page = cluster.page("/topics")
    assert status == 200 and 'data-queue="broker-b/1"' in page and 'id="unanswered"' not in page
    stamps = [ack.store_timestamp_ms for _, ack in cluster.every_sent()]
    status, rate = cluster.api("rate", topic=TOPIC, begin=min(stamps) - 1000, end=max(stamps) + 1, interval="1s")
    assert status == 200 and rate["total"] == len(stamps)
    assert {(q["brokerName"], q["queueId"]): q["total"] for q in rate["queues"]} == {
        (name, q): PER_GROUP // QUEUES for name in GROUPS for q in range(QUEUES)
    }
    status, page = cluster.page(f"/rate?topic={TOPIC}&begin={min(stamps) - 1000}&end={max(stamps) + 1}&interval=1s")
    assert status == 200 and 'id="chart-queue-broker-a-0"' in page and "Queue broker-b/1:" in page


def test_a_message_is_found_by_key_by_queue_offset_and_by_time(cluster: Cluster) -> None:
    every = {ack.offset_msg_id: (name, ack) for name, ack in cluster.every_sent()}
    status, found = cluster.api("search", mode="key", topic=TOPIC, key=SHARED_KEY, pageSize=1000)
    assert status == 200 and found["complete"] and found["unansweredGroups"] == []
    assert sorted(m["msgId"] for m in found["messages"]) == sorted(every)
    status, one = cluster.api("search", mode="key", topic=TOPIC, key="broker-b-5")
    assert status == 200 and [m["msgId"] for m in one["messages"]] == [cluster.groups["broker-b"].sent[5].offset_msg_id]
    # A key match does not say its group: its detail link goes by offsetMsgId, which does.
    status, page = cluster.page(f"/search?mode=key&topic={TOPIC}&key=broker-b-5")
    link = f'href="/message?id={one["messages"][0]["msgId"]}"'
    assert status == 200 and link in page

    for name, ack in every.values():
        status, by_offset = cluster.api("search", mode="offset", topic=TOPIC, broker=name, queue=ack.queue_id, offset=ack.queue_offset)
        assert status == 200 and [(m["msgId"], m["brokerName"]) for m in by_offset["messages"]] == [(ack.offset_msg_id, name)]
    status, refused = cluster.api("search", mode="offset", topic=TOPIC, queue=0, offset=0)
    assert status == 400 and "broker" in refused["error"]

    stamps = [ack.store_timestamp_ms for _, ack in every.values()]
    seen: list[tuple[str, int, int]] = []
    cursor = ""
    for _ in range(20):
        status, page_data = cluster.api("search", mode="time", topic=TOPIC, begin=min(stamps), end=max(stamps), pageSize=5, cursor=cursor)
        assert status == 200 and page_data["inRange"] == len(every)
        seen += [(m["brokerName"], m["queueId"], m["queueOffset"]) for m in page_data["messages"]]
        if page_data["complete"]:
            break
        cursor = page_data["cursor"]
    assert seen == sorted((name, ack.queue_id, ack.queue_offset) for name, ack in every.values())
    status, page = cluster.page(f"/search?mode=time&topic={TOPIC}&begin={min(stamps)}&end={max(stamps)}&pageSize=1000")
    assert status == 200 and f"/message?topic={TOPIC}&amp;broker=broker-a&amp;queue=1&amp;offset=0" in page

    name, ack = every[cluster.groups["broker-b"].sent[4].offset_msg_id]
    status, at = cluster.api("search", mode="timeoffset", topic=TOPIC, broker=name, queue=ack.queue_id, timestamp=ack.store_timestamp_ms)
    assert status == 200 and (at["brokerName"], at["offset"], at["found"]) == (name, ack.queue_offset, True)


def test_the_message_page_knows_its_group_and_pages_in_its_queue(cluster: Cluster) -> None:
    ack = cluster.groups["broker-b"].sent[6]  # queue 0, offset 3
    status, by_id = cluster.api("message", id=ack.offset_msg_id)
    assert status == 200 and by_id["brokerName"] == "broker-b"
    assert (by_id["previousOffset"], by_id["nextOffset"]) == (ack.queue_offset - 1, ack.queue_offset + 1)
    status, by_offset = cluster.api("message", topic=TOPIC, broker="broker-b", queue=ack.queue_id, offset=ack.queue_offset)
    assert (status, by_offset) == (200, by_id)
    status, page = cluster.page(f"/message?id={ack.offset_msg_id}")
    nxt = f'href="/message?topic={TOPIC}&amp;broker=broker-b&amp;queue={ack.queue_id}&amp;offset={ack.queue_offset + 1}"'
    assert status == 200 and nxt in page
    status, page = cluster.page(f"/message?topic={TOPIC}&broker=broker-b&queue={ack.queue_id}&offset={ack.queue_offset + 1}")
    assert status == 200 and cluster.groups["broker-b"].sent[8].offset_msg_id in page


def test_the_nodes_page_says_it_is_a_proxy_and_lists_its_groups(cluster: Cluster) -> None:
    status, data = cluster.api("nodes")
    assert status == 200 and data["query"] is None
    assert data["proxy"]["groups"] == [{"name": name, "answered": True, "queues": QUEUES} for name in GROUPS]
    status, page = cluster.page("/nodes")
    assert status == 200 and 'id="proxy-groups"' in page and 'data-group="broker-a"' in page


def test_browser_opens_a_key_match_in_its_group_and_pages_its_queue(cluster: Cluster, browser: Any) -> None:  # noqa: F811
    """In Chromium (tests/test_console.py's driver): a key search through the proxy, its
    match's detail page naming the group, and the next message of that group's queue."""
    from selenium.webdriver.common.by import By

    driver = browser
    ack = cluster.groups["broker-a"].sent[2]  # queue 0, offset 1
    driver.get(cluster.console.url + "/search")
    _submit(driver, "form-key", {"topic": TOPIC, "key": "broker-a-2", "begin": "", "end": "", "tag": "", "pageSize": ""})
    (row,) = driver.find_elements(By.CSS_SELECTOR, "#messages tr.message")
    assert row.get_attribute("data-msgid") == ack.offset_msg_id
    _click_and_wait(driver, row.find_element(By.CSS_SELECTOR, "a.detail"))
    assert driver.find_element(By.ID, "broker").text == "Writer group (broker) broker-a"
    _click_and_wait(driver, driver.find_element(By.ID, "next"))
    fields = _table(driver, "fields")
    assert (fields["OffsetID"], fields["Queue Offset"]) == (cluster.groups["broker-a"].sent[4].offset_msg_id, str(ack.queue_offset + 1))


def test_a_group_down_is_named_on_every_page_it_leaves_partial(cluster: Cluster) -> None:
    """Last in the module: it stops broker-b's nodes."""
    down = cluster.groups["broker-b"]
    down.query.kill()
    down.writer.kill()
    status, data = cluster.api("topics")
    assert status == 200 and data["unansweredGroups"] == ["broker-b"]
    status, page = cluster.page("/topics")
    assert status == 200 and 'id="unanswered"' in page and "<strong>broker-b</strong> did not answer" in page
    status, found = cluster.api("search", mode="key", topic=TOPIC, key=SHARED_KEY, pageSize=1000)
    assert status == 200 and not found["complete"] and found["unansweredGroups"] == ["broker-b"]
    assert sorted(m["msgId"] for m in found["messages"]) == sorted(a.offset_msg_id for a in cluster.groups["broker-a"].sent)
    status, page = cluster.page(f"/search?mode=key&topic={TOPIC}&key={SHARED_KEY}&pageSize=1000")
    assert status == 200 and "<strong>broker-b</strong> did not answer" in page and '<span id="complete" class="more">' in page
    stamps = [ack.store_timestamp_ms for _, ack in cluster.every_sent()]
    status, by_time = cluster.api("search", mode="time", topic=TOPIC, begin=min(stamps), end=max(stamps), pageSize=1000)
    assert status == 200 and not by_time["complete"] and by_time["unansweredGroups"] == ["broker-b"]
    assert len(by_time["messages"]) == PER_GROUP
    status, rate = cluster.api("rate", topic=TOPIC, begin=min(stamps) - 1000, end=max(stamps) + 1, interval="1s")
    assert status == 200 and rate["unansweredGroups"] == ["broker-b"] and rate["total"] == PER_GROUP
    status, groups = cluster.api("groups")
    assert (status, groups) == (200, {"groups": [], "unansweredGroups": ["broker-b"]})
    assert "<strong>broker-b</strong> did not answer" in cluster.page("/groups")[1]
    status, nodes = cluster.api("nodes")
    assert status == 200 and nodes["proxy"]["groups"][-1] == {"name": "broker-b", "answered": False, "queues": None}
    assert "<strong>broker-b</strong> did not answer" in cluster.page("/nodes")[1]
