"""The delay levels' delivery progress in ``config/delayOffset.json``, Apache RocketMQ 4.9's file.

Apache's ScheduleMessageService keeps, per delay level, the offset in its
SCHEDULE_TOPIC_XXXX queue (level − 1) of the next message to deliver, persisted through
fastjson with bare integer keys and pretty printing: ``{\\n\\t"offsetTable":{1:4,2:3\\n\\t}\\n}``.
We write that shape (a store moved to Apache's broker resumes its deliveries where ours
stopped) and read it, quoted keys too, falling back to ``.bak`` as the broker does.
"""

from __future__ import annotations

import json
import os

from rmqstore.common.errors import Corruption
from rmqstore.common.files.config_file import read_keeping_backup, replace_keeping_backup
from rmqstore.common.files.consumer_offsets import quote_integer_keys

FILE_NAME = "delayOffset.json"

DelayOffsets = dict[int, int]  # delay level → next SCHEDULE_TOPIC_XXXX queue offset to deliver


def path_in(config_dir: str) -> str:
    return os.path.join(config_dir, FILE_NAME)


def parse_delay_offsets(text: str, *, path: str = FILE_NAME) -> DelayOffsets:
    """The table in a delayOffset.json's text. Raises Corruption naming what does not fit."""
    try:
        document = json.loads(quote_integer_keys(text))
    except ValueError as error:
        raise Corruption(f"{path} is not readable JSON: {error}", path=path) from None
    raw = document.get("offsetTable") if isinstance(document, dict) else None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise Corruption(f"{path}: offsetTable is not an object", path=path)
    table: DelayOffsets = {}
    for level, offset in raw.items():
        try:
            number = int(level)
        except ValueError:
            raise Corruption(f"{path}: delay level {level!r} is not an integer", path=path) from None
        if number < 1 or isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise Corruption(f"{path}: level {level}: offset {offset!r} is not a queue offset", path=path)
        table[number] = offset
    return table


def render_delay_offsets(table: DelayOffsets) -> str:
    """fastjson's pretty-printed layout, as Apache writes it (the fixture's file, byte for byte)."""
    entries = ",".join(f"{level}:{offset}" for level, offset in sorted(table.items()))
    if not table:
        return '{\n\t"offsetTable":{}\n}'
    return '{\n\t"offsetTable":{' + entries + "\n\t}\n}"


def read_delay_offsets(config_dir: str) -> DelayOffsets:
    """{} for a store without the file; the ``.bak`` copy when the main file is missing or
    does not decode; Corruption when neither decodes."""
    read = read_keeping_backup(path_in(config_dir), lambda text, candidate: parse_delay_offsets(text, path=candidate))
    return {} if read is None else read


def write_delay_offsets(config_dir: str, table: DelayOffsets) -> None:
    """Replace the file atomically, the previous one kept as ``.bak``."""
    replace_keeping_backup(config_dir, path_in(config_dir), render_delay_offsets(table))
