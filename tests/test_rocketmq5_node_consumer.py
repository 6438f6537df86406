"""The official RocketMQ 5 Node.js client's SimpleConsumer (npm rocketmq-client-nodejs,
unmodified, tests/node/official_simple_consumer.js) against a ``rmqstore writer serve``
process: the 1,000 messages its Producer sent are received and acknowledged, each exactly
once; none comes back after the invisible duration; and the group's progress, flushed to
config/consumerOffset.json, is what ``rmqstore consumerProgress`` reports through a
``rmqstore query serve`` process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run_cli
from support.nodes import Nodes
from support.rmq5 import NODE_CLIENT_MESSAGES, make_topics, run_node
from support.stores import SIZE_ARGS
from support.wait import wait_until

from rmqstore.common.files.consumer_offsets import read_offsets

TOPIC = "NodeConsumed"
GROUP = "node-simple"
# The writer flushes group offsets every second; this is several flushes.
PROGRESS_WAIT_S = 15.0


@pytest.mark.slow
def test_official_nodejs_simple_consumer_receives_and_acks_each_message_once(nodes: Nodes, tmp_path: Path) -> None:
    store = tmp_path / "store"
    # The script receives for 2 s (INVISIBLE_MS), under Apache's 10 s minimum.
    writer = nodes.start("writer", store, *SIZE_ARGS, "--consumer-min-invisible", "1")
    make_topics(writer.endpoint, {TOPIC: "NORMAL"})
    sent = [json.loads(line) for line in run_node(tmp_path, "official_producer.js", writer.endpoint, TOPIC, str(NODE_CLIENT_MESSAGES)).splitlines()]
    assert len({s["message_id"] for s in sent}) == NODE_CLIENT_MESSAGES
    output = run_node(tmp_path, "official_simple_consumer.js", writer.endpoint, TOPIC, GROUP, str(NODE_CLIENT_MESSAGES))
    received = [json.loads(line) for line in output.splitlines()]
    during = [r for r in received if not r["after"]]
    # Exactly once: every message sent, no message twice, each on its first delivery.
    assert sorted(r["message_id"] for r in during) == sorted(s["message_id"] for s in sent)
    by_id = {s["message_id"]: s for s in sent}
    for r in during:
        s = by_id[r["message_id"]]
        assert (r["topic"], r["body"], r["tag"], sorted(r["keys"]), r["offset"]) == (TOPIC, s["body"], s["tag"], s["keys"], s["offset"]), r
        assert (r["delivery_attempt"], r["corrupted"]) == (1, False), r
    # Acknowledged messages do not come back once their invisible duration is over.
    assert [r for r in received if r["after"]] == []
    # The Node.js client writes and reads queue 0 only (its route filter): the group's
    # progress there is every message, in Apache's layout, and the query node reports it.
    query = nodes.start("query", store, *SIZE_ARGS)
    wait_until(lambda: read_offsets(str(store / "config")).get((TOPIC, GROUP), {}).get(0) == NODE_CLIENT_MESSAGES,
               PROGRESS_WAIT_S, f"the group's progress on queue 0 to reach {NODE_CLIENT_MESSAGES}", interval_s=0.1)  # fmt: skip
    progress = run_cli(["consumerProgress", "-g", GROUP, "-t", TOPIC, "--json", "--endpoint", query.endpoint])
    assert progress.returncode == 0, progress.stderr
    document = json.loads(progress.stdout)
    assert document["diffTotal"] == 0
    assert [(q["queueId"], q["brokerOffset"], q["consumerOffset"], q["diff"]) for q in document["queues"] if q["queueId"] == 0] == [
        (0, NODE_CLIENT_MESSAGES, NODE_CLIENT_MESSAGES, 0)
    ]
    query.stop()
    writer.stop()
