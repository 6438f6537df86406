"""Socket addresses as RocketMQ stores them: 4 or 16 address bytes, then an int32 port."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from rmqstore.common.errors import InvalidArgument

PORT_MAX = 65535


@dataclass(frozen=True, slots=True)
class SocketAddress:
    """An IPv4 (4-byte) or IPv6 (16-byte) address with a port."""

    ip: bytes
    port: int

    def __post_init__(self) -> None:
        if len(self.ip) not in (4, 16):
            raise InvalidArgument(f"address must be 4 or 16 bytes, got {len(self.ip)}")

    @property
    def is_v6(self) -> bool:
        return len(self.ip) == 16

    @property
    def width_bytes(self) -> int:
        """Bytes on disk: address + int32 port."""
        return len(self.ip) + 4

    def java_text(self) -> str:
        """``InetAddress.getHostAddress() + ":" + port``, as RocketMQ's tools print it.

        Java prints IPv6 as eight lowercase hex groups without ``::`` compression, and a
        16-byte IPv4-mapped address as dotted IPv4 (getByAddress returns an Inet4Address).
        """
        return f"{self.host_text()}:{self.port}"

    def host_text(self) -> str:
        if len(self.ip) == 4:
            return str(ipaddress.IPv4Address(self.ip))
        v6 = ipaddress.IPv6Address(self.ip)
        if v6.ipv4_mapped is not None:
            return str(v6.ipv4_mapped)
        return ":".join(f"{int.from_bytes(self.ip[i:i + 2], 'big'):x}" for i in range(0, 16, 2))

    @classmethod
    def parse(cls, text: str) -> SocketAddress:
        """Parse ``1.2.3.4:80``, ``[2001:db8::7]:80`` or Java's ``2001:db8:0:0:0:0:0:7:80``."""
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise InvalidArgument(f"address {text!r} has no port")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            address = ipaddress.ip_address(host)
            port = int(port_text)
        except ValueError as exc:
            raise InvalidArgument(f"bad socket address {text!r}: {exc}") from None
        if not 0 <= port <= PORT_MAX:
            raise InvalidArgument(f"port {port} out of range in {text!r}")
        return cls(address.packed, port)
