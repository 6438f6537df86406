"""How a proxy reaches the nodes of its writer groups (docs/cluster.md, "Security"):
plaintext, or TLS trusting ``--upstream-tls-ca`` and, for nodes that require a client
certificate, presenting ``--upstream-tls-cert``; with an upstream user
(``--upstream-access-key``), every call signed as the CLI signs its calls
(:func:`rmqstore.common.signing.sign`).

A proxy's clients never reach a node with their own identity: the proxy checks each of
them against its own ``--acl``, as Apache's proxy does, and the nodes see the proxy alone
(its user, or ``Cert:<common name>`` of its certificate). That identity must be allowed
everything the proxy relays (a ``Super`` user, or Pub, Sub, Create, Update, Get and List on
the topics and groups the clients use, and List on ``Cluster``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.signing import sign
from rmqstore.common.transport import check_certificates, check_key_pair, read_pem

ACCESS_KEY_ENV = "RMQSTORE_UPSTREAM_ACCESS_KEY"
SECRET_KEY_ENV = "RMQSTORE_UPSTREAM_SECRET_KEY"


@dataclass(frozen=True)
class UpstreamOptions:
    tls_ca: str | None = None  # PEM CA the nodes' certificates are checked against: dial TLS
    tls_cert: str | None = None  # PEM certificate presented to nodes that require one (implies TLS)
    tls_key: str | None = None  # its PEM private key
    access_key: str | None = None  # the user every call is signed as (nodes with --acl)
    secret_key: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    @property
    def signed(self) -> bool:
        return self.access_key is not None


def upstream_credentials(options: UpstreamOptions) -> grpc.ChannelCredentials | None:
    """The TLS credentials the nodes are dialled with (None: plaintext), the files and the
    options' combinations checked first: InvalidArgument naming the flag."""
    if (options.tls_cert is None) != (options.tls_key is None):
        raise InvalidArgument("give --upstream-tls-cert and --upstream-tls-key together")
    if (options.access_key is None) != (options.secret_key is None):
        raise InvalidArgument(
            f"give an upstream access key and secret key together (--upstream-access-key/--upstream-secret-key "
            f"or {ACCESS_KEY_ENV}/{SECRET_KEY_ENV})"
        )
    if not options.tls:
        return None
    roots = None
    if options.tls_ca is not None:
        roots = read_pem("--upstream-tls-ca", options.tls_ca)
        check_certificates("--upstream-tls-ca", options.tls_ca, roots)
    chain = private_key = None
    if options.tls_cert is not None and options.tls_key is not None:
        chain = read_pem("--upstream-tls-cert", options.tls_cert)
        check_certificates("--upstream-tls-cert", options.tls_cert, chain)
        private_key = read_pem("--upstream-tls-key", options.tls_key)
        check_key_pair(
            "--upstream-tls-cert", options.tls_cert, "--upstream-tls-key", options.tls_key
        )
    return grpc.ssl_channel_credentials(
        root_certificates=roots, private_key=private_key, certificate_chain=chain
    )


def options_from_environment(
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    access_key: str | None,
    secret_key: str | None,
) -> UpstreamOptions:
    """The flags, an absent credential taken from the environment (a secret is better
    there than in the arguments every local user can read)."""
    return UpstreamOptions(
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
        access_key=access_key or os.environ.get(ACCESS_KEY_ENV) or None,
        secret_key=secret_key or os.environ.get(SECRET_KEY_ENV) or None,
    )


class _Signer:
    """Signs a call of an asyncio channel when it starts (a stream is authenticated once,
    at its start)."""

    def __init__(self, access_key: str, secret_key: str):
        self.access_key, self.secret_key = access_key, secret_key

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *sign(self.access_key, self.secret_key))
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials, details.wait_for_ready)


# One class per kind of call: an asyncio channel files each interceptor under the first
# kind it is an instance of. (grpc's stubs type these base classes as Any.)
class _SignUnaryUnary(_Signer, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _SignUnaryStream(_Signer, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _SignStreamUnary(_Signer, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), requests)


class _SignStreamStream(_Signer, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), requests)


class Upstream:
    """Opens the proxy's channels to its groups' nodes as :class:`UpstreamOptions` say
    (the files read and checked once, when it is made)."""

    def __init__(self, options: UpstreamOptions | None = None):
        self.options = options or UpstreamOptions()
        self._credentials = upstream_credentials(self.options)
        access_key, secret_key = self.options.access_key, self.options.secret_key
        self._interceptors: list[_Signer] = []
        if access_key is not None and secret_key is not None:
            kinds = (_SignUnaryUnary, _SignUnaryStream, _SignStreamUnary, _SignStreamStream)
            self._interceptors = [kind(access_key, secret_key) for kind in kinds]

    def channel(self, endpoint: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """A channel to a node (opened on the running loop)."""
        interceptors = self._interceptors or None
        if self._credentials is None:
            return grpc.aio.insecure_channel(
                endpoint, options=list(options), interceptors=interceptors
            )
        return grpc.aio.secure_channel(
            endpoint, self._credentials, options=list(options), interceptors=interceptors
        )


PLAINTEXT = Upstream()
