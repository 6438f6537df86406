"""Malformed requests are INVALID_ARGUMENT, on every service of both nodes.

grpc parses a request before any handler of ours runs, and a request that does not parse
(truncated, wrong wire types, invalid UTF-8 in a string) ends there with the status grpc
picks (UNKNOWN on the asyncio server), which does not tell a client that the fault is its
own. The interceptor puts a parser that cannot raise in front of every method (ours,
health, reflection): it hands the handler wrapper a marker instead, which answers
INVALID_ARGUMENT naming the message type, before the handler runs (for a stream, when the
handler reaches the bad message: raised there as a StreamRefusal, so that what it answers
for the messages before goes first). It wraps whatever the server has, so that any service
added later (a gateway on the writer's port) is covered too.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from rmqstore.service.errors import REASON_KEY, StreamRefusal
from rmqstore.service.handlers import Handler, handler_behavior, handler_constructor

# grpc's stubs make contexts generic in request and response types; these
# wrappers serve every method alike.
AsyncContext = Any


REASON = "MalformedRequest"


class Malformed:
    """What the guarded parser returns for bytes that are not the method's request: the
    request an interceptor after the guard (service.acl) may see, and must let through to
    the guard's wrapper, which answers it."""

    __slots__ = ("detail",)

    def __init__(self, detail: str):
        self.detail = detail


def _message_name(deserialize: Callable[[bytes], Any]) -> str:
    """The request type's full protobuf name (a generated class's FromString is bound to it)."""
    descriptor = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "the method's request"))


def _guarded(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    detail = f"malformed request: the bytes do not parse as {_message_name(deserialize)}"

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, ValueError, TypeError):
            # Protobuf's parser raises DecodeError; ValueError and TypeError cover
            # deserializers that are not protobuf's (none today) failing the same way.
            return Malformed(detail)

    return parse


async def _abort_async(context: AsyncContext, marker: Malformed) -> None:
    context.set_trailing_metadata(((REASON_KEY, REASON),))
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, marker.detail)


def _asynchronous(handler: Handler) -> Handler:
    behavior = handler_behavior(handler)
    # A streaming answer is either an async generator or a coroutine that writes with
    # context.write (grpc's health Watch): the wrapper takes the same form.
    generates = inspect.isasyncgenfunction(behavior)

    async def checked(requests: AsyncIterator[Any], context: AsyncContext) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Malformed):
                # Raised where the handler reads it: the answers to the requests before it
                # go first (StreamRefusal), then the wrapper below ends the call.
                context.set_trailing_metadata(((REASON_KEY, REASON),))
                raise StreamRefusal(grpc.StatusCode.INVALID_ARGUMENT, request.detail)
            yield request

    async def arrived(request: Any, context: AsyncContext) -> Any:
        if not handler.request_streaming:
            if isinstance(request, Malformed):
                await _abort_async(context, request)
            return request
        return checked(request, context)

    if generates:

        async def generating(request: Any, context: AsyncContext) -> AsyncIterator[Any]:
            try:
                async for response in behavior(await arrived(request, context), context):
                    yield response
            except StreamRefusal as refusal:
                await refusal.end(context)

        wrapped: Callable[..., Any] = generating
    elif handler.response_streaming:

        async def writing(request: Any, context: AsyncContext) -> AsyncIterator[Any]:
            # A streaming answer written with context.write (health Watch, and our streams,
            # which bound each write's wait): presented as an async generator that yields
            # nothing, the form every interceptor around it (OpenTelemetry's) expects of a
            # streaming handler.
            try:
                await behavior(await arrived(request, context), context)
            except StreamRefusal as refusal:
                await refusal.end(context)
            return
            yield

        wrapped = writing
    else:

        async def answering(request: Any, context: AsyncContext) -> Any:
            try:
                return await behavior(await arrived(request, context), context)
            except StreamRefusal as refusal:
                await refusal.end(context)

        wrapped = answering
    return handler_constructor(handler)(
        wrapped,
        request_deserializer=_guarded(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


class AsyncMalformedRequestGuard(grpc.aio.ServerInterceptor):
    """For grpc's asyncio server."""

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return _asynchronous(handler)
