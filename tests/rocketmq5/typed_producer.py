"""The official RocketMQ 5 Python client's producer sending one message of each asked
type, unmodified, in its own process: for each TOPIC:TYPE argument (TYPE NORMAL, FIFO or
DELAY, due a second ahead, or TRANSACTION, committed at once) one JSON line with the
receipt, or the exception the client raised (its class and words) when it refused the send.

    python typed_producer.py ENDPOINT TOPIC:TYPE..."""

from __future__ import annotations

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer
from rocketmq.grpc_protocol import TransactionResolution
from rocketmq.v5.producer import TransactionChecker


class Rollback(TransactionChecker):
    """Every transaction here is committed at once: a check would mean a lost commit."""

    def check(self, message: object) -> TransactionResolution:
        return TransactionResolution.ROLLBACK


def message_of(topic: str, kind: str) -> Message:
    message = Message()
    message.topic = topic
    message.body = f"{kind} to {topic}".encode()
    message.keys = f"{kind}-{topic}"
    if kind == "FIFO":
        message.message_group = "group-1"
    elif kind == "DELAY":
        message.delivery_timestamp = int(time.time()) + 1  # the client takes whole seconds
    return message


def main() -> None:
    endpoint, *pairs = sys.argv[1:]
    wanted = [pair.split(":") for pair in pairs]
    topics = tuple({t for t, _ in wanted})
    producer = Producer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), topics, checker=Rollback())
    producer.startup()
    try:
        for topic, kind in wanted:
            line: dict[str, object] = {"topic": topic, "type": kind}
            try:
                if kind == "TRANSACTION":
                    transaction = producer.begin_transaction()
                    receipt = producer.send(message_of(topic, kind), transaction)
                    transaction.commit()
                else:
                    receipt = producer.send(message_of(topic, kind))
            except Exception as error:  # the client's own refusal is what is reported
                line.update(error=type(error).__name__, message=str(error))
            else:
                line.update(message_id=receipt.message_id, offset=receipt.offset)
            print(json.dumps(line), flush=True)
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main()
