"""``rmqstore console``: the web console over a query node (and the writer, for status),
and ``rmqstore console-passwd``, which adds a user to a console users file."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import sys
from collections.abc import Iterator

from rmqstore.cli import exits
from rmqstore.cli.writer_tools import add_client_tls_options, channel_from
from rmqstore.common.errors import InvalidArgument
from rmqstore.service.listen import is_loopback

EXIT_OK = 0
DEFAULT_PORT = 8080
RPC_TIMEOUT_S = 10.0


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise InvalidArgument(f"cannot listen on {host}:{port}: {error.strerror}") from None
    sock.listen(128)
    return sock


def trusted_hosts(host: str, given: list[str]) -> list[str]:
    """The names a request's Host may give (DNS rebinding: a page of another site whose
    name now points at this address sends its own name). A loopback console, and any
    console given --allowed-host, answers only to those, the loopback names and its listen
    address; one on another address without --allowed-host answers to any name, since
    only its operator knows the names it is reached by (docs/console.md)."""
    from rmqstore.console.app import LOOPBACK_HOSTS

    if not given and not is_loopback(host):
        return ["*"]
    wildcard = host in ("0.0.0.0", "::", "")
    listen = [] if wildcard else [f"[{host}]" if ":" in host else host]
    return list(dict.fromkeys([*given, *LOOPBACK_HOSTS, *listen]))


def cmd_console(args: argparse.Namespace) -> int:
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn's server without its own signal handling, which would restore the
        handlers it found once stopped and raise the signal again (a Ctrl-C then ended the
        command as an interrupt, exit 130): the command's handlers below stop it."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    from rmqstore.console.app import build_app
    from rmqstore.console.auth import read_users
    from rmqstore.console.backend import Backend, Endpoints

    if args.users and args.no_auth:
        raise InvalidArgument("give --users FILE or --no-auth, not both")
    if not is_loopback(args.host) and not args.users and not args.no_auth:
        raise InvalidArgument(
            f"--host {args.host} is not a loopback address: give --users FILE (rmqstore console-passwd makes one) "
            "or, to serve without passwords, --no-auth"
        )
    users = read_users(args.users) if args.users else None
    allowed_hosts = trusted_hosts(args.host, args.allowed_host or [])
    sock = _listening_socket(args.host, args.port)
    try:
        query = channel_from(args, args.query_endpoint)
    except BaseException:  # a bad TLS file: the socket is closed, not left to the collector
        sock.close()
        raise
    try:
        writer = channel_from(args, args.writer_endpoint) if args.writer_endpoint else None
    except BaseException:
        sock.close()
        query.close()
        raise
    backend = Backend(Endpoints(query, writer, args.timeout))
    port = sock.getsockname()[1]
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    server = _Server(
        uvicorn.Config(build_app(backend, users, allowed_hosts), log_config=None, access_log=False, log_level="warning", lifespan="off")
    )
    # SIGTERM and SIGINT (Ctrl-C) stop the console as they stop the nodes: a graceful stop,
    # the stopped line, exit 0. The handlers are this command's, installed before the
    # serving line so that a signal at any moment from then on takes that path; a second
    # Ctrl-C closes open connections without waiting for them.
    def stop(signum: int, frame: object) -> None:
        if server.should_exit and signum == signal.SIGINT:
            server.force_exit = True
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        json.dumps(
            {
                "event": "serving",
                "service": "console",
                "port": port,
                "url": f"http://{shown_host}:{port}/",
                "queryEndpoint": args.query_endpoint,
                "writerEndpoint": args.writer_endpoint,
                "auth": "users" if users else "none",
                "allowedHosts": allowed_hosts,
            }
        ),
        flush=True,
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        query.close()
        if writer is not None:
            writer.close()
    print(json.dumps({"event": "stopped", "service": "console"}), flush=True)
    return EXIT_OK


def cmd_console_passwd(args: argparse.Namespace) -> int:
    from rmqstore.console.auth import add_user

    password = sys.stdin.readline().rstrip("\n")
    add_user(args.users, args.user, password)
    print(f"user {args.user} saved in {args.users}")
    return EXIT_OK


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    console = commands.add_parser("console", help="serve the web console (pages and a JSON API) over a query node")
    console.add_argument("--query-endpoint", required=True, type=exits.endpoint, metavar="HOST:PORT", help="the query node to read from")
    console.add_argument("--writer-endpoint", type=exits.endpoint, metavar="HOST:PORT", help="the writer, for its status on the nodes page")
    console.add_argument("--host", type=exits.host, default="127.0.0.1", help="address to listen on (default 127.0.0.1; an IPv6 one bare or in brackets)")
    console.add_argument("--port", type=exits.port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port, printed at start)")
    console.add_argument("--users", metavar="FILE", help="users file (name:argon2 hash lines): HTTP Basic authentication")
    console.add_argument("--no-auth", action="store_true", help="serve a non-loopback address without passwords")
    console.add_argument(
        "--allowed-host", action="append", metavar="NAME",
        help="a name clients reach the console by, checked against each request's Host (repeatable; *.example.com "
        "for a domain's names); loopback names are always allowed (default: loopback names only on a loopback "
        "address, any name on another)",
    )  # fmt: skip
    console.add_argument("--timeout", type=float, default=RPC_TIMEOUT_S, help=f"seconds per call to a node (default {RPC_TIMEOUT_S:.0f})")
    add_client_tls_options(console)
    console.set_defaults(handler=cmd_console)

    passwd = commands.add_parser("console-passwd", help="add or replace a console user; reads the password from stdin")
    passwd.add_argument("--users", required=True, metavar="FILE", help="the users file (created if missing)")
    passwd.add_argument("--user", required=True, help="the user name")
    passwd.set_defaults(handler=cmd_console_passwd)
