"""A tmpfs mounted for a test: a disk of a set size that fills up, or a directory whose
fsyncs cost nothing. Mounting needs root, which CI has."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def can_mount() -> bool:
    return os.geteuid() == 0


@contextmanager
def tmpfs(mount: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` at ``mount`` (made here), lazily unmounted on the way out."""
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
