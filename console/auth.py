"""The console's users file: one ``name:hash`` line per user, Argon2id hashes
(argon2-cffi), ``#`` comments. Checked with HTTP Basic authentication.

An Argon2 check is made to be expensive (argon2-cffi's defaults: 64 MiB and about 0.2 s
of CPU each), so :class:`PasswordChecks` bounds them: a few at once, a few more waiting,
the rest refused at once; a budget of failed checks per client address; a user name the
file does not hold costs the same check as one it does (no answer tells, by its time,
which names exist); and a proven header is remembered for a while, so that a browser,
which sends it with every request, pays for one check, not one a page."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import secrets
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from argon2 import PasswordHasher, extract_parameters
from argon2.exceptions import InvalidHashError, VerificationError
from starlette.concurrency import run_in_threadpool

from rmqstore.common.errors import InvalidArgument

_HASHER = PasswordHasher()
USER_NAME_MAX = 64


def _check_name(name: str) -> None:
    if not name or len(name) > USER_NAME_MAX or ":" in name or not name.isprintable() or name != name.strip():
        raise InvalidArgument(f"user name {name[:USER_NAME_MAX]!r}: 1-{USER_NAME_MAX} printable characters, no ':' and no outer spaces")


def read_users(path: str) -> dict[str, str]:
    """Name → hash. A malformed line is an error naming it: a typo must not lock out or let in."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as error:
        raise InvalidArgument(f"users file {path}: {error.strerror}") from None
    users: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, hashed = line.partition(":")
        if not sep or not hashed.startswith("$argon2"):
            raise InvalidArgument(f"users file {path}, line {number}: expected name:$argon2id$... (make one with rmqstore console-passwd)")
        _check_name(name)
        users[name] = hashed
    if not users:
        raise InvalidArgument(f"users file {path} holds no user")
    return users


def add_user(path: str, name: str, password: str) -> None:
    """Add or replace a user, atomically (temp file, fsync, rename)."""
    _check_name(name)
    if not password:
        raise InvalidArgument("the password is empty")
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InvalidArgument(f"users file {path} is a directory")
    if not os.path.isdir(directory):
        raise InvalidArgument(f"users file {path}: no such directory {directory}")
    lines: list[str] = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            lines = [line for line in handle.read().splitlines() if line.partition(":")[0] != name]
    lines.append(f"{name}:{_HASHER.hash(password)}")
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=".users-")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def decoy_hash(users: dict[str, str]) -> str:
    """A hash of a random password with the parameters of the file's first user: what a
    name the file does not hold is checked against, so that it costs a known name's work."""
    first = next(iter(users.values()))
    try:
        hasher = PasswordHasher.from_parameters(extract_parameters(first))
    except InvalidHashError:
        hasher = _HASHER
    return hasher.hash(secrets.token_urlsafe(24))


def _basic_credentials(header: str) -> tuple[str, str] | None:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        name, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (name, password) if sep else None


def check_basic(users: dict[str, str], header: str, decoy: str | None = None) -> str | None:
    """The user an ``Authorization: Basic`` header proves, or None. With ``decoy``, a name
    the file does not hold is checked against it (and refused), at a known name's cost."""
    credentials = _basic_credentials(header)
    if credentials is None:
        return None
    name, password = credentials
    hashed = users.get(name)
    if hashed is None and decoy is None:
        return None
    try:
        _HASHER.verify(hashed if hashed is not None else decoy, password)  # type: ignore[arg-type]
    except (VerificationError, InvalidHashError):
        return None
    return name if hashed is not None else None


# Argon2 checks running at once (each holds its hash's memory, 64 MiB by default), and
# waiting for a turn; a request beyond both is refused at once (429).
CHECKS_RUNNING_MAX = 2
CHECKS_WAITING_MAX = 8
# Failed checks a client address may make in a burst, then one per FAILURE_REFILL_S: a
# password guesser gets 10 a minute; an address beyond is refused (429) without a check.
FAILURES_BURST = 10
FAILURE_REFILL_S = 6.0
ADDRESSES_TRACKED_MAX = 4096
# A header proven by a check is accepted without one for this long.
REMEMBERED_S = 300.0
REMEMBERED_MAX = 1024


class Outcome(Enum):
    PROVEN = "proven"
    REFUSED = "refused"  # no such user, or a wrong password: 401
    BUSY = "busy"  # too many checks running and waiting: 429
    LIMITED = "limited"  # the address spent its failed checks: 429


@dataclass
class _Budget:
    tokens: float
    at_s: float


class PasswordChecks:
    """HTTP Basic checks against a users file, bounded (see the module's note). Runs on
    the server's event loop; the Argon2 work on the thread pool."""

    def __init__(self, users: dict[str, str]):
        self.users = users
        self.decoy = decoy_hash(users)
        self._running = asyncio.Semaphore(CHECKS_RUNNING_MAX)
        self._waiting = 0
        self._budgets: OrderedDict[str, _Budget] = OrderedDict()
        self._remembered: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._key = secrets.token_bytes(32)

    def _budget(self, address: str, now_s: float) -> _Budget:
        budget = self._budgets.pop(address, None)
        if budget is None:
            budget = _Budget(float(FAILURES_BURST), now_s)
        else:
            budget.tokens = min(float(FAILURES_BURST), budget.tokens + (now_s - budget.at_s) / FAILURE_REFILL_S)
            budget.at_s = now_s
        self._budgets[address] = budget
        while len(self._budgets) > ADDRESSES_TRACKED_MAX:
            self._budgets.popitem(last=False)
        return budget

    async def check(self, header: str, address: str) -> tuple[Outcome, str | None]:
        """The outcome of a request's ``Authorization`` header, and the user it proves."""
        digest = hmac.new(self._key, header.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()
        now_s = time.monotonic()
        remembered = self._remembered.get(digest)
        if remembered is not None and remembered[1] > now_s:
            return Outcome.PROVEN, remembered[0]
        if self._budget(address, now_s).tokens < 1:
            return Outcome.LIMITED, None
        if self._waiting >= CHECKS_WAITING_MAX:
            return Outcome.BUSY, None
        self._waiting += 1
        try:
            await self._running.acquire()
        finally:
            self._waiting -= 1
        try:
            user = await run_in_threadpool(check_basic, self.users, header, self.decoy)
        finally:
            self._running.release()
        if user is None:
            self._budget(address, time.monotonic()).tokens -= 1
            return Outcome.REFUSED, None
        self._remembered[digest] = (user, time.monotonic() + REMEMBERED_S)
        while len(self._remembered) > REMEMBERED_MAX:
            self._remembered.popitem(last=False)
        return Outcome.PROVEN, user
