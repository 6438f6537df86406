"""Start a gRPC server with health checking, reflection and the tracing interceptor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import server_interceptor

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def start_server(
    register: Callable[[grpc.Server], None],
    service_names: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    workers: int = 32,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """Bind, register the services, mark them SERVING and start. Port 0 picks a free
    port; the bound port is returned."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"),
        interceptors=[server_interceptor()],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in (*service_names, ""):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((*service_names, reflection.SERVICE_NAME, health.SERVICE_NAME), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    server.start()
    return server, bound, health_servicer
