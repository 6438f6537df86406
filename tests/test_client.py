"""rmqstore.client: which calls gRPC retries when a node answers UNAVAILABLE, and that the
client loads none of OpenTelemetry's SDK or exporters while tracing is off."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from rmqstore.client import RETRY_ATTEMPTS_MAX, QueryClient, WriterClient, connect
from rmqstore.v1 import messages_pb2, query_pb2, writer_pb2


class Flaky:
    """A node answering UNAVAILABLE to the first ``failures`` calls of each method."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((self,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def service(self, details: Any) -> Any:
        method = details.method
        responses = {
            "/rmqstore.v1.QueryService/Ping": query_pb2.PingResponse,
            "/rmqstore.v1.WriterService/SendBatch": writer_pb2.SendBatchResponse,
        }
        if method not in responses:
            return None

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self.lock:
                self.calls[method] = self.calls.get(method, 0) + 1
                failing = self.calls[method] <= self.failures
            if failing:
                context.abort(grpc.StatusCode.UNAVAILABLE, "starting")
            return responses[method]().SerializeToString()

        return grpc.unary_unary_rpc_method_handler(handle)


@pytest.fixture
def flaky() -> Iterator[Flaky]:
    node = Flaky(failures=RETRY_ATTEMPTS_MAX - 1)
    yield node
    node.server.stop(None)


def test_queries_are_retried_while_unavailable(flaky: Flaky) -> None:
    client = QueryClient(connect(f"127.0.0.1:{flaky.port}"), timeout_s=30)
    try:
        assert client.call("Ping", query_pb2.PingRequest()) == query_pb2.PingResponse()
    finally:
        client.close()
    assert flaky.calls == {"/rmqstore.v1.QueryService/Ping": RETRY_ATTEMPTS_MAX}


def test_sends_are_not_retried(flaky: Flaky) -> None:
    client = WriterClient(connect(f"127.0.0.1:{flaky.port}"), timeout_s=30)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            client.send_batch([messages_pb2.Message(topic="T", body=b"x")])
    finally:
        client.close()
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNAVAILABLE, "starting")
    assert flaky.calls == {"/rmqstore.v1.WriterService/SendBatch": 1}


def test_the_client_loads_no_sdk_while_tracing_is_off() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import sys\n"
        "from rmqstore.cli.main import build_parser\n"
        "from rmqstore.client import connect, tracing\n"
        "connect('127.0.0.1:1').close()\n"
        "print(tracing.enabled(), sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "False []\n"


def test_a_send_loads_the_sdk_only_when_tracing_is_on() -> None:
    """``rmqstore send`` (to a port nothing listens on: the call fails, the command ends)
    loads none of OpenTelemetry's SDK without a tracing variable, and loads it when an
    OTLP endpoint asks for traces."""
    code = (
        "import sys\n"
        "from rmqstore.cli.main import main\n"
        "code = main(['send', '--endpoint', '127.0.0.1:1', '-t', 'T', '--body', 'x', '--timeout', '5'])\n"
        "print(code != 0, 'opentelemetry.sdk.trace' in sys.modules)\n"
    )
    quiet = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    off = subprocess.run([sys.executable, "-c", code], env=quiet, capture_output=True, text=True, timeout=60, check=True)
    assert off.stdout == "True False\n", off.stderr
    traced = {**quiet, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    on = subprocess.run([sys.executable, "-c", code], env=traced, capture_output=True, text=True, timeout=60, check=True)
    assert on.stdout == "True True\n", on.stderr
