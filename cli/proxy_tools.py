"""``rmqstore proxy serve``: cluster mode's RocketMQ 5 proxy (docs/cluster.md)."""

from __future__ import annotations

import argparse

from rmqstore.cli import exits
from rmqstore.cli.exits import EXIT_OK


def cmd_proxy_serve(args: argparse.Namespace) -> int:
    from rmqstore.cli.writer_tools import listen_options_from
    from rmqstore.proxy.node import ProxyOptions, serve
    from rmqstore.proxy.upstream import options_from_environment

    advertise = args.advertise or ()
    upstream = options_from_environment(
        args.upstream_tls_ca, args.upstream_tls_cert, args.upstream_tls_key, args.upstream_access_key, args.upstream_secret_key
    )
    serve(
        ProxyOptions(
            cluster=args.cluster,
            listen=listen_options_from(args),
            advertise=advertise,
            linger_ms=args.linger_ms,
            batch_max=args.batch_max,
            cursor_key=args.cursor_key or "",
            upstream=upstream,
        )
    )
    return EXIT_OK


def endpoints(text: str) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT…]``, each endpoint checked as every endpoint flag checks it."""
    return tuple(exits.endpoint(part) for part in text.split(","))


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from rmqstore.cli.writer_tools import add_server_tls_options
    from rmqstore.proxy.node import DEFAULT_BATCH_MAX, DEFAULT_LINGER_MS
    from rmqstore.proxy.upstream import ACCESS_KEY_ENV, SECRET_KEY_ENV

    proxy = commands.add_parser("proxy", help="cluster mode's RocketMQ 5 proxy, in front of writer groups")
    proxy_commands = proxy.add_subparsers(dest="proxy_command", required=True, metavar="serve")
    serve = proxy_commands.add_parser(
        "serve", help="serve RocketMQ 5's MessagingService for producers in front of the writer groups of a cluster file"
    )
    serve.add_argument(
        "--cluster", required=True, metavar="FILE",
        help="the cluster file (YAML: groups, each with name, writers and queries), read again when it changes",
    )  # fmt: skip
    serve.add_argument("--host", type=exits.host, default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=exits.port, default=0, help="port (default 0: any free port, printed at start)")
    serve.add_argument(
        "--advertise", type=endpoints, metavar="HOST:PORT[,HOST:PORT…]",
        help="the endpoints QueryRoute routes clients to: every proxy's, or their load balancer's (default: the listen address)",
    )  # fmt: skip
    serve.add_argument(
        "--linger-ms", type=float, default=DEFAULT_LINGER_MS,
        help=f"a send waits at most this long for others to share its writer batch (default {DEFAULT_LINGER_MS:g})",
    )  # fmt: skip
    serve.add_argument(
        "--batch-max", type=exits.positive, default=DEFAULT_BATCH_MAX,
        help=f"a writer batch leaves at once with this many messages (default {DEFAULT_BATCH_MAX})",
    )  # fmt: skip
    serve.add_argument(
        "--cursor-key", metavar="FILE",
        help="the key lookup cursors are signed with, the same file for every proxy (made if missing); "
        "default: one of this process's own, so a cursor continues only through this proxy",
    )  # fmt: skip
    # The proxy's own listener: the flags, meanings and defaults of writer serve and query serve.
    add_server_tls_options(serve)
    upstream = serve.add_argument_group("the writer groups' nodes, as the proxy dials them (default: plaintext, unsigned)")
    upstream.add_argument(
        "--upstream-tls-ca", metavar="FILE",
        help="dial the writers and query nodes over TLS, trusting this PEM CA",
    )  # fmt: skip
    upstream.add_argument(
        "--upstream-tls-cert", metavar="FILE",
        help="present this PEM certificate to nodes that require one (mutual TLS; implies TLS); "
        "their ACL sees the proxy as Cert:<its common name>",
    )  # fmt: skip
    upstream.add_argument("--upstream-tls-key", metavar="FILE", help="the upstream certificate's PEM private key")
    upstream.add_argument(
        "--upstream-access-key", metavar="KEY",
        help=f"sign every call to the nodes as this user of their ACL (default: ${ACCESS_KEY_ENV})",
    )  # fmt: skip
    upstream.add_argument(
        "--upstream-secret-key", metavar="SECRET",
        help=f"the upstream user's secret key (default: ${SECRET_KEY_ENV}; prefer it: arguments are visible to other local users)",
    )  # fmt: skip
    serve.set_defaults(handler=cmd_proxy_serve)
