"""RocketMQ 5's gRPC protocol (apache.rocketmq.v2.MessagingService) on the writer's port:
the calls an official producer of any language makes, answered from the writer's own
topics and stored through the same group commit as ``WriterService.SendStream``.

Every answer carries a v2 ``Status``: the clients read the status field, never the gRPC
code, so a refusal is an OK gRPC call whose status names the problem. Only the consumer
calls, which rmqstore does not serve yet, answer NOT_IMPLEMENTED (docs/rocketmq5.md).
The servicer holds no access control of its own: with ``--acl`` the node's ACL
interceptor checks every call first, by the rules :func:`acl_rules` gives it."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import ipaddress
import logging
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.record import PROPERTIES_LENGTH_MAX
from rmqstore.common.codec.topic import NOT_ALLOWED_SEND_TOPICS, topic_problem
from rmqstore.common.errors import InvalidArgument, NotFound, StoreError, StoreFull
from rmqstore.common.tracing import TRACEPARENT
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.acl import MethodRule, Need, Refused, Requirement
from rmqstore.writer.service import GroupAppender, peer_address
from rmqstore.writer.store import AppendResults, Writer
from rmqstore.writer.validate import (
    RESERVED_PROPERTIES,
    UNIQ_KEY_LENGTH_MAX,
    MessageBatch,
    MessageInput,
)

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
DEFAULT_BROKER_NAME = "rmqstore-0"
# RocketMQ's property for a FIFO message's group (MessageConst.PROPERTY_SHARDING_KEY).
SHARDING_KEY = "__SHARDINGKEY"
# The send retry policy handed to producers: Apache's proxy hands out the same shape, and
# the Java client refuses settings without one.
BACKOFF_INITIAL_MS = 10
BACKOFF_MAX_MS = 1_000
BACKOFF_MULTIPLIER = 2.0
DEFAULT_MAX_ATTEMPTS = 3
ACCEPTED_TYPES = (v2.NORMAL, v2.FIFO)
# The header every official client names its language in, and the languages whose clients
# send no queue id with a message (see MessageReader._queue_id).
LANGUAGE_HEADER = "x-mq-language"
LANGUAGES_WITHOUT_QUEUE_ID = frozenset({"PYTHON", "GOLANG"})
# A message group is a RocketMQ property value: the same rules, a bounded length.
MESSAGE_GROUP_LENGTH_MAX = 255

T = TypeVar("T")
log = logging.getLogger(__name__)


class V2Refusal(Exception):
    """A request or message refused with a v2 status code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def ok_status() -> v2.Status:
    return v2.Status(code=v2.OK, message="OK")


def status_for(error: BaseException) -> v2.Status:
    """The v2 status of an error: the refusals carry theirs, the store's errors are mapped
    here (the edge's one table for this protocol), anything else is the server's fault."""
    if isinstance(error, V2Refusal):
        return v2.Status(code=error.code, message=str(error))  # type: ignore[arg-type]
    if isinstance(error, StoreFull):
        # The clients stop retrying on TOO_MANY_REQUESTS: a full disk is not a blip.
        return v2.Status(code=v2.TOO_MANY_REQUESTS, message=str(error))
    if isinstance(error, NotFound):
        return v2.Status(code=v2.TOPIC_NOT_FOUND, message=str(error))
    if isinstance(error, InvalidArgument):
        return v2.Status(code=v2.BAD_REQUEST, message=str(error))
    if isinstance(error, StoreError):
        return v2.Status(code=v2.INTERNAL_SERVER_ERROR, message=f"{type(error).__name__}: {error}")
    return v2.Status(code=v2.INTERNAL_SERVER_ERROR, message=f"internal error: {type(error).__name__}: {error}")


