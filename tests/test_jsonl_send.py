"""`rmqstore send --file`'s one path (client/send_file.py): a JSON Lines file read into
the columnar request's columns by whole-column passes, checked by the writer's rules,
sent as SendBatchRequest.columns, the acks written as JSON Lines. Every documented field
takes that path; the columns must say what each line says alone (the line-by-line check,
``first_problem``, is the reference), and every error names its line."""

from __future__ import annotations

import base64
import json
import os
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rmqstore.client import send_file
from rmqstore.client.jsonl import message_from_json
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.message_rules import DEFAULT_LIMITS, MessageBatch
from rmqstore.v1 import writer_pb2
from rmqstore.writer.intake import columns_batch

LIMITS = DEFAULT_LIMITS
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CONTEXT = {"traceparent": TRACEPARENT}


def lines(*documents: Any) -> bytes:
    return "".join(json.dumps(d) + "\n" for d in documents).encode()


def read(tmp_path: Path, data: bytes, shared: dict[str, str] | None = None) -> send_file.Columns:
    path = tmp_path / "messages.jsonl"
    path.write_bytes(data)
    return send_file.read_file(str(path), LIMITS, shared or {})


def refusal(tmp_path: Path, data: bytes, shared: dict[str, str] | None = None) -> str:
    with pytest.raises(InvalidArgument) as error:
        read(tmp_path, data, shared)
    return str(error.value)


def sent(columns: send_file.Columns, batch_size: int, shared: dict[str, str] | None = None) -> list[writer_pb2.SendBatchRequest]:
    return [writer_pb2.SendBatchRequest.FromString(r) for r in send_file.requests(columns, batch_size, shared or {})]


def stored(requests: list[writer_pb2.SendBatchRequest]) -> MessageBatch:
    """The messages as the writer takes them from the requests."""
    return MessageBatch.concat([columns_batch(r.columns, r.shared_properties) for r in requests])


def expected(data: bytes, shared: dict[str, str] | None = None) -> MessageBatch:
    """The messages each line gives alone, as the writer would store them."""
    shared = shared or {}
    messages = [message_from_json(n, orjson.loads(line)) for n, line in enumerate(data.split(b"\n"), 1) if line.strip()]
    return MessageBatch(
        [m.topic for m in messages], [m.body for m in messages], [list(m.keys) for m in messages],
        [m.tags for m in messages], [{**shared, **m.properties} for m in messages],
        [m.queue_id if m.HasField("queue_id") else None for m in messages], [m.uniq_key for m in messages],
        [0] * len(messages), [0] * len(messages), [None] * len(messages),
    )  # fmt: skip


EVERY_FIELD = lines(
    {"topic": "Orders", "body": "héllo \"quoted\" \\ / \t", "keys": ["a", "b"], "tags": "t", "queueId": 2, "uniqKey": "AB12"},
    {"topic": "Orders", "bodyBase64": base64.b64encode(bytes(range(256))).decode(), "keys": "c  d\te", "queueId": 0},
    {"topic": "U", "body": "", "properties": {"color": "blue", "size": "XL"}, "tags": None, "uniqKey": None, "queueId": None},
    {"queueId": 2147483647, "topic": "U", "body": "\U0001f600 emoji, \u0000 nul, \u2028", "keys": []},
    {"topic": "Orders", "bodyBase64": "", "keys": "", "properties": {"only": "one"}},
)  # fmt: skip


@pytest.mark.parametrize("batch_size", [1, 2, 3, 1000])
@pytest.mark.parametrize("shared", [{}, CONTEXT])
def test_every_field_reaches_the_writer_as_each_line_says(tmp_path: Path, batch_size: int, shared: dict[str, str]) -> None:
    columns = read(tmp_path, EVERY_FIELD, shared)
    requests = sent(columns, batch_size, shared)
    assert [len(r.columns.bodies) for r in requests] == send_file.batch_sizes(5, batch_size)
    assert all(r.compact_results and not r.messages and dict(r.shared_properties) == shared for r in requests)
    assert stored(requests) == expected(EVERY_FIELD, shared)
    assert columns.topics == ["Orders", "Orders", "U", "U", "Orders"]


