"""The official RocketMQ 5 Python client's SimpleConsumer (PyPI rocketmq-python-client),
unmodified, as benchmarks/consumer_bench.py drives it: in its own virtualenv (it bundles
its own copy of the v2 protos) and its own process. Prints one JSON line at the end.

    python consumer_client.py rate ENDPOINT TOPIC GROUP COUNT BATCH
    python consumer_client.py latency ENDPOINT TOPIC GROUP COUNT BATCH DEADLINE_S

``rate``: receive batches of BATCH (a waiting long poll) and acknowledge each message
(the batch's acks sent together from threads, then waited for), until COUNT distinct messages came; prints
{"messages", "duplicates", "seconds"}, the time from the first receive call on.
``latency``: the same while a producer sends; each body is the send time (time.time_ns,
the same machine's clock); prints {"messages", "duplicates", "latencies_us"} (receive time
minus send time, one per message), stopping at COUNT or DEADLINE_S."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

INVISIBLE_S = 30
AWAIT_S = 5


def consume(endpoint: str, topic: str, group: str, count: int, batch: int, deadline_s: float, stamped: bool) -> dict[str, object]:
    consumer = SimpleConsumer(
        ClientConfiguration(endpoint, Credentials(), request_timeout=10), group, {topic: FilterExpression()}, await_duration=AWAIT_S
    )
    consumer.startup()
    # The client's ack_async answers through a callback executor a SimpleConsumer never
    # starts (its futures never complete): the batch's acks go out from threads instead.
    acking = ThreadPoolExecutor(max_workers=batch)
    seen: set[str] = set()
    duplicates = 0
    latencies_us: list[int] = []
    try:
        started = time.perf_counter()
        stop_at = time.monotonic() + deadline_s
        while len(seen) < count and time.monotonic() < stop_at:
            messages = consumer.receive(batch, INVISIBLE_S)
            arrived_ns = time.time_ns()
            acks = [acking.submit(consumer.ack, message) for message in messages]
            for message in messages:
                if message.message_id in seen:
                    duplicates += 1
                seen.add(message.message_id)
                if stamped:
                    latencies_us.append((arrived_ns - int(message.body)) // 1000)
            for ack in acks:
                ack.result(timeout=30)
        seconds = time.perf_counter() - started
    finally:
        acking.shutdown()
        consumer.shutdown()
    result: dict[str, object] = {"messages": len(seen), "duplicates": duplicates, "seconds": seconds}
    if stamped:
        result["latencies_us"] = latencies_us
    return result


def main() -> None:
    mode, endpoint, topic, group, count, batch = sys.argv[1:7]
    if mode == "rate":
        print(json.dumps(consume(endpoint, topic, group, int(count), int(batch), 600.0, stamped=False)), flush=True)
    elif mode == "latency":
        print(json.dumps(consume(endpoint, topic, group, int(count), int(batch), float(sys.argv[7]), stamped=True)), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}: rate or latency")


if __name__ == "__main__":
    main()
