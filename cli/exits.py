"""The command line's one table of exit codes, the one-line error every failure becomes, and
the argument types that refuse bad numbers before anything runs.

Every command ends through :func:`exit_code_for`: a store error, a gRPC status from a node,
an OS error or an interrupt is printed as one ``rmqstore: error: …`` line on stderr and
mapped to the same code whether the command ran against a node (``--endpoint``) or a
directory (``--store``).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Callable
from typing import NoReturn

import grpc

from rmqstore.common import errors

# Store directories named on the command line, checked as the nodes check theirs.
from rmqstore.common.files.directories import creatable_dir as creatable_dir
from rmqstore.common.files.directories import existing_store as existing_store
from rmqstore.common.times import parse_time_ms
from rmqstore.common.transport import parse_endpoint, parse_host
from rmqstore.service.stopping import EXIT_STOP_STALLED as EXIT_STOP_STALLED

EXIT_OK = 0
# Check failed, or a dump or reindex stopped at corruption.
EXIT_DISAGREE = 1
# Bad arguments, or a store that is missing, unreadable or of other sizes.
EXIT_USAGE = 2
# An unknown topic, queue or id, or no message at an offset.
EXIT_NOT_FOUND = 3
# EXIT_STOP_STALLED (4, imported above): a node whose stop did not finish in time (every
# thread's stack written to stderr).
# Ctrl-C: the code shells give a process that SIGINT ended (128 + 2).
EXIT_INTERRUPTED = 130

PREFIX = "rmqstore: error: "

# gRPC statuses a node answers with, to exit codes (the reverse of service.errors' table).
STATUS_EXITS = {
    grpc.StatusCode.NOT_FOUND: EXIT_NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE: EXIT_NOT_FOUND,
    grpc.StatusCode.DATA_LOSS: EXIT_DISAGREE,
}


class LocalRpcError(Exception):
    """The status a servicer run in process (``--store``) aborted with, shaped like the
    ``grpc.RpcError`` a node's answer raises, so both take one path to an exit code."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def fail(message: str) -> None:
    """Print one error line (newlines inside folded, so it stays one line)."""
    print(PREFIX + " ".join(message.split("\n")), file=sys.stderr, flush=True)


# What gRPC answers for a method the server does not serve.
METHOD_NOT_FOUND = "Method not found!"
# The node each kind of command talks to, and the one it is most often confused with.
OTHER_NODE = {"writer": "a query node", "query node": "a writer"}


def status_exit(error: grpc.RpcError | LocalRpcError, note: str = "", *, node: str | None = None, endpoint: str | None = None) -> int:
    """Report a node's (or the in-process servicer's) status, with ``note`` after it on the
    same line; its exit code. ``node``, the kind of node the command needs (``writer``,
    ``query node``) at ``endpoint``, names what answered a call it does not serve."""
    code: grpc.StatusCode = error.code()
    details = error.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        details = f"no node answers ({details})"
    elif code == grpc.StatusCode.UNIMPLEMENTED and details == METHOD_NOT_FOUND and node in OTHER_NODE:
        details = f"{endpoint} is not a {node}: it does not serve the {node}'s calls (is it {OTHER_NODE[node]}'s port?)"
    fail(f"{code.name}: {details}{note}")
    return STATUS_EXITS.get(code, EXIT_USAGE)


def store_error_exit(error: errors.StoreError) -> int:
    fail(str(error))
    if isinstance(error, (errors.NotFound, errors.OutOfRange)):
        return EXIT_NOT_FOUND
    if isinstance(error, errors.Corruption):
        return EXIT_DISAGREE
    return EXIT_USAGE


def os_error_exit(error: OSError) -> int:
    if error.filename is not None and error.strerror:
        fail(f"{error.filename}: {error.strerror}")
    else:
        fail(str(error) or type(error).__name__)
    return EXIT_USAGE


# Argument types: a number protobuf or the store cannot hold is refused by argparse, naming
# the flag, instead of surfacing later as a ValueError from deep inside a request.

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _bounded(kind: str, low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside [{low}, {high}] ({kind})")
        return value

    parse.__name__ = kind
    return parse


queue_id = _bounded("a queue id", 0, INT32_MAX)
offset = _bounded("an offset", 0, INT64_MAX)
port = _bounded("a TCP port", 0, 65535)
positive = _bounded("a count of at least 1", 1, INT32_MAX)
size = _bounded("a size of at least 1", 1, INT64_MAX)
rate_mib = _bounded("MiB a second, 0 for no limit", 0, 1 << 20)


def pace_ms(text: str) -> int:
    """``--replica-pace-ms``: 0 to the writer group's bound (imported only when given)."""
    from rmqstore.writer.replication.group import PACE_MS_MAX

    return _bounded("milliseconds, 0 for none", 0, PACE_MS_MAX)(text)


def _bounded_real(kind: str, low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (low < value if low_open else low <= value) or not value <= high:
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"{text} is outside {interval} ({kind})")
        return value

    parse.__name__ = kind
    return parse


def _endpoint_parts(text: str) -> tuple[str, int]:
    try:
        return parse_endpoint(text)
    except errors.InvalidArgument as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def time_ms(text: str) -> int:
    """A time argument, in the one syntax every command takes (common/times.py)."""
    try:
        return parse_time_ms(text)
    except errors.InvalidArgument as error:
        raise argparse.ArgumentTypeError(str(error)) from None


time_ms.__name__ = "a time"
# What every time argument's help says it takes.
TIME_HELP = "epoch ms, ISO 8601 (UTC without a zone) or yyyy-MM-dd#HH:mm:ss:SSS (local time)"


def host(text: str) -> str:
    """A host to listen on (``--host``): a name or an address, an IPv6 one bare or in
    brackets; returned bare."""
    try:
        return parse_host(text)
    except errors.InvalidArgument as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def endpoint(text: str) -> str:
    """``HOST:PORT`` (an IPv6 address in brackets), the one endpoint syntax of every flag
    that names one; as given, once checked."""
    _endpoint_parts(text)
    return text


def endpoints(text: str) -> str:
    """``HOST:PORT[,HOST:PORT…]``: a writer group's replicas (the command finds the
    primary among them), or one endpoint; as given, once each is checked."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT[,HOST:PORT...]: an empty endpoint")
    for part in parts:
        _endpoint_parts(part)
    return ",".join(parts)


def ip_endpoint(text: str) -> str:
    """``IP:PORT``: an endpoint whose host is an address (``--store-host``: records carry
    the address's bytes, never a name)."""
    host, _ = _endpoint_parts(text)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not IP:PORT: {host!r} is not an IP address") from None
    return text


ratio = _bounded_real("a share of the disk", 0.0, 1.0)
seconds = _bounded_real("seconds", 0.0, 1e9, low_open=True)
hours = _bounded_real("hours", 0.0, 1e9)


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line and exit code 2 like every other failure."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("rmqstore").strip()
        fail(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")
        sys.exit(EXIT_USAGE)
