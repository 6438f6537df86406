"""Calls signed for a node with an ACL (common.signing says how; docs/security.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from rmqstore.common.signing import sign

__all__ = ["sign", "signing_channel"]


class _Signing(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, access_key: str, secret_key: str):
        self.access_key, self.secret_key = access_key, secret_key

    def _details(self, details: Any) -> Any:
        metadata = (*(details.metadata or ()), *sign(self.access_key, self.secret_key))
        return _CallDetails(details.method, details.timeout, metadata, details.credentials, details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), requests)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: tuple[tuple[str, str | bytes], ...] | None
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


def signing_channel(channel: grpc.Channel, access_key: str, secret_key: str) -> grpc.Channel:
    """``channel`` with every call signed."""
    return grpc.intercept_channel(channel, _Signing(access_key, secret_key))
