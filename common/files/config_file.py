"""Apache's ConfigManager layout for a store's config files (``config/*.json``): a file is
replaced atomically with the previous one kept as ``.bak``, and read back from the ``.bak``
when the main file is missing or does not decode."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

from rmqstore.common.errors import Corruption
from rmqstore.common.files.mapped import fsync_directory, makedirs_durable

T = TypeVar("T")

log = logging.getLogger(__name__)


def replace_durably(config_dir: str, path: str, text: str) -> None:
    """Replace ``path`` (in ``config_dir``) by ``text`` atomically (temporary file, fsync,
    rename, fsync of the directory), keeping no ``.bak``."""
    temp = path + ".tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    fsync_directory(config_dir)


def read_or_set_aside(path: str, parse: Callable[[str, str], T], missing: T, consequence: str) -> T:
    """``parse(text, path)`` of the file at ``path``; ``missing`` when there is none. A file
    that cannot be read or that ``parse`` refuses (a Corruption) is renamed
    ``<path>.corrupt-<ms>`` and logged with ``consequence`` (what taking it as missing
    means), and ``missing`` is returned."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse(handle.read(), path)
    except FileNotFoundError:
        return missing
    except (OSError, UnicodeDecodeError, Corruption) as error:
        aside = f"{path}.corrupt-{int(time.time() * 1000)}"
        log.error("%s; set aside as %s, %s", error, aside, consequence)
        os.replace(path, aside)
        return missing


def replace_keeping_backup(config_dir: str, path: str, text: str) -> None:
    """Replace ``path`` (in ``config_dir``) by ``text`` atomically (temporary file, fsync,
    rename, fsync of the directory), the previous file kept as ``.bak``."""
    makedirs_durable(config_dir)
    temp = path + ".tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    if os.path.exists(path):
        # A hard link keeps `path` in place until the rename, so a crash never leaves the
        # directory without the main file.
        backup = path + ".bak"
        backup_temp = backup + ".tmp"
        if os.path.exists(backup_temp):
            os.unlink(backup_temp)
        os.link(path, backup_temp)
        os.replace(backup_temp, backup)
    os.replace(temp, path)
    fsync_directory(config_dir)


def read_keeping_backup(path: str, parse: Callable[[str, str], T]) -> T | None:
    """``parse(text, candidate)`` of the file at ``path``, or of its ``.bak`` when the main
    file is missing, unreadable or refused by ``parse`` (a Corruption); None when neither
    exists; the first Corruption when neither decodes."""
    failures: list[Corruption] = []
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, encoding="utf-8") as handle:
                text = handle.read()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except (OSError, UnicodeDecodeError) as error:
            failures.append(Corruption(f"{candidate} is not readable: {error}", path=candidate))
            continue
        try:
            return parse(text, candidate)
        except Corruption as error:
            failures.append(error)
    if failures:
        raise failures[0]
    return None
