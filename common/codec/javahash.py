"""Java's String.hashCode, the index key hash and java.util.HashMap iteration order.

RocketMQ hashes Java strings, i.e. UTF-16 code units, never UTF-8 bytes (docs/format.md §6.2,
§7.2). A byte-exact writer also has to reproduce the order in which a Java HashMap iterates
its keys, because the broker serializes message properties from one (docs/format.md §3.6).
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from rmqstore.common.codec.speedups import _speedups

if TYPE_CHECKING:
    import numpy as np

# numpy is imported by the functions that take or make arrays (the writer's and the
# readers' batch paths), not by this module: the scalar hashes and the HashMap order are all
# a command line's message encoding needs, and numpy would be a third of its start-up time.

INT32_MIN = -(2**31)
_MASK32 = 0xFFFFFFFF
# 31**e mod 2**32, grown on demand: the weight of a code unit e places from a string's end.
_POWERS_31: np.ndarray | None = None


def java_string_hash(text: str) -> int:
    """String.hashCode: h = 31*h + unit over UTF-16 code units, as a signed int32.

    Evaluated as Σ unit·31^(n−1−i) mod 2³², with the powers precomputed, so the loop runs
    in C (map and sum) rather than one Python step per character."""
    if text.isascii():
        units: Sequence[int] = text.encode("ascii")
    else:
        raw = text.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(raw) // 2}H", raw)
    count = len(units)
    if count > len(_DESCENDING_POWERS_31):
        _grow_descending_powers(count)
    h = sum(map(operator.mul, units, _DESCENDING_POWERS_31[len(_DESCENDING_POWERS_31) - count :])) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


# 31^k mod 2^32 for k = m−1 … 0: the last n entries weigh a string of n units.
_DESCENDING_POWERS_31: list[int] = []


def _grow_descending_powers(count: int) -> None:
    size = max(count, 2 * len(_DESCENDING_POWERS_31), 256)
    powers = [1] * size
    for k in range(1, size):
        powers[k] = (powers[k - 1] * 31) & _MASK32
    _DESCENDING_POWERS_31[:] = powers[::-1]


def index_key_hash(key: str) -> int:
    """IndexFile.indexKeyHashMethod: |hashCode|, with Integer.MIN_VALUE mapped to 0."""
    h = java_string_hash(key)
    return 0 if h == INT32_MIN else abs(h)


def topic_key_hash(topic: str, key: str) -> int:
    """``index_key_hash(index_key(topic, key))``: the hash a lookup of the key probes."""
    return index_key_hash(index_key(topic, key))


def _powers_31(count: int) -> np.ndarray:
    import numpy as np

    global _POWERS_31
    if _POWERS_31 is None or len(_POWERS_31) < count:
        size = max(count, 2 * (0 if _POWERS_31 is None else len(_POWERS_31)), 1)
        powers = np.empty(size, dtype=np.uint32)
        powers[0] = 1
        for e in range(1, size):  # once per process, up to the longest string seen
            powers[e] = (int(powers[e - 1]) * 31) & _MASK32
        _POWERS_31 = powers
    return _POWERS_31


def topic_prefix_hashes(topics: Sequence[str]) -> np.ndarray:
    """uint32 String.hashCode of ``topic#`` for each topic: the first part of its keys.
    One scalar hash a topic: the callers pass a batch's distinct topics, a handful, for
    which the array form's fixed cost was a tenth of a small batch's append."""
    import numpy as np

    return np.array([java_string_hash(index_key(topic, "")) & _MASK32 for topic in topics], dtype=np.uint32)


def _hashes_and_lengths(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """String.hashCode of each text as uint32, and its length in UTF-16 code units,
    computed as Σ unit·31^(n−1−i) mod 2³² over all texts' units in one pass."""
    import numpy as np

    count = len(texts)
    joined = "".join(texts)
    if joined.isascii():
        units = np.frombuffer(joined.encode("ascii"), dtype=np.uint8).astype(np.uint32)
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=count)
    else:
        units = np.frombuffer(joined.encode("utf-16-be", "surrogatepass"), dtype=">u2").astype(np.uint32)
        lengths = np.fromiter(
            (len(t) if t.isascii() else len(t.encode("utf-16-be", "surrogatepass")) // 2 for t in texts),
            dtype=np.int64,
            count=count,
        )
    hashes = np.zeros(count, dtype=np.uint32)
    if units.size:
        ends = np.cumsum(lengths)
        filled = lengths > 0
        # Exponent of each unit: the distance to the last unit of its string.
        exponents = np.repeat(ends - 1, lengths) - np.arange(units.size, dtype=np.int64)
        weighted = units * _powers_31(int(lengths.max()))[exponents]
        hashes[filled] = np.add.reduceat(weighted, (ends - lengths)[filled], dtype=np.uint32)
    return hashes, lengths


def offsets_within(lengths: np.ndarray) -> np.ndarray:
    """0 … n−1 for each length n, concatenated: each item's place within its span."""
    import numpy as np

    return np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def ascii_span_hashes(data: np.ndarray, at: np.ndarray, length: np.ndarray) -> np.ndarray:
    """String.hashCode (uint32) of byte spans ``data[at:at+length]`` that hold ASCII
    text, whose bytes are its UTF-16 code units: hashing without making the strings."""
    import numpy as np

    count = len(at)
    hashes = np.zeros(count, dtype=np.uint32)
    total = int(length.sum())
    if total:
        # Position in ``data`` of each unit, and its distance to the end of its span.
        inside = offsets_within(length)
        units = data[np.repeat(at, length) + inside].astype(np.uint32)
        exponents = np.repeat(length, length) - 1 - inside
        weighted = units * _powers_31(int(length.max()))[exponents]
        filled = length > 0
        hashes[filled] = np.add.reduceat(weighted, (np.cumsum(length) - length)[filled], dtype=np.uint32)
    return hashes


def combine_hashes(prefix: np.ndarray, suffix: np.ndarray, suffix_length: np.ndarray) -> np.ndarray:
    """The index key hash (int64, ≥ 0) of each concatenation prefix + suffix, from the
    uint32 String.hashCode of both parts and the suffix's length in UTF-16 units."""
    powers = _powers_31(int(suffix_length.max(initial=0)) + 1)
    return _index_hash(prefix * powers[suffix_length] + suffix)


def java_string_hashes(texts: Sequence[str]) -> np.ndarray:
    """:func:`java_string_hash` of many strings at once, as int32."""
    import numpy as np

    return _hashes_and_lengths(texts)[0].view(np.int32)


def _index_hash(hashes: np.ndarray) -> np.ndarray:
    import numpy as np

    signed = hashes.view(np.int32).astype(np.int64)
    signed[signed == INT32_MIN] = 0
    return np.abs(signed)


def index_key_hashes(keys: Sequence[str]) -> np.ndarray:
    """:func:`index_key_hash` of many keys at once, as int64 (all ≥ 0)."""
    return _index_hash(_hashes_and_lengths(keys)[0])


def topic_key_hashes(topics: Sequence[str], key_topics: np.ndarray, keys: Sequence[str]) -> np.ndarray:
    """``index_key_hash(index_key(topics[key_topics[i]], keys[i]))`` for every key, as
    int64, without building the ``topic#key`` strings: the hash of a concatenation is
    hash(topic#)·31^len(key) + hash(key) (mod 2³²)."""
    prefixes = topic_prefix_hashes(topics)
    hashes, lengths = _hashes_and_lengths(keys)
    return combine_hashes(prefixes[key_topics], hashes, lengths)


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


# The compiled versions, where the extension is built (it is, by every install of the
# project): the same results, pinned by tests/test_speedups.py against the Python above.
python_java_string_hash = java_string_hash
if _speedups is not None:
    java_string_hash = _speedups.java_string_hash
    topic_key_hash = _speedups.index_key_hash
