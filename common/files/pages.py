"""File mappings that hold no file descriptor, and allocation of a file's blocks.

Python 3.11's ``mmap.mmap`` keeps a duplicate of the descriptor it maps for as long as the
mapping lives, so a store with one mapped file per consume queue needs one descriptor per
queue: a few thousand queues exhaust a process's descriptor limit (1,024 by default), and
from then on no file, socket or connection can be opened. The mapping itself needs no
descriptor once made (the kernel keeps the file referenced through the mapping), so the
files here are mapped with the C library's ``mmap`` and the descriptor is closed at once:
open descriptors no longer grow with the number of queues.

A mapping is unmapped only when nothing refers to its pages any more (no memoryview, no
numpy array over it): a view that outlives :meth:`Pages.close` stays readable, never
dangling, and the pages go when the last view does.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import weakref

# The process's own symbols, the C library's among them (no ldconfig lookup at import).
_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_madvise = _libc.madvise
_madvise.restype = ctypes.c_int
_madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_MAP_FAILED = ctypes.c_void_p(-1).value

# Each size gets its own array class (ctypes arrays have a fixed length); subclassing it
# gives the instances weak references, which the unmapping hangs on.
_array_types: dict[int, type[ctypes.Array[ctypes.c_ubyte]]] = {}


def _array_type(size: int) -> type[ctypes.Array[ctypes.c_ubyte]]:
    found = _array_types.get(size)
    if found is None:
        found = type(f"Pages{size}", (ctypes.c_ubyte * size,), {})
        _array_types[size] = found
    return found


class Pages:
    """``size`` bytes of a file, mapped shared, read-only or writable; no descriptor held."""

    def __init__(self, fd: int, size: int, *, writable: bool):
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        address = _mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            code = ctypes.get_errno()
            raise OSError(code, f"mmap of {size} bytes failed: {os.strerror(code)}")
        self.address: int = address
        self.size = size
        pages = _array_type(size).from_address(address)
        # Not at interpreter exit: a daemon thread may still be reading the pages then.
        finalizer = weakref.finalize(pages, _munmap, address, size)
        finalizer.atexit = False  # type: ignore[misc]  # documented attribute, missing from the stubs' slots
        view = memoryview(pages).cast("B")
        self.view: memoryview = view if writable else view.toreadonly()
        self.closed = False

    def madvise(self, advice: int, start: int = 0, length: int | None = None) -> None:
        """Advise the kernel on ``[start, start + length)``; ``start`` page-aligned."""
        if self.closed:
            # The pages may be unmapped and the addresses reused by other memory, which
            # an advice such as DONTNEED would wipe.
            raise ValueError("madvise on closed pages")
        length = self.size - start if length is None else length
        if length > 0 and _madvise(self.address + start, length, advice) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"madvise failed: {os.strerror(code)}")

    def close(self) -> None:
        """Give up this object's view; the pages are unmapped once no other view of them
        is left (see the module's docstring)."""
        self.closed = True
        self.view.release()


def allocate(fd: int, size: int, offset: int = 0) -> None:
    """Give the file's bytes ``offset`` to ``offset + size`` their disk blocks now, so that
    a write through a mapping can never find the file system full: that write would get
    SIGBUS, and kill the process, where a full disk here is an ``ENOSPC`` the caller
    refuses cleanly. File systems without ``fallocate`` get zeros written instead (the
    caller names only bytes that hold nothing yet)."""
    try:
        os.posix_fallocate(fd, offset, size)
        return
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    chunk = bytes(1 << 20)
    position = offset
    while position < offset + size:
        written = os.pwrite(fd, memoryview(chunk)[: min(len(chunk), offset + size - position)], position)
        if written <= 0:  # a regular file takes at least a byte or raises; never spin
            raise OSError(errno.EIO, f"a write at {position} stored nothing")
        position += written
