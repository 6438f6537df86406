"""UNIQ_KEY generation in RocketMQ's MessageClientIDSetter layout (docs/format.md §5.2)."""

from __future__ import annotations

import datetime as dt
import os
import secrets
import threading

from rmqstore.common.codec.msgid import (
    UniqKey,
    encode_uniq_key,
    month_start_ms,
    next_month_start_ms,
    uniq_key_time_field,
)


class UniqKeyGenerator:
    """Per process: pid and a random stand-in for the class-loader hash, a counter, and
    the time since the start of the local month."""

    def __init__(self, zone: dt.tzinfo | None = None):
        self.zone = zone or dt.datetime.now().astimezone().tzinfo
        self.pid = os.getpid() & 0xFFFF
        self.loader_hash = secrets.randbits(31)
        self._counter = 0
        self._month_start = 0
        self._next_month_start = 0
        self._lock = threading.Lock()

    def next(self, ip: bytes, now_ms: int) -> str:
        return self.next_many(ip, now_ms, 1)[0]

    def next_many(self, ip: bytes, now_ms: int, count: int) -> list[str]:
        """``count`` keys for one ip and time, each what :meth:`next` would give in turn:
        they differ in the counter only (the last four hex digits)."""
        with self._lock:
            if now_ms >= self._next_month_start or now_ms < self._month_start - 1_000_000:
                assert self.zone is not None
                self._month_start = month_start_ms(now_ms, self.zone)
                self._next_month_start = next_month_start_ms(self._month_start, self.zone)
            first = self._counter
            self._counter = (first + count) & 0xFFFF
            month_start = self._month_start
        key = encode_uniq_key(UniqKey(ip, self.pid, self.loader_hash, uniq_key_time_field(now_ms, month_start), 0))
        counters = [(first + step) & 0xFFFF for step in range(count)]
        return list(map((key[:-4] + "%04X").__mod__, counters))
