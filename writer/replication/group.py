"""A writer group's options (``writer serve --group …``), checked."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

import grpc

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.transport import parse_endpoint

GROUP_NAME_MAX = 64
REPLICAS_MAX = 9
# --replica-pace-ms at most: what a paced chunk adds to an acknowledgement under load.
PACE_MS_MAX = 1000


class Replication(enum.Enum):
    ASYNC = "async"  # acknowledge after the primary's own flush; followers catch up
    SYNC = "sync"  # acknowledge once every in-sync replica, at least --min-insync, holds the bytes


@dataclass(frozen=True)
class PeerTls:
    """How a replica dials its peers when the group serves TLS: the CA their certificates
    are checked against and, when they require one, the client certificate it presents
    (its subject, ``Cert:<common name>``, is what the peers' ACL sees)."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """Read the files now: a replica that cannot read them fails at its start."""
        try:
            ca = Path(self.ca).read_bytes()
            cert = Path(self.cert).read_bytes() if self.cert else None
            key = Path(self.key).read_bytes() if self.key else None
        except OSError as error:
            raise InvalidArgument(f"--replica-tls-*: {error.filename}: {error.strerror}") from None
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


@dataclass(frozen=True)
class GroupOptions:
    """What a replica of a writer group is started with."""

    name: str
    replica_id: int
    replicas: dict[int, str]  # every replica of the group: id → HOST:PORT
    replication: Replication = Replication.ASYNC
    min_insync: int = 1  # replicas, the primary included, that must hold a record before its ack (SYNC)
    replica_lag_max_ms: int = 5000  # a follower further behind than this drops out of the in-sync set
    replica_pace_ms: int = 20  # under load, a follower is sent at most one chunk this often (0: never paced)
    etcd: tuple[str, ...] = ()  # HOST:PORT of etcd's members; none: manual failover (writer promote)
    lease_ttl_s: int = 5  # the primary's etcd lease
    peer_tls: PeerTls | None = None  # None: the replicas serve plaintext, and are dialled so

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > GROUP_NAME_MAX or not all(c.isalnum() or c in "-_." for c in self.name):
            raise InvalidArgument(f"--group {self.name!r}: expected 1-{GROUP_NAME_MAX} letters, digits, '-', '_' or '.'")
        if self.replica_id not in self.replicas:
            raise InvalidArgument(f"--replica-id {self.replica_id} is not in --replicas ({sorted(self.replicas)})")
        if not 1 <= self.min_insync <= len(self.replicas):
            raise InvalidArgument(f"--min-insync {self.min_insync}: expected 1 to the {len(self.replicas)} replicas")
        if self.replica_lag_max_ms < 1:
            raise InvalidArgument(f"--replica-lag-max-ms {self.replica_lag_max_ms}: expected a positive number")
        if not 0 <= self.replica_pace_ms <= PACE_MS_MAX:
            raise InvalidArgument(f"--replica-pace-ms {self.replica_pace_ms}: expected 0 to {PACE_MS_MAX}")
        if self.lease_ttl_s < 2:
            raise InvalidArgument(f"--lease-ttl-s {self.lease_ttl_s}: expected 2 or more (etcd's smallest lease)")
        for member in self.etcd:
            try:
                parse_endpoint(member)
            except InvalidArgument as error:
                raise InvalidArgument(f"--etcd: {error}") from None

    def peer_channel(self, endpoint: str, options: tuple[tuple[str, object], ...] = ()) -> grpc.Channel:
        """A channel to a peer replica, over TLS when the group serves it."""
        if self.peer_tls is None:
            return grpc.insecure_channel(endpoint, options=options)
        return grpc.secure_channel(endpoint, self.peer_tls.credentials(), options=options)

    def peer_aio_channel(self, endpoint: str, options: tuple[tuple[str, object], ...] = ()) -> grpc.aio.Channel:
        if self.peer_tls is None:
            return grpc.aio.insecure_channel(endpoint, options=options)
        return grpc.aio.secure_channel(endpoint, self.peer_tls.credentials(), options=options)

    @property
    def endpoint(self) -> str:
        return self.replicas[self.replica_id]

    @property
    def peers(self) -> dict[int, str]:
        return {k: v for k, v in self.replicas.items() if k != self.replica_id}

    @property
    def waits_for_followers(self) -> bool:
        return self.replication is Replication.SYNC and self.min_insync > 1


def parse_replicas(text: str) -> dict[int, str]:
    """``0=HOST:PORT,1=HOST:PORT,…`` → {0: HOST:PORT, …}."""
    replicas: dict[int, str] = {}
    for item in text.split(","):
        key, equals, endpoint = item.strip().partition("=")
        if not equals or not key.strip().isdigit():
            raise InvalidArgument(f"--replicas: {item!r} is not ID=HOST:PORT")
        replica_id = int(key)
        try:
            parse_endpoint(endpoint.strip())
        except InvalidArgument as error:
            raise InvalidArgument(f"--replicas: {error}") from None
        if replica_id in replicas:
            raise InvalidArgument(f"--replicas names replica {replica_id} twice")
        replicas[replica_id] = endpoint.strip()
    if not 1 <= len(replicas) <= REPLICAS_MAX:
        raise InvalidArgument(f"--replicas: expected 1 to {REPLICAS_MAX} replicas")
    return replicas
