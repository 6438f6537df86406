"""Golden vectors from docs/format.md, each reproduced there with Apache RocketMQ's own classes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from rmqstore.common.codec import index as ix
from rmqstore.common.codec.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from rmqstore.common.codec.consumequeue import (
    FILLER,
    decode_unit,
    deliver_timestamp,
    encode_unit,
    parse_delay_levels,
    tags_code,
)
from rmqstore.common.codec.dispatch import plan_dispatch
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.javahash import index_key_hash, java_hashmap_order, java_string_hash
from rmqstore.common.codec.msgid import (
    UniqKey,
    decode_offset_msg_id,
    decode_uniq_key,
    encode_uniq_key,
    nearly_time_from_id,
    offset_msg_id,
    uniq_key_time_field,
)
from rmqstore.common.codec.properties import decode_properties, encode_properties
from rmqstore.common.codec.record import (
    Blank,
    Record,
    body_crc,
    decode_record,
    encode_blank,
    encode_record,
    record_size,
)
from rmqstore.common.codec.topic import topic_problem
from rmqstore.common.errors import InvalidArgument
from rmqstore.common.files.index import IndexFile

# docs/format.md §3.2, as printed there (16 bytes a row).
WORKED_RECORD = bytes.fromhex(
    """
    00 00 00 bf da a3 20 a7 69 c8 65 ed 00 00 00 03
    00 00 00 00 00 00 00 00 00 00 00 07 00 00 00 00
    00 00 10 00 00 00 00 00 00 00 01 8b cf e5 68 00
    0a 00 00 02 00 00 c3 50 00 00 01 8b cf e5 68 7b
    0a 00 00 01 00 00 2a 9f 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 0e 48 65 6c 6c 6f 20 52 6f
    63 6b 65 74 4d 51 09 54 6f 70 69 63 54 65 73 74
    00 4d 4b 45 59 53 01 4f 72 64 65 72 49 44 31 38
    38 02 55 4e 49 51 5f 4b 45 59 01 30 41 30 30 30
    30 30 31 30 30 30 30 32 41 39 46 30 30 30 30 30
    30 30 30 30 30 30 30 31 30 30 30 02 57 41 49 54
    01 74 72 75 65 02 54 41 47 53 01 54 61 67 41
    """
)


def worked_record() -> Record:
    return Record(
        topic="TopicTest",
        body=b"Hello RocketMQ",
        properties={
            "KEYS": "OrderID188",
            "UNIQ_KEY": "0A00000100002A9F0000000000001000",
            "WAIT": "true",
            "TAGS": "TagA",
        },
        queue_id=3,
        queue_offset=7,
        commitlog_offset=4096,
        born_timestamp_ms=1700000000000,
        born_host=SocketAddress.parse("10.0.0.2:50000"),
        store_timestamp_ms=1700000000123,
        store_host=SocketAddress.parse("10.0.0.1:10911"),
    )


class TestJavaHash:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("TopicTest#OrderID188", -1231271670),
            ("TopicTest#订单-42", -609834538),
            ("TopicTest#\U0001F680", 4515685),
            ("polygenelubricants", -2147483648),
            ("TopicTest#KU8JAAYHLHI", -2147483648),
            ("TagA", 2598919),
            ("Order_Paid", -1546173091),
            ("TagA||TagB", 1789476431),
            ("", 0),
        ],
    )
    def test_string_hash_over_utf16_units(self, text: str, expected: int) -> None:
        assert java_string_hash(text) == expected

    def test_utf8_bytes_would_be_wrong(self) -> None:
        # Hashing UTF-8 bytes gives −794260776 for this key (docs/format.md §7.2); we must not.
        assert java_string_hash("TopicTest#订单-42") != -794260776

    def test_surrogate_pair_counts_two_units(self) -> None:
        assert java_string_hash("\U0001F680") == 0xD83D * 31 + 0xDE80

    @pytest.mark.parametrize(
        ("key", "key_hash", "slot", "slot_position"),
        [
            ("TopicTest#OrderID188", 1231271670, 1271670, 5_086_720),
            ("TopicTest#订单-42", 609834538, 4834538, 19_338_192),
            ("TopicTest#\U0001F680", 4515685, 4515685, 18_062_780),
            ("polygenelubricants", 0, 0, 40),
            ("TopicTest#KU8JAAYHLHI", 0, 0, 40),
        ],
    )
    def test_index_key_hash_and_slot(self, key: str, key_hash: int, slot: int, slot_position: int) -> None:
        assert index_key_hash(key) == key_hash
        assert key_hash % ix.DEFAULT_SLOTS == slot
        assert ix.slot_position(slot) == slot_position

    def test_fixture_min_value_key(self) -> None:
        # fixtures README: "TopicTest#minhash-垊丈丈万丌" hashes to Integer.MIN_VALUE.
        assert java_string_hash("TopicTest#minhash-垊丈丈万丌") == -(2**31)
        assert index_key_hash("TopicTest#minhash-垊丈丈万丌") == 0

    def test_equal_hash_keys(self) -> None:
        assert len({java_string_hash(k) for k in ("AaAa", "BBBB", "AaBB", "BBAa")}) == 1

    def test_hashmap_order_matches_broker_properties(self) -> None:
        # The order of the four properties in the worked record (docs/format.md §3.2) and a
        # broker-written fixture record (manifest seq 0).
        assert java_hashmap_order(["TAGS", "KEYS", "WAIT", "UNIQ_KEY"]) == ["KEYS", "UNIQ_KEY", "WAIT", "TAGS"]
        assert java_hashmap_order(["TAGS", "KEYS", "UNIQ_KEY", "CLUSTER"]) == ["KEYS", "UNIQ_KEY", "CLUSTER", "TAGS"]


class TestCrc:
    def test_masked_to_31_bits(self) -> None:
        assert body_crc(b"Hello RocketMQ") == 0x69C865ED
        assert body_crc(b"Hello") == 0x77D18982  # raw CRC-32 is F7D18982
        assert body_crc(b"") == 0


class TestRecord:
    def test_worked_record_bytes(self) -> None:
        encoded = encode_record(worked_record())
        assert encoded == WORKED_RECORD
        assert len(encoded) == 191

    def test_worked_record_decodes(self) -> None:
        decoded = decode_record(WORKED_RECORD)
        assert isinstance(decoded, Record)
        expected = worked_record()
        expected.body_crc = 0x69C865ED
        expected.size = 191
        assert decoded == expected
        assert plan_dispatch(decoded).tags_code == 2598919

    def test_size_rule(self) -> None:
        assert record_size(0, 0, 0, born_v6=False, store_v6=False) == 91
        assert record_size(0, 0, 0, born_v6=True, store_v6=True) == 115
        assert record_size(0, 0, 0, born_v6=False, store_v6=False, version=2) == 92

    def test_ipv6_hosts_set_sysflag_bits(self) -> None:
        record = worked_record()
        record.born_host = SocketAddress.parse("[2001:db8::2]:50000")
        record.store_host = SocketAddress.parse("[::1]:10911")
        encoded = encode_record(record)
        assert len(encoded) == 191 + 24
        decoded = decode_record(encoded)
        assert isinstance(decoded, Record)
        assert decoded.sys_flag == 0x30
        assert decoded.born_host.java_text() == "2001:db8:0:0:0:0:0:2:50000"
        assert decoded.store_host.java_text() == "0:0:0:0:0:0:0:1:10911"

    def test_v2_record_decodes_with_two_byte_topic_length(self) -> None:
        v1 = bytearray(encode_record(worked_record()))
        topic_at = 88 + 14
        v2 = bytearray(v1[:topic_at]) + b"\x00" + v1[topic_at:]
        v2[0:4] = (192).to_bytes(4, "big")
        v2[4:8] = bytes.fromhex("DAA320AB")
        decoded = decode_record(bytes(v2))
        assert isinstance(decoded, Record)
        assert (decoded.version, decoded.topic, decoded.size) == (2, "TopicTest", 192)

    def test_blank_record(self) -> None:
        # docs/format.md §3.4 example: 100 bytes left and a 93-byte record.
        assert encode_blank(100) == bytes.fromhex("00000064CBD43194")
        assert decode_record(encode_blank(100) + bytes(92), 0, commitlog_offset=524188) == Blank(524188, 100)

    def test_zeros_are_the_end(self) -> None:
        assert decode_record(bytes(64)) is None

    def test_topic_too_long_for_v1(self) -> None:
        record = worked_record()
        record.topic = "t" * 128
        with pytest.raises(InvalidArgument, match="128 bytes"):
            encode_record(record)

    def test_properties_too_long(self) -> None:
        record = worked_record()
        record.properties = {"X": "v" * 32766}
        with pytest.raises(InvalidArgument, match="32768 bytes"):
            encode_record(record)


class TestProperties:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("KEYS\x01k1 k2\x02EMPTY\x01\x02X\x01a\x01b", {"KEYS": "k1 k2", "X": "a\x01b"}),
            ("A\x01b\x02", {"A": "b"}),
            ("\x01v\x02B\x01c", {"B": "c"}),
            ("AB\x02C\x01d", {"C": "d"}),
            ("", {}),
            ("A\x01x\x02A\x01y", {"A": "y"}),
        ],
    )
    def test_apache_reader_vectors(self, text: str, expected: dict[str, str]) -> None:
        assert decode_properties(text.encode()) == expected

    def test_writer_drops_final_separator(self) -> None:
        assert encode_properties({"A": "1", "B": "2"}) == b"A\x011\x02B\x012"


class TestMessageIds:
    def test_offset_msg_id_v4(self) -> None:
        host = SocketAddress.parse("10.0.0.1:10911")
        assert offset_msg_id(host, 4096) == "0A00000100002A9F0000000000001000"
        decoded = decode_offset_msg_id("0a00000100002a9f0000000000001000")
        assert (decoded.store_host, decoded.commitlog_offset) == (host, 4096)

    def test_offset_msg_id_v6(self) -> None:
        host = SocketAddress.parse("[::1]:10911")
        msg_id = "0000000000000000000000000000000100002A9F0000000000001000"
        assert offset_msg_id(host, 4096) == msg_id
        assert decode_offset_msg_id(msg_id).store_host == host

    def test_uniq_key_read_as_msg_id_is_rejected(self) -> None:
        # docs/format.md §15: this UNIQ_KEY's "port" would be 809048941.
        with pytest.raises(InvalidArgument, match="809048941"):
            decode_offset_msg_id("0A00000130391B6D3586075BCD15002A")

    @pytest.mark.parametrize("bad", ["", "ABC", "0A00000100002A9F000000000000100", "ZZ00000100002A9F0000000000001000"])
    def test_bad_msg_ids(self, bad: str) -> None:
        with pytest.raises(InvalidArgument):
            decode_offset_msg_id(bad)

    def test_uniq_key_layout(self) -> None:
        key = UniqKey(bytes([10, 0, 0, 1]), 12345, 0x1B6D3586, 123456789, 42)
        assert encode_uniq_key(key) == "0A00000130391B6D3586075BCD15002A"
        assert decode_uniq_key("0A00000130391B6D3586075BCD15002A") == key

    def test_uniq_key_time_is_unsigned(self) -> None:
        # 25 days = 2160000000 ms = 80BEFC00, past int32.
        key = UniqKey(bytes(4), 1, 2, 2_160_000_000, 3)
        text = encode_uniq_key(key)
        assert text[20:28] == "80BEFC00"
        assert decode_uniq_key(text).time_since_month_ms == 2_160_000_000

    def test_uniq_key_time_clock_stepped_back(self) -> None:
        assert uniq_key_time_field(1000, 500_000) == 0
        assert uniq_key_time_field(5000, 1000) == 4000

    def test_nearly_time_from_id(self) -> None:
        # docs/format.md §5.2: span 1232000123 (496ED47B) from a UTC+8 producer.
        uniq = encode_uniq_key(UniqKey(bytes(4), 0, 0, 1_232_000_123, 0))
        assert uniq[20:28] == "496ED47B"
        shanghai = ZoneInfo("Asia/Shanghai")
        utc = ZoneInfo("UTC")
        sent = 1700000000123
        assert nearly_time_from_id(uniq, sent + 60_000, shanghai) == sent
        assert nearly_time_from_id(uniq, sent + 9 * 3_600_000, utc) == 1700028800123
        assert nearly_time_from_id(uniq, sent + 60_000, utc) == 1697350400123

    def test_fixture_uniq_key_is_ipv6(self) -> None:
        decoded = decode_uniq_key("FD0000000000000000000000000000025E0B5FFD2B276CCCF5720000")
        assert SocketAddress(decoded.ip, 0).host_text() == "fd00:0:0:0:0:0:0:2"
        assert decoded.counter == 0


class TestConsumeQueueCodec:
    def test_worked_unit(self) -> None:
        assert encode_unit(4096, 191, tags_code("TagA")).hex().upper() == "0000000000001000000000BF000000000027A807"

    def test_negative_tags_code_sign_extends(self) -> None:
        assert encode_unit(0, 1, tags_code("Order_Paid"))[12:].hex().upper() == "FFFFFFFFA3D7455D"

    def test_filler(self) -> None:
        assert FILLER.hex().upper() == "00000000000000007FFFFFFF0000000000000000"
        unit = decode_unit(FILLER)
        assert unit.is_filler and unit.is_valid

    def test_empty_tags(self) -> None:
        assert tags_code(None) == 0 and tags_code("") == 0

    def test_delay_deliver_time(self) -> None:
        levels = parse_delay_levels()
        assert len(levels) == 18 and levels[18] == 7_200_000
        assert deliver_timestamp(3, 1700000000123, levels) == 1700000010123
        assert encode_unit(0, 1, deliver_timestamp(3, 1700000000123, levels))[12:].hex().upper() == "0000018BCFE58F8B"


class TestIndexCodec:
    def test_file_size(self) -> None:
        assert ix.file_size(ix.DEFAULT_SLOTS, ix.DEFAULT_ENTRIES) == 420_000_040
        assert ix.file_size(500, 1500) == 32040

    def test_file_names(self) -> None:
        assert ix.file_name(1700000000123, dt.UTC) == "20231114221320123"
        assert ix.file_name(1700000000123, ZoneInfo("Asia/Shanghai")) == "20231115061320123"

    def test_time_diff(self) -> None:
        assert ix.time_diff_s(1700000002623, 1700000000123) == 2
        assert ix.time_diff_s(1700000000000, 1700000000123) == 0
        assert ix.time_diff_s(5, 0) == 0
        assert ix.time_diff_s(2**62, 1) == 2**31 - 1

    def test_worked_example_full_size_file(self, tmp_path: Path) -> None:
        """docs/format.md §7.3 on a full-size (sparse) 420,000,040-byte file."""
        index_file = IndexFile.create(
            str(tmp_path / "20231114221320123"),
            ix.DEFAULT_SLOTS,
            ix.DEFAULT_ENTRIES,
            prev_end_phy_offset=0,
            prev_end_timestamp_ms=0,
        )
        key_hash = index_key_hash("TopicTest#OrderID188")
        buf = index_file.mapped.buf
        assert index_file.put_key(key_hash, 4096, 1700000000123)
        assert bytes(buf[5_086_720:5_086_724]).hex() == "00000001"
        assert bytes(buf[20_000_060:20_000_080]).hex().upper() == "4963B6F6" "0000000000001000" "00000000" "00000000"
        assert bytes(buf[:40]).hex().upper() == (
            "0000018BCFE5687B" "0000018BCFE5687B" "0000000000001000" "0000000000001000" "00000001" "00000002"
        )
        assert index_file.put_key(key_hash, 4287, 1700000002623)
        assert bytes(buf[5_086_720:5_086_724]).hex() == "00000002"
        assert bytes(buf[20_000_080:20_000_100]).hex().upper() == "4963B6F6" "00000000000010BF" "00000002" "00000001"
        assert bytes(buf[:40]).hex().upper() == (
            "0000018BCFE5687B" "0000018BCFE5723F" "0000000000001000" "00000000000010BF" "00000001" "00000003"
        )
        # Entry 2 decodes 500 ms early (second rounding): a query from 1700000002200 misses it.
        out: list[int] = []
        index_file.select_phy_offsets(key_hash, 64, 1700000002200, 2**63 - 1, out)
        assert out == []
        index_file.select_phy_offsets(key_hash, 64, 0, 2**63 - 1, out)
        assert out == [4287, 4096]
        index_file.close()

    def test_rolled_over_first_entry_time_quirk(self, tmp_path: Path) -> None:
        """docs/format.md §15 flaw 3a, reproduced byte for byte: the first entry of a rolled
        file gets timeDiff 2 against the previous file's end."""
        index_file = IndexFile.create(
            str(tmp_path / "x"), 500, 1500, prev_end_phy_offset=4096, prev_end_timestamp_ms=1700000000123
        )
        assert index_file.put_key(7, 5000, 1700000002623)
        header = index_file.header
        assert header.begin_timestamp_ms == 1700000002623
        assert index_file.entry(1).time_diff_s == 2
        index_file.close()


class TestCheckpoint:
    def test_example(self) -> None:
        checkpoint = Checkpoint(1700000000123, 1700000000000, 0)
        data = encode_checkpoint(checkpoint)
        assert len(data) == 4096
        assert data[:24].hex().upper() == "0000018BCFE5687B0000018BCFE568000000000000000000"
        assert not any(data[24:])
        assert decode_checkpoint(data) == checkpoint
        assert checkpoint.min_timestamp_ms == 1700000000000 - 3000


class TestTopics:
    @pytest.mark.parametrize("topic", ["TopicTest", "Pay_Events-2", "%RETRY%group", "a|b", "x" * 127])
    def test_valid(self, topic: str) -> None:
        assert topic_problem(topic) is None

    @pytest.mark.parametrize(
        ("topic", "why"),
        [
            ("", "blank"),
            ("   ", "blank"),
            ("x" * 128, "128 characters"),
            ("../etc", "outside"),
            ("a/b", "outside"),
            ("..", "outside"),
            ("订单", "outside"),
            ("a b", "outside"),
        ],
    )
    def test_invalid(self, topic: str, why: str) -> None:
        problem = topic_problem(topic)
        assert problem is not None and why in problem
