"""The store's cursor key: the secret query nodes sign their page cursors with.

``config/rmqstore-cursor.key`` holds a magic line and 32 random bytes in hex. The writer
creates it when it opens a store (temp file, fsync, rename, fsync directory) and never
changes it, so every query node of the store signs and accepts the same cursors, and a
cursor stays valid across restarts. The file is made readable by its owner only: whoever
reads it can forge cursors (which would still only page through a query's own answer).
"""

from __future__ import annotations

import os
import secrets

from rmqstore.common.errors import Corruption
from rmqstore.common.files.mapped import fsync_directory

FILE_NAME = "rmqstore-cursor.key"
MAGIC = "rmqstore-cursor-key v1"
KEY_BYTES = 32


def key_path(config_dir: str) -> str:
    return os.path.join(config_dir, FILE_NAME)


def read_cursor_key(config_dir: str) -> bytes | None:
    """The store's key, or None when the store has none yet (no writer of ours has
    opened it: a store Apache's broker wrote). A file that is there but not a key is
    Corruption, never silently replaced: that would void every cursor in flight."""
    return read_key_file(key_path(config_dir))


def read_key_file(path: str) -> bytes | None:
    """The key a key file holds (a store's, or a proxy's ``--cursor-key``), or None when
    there is no file."""
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read(4096)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise Corruption(f"{path}: cannot read the cursor key: {error}", path=path) from None
    lines = text.split("\n")
    if len(lines) < 2 or lines[0] != MAGIC or len(lines[1]) != 2 * KEY_BYTES or any(lines[2:]):
        raise Corruption(f"{path} is not an rmqstore cursor key", path=path)
    try:
        return bytes.fromhex(lines[1])
    except ValueError:
        raise Corruption(f"{path} is not an rmqstore cursor key", path=path) from None


def ensure_cursor_key(config_dir: str) -> bytes:
    """The store's key, created if the store has none (the writer's part)."""
    os.makedirs(config_dir, exist_ok=True)
    return ensure_key_file(key_path(config_dir))


def ensure_key_file(path: str) -> bytes:
    """The key a key file holds, the file made (durably, owner-only) if there is none."""
    existing = read_key_file(path)
    if existing is not None:
        return existing
    key = secrets.token_bytes(KEY_BYTES)
    temp = path + ".tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(f"{MAGIC}\n{key.hex()}\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    fsync_directory(os.path.dirname(os.path.abspath(path)))
    return key
