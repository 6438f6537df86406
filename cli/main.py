"""``rmqstore``: the command-line entry point."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import grpc

from rmqstore.cli import exits
from rmqstore.common.errors import StoreError

# The modules that register commands, in the order the help lists them, and the commands
# each registers. A command line that names a command loads and registers only its module
# (a tenth of `rmqstore send`'s start-up is the others); help and an unknown command get
# the whole parser. tests/test_cli.py holds this table to what the modules register.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "store_tools": ("dump", "reindex", "inspect", "check"),
    "writer_tools": ("writer", "send"),
    "replica_tools": ("replicas",),
    "proxy_tools": ("proxy",),
    "query_tools": (
        "query", "queryMsgByKey", "queryMsgByUniqueKey", "queryMsgById", "queryMsgByOffset", "searchOffset",
        "printMsg", "topicList", "topicStatus", "consumerProgress", "updateTopic", "updateSubGroup",
    ),  # fmt: skip
    "console_tools": ("console", "console-passwd"),
    "demo": ("demo",),
    "pipeline_tools": ("pipeline",),
}


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


def build_parser(command: str | None = None) -> exits.Parser:
    """The command line's parser: with ``command`` (a name the table above knows), only its
    module's commands; with ``--version`` (which prints and exits before a command is
    parsed), none; else all of them."""
    parser = exits.Parser(
        prog="rmqstore",
        description="Apache RocketMQ 4.9's on-disk message store: tools, writer and query nodes.",
        epilog="exit codes: 0 success; 1 the data disagrees (check failed, corruption); 2 usage, or a "
        "missing or unreadable store; 3 not found (topic, queue, id, no message at an offset); 4 a node's stop "
        "stalled (every thread's stack on stderr); 130 interrupted",
    )
    parser.add_argument("--version", action=VersionAction, help="show the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if command == "--version":
        modules = []
    else:
        modules = [name for name, names in COMMAND_MODULES.items() if command in names] or list(COMMAND_MODULES)
    for name in modules:
        importlib.import_module(f"rmqstore.cli.{name}").register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The command is the first argument (the top level takes no option with a value).
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    # The edge of the command line: whatever ends a command becomes one error line and a
    # code from the exit table (exits.py), never a traceback.
    try:
        return int(args.handler(args))
    except StoreError as error:
        return exits.store_error_exit(error)
    except (grpc.RpcError, exits.LocalRpcError) as error:
        return exits.status_exit(error, node=getattr(args, "node", None), endpoint=getattr(args, "endpoint", None))
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


# A command's process ends at most this long after main() returned. Twice in CI a `send`
# printed its one line (a refused stream, an interrupted one) and its process did not end
# within 60 s; the thread that held the interpreter's exit is not known (it was never seen
# here). A script waiting on the command does not wait with it. Long enough for the
# telemetry exporters' last export at exit (OTLP's timeout is 10 s).
EXIT_GRACE_S = 30.0


def run() -> NoReturn:
    """The command line's entry point: :func:`main`, then the exit with its code, forced
    (os._exit) should the interpreter's exit take EXIT_GRACE_S; with PYTHONFAULTHANDLER
    set, every thread's stack goes to stderr first, to show what held it."""
    code = main()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()

    def force_exit() -> None:
        time.sleep(EXIT_GRACE_S)
        if os.environ.get("PYTHONFAULTHANDLER"):
            with contextlib.suppress(OSError, ValueError):
                faulthandler.dump_traceback(all_threads=True)
        os._exit(code)

    threading.Thread(target=force_exit, name="exit-grace", daemon=True).start()
    sys.exit(code)


if __name__ == "__main__":
    run()
