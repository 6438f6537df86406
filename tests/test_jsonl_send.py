"""`rmqstore send --file`'s compiled pass (jsonl_send_batches): from the file's bytes to
the SendBatchRequests in one pass. It may only vouch for lines the parse-and-check path
(orjson, the columns, the writer's screen) also takes as plainly good, and then its requests
must be that path's, byte for byte; every other line it declines, and the file goes down
that path, which words the error. These tests hold it to both halves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rmqstore.cli import bulk_send
from rmqstore.cli.writer_tools import client_limits
from rmqstore.common.codec.speedups import _speedups
from rmqstore.common.errors import InvalidArgument
from rmqstore.v1 import writer_pb2

LIMITS = client_limits()
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def by_columns(data: bytes, batch_size: int, traceparent: str | None) -> bulk_send.Prepared | None:
    """The parse-and-check path's requests for ``data`` when all of it is plainly good
    (the orjson columns), else None."""
    columns = bulk_send._fast(data, LIMITS)
    if columns is None:
        return None
    requests = bulk_send.encode_batches(columns, batch_size, bulk_send.context_field(traceparent))
    whole, rest = divmod(len(columns), batch_size)
    return bulk_send.Prepared(requests, columns.topics, [batch_size] * whole + ([rest] if rest else []))


def compiled(data: bytes, batch_size: int = 3, traceparent: str | None = None) -> bulk_send.Prepared | None:
    return bulk_send._compiled(data, LIMITS, batch_size, traceparent, bulk_send.context_field(traceparent))


def lines(*documents: Any) -> bytes:
    return "".join(json.dumps(d) + "\n" for d in documents).encode()


def test_the_compiled_pass_is_built() -> None:
    assert _speedups is not None and hasattr(_speedups, "jsonl_send_batches")


def test_plain_lines_give_the_column_paths_requests_byte_for_byte() -> None:
    data = lines(
        {"topic": "Orders", "body": "héllo \"quoted\" \\ / \t", "keys": ["a", "b"], "tags": "t", "queueId": 2, "uniqKey": "AB12"},
        {"topic": "U"},
        {"topic": "Orders", "body": "", "keys": [], "queueId": None, "tags": ""},
        {"queueId": 2147483647, "topic": "U", "body": "\U0001f600 emoji, \u0000 nul, \u2028"},
    )  # fmt: skip
    for batch_size in (1, 2, 3, 1000):
        for traceparent in (None, TRACEPARENT):
            got = compiled(data, batch_size, traceparent)
            assert got is not None and got == by_columns(data, batch_size, traceparent)
    got = compiled(data, 3, TRACEPARENT)
    assert got is not None and got.batch_sizes == [3, 1] and got.topics == ["Orders", "U", "Orders", "U"]
    first = writer_pb2.SendBatchRequest.FromString(got.requests[0])
    assert first.compact_results and [m.topic for m in first.messages] == ["Orders", "U", "Orders"]
    assert first.messages[0].body == 'héllo "quoted" \\ / \t'.encode()
    # The trace context is the request's, once, not each message's.
    assert dict(first.shared_properties) == {"traceparent": TRACEPARENT}
    assert all(not m.properties for m in first.messages)
    assert not first.messages[2].HasField("queue_id") and first.messages[0].queue_id == 2
    last = writer_pb2.SendBatchRequest.FromString(got.requests[1]).messages[0]
    assert last.body == "\U0001f600 emoji, \u0000 nul, \u2028".encode() and last.queue_id == 2147483647


def test_escapes_spacing_blank_lines_and_crlf_decode_as_json_does() -> None:
    data = (
        b'  {"topic":"T","body":"\\u00e9\\ud83d\\ude00\\n\\"\\/\\b\\f\\r\\t","keys":[ "k1" ,"k\\u0032" ]}  \r\n'
        b"\n   \t\n"
        b'{ "t\\u006fpic" : "T" , "tags" : "a\\u0062" , "queueId" : 0 }\r\n'
        b'{"topic": "T"}'  # no newline at the end
    )
    got = compiled(data)
    assert got is not None
    messages = [m for r in got.requests for m in writer_pb2.SendBatchRequest.FromString(r).messages]
    assert messages[0].body == "é\U0001f600\n\"/\b\f\r\t".encode() and list(messages[0].keys) == ["k1", "k2"]
    assert messages[1].tags == "ab" and messages[1].HasField("queue_id") and messages[1].queue_id == 0
    assert len(messages) == 3 and got.topics == ["T", "T", "T"]
    assert got == by_columns(data, 3, None)


@pytest.mark.parametrize(
    "line",
    [
        b'{"topic": "T", "topic": "U"}',  # twice: JSON keeps the last; the checked path shows which
        b'{"topic": "T", "properties": {"a": "b"}}',  # fields the columns take
        b'{"topic": "T", "bodyBase64": "aGk="}',
        b'{"topic": "T", "other": 1}',
        b'{"topic": "T", "tags": null}',
        b'{"topic": "T", "keys": "a b"}',
        b'{"topic": "T", "keys": [1]}',
        b'{"topic": "T", "queueId": -1}',
        b'{"topic": "T", "queueId": 2147483648}',
        b'{"topic": "T", "queueId": 1.0}',
        b'{"topic": "T", "queueId": 1e2}',
        b'{"topic": "T", "queueId": 01}',
        b'{"topic": "T", "queueId": true}',
        b'{"topic": "T", "queueId": "1"}',
        b'{"body": "no topic"}',
        b"{}",
        b"[]",
        b'{"topic": "T"} {"topic": "U"}',  # two values on a line
        b'{"topic": "T",}',
        b'{"topic": "T" "body": "x"}',
        b'{"topic": "T", "body": "unterminated}',
        b'{"topic": "T", "body": "a\\x"}',  # not an escape of JSON's
        b'{"topic": "T", "body": "\\ud83d"}',  # a lone surrogate
        b'{"topic": "T", "body": "\\ude00"}',
        b'{"topic": "T", "body": "\\ud83d\\u0041"}',
        b'{"topic": "T", "body": "tab\tinside"}',  # a raw control character
        b'{"topic": "T", "body": "caf\xe9"}',  # not UTF-8
        b'{"topic": "T", "body": "\xed\xa0\x80"}',  # an encoded surrogate
        b'{"topic": "T", "body": "\xc0\xaf"}',  # overlong
        b'{"topic": "T",\n"body": "x"}',  # an object over two lines
        b'{"topic": "bad topic"}',  # the writer's rules, left to the checked path
        b'{"topic": ""}',
        b'{"topic": "T", "keys": ["has space"]}',
        b'{"topic": "T", "keys": [""]}',
        b'{"topic": "T", "keys": ["k\\u0001"]}',
        b'{"topic": "T", "keys": ["\\u00e9"]}',
        b'{"topic": "T", "tags": "\\u00e9"}',
        b'{"topic": "T", "uniqKey": "not-alnum"}',
        b'{"topic": "T", "uniqKey": "' + b"A" * 129 + b'"}',
        b'{"topic": "T", "body": "' + b"x" * (4 * 1024 * 1024 + 1) + b'"}',
        b'{"topic": "T", "keys": [' + b",".join(b'"k%d"' % n for n in range(LIMITS.max_keys + 1)) + b"]}",
    ],
)
def test_lines_it_cannot_vouch_for_are_declined(line: bytes) -> None:
    data = b'{"topic": "T", "body": "good"}\n' + line + b"\n"
    assert compiled(data) is None
    if b"\n" not in line.strip() and line.strip():
        # the columns decline it too, or take it as the checked path does (a duplicate
        # field: the last one) — the compiled pass never takes what they would refuse
        assert by_columns(data, 3, None) is None or b'"topic": "T", "topic"' in line


def test_a_file_without_a_message_is_left_to_the_checked_path() -> None:
    assert compiled(b"") is None and compiled(b"\n  \r\n\t\n") is None


def test_a_bad_line_still_gets_the_checked_paths_error_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(lines(*({"topic": "T", "body": f"m{n}"} for n in range(5))) + b'{"topic": "T", "queueId": -1}\n')
    with pytest.raises(InvalidArgument) as error:
        bulk_send.prepare(str(path), LIMITS, 2)
    assert str(error.value) == "line 6: queueId -1 is outside [0, 2147483647]"


def test_prepare_takes_the_compiled_pass_and_gives_the_checked_paths_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "many.jsonl"
    path.write_bytes(lines(*({"topic": f"T{n % 3}", "body": f"message {n}", "keys": [f"k{n}"], "queueId": n % 4}
                             for n in range(50))))  # fmt: skip
    fast = bulk_send.prepare(str(path), LIMITS, 7, TRACEPARENT)
    assert fast == compiled(path.read_bytes(), 7, TRACEPARENT)
    monkeypatch.setattr(bulk_send, "_compiled", lambda *_: None)
    checked = bulk_send.prepare(str(path), LIMITS, 7, TRACEPARENT)
    assert checked == fast and fast.batch_sizes == [7] * 7 + [1]


json_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
plain_text = st.text(st.sampled_from("abcXYZ019_-"), min_size=1, max_size=8)
field_values = {
    "topic": st.one_of(plain_text, json_text, st.none(), st.integers(-3, 3)),
    "body": st.one_of(json_text, st.none(), st.integers()),
    "keys": st.one_of(st.lists(st.one_of(plain_text, json_text), max_size=3), json_text, st.none()),
    "tags": st.one_of(plain_text, json_text, st.none()),
    "uniqKey": st.one_of(st.text(st.sampled_from("0123456789ABCDEFabcdef"), max_size=40), json_text),
    "queueId": st.one_of(st.integers(-2, 2**31 + 1), st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    "other": st.integers(),
}
documents = st.lists(
    st.fixed_dictionaries({}, optional=field_values).filter(lambda d: "other" not in d or len(d) > 1),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents, st.booleans(), st.sampled_from([(", ", ": "), (",", ":")]), st.integers(1, 4))
@example([{"topic": "T", "body": "\u2028\x7f\x00"}], True, (",", ":"), 1)
def test_any_file_the_compiled_pass_takes_is_the_column_paths_byte_for_byte(
    docs: list[dict[str, Any]], ascii_only: bool, separators: tuple[str, str], batch_size: int
) -> None:
    data = "".join(json.dumps(d, ensure_ascii=ascii_only, separators=separators) + "\n" for d in docs).encode()
    got, expected = compiled(data, batch_size, None), by_columns(data, batch_size, None)
    # The same answer either way: both take the file (with the same requests) or neither.
    assert got == expected


@pytest.mark.parametrize("bad", [False, True])
def test_a_pipe_is_read_once_for_either_path(tmp_path: Path, bad: bool) -> None:
    """A file that cannot be mapped (a pipe) is read; when the compiled pass declines it,
    the checked path gets the same bytes rather than reading the pipe again."""
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = lines({"topic": "T", "body": "one"}, {"topic": "T", "body": "two"}) + (b'{"topic": "T", "x": 1}\n' if bad else b"")

    def feed() -> None:
        with open(fifo, "wb") as pipe:
            pipe.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        if bad:
            with pytest.raises(InvalidArgument) as error:
                bulk_send.prepare(str(fifo), LIMITS, 2)
            assert str(error.value).startswith("line 3: unknown field(s) ['x']")
        else:
            assert bulk_send.prepare(str(fifo), LIMITS, 2) == compiled(data, 2)
    finally:
        feeder.join(timeout=10)
    assert not feeder.is_alive()
