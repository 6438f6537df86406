"""Fixed-size memory-mapped files named by their start offset (docs/format.md §4).

A :class:`MappedFile` is one file of exactly ``file_size_bytes``; a
:class:`MappedFileQueue` is a directory of them named by 20-digit start offsets, each
``file_size_bytes`` after the previous one. Read-only views map with ``ACCESS_READ`` and
open the file ``O_RDONLY``: they never write and work on directories they cannot write to.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Iterator

from rmqstore.common.errors import Corruption, InvalidArgument, ReadOnly, invariant
from rmqstore.common.files.pages import Pages, allocate

NAME_DIGITS = 20
_ZERO_CHUNK_BYTES = 1 << 20
_ZEROS = memoryview(bytes(_ZERO_CHUNK_BYTES))


def offset_name(offset: int) -> str:
    """A commit log / consume queue file name: the start offset, 20 digits."""
    invariant(offset >= 0, "file offsets are never negative")
    return f"{offset:0{NAME_DIGITS}d}"


def fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(directory: str, name: str, content: bytes) -> None:
    """Replace ``directory/name`` with ``content`` atomically and durably: a temp file,
    fsync, rename, fsync of the directory."""
    path = os.path.join(directory, name)
    temp = path + ".tmp"
    with open(temp, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    fsync_directory(directory)


def makedirs_durable(path: str) -> None:
    """``os.makedirs``, then fsync the parent of each directory it made: a directory's
    entry lives in its parent and survives a power cut only once the parent is synced
    (a consume queue directory made for a new topic otherwise vanished with its units,
    while the published durable offset said they were on disk)."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    if not missing:
        return
    os.makedirs(path, exist_ok=True)
    for made in reversed(missing):
        fsync_directory(os.path.dirname(made))


