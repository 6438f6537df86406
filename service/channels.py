"""A node's TLS credentials, from PEM files checked first (common.transport). Apart from
the server (service.server), whose health, reflection, tracing and metrics modules a
node's options are checked without."""

from __future__ import annotations

import grpc

from rmqstore.common.transport import check_certificates, check_key_pair, read_pem


def load_server_credentials(cert: str, key: str, client_ca: str | None = None) -> grpc.ServerCredentials:
    """TLS credentials of a server from PEM files: its certificate chain and private key,
    and with ``client_ca`` the CA that must have signed every client's certificate (mutual
    TLS). A missing, unreadable or invalid file raises InvalidArgument naming it."""
    chain = read_pem("--tls-cert", cert)
    check_certificates("--tls-cert", cert, chain)
    private_key = read_pem("--tls-key", key)
    check_key_pair("--tls-cert", cert, "--tls-key", key)
    roots = None
    if client_ca is not None:
        roots = read_pem("--tls-client-ca", client_ca)
        check_certificates("--tls-client-ca", client_ca, roots)
    return grpc.ssl_server_credentials(
        [(private_key, chain)], root_certificates=roots, require_client_auth=client_ca is not None
    )
