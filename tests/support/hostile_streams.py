"""A hostile client for the hostile-stream tests, run as its own process: it opens many
streams against a node and then neither reads nor ends them.

    python hostile_streams.py ENDPOINT writer|query IDLE STALLED CONNECTIONS [TOPIC]

* IDLE streams are health Watch calls: the first answer is read, then nothing more.
* STALLED streams against a query node are StreamByTime calls over all of TOPIC's queue 0
  whose answers are never read; against a writer, SendStream calls that send
  ``STALLED_SENDS`` one-message requests and never read an ack.

The streams are spread over CONNECTIONS connections. The client prints one JSON line,
{"event": "open", "idle": n, "stalled": m, "refused": {...}} once every stream is open
(an idle one has had its first answer; a stalled one its first message or its sends),
then holds them until its stdin closes, and exits without ending them.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc, writer_pb2, writer_pb2_grpc

STALLED_SENDS = 20
OPEN_TIMEOUT_S = 120.0


async def idle(channel: grpc.aio.Channel, refused: Counter[str]) -> Any:
    call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
    try:
        await call.read()
    except grpc.RpcError as error:
        refused[str(error.code())] += 1  # type: ignore[attr-defined]
    return call


async def stalled_query(channel: grpc.aio.Channel, topic: str, refused: Counter[str]) -> Any:
    call = query_pb2_grpc.QueryServiceStub(channel).StreamByTime(
        query_pb2.StreamByTimeRequest(topic=topic, queue_id=0, begin_ms=0, end_ms=2**62)
    )
    try:
        await call.read()  # the first message; the rest stay unread
    except grpc.RpcError as error:
        refused[str(error.code())] += 1  # type: ignore[attr-defined]
    return call


async def stalled_writer(channel: grpc.aio.Channel, topic: str, refused: Counter[str]) -> Any:
    call = writer_pb2_grpc.WriterServiceStub(channel).SendStream()
    request = writer_pb2.SendBatchRequest(messages=[messages_pb2.Message(topic=topic, body=b"h" * 100)])
    try:
        for _ in range(STALLED_SENDS):
            await call.write(request)
    except (grpc.RpcError, asyncio.InvalidStateError) as error:
        refused[type(error).__name__] += 1
    return call


async def main(endpoint: str, kind: str, idle_count: int, stalled_count: int, connections: int, topic: str) -> None:
    # A channel of its own per connection: channels with the same target and options
    # would share one.
    channels = [
        grpc.aio.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1), ("rmqstore.connection", i), ("grpc.http2.bdp_probe", 0)])
        for i in range(connections)
    ]
    refused: Counter[str] = Counter()
    starts = [idle(channels[i % connections], refused) for i in range(idle_count)]
    stall = stalled_query if kind == "query" else stalled_writer
    starts += [stall(channels[i % connections], topic, refused) for i in range(stalled_count)]
    calls = await asyncio.wait_for(asyncio.gather(*starts), OPEN_TIMEOUT_S)
    print(json.dumps({"event": "open", "idle": idle_count, "stalled": stalled_count, "refused": dict(refused)}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    del calls  # held open until here


if __name__ == "__main__":
    endpoint, kind, idle_text, stalled_text, connections_text, *rest = sys.argv[1:]
    asyncio.run(main(endpoint, kind, int(idle_text), int(stalled_text), int(connections_text), rest[0] if rest else "TopicA"))
