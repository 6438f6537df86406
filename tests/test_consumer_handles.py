"""Receipt handles on the writer's consumer groups: the handles a writer gives out now
(version 2, keyed BLAKE2b), the ones writers gave out before (version 1, HMAC-SHA256: a
client holding one across the upgrade can still acknowledge it), and forgeries of either.

Real parts: a writer's store in a temporary directory, messages appended to it, the
group's receive and acknowledgement as the gateway calls them; the secret read back from
the state file a flush wrote, as a writer restarted on the store reads it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest
from support.stores import SMALL

from rmqstore.writer.config import WriterConfig
from rmqstore.writer.consumers import (
    STATE_FILE_NAME,
    ConsumerGroups,
    InvalidReceiptHandle,
    Picked,
    TagFilter,
    parse_state,
)
from rmqstore.writer.store import Writer
from rmqstore.writer.validate import MessageInput

GROUP, TOPIC = "audit", "Orders"


def _received(tmp_path: Path, count: int) -> tuple[Writer, ConsumerGroups, list[Picked]]:
    writer = Writer(WriterConfig(store=str(tmp_path / "store"), sizes=SMALL))
    writer.topics.create(TOPIC, 1)
    writer.append([MessageInput(topic=TOPIC, body=b"m%d" % n, queue_id=0) for n in range(count)])
    groups = ConsumerGroups(writer, writer.paths.config)
    picked, dead = groups.receive(GROUP, TOPIC, [0], count, 30_000, TagFilter.parse("*"))
    assert len(picked) == count and not dead
    return writer, groups, picked


def _v1_handle(secret: bytes, group: str, one: Picked, nonce: int) -> str:
    """A handle as version 1 made it: the payload, then 16 bytes of HMAC-SHA256."""
    payload = f"1 {group} {TOPIC} {one.queue_id} {one.queue_offset} {nonce}".encode()
    mac = hmac.new(secret, payload, hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(payload + mac).decode().rstrip("=")


def _payload(handle: str) -> list[str]:
    raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    return raw[:-16].decode().split(" ")


def test_handles_are_version_2_and_a_version_1_handle_of_the_same_delivery_is_taken(tmp_path: Path) -> None:
    writer, groups, picked = _received(tmp_path, 3)
    try:
        groups.flush()
        secret = bytes.fromhex(parse_state((Path(writer.paths.config) / STATE_FILE_NAME).read_text())["secret"])
        nonces = []
        for one in picked:
            version, group, topic, queue_id, offset, nonce = _payload(one.receipt_handle)
            assert (version, group, topic, int(queue_id), int(offset)) == ("2", GROUP, TOPIC, 0, one.queue_offset)
            nonces.append(int(nonce))
        assert len(set(nonces)) == 3 and all(0 <= n < 2**62 for n in nonces)
        groups.ack(GROUP, TOPIC, _v1_handle(secret, GROUP, picked[0], nonces[0]))
        assert groups.committed(GROUP, TOPIC, 0) == 1
        # Version 1 still binds the handle to its delivery, its group and the secret.
        with pytest.raises(InvalidReceiptHandle, match="stale"):
            groups.ack(GROUP, TOPIC, _v1_handle(secret, GROUP, picked[1], nonces[1] ^ 1))
        with pytest.raises(InvalidReceiptHandle, match="not one this writer gave out"):
            groups.ack(GROUP, TOPIC, _v1_handle(b"\0" * 32, GROUP, picked[1], nonces[1]))
        with pytest.raises(InvalidReceiptHandle, match="for group other"):
            groups.ack(GROUP, TOPIC, _v1_handle(secret, "other", picked[1], nonces[1]))
        groups.ack(GROUP, TOPIC, picked[1].receipt_handle)
        groups.ack(GROUP, TOPIC, picked[2].receipt_handle)
        assert groups.committed(GROUP, TOPIC, 0) == 3
    finally:
        writer.close()


@pytest.mark.parametrize("where", ["payload", "mac"])
def test_a_version_2_handle_changed_anywhere_is_refused(tmp_path: Path, where: str) -> None:
    writer, groups, picked = _received(tmp_path, 1)
    try:
        raw = bytearray(base64.urlsafe_b64decode(picked[0].receipt_handle + "=" * (-len(picked[0].receipt_handle) % 4)))
        at = len(raw) - 20 if where == "payload" else len(raw) - 1  # the payload's nonce, or the MAC
        raw[at] ^= 1
        changed = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
        with pytest.raises(InvalidReceiptHandle, match="not one this writer gave out"):
            groups.ack(GROUP, TOPIC, changed)
        groups.ack(GROUP, TOPIC, picked[0].receipt_handle)
        assert groups.committed(GROUP, TOPIC, 0) == 1
    finally:
        writer.close()
