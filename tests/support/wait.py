"""Waiting for a condition: polled until a deadline, never a fixed sleep standing in for
"long enough"."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

INTERVAL_S = 0.01


class WaitTimedOut(AssertionError):
    """The condition did not hold within the time given."""


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = INTERVAL_S) -> T:
    """Call ``predicate`` every ``interval_s`` until it returns a true value, and return
    that value; fail naming ``what`` if ``timeout_s`` passes first. An exception from
    ``predicate`` propagates (a condition that can never hold fails at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimedOut(f"waited {timeout_s} s for {what}")
        time.sleep(interval_s)


def clock_past(ms: int, timeout_s: float = 1.0) -> int:
    """Wait until the wall clock, in whole milliseconds, is past ``ms`` (a store time: what
    is written from now on is stamped later), and return it."""
    return wait_until(lambda: (now := time.time_ns() // 1_000_000) > ms and now, timeout_s, f"the clock to pass {ms} ms",
                      interval_s=0.001)  # fmt: skip
