"""Java's String.hashCode, the index key hash and java.util.HashMap iteration order.

RocketMQ hashes Java strings, i.e. UTF-16 code units, never UTF-8 bytes (FORMAT.md §6.2,
§7.2). A byte-exact writer also has to reproduce the order in which a Java HashMap iterates
its keys, because the broker serializes message properties from one (FORMAT.md §3.6).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

INT32_MIN = -(2**31)
_MASK32 = 0xFFFFFFFF


def java_string_hash(text: str) -> int:
    """String.hashCode: h = 31*h + unit over UTF-16 code units, as a signed int32."""
    if text.isascii():
        units: Iterable[int] = text.encode("ascii")
    else:
        raw = text.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(raw) // 2}H", raw)
    h = 0
    for unit in units:
        h = (31 * h + unit) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """IndexFile.indexKeyHashMethod: |hashCode|, with Integer.MIN_VALUE mapped to 0."""
    h = java_string_hash(key)
    return 0 if h == INT32_MIN else abs(h)


def index_key(topic: str, key: str) -> str:
    """The string the index hashes for a key of a topic: ``topic#key``."""
    return f"{topic}#{key}"


def _hashmap_spread(text: str) -> int:
    h = java_string_hash(text) & _MASK32
    return h ^ (h >> 16)


def java_hashmap_order(keys: Iterable[str]) -> list[str]:
    """The iteration order of a java.util.HashMap<String, …> filled with ``keys`` in order.

    Bucket = (h ^ h>>>16) & (capacity-1); capacity starts at 16 and doubles when the size
    exceeds 0.75·capacity; a bucket keeps insertion order (Java splits buckets stably on
    resize, and treeified buckets only appear past 64 entries with 8 collisions — beyond
    any property map a record can hold in practice, so lists are enough here).
    """
    unique: list[str] = list(dict.fromkeys(keys))
    capacity = 16
    while len(unique) > capacity * 3 // 4:
        capacity *= 2
    buckets: dict[int, list[str]] = {}
    for key in unique:
        buckets.setdefault(_hashmap_spread(key) & (capacity - 1), []).append(key)
    return [key for slot in sorted(buckets) for key in buckets[slot]]
