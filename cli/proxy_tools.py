"""``rmqstore proxy serve``: cluster mode's RocketMQ 5 proxy (docs/cluster.md)."""

from __future__ import annotations

import argparse

from rmqstore.cli import exits
from rmqstore.cli.exits import EXIT_OK


def cmd_proxy_serve(args: argparse.Namespace) -> int:
    from rmqstore.proxy.node import ProxyOptions, serve
    from rmqstore.service.listen import ListenOptions

    advertise = args.advertise or ()
    serve(
        ProxyOptions(
            cluster=args.cluster,
            listen=ListenOptions(host=args.host, port=args.port),
            advertise=advertise,
            linger_ms=args.linger_ms,
            batch_max=args.batch_max,
            cursor_key=args.cursor_key or "",
        )
    )
    return EXIT_OK


def endpoints(text: str) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT…]``, each endpoint checked as every endpoint flag checks it."""
    return tuple(exits.endpoint(part) for part in text.split(","))


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from rmqstore.proxy.node import DEFAULT_BATCH_MAX, DEFAULT_LINGER_MS

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
    serve.set_defaults(handler=cmd_proxy_serve)
