"""``inspect``: what a store directory holds, read-only and quick (no full CRC scan)."""

from __future__ import annotations

import fcntl
import os
import struct
from typing import Any

from rmqstore.common.files.checkpoint import read_checkpoint
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.consumequeue import ConsumeQueueSet
from rmqstore.common.files.index import IndexFileList
from rmqstore.common.files.store import StorePaths, StoreSizes


def _commitlog_end(log: CommitLog) -> dict[str, Any]:
    """Scan from the newest file that holds data: records never span files, so the end
    of the log is found without reading the older files."""
    start = log.min_offset
    for mapped in reversed(log.files.files):
        if mapped.last_nonzero_position(0) > 0:
            start = mapped.start_offset
            break
    stop = log.scan(start, check_crc=True)
    return {
        "endOffset": stop.end_offset,
        "stop": stop.reason.value,
        "stopDetail": stop.describe(),
    }


# struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (native alignment).
_FLOCK = struct.Struct("hhqqi4x")


def lock_held(path: str) -> bool:
    """Whether a process (a running writer) holds the store lock: the lock file itself
    stays after every exit, clean or not, so only the lock says a writer is alive. Asked
    with F_GETLK on a read-only descriptor, which takes no lock and writes nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    finally:
        os.close(fd)
    return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)


def inspect_store(root: str, sizes: StoreSizes) -> dict[str, Any]:
    paths = StorePaths(root)
    log = CommitLog(paths.commitlog, sizes.commitlog_file_size_bytes)
    queues = ConsumeQueueSet(paths.consumequeue, sizes.cq_file_units)
    index = IndexFileList(paths.index, sizes.index_slots, sizes.index_entries)
    try:
        checkpoint = read_checkpoint(paths.checkpoint)
        result: dict[str, Any] = {
            "store": os.path.abspath(root),
            "sizes": {
                "commitlogFileSize": sizes.commitlog_file_size_bytes,
                "cqFileUnits": sizes.cq_file_units,
                "indexSlots": sizes.index_slots,
                "indexEntries": sizes.index_entries,
            },
            "abort": os.path.exists(paths.abort),
            "lock": os.path.exists(paths.lock),
            "lockHeld": lock_held(paths.lock),
            "commitlog": {
                "files": [mapped.name for mapped in log.files],
                "minOffset": log.min_offset,
                **_commitlog_end(log),
            },
            "consumequeues": [
                {
                    "topic": queue.topic,
                    "queueId": queue.queue_id,
                    "files": len(queue.files),
                    "minOffset": queue.min_offset,
                    "maxOffset": queue.max_offset,
                    "maxCommitLogEnd": queue.max_commitlog_end,
                }
                for queue in queues.open_all()
            ],
            "index": [
                {
                    "file": index_file.name,
                    "beginTimestamp": header.begin_timestamp_ms,
                    "endTimestamp": header.end_timestamp_ms,
                    "beginPhyOffset": header.begin_phy_offset,
                    "endPhyOffset": header.end_phy_offset,
                    "hashSlotCount": header.hash_slot_count,
                    "indexCount": header.index_count,
                    "entriesUsed": max(header.index_count - 1, 0),
                    "fill": round(max(header.index_count - 1, 0) / (sizes.index_entries - 1), 6),
                }
                for index_file in index.files
                for header in (index_file.header,)
            ],
            "checkpoint": None
            if checkpoint is None
            else {
                "physicMsgTimestamp": checkpoint.physic_msg_timestamp_ms,
                "logicsMsgTimestamp": checkpoint.logics_msg_timestamp_ms,
                "indexMsgTimestamp": checkpoint.index_msg_timestamp_ms,
                "minTimestamp": checkpoint.min_timestamp_ms,
                "minTimestampIndex": checkpoint.min_timestamp_index_ms,
            },
        }
    finally:
        log.close()
        queues.close()
        index.close()
    return result
