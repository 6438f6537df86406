"""sysFlag bits of a commit log record (docs/format.md §3.3)."""

from __future__ import annotations

COMPRESSED = 0x1
MULTI_TAGS = 0x2
TRANSACTION_MASK = 0xC
TRANSACTION_NOT = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
BORNHOST_V6 = 0x10
STOREHOST_V6 = 0x20
NEED_UNWRAP = 0x40
INNER_BATCH = 0x80
COMPRESSION_TYPE_MASK = 0x700
COMPRESSION_TYPE_SHIFT = 8

TRANSACTION_NAMES = {
    TRANSACTION_NOT: "NOT",
    TRANSACTION_PREPARED: "PREPARED",
    TRANSACTION_COMMIT: "COMMIT",
    TRANSACTION_ROLLBACK: "ROLLBACK",
}


def transaction_type(sys_flag: int) -> int:
    return sys_flag & TRANSACTION_MASK


def compression_type(sys_flag: int) -> str | None:
    """The body's compression, or None if uncompressed. 0 and 3 both mean ZLIB."""
    if not sys_flag & COMPRESSED:
        return None
    kind = (sys_flag & COMPRESSION_TYPE_MASK) >> COMPRESSION_TYPE_SHIFT
    return {1: "LZ4", 2: "ZSTD"}.get(kind, "ZLIB")
