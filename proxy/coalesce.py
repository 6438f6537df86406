"""Group commit across a proxy's clients: the messages of every client's SendMessage bound
for one writer group go into one columnar batch of the writer's v1 stream
(``WriterService.SendStream``, ``compact_results``). A batch leaves once the first of its
messages has waited ``linger_s`` out (or ``batch_max`` messages wait), and no more than
BATCHES_IN_FLIGHT batches wait for the writer's answer: a batch ready while one is in
flight keeps gathering until the answer comes. A batch so holds about the send rate times
the linger, or times the writer's turnaround when that is longer (group commit); an
answer does not send the next batch before its linger is out (benchmarks/CLUSTER.md: at
a few hundred sends a second, that is what makes batches grow with the linger). Each
caller gets its own messages' results back (their UNIQ_KEYs and queue offsets, in its
order).

A batch is stored whole or not at all (SendBatchRequest's contract): a writer's refusal
of a batch, or a stream that breaks with batches unanswered, fails every caller of those
batches, and the stream is opened again for the next batch (on the group's next writer,
when it lists several). Whether a batch whose stream broke was stored is unknown: its
callers are told it failed, and a RocketMQ client sends again (at least once)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import grpc

from rmqstore.common.message_rules import MessageBatch
from rmqstore.proxy.metrics import proxy_metrics
from rmqstore.proxy.upstream import PLAINTEXT, Upstream
from rmqstore.v1 import writer_pb2, writer_pb2_grpc

# What a writer found unreachable is left out of routes and sends for this long, then
# tried again by the next send.
DOWN_S = 2.0
# Batches sent to a writer and not yet answered, at most.
BATCHES_IN_FLIGHT = 1
# How long a batch may wait for the writer's answer before its callers are told it failed.
BATCH_TIMEOUT_S = 10.0
# gRPC codes that say the writer (not the batch) is at fault: the group is down for DOWN_S.
UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})

log = logging.getLogger(__name__)

Results = tuple[list[str], list[int]]  # a caller's UNIQ_KEYs and queue offsets, in its order


class BatchFailed(Exception):
    """A batch the writer refused or did not answer: ``code`` is the gRPC code it gave
    (UNAVAILABLE when its stream broke)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class _Columns:
    """A batch being gathered: MessageColumns' fields as lists, and its callers."""

    bodies: list[bytes] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    queue_ids: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    uniq_keys: list[str] = field(default_factory=list)
    born_timestamps_ms: list[int] = field(default_factory=list)
    born_hosts: list[str] = field(default_factory=list)
    property_counts: list[int] = field(default_factory=list)
    property_names: list[str] = field(default_factory=list)
    property_values: list[str] = field(default_factory=list)
    callers: list[tuple[int, asyncio.Future[Results]]] = field(default_factory=list)

    def add(self, batch: MessageBatch, queue_id: int, born_hosts: Sequence[str]) -> None:
        self.bodies += batch.bodies
        self.topics += batch.topics
        self.queue_ids += [queue_id] * len(batch.bodies)
        self.keys += [" ".join(keys) for keys in batch.keys]
        self.tags += batch.tags
        self.uniq_keys += batch.uniq_keys
        self.born_timestamps_ms += batch.born_timestamps_ms
        self.born_hosts += born_hosts
        self.property_counts += map(len, batch.properties)
        self.property_names += chain.from_iterable(batch.properties)
        self.property_values += chain.from_iterable(p.values() for p in batch.properties)

    def request(self) -> writer_pb2.SendBatchRequest:
        columns = writer_pb2.MessageColumns(
            bodies=self.bodies, topics=self.topics[:1] if len(set(self.topics)) == 1 else self.topics,
            queue_ids=self.queue_ids, keys=self.keys, tags=self.tags, uniq_keys=self.uniq_keys,
            born_timestamps_ms=self.born_timestamps_ms, born_hosts=self.born_hosts,
            property_counts=self.property_counts, property_names=self.property_names,
            property_values=self.property_values,
        )  # fmt: skip
        return writer_pb2.SendBatchRequest(columns=columns, compact_results=True)


class _Stream:
    """One SendStream to a writer: batches written in order, each answer handed to the
    callers of the batch it answers."""

    def __init__(
        self, stub: writer_pb2_grpc.WriterServiceStub, on_answer: Callable[[], None], on_end: Callable[[BatchFailed], None]
    ):
        self.on_answer = on_answer
        self.on_end = on_end
        self.outgoing: asyncio.Queue[writer_pb2.SendBatchRequest | None] = asyncio.Queue()
        self.unanswered: collections.deque[list[tuple[int, asyncio.Future[Results]]]] = collections.deque()
        self.open = True
        self.call = stub.SendStream(self._requests())
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self) -> AsyncIterator[writer_pb2.SendBatchRequest]:
        while True:
            request = await self.outgoing.get()
            if request is None:
                return
            yield request

    def send(self, columns: _Columns) -> None:
        self.unanswered.append(columns.callers)
        self.outgoing.put_nowait(columns.request())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                callers = self.unanswered.popleft()
                compact = response.compact
                uniq_keys, offsets = list(compact.uniq_keys), list(compact.queue_offsets)
                start = 0
                for count, future in callers:
                    if not future.done():
                        future.set_result((uniq_keys[start : start + count], offsets[start : start + count]))
                    start += count
                self.on_answer()
            failure = BatchFailed(grpc.StatusCode.UNAVAILABLE, "the writer ended its stream")
        except grpc.aio.AioRpcError as error:
            failure = BatchFailed(error.code(), error.details() or error.code().name)
        except asyncio.CancelledError:
            self.fail(BatchFailed(grpc.StatusCode.CANCELLED, "the proxy is stopping"))
            raise
        self.fail(failure)
        self.on_end(failure)

    def fail(self, failure: BatchFailed) -> None:
        self.open = False
        while self.unanswered:
            for _, future in self.unanswered.popleft():
                if not future.done():
                    future.set_exception(failure)
        self.outgoing.put_nowait(None)


