"""What both ends of a connection to a node share: the largest message either sends, and
the PEM files TLS is set up from, checked before gRPC reads them (a bad file is an
InvalidArgument naming its option, not an error from deep inside gRPC)."""

from __future__ import annotations

import ssl

from rmqstore.common.errors import InvalidArgument

# A page may hold 16 MiB of records and one more record of up to 4 MiB: more than grpc's
# default 4 MiB a client receives.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def read_pem(option: str, path: str) -> bytes:
    """The file ``option`` names, which must hold PEM data."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise InvalidArgument(f"{option} {path}: cannot read: {error.strerror or error}") from None
    if b"-----BEGIN " not in data:
        raise InvalidArgument(f"{option} {path}: not a PEM file")
    return data


def check_certificates(option: str, path: str, data: bytes) -> None:
    """The file parses as one or more PEM certificates (OpenSSL, through the ssl module)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, ValueError, UnicodeDecodeError) as error:
        raise InvalidArgument(f"{option} {path}: not a PEM certificate ({error})") from None


def check_key_pair(cert_option: str, cert: str, key_option: str, key: str) -> None:
    """The key parses, is not encrypted and matches the certificate."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, OSError, ValueError) as error:
        raise InvalidArgument(
            f"{key_option} {key}: not an unencrypted PEM private key matching {cert_option} {cert} ({error})"
        ) from None
