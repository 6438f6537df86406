"""The official RocketMQ 5 Python client (PyPI rocketmq-python-client) as a user runs it,
unmodified, in its own virtualenv and process: the tests and the benchmark drive it with
this script. Each acknowledged send is printed at once as one JSON line on stdout (what
was sent and the receipt), so a process killed mid-loop has reported every OK receipt.

    python python_producer.py send ENDPOINT TOPIC FIFO_TOPIC COUNT
    python python_producer.py loop ENDPOINT TOPIC SECONDS
    python python_producer.py bench ENDPOINT TOPIC COUNT CONCURRENCY
    python python_producer.py timed ENDPOINT TOPIC COUNT DELAY_MS RECALL_EVERY

``send``: COUNT messages, three quarters to TOPIC (tag, two keys, user properties; sync
and async sends alternating in blocks) and a quarter to FIFO_TOPIC (eight message groups,
sent synchronously so each group's order is the send order). ``loop``: synchronous sends
until SECONDS pass or the process is killed. ``bench``: COUNT async sends with
CONCURRENCY in flight; prints {"messages", "seconds"}. ``timed``: COUNT DELAY messages
("message N to TOPIC"), message N due DELAY_MS + 10·N ms after it is sent, rounded up to
the second (``delivery_timestamp``, which this client takes in seconds), every RECALL_EVERY-th (from 0) recalled by its receipt's recall
handle at once; each line adds "due" (ms) and "recalled"."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from rocketmq import ClientConfiguration, Credentials, Message, Producer

ASYNC_BLOCK = 64
FIFO_GROUPS = 8


def producer_for(endpoint: str, *topics: str) -> Producer:
    producer = Producer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), topics)
    producer.startup()
    return producer


def make(topic: str, n: int, group: str | None = None) -> tuple[Message, dict[str, Any]]:
    message = Message()
    message.topic = topic
    body = f"message {n} to {topic}".encode()
    message.body = body
    sent: dict[str, Any] = {"topic": topic, "body": body.decode(), "n": n}
    if group is None:
        message.tag = f"Tag{n % 3}"
        message.keys = f"order-{n}"
        message.keys = f"customer-{n % 100}"
        message.add_property("seq", str(n))
        message.add_property("origin", "python-client")
        sent.update(tag=f"Tag{n % 3}", keys=sorted([f"order-{n}", f"customer-{n % 100}"]))
        sent["properties"] = {"seq": str(n), "origin": "python-client"}
    else:
        message.message_group = group
        message.keys = f"fifo-{n}"
        sent.update(group=group, keys=[f"fifo-{n}"])
    return message, sent


def report(sent: dict[str, Any], receipt: Any, mode: str) -> None:
    queue_id = int(str(receipt.message_queue).rsplit(".", 1)[1])
    line = {**sent, "mode": mode, "message_id": receipt.message_id, "offset": receipt.offset, "queue_id": queue_id}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def send(endpoint: str, topic: str, fifo_topic: str, count: int) -> None:
    producer = producer_for(endpoint, topic, fifo_topic)
    try:
        fifo_count = count // 4
        n = 0
        while n < count - fifo_count:
            block = list(range(n, min(n + ASYNC_BLOCK, count - fifo_count)))
            if (n // ASYNC_BLOCK) % 2:
                futures = [(make(topic, i), None) for i in block]
                pending = [(sent, producer.send_async(message)) for (message, sent), _ in futures]
                for sent, future in pending:
                    report(sent, future.result(timeout=30), "async")
            else:
                for i in block:
                    message, sent = make(topic, i)
                    report(sent, producer.send(message), "sync")
            n = block[-1] + 1
        for i in range(count - fifo_count, count):
            message, sent = make(fifo_topic, i, group=f"group-{i % FIFO_GROUPS}")
            report(sent, producer.send(message), "sync")
    finally:
        producer.shutdown()


def loop(endpoint: str, topic: str, seconds: float) -> None:
    producer = producer_for(endpoint, topic)
    sys.stdout.write(json.dumps({"started": True}) + "\n")
    sys.stdout.flush()
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        message, sent = make(topic, n)
        report(sent, producer.send(message), "sync")
        n += 1
    producer.shutdown()


def bench(endpoint: str, topic: str, count: int, concurrency: int) -> None:
    producer = producer_for(endpoint, topic)
    try:
        # Warm the route and the channel before timing.
        producer.send(make(topic, -1)[0])
        slots = threading.Semaphore(concurrency)
        done = threading.Event()
        remaining = [count]
        failures: list[BaseException] = []
        lock = threading.Lock()

        def finished(future: Any) -> None:
            if future.exception() is not None:
                failures.append(future.exception())
            slots.release()
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        started = time.perf_counter()
        for n in range(count):
            slots.acquire()
            producer.send_async(make(topic, n)[0]).add_done_callback(finished)
        done.wait(timeout=600)
        seconds = time.perf_counter() - started
        if failures:
            raise RuntimeError(f"{len(failures)} sends failed, first: {failures[0]!r}")
        print(json.dumps({"messages": count, "seconds": seconds}), flush=True)
    finally:
        producer.shutdown()


def timed(endpoint: str, topic: str, count: int, delay_ms: int, recall_every: int) -> None:
    producer = producer_for(endpoint, topic)
    try:
        for n in range(count):
            message = Message()
            message.topic = topic
            message.body = f"message {n} to {topic}".encode()
            # The client takes whole seconds (it fills the Timestamp's seconds with it).
            due_s = -(-(int(time.time() * 1000) + delay_ms + 10 * n) // 1000)
            message.delivery_timestamp = due_s
            due = due_s * 1000
            receipt = producer.send(message)
            recalled = recall_every > 0 and n % recall_every == 0
            if recalled:
                producer.recall_message(topic, receipt.recall_handle)
            report({"topic": topic, "body": message.body.decode(), "n": n, "due": due, "recalled": recalled}, receipt, "sync")
    finally:
        producer.shutdown()


def main() -> None:
    command, endpoint, *rest = sys.argv[1:]
    if command == "send":
        send(endpoint, rest[0], rest[1], int(rest[2]))
    elif command == "timed":
        timed(endpoint, rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
    elif command == "loop":
        loop(endpoint, rest[0], float(rest[1]))
    elif command == "bench":
        bench(endpoint, rest[0], int(rest[1]), int(rest[2]))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
