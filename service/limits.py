"""Limits a node enforces on its clients' connections and streams (both nodes, on grpc's
asyncio server).

* Per connection: at most ``STREAMS_PER_CONNECTION_MAX`` concurrent calls (HTTP/2's
  SETTINGS_MAX_CONCURRENT_STREAMS): a client's further calls wait in the client, or, where
  the client does not hold them, are refused by grpc's server with RST_STREAM
  REFUSED_STREAM (UNAVAILABLE, unprocessed; docs/security.md).
* In total: at most ``STREAMS_MAX`` open streaming calls (SendStream, StreamByTime,
  health Watch, reflection); one more is RESOURCE_EXHAUSTED at once. Unary calls are not
  counted, so Ping, health checks and lookups still answer while streams are at the limit.
* Idle connections: a ping every ``KEEPALIVE_TIME_MS`` that must be answered within
  ``KEEPALIVE_TIMEOUT_MS``, and a connection with no call for ``CONNECTION_IDLE_MAX_MS``
  is closed.
* A stream's unread messages: HTTP/2 flow control holds a stream whose reader stops; the
  stream's handler waits holding one message and, after a node-specific time, ends the
  stream with RESOURCE_EXHAUSTED (the query node's StreamByTime, the writer's SendStream acks).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from rmqstore.service.errors import REASON_KEY

# grpc's stubs make contexts and handlers generic in request and response types; these
# wrappers serve every method alike.
Context = Any
AsyncContext = Any
Handler = Any


STREAMS_PER_CONNECTION_MAX = 128
STREAMS_MAX = 2048
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
CONNECTION_IDLE_MAX_MS = 300_000

CONNECTION_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION_MAX),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.max_connection_idle_ms", CONNECTION_IDLE_MAX_MS),
]


class AsyncStreamLimit(grpc.aio.ServerInterceptor):
    """At most ``limit`` streaming calls open at once; the next is RESOURCE_EXHAUSTED."""

    def __init__(self, limit: int = STREAMS_MAX):
        self.limit = limit
        self.open = 0  # touched only on the server's event loop

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        return self._counted(handler)

    def _counted(self, handler: Handler) -> Handler:
        behavior: Callable[..., Any]
        if handler.request_streaming:
            behavior = handler.stream_stream if handler.response_streaming else handler.stream_unary
            make = grpc.stream_stream_rpc_method_handler if handler.response_streaming else grpc.stream_unary_rpc_method_handler
        else:
            behavior = handler.unary_stream
            make = grpc.unary_stream_rpc_method_handler
        limiter = self

        async def refuse(context: AsyncContext) -> None:
            context.set_trailing_metadata(((REASON_KEY, "TooManyStreams"),))
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"{limiter.limit} streams are open, this node's limit: retry later"
            )

        if handler.response_streaming and _generates(behavior):

            async def generating(request: Any, context: AsyncContext) -> AsyncIterator[Any]:
                if limiter.open >= limiter.limit:
                    await refuse(context)
                limiter.open += 1
                try:
                    async for response in behavior(request, context):
                        yield response
                finally:
                    limiter.open -= 1

            wrapped: Callable[..., Any] = generating
        else:

            async def answering(request: Any, context: AsyncContext) -> Any:
                if limiter.open >= limiter.limit:
                    await refuse(context)
                limiter.open += 1
                try:
                    return await behavior(request, context)
                finally:
                    limiter.open -= 1

            wrapped = answering
        return make(wrapped, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


def _generates(behavior: Callable[..., Any]) -> bool:
    return inspect.isasyncgenfunction(behavior)
