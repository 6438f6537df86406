"""One error module for the whole store.

Operating errors are typed and carry what a caller needs to act on them; the service edge
maps each type to a gRPC code in one table. "Cannot happen" conditions use :func:`invariant`,
which vanishes under ``python -O``.
"""

from __future__ import annotations


def invariant(condition: bool, message: str = "invariant violated") -> None:
    """Crash on a broken internal invariant (a bug, never bad input)."""
    assert condition, message


class StoreError(Exception):
    """Base of every error the store raises on purpose."""

    retriable = False


class InvalidArgument(StoreError):
    """The caller's input breaks a rule (topic, size, range, format)."""


class NotFound(StoreError):
    """The thing asked for does not exist (yet, or any more)."""


class OutOfRange(StoreError):
    """An offset or position outside what the store holds (below its min, at or past its max)."""


class Corruption(StoreError):
    """Bytes on disk do not decode: bad magic, size, CRC or layout.

    ``offset`` is the absolute position of the bad bytes (commit log offset, queue byte
    offset or file position, as the message says), ``path`` the file when known.
    """

    def __init__(self, message: str, *, offset: int | None = None, path: str | None = None):
        super().__init__(message)
        self.offset = offset
        self.path = path


class CrcMismatch(Corruption):
    """A record's stored body CRC differs from the CRC of its body."""

    def __init__(self, *, offset: int, stored: int, computed: int, path: str | None = None):
        super().__init__(
            f"body CRC mismatch at commit log offset {offset}: "
            f"stored {stored:08X}, computed {computed:08X}",
            offset=offset,
            path=path,
        )
        self.stored = stored
        self.computed = computed


class StoreFull(StoreError):
    """The disk is above the configured full ratio, or a file cannot grow."""


class LimitReached(StoreFull):
    """A configured cap on what the store holds (topics, queues, consumer groups) is
    reached: nothing more of that kind is made until an operator raises it."""


class OutOfResources(StoreError):
    """The process ran out of something the operating system grants (file descriptors,
    memory): retry once it returns."""

    retriable = True


class Unavailable(StoreError):
    """The store cannot take this request now, for the reason given (a dispatch waiting
    for a resource to return); nothing is wrong with the request."""

    retriable = True


class NotPrimary(Unavailable):
    """This replica of a writer group is not its primary: writes go to the one named
    (``primary``, HOST:PORT, None while none is known)."""

    def __init__(self, message: str, *, primary: str | None = None):
        super().__init__(message)
        self.primary = primary


class NotInSync(Unavailable):
    """Fewer replicas of a writer group than its --min-insync are in sync: a send is
    refused (or, if already appended, not acknowledged) rather than acknowledged unsafely."""


class StoreLocked(StoreError):
    """Another writer holds the store directory's lock."""


class ReadOnly(StoreError):
    """A write was attempted through a read-only view."""