def test_the_columns_are_the_contracts(tmp_path: Path) -> None:
    """MessageColumns as writer.proto defines them: keys joined by single spaces, -1 where
    the writer picks the queue, one topic for a batch of one topic, property pairs in
    order with a count a message, and a column no message sets left empty."""
    [request] = sent(read(tmp_path, EVERY_FIELD), 1000)
    made = request.columns
    assert list(made.keys) == ["a b", "c d e", "", "", ""]
    assert list(made.queue_ids) == [2, 0, -1, 2147483647, -1]
    assert list(made.topics) == ["Orders", "Orders", "U", "U", "Orders"]
    assert list(made.tags) == ["t", "", "", "", ""] and list(made.uniq_keys) == ["AB12", "", "", "", ""]
    assert list(made.property_counts) == [0, 0, 2, 0, 1]
    assert list(made.property_names) == ["color", "size", "only"] and list(made.property_values) == ["blue", "XL", "one"]
    assert made.bodies[1] == bytes(range(256)) and made.bodies[4] == b""
    [plain] = sent(read(tmp_path, lines({"topic": "T", "body": "x"}, {"topic": "T", "body": ""})), 10)
    columns = plain.columns
    assert list(columns.topics) == ["T"] and list(columns.bodies) == [b"x", b""]
    assert not (columns.queue_ids or columns.keys or columns.tags or columns.uniq_keys or columns.property_counts)
    # A batch's slice of the property columns is its own messages' pairs.
    second = sent(read(tmp_path, EVERY_FIELD), 2)[1].columns
    assert list(second.property_counts) == [2, 0] and list(second.property_names) == ["color", "size"]


def test_spacing_escapes_blank_lines_and_crlf_read_as_json_does(tmp_path: Path) -> None:
    data = (
        b'  {"topic":"T","body":"\\u00e9\\ud83d\\ude00\\n\\"\\/\\b\\f\\r\\t","keys":[ "k1" ,"k\\u0032" ]}  \r\n'
        b"\n   \t\n"
        b'{ "t\\u006fpic" : "T" , "tags" : "a\\u0062" , "queueId" : 0, "body": "" }\r\n'
        b'{"topic": "T", "body": ""}'  # no newline at the end
        b"\n\n \n"
    )
    batch = stored(sent(read(tmp_path, data), 2))
    assert batch.bodies[0] == "é\U0001f600\n\"/\b\f\r\t".encode() and batch.keys[0] == ["k1", "k2"]
    assert batch.tags[1] == "ab" and batch.queue_ids == [None, 0, None] and batch.topics == ["T", "T", "T"]


def test_a_valid_message_the_screen_declines_is_sent_all_the_same(tmp_path: Path) -> None:
    """The batch screen passes ASCII keys only; a key outside ASCII is the rules' to judge,
    and they accept it."""
    data = lines({"topic": "T", "body": "", "keys": ["clé", "k"], "tags": "étiquette"}, {"topic": "T", "body": "x"})
    assert stored(sent(read(tmp_path, data), 5)) == expected(data)


def test_an_empty_file_has_no_message(tmp_path: Path) -> None:
    assert len(read(tmp_path, b"")) == 0 and len(read(tmp_path, b"\n \r\n\t\n")) == 0
    assert sent(read(tmp_path, b""), 3) == []


