"""Consumer groups' progress in ``config/consumerOffset.json``, in Apache RocketMQ 4.9's layout.

Apache's broker (ConsumerOffsetManager, persisted through fastjson with pretty printing)
keeps one table: ``"topic@group"`` → queue id → the next offset the group will consume.
fastjson writes the queue ids as bare integers (``{0:250,1:250}``), which is not JSON; the
broker reads quoted keys as well. We write the broker's own shape, so that a store moved to
Apache's broker keeps its groups' positions, and read both shapes.

Like the broker, a replaced file is kept as ``consumerOffset.json.bak`` and read when the
main file is missing or does not decode (the broker's ConfigManager falls back the same way).
"""

from __future__ import annotations

import json
import os
import re

from rmqstore.common.errors import Corruption
from rmqstore.common.files.config_file import read_keeping_backup, replace_keeping_backup

FILE_NAME = "consumerOffset.json"
# MixAll.TOPIC_GROUP_SEPARATOR: topic and group names cannot hold it (their charset is
# letters, digits, %, |, _ and -), so one split is unambiguous.
SEPARATOR = "@"

# (topic, group) → {queue id: next offset to consume}
OffsetTable = dict[tuple[str, str], dict[int, int]]

# A JSON string (skipped as is) or an unquoted integer object key (quoted): strings come
# first in the alternation, so digits inside a name are never touched.
_KEY_OR_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|(?<=[{,])(\s*)(-?\d+)(\s*):')


def path_in(config_dir: str) -> str:
    return os.path.join(config_dir, FILE_NAME)


def quote_integer_keys(text: str) -> str:
    """fastjson's bare integer object keys quoted, so that the text reads as JSON."""

    def quoted(match: re.Match[str]) -> str:
        if match.group(2) is None:
            return match.group(0)
        return f'{match.group(1)}"{match.group(2)}"{match.group(3)}:'

    return _KEY_OR_STRING.sub(quoted, text)


def parse_offsets(text: str, *, path: str = FILE_NAME) -> OffsetTable:
    """The table in a consumerOffset.json's text (Apache's bare integer keys or quoted ones).
    Raises Corruption naming what does not fit."""
    try:
        document = json.loads(quote_integer_keys(text))
    except ValueError as error:
        raise Corruption(f"{path} is not readable JSON: {error}", path=path) from None
    if not isinstance(document, dict):
        raise Corruption(f"{path} is not an object with an offsetTable", path=path)
    raw = document.get("offsetTable", {})
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise Corruption(f"{path}: offsetTable is not an object", path=path)
    table: OffsetTable = {}
    for topic_at_group, queues in raw.items():
        topic, separator, group = str(topic_at_group).partition(SEPARATOR)
        if not separator or not topic or not group or SEPARATOR in group:
            raise Corruption(f"{path}: key {topic_at_group!r} is not topic@group", path=path)
        if not isinstance(queues, dict):
            raise Corruption(f"{path}: {topic_at_group} is not an object of queue offsets", path=path)
        offsets: dict[int, int] = {}
        for queue, offset in queues.items():
            try:
                queue_id = int(queue)
            except ValueError:
                raise Corruption(f"{path}: {topic_at_group}: queue id {queue!r} is not an integer", path=path) from None
            if isinstance(offset, bool) or not isinstance(offset, int) or queue_id < 0:
                raise Corruption(f"{path}: {topic_at_group}: queue {queue}: offset {offset!r} is not an integer", path=path)
            offsets[queue_id] = offset
        table[(topic, group)] = offsets
    return table


def render_offsets(table: OffsetTable) -> str:
    """Apache's pretty-printed layout: tabs, one ``"topic@group"`` a line, bare queue ids,
    the closing brace of a non-empty table on a line of its own, no final newline."""
    if not table:
        return '{\n\t"offsetTable":{}\n}'
    lines = []
    for (topic, group), offsets in sorted(table.items()):
        queues = ",".join(f"{queue}:{offset}" for queue, offset in sorted(offsets.items()))
        closing = "\n\t\t}" if offsets else "}"
        lines.append(f'\t\t"{topic}{SEPARATOR}{group}":{{{queues}{closing}')
    return '{\n\t"offsetTable":{\n' + ",\n".join(lines) + "\n\t}\n}"


def read_offsets(config_dir: str) -> OffsetTable:
    """The store's group offsets: {} for a store without the file; the ``.bak`` copy when the
    main file is missing or does not decode; Corruption when neither decodes."""
    read = read_keeping_backup(path_in(config_dir), lambda text, candidate: parse_offsets(text, path=candidate))
    return {} if read is None else read


def write_offsets(config_dir: str, table: OffsetTable) -> None:
    """Replace the file atomically (temporary file, fsync, rename, fsync of the directory),
    keeping the previous one as ``.bak`` as the broker does."""
    replace_keeping_backup(config_dir, path_in(config_dir), render_offsets(table))
