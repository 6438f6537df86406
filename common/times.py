"""Times as people write and read them: the one syntax every command, the console and the
pipeline take where a time is an argument, and the one way they print a time for people.

A time is written as

* epoch milliseconds: a whole number (``1795941216871``);
* ISO 8601, with or without a zone: ``2026-11-29``, ``2026-11-29T04:12``,
  ``2026-11-29T04:12:00.123Z``, ``2026-11-29 05:12:00+01:00`` (no zone: UTC);
* mqadmin's ``yyyy-MM-dd#HH:mm:ss:SSS`` (``2026-11-29#04:12:00:000``), in local time as
  mqadmin reads it.

For people a time is printed as ISO 8601 to the millisecond, in UTC (``…Z``) or in local
time with its offset, so that what is printed can be given back as an argument. JSON keeps
epoch milliseconds.
"""

from __future__ import annotations

import datetime as dt
import re

from rmqstore.common.errors import InvalidArgument

# The largest time a store or a request carries (a Java long of milliseconds).
EPOCH_MS_MAX = 2**63 - 1
MQADMIN_FORMAT = "%Y-%m-%d#%H:%M:%S:%f"
_MQADMIN = re.compile(r"\d{4}-\d{2}-\d{2}#\d{2}:\d{2}:\d{2}:\d{3}")
# What a time argument's error shows, after the text it could not read.
SYNTAX = (
    "give epoch milliseconds, ISO 8601 (2026-11-29T04:12:00Z; UTC without a zone) "
    "or mqadmin's yyyy-MM-dd#HH:mm:ss:SSS (local time)"
)


def parse_time_ms(text: str) -> int:
    """``text`` as epoch milliseconds; InvalidArgument saying what it accepts otherwise."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        value = int(text)
        if value > EPOCH_MS_MAX:
            raise InvalidArgument(f"{text!r} is past the largest time, {EPOCH_MS_MAX} ms")
        return value
    if _MQADMIN.fullmatch(text):
        try:
            moment = dt.datetime.strptime(text, MQADMIN_FORMAT)
        except ValueError:
            raise InvalidArgument(f"{text!r} is not a time: {SYNTAX}") from None
        moment = moment.astimezone()  # local time, as mqadmin
    else:
        try:
            moment = dt.datetime.fromisoformat(text)
        except ValueError:
            raise InvalidArgument(f"{text!r} is not a time: {SYNTAX}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
    # Whole seconds through the float timestamp, milliseconds added exactly.
    value = int(moment.replace(microsecond=0).timestamp()) * 1000 + moment.microsecond // 1000
    if value < 0:
        raise InvalidArgument(f"{text!r} is before 1970-01-01T00:00:00Z, the earliest time")
    return value


def iso_time(epoch_ms: int, *, local: bool = False) -> str:
    """``epoch_ms`` as ISO 8601 to the millisecond: UTC as ``…Z``, or (``local``) local
    time with its offset. A time past year 9999 (no calendar date) as ``N ms``."""
    try:
        moment = dt.datetime.fromtimestamp(epoch_ms // 1000, dt.UTC)
        if local:
            moment = moment.astimezone()
    except (OverflowError, OSError, ValueError):
        return f"{epoch_ms} ms"
    text = moment.replace(microsecond=(epoch_ms % 1000) * 1000).isoformat(timespec="milliseconds")
    return text.removesuffix("+00:00") + "Z" if not local else text
