"""The official RocketMQ 5 Python client's consumers (PyPI rocketmq-python-client), unmodified,
in their own virtualenv and process, as the tests drive them. Every message is printed as
one JSON line on stdout the moment it is handled (so a process stopped mid-run has
reported all it did), ``"acked": true`` only once the writer answered the ack OK.

    python python_consumer.py simple ENDPOINT GROUP TOPIC [options]
    python python_consumer.py push ENDPOINT GROUP TOPIC [options]

TOPIC may name several, separated by commas. ``simple``: a SimpleConsumer receives (batches of --batch, invisible for --invisible-s)
until --expect messages were handled (or every body listed in the file --want), or
nothing came for --idle-s (--tolerate: a receive or ack that raises is printed as
``{"error": ...}`` and the loop goes on, as an application riding out a server's loss
would). --ack none leaves every
message unacknowledged; --renew N makes message N invisible for --renew-s more instead of
acking it (ChangeInvisibleDuration). ``push``: a PushConsumer whose listener answers
FAILURE for the messages whose number (in the body "message N to TOPIC") is a multiple of
--fail-mod, SUCCESS for the rest,
for --seconds."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import FilterType

_print_lock = threading.Lock()


def emit(line: dict[str, Any]) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


def describe(message: Any) -> dict[str, Any]:
    return {
        "message_id": message.message_id,
        "body": message.body.decode(),
        "tag": message.tag,
        "group": message.message_group,
        "attempt": message.delivery_attempt,
        "topic": message.topic,
        "properties": dict(message.properties or {}),
        "t": time.time(),
    }


def subscription(args: argparse.Namespace) -> FilterExpression:
    if args.sql:
        return FilterExpression(args.sql, FilterType.SQL)
    return FilterExpression(args.tag) if args.tag else FilterExpression()


def simple(args: argparse.Namespace) -> None:
    expression = subscription(args)
    consumer = SimpleConsumer(
        ClientConfiguration(args.endpoint, Credentials(), request_timeout=10),
        args.group,
        {topic: expression for topic in args.topic.split(",")},
        await_duration=args.await_s,
    )
    consumer.startup()
    handled = 0
    wanted = set(open(args.want, encoding="utf-8").read().splitlines()) if args.want else None
    idle_since = time.monotonic()
    try:
        while handled < args.expect and wanted != set() and time.monotonic() - idle_since < args.idle_s:
            try:
                messages = consumer.receive(args.batch, args.invisible_s)
            except Exception as error:
                if not args.tolerate:
                    raise
                emit({"error": f"receive: {error}"})
                time.sleep(0.2)
                continue
            if messages:
                idle_since = time.monotonic()
            for message in messages:
                line = describe(message)
                handled += 1
                if wanted is not None:
                    wanted.discard(line["body"])
                if args.renew is not None and handled == args.renew:
                    consumer.change_invisible_duration(message, args.renew_s)
                    line["renewed"] = True
                elif args.ack == "all":
                    try:
                        consumer.ack(message)
                        line["acked"] = True
                    except Exception as error:
                        if not args.tolerate:
                            raise
                        line["error"] = f"ack: {error}"
                line["t_done"] = time.time()
                emit(line)
                time.sleep(args.pace_s)  # pacing asked for: a slow consumer is what the test measures
    finally:
        consumer.shutdown()


class Listener(MessageListener):  # type: ignore[misc]
    def __init__(self, fail_mod: int):
        self.fail_mod = fail_mod

    def consume(self, message: Any) -> Any:
        line = describe(message)
        # The bodies are "message N to TOPIC" (python_producer.py).
        fail = self.fail_mod > 0 and int(line["body"].split(" ")[1]) % self.fail_mod == 0
        line["result"] = "FAILURE" if fail else "SUCCESS"
        emit(line)
        return ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS


def push(args: argparse.Namespace) -> None:
    expression = subscription(args)
    consumer = PushConsumer(
        ClientConfiguration(args.endpoint, Credentials(), request_timeout=10),
        args.group,
        Listener(args.fail_mod),
        {topic: expression for topic in args.topic.split(",")},
    )
    consumer.startup()
    try:
        time.sleep(args.seconds)  # the push consumer runs, its listener called, for the time asked
    finally:
        consumer.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["simple", "push"])
    parser.add_argument("endpoint")
    parser.add_argument("group")
    parser.add_argument("topic")
    parser.add_argument("--tag", default="")
    parser.add_argument("--sql", default="", help="a SQL92 expression to subscribe by, instead of a tag")
    parser.add_argument("--expect", type=int, default=1_000_000)
    # A safety net: the tests stop a consumer by --expect or --want where they can.
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--want", default="", help="a file of bodies, one a line: stop once each was handled")
    parser.add_argument("--pace-s", type=float, default=0.0, help="a pause after each message handled")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--invisible-s", type=int, default=30)
    parser.add_argument("--await-s", type=int, default=2)
    parser.add_argument("--ack", choices=["all", "none"], default="all")
    parser.add_argument("--renew", type=int, default=None)
    parser.add_argument("--renew-s", type=int, default=60)
    parser.add_argument("--tolerate", action="store_true")
    parser.add_argument("--fail-mod", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    simple(args) if args.mode == "simple" else push(args)


if __name__ == "__main__":
    main()
