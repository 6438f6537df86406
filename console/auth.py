"""The console's users file: one ``name:hash`` line per user, Argon2id hashes
(argon2-cffi), ``#`` comments. Checked with HTTP Basic authentication."""

from __future__ import annotations

import base64
import binascii
import os
import tempfile

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

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
    lines: list[str] = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            lines = [line for line in handle.read().splitlines() if line.partition(":")[0] != name]
    lines.append(f"{name}:{_HASHER.hash(password)}")
    directory = os.path.dirname(os.path.abspath(path))
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


def check_basic(users: dict[str, str], header: str) -> str | None:
    """The user an ``Authorization: Basic`` header proves, or None."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        name, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    hashed = users.get(name)
    if not sep or hashed is None:
        return None
    try:
        _HASHER.verify(hashed, password)
    except (VerificationError, InvalidHashError):
        return None
    return name