@dataclass(frozen=True)
class RouteConfig:
    """What QueryRoute hands out: the writer as the one broker of every topic."""

    advertise_host: str
    advertise_port: int
    broker_name: str = DEFAULT_BROKER_NAME

    @classmethod
    def parse(cls, advertise: str, broker_name: str = DEFAULT_BROKER_NAME) -> RouteConfig:
        """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address)."""
        host, sep, port_text = advertise.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise InvalidArgument(f"--advertise {advertise!r}: expected HOST:PORT with a port in 1-65535")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not broker_name or any(c.isspace() for c in broker_name):
            raise InvalidArgument(f"--broker-name {broker_name!r}: expected a non-empty name without spaces")
        return cls(host, int(port_text), broker_name)

    def endpoints(self) -> v2.Endpoints:
        try:
            version = ipaddress.ip_address(self.advertise_host).version
        except ValueError:
            scheme = v2.DOMAIN_NAME
        else:
            scheme = v2.IPv4 if version == 4 else v2.IPv6
        return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=self.advertise_host, port=self.advertise_port)])


def _topic(resource: v2.Resource) -> str:
    name = resource.name
    problem = topic_problem(name)
    if problem is not None:
        raise V2Refusal(v2.ILLEGAL_TOPIC, problem)
    if name in NOT_ALLOWED_SEND_TOPICS:
        raise V2Refusal(v2.ILLEGAL_TOPIC, f"topic {name} is a system topic producers may not send to")
    return name


def _crc32_matches(checksum: str, body: bytes) -> bool:
    # The Java client writes CRC32 in upper-case hex, the Node.js client in decimal.
    crc = zlib.crc32(body)
    text = checksum.strip()
    return any(_parses_to(text, base, crc) for base in (16, 10))


def _parses_to(text: str, base: int, value: int) -> bool:
    try:
        return int(text, base) == value
    except ValueError:
        return False


def check_digest(digest: v2.Digest, body: bytes) -> None:
    """The body's digest as the client computed it over the bytes sent (before any gzip
    decoding). A message without one is taken as it is: the Python client sends none."""
    if not digest.checksum and digest.type == v2.DIGEST_TYPE_UNSPECIFIED:
        return
    if digest.type == v2.CRC32:
        good = _crc32_matches(digest.checksum, body)
    elif digest.type == v2.MD5:
        good = digest.checksum.lower() == hashlib.md5(body).hexdigest()
    elif digest.type == v2.SHA1:
        good = digest.checksum.lower() == hashlib.sha1(body).hexdigest()
    else:
        raise V2Refusal(v2.BAD_REQUEST, f"body_digest type {digest.type} is not CRC32, MD5 or SHA1")
    if not good:
        name = v2.DigestType.Name(digest.type)
        raise V2Refusal(v2.MESSAGE_CORRUPTED, f"invalid body digest: the body's {name} is not {digest.checksum!r}")


def decode_body(encoding: int, body: bytes, max_body_bytes: int) -> bytes:
    """The body as stored: gzip is decoded (a RocketMQ 4.9 reader of the store sees the
    producer's bytes), never past the size limit."""
    if encoding in (v2.ENCODING_UNSPECIFIED, v2.IDENTITY):
        return body
    if encoding != v2.GZIP:
        raise V2Refusal(v2.BAD_REQUEST, f"body_encoding {encoding} is not IDENTITY or GZIP")
    decoder = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        plain = decoder.decompress(body, max_body_bytes + 1)
    except zlib.error as error:
        raise V2Refusal(v2.MESSAGE_CORRUPTED, f"the body is marked GZIP but does not decode: {error}") from None
    if len(plain) > max_body_bytes:
        raise V2Refusal(
            v2.MESSAGE_BODY_TOO_LARGE, f"the gzip body decodes to more than {max_body_bytes} bytes; at most that is allowed"
        )
    if not decoder.eof:
        raise V2Refusal(v2.MESSAGE_CORRUPTED, "the body is marked GZIP but its gzip stream is cut short")
    return plain


def _born_host(text: str, peer: SocketAddress | None) -> SocketAddress | None:
    """The client's address when it gives an IP (with the connection's port), else None,
    which the writer fills with the connection's address: the Java and Node.js clients
    send a host name, which a record cannot hold."""
    return _ip_address(text, peer.port if peer is not None else 0)


