"""A grpc method handler's parts, for the interceptors that wrap one (service.guard,
service.acl): the function serving its calls, and grpc's constructor of a handler of its
kind, to make the wrapper with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

# grpc's stubs make handlers generic in request and response types; these wrappers serve
# every method alike.
Handler = Any


def handler_constructor(handler: Handler) -> Callable[..., Handler]:
    """grpc's function that makes a handler of ``handler``'s kind (unary or streaming, each way)."""
    constructor: Callable[..., Handler]
    if handler.request_streaming:
        constructor = grpc.stream_stream_rpc_method_handler if handler.response_streaming else grpc.stream_unary_rpc_method_handler
    else:
        constructor = grpc.unary_stream_rpc_method_handler if handler.response_streaming else grpc.unary_unary_rpc_method_handler
    return constructor


def handler_behavior(handler: Handler) -> Callable[..., Any]:
    """The function that serves ``handler``'s calls (the one of its four that is set)."""
    if handler.request_streaming:
        return handler.stream_stream if handler.response_streaming else handler.stream_unary  # type: ignore[no-any-return]
    return handler.unary_stream if handler.response_streaming else handler.unary_unary  # type: ignore[no-any-return]
