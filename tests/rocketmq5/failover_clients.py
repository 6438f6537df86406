"""The official RocketMQ 5 Python client (PyPI rocketmq-python-client), unmodified, as an
application runs it against a writer group whose primary fails over: each call that fails
is reported and tried again (a new message for a send), and the process goes on until told
to stop. Every outcome is one JSON line on stdout, printed at once, with its wall time.

    python failover_clients.py produce ENDPOINTS TOPIC STOP_FILE
    python failover_clients.py consume ENDPOINTS GROUP TOPICS STOP_FILE

ENDPOINTS: every replica, ``HOST:PORT;HOST:PORT;…`` (the client's own list syntax).
``produce``: synchronous sends ("python N to TOPIC") until STOP_FILE exists; a line per
receipt ({"n", "message_id", "offset", "queue_id"}) or per failure ({"error"}).
``consume``: a SimpleConsumer of GROUP on TOPICS (comma-separated) receives batches and
acknowledges each message: a line per message received ({"message_id", "body", "attempt"})
and per acknowledgement answered OK ({"acked"}) or failed ({"ack_error"}); it stops once
STOP_FILE exists and nothing came for IDLE_S."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

REQUEST_TIMEOUT_S = 5
INVISIBLE_S = 3  # the writers run with --consumer-min-invisible 3
IDLE_S = 6.0
RETRY_PAUSE_S = 0.1


def emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({**line, "t": time.time()}) + "\n")
    sys.stdout.flush()


def produce(endpoints: str, topic: str, stop_file: str) -> None:
    producer = Producer(
        ClientConfiguration(endpoints, Credentials(), request_timeout=REQUEST_TIMEOUT_S), (topic,)
    )
    producer.startup()
    n = 0
    try:
        while not os.path.exists(stop_file):
            message = Message()
            message.topic = topic
            message.body = f"python {n} to {topic}".encode()
            message.keys = f"python-{n}"
            try:
                receipt = producer.send(message)
            except Exception as error:  # the application's answer to a failed send: try a new one
                emit({"n": n, "error": repr(error)[:300]})
                time.sleep(RETRY_PAUSE_S)
            else:
                queue_id = int(str(receipt.message_queue).rsplit(".", 1)[1])
                emit(
                    {
                        "n": n,
                        "message_id": receipt.message_id,
                        "offset": receipt.offset,
                        "queue_id": queue_id,
                    }
                )
            n += 1
    finally:
        producer.shutdown()


def consume(endpoints: str, group: str, topics: str, stop_file: str) -> None:
    consumer = SimpleConsumer(
        ClientConfiguration(endpoints, Credentials(), request_timeout=REQUEST_TIMEOUT_S),
        group,
        {topic: FilterExpression() for topic in topics.split(",")},
        await_duration=2,
    )
    consumer.startup()
    last_message = time.monotonic()
    try:
        while not (os.path.exists(stop_file) and time.monotonic() - last_message > IDLE_S):
            try:
                messages = consumer.receive(16, INVISIBLE_S)
            except Exception as error:
                emit({"receive_error": repr(error)[:300]})
                time.sleep(RETRY_PAUSE_S)
                continue
            for message in messages:
                last_message = time.monotonic()
                emit(
                    {
                        "message_id": message.message_id,
                        "body": message.body.decode(),
                        "attempt": message.delivery_attempt,
                        "handle": message.receipt_handle,
                    }
                )
                try:
                    consumer.ack(message)
                except Exception as error:
                    emit({"message_id": message.message_id, "handle": message.receipt_handle, "ack_error": repr(error)[:300]})
                else:
                    emit({"message_id": message.message_id, "handle": message.receipt_handle, "acked": True})
    finally:
        consumer.shutdown()


def main() -> None:
    command, *rest = sys.argv[1:]
    if command == "produce":
        produce(*rest)
    elif command == "consume":
        consume(*rest)
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
