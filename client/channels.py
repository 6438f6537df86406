"""The client's channel to a node: plaintext, or TLS with the client's trust and
certificate (the server's side is service.channels)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.transport import (
    MAX_MESSAGE_BYTES,
    check_certificates,
    check_key_pair,
    read_pem,
)


def load_channel_credentials(
    ca: str | None = None, client_cert: str | None = None, client_key: str | None = None
) -> grpc.ChannelCredentials:
    """TLS credentials of a client: trust ``ca`` (default: gRPC's built-in roots) and, for
    mutual TLS, present ``client_cert`` with ``client_key``."""
    if (client_cert is None) != (client_key is None):
        raise InvalidArgument("give --tls-client-cert and --tls-client-key together")
    roots = None
    if ca is not None:
        roots = read_pem("--tls-ca", ca)
        check_certificates("--tls-ca", ca, roots)
    chain = private_key = None
    if client_cert is not None and client_key is not None:
        chain = read_pem("--tls-client-cert", client_cert)
        check_certificates("--tls-client-cert", client_cert, chain)
        private_key = read_pem("--tls-client-key", client_key)
        check_key_pair("--tls-client-cert", client_cert, "--tls-client-key", client_key)
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=private_key, certificate_chain=chain)


def open_channel(
    endpoint: str,
    *,
    ca: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
    server_name: str | None = None,
    extra_options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A plaintext channel, or a TLS one as soon as any TLS file is given. ``server_name``
    checks the server's certificate for that name instead of the endpoint's host (e.g.
    through a port-forward to 127.0.0.1). ``extra_options`` are more channel arguments."""
    options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), *extra_options]
    if ca is None and client_cert is None and client_key is None:
        if server_name is not None:
            raise InvalidArgument("--tls-server-name needs TLS: give --tls-ca (or a client certificate)")
        return grpc.insecure_channel(endpoint, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(endpoint, load_channel_credentials(ca, client_cert, client_key), options=options)
