"""A store directory named by a caller (``option``: how the caller named it, e.g.
``--store``), checked before anything opens it. Kept apart from the file layers so that a
command line can check a path without loading them."""

from __future__ import annotations

import os

from rmqstore.common.errors import InvalidArgument


def existing_store(path: str, option: str) -> str:
    """A store directory a read-only reader opens: it must exist and be a directory (an
    empty or missing directory would otherwise read as an empty store)."""
    if not os.path.exists(path):
        raise InvalidArgument(f"{option} {path}: no such directory")
    if not os.path.isdir(path):
        raise InvalidArgument(f"{option} {path}: not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise InvalidArgument(f"{option} {path}: cannot read the directory")
    return path


def creatable_dir(path: str, option: str) -> str:
    """A directory a writer may create: missing, or an existing directory."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise InvalidArgument(f"{option} {path}: not a directory")
    return path
