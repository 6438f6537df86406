"""rmqstore.v1.QueryService through a proxy (cluster mode, docs/cluster.md): lookups across
the writer groups of a cluster file, answered by each group's query nodes.

- Key and UNIQ_KEY lookups ask every group and merge the answers newest first (store
  time, then the groups' order), each group's own order kept. One cursor
  (:mod:`rmqstore.proxy.lookup_cursor`, signed with the proxies' key) carries where the
  lookup stands in each group, so pages go on across groups as a single merge would.
- A message id goes to the group whose store host it names, learnt from the records the
  groups answered with; an id of a host not seen yet is asked of every group.
- Queue lookups (queue offset, time search, Pull, a queue's bounds, StreamByTime) go to the
  group their request's broker name names (the only group when there is one).
- ListTopics, ListGroups and GroupLag are the groups' answers together, each queue under
  its group's broker name.

A group none of whose query nodes answers is named in the answer's ``unanswered_groups``:
the answer holds what the other groups have, and is never ``complete``; a lookup that can
only be answered by that group is UNAVAILABLE, naming it."""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc

from rmqstore.common.codec.msgid import decode_offset_msg_id
from rmqstore.common.errors import InvalidArgument, NotFound, StoreError, Unavailable
from rmqstore.common.files.cursorkey import KEY_BYTES
from rmqstore.proxy.cluster import GroupEndpoints
from rmqstore.proxy.lookup_cursor import (
    BELOW_NONE,
    GroupPosition,
    decode_merged_cursor,
    encode_merged_cursor,
)
from rmqstore.proxy.metrics import proxy_metrics
from rmqstore.proxy.upstream import PLAINTEXT, Upstream
from rmqstore.query.cursor import query_digest
from rmqstore.service.errors import REASON_KEY, abort_with_async
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc

# A group's query node has this long to answer (less when the caller's deadline is nearer).
GROUP_CALL_TIMEOUT_S = 10.0
# The statuses that mean a query node did not answer: the group's next one is asked.
_NOT_ANSWERED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# A query node that did not answer is tried again at most this long after (grpc's default
# backoff grows to 120 s: a group back from a restart would stay unanswered that long).
RECONNECT_BACKOFF_MAX_MS = 1000
_CHANNEL_OPTIONS = (
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
    ("grpc.initial_reconnect_backoff_ms", 200),
)
# Store hosts remembered, each with its group (a group's hosts change only with its writers).
STORE_HOSTS_MAX = 4096
# What a query node allows (query.view's PAGE_SIZE_MAX and RESPONSE_BYTES_MAX): a merged
# page keeps to the same.
PAGE_SIZE_MAX = 10_000
RESPONSE_BYTES_MAX = 16 * 1024 * 1024


class GroupUnanswered(Exception):
    """None of a group's query nodes answered."""

    def __init__(self, group: str, detail: str):
        super().__init__(f"group {group} did not answer: {detail}")
        self.group = group