@functools.lru_cache(maxsize=1024)  # a client sends the same born host with every message
def _ip_address(text: str, port: int) -> SocketAddress | None:
    """``text`` with ``port`` as a socket address if ``text`` is an IP address, else None."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return SocketAddress(address.packed, port)


class MessageReader:
    """v2 messages as the writer's columns (the batch a ``WriterService`` request is read
    into, with no proto of ours built in between), each checked with the code a RocketMQ
    5 client understands (the writer's validation then finds nothing left to refuse but
    what only the store knows)."""

    def __init__(self, writer: Writer):
        self.writer = writer
        self.limits = writer.config

    def read(
        self, messages: Sequence[v2.Message], peer: SocketAddress | None, sends_queue_id: bool = True
    ) -> MessageBatch:
        if not messages:
            raise V2Refusal(v2.BAD_REQUEST, "the request has no messages")
        if len(messages) > self.limits.max_batch_messages:
            raise V2Refusal(
                v2.BAD_REQUEST, f"the request has {len(messages)} messages; at most {self.limits.max_batch_messages}"
            )
        numbered = len(messages) > 1
        out = []
        for position, message in enumerate(messages, 1):
            try:
                out.append(self._one(message, peer, sends_queue_id))
            except V2Refusal as refusal:
                if numbered:
                    raise V2Refusal(refusal.code, f"message {position}: {refusal}") from None
                raise
        return MessageBatch.of(out)

    def _one(self, message: v2.Message, peer: SocketAddress | None, sends_queue_id: bool) -> MessageInput:
        system = message.system_properties
        topic = _topic(message.topic)
        group = _message_group(system)
        message_id = _message_id(system)
        body = self._body(message)
        keys = list(system.keys)
        self._check_keys(keys)
        tag = _tag(system)
        properties = dict(message.user_properties)
        self._check_properties(properties)
        if group:
            properties[SHARDING_KEY] = group
        if system.trace_context and not _has_separator(system.trace_context):
            # The producer's trace context, kept as an ordinary property: the writer's
            # dispatch span links to it, and so can a consumer's receive span.
            properties.setdefault(TRACEPARENT, system.trace_context)
        if _properties_may_overflow(properties, keys, tag) and _properties_size(properties, keys, tag) > PROPERTIES_LENGTH_MAX:
            raise V2Refusal(
                v2.MESSAGE_PROPERTIES_TOO_LARGE, f"the properties take more than the {PROPERTIES_LENGTH_MAX} bytes a record holds"
            )
        born = system.born_timestamp
        return MessageInput(
            topic=topic,
            body=body,
            keys=keys,
            tags=tag,
            properties=properties,
            queue_id=self._queue_id(topic, system.queue_id, group, sends_queue_id),
            uniq_key=message_id,
            flag=0,
            born_timestamp_ms=born.seconds * 1000 + born.nanos // 1_000_000,
            born_host=_born_host(system.born_host, peer),
        )

    def _body(self, message: v2.Message) -> bytes:
        """The body to store: its digest checked, gzip decoded, its size checked."""
        system = message.system_properties
        check_digest(system.body_digest, message.body)
        body = decode_body(system.body_encoding, message.body, self.limits.max_body_bytes)
        if not body:
            raise V2Refusal(v2.MESSAGE_BODY_EMPTY, "the message body is empty")
        if len(body) > self.limits.max_body_bytes:
            raise V2Refusal(
                v2.MESSAGE_BODY_TOO_LARGE, f"the body is {len(body)} bytes; at most {self.limits.max_body_bytes} allowed"
            )
        return body

    def _check_keys(self, keys: list[str]) -> None:
        if len(keys) > self.limits.max_keys:
            raise V2Refusal(v2.ILLEGAL_MESSAGE_KEY, f"{len(keys)} keys; at most {self.limits.max_keys} allowed")
        for key in keys:
            if not key or len(key) > self.limits.max_key_length or " " in key or _has_separator(key):
                raise V2Refusal(
                    v2.ILLEGAL_MESSAGE_KEY,
                    f"key {key[:40]!r} must be 1-{self.limits.max_key_length} characters without spaces, 0x01 or 0x02",
                )

    @staticmethod
    def _check_properties(properties: dict[str, str]) -> None:
        for name, value in properties.items():
            if not name or name in RESERVED_PROPERTIES or name == SHARDING_KEY or _has_separator(name):
                raise V2Refusal(
                    v2.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property name {name!r} is empty, reserved or holds 0x01/0x02"
                )
            if not value or _has_separator(value):
                raise V2Refusal(
                    v2.BAD_REQUEST,
                    f"user property {name} has an empty value or holds 0x01/0x02, which RocketMQ's format cannot keep",
                )

    def _queue_id(self, topic: str, client_queue_id: int, group: str, sends_queue_id: bool) -> int | None:
        """The queue the message goes to. Most official clients (Java, C#, C++, Rust,
        Node.js) send the queue they picked from the route, a FIFO group's by their own
        hash: it is kept, so their receipt's queue and offset name the stored record. The
        Python and Go clients send none (0 on the wire): their FIFO group is placed by the
        Python client's own rule (SHA-256 of the group, modulo the queue count), so a
        group stays in one queue and the Python receipt names it, and their other messages
        take the writer's round robin."""
        count = self.writer.topics.queue_count(topic)
        if sends_queue_id:
            return client_queue_id if count is None or client_queue_id < count else None
        if not group:
            return None
        digest = int.from_bytes(hashlib.sha256(group.encode()).digest(), "big")
        return digest % (count or self.writer.config.auto_create_queue_count)


