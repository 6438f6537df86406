"""The writer's group commit: the requests of one moment appended as one batch."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from opentelemetry import trace

from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.errors import InvalidArgument, invariant
from rmqstore.common.tracing import LINKS_MAX, tracing_on
from rmqstore.writer.config import FlushPolicy
from rmqstore.writer.intake import Respond
from rmqstore.writer.metrics import WriterMetrics
from rmqstore.writer.store import GROUP_MAX_MESSAGES, AppendResults, Writer
from rmqstore.writer.validate import MessageBatch


class _Pending:
    """One request waiting for the group commit: its messages as columns."""

    __slots__ = ("batch", "context", "future", "peer", "respond", "started")

    def __init__(self, batch: MessageBatch, peer: SocketAddress | None, respond: Respond, future: asyncio.Future[Any]):
        self.batch = batch
        self.peer = peer
        self.respond = respond
        self.future = future
        # The caller's context (its trace): a group's append and flush spans belong to
        # the request at its front.
        self.context = contextvars.copy_context()
        self.started = time.perf_counter()

    @property
    def count(self) -> int:
        return self.batch.message_count


def _request_links(waiting: list[tuple[_Pending, Any]]) -> list[trace.Link]:
    """Links to the spans of the requests ``waiting`` (the ones in a trace), at most
    :data:`LINKS_MAX`."""
    links = []
    for pending, _ in waiting:
        context = pending.context.run(trace.get_current_span).get_span_context()
        if context.is_valid:
            links.append(trace.Link(context))
            if len(links) >= LINKS_MAX:
                break
    return links


class _Stored(NamedTuple):
    """A request appended, its response made, waiting to be acknowledged."""

    response: Any
    results: AppendResults


class AckGate(Protocol):
    """What holds acknowledgements back until replicas have the bytes (a writer group's
    primary: writer.replication.primary.SyncTracker). On the loop."""

    def check_writable(self) -> None:
        """Raise why a send is refused now (not the primary; too few replicas in sync)."""

    def appended(self) -> None:
        """Records were appended (the followers' streams have bytes to send)."""

    def hold(self, end_offset: int, release: Callable[[BaseException | None], None]) -> None:
        """Call ``release(None)`` once the commit log below ``end_offset`` may be
        acknowledged, or ``release(error)`` once it may not."""


class GroupAppender:
    """The writer's group commit: appends for the handlers of one event loop, as
    RocketMQ's group commit takes them.

    A handler reads its request's messages into columns (:func:`request_batch`), queues
    them and awaits a future. A drain, scheduled on the loop when a request finds none
    pending, takes every request queued by then as one group and appends it right
    there: checked, appended and dispatched as one batch (Writer.append_group), and each
    request's response made. Under ASYNC the futures are settled at once; under SYNC the
    flusher thread fsyncs what has been appended, then settles every request the fsync
    covered, while the loop reads the next requests and appends them.

    The append runs on the loop rather than on a thread of its own because it holds the
    GIL wherever it runs: an appender thread only took turns with the loop, waiting for
    the GIL after every burst of requests, and a SYNC producer's round trip is the whole
    cost."""

    def __init__(self, writer: Writer, metrics: WriterMetrics):
        self.writer = writer
        self.metrics = metrics
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: collections.deque[_Pending] = collections.deque()
        self._drain_scheduled = False
        self._closed = False
        # Called on the loop with each request's results once its messages are stored (the
        # consumers' long polls on those queues wake).
        self.listeners: list[Callable[[AppendResults], None]] = []
        # A writer group's primary: acknowledgements wait for the replicas (None: a single node).
        self.gate: AckGate | None = None
        # Appended, waiting for an fsync (SYNC only), each request with its outcome.
        self._appended = threading.Condition()
        self._unflushed: list[tuple[_Pending, _Stored | BaseException]] = []
        self._flusher: threading.Thread | None = None
        if writer.config.flush is FlushPolicy.SYNC:
            self._flusher = threading.Thread(target=self._flush_run, name="group-flush", daemon=True)
            self._flusher.start()

    def append(self, batch: MessageBatch, peer: SocketAddress | None, respond: Respond) -> asyncio.Future[Any]:
        """Queue a request's messages (on the loop); the future holds
        ``respond(results)`` once they are stored, or the error that refused them."""
        if self._closed:
            raise InvalidArgument("the writer is closed")
        if self.gate is not None:
            self.gate.check_writable()
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        invariant(loop is self._loop, "a GroupAppender serves one event loop")
        pending = _Pending(batch, peer, respond, loop.create_future())
        self._queue.append(pending)
        if not self._drain_scheduled:
            # After the callbacks already due: the requests read meanwhile join the group.
            self._drain_scheduled = True
            loop.call_soon(self._drain)
        return pending.future

    def _drain(self) -> None:
        self._drain_scheduled = False
        if not self._queue:
            return
        group = [self._queue.popleft()]
        messages = group[0].count
        while self._queue and messages + self._queue[0].count <= GROUP_MAX_MESSAGES:
            messages += self._queue[0].count
            group.append(self._queue.popleft())
        if self._queue:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)
        try:
            outcomes: list[_Stored | BaseException] = group[0].context.run(self._store, group)
        except BaseException as error:  # never leave a caller waiting
            outcomes = [error] * len(group)
        if self.gate is not None:
            self.gate.appended()
        if self._flusher is None:
            self._settle(list(zip(group, outcomes)))
        else:
            with self._appended:
                self._unflushed.extend(zip(group, outcomes))
                self._appended.notify()

    def _store(self, group: list[_Pending]) -> list[_Stored | BaseException]:
        """Append the group; each request's response, or the error that refused it."""
        batch = group[0].batch if len(group) == 1 else MessageBatch.concat([pending.batch for pending in group])
        parts = [(pending.count, pending.peer) for pending in group]
        outcomes: list[_Stored | BaseException] = []
        for pending, result in zip(group, self.writer.append_group(batch, parts, flush=False)):
            outcome: _Stored | BaseException
            if isinstance(result, AppendResults):
                try:
                    outcome = _Stored(pending.respond(result), result)
                except BaseException as error:  # never leave a caller waiting
                    outcome = error
            else:
                outcome = result
            outcomes.append(outcome)
        return outcomes

    def _flush_run(self) -> None:
        while True:
            with self._appended:
                while not self._unflushed and not self._closed:
                    self._appended.wait()
                if not self._unflushed:
                    return
                waiting, self._unflushed = self._unflushed, []
            if any(isinstance(outcome, _Stored) for _, outcome in waiting):
                try:
                    # Every request here was appended before this fsync began. Its span
                    # is the first request's child, linked to the others it acknowledges.
                    links = _request_links(waiting[1:]) if tracing_on() else []
                    if links:
                        waiting[0][0].context.run(self.writer.flush, links)
                    else:
                        waiting[0][0].context.run(self.writer.flush)
                except BaseException as error:
                    # Not known to be stored: nobody is acknowledged.
                    waiting = [(p, error if isinstance(o, _Stored) else o) for p, o in waiting]
            loop = self._loop
            assert loop is not None
            try:
                loop.call_soon_threadsafe(self._settle, waiting)
            except RuntimeError:
                pass  # the loop is closed: nobody awaits these any more

    def _settle(self, done: list[tuple[_Pending, _Stored | BaseException]]) -> None:
        """Acknowledge (or refuse) each request, then wake the listeners: on the loop."""
        gate = self.gate
        for pending, outcome in done:
            if pending.future.done():
                continue  # the call was cancelled (its client went away)
            if isinstance(outcome, _Stored):
                if gate is None:
                    self._acknowledge(pending, outcome, None)
                else:
                    results = outcome.results
                    end = results.commitlog_offsets[-1] + results.sizes[-1]
                    gate.hold(end, functools.partial(self._acknowledge, pending, outcome))
            else:
                pending.future.set_exception(outcome)
        for _, outcome in done:
            if isinstance(outcome, _Stored):
                for listener in self.listeners:
                    listener(outcome.results)

    def _acknowledge(self, pending: _Pending, stored: _Stored, refusal: BaseException | None) -> None:
        """Settle a stored request's future: its response, or ``refusal`` (not acknowledged)."""
        if pending.future.done():
            return
        if refusal is not None:
            pending.future.set_exception(refusal)
            return
        self.metrics.appended(stored.results, pending.started)
        pending.future.set_result(stored.response)

    def close(self) -> None:
        """Flush and acknowledge what is appended, then stop the flusher; later appends
        are refused. Called once the server has stopped (no handler is waiting)."""
        self._closed = True
        if self._flusher is not None:
            with self._appended:
                self._appended.notify()
            self._flusher.join()
