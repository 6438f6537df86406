"""A hostile client of the RocketMQ 5 gateway for tests/test_gateway_limits.py, run as its
own process: it holds many calls open against a writer, unsigned, and then keeps them so.

    python hostile_gateway.py ENDPOINT KIND COUNT [TOPIC [GROUP]]

KIND:

* ``polls``: COUNT ReceiveMessage long polls (30 s) of GROUP on TOPIC, each issued
  again when it ends, on 8 connections;
* ``watch``: COUNT grpc health Watch streams, each read once, on 16 connections;
* ``repoll``: COUNT clients, each sending ReceiveMessage calls of GROUP on TOPIC without
  a long poll, ``REPOLL_PAUSE_S`` apart, for as long as it runs;
* ``greedy``: COUNT clients, each asking GREEDY_BATCH messages of TOPIC's queue 0 for as
  long as it runs, by ReceiveMessage (1 s invisibility: they come back) and PullMessage
  from offset 0 in turn (benchmarks/gateway_under_fire.py);
* ``big``: COUNT ReceiveMessage calls (each of a group of its own) and COUNT PullMessage
  calls from offset 0, all at once, each asking ``BIG_BATCH`` messages of TOPIC's queue 0.

The client prints one JSON line, {"event": "open", "count": n, "refused": {...}} once every
call is issued (a Watch once its first answer came), then holds them until its stdin
closes, and exits without ending them; for ``big``, once every call is answered,
{"event": "answered", "receive": [[body sizes], ...], "pull": [[[body sizes], next offset], ...]}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc

OPEN_TIMEOUT_S = 120.0
POLL_S = 30
BIG_BATCH = 40
GREEDY_BATCH = 100
REPOLL_PAUSE_S = 0.01


def channels(endpoint: str, count: int) -> list[grpc.aio.Channel]:
    # A channel of its own per connection: channels with the same target and options share one.
    return [
        grpc.aio.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1), ("rmqstore.connection", i)])
        for i in range(count)
    ]


def receive_request(topic: str, group: str, batch: int, invisible_s: int, poll_s: int) -> v2s.ReceiveMessageRequest:
    """A ReceiveMessage of every tag on queue 0 of ``topic``."""
    return v2s.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=batch,
        invisible_duration=duration_pb2.Duration(seconds=invisible_s),
        long_polling_timeout=duration_pb2.Duration(seconds=poll_s),
    )


async def poll_forever(channel: grpc.aio.Channel, topic: str, group: str, issued: asyncio.Event, refused: Counter[str]) -> None:
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    request = receive_request(topic, group, 32, 60, POLL_S)
    while True:
        call = stub.ReceiveMessage(request, timeout=POLL_S + 10)
        issued.set()
        try:
            async for answer in call:
                if answer.HasField("status") and answer.status.code not in (v2.OK, v2.MESSAGE_NOT_FOUND):
                    refused[str(answer.status.code)] += 1
        except grpc.RpcError as error:
            refused[str(error.code())] += 1  # type: ignore[attr-defined]
            await asyncio.sleep(1)


async def repoll_forever(channel: grpc.aio.Channel, topic: str, group: str, issued: asyncio.Event, refused: Counter[str]) -> None:
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    request = receive_request(topic, group, 32, 43_200, 0)
    while True:
        async for answer in stub.ReceiveMessage(request, timeout=OPEN_TIMEOUT_S):
            if answer.HasField("status") and answer.status.code not in (v2.OK, v2.MESSAGE_NOT_FOUND):
                refused[str(answer.status.code)] += 1
        issued.set()
        await asyncio.sleep(REPOLL_PAUSE_S)


async def greedy_forever(channel: grpc.aio.Channel, topic: str, group: str, issued: asyncio.Event, refused: Counter[str]) -> None:
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    queue = v2.MessageQueue(topic=v2.Resource(name=topic), id=0)
    everything = v2.FilterExpression(type=v2.TAG, expression="*")
    receive = receive_request(topic, group, GREEDY_BATCH, 1, 0)
    pull = v2s.PullMessageRequest(
        group=v2.Resource(name=group), message_queue=queue, offset=0, batch_size=GREEDY_BATCH, filter_expression=everything
    )
    while True:
        for call in (stub.ReceiveMessage(receive, timeout=OPEN_TIMEOUT_S), stub.PullMessage(pull, timeout=OPEN_TIMEOUT_S)):
            try:
                async for _ in call:
                    pass
            except grpc.RpcError as error:
                refused[str(error.code())] += 1  # type: ignore[attr-defined]
            issued.set()


async def watch(channel: grpc.aio.Channel, refused: Counter[str]) -> Any:
    call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
    try:
        await call.read()
    except grpc.RpcError as error:
        refused[str(error.code())] += 1  # type: ignore[attr-defined]
    return call


async def big_receive(channel: grpc.aio.Channel, topic: str, group: str) -> list[int]:
    request = receive_request(topic, group, BIG_BATCH, 60, 0)
    answers = [a async for a in service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(request, timeout=OPEN_TIMEOUT_S)]
    return [len(a.message.body) for a in answers if a.HasField("message")]


async def big_pull(channel: grpc.aio.Channel, topic: str, group: str) -> tuple[list[int], list[int]]:
    request = v2s.PullMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
        offset=0,
        batch_size=BIG_BATCH,
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
    )
    answers = [a async for a in service_pb2_grpc.MessagingServiceStub(channel).PullMessage(request, timeout=OPEN_TIMEOUT_S)]
    return [len(a.message.body) for a in answers if a.HasField("message")], [a.next_offset for a in answers if a.HasField("next_offset")]


async def hold(count: int, call: Callable[[int, asyncio.Event], Awaitable[None]]) -> list[Any]:
    """``count`` tasks of ``call(i, issued)``, once each has set its ``issued``."""
    events = [asyncio.Event() for _ in range(count)]
    held = [asyncio.ensure_future(call(i, events[i])) for i in range(count)]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in events)), OPEN_TIMEOUT_S)
    return held


async def main(endpoint: str, kind: str, count: int, topic: str, group: str) -> None:
    refused: Counter[str] = Counter()
    held: list[Any] = []
    if kind == "polls":
        connections = channels(endpoint, 8)
        held = await hold(count, lambda i, issued: poll_forever(connections[i % len(connections)], topic, group, issued, refused))
    elif kind == "repoll":
        connections = channels(endpoint, count)
        held = await hold(count, lambda i, issued: repoll_forever(connections[i], topic, group, issued, refused))
    elif kind == "greedy":
        connections = [
            grpc.aio.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 64 << 20), ("rmqstore.connection", i)])
            for i in range(count)
        ]
        held = await hold(count, lambda i, issued: greedy_forever(connections[i], topic, f"{group}{i}", issued, refused))
    elif kind == "watch":
        connections = channels(endpoint, 16)
        held = await asyncio.wait_for(
            asyncio.gather(*(watch(connections[i % len(connections)], refused) for i in range(count))), OPEN_TIMEOUT_S
        )
    elif kind == "big":
        connection = grpc.aio.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 64 << 20)])
        receives = [big_receive(connection, topic, f"{group}{i}") for i in range(count)]
        pulls = [big_pull(connection, topic, group) for _ in range(count)]
        answered = await asyncio.wait_for(asyncio.gather(*receives, *pulls), OPEN_TIMEOUT_S)
        print(json.dumps({"event": "answered", "receive": answered[:count], "pull": answered[count:]}), flush=True)
        return
    else:
        raise SystemExit(f"unknown kind {kind}")
    print(json.dumps({"event": "open", "count": count, "refused": dict(refused)}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    del held  # held open until here


if __name__ == "__main__":
    endpoint, kind, count_text, *rest = sys.argv[1:]
    topic = rest[0] if rest else "Idle"
    group = rest[1] if len(rest) > 1 else "idlers"
    asyncio.run(main(endpoint, kind, int(count_text), topic, group))
