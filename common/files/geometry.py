"""The geometry a writer made its store with, in a file of our own.

Apache's files do not say how big they are meant to be: a commit log or consume queue
file's size can be read off the disk, but an index file's size has two unknowns (slots
and entries). The writer therefore records the four numbers in
``config/rmqstore-geometry.json`` (a magic, a version, the numbers and a CRC-32 of their
canonical JSON, replaced atomically like the topic table), and every tool and query node
reads them, so that flags are needed only for stores Apache's broker wrote.

For those, :func:`infer_index_geometry` reads an index file's size at RocketMQ's ratio of
four entries per slot, the only ratio its configuration ships with.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass

from rmqstore.common.codec import index as ix
from rmqstore.common.errors import Corruption, InvalidArgument
from rmqstore.common.files.mapped import fsync_directory

FILE_NAME = "rmqstore-geometry.json"
MAGIC = "rmqstore-geometry"
VERSION = 1
# RocketMQ's MessageStoreConfig: maxIndexNum = 4 * maxHashSlotNum.
ENTRIES_PER_SLOT = 4


@dataclass(frozen=True, slots=True)
class Geometry:
    commitlog_file_size_bytes: int
    cq_file_units: int
    index_slots: int
    index_entries: int

    def fields(self) -> dict[str, int]:
        return {
            "commitLogFileSize": self.commitlog_file_size_bytes,
            "cqFileUnits": self.cq_file_units,
            "indexSlots": self.index_slots,
            "indexEntries": self.index_entries,
        }


def _canonical(fields: dict[str, int]) -> bytes:
    return json.dumps(sorted(fields.items()), separators=(",", ":")).encode()


def path_in(config_dir: str) -> str:
    return os.path.join(config_dir, FILE_NAME)


def read_geometry(config_dir: str) -> Geometry | None:
    """The recorded geometry, None when the store has no record (Apache's, or new)."""
    path = path_in(config_dir)
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except (OSError, ValueError) as error:
        raise Corruption(f"{path} is not readable JSON: {error}", path=path) from None
    if not isinstance(document, dict) or document.get("magic") != MAGIC or document.get("version") != VERSION:
        raise Corruption(f"{path} is not a version-{VERSION} rmqstore geometry file", path=path)
    names = ("commitLogFileSize", "cqFileUnits", "indexSlots", "indexEntries")
    values = [document.get(name) for name in names]
    if not all(isinstance(value, int) and not isinstance(value, bool) and value > 0 for value in values):
        raise Corruption(f"{path} lacks a positive integer for one of {', '.join(names)}", path=path)
    geometry = Geometry(*values)  # type: ignore[arg-type]
    if document.get("crc32") != zlib.crc32(_canonical(geometry.fields())):
        raise Corruption(f"{path} fails its checksum", path=path)
    return geometry


def record_geometry(config_dir: str, geometry: Geometry) -> None:
    """Write the store's geometry if it has no record yet; refuse a different one, which
    would make the files already written unreadable."""
    recorded = read_geometry(config_dir)
    if recorded == geometry:
        return
    if recorded is not None:
        differ = [
            f"{name} {mine} (recorded {theirs})"
            for (name, mine), theirs in zip(geometry.fields().items(), recorded.fields().values())
            if mine != theirs
        ]
        raise InvalidArgument(
            f"the store was made with another geometry ({path_in(config_dir)}): {', '.join(differ)}; "
            "drop the size options or give the recorded ones"
        )
    os.makedirs(config_dir, exist_ok=True)
    fields = geometry.fields()
    document = {"magic": MAGIC, "version": VERSION, **fields, "crc32": zlib.crc32(_canonical(fields))}
    path = path_in(config_dir)
    temp = path + ".tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    fsync_directory(config_dir)


def infer_index_geometry(file_size_bytes: int) -> tuple[int, int] | None:
    """Slots and entries of an index file this size, at four entries per slot; None when
    the size admits no such answer (a store made with another ratio needs its flags)."""
    table_bytes = file_size_bytes - ix.HEADER_SIZE
    per_slot = ix.SLOT_SIZE + ENTRIES_PER_SLOT * ix.ENTRY_SIZE
    if table_bytes <= 0 or table_bytes % per_slot:
        return None
    slots = table_bytes // per_slot
    return slots, slots * ENTRIES_PER_SLOT
