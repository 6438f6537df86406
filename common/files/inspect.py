"""``inspect``: what a store directory holds, read-only and quick (no full CRC scan)."""

from __future__ import annotations

import os
from typing import Any

from rmqstore.common.files.checkpoint import read_checkpoint
from rmqstore.common.files.commitlog import CommitLog
from rmqstore.common.files.consumequeue import ConsumeQueueSet
from rmqstore.common.files.index import IndexFileList
from rmqstore.common.files.lockfile import lock_holder
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
            "lockHeld": lock_holder(paths.lock) is not None,
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
