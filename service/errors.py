"""The one table from store errors to gRPC status codes.

Every status carries a machine-readable reason in the trailing metadata
(``rmqstore-reason``: the error class name) next to the human message.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from rmqstore.common import errors

REASON_KEY = "rmqstore-reason"

LOG = logging.getLogger("rmqstore.service")

# The statuses an operator acts on (the node or its store is in trouble), logged as they
# are answered; the others are the caller's business (a bad request, a missing message).
LOGGED_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL}
)

CODES: dict[type[errors.StoreError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.StoreFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.OutOfResources: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.StoreLocked: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ReadOnly: grpc.StatusCode.FAILED_PRECONDITION,
    errors.CrcMismatch: grpc.StatusCode.DATA_LOSS,
    errors.Corruption: grpc.StatusCode.DATA_LOSS,
}


def code_for(error: errors.StoreError) -> grpc.StatusCode:
    for kind in type(error).__mro__:
        if kind in CODES:
            return CODES[kind]
    return grpc.StatusCode.INTERNAL


def _log(code: grpc.StatusCode, error: errors.StoreError) -> None:
    if code in LOGGED_CODES:
        LOG.warning("answered %s (%s): %s", code.name, type(error).__name__, error)


def abort_with(context: grpc.ServicerContext, error: errors.StoreError) -> None:
    code = code_for(error)
    _log(code, error)
    context.set_trailing_metadata(((REASON_KEY, type(error).__name__),))
    context.abort(code, str(error))


class StreamRefusal(Exception):
    """A streamed request refused by an interceptor (it does not parse: service.guard; the
    caller may not send it: service.acl), raised where the handler reads it rather than
    answered there. A handler that reads ahead of its answers (WriterService.SendStream)
    thus answers the requests before it first; the interceptor's wrapper then ends the call
    with :meth:`end` (the refusal's reason is already in the trailing metadata). A handler
    that reads in a task of its own hands it to the task that answers."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details

    async def end(self, context: grpc.aio.ServicerContext) -> None:
        """End the call with the refusal's status (``context.abort`` raises)."""
        await context.abort(self.code, self.details)


F = TypeVar("F", bound=Callable[..., Any])


def mapped(method: F) -> F:
    """Turn store errors raised by a unary or client-streaming handler into statuses."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except errors.StoreError as error:
            abort_with(context, error)

    return wrapper  # type: ignore[return-value]


async def abort_with_async(context: grpc.aio.ServicerContext, error: errors.StoreError) -> None:
    """:func:`abort_with` on an asyncio server's context."""
    code = code_for(error)
    _log(code, error)
    context.set_trailing_metadata(((REASON_KEY, type(error).__name__),))
    await context.abort(code, str(error))


def mapped_async(method: F) -> F:
    """:func:`mapped` for the unary handlers of an asyncio server."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except errors.StoreError as error:
            await abort_with_async(context, error)

    return wrapper  # type: ignore[return-value]
