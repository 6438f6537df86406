"""Loads on the RocketMQ 5 gateway shared by tests/test_gateway_limits.py and
benchmarks/gateway_under_fire.py: a consumer group holding many messages in flight, and
the hostile client (hostile_gateway.py, beside this file) run as a process of its own."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

HOSTILE = Path(__file__).resolve().parent / "hostile_gateway.py"
# Twelve hours: nothing a test or a benchmark holds comes back while it runs.
HOLD_S = 43_200
SEND_BATCH = 8192
RECEIVE_BATCH = 1024


def hold_in_flight(channel: grpc.Channel, topic: str, group: str, count: int, timeout_s: float) -> None:
    """Sends ``count`` one-byte messages to queue 0 of ``topic`` (made beforehand), then
    receives every one of them for ``group`` with a 12 h invisibility: ``count`` in flight."""
    writer = writer_pb2_grpc.WriterServiceStub(channel)
    for start in range(0, count, SEND_BATCH):
        batch = [messages_pb2.Message(topic=topic, queue_id=0, body=b"f") for _ in range(min(SEND_BATCH, count - start))]
        writer.SendBatch(writer_pb2.SendBatchRequest(messages=batch), timeout=timeout_s)
    gateway = service_pb2_grpc.MessagingServiceStub(channel)
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name=group), message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=RECEIVE_BATCH,
        invisible_duration=duration_pb2.Duration(seconds=HOLD_S), long_polling_timeout=duration_pb2.Duration(seconds=0),
    )  # fmt: skip
    held = 0
    while held < count:
        taken = sum(a.HasField("message") for a in gateway.ReceiveMessage(request, timeout=timeout_s))
        if not taken:
            raise AssertionError(f"{held} of {count} in flight, then nothing to receive")
        held += taken


def open_hostile(
    endpoint: str, args: tuple[str, ...], timeout_s: float, env: Mapping[str, str] | None = None, script: Path = HOSTILE
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """A hostile client against ``endpoint`` (``script``, hostile_gateway.py unless said,
    with its ``args``), once it prints the JSON line saying its calls are open, with what it
    said. It holds them until killed (stop_hostile)."""
    hostile = subprocess.Popen(
        [sys.executable, str(script), endpoint, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert hostile.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(hostile.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            stop_hostile(hostile)
            raise AssertionError(f"the hostile client {args} opened nothing within {timeout_s} s")
    line = hostile.stdout.readline()
    if not line:
        stop_hostile(hostile)
        raise AssertionError(f"the hostile client {args} exited ({hostile.wait()})")
    return hostile, json.loads(line)


def stop_hostile(hostile: subprocess.Popen[bytes]) -> None:
    hostile.kill()
    hostile.wait()
    for pipe in (hostile.stdin, hostile.stdout):
        if pipe is not None:
            pipe.close()
