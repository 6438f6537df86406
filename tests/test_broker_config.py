"""Topics and consumer groups in Apache RocketMQ 5's files (config/topics.json,
config/subscriptionGroup.json): the layouts Apache writes, what Apache wrote kept, the
migration of rmqstore's own topic table, and orderly groups consuming FIFO."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import grpc
import pytest
from support.inprocess import WriterNode

from rmqstore.common.errors import Corruption
from rmqstore.common.files import broker_config
from rmqstore.v1 import messages_pb2, writer_pb2

# A topics.json as Apache RocketMQ 5.3's broker writes it (fastjson, pretty, tabs): a
# system topic, a FIFO topic with a second attribute, read and write counts that differ.
APACHE_TOPICS = """{
\t"dataVersion":{
\t\t"counter":7,
\t\t"stateVersion":0,
\t\t"timestamp":1732867200000
\t},
\t"topicConfigTable":{
\t\t"TBW102":{
\t\t\t"attributes":{},
\t\t\t"order":false,
\t\t\t"perm":7,
\t\t\t"readQueueNums":8,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"TBW102",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":8
\t\t},
\t\t"Orders":{
\t\t\t"attributes":{
\t\t\t\t"message.type":"FIFO",
\t\t\t\t"cleanup.policy":"DELETE"
\t\t\t},
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":4,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"Orders",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":2
\t\t}
\t}
}"""


def topics_file(store: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((store / "config" / "topics.json").read_text())  # type: ignore[no-any-return]


def test_topics_are_written_in_apaches_layout_with_their_message_type(tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = WriterNode(store)
    try:
        node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Plain", queue_count=2))
        created = node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Ordered", queue_count=3, message_type="FIFO"))
        assert created == writer_pb2.CreateTopicResponse(
            topic=messages_pb2.Topic(name="Ordered", queue_count=3, message_type="FIFO"), created=True
        )
        # Retyped without a count: the queues stay, the type changes.
        retyped = node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Plain", message_type="DELAY"))
        assert (retyped.created, retyped.topic.queue_count, retyped.topic.message_type) == (True, 2, "DELAY")
        same = node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Ordered", message_type="FIFO"))
        assert (same.created, same.topic.queue_count) == (False, 3)
        with pytest.raises(grpc.RpcError) as caught:
            node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Bad", message_type="ORDERED"))
        assert (caught.value.code(), caught.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "message.type 'ORDERED' is not one of NORMAL, FIFO, DELAY, TRANSACTION, MIXED",
        )
        listed = node.stub.ListTopics(writer_pb2.ListTopicsRequest()).topics
        assert [(t.name, t.queue_count, t.message_type) for t in listed] == [("Ordered", 3, "FIFO"), ("Plain", 2, "DELAY")]
    finally:
        node.close()
    document = topics_file(store)
    assert document["topicConfigTable"]["Ordered"] == {
        "attributes": {"message.type": "FIFO"},
        "order": False,
        "perm": 6,
        "readQueueNums": 3,
        "topicFilterType": "SINGLE_TAG",
        "topicName": "Ordered",
        "topicSysFlag": 0,
        "writeQueueNums": 3,
    }
    assert document["topicConfigTable"]["Plain"]["attributes"] == {"message.type": "DELAY"}
    # One DataVersion step a change (three changes; the refused and unchanged ones none).
    assert document["dataVersion"]["counter"] == 3 and document["dataVersion"]["stateVersion"] == 0
    # Each replaced file is kept as .bak, as Apache's ConfigManager keeps it.
    backup = json.loads((store / "config" / "topics.json.bak").read_text())
    assert backup["dataVersion"]["counter"] == 2
    assert not list((store / "config").glob("*.tmp"))
    assert (store / "config" / "topics.json").read_text().startswith('{\n\t"dataVersion":{\n\t\t"counter":3,')


def test_a_topics_json_apache_wrote_is_read_and_kept(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "config").mkdir(parents=True)
    (store / "commitlog").mkdir()  # a store an earlier writer (or Apache) left
    (store / "config" / "topics.json").write_text(APACHE_TOPICS)
    node = WriterNode(store)
    try:
        assert node.writer.topics.queue_count("Orders") == 4  # the larger of read 4 and write 2
        assert node.writer.topics.message_type("Orders") == "FIFO"
        assert node.writer.topics.message_type("TBW102") == "NORMAL"
        node.stub.CreateTopic(writer_pb2.CreateTopicRequest(name="Orders", queue_count=6))
    finally:
        node.close()
    document = topics_file(store)
    orders = document["topicConfigTable"]["Orders"]
    assert orders["attributes"] == {"message.type": "FIFO", "cleanup.policy": "DELETE"}
    assert (orders["readQueueNums"], orders["writeQueueNums"], orders["perm"]) == (6, 6, 6)
    assert document["topicConfigTable"]["TBW102"]["perm"] == 7
    assert document["dataVersion"]["counter"] == 8


def test_rmqstores_own_topic_table_is_migrated_once(tmp_path: Path) -> None:
    """An earlier rmqstore's config/rmqstore-topics.json: its topics move to topics.json as
    MIXED (they accepted NORMAL and FIFO), and the file goes."""
    store = tmp_path / "store"
    (store / "config").mkdir(parents=True)
    (store / "commitlog").mkdir()  # a store an earlier writer (or Apache) left
    topics = {"Orders": 4, "Payments": 2}
    canonical = json.dumps(sorted(topics.items()), separators=(",", ":")).encode()
    legacy = {"magic": "rmqstore-topics", "version": 1, "topics": topics, "crc32": zlib.crc32(canonical)}
    (store / "config" / "rmqstore-topics.json").write_text(json.dumps(legacy))
    node = WriterNode(store)
    try:
        assert node.writer.topics.snapshot() == {"Orders": 4, "Payments": 2}
        assert node.writer.topics.types_snapshot() == {"Orders": "MIXED", "Payments": "MIXED"}
        assert sorted(p.name for p in (store / "consumequeue" / "Payments").iterdir()) == ["0", "1"]
    finally:
        node.close()
    assert not (store / "config" / "rmqstore-topics.json").exists()
    table = topics_file(store)["topicConfigTable"]
    assert {n: (e["readQueueNums"], e["attributes"]) for n, e in table.items()} == {
        "Orders": (4, {"message.type": "MIXED"}),
        "Payments": (2, {"message.type": "MIXED"}),
    }
    again = WriterNode(store)
    try:
        assert again.writer.topics.types_snapshot() == {"Orders": "MIXED", "Payments": "MIXED"}
    finally:
        again.close()


def test_a_damaged_legacy_table_is_refused_not_migrated(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "config").mkdir(parents=True)
    (store / "commitlog").mkdir()  # a store an earlier writer (or Apache) left
    legacy = {"magic": "rmqstore-topics", "version": 1, "topics": {"Orders": 4}, "crc32": 1}
    (store / "config" / "rmqstore-topics.json").write_text(json.dumps(legacy))
    with pytest.raises(Corruption, match=r"rmqstore-topics\.json fails its checksum"):
        WriterNode(store)
    assert (store / "config" / "rmqstore-topics.json").exists()
    assert not (store / "config" / "topics.json").exists()


def test_a_damaged_topics_json_falls_back_to_its_bak_else_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "topics.json").write_text('{"topicConfigTable":{"A":{"topicName":"A","readQueueNums":1')
    with pytest.raises(Corruption, match=r"topics\.json is not readable JSON"):
        broker_config.read_table(str(config), "topics.json", "topicConfigTable", "topicName")
    (config / "topics.json.bak").write_text(APACHE_TOPICS)
    assert broker_config.read_topic_types(str(config)) == {"TBW102": "NORMAL", "Orders": "FIFO"}
    bad_type = APACHE_TOPICS.replace('"message.type":"FIFO"', '"message.type":"ORDERED"')
    with pytest.raises(Corruption, match=r"topic Orders: message\.type 'ORDERED' is not a TopicMessageType"):
        broker_config.parse_table(bad_type, "topicConfigTable", "topicName", path="topics.json")
    bad_count = APACHE_TOPICS.replace('"readQueueNums":4', '"readQueueNums":"4"')
    with pytest.raises(Corruption, match="topic Orders: readQueueNums and writeQueueNums must be integers"):
        broker_config.parse_table(bad_count, "topicConfigTable", "topicName", path="topics.json")


def test_subscription_groups_in_apaches_layout_and_orderly_groups_consume_fifo(tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = WriterNode(store, fifo_groups=("Flagged",))
    try:
        made = node.stub.UpdateSubscriptionGroup(writer_pb2.UpdateSubscriptionGroupRequest(group="Billing", consume_orderly=True))
        assert made == writer_pb2.UpdateSubscriptionGroupResponse(group="Billing", consume_orderly=True, changed=True)
        plain = node.stub.UpdateSubscriptionGroup(writer_pb2.UpdateSubscriptionGroupRequest(group="Audit"))
        assert plain == writer_pb2.UpdateSubscriptionGroupResponse(group="Audit", consume_orderly=False, changed=True)
        kept = node.stub.UpdateSubscriptionGroup(writer_pb2.UpdateSubscriptionGroupRequest(group="Billing"))
        assert (kept.consume_orderly, kept.changed) == (True, False)
        assert [node.messaging.consumers.is_fifo(g) for g in ("Billing", "Audit", "Flagged")] == [True, False, True]
        with pytest.raises(grpc.RpcError) as caught:
            node.stub.UpdateSubscriptionGroup(writer_pb2.UpdateSubscriptionGroupRequest(group="no/such"))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "consumer group 'no/such' must be 1-" in str(caught.value.details())
        node.stub.UpdateSubscriptionGroup(writer_pb2.UpdateSubscriptionGroupRequest(group="Billing", consume_orderly=False))
        assert not node.messaging.consumers.is_fifo("Billing")
        node.stub.UpdateSubscriptionGroup(writer_pb2.UpdateSubscriptionGroupRequest(group="Billing", consume_orderly=True))
    finally:
        node.close()
    document = json.loads((store / "config" / "subscriptionGroup.json").read_text())
    assert sorted(document) == ["dataVersion", "forbiddenTable", "subscriptionGroupTable"]
    assert document["subscriptionGroupTable"]["Billing"] == {
        "attributes": {},
        "brokerId": 0,
        "consumeBroadcastEnable": True,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeMessageOrderly": True,
        "consumeTimeoutMinute": 15,
        "groupName": "Billing",
        "groupRetryPolicy": {"type": "CUSTOMIZED"},
        "groupSysFlag": 0,
        "notifyConsumerIdsChangedEnable": True,
        "retryMaxTimes": 16,
        "retryQueueNums": 1,
        "whichBrokerWhenConsumeSlowly": 1,
    }
    assert document["dataVersion"]["counter"] == 4
    again = WriterNode(store)
    try:
        assert [again.messaging.consumers.is_fifo(g) for g in ("Billing", "Audit", "Flagged")] == [True, False, False]
    finally:
        again.close()