BAD_LINES = [
    (b'{"topic": "T", "body": "", "tags": 5}', "line 3: tags must be a string"),
    (b'{"topic": "T", "body": "", "uniqKey": 7}', "line 3: uniqKey must be a string"),
    (b'{"topic": "T", "body": "", "queueId": true}', "line 3: queueId must be an integer"),
    (b'{"topic": "T", "body": "", "queueId": 1.0}', "line 3: queueId must be an integer"),
    (b'{"topic": "T", "body": "", "queueId": "1"}', "line 3: queueId must be an integer"),
    (b'{"topic": "T", "body": "", "queueId": -1}', "line 3: queueId -1 is outside [0, 2147483647]"),
    (b'{"topic": "T", "body": "", "queueId": 2147483648}', "line 3: queueId 2147483648 is outside [0, 2147483647]"),
    (b'{"topic": "T"} {"topic": "U"}', "line 3, column 16: not JSON: unexpected content after document"),
    (b'{"topic": "T", "body": "x", "bodyBase64": "AA=="}', "line 3: give body or bodyBase64, not both"),
    (b'{"topic": "T", "bodyBase64": "AA="}', "line 3: bodyBase64 is not base64: Incorrect padding"),
    (b'{"topic": "T", "bodyBase64": "AA*A"}', "line 3: bodyBase64 is not base64: Only base64 data is allowed"),
    (b'{"topic": "T", "bodyBase64": 5}',
     "line 3: bodyBase64 is not base64: argument should be a bytes-like object or ASCII string, not 'int'"),
    (b'{"topic": "T", "bodyBase64": null}',
     "line 3: bodyBase64 is not base64: argument should be a bytes-like object or ASCII string, not 'NoneType'"),
    (b'{"topic": "T", "body": 5}', "line 3: body must be a string (use bodyBase64 for bytes)"),
    (b'{"topic": "T", "body": null}', "line 3: body must be a string (use bodyBase64 for bytes)"),
    (b'{"topic": "T", "body": "", "keys": [1]}', "line 3: keys must be a string or a list of strings"),
    (b'{"topic": "T", "body": "", "keys": {"a": "b"}}', "line 3: keys must be a string or a list of strings"),
    (b'{"topic": "T", "body": "", "keys": ["a b"]}', "line 3: key 'a b' contains a space; KEYS are space-separated"),
    (b'{"topic": "T", "body": "", "keys": ["a", ""]}', "line 3: a key is empty"),
    (b'{"topic": "T", "body": "", "properties": {"a": 1}}', "line 3: properties must be an object of strings"),
    (b'{"topic": "T", "body": "", "properties": ["a"]}', "line 3: properties must be an object of strings"),
    (b'{"topic": "T", "body": "", "properties": {"KEYS": "x"}}', "line 3: property KEYS is reserved; use the message's own fields"),
    (b'{"topic": "T", "body": "", "properties": {"a": ""}}',
     "line 3: property a has an empty value, which RocketMQ's format cannot keep"),
    (b'{"topic": "T", "body": "", "properties": {"": "v"}}', "line 3: a property name is empty"),
    (b'{"topic": "T", "body": "", "properties": {"a": "x\\u0001"}}',
     "line 3: property a contains a 0x01 or 0x02 character, which would corrupt the properties"),
    (b'{"topic": "T", "body": "", "other": 1}',
     "line 3: unknown field(s) ['other']; known: ['body', 'bodyBase64', 'keys', 'properties', 'queueId', 'tags', 'topic', 'uniqKey']"),
    (b'{"body": "no topic"}', "line 3: topic (a string) is required"),
    (b'{"topic": "T"}', 'line 3: give the body: body (text) or bodyBase64 (bytes) ("body": "" sends an empty one)'),
    (b'{"topic": "T", "keys": "a"}', 'line 3: give the body: body (text) or bodyBase64 (bytes) ("body": "" sends an empty one)'),
    (b"[]", "line 3: expected a JSON object"),
    (b'"text"', "line 3: expected a JSON object"),
    (b'{"topic": "bad topic", "body": ""}', "line 3: the topic name contains characters other than [%|a-zA-Z0-9_-]: 'bad topic'"),
    (b'{"topic": "T", "body": "", "uniqKey": "not-alnum"}', "line 3: uniq key must be 1-128 ASCII letters and digits"),
    (b'{"topic": "T", "body": "' + b"x" * (4 * 1024 * 1024 + 1) + b'"}', "line 3: body is 4194305 bytes; at most 4194304 allowed"),
    (b'{"topic": "T", "body": "", "keys": [' + b",".join(b'"k%d"' % n for n in range(33)) + b"]}", "line 3: 33 keys; at most 32 allowed"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=[message for _, message in BAD_LINES])
def test_each_error_names_its_line(tmp_path: Path, line: bytes, message: str) -> None:
    good = lines({"topic": "T", "bodyBase64": "aGk=", "properties": {"p": "v"}, "keys": "a b"})
    got = refusal(tmp_path, good + b"\n" + line + b"\n" + good)
    if "topic name" in message:
        assert got.startswith("line 3: ") and "bad topic" in got
    else:
        assert got == message


def test_the_first_bad_line_is_named_whatever_its_problem(tmp_path: Path) -> None:
    """A type error on line 2 comes before a line that is not JSON on line 3 and a rule
    broken on line 1 before both: the file is judged line by line, in order."""
    good = b'{"topic": "T", "body": ""}\n'
    assert refusal(tmp_path, good + b'{"topic": "T", "tags": 5}\n{"topic": \n') == "line 2: tags must be a string"
    assert refusal(tmp_path, b'{"topic": "T", "body": "", "keys": ["a b"]}\n{"topic": \n') == (
        "line 1: key 'a b' contains a space; KEYS are space-separated"
    )
    # Blank lines before it count: the line is the file's.
    data = good + b"\n \r\n" + lines({"topic": "T", "body": "", "keys": ["clé"]}, {"topic": "T", "body": "", "keys": ["a", "b c"]})
    assert refusal(tmp_path, data) == "line 5: key 'b c' contains a space; KEYS are space-separated"


def test_a_line_that_is_not_utf8_is_named_with_its_byte_in_the_file(tmp_path: Path) -> None:
    text = "".join(json.dumps({"topic": "T", "body": f"message {n}"}) + "\n" for n in range(40))
    path = tmp_path / "bad.jsonl"
    path.write_bytes(text.encode() + b"\n" + b'{"topic": "T", "body": "caf\xe9"}\n')
    offset = len(text.encode()) + 1 + len('{"topic": "T", "body": "caf')
    with pytest.raises(InvalidArgument) as error:
        send_file.read_file(str(path), LIMITS, {})
    assert str(error.value) == f"--file {path}: line 42 is not UTF-8 (invalid continuation byte at byte {offset})"


def test_the_shared_context_counts_against_each_messages_room(tmp_path: Path) -> None:
    """Checked as stored: a message's own properties with the send's trace context, which
    may tip it over what a record holds."""
    room = 32767 - 64 - 128 - 10  # about what a message may bring beside a long traceparent
    data = lines({"topic": "T", "body": "", "properties": {"big": "x" * room}})
    assert len(read(tmp_path, data)) == 1
    assert refusal(tmp_path, data, {"traceparent": "y" * 300}).startswith("line 1: properties take ")


def test_the_files_problems_of_its_own(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as error:
        send_file.read_file(str(tmp_path / "nope.jsonl"), LIMITS, {})
    assert str(error.value) == f"--file {tmp_path / 'nope.jsonl'}: No such file or directory"
    with pytest.raises(InvalidArgument) as error:
        send_file.read_file(str(tmp_path), LIMITS, {})
    assert str(error.value) == f"--file {tmp_path}: is a directory, not a JSONL file"


@pytest.mark.parametrize("bad", [False, True])
def test_a_pipe_is_read(tmp_path: Path, bad: bool) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = lines({"topic": "T", "body": "one"}, {"topic": "T", "bodyBase64": "dHdv"}) + (b'{"topic": "T", "x": 1}\n' if bad else b"")

    def feed() -> None:
        with open(fifo, "wb") as pipe:
            pipe.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        if bad:
            with pytest.raises(InvalidArgument) as error:
                send_file.read_file(str(fifo), LIMITS, {})
            assert str(error.value).startswith("line 3: unknown field(s) ['x']")
        else:
            assert send_file.read_file(str(fifo), LIMITS, {}).bodies == [b"one", b"two"]
    finally:
        feeder.join(timeout=10)
    assert not feeder.is_alive()


def test_ack_lines_are_json_objects_of_the_ack_fields_in_order() -> None:
    compact = writer_pb2.CompactResults(
        offset_msg_id_prefix="7F00000100002A9F", store_timestamp_ms=1_700_000_000_123, uniq_keys=["AB12", "", "C0A80001"],
        queue_ids=[0, 2147483647, 3], queue_offsets=[0, 9_000_000_000, 7], commitlog_offsets=[0, (1 << 40) + 255, 1 << 62],
    )  # fmt: skip
    topics = ["Orders", "%RETRY%g_1", "T"]
    text = send_file.ack_lines(compact, topics)
    assert text.endswith(b"\n") and text.count(b"\n") == 3
    acks = [json.loads(line) for line in text.splitlines()]
    assert all(list(ack) == list(send_file.ACK_FIELDS) for ack in acks)
    assert acks[1] == {
        "offsetMsgId": "7F00000100002A9F00000100000000FF", "uniqKey": "", "topic": "%RETRY%g_1", "queueId": 2147483647,
        "queueOffset": 9_000_000_000, "commitLogOffset": (1 << 40) + 255, "storeTimestamp": 1_700_000_000_123,
    }  # fmt: skip
    assert acks[2]["offsetMsgId"] == "7F00000100002A9F4000000000000000"
    assert send_file.ack_lines(writer_pb2.CompactResults(), []) == b""


json_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
plain_text = st.text(st.sampled_from("abcXYZ019_-"), min_size=1, max_size=8)
field_values = {
    "topic": st.one_of(plain_text, json_text, st.none(), st.integers(-3, 3)),
    "body": st.one_of(json_text, st.none(), st.integers()),
    "bodyBase64": st.one_of(st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()), json_text, st.none()),
    "keys": st.one_of(st.lists(st.one_of(plain_text, json_text), max_size=3), json_text, st.none()),
    "tags": st.one_of(plain_text, json_text, st.none()),
    "uniqKey": st.one_of(st.text(st.sampled_from("0123456789ABCDEFabcdef"), max_size=40), json_text, st.none()),
    "queueId": st.one_of(st.integers(-2, 2**31 + 1), st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    "properties": st.one_of(st.dictionaries(st.one_of(plain_text, json_text), st.one_of(plain_text, json_text, st.integers()), max_size=3), st.none()),
    "other": st.integers(),
}
documents = st.lists(
    st.fixed_dictionaries({}, optional=field_values).filter(lambda d: "other" not in d or len(d) > 1), min_size=1, max_size=6
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(documents, st.booleans(), st.integers(1, 4), st.booleans())
@example([{"topic": "T", "body": "\u2028\x7f\x00"}], True, 1, False)
@example([{"topic": "T", "keys": "a  b"}, {"topic": "T", "bodyBase64": "AAE="}, {"topic": "T", "body": "x"}], False, 2, True)
def test_the_columns_say_what_each_line_says_alone(
    tmp_path: Path, docs: list[dict[str, Any]], ascii_only: bool, batch_size: int, traced: bool
) -> None:
    """Whatever the lines: the file is refused with the line-by-line check's first error,
    or its requests store exactly the messages each line gives alone."""
    data = "".join(json.dumps(d, ensure_ascii=ascii_only) + "\n" for d in docs).encode()
    shared = CONTEXT if traced else {}
    try:
        send_file.first_problem("f", data.split(b"\n"), LIMITS, shared)
    except InvalidArgument as error:
        assert refusal(tmp_path, data, shared) == str(error)
        return
    assert stored(sent(read(tmp_path, data, shared), batch_size, shared)) == expected(data, shared)
