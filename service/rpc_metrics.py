"""``rpc.server.duration``: every call a node's asyncio server answers, timed per method.

OpenTelemetry's gRPC instrumentation for Python makes spans only, so the server records
the RPC duration itself, with the attributes of OpenTelemetry's RPC conventions:
``rpc.system`` (``grpc``), ``rpc.service``, ``rpc.method`` and ``rpc.grpc.status_code``
(an integer, 0 for OK). A streaming call counts from its start to its end. Without an SDK
meter provider the interceptor hands every handler back untouched."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from rmqstore.service.metrics import DURATION_BOUNDS_MS, METER_NAME, metrics_on

Handler = Any  # grpc.RpcMethodHandler: grpc ships no types
_UNKNOWN = grpc.StatusCode.UNKNOWN.value[0]
_CANCELLED = grpc.StatusCode.CANCELLED.value[0]


class AsyncRpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Times each call of the asyncio server it is installed on (all of whose handlers
    are async)."""

    def __init__(self) -> None:
        self._duration: Any = None
        self._attributes: dict[str, dict[str, str]] = {}

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        if handler is None or not metrics_on():
            return handler
        if self._duration is None:
            from opentelemetry import metrics

            self._duration = metrics.get_meter(METER_NAME).create_histogram(
                "rpc.server.duration",
                unit="ms",
                description="duration of inbound RPCs, from the request's arrival to its status",
                explicit_bucket_boundaries_advisory=DURATION_BOUNDS_MS,
            )
        return self._timed(handler, self._method_attributes(handler_call_details.method))

    def _method_attributes(self, method: str) -> dict[str, str]:
        attributes = self._attributes.get(method)
        if attributes is None:
            # "/package.Service/Method"; anything else (never seen from grpc) is kept whole.
            service, _, name = method.lstrip("/").rpartition("/")
            attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name or method}
            if len(self._attributes) < 1024:  # bounded: the methods a server serves
                self._attributes[method] = attributes
        return attributes

    def _record(self, started: float, attributes: dict[str, str], context: Any, code: int | None) -> None:
        if code is None:
            status = context.code()
            code = 0 if status is None else int(status.value[0])
        self._duration.record((time.perf_counter() - started) * 1000, {**attributes, "rpc.grpc.status_code": code})

    def _timed(self, handler: Handler, attributes: dict[str, str]) -> Handler:
        if handler.request_streaming:
            behavior = handler.stream_stream if handler.response_streaming else handler.stream_unary
            make = grpc.stream_stream_rpc_method_handler if handler.response_streaming else grpc.stream_unary_rpc_method_handler
        else:
            behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
            make = grpc.unary_stream_rpc_method_handler if handler.response_streaming else grpc.unary_unary_rpc_method_handler
        record = self._record
        wrapped: Callable[..., Any]
        if inspect.isasyncgenfunction(behavior):

            async def generating(request: Any, context: Any) -> AsyncIterator[Any]:
                started = time.perf_counter()
                code: int | None = _UNKNOWN
                try:
                    async for response in behavior(request, context):
                        yield response
                    code = None
                except grpc.aio.AbortError:
                    code = None
                    raise
                except (asyncio.CancelledError, GeneratorExit):
                    code = _CANCELLED  # the client went away
                    raise
                finally:
                    record(started, attributes, context, code)

            wrapped = generating
        elif inspect.iscoroutinefunction(behavior):

            async def answering(request: Any, context: Any) -> Any:
                started = time.perf_counter()
                code: int | None = _UNKNOWN
                try:
                    response = await behavior(request, context)
                    code = None
                    return response
                except grpc.aio.AbortError:
                    code = None  # the status the handler aborted with
                    raise
                except asyncio.CancelledError:
                    code = _CANCELLED  # the client went away
                    raise
                finally:
                    record(started, attributes, context, code)

            wrapped = answering
        else:
            return handler  # a synchronous handler: not on this server
        return make(wrapped, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
