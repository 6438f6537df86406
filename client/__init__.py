"""rmqstore's client: a channel to a writer or query node (plaintext or TLS, calls signed for
a node with an ACL, UNAVAILABLE retried where a call is safe to repeat) and the writer's
and query node's calls, each in a client span carrying W3C trace context when the
standard ``OTEL_*`` variables ask for tracing (see :mod:`rmqstore.client.tracing`).

Without those variables none of OpenTelemetry's SDK is loaded: the command line uses this
client on every run."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from rmqstore.client import tracing
from rmqstore.client.columns import batch_request
from rmqstore.common.conventions import TRACEPARENT
from rmqstore.common.transport import parse_endpoint
from rmqstore.v1 import messages_pb2, query_pb2_grpc, writer_pb2

__all__ = ["Credentials", "QueryClient", "Tls", "WriterClient", "connect"]

WRITER_SERVICE = "rmqstore.v1.WriterService"
QUERY_SERVICE = "rmqstore.v1.QueryService"
SEND_STREAM = f"/{WRITER_SERVICE}/SendStream"

# gRPC's own retries, for the calls that change nothing or whose repetition changes
# nothing more (creating a topic that exists, a second fsync): every query, and the
# writer's topic, flush and status calls. Sends are not retried: a send answered
# UNAVAILABLE may be in the commit log already (a failed dispatch), and a repeat would
# store its messages twice.
RETRY_ATTEMPTS_MAX = 4
_RETRY_POLICY = {
    "maxAttempts": RETRY_ATTEMPTS_MAX,
    "initialBackoff": "0.2s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": QUERY_SERVICE}]
                + [{"service": WRITER_SERVICE, "method": method} for method in ("CreateTopic", "ListTopics", "Flush", "Status")],
                "retryPolicy": _RETRY_POLICY,
            }
        ]
    }
)


@dataclass(frozen=True)
class Tls:
    """TLS to the node: the CA to trust, a client certificate and key for mutual TLS, and
    the name expected in the server's certificate when it is not the endpoint's host."""

    ca: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    server_name: str | None = None


@dataclass(frozen=True)
class Credentials:
    """A user of a node with an ACL: every call is signed as RocketMQ 5 clients sign."""

    access_key: str
    secret_key: str


def connect(
    endpoint: str, tls: Tls | None = None, credentials: Credentials | None = None, *, unary_spans: bool = True
) -> grpc.Channel:
    """A channel to ``endpoint`` (``HOST:PORT``): plaintext unless ``tls`` gives a file,
    signed when ``credentials`` are given, its unary calls traced when the environment
    asks for it (``unary_spans=False``: a channel that only streams sends, whose spans
    are the sender's own, is not wrapped for them). An endpoint of another form is an
    InvalidArgument (common.transport.parse_endpoint), never a target gRPC reads its own way."""
    from rmqstore.client.channels import open_channel

    parse_endpoint(endpoint)
    tls = tls or Tls()
    channel = open_channel(
        endpoint,
        ca=tls.ca,
        client_cert=tls.client_cert,
        client_key=tls.client_key,
        server_name=tls.server_name,
        extra_options=[("grpc.enable_retries", 1), ("grpc.service_config", SERVICE_CONFIG)],
    )
    if credentials is not None:
        from rmqstore.client.signing import signing_channel

        channel = signing_channel(channel, credentials.access_key, credentials.secret_key)
    if unary_spans and tracing.requested():
        channel = grpc.intercept_channel(channel, tracing.ClientSpans(endpoint))
    return channel


class WriterClient:
    """The writer's calls over a channel (owned: :meth:`close` closes it)."""

    def __init__(self, channel: grpc.Channel, endpoint: str = "", timeout_s: float | None = None):
        self.channel = channel
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    def send(self, message: messages_pb2.Message) -> messages_pb2.SendResult:
        """Store one message; its ack. Traced as a PRODUCER span whose context the
        message carries in its ``traceparent`` property."""
        [result] = self.send_batch([message]).results
        return result

    def send_batch(self, messages: Sequence[messages_pb2.Message]) -> writer_pb2.SendBatchResponse:
        """Store messages as one batch; one ack each, in order. Sent as columns
        (:mod:`rmqstore.client.columns`), which the writer reads cheapest."""
        request = batch_request(messages)
        one = messages[0] if len(messages) == 1 else None
        keys, tag = (list(one.keys), one.tags) if one is not None else ((), "")
        with tracing.producer_span(self.endpoint, "SendBatch", [m.topic for m in messages], keys, tag) as span:
            if span is not None:
                request.shared_properties[TRACEPARENT] = tracing.traceparent(span)
            call = self.channel.unary_unary(
                f"/{WRITER_SERVICE}/SendBatch",
                request_serializer=writer_pb2.SendBatchRequest.SerializeToString,
                response_deserializer=writer_pb2.SendBatchResponse.FromString,
            )
            response: writer_pb2.SendBatchResponse = call(request, timeout=self.timeout_s, metadata=tracing.metadata(span))
            if span is not None:
                tracing.succeeded(span)
                if len(response.results) == 1:
                    tracing.acknowledged(span, response.results[0].uniq_key)
            return response

    def send_stream(
        self, requests: Iterable[bytes], timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] | None = None
    ) -> Iterator[writer_pb2.SendBatchResponse]:
        """Serialized SendBatchRequests sent on one stream (gRPC sends their bytes as they
        are); their responses, in order. The caller traces it (``metadata`` carries its
        context): ``send --file`` has a span per batch."""
        call = self.channel.stream_stream(
            SEND_STREAM, request_serializer=None, response_deserializer=writer_pb2.SendBatchResponse.FromString
        )
        responses: Iterator[writer_pb2.SendBatchResponse] = call(
            iter(requests), timeout=timeout_s or self.timeout_s, metadata=metadata
        )
        return responses

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> WriterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class QueryClient:
    """The query node's calls over a channel (owned: :meth:`close` closes it). Each call
    is a client span with the lookup's topic and result count when traced."""

    def __init__(self, channel: grpc.Channel, timeout_s: float | None = None):
        self.channel = channel
        self.stub = query_pb2_grpc.QueryServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, untyped
        self.timeout_s = timeout_s

    def call(self, method: str, request: Any) -> Any:
        """A unary call by its method name (``QueryByKey``, ``Pull``, …)."""
        return getattr(self.stub, method)(request, timeout=self.timeout_s)

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        """A server-streaming call by its method name (``StreamByTime``)."""
        responses: Iterator[Any] = getattr(self.stub, method)(request, timeout=self.timeout_s)
        return responses

    def close(self) -> None:
        self.channel.close()