def _size_or_zero(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


_datasync = getattr(os, "fdatasync", os.fsync)


# Writes of at least this many bytes go through pwrite rather than the mapping.
WRITE_THROUGH_FILE_BYTES = 64 * 1024
# A sparse file's first blocks: a page. Each later reservation at least doubles what the
# file holds, so a file of N bytes of data takes at most 2N of disk, in log(N) steps.
SPARSE_RESERVE_MIN_BYTES = 4096


class MappedFile:
    """One fixed-size file, memory-mapped for reading or for reading and writing."""

    def __init__(
        self, path: str, file_size_bytes: int, start_offset: int, *, writable: bool, read_ahead: bool = True, sparse: bool = False
    ):
        """``read_ahead=False`` (madvise RANDOM) for a file written page by page in
        order: a write fault on a page the file has not stored yet otherwise starts the
        kernel's read-ahead over the hole around it, which allocates and zeroes that
        whole window at once (what that costs: benchmarks/FILES.md).

        ``sparse``: the file was created with its size but not its blocks (a consume
        queue's: its disk use follows its data); every write first gives the bytes it
        writes their blocks (:meth:`reserve`), so that no write through the mapping can
        meet a full disk."""
        self.path = path
        self.sparse = sparse
        # Below this position every byte has its blocks (None: not looked up yet).
        self._reserved_end: int | None = None if sparse else file_size_bytes
        self.file_size_bytes = file_size_bytes
        self.start_offset = start_offset
        self.writable = writable
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            actual = os.fstat(fd).st_size
            if actual != file_size_bytes:
                raise Corruption(
                    f"{path} is {actual} bytes; files here must be exactly {file_size_bytes}",
                    path=path,
                )
            # The mapping holds no descriptor (pages.py): the store's open descriptors do
            # not grow with its number of files.
            self._pages = Pages(fd, file_size_bytes, writable=writable)
        finally:
            os.close(fd)
        if not read_ahead and hasattr(mmap, "MADV_RANDOM"):
            self._pages.madvise(mmap.MADV_RANDOM)
        self.buf = self._pages.view
        self._write_fd: int | None = None  # see hold_descriptor
        # Users of the held descriptor: a flush on the flusher thread may still be syncing
        # through it when the appender drops it; the last user closes a dropped one.
        self._write_lock = threading.Lock()
        self._write_users = 0
        self._write_dropped: int | None = None
        # Written through since the last flush: the periodic flush syncs only such files.
        self.dirty = False

    @classmethod
    def create(
        cls,
        path: str,
        file_size_bytes: int,
        start_offset: int,
        initial: tuple[tuple[int, bytes], ...] = (),
        *,
        read_ahead: bool = True,
        spare: str | None = None,
        sparse: bool = False,
    ) -> MappedFile:
        """Create a new zero-filled file of the full size, its blocks allocated (with
        ``sparse``, none but those of its ``initial`` bytes: :meth:`reserve` gives the
        rest theirs as they are written), and map it writable.

        The file is sized and allocated, and its ``initial`` bytes (position, data)
        written, under a hidden temporary name, then renamed into place: neither a reader
        following the directory nor a restart after a kill ever sees it half made. A full
        disk fails here, with ``ENOSPC``, and leaves nothing behind; writes into the
        file's mapping later can then never meet a full disk (which is SIGBUS).

        ``spare`` names a file :func:`allocate_spare` made ahead, in the same directory:
        it becomes this file, so the creation needs no new blocks."""
        directory = os.path.dirname(path) or "."
        if os.path.exists(path):
            raise FileExistsError(path)
        temp = spare or os.path.join(directory, f".{os.path.basename(path)}.creating")
        fd = os.open(temp, os.O_RDWR) if spare else os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if not spare:
                os.ftruncate(fd, file_size_bytes)
                if not sparse:
                    allocate(fd, file_size_bytes)
            for position, data in initial:
                os.pwrite(fd, data, position)
            os.fsync(fd)  # the size is metadata: a data-only sync would not persist it
        except BaseException:
            os.close(fd)
            if not spare:
                os.unlink(temp)
            raise
        os.close(fd)
        os.rename(temp, path)
        fsync_directory(directory)
        mapped = cls(path, file_size_bytes, start_offset, writable=True, read_ahead=read_ahead, sparse=sparse)
        if sparse and not spare:
            mapped._reserved_end = 0  # made here without blocks: no need to look for them
        return mapped

    @staticmethod
    def allocate_spare(path: str, file_size_bytes: int) -> None:
        """A zero-filled file of ``file_size_bytes`` with its blocks allocated, for a later
        :meth:`create` to take (``spare``); an existing one of that size is kept."""
        if _size_or_zero(path) == file_size_bytes:
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, file_size_bytes)
            allocate(fd, file_size_bytes)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.file_size_bytes

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def reserve(self, end: int) -> None:
        """Give the file's bytes up to ``end`` their disk blocks (a sparse file's; a full
        file has all of its own): ``ENOSPC`` here, where a write through the mapping
        would get SIGBUS. Grows by at least what the file holds, a page at the least."""
        reserved = self._reserved_end
        if reserved is None:
            # Blocks already given: up to the file's trailing hole (after a restart).
            reserved = self._reserved_end = self._allocated_end()
        if end <= reserved:
            return
        target = min(self.file_size_bytes, max(end + -end % mmap.PAGESIZE, 2 * reserved, SPARSE_RESERVE_MIN_BYTES))
        fd, owned = self._take_descriptor()
        try:
            allocate(fd, target - reserved, reserved)
        finally:
            self._give_descriptor(fd, owned)
        self._reserved_end = target

    def write(self, position: int, data: bytes | bytearray | memoryview) -> None:
        if not self.writable:
            raise ReadOnly(f"{self.path} is mapped read-only")
        invariant(position >= 0 and position + len(data) <= self.file_size_bytes, "write past file end")
        if self.sparse:
            self.reserve(position + len(data))
        self.dirty = True
        if len(data) < WRITE_THROUGH_FILE_BYTES:
            self.buf[position : position + len(data)] = data
            return
        # A large write goes through the file: the kernel fills the page cache pages in
        # the write itself, where a write through the mapping takes a page fault for each
        # new page. The mapping shares those pages, so it reads what was written. The
        # descriptor lives for this write only (a reindex writes large blocks to
        # thousands of queue files; holding one each would run out of descriptors).
        fd, owned = self._take_descriptor()
        try:
            written = os.pwrite(fd, data, position)
            while written < len(data):
                more = os.pwrite(fd, memoryview(data)[written:], position + written)
                if more <= 0:  # a regular file takes at least a byte or raises; never spin
                    raise OSError(errno.EIO, f"{self.path}: a write at {position + written} stored nothing")
                written += more
        finally:
            self._give_descriptor(fd, owned)

    def zero(self, position: int, end: int | None = None) -> None:
        """Zero ``[position, end)`` (default: to the end of the file)."""
        end = self.file_size_bytes if end is None else end
        for start in range(position, end, _ZERO_CHUNK_BYTES):
            stop = min(start + _ZERO_CHUNK_BYTES, end)
            self.write(start, bytes(stop - start))

    def clear(self, position: int, end: int) -> None:
        """Zero what a failed write left in [position, end), through the file, a page at
        a time, where it can: on a full disk a page that was never written stays a hole
        (zero already) and its write fails, which is ignored."""
        fd, owned = self._take_descriptor()
        try:
            for start in range(position - position % mmap.PAGESIZE, end, mmap.PAGESIZE):
                low, high = max(start, position), min(start + mmap.PAGESIZE, end)
                try:
                    os.pwrite(fd, bytes(high - low), low)
                except OSError:
                    pass
            self.dirty = True
        finally:
            self._give_descriptor(fd, owned)

    def _allocated_end(self) -> int:
        """Where the file's trailing hole starts (SEEK_DATA/SEEK_HOLE; pages written
        through a mapping but not yet on disk count as data), or its size where the file
        system cannot tell: no byte past it can be non-zero, and reading the hole would
        fault in every page of it (benchmarks/FILES.md)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return self.file_size_bytes
        try:
            end = position = 0
            while position < self.file_size_bytes:
                try:
                    data = os.lseek(fd, position, os.SEEK_DATA)
                except OSError as error:
                    if error.errno == errno.ENXIO:  # no data at or after position
                        return end
                    return self.file_size_bytes
                position = end = os.lseek(fd, data, os.SEEK_HOLE)
            return min(end, self.file_size_bytes)
        except OSError:
            return self.file_size_bytes
        finally:
            os.close(fd)

    def last_nonzero_position(self, start: int = 0) -> int:
        """One past the last non-zero byte at or after ``start``; ``start`` if there is none."""
        end = max(min(self._allocated_end(), self.file_size_bytes), start)
        while end > start:
            chunk_start = max(start, end - _ZERO_CHUNK_BYTES)
            if self.buf[chunk_start:end] == _ZEROS[: end - chunk_start]:
                end = chunk_start  # a zero chunk compares in C; rstrip walks it byte by byte
                continue
            stripped = bytes(self.buf[chunk_start:end]).rstrip(b"\x00")
            if stripped:
                return chunk_start + len(stripped)
            end = chunk_start
        return start

    def release(self, start: int = 0, end: int | None = None) -> None:
        """Drop the pages of [start, end) from this process's resident set (madvise
        DONTNEED). The file's data is untouched: a shared mapping's pages stay in the page
        cache, written or not, and fault back in when read. A pass over a whole file (a
        header walk, finding a queue's end) then leaves no trace in the RSS."""
        end = self.file_size_bytes if end is None else end
        low = start - start % mmap.PAGESIZE
        if end > low and hasattr(mmap, "MADV_DONTNEED"):
            self._pages.madvise(mmap.MADV_DONTNEED, low, min(end, self.file_size_bytes) - low)

    def will_need(self, start: int, end: int) -> None:
        """Say that [start, end) is about to be read (madvise WILLNEED): the kernel reads
        it ahead and maps what it holds, so the reads take fewer page faults."""
        low = start - start % mmap.PAGESIZE
        end = min(end, self.file_size_bytes)
        if end > low and hasattr(mmap, "MADV_WILLNEED"):
            self._pages.madvise(mmap.MADV_WILLNEED, low, end - low)

    def flush(self, start: int = 0, end: int | None = None) -> None:
        """Make the bytes written through the mapping durable. ``start``/``end`` name the
        range the caller needs; the whole file is synced (see below)."""
        if not self.writable:
            return
        # Cleared before the sync: a write that lands during it marks the file again.
        self.dirty = False
        # fdatasync writes back the file's dirty pages, those dirtied through the shared
        # mapping included, and releases the GIL while the disk works; mmap.flush (msync)
        # holds it, stalling every other thread — the appends a group commit is waiting
        # to cover. The whole file is synced: only its dirty pages cost anything. The
        # descriptor is opened per flush so that a store of many files holds none.
        try:
            fd, owned = self._take_descriptor()
        except FileNotFoundError:
            return  # deleted by retention meanwhile: nothing left to make durable
        try:
            _datasync(fd)
        except BaseException:
            self.dirty = True
            raise
        finally:
            self._give_descriptor(fd, owned)

    def _take_descriptor(self) -> tuple[int, bool]:
        """The held descriptor (counted as in use), or a new one the caller owns."""
        with self._write_lock:
            if self._write_fd is not None:
                self._write_users += 1
                return self._write_fd, False
        return os.open(self.path, os.O_RDWR), True

    def _give_descriptor(self, fd: int, owned: bool) -> None:
        if owned:
            os.close(fd)
            return
        with self._write_lock:
            self._write_users -= 1
            if self._write_users == 0 and self._write_dropped is not None:
                os.close(self._write_dropped)
                self._write_dropped = None

    def hold_descriptor(self) -> None:
        """Keep a read-write descriptor open for flushes and large writes, until
        :meth:`drop_descriptor` or :meth:`close`. For the few files being written (the
        commit log's newest): appending to them and acknowledging a SYNC write then need
        no new descriptor, which a process that has run out of them cannot get."""
        with self._write_lock:
            if self._write_fd is None and self._write_dropped is None and self.writable:
                self._write_fd = os.open(self.path, os.O_RDWR)

    def drop_descriptor(self) -> None:
        """Close the held descriptor, or have its last user close it."""
        with self._write_lock:
            fd, self._write_fd = self._write_fd, None
            if fd is None:
                return
            if self._write_users:
                self._write_dropped = fd
            else:
                os.close(fd)

    def flush_if_dirty(self) -> bool:
        """:meth:`flush` if anything was written since the last flush; whether it was.
        For one flusher at a time (the periodic flush of queues and index): a second
        caller could return while the first one's sync is still under way."""
        if not self.dirty:
            return False
        self.flush()
        return True

    def pread(self, position: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``position`` (fewer at the end of the file), read
        through the file rather than the mapping: no page is mapped into the process, so
        the read costs no page fault and adds nothing to the resident set. The descriptor
        stays open for the next read (within the process's budget: READ_DESCRIPTORS)."""
        with self.reading() as fd:
            return os.pread(fd, max(0, min(length, self.file_size_bytes - position)), position)

    def reading(self) -> contextlib.AbstractContextManager[int]:
        """A read-only descriptor of the file for the block's reads (through the file
        rather than the mapping); kept open afterwards for the next reads, up to the
        process's budget of such descriptors."""
        return READ_DESCRIPTORS.using(self)

    def close(self) -> None:
        READ_DESCRIPTORS.discard(self)
        self.drop_descriptor()
        self.buf.release()
        self._pages.close()

    def __repr__(self) -> str:
        mode = "rw" if self.writable else "ro"
        return f"MappedFile({self.path!r}, {mode})"


class ReadDescriptors:
    """The read-only descriptors files keep open for reads through the file, at most
    ``budget`` of them: opening one more closes the least recently used that no read is
    using (a read under way keeps its own, so the budget is exceeded only while more
    reads than that run at once). Without it a query node held one per commit log file
    it had ever read."""

    def __init__(self, budget: int):
        self.budget = budget
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[MappedFile, list[int]] = collections.OrderedDict()  # [fd, users]

    @contextlib.contextmanager
    def using(self, mapped: MappedFile) -> Iterator[int]:
        with self._lock:
            entry = self._open.get(mapped)
            if entry is None:
                entry = [os.open(mapped.path, os.O_RDONLY), 0]
                self._open[mapped] = entry
            else:
                self._open.move_to_end(mapped)
            entry[1] += 1
            self._evict()
        try:
            yield entry[0]
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0 and self._open.get(mapped) is not entry:
                    os.close(entry[0])  # evicted or discarded while in use: the last user closes it
                self._evict()

    def _evict(self) -> None:
        while len(self._open) > self.budget:
            idle = next((victim for victim, entry in self._open.items() if entry[1] == 0), None)
            if idle is None:
                return
            os.close(self._open.pop(idle)[0])

    def discard(self, mapped: MappedFile) -> None:
        """Close the file's descriptor (its file is closed or deleted)."""
        with self._lock:
            entry = self._open.pop(mapped, None)
            if entry is not None and entry[1] == 0:
                os.close(entry[0])

    def __len__(self) -> int:
        return len(self._open)


READ_DESCRIPTORS_MAX = 256
READ_DESCRIPTORS = ReadDescriptors(READ_DESCRIPTORS_MAX)


class MappedFileQueue:
    """A directory of fixed-size files named by their 20-digit start offset."""

    def __init__(self, directory: str, file_size_bytes: int, *, writable: bool, read_ahead: bool = True, sparse: bool = False):
        """``sparse``: the files are made without their blocks, which each write gives
        the bytes it writes (see MappedFile)."""
        if file_size_bytes <= 0:
            raise InvalidArgument(f"file size must be positive, got {file_size_bytes}")
        self.directory = directory
        self.sparse = sparse
        self.file_size_bytes = file_size_bytes
        self.writable = writable
        self.read_ahead = read_ahead  # see MappedFile
        self.files: list[MappedFile] = []
        self.refresh()

    def _names_on_disk(self) -> list[tuple[int, str]]:
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        named: list[tuple[int, str]] = []
        for name in entries:
            if name.startswith("."):
                continue
            if len(name) != NAME_DIGITS or not name.isdigit() or not name.isascii():
                raise Corruption(
                    f"unexpected file {name!r} in {self.directory}: names must be 20-digit offsets",
                    path=os.path.join(self.directory, name),
                )
            named.append((int(name), name))
        named.sort()
        return named

    def refresh(self) -> bool:
        """Map files that appeared since the last look (a read-only view following a
        writer). Returns True if the set of files changed."""
        known = {f.start_offset for f in self.files}
        on_disk = self._names_on_disk()
        added = False
        if on_disk and on_disk[-1][0] not in known:
            # Apache's broker creates its next file empty, then sizes it: a follower acts
            # as if an empty newest file were not there yet, and the writer removes one a
            # kill left behind (it holds nothing). Any other size is corruption.
            newest = os.path.join(self.directory, on_disk[-1][1])
            if _size_or_zero(newest) == 0:
                on_disk = on_disk[:-1]
                if self.writable and os.path.exists(newest):
                    os.unlink(newest)
                    fsync_directory(self.directory)
        for start, name in on_disk:
            if start in known:
                continue
            if start % self.file_size_bytes:
                raise Corruption(
                    f"{name} in {self.directory} is not a multiple of the file size "
                    f"{self.file_size_bytes}",
                    path=os.path.join(self.directory, name),
                )
            self.files.append(
                MappedFile(
                    os.path.join(self.directory, name),
                    self.file_size_bytes,
                    start,
                    writable=self.writable,
                    read_ahead=self.read_ahead,
                    sparse=self.sparse and self.writable,
                )
            )
            added = True
        present = {start for start, _ in on_disk}
        removed = [f for f in self.files if f.start_offset not in present]
        for f in removed:
            f.close()
        self.files = sorted((f for f in self.files if f.start_offset in present), key=lambda f: f.start_offset)
        for before, after in zip(self.files, self.files[1:]):
            if after.start_offset != before.end_offset:
                raise Corruption(
                    f"gap in {self.directory}: {before.name} is followed by {after.name}",
                    path=after.path,
                )
        return added or bool(removed)

    def __iter__(self) -> Iterator[MappedFile]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    @property
    def first(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    @property
    def min_offset(self) -> int:
        return self.files[0].start_offset if self.files else 0

    def find(self, offset: int) -> MappedFile | None:
        """The file holding ``offset``, or None if no file does."""
        if not self.files or offset < self.files[0].start_offset:
            return None
        index = (offset - self.files[0].start_offset) // self.file_size_bytes
        if index >= len(self.files):
            return None
        found = self.files[index]
        invariant(found.start_offset <= offset < found.end_offset, "files are contiguous")
        return found

    def index_of(self, mapped: MappedFile) -> int:
        return (mapped.start_offset - self.files[0].start_offset) // self.file_size_bytes

    def create(self, start_offset: int) -> MappedFile:
        """Create the file that starts at ``start_offset`` (right after the last one)."""
        if not self.writable:
            raise ReadOnly(f"{self.directory} is open read-only")
        invariant(start_offset % self.file_size_bytes == 0, "file starts are aligned")
        invariant(not self.files or start_offset == self.files[-1].end_offset, "files stay contiguous")
        makedirs_durable(self.directory)
        mapped = MappedFile.create(
            os.path.join(self.directory, offset_name(start_offset)),
            self.file_size_bytes,
            start_offset,
            read_ahead=self.read_ahead,
            sparse=self.sparse,
        )
        self.files.append(mapped)
        return mapped

    def delete_after(self, offset: int) -> list[str]:
        """Delete every file that starts after ``offset`` (truncation keeps the file that
        holds it, and a file starting exactly at it)."""
        if not self.writable:
            raise ReadOnly(f"{self.directory} is open read-only")
        return self._delete([f for f in self.files if f.start_offset > offset])

    def delete_first(self, count: int) -> list[str]:
        """Delete the ``count`` oldest files (retention)."""
        if not self.writable:
            raise ReadOnly(f"{self.directory} is open read-only")
        return self._delete(self.files[:count])

    def _delete(self, doomed: list[MappedFile]) -> list[str]:
        paths = []
        for mapped in doomed:
            mapped.close()
            os.unlink(mapped.path)
            paths.append(mapped.path)
        if doomed:
            self.files = [f for f in self.files if f not in doomed]
            fsync_directory(self.directory)
        return paths

    def flush(self) -> int:
        """Sync the files written since the last flush; returns how many were synced."""
        return sum(mapped.flush_if_dirty() for mapped in self.files)

    def close(self) -> None:
        for mapped in self.files:
            mapped.close()
        self.files = []
