"""The official RocketMQ 5 Python client's transactional producer (PyPI
rocketmq-python-client), unmodified, in its own virtualenv and process, as the tests drive
it. Each line on stdout is one JSON object, printed at once.

    python python_transactions.py end ENDPOINT TOPIC COUNT
    python python_transactions.py orphan ENDPOINT TOPIC COUNT [--checks N] [--seconds S]
    python python_transactions.py checker ENDPOINT TOPIC --checks N [--seconds S]

``end``: COUNT half messages ("commit N" or "rollback N", alternating), each ended at once
with its transaction's commit or rollback; a line per message (body, message_id,
transaction_id, resolution). ``orphan``: COUNT half messages ("commit N" for even N,
"rollback N" for odd) that are never ended; a line per send ({"sent": body, ...}); then, with
--checks, the producer stays up until its checker was asked N times (or --seconds passed).
``checker``: a producer that sends nothing and answers checks. The checker answers COMMIT
for a body starting "commit", ROLLBACK otherwise, and prints {"checked": body, "answer": ...}."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from rocketmq import ClientConfiguration, Credentials, Message, Producer
from rocketmq.grpc_protocol import TransactionResolution
from rocketmq.v5.producer import TransactionChecker

_print_lock = threading.Lock()


def emit(line: dict[str, Any]) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


class BodyChecker(TransactionChecker):
    def __init__(self) -> None:
        self.checked = 0
        self.lock = threading.Lock()

    def check(self, message: Any) -> Any:
        body = message.body.decode()
        answer = TransactionResolution.COMMIT if body.startswith("commit") else TransactionResolution.ROLLBACK
        emit({"checked": body, "message_id": message.message_id, "answer": "COMMIT" if body.startswith("commit") else "ROLLBACK"})
        with self.lock:
            self.checked += 1
        return answer


def producer_for(endpoint: str, topic: str, checker: BodyChecker) -> Producer:
    producer = Producer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), (topic,), checker=checker)
    producer.startup()
    return producer


def half(topic: str, body: str) -> Message:
    message = Message()
    message.topic = topic
    message.body = body.encode()
    message.tag = "Tx"
    message.keys = body.replace(" ", "-")
    return message


def wait_checks(checker: BodyChecker, wanted: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with checker.lock:
            if checker.checked >= wanted:
                time.sleep(1)  # the last answer's EndTransaction is sent from the client's own thread
                return
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("end", "orphan", "checker"))
    parser.add_argument("endpoint")
    parser.add_argument("topic")
    parser.add_argument("count", type=int, nargs="?", default=0)
    parser.add_argument("--checks", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    checker = BodyChecker()
    producer = producer_for(args.endpoint, args.topic, checker)
    try:
        for n in range(args.count):
            body = f"{'commit' if n % 2 == 0 else 'rollback'} {n}"
            transaction = producer.begin_transaction()
            receipt = producer.send(half(args.topic, body), transaction)
            line = {"sent": body, "message_id": receipt.message_id, "transaction_id": receipt.transaction_id}
            if args.mode == "end":
                if n % 2 == 0:
                    transaction.commit()
                    line["resolution"] = "COMMIT"
                else:
                    transaction.rollback()
                    line["resolution"] = "ROLLBACK"
            emit(line)
        if args.checks:
            wait_checks(checker, args.checks, args.seconds)
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main()
