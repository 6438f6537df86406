"""Limits a node enforces on its clients' connections and streams (both nodes, on grpc's
asyncio server).

* Per connection: at most ``STREAMS_PER_CONNECTION_MAX`` concurrent calls (HTTP/2's
  SETTINGS_MAX_CONCURRENT_STREAMS): a client's further calls wait in the client, or, where
  the client does not hold them, are refused by grpc's server with RST_STREAM
  REFUSED_STREAM (UNAVAILABLE, unprocessed; docs/security.md).
* In total: at most ``STREAMS_MAX`` open streaming calls (SendStream, StreamByTime,
  Telemetry, ReceiveMessage, reflection); one more is RESOURCE_EXHAUSTED at once. Unary
  calls are not counted, so Ping, health checks and lookups still answer while streams
  are at the limit.
* Apart from those: at most ``UNAUTHENTICATED_STREAMS_MAX`` open streams of the methods
  that need no credentials (health Watch), so that callers who identify themselves to
  no one cannot take the streams of those who do.
* Per principal (with an ACL: the user or certificate a call is authenticated as): at
  most ``PRINCIPAL_STREAMS_MAX`` open streams and ``PRINCIPAL_CALLS_MAX`` calls in
  flight (streams and unary calls), so that one user's clients cannot spend the node's
  limits for all.
* Idle connections: a ping every ``KEEPALIVE_TIME_MS`` that must be answered within
  ``KEEPALIVE_TIMEOUT_MS``, and a connection with no call for ``CONNECTION_IDLE_MAX_MS``
  is closed.
* A stream's unread messages: HTTP/2 flow control holds a stream whose reader stops; the
  stream's handler waits holding one message and, after ``STALLED_WRITE_S``, ends the
  stream with RESOURCE_EXHAUSTED (the query node's StreamByTime, the writer's SendStream acks).

A node is started with these as :class:`ServerLimits`.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from rmqstore.service.errors import REASON_KEY
from rmqstore.service.handlers import handler_behavior, handler_constructor

# grpc's stubs make contexts and handlers generic in request and response types; these
# wrappers serve every method alike.
Context = Any
AsyncContext = Any
Handler = Any


STREAMS_PER_CONNECTION_MAX = 128
STREAMS_MAX = 2048
UNAUTHENTICATED_STREAMS_MAX = 512
PRINCIPAL_STREAMS_MAX = 1024
PRINCIPAL_CALLS_MAX = 2048
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
CONNECTION_IDLE_MAX_MS = 300_000
# A stream's reader that takes none of the next message for this long is a stalled client:
# its stream ends with RESOURCE_EXHAUSTED (a SendStream's messages so far are stored; the
# acks it did not read are lost to it) instead of holding its handler open.
STALLED_WRITE_S = 30.0

CONNECTION_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION_MAX),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.max_connection_idle_ms", CONNECTION_IDLE_MAX_MS),
]


@dataclass(frozen=True)
class CallLimits:
    """The counts :class:`AsyncStreamLimit` enforces (the module's note)."""

    streams_max: int = STREAMS_MAX
    unauthenticated_streams_max: int = UNAUTHENTICATED_STREAMS_MAX
    principal_streams_max: int = PRINCIPAL_STREAMS_MAX
    principal_calls_max: int = PRINCIPAL_CALLS_MAX


DEFAULT_CALL_LIMITS = CallLimits()


@dataclass(frozen=True)
class ServerLimits:
    """The limits a node serves its clients under (this module's defaults)."""

    calls: CallLimits = DEFAULT_CALL_LIMITS  # streams and calls open at once
    connection_idle_max_ms: int = CONNECTION_IDLE_MAX_MS  # a connection with no call is closed after this
    stalled_write_s: float = STALLED_WRITE_S  # a stream whose reader takes nothing for this long ends


class AsyncStreamLimit(grpc.aio.ServerInterceptor):
    """The node's and each principal's streams and calls within ``limits``; the call past
    a limit is RESOURCE_EXHAUSTED at once. ``open_methods`` need no credentials (their
    streams have a pool of their own); ``principal_of`` names the caller of the call being
    handled (None: no ACL, no principals), so this interceptor runs inside the ACL's."""

    def __init__(
        self,
        limits: CallLimits = DEFAULT_CALL_LIMITS,
        open_methods: frozenset[str] = frozenset(),
        principal_of: Callable[[], str | None] | None = None,
    ):
        self.limits = limits
        self.open_methods = open_methods
        self.principal_of = principal_of
        # Touched only on the server's event loop.
        self.open = 0  # every open stream
        self.unauthenticated = 0  # those of the open methods
        self.principal_streams: Counter[str] = Counter()
        self.principal_calls: Counter[str] = Counter()

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        streaming = bool(handler.request_streaming or handler.response_streaming)
        unauthenticated = handler_call_details.method in self.open_methods
        if not streaming and (unauthenticated or self.principal_of is None):
            return handler  # a unary call counts only against its principal's calls
        return self._counted(handler, streaming, unauthenticated)

    def _refusal(self, streaming: bool, unauthenticated: bool, principal: str | None) -> tuple[str, str] | None:
        """The reason and message refusing a call now, or None when it is admitted."""
        limits = self.limits
        if streaming:
            if unauthenticated and self.unauthenticated >= limits.unauthenticated_streams_max:
                return "TooManyStreams", (
                    f"{limits.unauthenticated_streams_max} streams without credentials (health Watch) are open, "
                    "this node's limit for them: retry later"
                )
            if not unauthenticated and self.open - self.unauthenticated >= limits.streams_max:
                return "TooManyStreams", f"{limits.streams_max} streams are open, this node's limit: retry later"
            if principal is not None and self.principal_streams[principal] >= limits.principal_streams_max:
                return "TooManyStreams", (
                    f"{principal} has {limits.principal_streams_max} streams open, the limit of one caller: retry later"
                )
        if principal is not None and self.principal_calls[principal] >= limits.principal_calls_max:
            return "TooManyCalls", f"{principal} has {limits.principal_calls_max} calls in flight, the limit of one caller: retry later"
        return None

    def _enter(self, streaming: bool, unauthenticated: bool, principal: str | None) -> None:
        if streaming:
            self.open += 1
            self.unauthenticated += unauthenticated
            if principal is not None:
                self.principal_streams[principal] += 1
        if principal is not None:
            self.principal_calls[principal] += 1

    def _leave(self, streaming: bool, unauthenticated: bool, principal: str | None) -> None:
        if streaming:
            self.open -= 1
            self.unauthenticated -= unauthenticated
            if principal is not None:
                _decrement(self.principal_streams, principal)
        if principal is not None:
            _decrement(self.principal_calls, principal)

    def _counted(self, handler: Handler, streaming: bool, unauthenticated: bool) -> Handler:
        behavior = handler_behavior(handler)
        limiter = self

        async def admit(context: AsyncContext) -> str | None:
            principal = None if unauthenticated or limiter.principal_of is None else limiter.principal_of()
            refusal = limiter._refusal(streaming, unauthenticated, principal)
            if refusal is not None:
                reason, message = refusal
                context.set_trailing_metadata(((REASON_KEY, reason),))
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
            limiter._enter(streaming, unauthenticated, principal)
            return principal

        if handler.response_streaming and _generates(behavior):

            async def generating(request: Any, context: AsyncContext) -> AsyncIterator[Any]:
                principal = await admit(context)
                try:
                    async for response in behavior(request, context):
                        yield response
                finally:
                    limiter._leave(streaming, unauthenticated, principal)

            wrapped: Callable[..., Any] = generating
        else:

            async def answering(request: Any, context: AsyncContext) -> Any:
                principal = await admit(context)
                try:
                    return await behavior(request, context)
                finally:
                    limiter._leave(streaming, unauthenticated, principal)

            wrapped = answering
        return handler_constructor(handler)(
            wrapped, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


def _decrement(counts: Counter[str], key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]


def _generates(behavior: Callable[..., Any]) -> bool:
    return inspect.isasyncgenfunction(behavior)
