"""A stream's stall limit (service.limits' ``stalled_write_s``) kept by one timer a
stream: the handler writes through :meth:`StallWatch.write`, and a write its client has not
taken after the limit ends the stream with RESOURCE_EXHAUSTED.

One timer a stream rather than a timeout around each write (``asyncio.timeout`` makes a
timer and cancels it for every message written, ``asyncio.wait_for`` a task as well): a
SendStream writes an ack for every batch it stores, and that timer was a measurable part of
a batch's cost on the writer (benchmarks/CLUSTER.md); a StreamByTime writes a message for
every record it streams. The timer fires at most once a limit while writes go through,
and when it finds a write waiting it fires again when that write's limit is out, so a
stalled write is still caught ``limit_s`` after it began."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc


class StallWatch:
    """The stall limit of the stream served by the current task. Made and closed on the
    loop by that task (``with StallWatch(limit_s, "no ack") as watch``); ``unread`` names
    what the client did not read, in the status that ends a stalled stream."""

    def __init__(self, limit_s: float, unread: str):
        self.limit_s = limit_s
        self.unread = unread
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "a StallWatch belongs to the task that writes the stream"
        self._task = task
        self._write_began: float | None = None  # loop.time() of the write waiting, if one does
        self._stalled = False
        self._timer = self._loop.call_later(limit_s, self._check)

    def __enter__(self) -> StallWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        began = self._write_began
        now = self._loop.time()
        if began is not None and now - began >= self.limit_s:
            self._stalled = True
            self._task.cancel()  # the write's await ends; write() ends the stream
            return
        self._timer = self._loop.call_at((now if began is None else began) + self.limit_s, self._check)

    async def write(self, context: grpc.aio.ServicerContext, message: Any) -> None:
        """``context.write(message)``; once the client has taken none of it for the
        limit, the stream ends with RESOURCE_EXHAUSTED (``context.abort`` raises)."""
        self._write_began = self._loop.time()
        try:
            await context.write(message)
            return
        except asyncio.CancelledError:
            if not self._stalled:
                raise  # the call was cancelled (its client went away)
            self._task.uncancel()
        finally:
            self._write_began = None
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"the client read {self.unread} for {self.limit_s:g} s: the stream is closed"
        )