class GroupSender:
    """The sends of one writer group, coalesced (see the module's docstring)."""

    def __init__(self, name: str, writers: Sequence[str], linger_s: float, batch_max: int, upstream: Upstream = PLAINTEXT):
        self.name = name
        self.writers = tuple(writers)
        self.linger_s = linger_s
        self.batch_max = batch_max
        self.down_until = 0.0  # time.monotonic(): left out of sends and routes until then
        self._writer_index = 0
        self._channels = [upstream.channel(w) for w in self.writers]
        self._gathering = _Columns()
        self._gathering_since = 0.0  # time.monotonic() of the gathering batch's first message
        self._sealed: collections.deque[_Columns] = collections.deque()  # full batches waiting for a turn
        self._timer: asyncio.TimerHandle | None = None
        self._stream: _Stream | None = None
        self.batches_sent = 0
        self.messages_sent = 0

    @property
    def available(self) -> bool:
        return time.monotonic() >= self.down_until

    def mark_down(self, why: str) -> None:
        if self.available:
            log.warning("writer group %s is unavailable for %.1f s: %s", self.name, DOWN_S, why)
        self.down_until = time.monotonic() + DOWN_S

    async def send(self, batch: MessageBatch, queue_id: int, born_hosts: Sequence[str]) -> Results:
        """Append ``batch`` (one caller's messages) to queue ``queue_id`` of the group, in
        the next coalesced batch; its UNIQ_KEYs and queue offsets once stored. Raises
        BatchFailed."""
        future: asyncio.Future[Results] = asyncio.get_running_loop().create_future()
        gathering = self._gathering
        if not gathering.callers:
            self._gathering_since = time.monotonic()
        gathering.add(batch, queue_id, born_hosts)
        gathering.callers.append((len(batch.bodies), future))
        if len(gathering.bodies) >= self.batch_max:
            self._sealed.append(gathering)
            self._gathering = _Columns()
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.linger_s, self._flush)
        try:
            # No task a send, as wait_for makes; the future is this caller's alone (its
            # batch's answer skips a future that is done, cancelled included).
            async with asyncio.timeout(BATCH_TIMEOUT_S):
                return await future
        except TimeoutError:
            raise BatchFailed(grpc.StatusCode.DEADLINE_EXCEEDED, f"writer group {self.name} did not answer within {BATCH_TIMEOUT_S:g} s") from None

    def _in_flight(self) -> int:
        stream = self._stream
        return len(stream.unanswered) if stream is not None and stream.open else 0

    def _flush(self) -> None:
        """Send what waits, as far as the batches in flight allow: full batches first,
        then the one gathering once its first message has waited the linger out (the rest
        leaves when an answer comes, or its linger ends)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._sealed and self._in_flight() < BATCHES_IN_FLIGHT:
            self._send(self._sealed.popleft())
        if not self._gathering.callers or self._sealed:
            return
        waited_s = time.monotonic() - self._gathering_since
        if waited_s < self.linger_s:
            self._timer = asyncio.get_running_loop().call_later(self.linger_s - waited_s, self._flush)
        elif self._in_flight() < BATCHES_IN_FLIGHT:
            gathering, self._gathering = self._gathering, _Columns()
            self._send(gathering)

    def _send(self, batch: _Columns) -> None:
        self._open_stream().send(batch)
        self.batches_sent += 1
        self.messages_sent += len(batch.bodies)
        proxy_metrics().batch_sent(self.name, len(batch.bodies))

    def _open_stream(self) -> _Stream:
        if self._stream is None or not self._stream.open:
            stub = writer_pb2_grpc.WriterServiceStub(self._channels[self._writer_index])  # type: ignore[no-untyped-call]  # generated
            self._stream = _Stream(stub, self._flush, self._ended)
        return self._stream

    def _ended(self, failure: BatchFailed) -> None:
        proxy_metrics().upstream_failed(self.name, failure.code)
        if failure.code in UNREACHABLE:
            self.mark_down(f"its stream to {self.writers[self._writer_index]} ended: {failure}")
            self._writer_index = (self._writer_index + 1) % len(self.writers)
        # What was waiting for an answer goes on a new stream (or fails fast on it).
        if self._sealed or self._gathering.callers:
            asyncio.get_running_loop().call_soon(self._flush)

    async def close(self) -> None:
        log.info("writer group %s: %d messages sent in %d batches", self.name, self.messages_sent, self.batches_sent)
        if self._timer is not None:
            self._timer.cancel()
        if self._stream is not None:
            self._stream.fail(BatchFailed(grpc.StatusCode.CANCELLED, "the proxy is stopping"))
            self._stream.reader.cancel()
        for channel in self._channels:
            await channel.close()
