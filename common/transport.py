"""What both ends of a connection to a node share: the one endpoint syntax, the largest
message either sends, and the PEM files TLS is set up from, checked before gRPC reads them
(a bad file is an InvalidArgument naming its option, not an error from deep inside gRPC)."""

from __future__ import annotations

import ipaddress
import re
import ssl

from rmqstore.common.errors import InvalidArgument

# A page may hold 16 MiB of records and one more record of up to 4 MiB: more than grpc's
# default 4 MiB a client receives.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

PORT_MAX = 65535
# A DNS name (labels of letters, digits, '-' and '_'; an optional final dot) or an IPv4
# address; anything else (a scheme, a path, spaces) would be read by gRPC as another kind of
# target.
_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?")
_PORT = re.compile(r"[0-9]{1,5}")


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def parse_host(text: str) -> str:
    """A host to listen on (``--host``): a host name, an IPv4 address, or an IPv6 address,
    bare or in brackets; returned bare. A port, a scheme or spaces are an InvalidArgument."""
    if _is_ipv6(text):
        return text
    if text.startswith("[") and text.endswith("]") and _is_ipv6(text[1:-1]):
        return text[1:-1]
    if ":" in text:
        raise InvalidArgument(f"{text!r} is not a host: give the address alone (the port has a flag of its own)")
    if not _HOST_NAME.fullmatch(text):
        raise InvalidArgument(f"{text!r} is not a host name or address")
    return text


def endpoint_text(host: str, port: int) -> str:
    """``HOST:PORT`` for a bare host (an IPv6 address put in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT``, the one way every command and node names an endpoint (an IPv6 address
    in brackets: ``[::1]:8081``): its host (an IPv6 address without the brackets) and port,
    1-65535. Anything else is an InvalidArgument saying what is wrong, rather than a target
    gRPC would read another way (``localhost`` alone dials port 443, a port above 65535
    wraps around)."""

    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(f"{text!r} is not HOST:PORT: {why}")

    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed:
            raise bad("no ] after the IPv6 address")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad(f"{host!r} in brackets is not an IPv6 address") from None
        if not rest:
            raise bad("no port")
        if not rest.startswith(":"):
            raise bad(f"{rest!r} after the ] is not :PORT")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise bad("no port")
        if ":" in host:
            unbracketed = any(_is_ipv6(address) for address in (text, host))
            raise bad("an IPv6 address goes in brackets, e.g. [::1]:8081" if unbracketed else f"{host!r} is not a host name or address")
        if not host:
            raise bad("no host")
        if not _HOST_NAME.fullmatch(host):
            raise bad(f"{host!r} is not a host name or address")
        if all(label.isdigit() for label in host.rstrip(".").split(".")):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise bad(f"{host!r} is not an IPv4 address") from None
    if not _PORT.fullmatch(port_text):
        raise bad(f"the port {port_text!r} is not a number" if port_text else "no port")
    port = int(port_text)
    if not 1 <= port <= PORT_MAX:
        raise bad(f"the port {port} is outside [1, {PORT_MAX}]")
    return host, port


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