def _message_group(system: v2.SystemProperties) -> str:
    """The FIFO group ("" for a NORMAL message), once the type is one rmqstore stores."""
    kind = system.message_type
    group = system.message_group if system.HasField("message_group") else ""
    if kind in (v2.DELAY, v2.TRANSACTION, v2.LITE, v2.PRIORITY):
        name = v2.MessageType.Name(kind)
        raise V2Refusal(v2.UNSUPPORTED, f"{name} messages are not supported: rmqstore stores NORMAL and FIFO messages")
    if system.HasField("delivery_timestamp"):
        raise V2Refusal(
            v2.UNSUPPORTED, "delivery_timestamp (a DELAY message) is not supported: rmqstore stores NORMAL and FIFO messages"
        )
    if kind not in (v2.MESSAGE_TYPE_UNSPECIFIED, v2.NORMAL, v2.FIFO):
        raise V2Refusal(v2.BAD_REQUEST, f"message_type {kind} is not a message type")
    if kind == v2.FIFO and not group:
        raise V2Refusal(v2.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message_group")
    if group and kind == v2.NORMAL:
        raise V2Refusal(v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a NORMAL message has no message_group; send it as FIFO")
    if group and (len(group) > MESSAGE_GROUP_LENGTH_MAX or _has_separator(group) or not group.strip()):
        raise V2Refusal(
            v2.ILLEGAL_MESSAGE_GROUP, f"message_group must be 1-{MESSAGE_GROUP_LENGTH_MAX} characters without 0x01 or 0x02"
        )
    return group


def _message_id(system: v2.SystemProperties) -> str:
    """The client's message id, which becomes the record's UNIQ_KEY."""
    message_id = system.message_id
    if not message_id:
        raise V2Refusal(v2.ILLEGAL_MESSAGE_ID, "the message has no message_id")
    if len(message_id) > UNIQ_KEY_LENGTH_MAX or not message_id.isascii() or not message_id.isalnum():
        raise V2Refusal(v2.ILLEGAL_MESSAGE_ID, f"message_id must be 1-{UNIQ_KEY_LENGTH_MAX} ASCII letters and digits")
    return message_id


def _tag(system: v2.SystemProperties) -> str:
    if not system.HasField("tag"):
        return ""
    tag = system.tag
    # '|' separates tags in a subscription expression ("TagA || TagB"): no tag holds one.
    if not tag.strip() or "|" in tag or _has_separator(tag):
        raise V2Refusal(v2.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} is blank or holds '|', 0x01 or 0x02")
    return tag


def _has_separator(text: str) -> bool:
    return "\x01" in text or "\x02" in text


def _properties_may_overflow(properties: dict[str, str], keys: list[str], tag: str) -> bool:
    """False when the properties surely fit: every character at most 3 UTF-8 bytes, every
    name and value with its separators, and room for the writer's own. Encoding them
    costs more than this count, and almost every message is far below the limit."""
    characters = sum(len(name) + len(value) for name, value in properties.items())
    characters += sum(map(len, keys)) + len(tag)
    separators = 2 * (len(properties) + 3) + len(keys)
    return 3 * characters + separators + 64 + UNIQ_KEY_LENGTH_MAX > PROPERTIES_LENGTH_MAX


def _properties_size(properties: dict[str, str], keys: list[str], tag: str) -> int:
    stored = dict(properties)
    if keys:
        stored[props.KEYS] = props.KEY_SEPARATOR.join(keys)
    if tag:
        stored[props.TAGS] = tag
    return len(props.encode_properties(stored)) + len(props.UNIQ_KEY) + 2 + UNIQ_KEY_LENGTH_MAX


def send_response(results: AppendResults) -> v2s.SendMessageResponse:
    response = v2s.SendMessageResponse(status=ok_status())
    add = response.entries.add
    for uniq_key, queue_offset in zip(results.uniq_keys, results.queue_offsets):
        add(status=ok_status(), message_id=uniq_key, offset=queue_offset)
    return response


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    """apache.rocketmq.v2.MessagingService for producers, all handlers async (the writer's
    asyncio server). Sends share the writer's GroupAppender with WriterService."""

    def __init__(self, writer: Writer, appender: GroupAppender, route: RouteConfig):
        self.writer = writer
        self.appender = appender
        self.route = route
        self.reader = MessageReader(writer)
        # Set when the writer stops: open Telemetry streams end at once rather than hold
        # the server's shutdown grace (a client keeps its stream open for its lifetime).
        self._stopping = asyncio.Event()

    async def end_streams(self) -> None:
        """End every open Telemetry stream (on the server's loop), and any opened later."""
        self._stopping.set()

    @staticmethod
    async def _blocking(call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, call)

    async def _queue_count(self, topic: str) -> int:
        """The topic's queue count, creating it as a first send would."""
        count = self.writer.topics.queue_count(topic)
        if count is not None:
            return count
        config = self.writer.config
        if not config.auto_create_topics:
            raise V2Refusal(
                v2.TOPIC_NOT_FOUND, f"topic {topic} does not exist and the writer does not create topics (--no-auto-create)"
            )
        await self._blocking(lambda: self.writer.topics.create(topic, config.auto_create_queue_count))
        return self.writer.topics.queue_count(topic) or config.auto_create_queue_count

    async def QueryRoute(self, request: v2s.QueryRouteRequest, context: grpc.aio.ServicerContext) -> v2s.QueryRouteResponse:
        try:
            topic = _topic(request.topic)
            count = await self._queue_count(topic)
        except (V2Refusal, StoreError) as error:  # every answer is a v2 status
            return v2s.QueryRouteResponse(status=status_for(error))
        except Exception as error:
            log.exception("QueryRoute failed")
            return v2s.QueryRouteResponse(status=status_for(error))
        broker = v2.Broker(name=self.route.broker_name, id=0, endpoints=self.route.endpoints())
        resource = v2.Resource(name=topic, resource_namespace=request.topic.resource_namespace)
        return v2s.QueryRouteResponse(
            status=ok_status(),
            message_queues=[
                v2.MessageQueue(
                    topic=resource, id=queue_id, permission=v2.READ_WRITE, broker=broker, accept_message_types=ACCEPTED_TYPES
                )
                for queue_id in range(count)
            ],
        )

    async def Heartbeat(self, request: v2s.HeartbeatRequest, context: grpc.aio.ServicerContext) -> v2s.HeartbeatResponse:
        if request.client_type not in v2.ClientType.values():
            return v2s.HeartbeatResponse(status=_unknown_client_type(request.client_type))
        return v2s.HeartbeatResponse(status=ok_status())

    async def NotifyClientTermination(
        self, request: v2s.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> v2s.NotifyClientTerminationResponse:
        return v2s.NotifyClientTerminationResponse(status=ok_status())

    async def SendMessage(
        self, request: v2s.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> v2s.SendMessageResponse:
        try:
            peer = peer_address(context)
            language = next((v for k, v in context.invocation_metadata() or () if k == LANGUAGE_HEADER), "")
            messages = self.reader.read(request.messages, peer, language not in LANGUAGES_WITHOUT_QUEUE_ID)
            return await self.appender.append_batch(messages, peer, send_response)  # type: ignore[no-any-return]
        except Exception as error:  # every answer is a v2 status; a cancelled call is not an answer
            status = status_for(error)
            if status.code == v2.INTERNAL_SERVER_ERROR:
                log.exception("SendMessage failed")
            return v2s.SendMessageResponse(
                status=status, entries=[v2s.SendResultEntry(status=status) for _ in request.messages]
            )

    def _settings(self, settings: v2.Settings) -> v2.Settings:
        """The client's settings as the writer wants them used."""
        answer = v2.Settings()
        answer.CopyFrom(settings)
        attempts = settings.backoff_policy.max_attempts if settings.HasField("backoff_policy") else 0
        answer.backoff_policy.CopyFrom(
            v2.RetryPolicy(
                max_attempts=attempts or DEFAULT_MAX_ATTEMPTS,
                exponential_backoff=v2.ExponentialBackoff(
                    initial=duration_pb2.Duration(nanos=BACKOFF_INITIAL_MS * 1_000_000),
                    max=duration_pb2.Duration(seconds=BACKOFF_MAX_MS // 1000),
                    multiplier=BACKOFF_MULTIPLIER,
                ),
            )
        )
        if settings.WhichOneof("pub_sub") == "publishing" or settings.client_type == v2.PRODUCER:
            answer.publishing.max_body_size = self.writer.config.max_body_bytes
            answer.publishing.validate_message_type = settings.publishing.validate_message_type
        return answer

    async def Telemetry(
        self, request_iterator: AsyncIterator[v2s.TelemetryCommand], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2s.TelemetryCommand]:
        """Answer each Settings; the stream stays open until the client ends it. The
        client's other commands (thread stack traces, verify results) answer the server's
        own commands, which the writer never sends: they are read and dropped."""
        async for command in self._until_stopping(request_iterator):
            if command.WhichOneof("command") != "settings":
                continue
            settings = command.settings
            if settings.client_type not in v2.ClientType.values():
                yield v2s.TelemetryCommand(status=_unknown_client_type(settings.client_type), settings=settings)
                continue
            if settings.client_type not in (v2.CLIENT_TYPE_UNSPECIFIED, v2.PRODUCER):
                yield v2s.TelemetryCommand(
                    status=v2.Status(
                        code=v2.NOT_IMPLEMENTED,
                        message="the writer serves producers; consumers are not served by rmqstore yet",
                    ),
                    settings=settings,
                )
                continue
            yield v2s.TelemetryCommand(status=ok_status(), settings=self._settings(settings))

    async def _until_stopping(self, commands: AsyncIterator[v2s.TelemetryCommand]) -> AsyncIterator[v2s.TelemetryCommand]:
        """The client's commands until it ends the stream or the writer stops."""
        iterator = commands.__aiter__()
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while True:
                following = asyncio.ensure_future(iterator.__anext__())
                # If this call ends while the read is pending (the client drops it, the
                # writer stops), the read's outcome (StopAsyncIteration once the stream
                # closes) is collected here rather than logged by asyncio as never retrieved.
                following.add_done_callback(_collect)
                await asyncio.wait((following, stopping), return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    following.cancel()
                    return
                try:
                    yield following.result()
                except StopAsyncIteration:
                    return
        finally:
            stopping.cancel()

    # The consumer and transaction calls: answered with a v2 status, never a bare gRPC error.

    async def QueryAssignment(self, request: Any, context: grpc.aio.ServicerContext) -> v2s.QueryAssignmentResponse:
        return v2s.QueryAssignmentResponse(status=_not_served("QueryAssignment"))

    async def ReceiveMessage(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[v2s.ReceiveMessageResponse]:
        yield v2s.ReceiveMessageResponse(status=_not_served("ReceiveMessage"))

    async def AckMessage(self, request: Any, context: grpc.aio.ServicerContext) -> v2s.AckMessageResponse:
        return v2s.AckMessageResponse(status=_not_served("AckMessage"))

    async def ForwardMessageToDeadLetterQueue(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> v2s.ForwardMessageToDeadLetterQueueResponse:
        return v2s.ForwardMessageToDeadLetterQueueResponse(status=_not_served("ForwardMessageToDeadLetterQueue"))

    async def PullMessage(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[v2s.PullMessageResponse]:
        yield v2s.PullMessageResponse(status=_not_served("PullMessage"))

    async def UpdateOffset(self, request: Any, context: grpc.aio.ServicerContext) -> v2s.UpdateOffsetResponse:
        return v2s.UpdateOffsetResponse(status=_not_served("UpdateOffset"))

    async def GetOffset(self, request: Any, context: grpc.aio.ServicerContext) -> v2s.GetOffsetResponse:
        return v2s.GetOffsetResponse(status=_not_served("GetOffset"))

    async def QueryOffset(self, request: Any, context: grpc.aio.ServicerContext) -> v2s.QueryOffsetResponse:
        return v2s.QueryOffsetResponse(status=_not_served("QueryOffset"))

    async def EndTransaction(self, request: Any, context: grpc.aio.ServicerContext) -> v2s.EndTransactionResponse:
        return v2s.EndTransactionResponse(status=_not_served("EndTransaction"))

    async def ChangeInvisibleDuration(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> v2s.ChangeInvisibleDurationResponse:
        return v2s.ChangeInvisibleDurationResponse(status=_not_served("ChangeInvisibleDuration"))

    async def RecallMessage(self, request: Any, context: grpc.aio.ServicerContext) -> v2s.RecallMessageResponse:
        return v2s.RecallMessageResponse(status=_not_served("RecallMessage"))

    async def SyncLiteSubscription(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> v2s.SyncLiteSubscriptionResponse:
        return v2s.SyncLiteSubscriptionResponse(status=_not_served("SyncLiteSubscription"))


def _collect(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _unknown_client_type(client_type: int) -> v2.Status:
    return v2.Status(code=v2.UNRECOGNIZED_CLIENT_TYPE, message=f"client_type {client_type} is not a client type")


def _not_served(call: str) -> v2.Status:
    return v2.Status(
        code=v2.NOT_IMPLEMENTED,
        message=f"{call} is not served: the rmqstore writer takes producers' messages only (consumers are not served yet)",
    )


# Authorization (--acl): what each call needs, after RocketMQ 5's ACL 2.0 for the v2
# protocol, and how a refusal is answered.

CONSUMER_TYPES = frozenset({v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER, v2.PULL_CONSUMER, v2.LITE_PUSH_CONSUMER, v2.LITE_SIMPLE_CONSUMER})
_METHOD = f"/{SERVICE_NAME}/"


def _refusal_status(refused: Refused) -> v2.Status:
    """An ACL refusal as the v2 code a client maps to its own exception: no or bad
    credentials are UNAUTHORIZED, an identified caller without the permission FORBIDDEN."""
    code = v2.UNAUTHORIZED if refused.code == grpc.StatusCode.UNAUTHENTICATED else v2.FORBIDDEN
    return v2.Status(code=code, message=str(refused))


def _answer(response: Callable[..., Any]) -> Callable[[Any, Refused], Any]:
    return lambda request, refused: response(status=_refusal_status(refused))


def _send_refused(request: v2s.SendMessageRequest, refused: Refused) -> v2s.SendMessageResponse:
    # The shape of the gateway's other refusals of a send: the status once for the request
    # and once for each message.
    status = _refusal_status(refused)
    return v2s.SendMessageResponse(status=status, entries=[v2s.SendResultEntry(status=status) for _ in request.messages])


def _sub(group: v2.Resource, topic: v2.Resource) -> list[Requirement]:
    return [("Sub", f"Group:{group.name}"), ("Sub", f"Topic:{topic.name}")]


def _telemetry_needs(command: v2s.TelemetryCommand) -> list[Requirement]:
    """A Settings command declares what the client will do: a producer's topics need Pub,
    a consumer's group and subscribed topics Sub. The other commands answer the server."""
    if command.WhichOneof("command") != "settings":
        return []
    settings = command.settings
    needs: list[Requirement] = [("Pub", f"Topic:{topic.name}") for topic in settings.publishing.topics]
    if settings.HasField("subscription"):
        subscription = settings.subscription
        needs.append(("Sub", f"Group:{subscription.group.name}"))
        needs += [("Sub", f"Topic:{entry.topic.name}") for entry in subscription.subscriptions]
    return needs


def acl_rules(writer: Writer) -> dict[str, MethodRule]:
    """The ACL's rules for every MessagingService method, by full method name.

    A topic that a route query or a send would create (it does not exist and the writer
    auto-creates) needs Create too: without it, anyone allowed to publish to a pattern
    could make topics without bound. The consumer calls, which answer NOT_IMPLEMENTED,
    are authorized all the same, so that serving them later opens nothing unchecked."""

    def created(topic: str) -> list[Requirement]:
        new = writer.config.auto_create_topics and writer.topics.queue_count(topic) is None
        return [("Create", f"Topic:{topic}")] if new else []

    def query_route(request: v2s.QueryRouteRequest) -> list[Requirement]:
        topic = request.topic.name
        return [(("Pub", "Sub"), f"Topic:{topic}"), *created(topic)]

    def send_message(request: v2s.SendMessageRequest) -> list[Requirement]:
        # Every message's topic, each once, in the order of the request.
        topics = list(dict.fromkeys(message.topic.name for message in request.messages))
        return [need for topic in topics for need in (("Pub", f"Topic:{topic}"), *created(topic))]

    def heartbeat(request: v2s.HeartbeatRequest) -> list[Requirement]:
        return [("Sub", f"Group:{request.group.name}")] if request.client_type in CONSUMER_TYPES else []

    def termination(request: v2s.NotifyClientTerminationRequest) -> list[Requirement]:
        # A producer names no group: it needs nothing to say goodbye.
        return [("Sub", f"Group:{request.group.name}")] if request.group.name else []

    needs: dict[str, tuple[Need, Callable[..., Any]]] = {
        "QueryRoute": (query_route, v2s.QueryRouteResponse),
        "Heartbeat": (heartbeat, v2s.HeartbeatResponse),
        "NotifyClientTermination": (termination, v2s.NotifyClientTerminationResponse),
        "EndTransaction": (lambda r: [("Pub", f"Topic:{r.topic.name}")], v2s.EndTransactionResponse),
        "RecallMessage": (lambda r: [("Pub", f"Topic:{r.topic.name}")], v2s.RecallMessageResponse),
        "QueryAssignment": (lambda r: _sub(r.group, r.topic), v2s.QueryAssignmentResponse),
        "ReceiveMessage": (lambda r: _sub(r.group, r.message_queue.topic), v2s.ReceiveMessageResponse),
        "AckMessage": (lambda r: _sub(r.group, r.topic), v2s.AckMessageResponse),
        "ForwardMessageToDeadLetterQueue": (lambda r: _sub(r.group, r.topic), v2s.ForwardMessageToDeadLetterQueueResponse),
        "ChangeInvisibleDuration": (lambda r: _sub(r.group, r.topic), v2s.ChangeInvisibleDurationResponse),
        "PullMessage": (lambda r: _sub(r.group, r.message_queue.topic), v2s.PullMessageResponse),
        "UpdateOffset": (lambda r: _sub(r.group, r.message_queue.topic), v2s.UpdateOffsetResponse),
        "GetOffset": (lambda r: _sub(r.group, r.message_queue.topic), v2s.GetOffsetResponse),
        "QueryOffset": (lambda r: [("Sub", f"Topic:{r.message_queue.topic.name}")], v2s.QueryOffsetResponse),
        "SyncLiteSubscription": (lambda r: _sub(r.group, r.topic), v2s.SyncLiteSubscriptionResponse),
    }
    rules = {_METHOD + name: MethodRule(need, _answer(response)) for name, (need, response) in needs.items()}
    rules[_METHOD + "SendMessage"] = MethodRule(send_message, _send_refused)
    # Telemetry is a stream both ways: a refusal ends it with a gRPC error, which the
    # clients log with its code; a status inside a settings answer they drop unread.
    rules[_METHOD + "Telemetry"] = MethodRule(_telemetry_needs)
    return rules
