"""Start a gRPC server with health checking, reflection, the tracing interceptor and the
RPC metrics (service.rpc_metrics).

Both nodes serve on grpc's asyncio server on an event loop of its own thread
(:class:`AsyncServing`): a SYNC ack waits for an fsync, a stream lasts as long as its
client, a reader may stop reading, and none of them may hold a thread while it waits
(service.limits). Every call passes the malformed-request guard (service.guard) and, with
an ACL, its check (service.acl). A node's TLS credentials are in service.channels, the
client's channel in client.channels: neither loads the server's dependencies."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from opentelemetry import trace

from rmqstore.common.transport import MAX_MESSAGE_BYTES, endpoint_text
from rmqstore.service.acl import (
    OPEN_METHODS,
    Acl,
    AsyncAclInterceptor,
    MethodRule,
    current_principal,
)
from rmqstore.service.guard import AsyncMalformedRequestGuard
from rmqstore.service.limits import (
    CONNECTION_IDLE_MAX_MS,
    CONNECTION_OPTIONS,
    DEFAULT_CALL_LIMITS,
    AsyncStreamLimit,
    CallLimits,
)
from rmqstore.service.metrics import watch_open_streams
from rmqstore.service.rpc_metrics import AsyncRpcMetricsInterceptor

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    *CONNECTION_OPTIONS,
]
T = TypeVar("T")
REFLECTION_V1_SERVICE = "grpc.reflection.v1.ServerReflection"


class AsyncTracingInterceptor(grpc.aio.ServerInterceptor):
    """OpenTelemetry's asyncio server interceptor, for the calls made while a tracer
    provider is installed. Without one its spans record nothing, yet it costs each call
    far more than the check does (benchmarks/TRACING.md). A provider installed after the
    server started counts from its next call."""

    def __init__(self) -> None:
        # Made on the first traced call: the instrumentation's import (wrapt, packaging,
        # importlib.metadata) was about 40 ms of a writer's 0.75 s of start-up CPU, paid
        # now only when traced (benchmarks/CI.md, "Seventh round").
        self._traced: grpc.aio.ServerInterceptor | None = None

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        if _untraced():
            return await continuation(handler_call_details)
        if self._traced is None:
            from opentelemetry.instrumentation.grpc import aio_server_interceptor

            self._traced = aio_server_interceptor()
        return await self._traced.intercept_service(continuation, handler_call_details)


def _principal_subject() -> str | None:
    """The subject the ACL authenticated the call being handled as."""
    principal = current_principal.get()
    return None if principal is None else principal.subject


def _untraced() -> bool:
    return isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _add_services(
    server: grpc.aio.Server, register: Callable[[grpc.aio.Server], None], health_servicer: Any, service_names: Sequence[str]
) -> None:
    """A node's services on ``server``: its own, the health service and reflection listing
    both."""
    register(server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection(server, (*service_names, health.SERVICE_NAME))


def enable_reflection(server: grpc.aio.Server, service_names: Sequence[str]) -> None:
    """Server reflection as both v1alpha and v1 (current grpcurl asks v1 first). grpcio's
    reflection package serves v1alpha only; v1 renamed the package and kept every
    message, so the same servicer answers it, its messages read and written as v1alpha's."""
    names = (*service_names, reflection.SERVICE_NAME, REFLECTION_V1_SERVICE)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    info = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1_SERVICE, {"ServerReflectionInfo": info}),)
    )


class AsyncServing:
    """A node's listeners on grpc's asyncio server: an event loop on its own thread runs the
    main server and, when asked, the plaintext health port, so that a call that waits (a
    SYNC ack, an open stream) holds no thread, however many producers are connected.
    ``register`` adds services whose handlers are all async; they hand blocking work to
    the loop's default executor (``workers`` threads). Driven from synchronous code.
    With ``acl``, every call is checked; ``acl_rules`` authorizes the methods of services
    other than rmqstore's own (the RocketMQ 5 gateway's)."""

    def __init__(
        self,
        register: Callable[[grpc.aio.Server], None],
        service_names: Sequence[str],
        *,
        host: str,
        port: int,
        credentials: grpc.ServerCredentials | None,
        health_port: int | None,
        workers: int = 32,
        limits: CallLimits = DEFAULT_CALL_LIMITS,
        acl: Acl | None = None,
        acl_rules: Mapping[str, MethodRule] | None = None,
        connection_idle_max_ms: int = CONNECTION_IDLE_MAX_MS,
    ):
        self.limits = limits
        self.options = [
            (name, connection_idle_max_ms if name == "grpc.max_connection_idle_ms" else value)
            for name, value in SERVER_OPTIONS
        ]
        self.acl = acl
        self.acl_rules = acl_rules
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"))
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-loop", daemon=True)
        self._thread.start()
        self.health_servicer = health.aio.HealthServicer()
        self._servers: list[grpc.aio.Server] = []
        self.health_port: int | None = None
        try:
            self.port = self.call(self._start(register, service_names, host, port, credentials))
            if health_port is not None:
                self.health_port = self.call(self._start_health(host, health_port))
        except BaseException:
            self._stop_loop()
            raise

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    async def _start(
        self,
        register: Callable[[grpc.aio.Server], None],
        service_names: Sequence[str],
        host: str,
        port: int,
        credentials: grpc.ServerCredentials | None,
    ) -> int:
        # The guard innermost: it wraps the handlers as registered; the ACL checks what
        # parsed; the stream limit counts what the ACL admitted, by the principal it
        # found; the tracing sees every call. The RPC duration inside the server span:
        # it times what the node does.
        interceptors: list[grpc.aio.ServerInterceptor] = [AsyncTracingInterceptor(), AsyncRpcMetricsInterceptor()]
        principal_of = None
        if self.acl is not None:
            # Outside the guard: a request is authorized once it parses.
            self.acl_interceptor = AsyncAclInterceptor(self.acl, rules=self.acl_rules)
            interceptors.append(self.acl_interceptor)
            principal_of = _principal_subject
        streams = AsyncStreamLimit(self.limits, OPEN_METHODS, principal_of)
        interceptors += [streams, AsyncMalformedRequestGuard()]
        server = grpc.aio.server(interceptors=interceptors, options=self.options)
        _add_services(server, register, self.health_servicer, service_names)
        for name in (*service_names, ""):
            await self.health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        address = endpoint_text(host, port)
        bound = await self._bind(server, address, credentials, f"cannot bind {address}")
        await server.start()
        self._servers.append(server)
        watch_open_streams(streams, bound, lambda limiter: limiter.open)
        return bound

    async def _start_health(self, host: str, port: int) -> int:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health_servicer, server)
        address = endpoint_text(host, port)
        bound = await self._bind(server, address, None, f"cannot bind the health port {address}")
        await server.start()
        self._servers.append(server)
        return bound

    @staticmethod
    async def _bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None, problem: str) -> int:
        try:
            bound: int = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise OSError(problem)
        return bound

    def stop(self, grace_s: float | None) -> None:
        """Report NOT_SERVING, let in-flight calls finish within ``grace_s``, close the
        listeners and the loop."""
        try:
            self.call(self._stop(grace_s))
        finally:
            self._stop_loop()

    async def _stop(self, grace_s: float | None) -> None:
        await self.health_servicer.enter_graceful_shutdown()
        await self._stop_servers(grace_s)

    async def _stop_servers(self, grace_s: float | None) -> None:
        while self._servers:
            await self._servers.pop(0).stop(grace_s)

    def _stop_loop(self) -> None:
        if self._servers:
            # A start that failed half way: whatever did start stops at once.
            self.call(self._stop_servers(None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()
