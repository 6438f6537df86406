"""config/consumerOffset.json in Apache RocketMQ 4.9's layout: read with bare integer keys
(what the broker's fastjson writes) or quoted ones, written in the broker's own shape,
replaced atomically with a .bak copy that is read when the main file is damaged."""

from __future__ import annotations

import os

import pytest

from rmqstore.common.errors import Corruption
from rmqstore.common.files import consumer_offsets as co

# The shape Apache's broker writes (ConsumerOffsetManager through fastjson, pretty printed).
APACHE_TEXT = (
    "{\n"
    '\t"offsetTable":{\n'
    '\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0\n'
    "\t\t},\n"
    '\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:250,2:250,3:249\n'
    "\t\t}\n"
    "\t}\n"
    "}"
)
APACHE_TABLE = {
    ("%RETRY%please_rename_unique_group_name_4", "please_rename_unique_group_name_4"): {0: 0},
    ("TopicTest", "please_rename_unique_group_name_4"): {0: 250, 1: 250, 2: 250, 3: 249},
}


def test_parses_apaches_bare_integer_keys() -> None:
    assert co.parse_offsets(APACHE_TEXT) == APACHE_TABLE


def test_renders_apaches_layout_byte_for_byte() -> None:
    assert co.render_offsets(APACHE_TABLE) == APACHE_TEXT


def test_parses_quoted_keys_and_leaves_digits_in_names_alone() -> None:
    text = '{"offsetTable":{"T1,2:3@G{4:5}":{"7":8}}}'
    assert co.parse_offsets(text) == {("T1,2:3", "G{4:5}"): {7: 8}}


def test_empty_table_round_trips() -> None:
    assert co.render_offsets({}) == '{\n\t"offsetTable":{}\n}'
    assert co.parse_offsets(co.render_offsets({})) == {}
    assert co.parse_offsets('{"offsetTable":null}') == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not readable JSON"),
        ("[]", "is not an object with an offsetTable"),
        ('{"offsetTable":[]}', "offsetTable is not an object"),
        ('{"offsetTable":{"nogroup":{0:1}}}', "key 'nogroup' is not topic@group"),
        ('{"offsetTable":{"a@b@c":{0:1}}}', "key 'a@b@c' is not topic@group"),
        ('{"offsetTable":{"t@g":5}}', "t@g is not an object of queue offsets"),
        ('{"offsetTable":{"t@g":{"x":1}}}', "queue id 'x' is not an integer"),
        ('{"offsetTable":{"t@g":{0:"1"}}}', "queue 0: offset '1' is not an integer"),
        ('{"offsetTable":{"t@g":{0:true}}}', "queue 0: offset True is not an integer"),
    ],
)
def test_malformed_tables_are_refused_naming_the_fault(text: str, message: str) -> None:
    with pytest.raises(Corruption, match=message.replace("[", r"\[")):
        co.parse_offsets(text, path="consumerOffset.json")


def test_write_then_read_keeps_the_previous_file_as_bak(tmp_path: os.PathLike[str]) -> None:
    config = os.path.join(tmp_path, "config")
    assert co.read_offsets(config) == {}
    first = {("T", "g"): {0: 1}}
    second = {("T", "g"): {0: 2, 1: 5}}
    co.write_offsets(config, first)
    co.write_offsets(config, second)
    assert co.read_offsets(config) == second
    with open(co.path_in(config) + ".bak", encoding="utf-8") as handle:
        assert handle.read() == co.render_offsets(first)
    assert sorted(os.listdir(config)) == ["consumerOffset.json", "consumerOffset.json.bak"]


def test_a_damaged_main_file_falls_back_to_bak_and_both_damaged_is_corruption(tmp_path: os.PathLike[str]) -> None:
    config = str(tmp_path)
    co.write_offsets(config, {("T", "g"): {0: 1}})
    co.write_offsets(config, {("T", "g"): {0: 2}})
    with open(co.path_in(config), "w", encoding="utf-8") as handle:
        handle.write('{"offsetTable":{"T@g":{0:')  # torn by a crash of another writer
    assert co.read_offsets(config) == {("T", "g"): {0: 1}}
    with open(co.path_in(config) + ".bak", "wb") as handle:
        handle.write(b"\xff\xfe")
    with pytest.raises(Corruption, match=r"consumerOffset\.json is not readable JSON"):
        co.read_offsets(config)
