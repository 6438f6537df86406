"""One client of the RocketMQ 5 gateway cannot spend the writer for all (issue 40): real
writer processes, a hostile client process (tests/support/hostile_gateway.py) or hostile
calls from this process, and an unrelated producer timed meanwhile."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli import quiet_env
from support.nodes import Nodes, ProcessNode

from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.v1 import messages_pb2, writer_pb2

HOSTILE = Path(__file__).parent / "support" / "hostile_gateway.py"
OPEN_TIMEOUT_S = 180.0
RPC_TIMEOUT_S = 30.0
# Latency bounds are a node's, not a loaded machine's: .ci/run runs this module alone.
pytestmark = pytest.mark.serial


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def median_s(call: Callable[[], Any], samples: int) -> float:
    for _ in range(10):
        call()  # warm: the connection's set-up is not the node's answer time
    timings = []
    for _ in range(samples):
        started = time.perf_counter()
        call()
        timings.append(time.perf_counter() - started)
    timings.sort()
    return timings[len(timings) // 2]


def stop(hostile: subprocess.Popen[bytes]) -> None:
    hostile.kill()
    hostile.wait()
    for pipe in (hostile.stdin, hostile.stdout):
        if pipe is not None:
            pipe.close()


def open_hostile(node: ProcessNode, *args: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """The hostile client against ``node``, once it says its calls are open."""
    hostile = subprocess.Popen(
        [sys.executable, str(HOSTILE), node.endpoint, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=quiet_env()
    )
    assert hostile.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(hostile.stdout, selectors.EVENT_READ)
        if not selector.select(OPEN_TIMEOUT_S):
            stop(hostile)
            raise AssertionError(f"the hostile client opened nothing within {OPEN_TIMEOUT_S} s")
    line = hostile.stdout.readline()
    if not line:
        stop(hostile)
        raise AssertionError(f"the hostile client exited ({hostile.wait()})")
    return hostile, json.loads(line)


def create_topic(node: ProcessNode, nodes: Nodes, name: str, queue_count: int) -> None:
    nodes.writer(node).CreateTopic(writer_pb2.CreateTopicRequest(name=name, queue_count=queue_count), timeout=RPC_TIMEOUT_S)


def v2_stub(nodes: Nodes, node: ProcessNode) -> service_pb2_grpc.MessagingServiceStub:
    return service_pb2_grpc.MessagingServiceStub(nodes.channel(node))


IDLE_POLLS = 300
# An idle poll elsewhere may cost a send something (the writer's loop holds them), not a
# multiple of its time: before wake-ups by topic, 300 polls made a send 10-30 times slower.
IDLE_POLL_SLOWDOWN_MAX = 2.5


@pytest.mark.slow
def test_idle_long_polls_on_another_topic_cost_an_append_nothing(nodes: Nodes, tmp_path: Path) -> None:
    """Finding 4: an append wakes only the polls on its topic."""
    writer = nodes.start("writer", tmp_path / "store")
    create_topic(writer, nodes, "Idle", 8)
    producer = nodes.writer(writer)
    request = writer_pb2.SendRequest(message=messages_pb2.Message(topic="Busy", body=b"b" * 100))

    def send() -> Any:
        return producer.Send(request, timeout=RPC_TIMEOUT_S)

    unloaded_s = median_s(send, 300)
    hostile, opened = open_hostile(writer, "polls", str(IDLE_POLLS), "Idle", "idlers")
    try:
        assert opened == {"event": "open", "count": IDLE_POLLS, "refused": {}}
        time.sleep(1.0)  # the last polls issued reach the writer and wait
        loaded_s = median_s(send, 300)
        assert hostile.poll() is None
    finally:
        stop(hostile)
    print(f"send p50 {unloaded_s * 1000:.2f} ms alone, {loaded_s * 1000:.2f} ms beside {IDLE_POLLS} idle polls")
    assert loaded_s <= IDLE_POLL_SLOWDOWN_MAX * unloaded_s + 0.001, (unloaded_s, loaded_s)
