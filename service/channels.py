"""TLS credentials of both ends (server certificates, client trust and client
certificates) and the client's channel: apart from the server (service.server), whose
health, reflection, tracing and metrics modules a command line would otherwise load
before its first call (a tenth of a second)."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any

import grpc

from rmqstore.common.errors import InvalidArgument

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def _read_pem(option: str, path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise InvalidArgument(f"{option} {path}: cannot read: {error.strerror or error}") from None
    if b"-----BEGIN " not in data:
        raise InvalidArgument(f"{option} {path}: not a PEM file")
    return data


def _check_certificates(option: str, path: str, data: bytes) -> None:
    """The file parses as one or more PEM certificates (OpenSSL, through the ssl module)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, ValueError, UnicodeDecodeError) as error:
        raise InvalidArgument(f"{option} {path}: not a PEM certificate ({error})") from None


def _check_key_pair(cert_option: str, cert: str, key_option: str, key: str) -> None:
    """The key parses, is not encrypted and matches the certificate."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, OSError, ValueError) as error:
        raise InvalidArgument(
            f"{key_option} {key}: not an unencrypted PEM private key matching {cert_option} {cert} ({error})"
        ) from None


def load_server_credentials(cert: str, key: str, client_ca: str | None = None) -> grpc.ServerCredentials:
    """TLS credentials of a server from PEM files: its certificate chain and private key,
    and with ``client_ca`` the CA that must have signed every client's certificate (mutual
    TLS). A missing, unreadable or invalid file raises InvalidArgument naming it."""
    chain = _read_pem("--tls-cert", cert)
    _check_certificates("--tls-cert", cert, chain)
    private_key = _read_pem("--tls-key", key)
    _check_key_pair("--tls-cert", cert, "--tls-key", key)
    roots = None
    if client_ca is not None:
        roots = _read_pem("--tls-client-ca", client_ca)
        _check_certificates("--tls-client-ca", client_ca, roots)
    return grpc.ssl_server_credentials(
        [(private_key, chain)], root_certificates=roots, require_client_auth=client_ca is not None
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
        roots = _read_pem("--tls-ca", ca)
        _check_certificates("--tls-ca", ca, roots)
    chain = private_key = None
    if client_cert is not None and client_key is not None:
        chain = _read_pem("--tls-client-cert", client_cert)
        _check_certificates("--tls-client-cert", client_cert, chain)
        private_key = _read_pem("--tls-client-key", client_key)
        _check_key_pair("--tls-client-cert", client_cert, "--tls-client-key", client_key)
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
    # A page may hold 16 MiB of records and one more record of up to 4 MiB: more than
    # grpc's default 4 MiB a client receives.
    options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), *extra_options]
    if ca is None and client_cert is None and client_key is None:
        if server_name is not None:
            raise InvalidArgument("--tls-server-name needs TLS: give --tls-ca (or a client certificate)")
        return grpc.insecure_channel(endpoint, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(endpoint, load_channel_credentials(ca, client_cert, client_key), options=options)
