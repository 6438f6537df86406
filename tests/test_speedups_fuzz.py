"""Every compiled entry point on arguments it was not written for.

Each call starts from a good one (well-formed records, index and queue bytes, columns of
one length) and hypothesis mutates it: bytes flipped, cut short or extended, integers
replaced by edge values (negative, past int32 and int64, huge counts), columns of other
lengths or with a partial item, items of the wrong type, arguments of the wrong type,
one argument too many or too few. Whatever comes in, an entry point returns or raises
one of the errors a Python function raises for bad arguments; a SystemError (an error
return with no exception set, or the reverse) or a crash fails the test.

tests/test_speedups.py holds each function to its Python definition; this test is the
one .ci/sanitize runs under AddressSanitizer and UndefinedBehaviorSanitizer, where a read
or write outside a buffer, a use after free, or a signed overflow stops the run.
SPEEDUPS_FUZZ_EXAMPLES sets the examples per entry point (default 100).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqstore.common.codec import properties as props
from rmqstore.common.codec import record
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.record import Record, encode_record
from rmqstore.common.codec.speedups import _speedups

pytestmark = pytest.mark.skipif(
    _speedups is None or os.environ.get("RMQSTORE_PURE_PYTHON") == "1", reason="the compiled paths are not in use"
)

EXAMPLES = int(os.environ.get("SPEEDUPS_FUZZ_EXAMPLES", "100"))

# What a function may raise for arguments it refuses, as Python's own functions do.
REFUSALS = (TypeError, ValueError, OverflowError, BufferError, MemoryError)

INTEGERS = [0, 1, -1, 2, 7, 8, 20, 36, 40, 91, 4096, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**40,
            2**62, 2**63 - 1, -(2**63), 2**63, 2**64, -(2**64), 10**30]  # fmt: skip
WRONG = [None, 1.5, "text", b"bytes", [], (), {}, object(), True]
HOST = SocketAddress(b"\x7f\x00\x00\x01", 50123)
HOST_V6 = SocketAddress(bytes(range(16)), 443)


def _record(commitlog_offset: int = 0, **changes: Any) -> bytes:
    fields: dict[str, Any] = dict(
        topic="TopicTest", body=b"hello body",
        properties={"KEYS": "order-1 cust-9", "TAGS": "TagA", "UNIQ_KEY": "7F00000100002A9F0000000000000001"},
        queue_id=3, flag=5, queue_offset=42, commitlog_offset=commitlog_offset, sys_flag=0,
        born_timestamp_ms=1_795_000_000_000, born_host=HOST, store_timestamp_ms=1_795_000_000_007,
        store_host=SocketAddress(b"\x0a\x00\x00\x02", 10911), reconsume_times=2, prepared_transaction_offset=77,
    )  # fmt: skip
    fields.update(changes)
    return encode_record(Record(**fields))


def _log() -> bytes:
    """Three records laid out from offset 0, the second with IPv6 hosts."""
    first = _record(0)
    second = _record(len(first), born_host=HOST_V6, store_host=HOST_V6, sys_flag=0x30, body=b"\xff" * 70)
    third = _record(len(first) + len(second), properties={})
    return first + second + third


LOG = _log()
STARTS = [0, len(_record(0)), len(LOG) - len(_record(0, properties={}))]


def _index_bytes() -> bytes:
    """A small index file: 8 slots, room for 16 entries, three keys put (two on one chain)."""
    from rmqstore.common.files.index import IndexFile

    with tempfile.TemporaryDirectory() as directory:
        index = IndexFile.create(str(Path(directory) / "index"), 8, 16, prev_end_phy_offset=0, prev_end_timestamp_ms=0)
        try:
            index.put_keys(_i64([5, 13, 5]), _i64([100, 200, 300]), _i64([1_795_000_000_000] * 3))
            return bytes(index.mapped.buf)
        finally:
            index.close()


@pytest.fixture(scope="module")
def log_fd() -> Iterator[int]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "00000000000000000000"
        path.write_bytes(LOG)
        descriptor = os.open(path, os.O_RDONLY)
        try:
            yield descriptor
        finally:
            os.close(descriptor)


def _i64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@functools.cache
def _good_calls(fd: int) -> dict[str, tuple[Any, ...]]:
    """A call each entry point accepts, by name. Shared by the examples: a mutation makes
    new containers, and the one buffer a function writes (index_put_keys') is copied."""
    units = b"".join(
        int(start).to_bytes(8, "big") + (100).to_bytes(4, "big") + (7).to_bytes(8, "big") for start in STARTS
    )
    log = np.frombuffer(LOG, np.uint8)
    at = _i64([4, 20, 100])
    length = _i64([10, 0, 30])
    calls: dict[str, tuple[Any, ...]] = {
        "java_string_hash": ("TopicTest",),
        "index_key_hash": ("TopicTest", "key-é"),
        "matching_offsets": (INDEX, 8, 16, 5, 0, 0, 4),
        "index_put_keys": (bytearray(INDEX), 8, 4, 1_795_000_000_000, _i64([5, 6]), _i64([400, 500]), _i64([1, 2])),
        "configure": (Record, record._address, tuple(f.name for f in dataclasses.fields(Record))),
        "decode_record": (LOG, 0, True, len(LOG)),
        "read_records": (fd, list(STARTS) + [1], len(LOG), 0, 64, True, None),
        "encode_records": (0, [1, 2], [0, 0], [5, 6], [None, 3], [HOST, HOST_V6], [b"ab", b""], ["T", "T"],
                           [b"p", b""], 9, HOST, 8),  # fmt: skip
        "first_stored_after": (units, 0, 3, 1_795_000_000_007, False, fd, 0, len(LOG)),
        "store_times": (units, 0, 3, fd, 0, len(LOG), bytearray(24)),
        "queue_unit_blocks": (["A", "B", "A"], [0, 1, 0], [4, 0, 5], [1, 2, 3], [1, 2, 3], [1, 2, 3]),
        "encode_common_properties": (props._COMMON_ORDER, [["a", "b"]], ["t"], ["u"]),
        "property_pairs": (log, at, length),
        "walk_starts": (LOG, 0, len(LOG), 10),
        "body_crcs": (log, at, length),
        "span_texts": (log, at, length),
        "span_key_hashes": (log, _i64([1, 2, 3]), at, length, at, length),
        "tags_codes": (["TagA", None, "é"],),
        "message_key_hashes": (_i64([1, 2]), ["u", "v"], [["a"], []]),
        "screen_batch": ([b"ab"], [["k"]], ["t"], ["AB"], [1], 100, 4, 10, 10),
    }
    return calls


INDEX = _index_bytes()

# Arguments whose every value is safe to mutate only within bounds: a descriptor (only
# ours, none, or one not open: pread on any other would read the test's own files), and
# the index header's entry count, which bounds a chain's walk (Apache's rule: up to
# 2^31 steps round a cycle, each kept when max_count allows).
FDS = st.sampled_from([None, -1, 10**6, 2**31, 2**40])


def _mutated_bytes(data: st.DataObject, value: bytes) -> bytes:
    choice = data.draw(st.sampled_from(["flip", "cut", "extend", "random", "same"]))
    if choice == "flip" and value:
        array = bytearray(value)
        for _ in range(data.draw(st.integers(1, 8))):
            array[data.draw(st.integers(0, len(array) - 1))] = data.draw(st.integers(0, 255))
        return bytes(array)
    if choice == "cut":
        return value[: data.draw(st.integers(0, len(value)))]
    if choice == "extend":
        return value + data.draw(st.binary(max_size=64))
    if choice == "random":
        return data.draw(st.binary(max_size=256))
    return value


def _mutated_int(data: st.DataObject) -> int:
    return data.draw(st.one_of(st.sampled_from(INTEGERS), st.integers(-(2**70), 2**70)))


def _mutated_column(data: st.DataObject, value: np.ndarray) -> object:
    choice = data.draw(st.sampled_from(["values", "longer", "shorter", "partial", "same"]))
    if choice == "values":
        return _i64([data.draw(st.sampled_from([v for v in INTEGERS if -(2**63) <= v < 2**63])) for _ in value])
    if choice == "longer":
        return np.concatenate([value, _i64([data.draw(st.integers(-(2**63), 2**63 - 1))])])
    if choice == "shorter":
        return value[: max(len(value) - 1, 0)]
    if choice == "partial":
        return value.tobytes() + b"\x01"
    return value


def _mutated(data: st.DataObject, value: Any) -> Any:
    """value, changed as its type allows (or not at all)."""
    if data.draw(st.integers(0, 9)) == 0:
        return data.draw(st.sampled_from(WRONG))
    if isinstance(value, bool):
        return data.draw(st.sampled_from([True, False, 2, None]))
    if isinstance(value, int):
        return _mutated_int(data) if data.draw(st.booleans()) else value
    if isinstance(value, bytearray):
        return bytearray(_mutated_bytes(data, bytes(value)))  # a copy, even when unchanged
    if isinstance(value, bytes):
        return _mutated_bytes(data, value)
    if isinstance(value, np.ndarray):
        if value.dtype == np.uint8:
            return np.frombuffer(_mutated_bytes(data, value.tobytes()), np.uint8)
        return _mutated_column(data, value)
    if isinstance(value, str):
        return data.draw(st.sampled_from([value, "", "\ud800", "é" * 3, "a\x01b", "x" * 300, "k k"]))
    if isinstance(value, list):
        items = list(value)
        choice = data.draw(st.sampled_from(["item", "shorter", "longer", "same"]))
        if choice == "item" and items:
            at = data.draw(st.integers(0, len(items) - 1))
            items[at] = _mutated(data, items[at])
        elif choice == "shorter":
            items = items[:-1]
        elif choice == "longer" and items:
            items.append(_mutated(data, items[0]))
        return items
    if isinstance(value, tuple):
        return tuple(_mutated(data, item) if data.draw(st.booleans()) else item for item in value)
    if isinstance(value, dict):
        return data.draw(st.sampled_from([value, {}, {"a": 1}, {1: "a"}, {"\ud800": "x"}]))
    return value


def _mutated_call(name: str, data: st.DataObject, good: tuple[Any, ...]) -> tuple[Any, ...]:
    args = list(good)
    for position, value in enumerate(args):
        if position == {"read_records": 0, "first_stored_after": 5, "store_times": 3}.get(name):
            if data.draw(st.integers(0, 3)) == 0:
                args[position] = data.draw(FDS)
            continue
        args[position] = _mutated(data, value)
    if name in ("matching_offsets", "index_put_keys") and isinstance(args[0], bytes | bytearray) and len(args[0]) >= 40:
        buf = bytearray(args[0])
        buf[36:40] = min(int.from_bytes(buf[36:40], "big"), 64).to_bytes(4, "big")
        args[0] = type(args[0])(buf)
    arity = data.draw(st.sampled_from(["same"] * 8 + ["fewer", "more"]))
    if arity == "fewer" and args:
        args.pop()
    elif arity == "more":
        args.append(0)
    return tuple(args)


def _entry_points() -> list[str]:
    return sorted(name for name in dir(_speedups) if not name.startswith("_")) if _speedups is not None else []


def test_every_entry_point_has_a_good_call() -> None:
    assert set(_good_calls(-1)) == set(_entry_points())


@pytest.mark.parametrize("name", _entry_points())
def test_good_calls_are_accepted(name: str, log_fd: int) -> None:
    """The starting points are calls the functions take (else the fuzz tests refusals only)."""
    try:
        getattr(_speedups, name)(*_good_calls(log_fd)[name])
    finally:
        _restore()


def _restore() -> None:
    """configure as record.py calls it: a fuzzed configure must not change later decodes."""
    _speedups.configure(Record, record._address, tuple(f.name for f in dataclasses.fields(Record)))


@pytest.mark.parametrize("name", _entry_points())
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_bad_arguments_are_refused_or_handed_back(name: str, log_fd: int, data: st.DataObject) -> None:
    function: Callable[..., object] = getattr(_speedups, name)
    args = _mutated_call(name, data, _good_calls(log_fd)[name])
    try:
        function(*args)
    except REFUSALS:
        pass
    finally:
        _restore()
