"""A commit log scan that yields records in column batches (``codec.columnar``), with the
recovery contract of ``CommitLog.records``.

Records are walked and decoded in bulk. Where the bulk walk meets something that is not
a record — zeros, a torn or corrupt record, the end of the data — the per-record reader
takes over from that offset: it yields nothing more and says, in its own words, whether
that is the end of the log, a torn tail or corruption. A BLANK moves to the next file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from rmqstore.common.codec import columnar
from rmqstore.common.codec.columnar import WalkEnd
from rmqstore.common.errors import invariant
from rmqstore.common.files.commitlog import CommitLog, ScanStop

# Batches of 8,192 records (about 3.5 MB at 256-byte bodies) stay in the CPU's caches
# from the copy out of the log through the passes over them (benchmarks/FILES.md).
BATCH_ROWS_DEFAULT = 8192
BATCH_BYTES_MAX = 32 * 1024 * 1024

# A decoder takes columnar.decode's arguments (buffer, record starts, base_offset=,
# check_crc=) and returns a batch with its ``rows`` and ``bad`` (``RecordColumns``').
Decoder = Callable[..., Any]


class ColumnScan:
    """Batches of the valid records in ``[start, stop)`` of ``log``; after iteration
    ``stop`` says where and why the scan ended (None when it reached ``stop``), exactly as
    ``CommitLog.records(start, stop=stop)`` would."""

    def __init__(
        self,
        log: CommitLog,
        start: int,
        stop: int,
        *,
        check_crc: bool = True,
        batch_rows: int = BATCH_ROWS_DEFAULT,
        batch_bytes: int = BATCH_BYTES_MAX,
        decode: Decoder = columnar.decode,
    ):
        self.log = log
        self.start = start
        self.end = stop
        self.check_crc = check_crc
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.decode = decode
        self.stop: ScanStop | None = None

    def __iter__(self) -> Iterator[Any]:
        """Batches as ``decode`` gives them: ``RecordColumns`` by default."""
        offset = self.start
        while offset < self.end:
            mapped = self.log.files.find(offset)
            if mapped is None:
                break  # past the last file: the per-record reader says END
            base = mapped.start_offset
            mapped.will_need(offset - base, min(self.end, offset + self.batch_bytes) - base)
            found = columnar.walk(
                mapped.buf,
                offset - base,
                stop=self.end - base,
                rows_max=self.batch_rows,
                bytes_max=self.batch_bytes,
            )
            if len(found.starts):
                decoded = self.decode(mapped.buf, found.starts, base_offset=base, check_crc=self.check_crc)
                if decoded.rows:
                    yield decoded
                if decoded.bad is not None:
                    offset = base + int(found.starts[decoded.bad])
                    break
            offset = base + found.position
            if found.end is WalkEnd.BLANK:
                offset = mapped.end_offset
            elif found.end is WalkEnd.OTHER:
                break
        else:
            return
        self.stop = self._classify(offset)

    def _classify(self, offset: int) -> ScanStop | None:
        """Why no record starts at ``offset``, in the per-record reader's words."""
        records = self.log.records(offset, check_crc=self.check_crc, stop=self.end)
        missed = next(iter(records), None)
        invariant(missed is None, f"the bulk walk stopped at {offset}, where the per-record reader finds a record")
        return records.stop
