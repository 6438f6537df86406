"""``rmqstore``: the command-line entry point."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import grpc

from rmqstore.cli import (
    console_tools,
    demo,
    exits,
    pipeline_tools,
    query_tools,
    store_tools,
    writer_tools,
)
from rmqstore.common.errors import StoreError


def version() -> str:
    # importlib.metadata (with the email package it reads metadata with) is a tenth of the
    # command line's start-up: loaded only when the version is asked for.
    from importlib import metadata

    try:
        return metadata.version("rmqstore")
    except metadata.PackageNotFoundError:
        return "unknown"


class VersionAction(argparse.Action):
    """``--version``: argparse's, with the version looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"rmqstore {version()}")
        parser.exit()


def build_parser() -> exits.Parser:
    parser = exits.Parser(
        prog="rmqstore",
        description="Apache RocketMQ 4.9's on-disk message store: tools, writer and query nodes.",
        epilog="exit codes: 0 success; 1 the data disagrees (check failed, corruption); 2 usage, or a "
        "missing or unreadable store; 3 not found (topic, queue, id, no message at an offset); 130 interrupted",
    )
    parser.add_argument("--version", action=VersionAction, help="show the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    store_tools.register(commands)
    writer_tools.register(commands)
    query_tools.register(commands)
    console_tools.register(commands)
    demo.register(commands)
    pipeline_tools.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The edge of the command line: whatever ends a command becomes one error line and a
    # code from the exit table (exits.py), never a traceback.
    try:
        return int(args.handler(args))
    except StoreError as error:
        return exits.store_error_exit(error)
    except (grpc.RpcError, exits.LocalRpcError) as error:
        return exits.status_exit(error)
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return exits.EXIT_OK
    except OSError as error:
        return exits.os_error_exit(error)
    except KeyboardInterrupt:
        exits.fail("interrupted")
        return exits.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
