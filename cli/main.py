"""``rmqstore``: the command-line entry point."""

from __future__ import annotations

import argparse
import os
import sys

from rmqstore.cli import console_tools, demo, pipeline_tools, query_tools, store_tools, writer_tools
from rmqstore.common.errors import StoreError

EXIT_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rmqstore",
        description="Apache RocketMQ 4.9's on-disk message store: tools, writer and query nodes.",
    )
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
    try:
        return int(args.handler(args))
    except StoreError as error:
        print(f"rmqstore: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
