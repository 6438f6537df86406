"""A store directory named by a caller (``option``: how the caller named it, e.g.
``--store``), checked before anything opens it: the one check of what a store directory is,
shared by every command, node and job. Kept apart from the file layers so that a command
line can check a path without loading them."""

from __future__ import annotations

import os

from rmqstore.common.errors import InvalidArgument

# What a store holds from the first time a writer opened it: the abort file (from its
# opening until a clean close, RocketMQ's broker's and our writer's alike), the checkpoint
# (written by that close) or the commit log's directory (all a store copied for its data
# may keep). A writer that has stored nothing yet has made the abort file only.
STORE_ENTRIES = ("commitlog", "checkpoint", "abort")


def is_store(path: str) -> bool:
    """Whether the directory ``path`` holds a store (STORE_ENTRIES)."""
    return any(os.path.lexists(os.path.join(path, entry)) for entry in STORE_ENTRIES)


def _directory(path: str, option: str) -> None:
    if not os.path.exists(path):
        raise InvalidArgument(f"{option} {path}: no such directory")
    if not os.path.isdir(path):
        raise InvalidArgument(f"{option} {path}: not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise InvalidArgument(f"{option} {path}: cannot read the directory")


def existing_store(path: str, option: str, *, empty_ok: bool = False) -> str:
    """A store directory a reader opens: it must exist and hold a store, so that a mistyped
    path is an error rather than an empty answer. ``empty_ok``: an empty directory too (a
    query node started before the writer that will make the store there)."""
    _directory(path, option)
    if not is_store(path) and not (empty_ok and not os.listdir(path)):
        raise InvalidArgument(f"{option} {path}: not a store directory (it has neither commitlog/ nor checkpoint)")
    return path


def writer_store(path: str, option: str, *, init: bool = False) -> str:
    """A directory a writer may own: missing (it is created), empty, or a store; another
    directory only when told to make a store beside what it holds (``init``)."""
    if not os.path.lexists(path):
        return path
    _directory(path, option)
    if not init and not is_store(path) and os.listdir(path):
        raise InvalidArgument(
            f"{option} {path}: not a store directory (it has neither commitlog/ nor checkpoint) and not empty; "
            "give a new or empty directory, or --init to make a store in it beside what it holds"
        )
    return path


def creatable_dir(path: str, option: str) -> str:
    """A directory a command may create or write into: missing, or an existing directory."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise InvalidArgument(f"{option} {path}: not a directory")
    return path
