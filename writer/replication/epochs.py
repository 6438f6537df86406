"""A replica's epoch history: each primary term of its group, with the commit log offset
it began at (RocketMQ 5's epoch checkpoint), in ``rmqstore-epochs`` at the store's root.

The file holds a magic, a version, the epochs and a CRC-32 of their canonical JSON; it is
replaced atomically (temp file, fsync, rename, fsync directory). Comparing two histories
gives the offset up to which two replicas' commit logs agree (:func:`consistent_end`).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass

from rmqstore.common.errors import Corruption, invariant
from rmqstore.common.files.mapped import fsync_directory

FILE_NAME = "rmqstore-epochs"
MAGIC = "rmqstore-epochs"
VERSION = 1


@dataclass(frozen=True, slots=True)
class Epoch:
    epoch: int  # from etcd's revision (or a manual promotion's count): grows with each term
    start_offset: int  # the commit log offset the term's first record was written at
    primary_id: int  # the replica that was primary


def _canonical(epochs: list[Epoch]) -> bytes:
    return json.dumps([[e.epoch, e.start_offset, e.primary_id] for e in epochs], separators=(",", ":")).encode()


def consistent_end(mine: list[Epoch], primary: list[Epoch], my_end: int, primary_end: int) -> int:
    """How far a replica whose log ends at ``my_end`` with history ``mine`` agrees with a
    primary's log (``primary``, ``primary_end``): to the end of the newest epoch both
    histories hold with the same start, or 0 when they share none."""
    theirs = {e.epoch: e for e in primary}
    for position in range(len(mine) - 1, -1, -1):
        shared = mine[position]
        if theirs.get(shared.epoch) == shared:
            later = [e.start_offset for e in primary if e.epoch > shared.epoch]
            return min(my_end, later[0] if later else primary_end)
    return 0 if mine or primary else min(my_end, primary_end)


class EpochHistory:
    """The epoch file of one store, loaded; :meth:`append` and :meth:`replace` write it
    durably before they return."""

    def __init__(self, root: str):
        self.path = os.path.join(root, FILE_NAME)
        self.root = root
        self.epochs: list[Epoch] = self._load()

    def _load(self) -> list[Epoch]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                document = json.load(handle)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as error:
            raise Corruption(f"{self.path} is not readable JSON: {error}", path=self.path) from None
        if not isinstance(document, dict) or document.get("magic") != MAGIC or document.get("version") != VERSION:
            raise Corruption(f"{self.path} is not a version-{VERSION} rmqstore epoch file", path=self.path)
        try:
            epochs = [Epoch(int(e), int(s), int(p)) for e, s, p in document.get("epochs", [])]
        except (TypeError, ValueError):
            raise Corruption(f"{self.path} holds a malformed epoch", path=self.path) from None
        if document.get("crc32") != zlib.crc32(_canonical(epochs)):
            raise Corruption(f"{self.path} fails its checksum", path=self.path)
        return epochs

    @property
    def last(self) -> Epoch | None:
        return self.epochs[-1] if self.epochs else None

    def append(self, epoch: Epoch) -> None:
        last = self.last
        invariant(last is None or (epoch.epoch > last.epoch and epoch.start_offset >= last.start_offset), "epochs grow")
        self.replace([*self.epochs, epoch])

    def replace(self, epochs: list[Epoch]) -> None:
        """Take another replica's history (a follower takes its primary's)."""
        if epochs == self.epochs:
            return
        document = {
            "magic": MAGIC,
            "version": VERSION,
            "epochs": [[e.epoch, e.start_offset, e.primary_id] for e in epochs],
            "crc32": zlib.crc32(_canonical(epochs)),
        }
        temp = self.path + ".tmp"
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(document, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, self.path)
        fsync_directory(self.root)
        self.epochs = list(epochs)