class GroupNodes:
    """A writer group's nodes of one kind (its query nodes, or its writers) as the proxy
    reaches them: the one that answered last is asked first, the others when it does not
    answer."""

    def __init__(
        self,
        group: GroupEndpoints,
        endpoints: tuple[str, ...],
        stub: Callable[[grpc.aio.Channel], Any],
        kind: str,
        upstream: Upstream = PLAINTEXT,
    ):
        self.group = group
        self.name = group.name
        self.endpoints = endpoints
        self.kind = kind
        self._channels = [upstream.channel(e, _CHANNEL_OPTIONS) for e in endpoints]
        self._stubs = [stub(channel) for channel in self._channels]
        self._first = 0

    async def call(self, method: str, request: Any, timeout_s: float) -> Any:
        """A unary call to the first node that answers; a node's own status (not found, a
        bad request) is raised as the AioRpcError it is."""
        if not self._stubs:
            raise GroupUnanswered(self.name, f"the cluster file names no {self.kind} for it")
        detail = ""
        for step in range(len(self._stubs)):
            index = (self._first + step) % len(self._stubs)
            try:
                answer = await getattr(self._stubs[index], method)(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as error:
                if error.code() not in _NOT_ANSWERED:
                    raise
                proxy_metrics().upstream_failed(self.name, error.code())
                detail = f"{self.endpoints[index]}: {error.code().name}: {error.details()}"
                continue
            self._first = index
            return answer
        raise GroupUnanswered(self.name, detail)

    def stream(self, method: str, request: Any, timeout_s: float | None) -> Any:
        """A server-streaming call to the node that answered last."""
        if not self._stubs:
            raise GroupUnanswered(self.name, f"the cluster file names no {self.kind} for it")
        return getattr(self._stubs[self._first], method)(request, timeout=timeout_s)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


class GroupQueries(GroupNodes):
    """A writer group's query nodes."""

    def __init__(self, endpoints: GroupEndpoints, upstream: Upstream = PLAINTEXT):
        super().__init__(endpoints, endpoints.queries, query_pb2_grpc.QueryServiceStub, "query node", upstream)


N = TypeVar("N", bound=GroupNodes)


class GroupSet(Generic[N]):
    """The cluster file's groups, each as its nodes of one kind (made by ``nodes``): the
    channels are opened on the server's loop (:meth:`start`) and follow the file as it
    changes (:meth:`set_groups`)."""

    def __init__(self, groups: Sequence[GroupEndpoints], nodes: Callable[[GroupEndpoints], N]):
        self.groups: dict[str, N] = {}
        self._nodes = nodes
        self._pending_groups = tuple(groups)

    async def start(self) -> None:
        await self.set_groups(self._pending_groups)

    async def set_groups(self, groups: Sequence[GroupEndpoints]) -> None:
        """The cluster file's groups, in its order; a group whose nodes changed gets new
        channels."""
        kept: dict[str, N] = {}
        for endpoints in groups:
            current = self.groups.get(endpoints.name)
            kept[endpoints.name] = current if current is not None and current.group == endpoints else self._nodes(endpoints)
        dropped = [group for name, group in self.groups.items() if kept.get(name) is not group]
        self.groups = kept
        for group in dropped:
            await group.close()

    async def close(self) -> None:
        groups, self.groups = list(self.groups.values()), {}
        for group in groups:
            await group.close()

    @staticmethod
    def _timeout_s(context: grpc.aio.ServicerContext[Any, Any]) -> float:
        """A call to a group: the caller's deadline, at most GROUP_CALL_TIMEOUT_S."""
        remaining = context.time_remaining()
        return GROUP_CALL_TIMEOUT_S if remaining is None else max(0.001, min(GROUP_CALL_TIMEOUT_S, remaining))


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def relayed(method: F) -> F:
    """A handler whose errors become statuses: the proxy's own (StoreError) by the one
    table, a group's unanswered as UNAVAILABLE naming it, a query node's status as it came
    (code, words and reason)."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await method(self, request, context)
        except StoreError as error:
            await abort_with_async(context, error)
        except GroupUnanswered as error:
            await abort_with_async(context, Unavailable(str(error)))
        except grpc.aio.AioRpcError as error:
            reason = [(k, v) for k, v in (error.trailing_metadata() or ()) if k == REASON_KEY]
            await context.abort(
                error.code(), error.details() or "", trailing_metadata=tuple(reason)
            )

    return wrapper  # type: ignore[return-value]


class _GroupReader:
    """One group's part of a merged key or UNIQ_KEY page: the records of the node page it
    stands in, not given yet, and where it stands (a GroupPosition) as records are taken."""

    def __init__(
        self, group: GroupQueries | None, position: GroupPosition, node_request: Callable[[str], Any], method: str,
        timeout_s: float,
    ):  # fmt: skip
        self.group = group
        self.name = position.group
        self.done = position.done
        self.page_cursor = position.node_cursor
        self.below = position.below
        self.node_request = node_request
        self.method = method
        self.timeout_s = timeout_s
        self.buffer: deque[messages_pb2.StoredMessage] = deque()
        self.loaded = False  # whether buffer holds what is left of the node page at page_cursor
        self.next_cursor = ""
        self.page_last = False
        self.unanswered: str | None = None

    async def fill(self) -> None:
        """Read node pages until a record is ready, the group is done or did not answer."""
        while not self.buffer and not self.done and self.unanswered is None:
            if self.loaded:  # the node page is used up
                if self.page_last:
                    self.done = True
                    return
                self.page_cursor, self.below, self.loaded = self.next_cursor, BELOW_NONE, False
            if self.group is None:
                self.unanswered = f"group {self.name} is not in the cluster file any more"
                return
            try:
                page = await self.group.call(
                    self.method, self.node_request(self.page_cursor), self.timeout_s
                )
            except GroupUnanswered as error:
                self.unanswered = str(error)
                return
            self.loaded = True
            self.next_cursor = page.cursor
            self.page_last = page.complete or not page.cursor
            # Records at or above `below` were given already (or, on a newest page, arrived
            # since the lookup began: they are newer than its first page).
            self.buffer.extend(
                m
                for m in page.messages
                if self.below == BELOW_NONE or m.commitlog_offset < self.below
            )

    def take(self) -> messages_pb2.StoredMessage:
        message = self.buffer.popleft()
        self.below = message.commitlog_offset
        return message

    def position(self) -> GroupPosition:
        if self.done or (self.loaded and not self.buffer and self.page_last):
            return GroupPosition(self.name, done=True)
        if self.loaded and not self.buffer:
            return GroupPosition(self.name, node_cursor=self.next_cursor)
        return GroupPosition(self.name, node_cursor=self.page_cursor, below=self.below)


@dataclass(frozen=True)
class MergedPage:
    messages: list[messages_pb2.StoredMessage]
    cursor: str
    complete: bool
    unanswered: list[str]


class ProxyQueryServicer(GroupSet[GroupQueries], query_pb2_grpc.QueryServiceServicer):
    """QueryService in front of the groups' query nodes."""

    def __init__(self, groups: Sequence[GroupEndpoints], cursor_key: bytes | None = None, upstream: Upstream = PLAINTEXT):
        super().__init__(groups, lambda endpoints: GroupQueries(endpoints, upstream))
        # Without a shared key a cursor continues only through this proxy process.
        self.cursor_key = cursor_key if cursor_key is not None else secrets.token_bytes(KEY_BYTES)
        # A store host (Java text) → the groups seen storing with it: one, unless writers of
        # several groups were given the same --store-host (their ids are then ambiguous).
        self.store_hosts: dict[str, set[str]] = {}

    def _learn_host(self, store_host: str, group: str) -> None:
        known = self.store_hosts.get(store_host)
        if known is None:
            if len(self.store_hosts) >= STORE_HOSTS_MAX:
                self.store_hosts.clear()
            self.store_hosts[store_host] = {group}
        elif group not in known:
            known.add(group)

    # Key and UNIQ_KEY: every group, merged

    async def _merged_page(
        self, context: grpc.aio.ServicerContext[Any, Any], method: str, node_request: Callable[[str], Any], query: bytes,
        cursor: str, count_max: int,
    ) -> MergedPage:  # fmt: skip
        if cursor:
            positions = decode_merged_cursor(self.cursor_key, cursor, query)
        else:
            positions = [GroupPosition(name) for name in self.groups]
        timeout_s = self._timeout_s(context)
        readers = [
            _GroupReader(self.groups.get(p.group), p, node_request, method, timeout_s)
            for p in positions
        ]
        await asyncio.gather(*(reader.fill() for reader in readers))
        messages: list[messages_pb2.StoredMessage] = []
        used_bytes = 0
        while len(messages) < count_max:
            ready = [reader for reader in readers if reader.buffer]
            if not ready:
                break
            # Newest first; at equal store times, the group named first (max keeps the first).
            reader = max(ready, key=lambda r: r.buffer[0].store_timestamp_ms)
            if messages and used_bytes + reader.buffer[0].size > RESPONSE_BYTES_MAX:
                break
            message = reader.take()
            self._learn_host(message.store_host, reader.name)
            messages.append(message)
            used_bytes += message.size
            if not reader.buffer:
                await reader.fill()
        after = [reader.position() for reader in readers]
        unanswered = [reader.name for reader in readers if reader.unanswered is not None]
        finished = all(position.done for position in after)
        next_cursor = "" if finished else encode_merged_cursor(self.cursor_key, after, query)
        return MergedPage(messages, next_cursor, finished, unanswered)

    @relayed
    async def QueryByKey(
        self, request: query_pb2.QueryByKeyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.QueryByKeyResponse:
        if not 1 <= request.page_size <= PAGE_SIZE_MAX:
            raise InvalidArgument(
                f"page size must be in [1, {PAGE_SIZE_MAX}], got {request.page_size}"
            )
        begin = request.begin_ms if request.HasField("begin_ms") else None
        end = request.end_ms if request.HasField("end_ms") else None
        query = query_digest(
            "proxy-key",
            request.topic,
            request.key,
            "" if begin is None else begin,
            "" if end is None else end,
        )

        def node_request(node_cursor: str) -> query_pb2.QueryByKeyRequest:
            asked = query_pb2.QueryByKeyRequest()
            asked.CopyFrom(request)
            asked.cursor = node_cursor
            return asked

        page = await self._merged_page(
            context, "QueryByKey", node_request, query, request.cursor, request.page_size
        )
        return query_pb2.QueryByKeyResponse(
            messages=page.messages,
            cursor=page.cursor,
            complete=page.complete,
            unanswered_groups=page.unanswered,
        )

    @relayed
    async def QueryByUniqKey(
        self, request: query_pb2.QueryByUniqKeyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.QueryByUniqKeyResponse:
        query = query_digest("proxy-uniq-key", request.topic, request.uniq_key)

        def node_request(node_cursor: str) -> query_pb2.QueryByUniqKeyRequest:
            return query_pb2.QueryByUniqKeyRequest(
                topic=request.topic, uniq_key=request.uniq_key, cursor=node_cursor
            )

        page = await self._merged_page(
            context, "QueryByUniqKey", node_request, query, request.cursor, PAGE_SIZE_MAX
        )
        return query_pb2.QueryByUniqKeyResponse(
            messages=page.messages,
            cursor=page.cursor,
            complete=page.complete,
            unanswered_groups=page.unanswered,
        )

    # A message id: the group of its store host

    @relayed
    async def QueryByMsgId(
        self, request: query_pb2.QueryByMsgIdRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.QueryByMsgIdResponse:
        store_host = decode_offset_msg_id(request.msg_id).store_host.java_text()
        timeout_s = self._timeout_s(context)
        owners = self.store_hosts.get(store_host, set())
        if len(owners) == 1 and (known := self.groups.get(next(iter(owners)))) is not None:
            answer: query_pb2.QueryByMsgIdResponse = await known.call(
                "QueryByMsgId", request, timeout_s
            )
            return answer
        # A host not seen yet (or shared): the group that holds the id says so, the others NOT_FOUND.
        groups = list(self.groups.values())
        outcomes = await asyncio.gather(
            *(g.call("QueryByMsgId", request, timeout_s) for g in groups), return_exceptions=True
        )
        found = [
            (g.name, o)
            for g, o in zip(groups, outcomes, strict=True)
            if isinstance(o, query_pb2.QueryByMsgIdResponse)
        ]
        for name, answer in found:
            self._learn_host(answer.message.store_host, name)
        if len(found) > 1:
            raise InvalidArgument(
                f"msgId {request.msg_id} names a message in groups {', '.join(name for name, _ in found)}: their writers "
                f"share the store host {store_host} (give each writer its own --store-host)"
            )
        if found:
            return found[0][1]
        unanswered: list[str] = []
        refused: grpc.aio.AioRpcError | None = None
        for group, outcome in zip(groups, outcomes, strict=True):
            if isinstance(outcome, GroupUnanswered):
                unanswered.append(group.name)
            elif isinstance(outcome, grpc.aio.AioRpcError):
                if outcome.code() != grpc.StatusCode.NOT_FOUND and refused is None:
                    refused = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
        if refused is not None:
            raise refused
        if unanswered:
            raise Unavailable(
                f"no message with msgId {request.msg_id} in the groups that answered; "
                f"group{'s' if len(unanswered) > 1 else ''} {', '.join(unanswered)} did not answer"
            )
        raise NotFound(
            f"no message with msgId {request.msg_id} in any group ({', '.join(g.name for g in groups)})"
        )

    # Queue lookups: the group the broker name names

    def _group_named(self, broker_name: str) -> GroupQueries:
        if not broker_name:
            if len(self.groups) == 1:
                return next(iter(self.groups.values()))
            raise InvalidArgument(
                f"this proxy fronts {len(self.groups)} writer groups ({', '.join(self.groups)}): "
                "give the broker name of the queue"
            )
        group = self.groups.get(broker_name)
        if group is None:
            raise InvalidArgument(
                f"no writer group {broker_name} in the cluster (its groups: {', '.join(self.groups)})"
            )
        return group

    async def _routed(
        self, method: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        group = self._group_named(request.broker_name)
        asked = type(request)()
        asked.CopyFrom(request)
        asked.broker_name = ""
        return await group.call(method, asked, self._timeout_s(context))

    @relayed
    async def QueryByQueueOffset(
        self,
        request: query_pb2.QueryByQueueOffsetRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> query_pb2.QueryByQueueOffsetResponse:
        answer: query_pb2.QueryByQueueOffsetResponse = await self._routed(
            "QueryByQueueOffset", request, context
        )
        return answer

    @relayed
    async def Pull(
        self, request: query_pb2.PullRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.PullResponse:
        answer: query_pb2.PullResponse = await self._routed("Pull", request, context)
        return answer

    @relayed
    async def QueueBounds(
        self, request: query_pb2.QueueBoundsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.QueueBoundsResponse:
        answer: query_pb2.QueueBoundsResponse = await self._routed("QueueBounds", request, context)
        return answer

    @relayed
    async def SearchOffset(
        self, request: query_pb2.SearchOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.SearchOffsetResponse:
        answer: query_pb2.SearchOffsetResponse = await self._routed(
            "SearchOffset", request, context
        )
        return answer

    @relayed
    async def OffsetsByTime(
        self, request: query_pb2.OffsetsByTimeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.OffsetsByTimeResponse:
        answer: query_pb2.OffsetsByTimeResponse = await self._routed(
            "OffsetsByTime", request, context
        )
        return answer

    async def StreamByTime(
        self, request: query_pb2.StreamByTimeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[messages_pb2.StoredMessage]:
        try:
            group = self._group_named(request.broker_name)
            asked = query_pb2.StreamByTimeRequest()
            asked.CopyFrom(request)
            asked.broker_name = ""
            remaining = context.time_remaining()
            async for message in group.stream("StreamByTime", asked, remaining):
                yield message
        except StoreError as error:
            await abort_with_async(context, error)
        except GroupUnanswered as error:
            await abort_with_async(context, Unavailable(str(error)))
        except grpc.aio.AioRpcError as error:
            code = error.code()
            if code in _NOT_ANSWERED:
                await abort_with_async(
                    context,
                    Unavailable(
                        f"group {request.broker_name or 'of the queue'} did not answer: {error.details()}"
                    ),
                )
            reason = [(k, v) for k, v in (error.trailing_metadata() or ()) if k == REASON_KEY]
            await context.abort(code, error.details() or "", trailing_metadata=tuple(reason))

    # Every group's answer together

    async def _each_group(
        self, method: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[list[tuple[str, Any]], list[str]]:
        """Each answering group's answer (the cluster file's order) and the groups that did not answer."""
        groups = list(self.groups.values())
        timeout_s = self._timeout_s(context)
        outcomes = await asyncio.gather(
            *(g.call(method, request, timeout_s) for g in groups), return_exceptions=True
        )
        answers, unanswered = [], []
        for group, outcome in zip(groups, outcomes, strict=True):
            if isinstance(outcome, GroupUnanswered):
                unanswered.append(group.name)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                answers.append((group.name, outcome))
        return answers, unanswered

    @relayed
    async def ListTopics(
        self, request: query_pb2.ListQueryTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.ListQueryTopicsResponse:
        answers, unanswered = await self._each_group("ListTopics", request, context)
        topics: dict[str, query_pb2.TopicInfo] = {}
        for group, answer in answers:
            for topic in answer.topics:
                # A topic's type is the first group's that has it (updateTopic sets it on each).
                merged = topics.setdefault(
                    topic.name,
                    query_pb2.TopicInfo(name=topic.name, message_type=topic.message_type),
                )
                for queue in topic.queues:
                    shown = merged.queues.add()
                    shown.CopyFrom(queue)
                    shown.broker_name = group
        return query_pb2.ListQueryTopicsResponse(
            topics=list(topics.values()), unanswered_groups=unanswered
        )

    @relayed
    async def ListGroups(
        self, request: query_pb2.ListGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.ListGroupsResponse:
        answers, unanswered = await self._each_group("ListGroups", request, context)
        merged: dict[str, query_pb2.GroupSummary] = {}
        for _, answer in answers:
            for summary in answer.groups:
                into = merged.setdefault(summary.group, query_pb2.GroupSummary(group=summary.group))
                into.topics.extend(t for t in summary.topics if t not in into.topics)
                into.lag_total += summary.lag_total
        return query_pb2.ListGroupsResponse(
            groups=list(merged.values()), unanswered_groups=unanswered
        )

    @relayed
    async def GroupLag(
        self, request: query_pb2.GroupLagRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.GroupLagResponse:
        answers, unanswered = await self._each_group("GroupLag", request, context)
        response = query_pb2.GroupLagResponse(group=request.group, unanswered_groups=unanswered)
        for group, answer in answers:
            for queue in answer.queues:
                shown = response.queues.add()
                shown.CopyFrom(queue)
                shown.broker_name = group
            response.lag_total += answer.lag_total
        return response

    async def Ping(
        self, request: query_pb2.PingRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.PingResponse:
        return query_pb2.PingResponse()

    async def Stats(
        self, request: query_pb2.StatsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> query_pb2.StatsResponse:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "Stats describes one store: ask a group's query node (the cluster file names them)",
        )
        raise AssertionError("abort returned")
