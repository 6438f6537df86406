"""RocketMQ 5's gRPC protocol (apache.rocketmq.v2.MessagingService) on the writer's port:
the calls an official producer of any language makes, answered from the writer's own
topics and stored through the same group commit as ``WriterService.SendStream``; and the
calls of its simple and push consumers, over the groups' progress in
:mod:`rmqstore.writer.consumers`.

Every answer carries a v2 ``Status``: the clients read the status field, never the gRPC
code, so a refusal is an OK gRPC call whose status names the problem. Only lite topics
answer NOT_IMPLEMENTED (docs/rocketmq5.md). Transactions are resolved as Apache's proxy
and broker resolve them: EndTransaction finds the half message by the transaction data the
send receipt (or a check) left, and a check asks a producer of the topic over its Telemetry
stream (:mod:`rmqstore.writer.transaction_check`).
The servicer holds no access control of its own: with ``--acl`` the node's ACL
interceptor checks every call first, by the rules :func:`acl_rules` gives it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import ipaddress
import logging
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc
from google.protobuf import duration_pb2, timestamp_pb2
from opentelemetry import trace

from rmqstore.common.codec import properties as props
from rmqstore.common.codec.consumequeue import HALF_TOPIC, TIMER_TOPIC
from rmqstore.common.codec.hosts import SocketAddress
from rmqstore.common.codec.msgid import offset_msg_id
from rmqstore.common.codec.record import PROPERTIES_LENGTH_MAX, Record
from rmqstore.common.codec.topic import (
    NOT_ALLOWED_SEND_TOPICS,
    topic_problem,
)
from rmqstore.common.conventions import (
    MESSAGING_BATCH_MESSAGE_COUNT,
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_OPERATION_TYPE,
    MESSAGING_SYSTEM,
    ROCKETMQ,
    TRACEPARENT,
)
from rmqstore.common.errors import (
    InvalidArgument,
    NotFound,
    NotInSync,
    NotPrimary,
    StoreError,
    StoreFull,
)
from rmqstore.common.files.consumequeue import Boundary
from rmqstore.common.tracing import leaf_span, links_from_messages, tracing_on
from rmqstore.common.transport import parse_endpoint
from rmqstore.rocketmq_v2 import definition_pb2 as v2
from rmqstore.rocketmq_v2 import service_pb2 as v2s
from rmqstore.rocketmq_v2 import service_pb2_grpc
from rmqstore.service.acl import Answered, MethodRule, Need, Refused, Requirement
from rmqstore.service.errors import StreamRefusal
from rmqstore.writer.config import LARGE_ANSWER_BYTES_PER_S, WriterConfig
from rmqstore.writer.consumers import (
    BATCH_MAX,
    DLQ_PREFIX,
    INVISIBLE_MS_MAX,
    RECEIVE_BYTES_MAX,
    SCAN_UNITS_MAX,
    ConsumerGroups,
    ExpiredReceiptHandle,
    Handed,
    IllegalFilter,
    IllegalGroup,
    InvalidReceiptHandle,
    Picked,
    TagFilter,
    check_group,
)
from rmqstore.writer.consumers import DEFAULT_MAX_ATTEMPTS as DEFAULT_CONSUMER_MAX_ATTEMPTS
from rmqstore.writer.group_commit import GroupAppender
from rmqstore.writer.schedule import parse_recall_handle, recall_handle, recall_marker
from rmqstore.writer.service import peer_address
from rmqstore.writer.store import AppendResults, Writer
from rmqstore.writer.transaction_check import Check, TransactionCheck
from rmqstore.writer.transactions import TRANSACTION_DATA_EXPIRE_MS, TRANSACTION_DATA_MAX
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
# ProxyConfig.maxTransactionRecoverySecond: the longest orphaned_transaction_recovery_duration.
MAX_TRANSACTION_RECOVERY_S = 3600
# MessageConst.PROPERTY_BORN_HOST: the born host as the client gave it (or, without one,
# the connection's address), kept as Apache's proxy keeps it and handed back on receive.
BORN_HOST = "__BORNHOST"
# Properties the gateway sets itself, which a v2 user property may not name (MessageConst's
# STRING_HASH_SET, as Apache's proxy refuses them).
V2_SYSTEM_PROPERTIES = frozenset({SHARDING_KEY, BORN_HOST, props.TRAN_MSG, props.PGROUP})
# A scheduled message's properties that Apache's proxy keeps out of the user properties
# (MessageConst.STRING_HASH_SET): the delay level, the real topic and queue, the timer's.
SCHEDULE_PROPERTIES = (
    props.DELAY, props.REAL_TOPIC, props.REAL_QID, props.TIMER_DELIVER_MS, props.TIMER_DELAY_SEC, props.TIMER_DELAY_MS,
    props.TIMER_OUT_MS, props.TIMER_ENQUEUE_MS, props.TIMER_DEQUEUE_MS, props.TIMER_DEL_UNIQKEY,
)  # fmt: skip
# The send retry policy handed to producers: Apache's proxy hands out the same shape, and
# the Java client refuses settings without one.
BACKOFF_INITIAL_MS = 10
BACKOFF_MAX_MS = 1_000
BACKOFF_MULTIPLIER = 2.0
DEFAULT_MAX_ATTEMPTS = 3
# The message types a route says a topic accepts, by its message.type (RouteActivity's
# parseTopicMessageType); a type Apache does not know (UNSPECIFIED) accepts none.
ACCEPTED_TYPES: dict[str, tuple[v2.MessageType, ...]] = {
    "NORMAL": (v2.NORMAL,),
    "FIFO": (v2.FIFO,),
    "DELAY": (v2.DELAY,),
    "TRANSACTION": (v2.TRANSACTION,),
    "MIXED": (v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION),
}
UNSPECIFIED_TYPES: tuple[v2.MessageType, ...] = (v2.MESSAGE_TYPE_UNSPECIFIED,)
# Apache's proxy's answer for a topic it has no route for (TopicRouteService, an
# MQClientException of TOPIC_NOT_EXIST, 17, with FAQUrl.attachDefaultURL's tail).
FAQ_URL = "https://rocketmq.apache.org/docs/bestPractice/06FAQ"
# The header every official client names its language in, and the languages whose clients
# send no queue id with a message (see MessageReader._queue_id).
LANGUAGE_HEADER = "x-mq-language"
LANGUAGES_WITHOUT_QUEUE_ID = frozenset({"PYTHON", "GOLANG"})
# A message group is a RocketMQ property value: the same rules, a bounded length.
MESSAGE_GROUP_LENGTH_MAX = 255

# Consumers: the long poll's bounds, and what a consumer is told in the Settings answer
# (a group's dead-letter topic is DLQ_PREFIX + group, MixAll.DLQ_GROUP_TOPIC_PREFIX).
DEFAULT_LONG_POLL_MS = 20_000
LONG_POLL_MS_MAX = 60_000
POLL_MARGIN_S = 0.5
AUTO_RENEW_INVISIBLE_MS = 60_000
INVISIBLE_MS_APACHE_MIN = 10_000  # ProxyConfig.minInvisibleTimeMillsForRecv
RECEIVE_BATCH_SIZE = 32
# Records of an answer up to this many bytes are read and made into messages on the
# loop: a thread's hop costs more than that. Larger ones are read on the executor, so a
# receive of 16 MiB holds no other call up.
INLINE_READ_BYTES_MAX = 256 * 1024
# A larger answer's messages are made on the executor in pieces of about this many bytes
# of bodies (a message never split), each sent before the next is made, and by one call at
# a time (MessagingServicer._large): clients asking 16 MiB answers without a pause share
# one thread, whose each hop holds the interpreter's lock only briefly, rather than take
# the lock from the loop that serves everyone else's sends (benchmarks/GATEWAY.md).
ANSWER_PIECE_BYTES = 1024 * 1024
# A group's retries (push consumers): Apache's maxReconsumeTimes 16 is 17 deliveries, and
# its delay levels from the fourth (1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h).
DEFAULT_RETRY_DELAYS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
# RocketMQ's properties of a message moved to a dead-letter topic.
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
RETRY_TOPIC = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUME_TIMES = "RECONSUME_TIME"

T = TypeVar("T")
A = TypeVar("A")
log = logging.getLogger(__name__)
_TRACER = trace.get_tracer(__name__)


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
    if isinstance(error, ExpiredReceiptHandle):
        # The words of Apache's proxy (its ProxyException, wrapped as its gRPC answer shows it).
        return v2.Status(code=v2.INVALID_RECEIPT_HANDLE, message=f"org.apache.rocketmq.proxy.common.ProxyException: {error}")
    if isinstance(error, InvalidReceiptHandle):
        return v2.Status(code=v2.INVALID_RECEIPT_HANDLE, message=str(error))
    if isinstance(error, IllegalFilter):
        return v2.Status(code=v2.ILLEGAL_FILTER_EXPRESSION, message=str(error))
    if isinstance(error, IllegalGroup):
        return v2.Status(code=v2.ILLEGAL_CONSUMER_GROUP, message=str(error))
    if isinstance(error, StoreFull):
        # The clients stop retrying on TOO_MANY_REQUESTS: a full disk is not a blip.
        return v2.Status(code=v2.TOO_MANY_REQUESTS, message=str(error))
    if isinstance(error, (NotPrimary, NotInSync)):
        # Apache's proxy answers a broker's SLAVE_NOT_AVAILABLE with HA_NOT_AVAILABLE.
        return v2.Status(code=v2.HA_NOT_AVAILABLE, message=str(error))
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
        try:
            host, port = parse_endpoint(advertise)
        except InvalidArgument as error:
            raise InvalidArgument(f"--advertise: {error}") from None
        if not broker_name or any(c.isspace() for c in broker_name):
            raise InvalidArgument(f"--broker-name {broker_name!r}: expected a non-empty name without spaces")
        return cls(host, port, broker_name)

    def endpoints(self) -> v2.Endpoints:
        try:
            version = ipaddress.ip_address(self.advertise_host).version
        except ValueError:
            scheme = v2.DOMAIN_NAME
        else:
            scheme = v2.IPv4 if version == 4 else v2.IPv6
        return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=self.advertise_host, port=self.advertise_port)])


def topic_not_found(topic: str) -> V2Refusal:
    return V2Refusal(
        v2.TOPIC_NOT_FOUND,
        f"CODE: 17  DESC: No topic route info in name server for the topic: {topic}\n"
        f"For more information, please visit the url, {FAQ_URL}",
    )


def _sent_type(message: v2.Message) -> str:
    """The message's type as Apache's proxy reads it from the properties it makes of the
    message (TopicMessageType.parseFromMessageProperty): transactional, else timed, else
    with a message group FIFO, else NORMAL."""
    system = message.system_properties
    if system.message_type == v2.TRANSACTION:
        return "TRANSACTION"
    if system.HasField("delivery_timestamp") or system.message_type == v2.DELAY:
        return "DELAY"
    if system.HasField("message_group") and system.message_group:
        return "FIFO"
    return "NORMAL"


def check_message_type(topic_type: str, message: v2.Message) -> None:
    """DefaultTopicMessageTypeValidator: a topic takes messages of its own type, a MIXED
    topic any; refused with the proxy's code and words (a ProxyException wrapped in a
    GrpcProxyException, whose message is the ProxyException's toString)."""
    sent = _sent_type(message)
    if sent != topic_type and topic_type != "MIXED":
        raise V2Refusal(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "org.apache.rocketmq.proxy.common.ProxyException: TopicMessageType validate failed, "
            f"the expected type is {topic_type}, but actual type is {sent}",
        )


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


def _born_host_text(text: str, peer: SocketAddress | None) -> str:
    """What the record's ``__BORNHOST`` keeps (SendMessageActivity): the client's born host
    as it sent it (an IP, or the host name the Java and Node.js clients send), else the
    connection's address; "" when there is neither or it cannot be a property value."""
    text = text.strip()
    if not text and peer is not None:
        text = peer.java_text()
    return "" if _has_separator(text) else text


class ProgressGate(Protocol):
    """What holds a consumer's acknowledgement back until the replicas have it (a SYNC
    writer group's primary: writer.replication.tracker.SyncTracker). On the loop."""

    def hold_progress(self, version: int, release: Callable[[BaseException | None], None]) -> None:
        """Call ``release(None)`` once the groups' progress of ``version`` (and the commit
        log to its end now) is on enough replicas, or ``release(error)`` once it cannot be."""


class ReaderTopics(Protocol):
    def queue_count(self, topic: str) -> int | None: ...

    def message_type(self, topic: str) -> str | None: ...


class ReaderSource(Protocol):
    """What :class:`MessageReader` reads of a writer: its limits and its topics' queue
    counts and message types (a proxy gives its own: rmqstore.proxy)."""

    @property
    def config(self) -> WriterConfig: ...

    @property
    def topics(self) -> ReaderTopics: ...


class MessageReader:
    """v2 messages as the writer's columns (the batch a ``WriterService`` request is read
    into, with no proto of ours built in between), each checked with the code a RocketMQ
    5 client understands (the writer's validation then finds nothing left to refuse but
    what only the store knows)."""

    def __init__(self, writer: ReaderSource):
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
        if system.message_type == v2.TRANSACTION:
            # SendMessageActivity.buildMessageProperty: a half message, its producer group
            # the topic ("here use topicName as producerGroup for transactional checker").
            properties[props.TRAN_MSG] = "true"
            properties[props.PGROUP] = topic
            if system.HasField("orphaned_transaction_recovery_duration"):
                seconds = system.orphaned_transaction_recovery_duration.seconds
                if seconds > MAX_TRANSACTION_RECOVERY_S:
                    raise V2Refusal(
                        v2.BAD_REQUEST, f"the max transaction recovery time of message is too large, max is {MAX_TRANSACTION_RECOVERY_S}"
                    )
                properties[props.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(max(seconds, 0))
        if system.HasField("delivery_timestamp"):
            # SendMessageActivity.fillDelayMessageProperty: the writer moves it to the timer.
            properties[props.TIMER_DELIVER_MS] = str(self._delivery_ms(system.delivery_timestamp))
        born_host = _born_host_text(system.born_host, peer)
        if born_host:
            properties[BORN_HOST] = born_host
        if system.trace_context and not _has_separator(system.trace_context):
            # The producer's trace context, kept as an ordinary property: the writer's
            # append span links to it, and so can a consumer's receive span.
            properties.setdefault(TRACEPARENT, system.trace_context)
        if _properties_may_overflow(properties, keys, tag) and _properties_size(properties, keys, tag) > PROPERTIES_LENGTH_MAX:
            raise V2Refusal(
                v2.MESSAGE_PROPERTIES_TOO_LARGE, f"the properties take more than the {PROPERTIES_LENGTH_MAX} bytes a record holds"
            )
        # As Apache's proxy: the message is checked first (SendMessageActivity), then its
        # type against the topic's and the topic's existence (ProducerProcessor).
        topic_type = self.writer.topics.message_type(topic)
        if topic_type is None:  # a send creates no topic, as a route query does not
            raise topic_not_found(topic)
        check_message_type(topic_type, message)
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
            # The record's own born host is the connection's address (None: the writer
            # fills in the same), an address that existed; __BORNHOST keeps the client's.
            born_host=peer,
        )

    def _delivery_ms(self, timestamp: timestamp_pb2.Timestamp) -> int:
        """SendMessageActivity.validateDelayTime: at most the timer's maximum delay ahead."""
        delivery_ms = timestamp.seconds * 1000 + timestamp.nanos // 1_000_000
        max_delay_ms = self.writer.config.timer_max_delay_ms
        if delivery_ms - _now_ms() > max_delay_ms:
            raise V2Refusal(v2.ILLEGAL_DELIVERY_TIME, f"the max delay time of message is too large, max is {max_delay_ms}")
        return max(delivery_ms, 0)

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
            if not name or name in RESERVED_PROPERTIES or name in V2_SYSTEM_PROPERTIES or _has_separator(name):
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
    if kind in (v2.LITE, v2.PRIORITY):
        name = v2.MessageType.Name(kind)
        raise V2Refusal(
            v2.UNSUPPORTED, f"{name} messages are not supported: rmqstore stores NORMAL, FIFO, DELAY and TRANSACTION messages"
        )
    if kind not in (v2.MESSAGE_TYPE_UNSPECIFIED, v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION):
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
    # Apache's broker answers the message id as the transaction id too
    # (SendMessageProcessor: MessageClientIDSetter.getUniqID), and the proxy passes it on.
    for uniq_key, queue_offset in zip(results.uniq_keys, results.queue_offsets):
        add(status=ok_status(), message_id=uniq_key, transaction_id=uniq_key, offset=queue_offset)
    return response


def timed_send_response(messages: MessageBatch, broker_name: str, results: AppendResults) -> v2s.SendMessageResponse:
    """:func:`send_response`, each timed message's entry with its recall handle
    (SendMessageProcessor.attachRecallHandle; a batch gets none, as in Apache)."""
    response = send_response(results)
    if len(results) != 1 or results.topics[0] != TIMER_TOPIC:
        return response
    due = int(messages.properties[0][props.TIMER_DELIVER_MS])
    response.entries[0].recall_handle = recall_handle(messages.topics[0], broker_name, due, results.uniq_keys[0])
    return response


@dataclass(frozen=True)
class ConsumerPolicy:
    """What the writer tells consumers: their retries (max delivery attempts, the delay
    before each retry) and how long an auto-renewed delivery stays invisible."""

    max_attempts: int = DEFAULT_CONSUMER_MAX_ATTEMPTS
    retry_delays_s: tuple[int, ...] = DEFAULT_RETRY_DELAYS_S
    auto_renew_invisible_ms: int = AUTO_RENEW_INVISIBLE_MS
    # The shortest invisible duration a receive may ask (the proxy's
    # minInvisibleTimeMillsForRecv); ChangeInvisibleDuration may ask 0.
    min_invisible_ms: int = INVISIBLE_MS_APACHE_MIN
    # Large answers' bytes a second, every client's together (0: unlimited).
    large_answer_bytes_per_s: int = LARGE_ANSWER_BYTES_PER_S


class LargeAnswers:
    """Answers larger than INLINE_READ_BYTES_MAX, node-wide: their records read and their
    pieces made one call at a time, in the order they asked (``lock``), and their reads
    paced to ``bytes_per_s`` (0: unpaced) by a token bucket holding one second's worth:
    a read takes its bytes at once, going into debt if it must, and waits until the debt
    is paid, so the calls after it wait their turn behind it."""

    def __init__(self, bytes_per_s: int, clock: Callable[[], float] = time.monotonic):
        self.lock = asyncio.Lock()
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._tokens = float(bytes_per_s)
        self._stamp = clock()

    def reserve(self, size: int) -> float:
        """Take ``size`` bytes from the bucket: the seconds to wait before reading them."""
        if not self.bytes_per_s:
            return 0.0
        now = self._clock()
        self._tokens = min(float(self.bytes_per_s), self._tokens + (now - self._stamp) * self.bytes_per_s) - size
        self._stamp = now
        return max(0.0, -self._tokens / self.bytes_per_s)

    async def read(self, size: int, read: Callable[[], Awaitable[T]]) -> T:
        """``read()`` of an answer's ``size`` bytes, once the pace allows, under the lock."""
        wait_s = self.reserve(size)
        if wait_s:
            try:
                await asyncio.sleep(wait_s)
            except asyncio.CancelledError:
                self._tokens += size  # the call is gone (its deadline, its client): nothing was read
                raise
        async with self.lock:
            return await read()


class Wakeup:
    """Long polls waiting for new messages, each on one topic (a receive takes from any of
    its queues) or one queue of it (a pull): an append wakes only the polls waiting on
    what it appended to, each of which then looks again, with no timer loop. A poll on
    another topic costs an append nothing."""

    def __init__(self) -> None:
        # topic -> the futures of the polls on it, each with its queue (None: every queue).
        self._waiters: dict[str, dict[asyncio.Future[None], int | None]] = {}

    @property
    def waiting(self) -> int:
        """How many long polls wait now."""
        return sum(map(len, self._waiters.values()))

    def appended(self, results: AppendResults) -> None:
        """Wake the polls on the queues ``results`` appended to."""
        if not self._waiters:
            return
        for topic, queue_id in set(zip(results.topics, results.queue_ids)):
            self.notify(topic, queue_id)

    def notify(self, topic: str, queue_id: int | None = None) -> None:
        """Wake the polls on ``topic`` (those on ``queue_id`` and on every queue; with no
        ``queue_id``, all of them)."""
        waiters = self._waiters.get(topic)
        if not waiters:
            return
        woken = [w for w, q in waiters.items() if queue_id is None or q is None or q == queue_id]
        for waiter in woken:
            del waiters[waiter]
            if not waiter.done():
                waiter.set_result(None)
        if not waiters:
            del self._waiters[topic]

    def notify_all(self) -> None:
        for topic in list(self._waiters):
            self.notify(topic)

    async def wait(self, topic: str, queue_id: int | None, timeout_s: float) -> None:
        """Until an append to ``topic`` (its queue ``queue_id``; None: any) or ``timeout_s``."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(topic, {})[waiter] = queue_id
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(topic)
            if waiters is not None:
                waiters.pop(waiter, None)
                if not waiters:
                    del self._waiters[topic]


@dataclass
class Piece(Generic[T]):
    """Messages of one answer made at once (ANSWER_PIECE_BYTES), and their bodies' size."""

    items: list[T]
    body_bytes: int


def _pieces(items: list[T], body_bytes: Callable[[T], int]) -> list[Piece[T]]:
    """``items`` in order, cut into pieces of about ANSWER_PIECE_BYTES of bodies each (a
    piece ends once it reaches that; an answer within INLINE_READ_BYTES_MAX is one piece)."""
    sizes = [body_bytes(one) for one in items]
    if sum(sizes) <= INLINE_READ_BYTES_MAX:
        return [Piece(items, sum(sizes))]
    pieces: list[Piece[T]] = []
    piece: Piece[T] = Piece([], 0)
    for one, size in zip(items, sizes):
        piece.items.append(one)
        piece.body_bytes += size
        if piece.body_bytes >= ANSWER_PIECE_BYTES:
            pieces.append(piece)
            piece = Piece([], 0)
    if piece.items:
        pieces.append(piece)
    return pieces


def _receive_span(group: str, handed: list[Handed]) -> AbstractContextManager[Any]:
    """The span of a receive that hands out messages, linked to the trace contexts their
    producers stored with them, so one trace runs from a producer through the writer to
    the consumer; nothing while tracing is off."""
    if not tracing_on():
        return nullcontext()
    attributes = {
        MESSAGING_SYSTEM: ROCKETMQ,
        MESSAGING_OPERATION_TYPE: "receive",
        MESSAGING_DESTINATION_NAME: handed[0].record.topic,
        MESSAGING_CONSUMER_GROUP_NAME: group,
        MESSAGING_BATCH_MESSAGE_COUNT: len(handed),
    }
    return leaf_span(_TRACER, "rmqstore.receive", attributes, links_from_messages(one.record.properties for one in handed))



def with_retry_policy(settings: v2.Settings) -> v2.Settings:
    """The client's settings with the gateway's retry policy: exponential backoff, and the
    client's own max attempts (DEFAULT_MAX_ATTEMPTS when it gives none)."""
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
    return answer

class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    """apache.rocketmq.v2.MessagingService, all handlers async (the writer's asyncio
    server). Sends share the writer's GroupAppender with WriterService; each append
    wakes the consumers' long polls on the queues it appended to."""

    def __init__(
        self,
        writer: Writer,
        appender: GroupAppender,
        route: RouteConfig,
        consumers: ConsumerGroups | None = None,
        policy: ConsumerPolicy = ConsumerPolicy(),
        transactions: TransactionCheck | None = None,
    ):
        self.writer = writer
        self.appender = appender
        self.route = route
        self.reader = MessageReader(writer)
        self.consumers = consumers if consumers is not None else ConsumerGroups(writer, writer.paths.config)
        self.policy = policy
        self.consumers.max_attempts = policy.max_attempts
        self.auto_renew_invisible_ms = policy.auto_renew_invisible_ms
        self.wakeup = Wakeup()
        # The queue each (group, topic)'s next receive starts at.
        self._next_queue: dict[tuple[str, str], int] = {}
        appender.listeners.append(self.wakeup.appended)
        self._flusher: asyncio.Task[None] | None = None
        # A writer group's primary under SYNC replication (writer.replication.tracker): an
        # acknowledgement is answered once the in-sync replicas hold the groups' progress
        # that has it (None: answered at once, the progress written every flush interval).
        self.progress_gate: ProgressGate | None = None
        # Told on the loop after each snapshot of the groups' progress, as its write starts
        # (the followers' streams send it meanwhile).
        self.progress_taken: list[Callable[[], None]] = []
        self._flush_now = asyncio.Event()
        # Set when the writer stops: open Telemetry streams end at once rather than hold
        # the server's shutdown grace (a client keeps its stream open for its lifetime).
        self._stopping = asyncio.Event()
        self.transactions = transactions if transactions is not None else TransactionCheck(writer)
        self.transaction_data = TransactionData()
        # The Telemetry streams of producers, by the topics they publish (a v2 producer's
        # group is its topic): where a check's RecoverOrphanedTransactionCommand goes.
        self._producers: dict[str, dict[int, asyncio.Queue[Any]]] = {}
        self._checker: asyncio.Task[None] | None = None
        # Large answers: read at a pace, and read or made one call at a time
        # (ANSWER_PIECE_BYTES, LARGE_ANSWER_BYTES_PER_S).
        self._large = LargeAnswers(self.policy.large_answer_bytes_per_s)

    async def end_streams(self) -> None:
        """End every open Telemetry stream and long poll (on the server's loop), and any
        opened later; stop the periodic flush of the groups' progress."""
        self._stopping.set()
        self.wakeup.notify_all()
        if self._flusher is not None:
            self._flusher.cancel()
        if self._checker is not None:
            self._checker.cancel()

    async def start_checking(self) -> None:
        """Check unresolved transactions every check interval (on the server's loop: the
        look runs on a thread, its commands go out on the producers' streams)."""
        self._checker = asyncio.get_running_loop().create_task(self._check_loop())

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.transactions.settings.check_interval_ms / 1000)
            try:
                await self.check_transactions()
            except (StoreError, OSError) as error:
                log.error("checking transactions failed; retrying at the next interval: %s", error)

    async def check_transactions(self) -> int:
        """One check (TransactionalMessageCheckService.onWaitEnd): each half message due a
        check is appended again and its producer asked; how many were asked."""
        checks = await self._blocking(self.transactions.check)
        asked = 0
        for check in checks:
            asked += self._ask_producer(check)
        return asked

    def _ask_producer(self, check: Check) -> int:
        """AbstractTransactionalMessageCheckListener.sendCheckMessage and the proxy's
        GrpcClientChannel.processCheckTransaction: the transaction data kept for the new
        copy, a RecoverOrphanedTransactionCommand (the message in its real topic) on one
        stream of a producer of the group; no producer, no command (the next check asks again)."""
        streams = self._producers.get(check.group)
        if not streams:
            log.warning("transaction %s: no producer of %s to check it with", check.transaction_id, check.group)
            return 0
        self.transaction_data.add(check.group, check.transaction_id, check.half_queue_offset, check.commitlog_offset)
        record = check.record
        real_topic = record.properties.get(props.REAL_TOPIC, "")
        real_queue = record.properties.get(props.REAL_QID, "0")
        message = v2.Message()
        queue_id = int(real_queue) if real_queue.isascii() and real_queue.isdigit() else 0
        self._message(Handed(record, queue_id, check.half_queue_offset, 1, "", _now_ms()), v2.Resource(name=real_topic), message)
        for field in ("receipt_handle", "invisible_duration", "delivery_attempt"):
            message.system_properties.ClearField(field)
        command = v2s.TelemetryCommand(
            recover_orphaned_transaction_command=v2s.RecoverOrphanedTransactionCommand(
                message=message, transaction_id=check.transaction_id
            )
        )
        outbox = list(streams.values())[-1]
        outbox.put_nowait(_Outgoing(command))
        return 1

    async def start_flushing(self) -> None:
        """Write the groups' progress every flush interval (on the server's loop: the
        snapshot is taken there, the files are written on a thread)."""
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        consumers = self.consumers
        while True:
            # Every flush interval, and at once while an acknowledgement waits for the
            # replicas (:meth:`_progress_replicated`): those taken during a write go with
            # the next one, as a group commit takes sends.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(consumers.flush_interval_ms / 1000):
                    await self._flush_now.wait()
            self._flush_now.clear()
            if not consumers.dirty:
                continue
            table, state = consumers.snapshot()
            for listener in self.progress_taken:
                listener()
            try:
                await self._blocking(functools.partial(consumers.write, table, state))
            except OSError as error:
                consumers.dirty = True  # tried again at the next interval
                log.error("writing the consumer groups' progress failed: %s", error)

    async def _progress_replicated(self) -> None:
        """Return once the acknowledgements taken so far may be answered: at once on a
        single node or under ASYNC replication; under SYNC once the in-sync replicas (at
        least --min-insync, the primary included) hold the groups' progress that has them,
        and the commit log up to its end now (so no replica elected next lacks a message
        acknowledged). The primary's own copy is written as a single node's is (at once
        here, durable once the flush's write is done). Raises why not (not in sync, not
        the primary)."""
        gate = self.progress_gate
        if gate is None:
            return
        version = self.consumers.version
        if version > self.consumers.snapshot_version:
            self._flush_now.set()
        held: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def release(refusal: BaseException | None) -> None:
            if held.done():
                return
            if refusal is None:
                held.set_result(None)
            else:
                held.set_exception(refusal)

        gate.hold_progress(version, release)
        await held

    @staticmethod
    async def _blocking(call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, call)

    def accepted_types(self, topic: str) -> tuple[v2.MessageType, ...]:
        return ACCEPTED_TYPES.get(self.writer.topics.message_type(topic) or "", UNSPECIFIED_TYPES)

    async def QueryRoute(self, request: v2s.QueryRouteRequest, context: grpc.aio.ServicerContext) -> v2s.QueryRouteResponse:
        """The topic's queues and the message types it accepts. A topic the writer does not
        have is not created: Apache's proxy answers NotFound (and a route query that made
        topics let any client fill the store's disk with queues)."""
        try:
            topic = _topic(request.topic)
            count = self.writer.topics.queue_count(topic)
            if count is None:
                raise topic_not_found(topic)
        except (V2Refusal, StoreError) as error:  # every answer is a v2 status
            return v2s.QueryRouteResponse(status=status_for(error))
        except Exception as error:
            log.exception("QueryRoute failed")
            return v2s.QueryRouteResponse(status=status_for(error))
        broker = v2.Broker(name=self.route.broker_name, id=0, endpoints=self.route.endpoints())
        resource = v2.Resource(name=topic, resource_namespace=request.topic.resource_namespace)
        accepted = self.accepted_types(topic)
        return v2s.QueryRouteResponse(
            status=ok_status(),
            message_queues=[
                v2.MessageQueue(topic=resource, id=queue_id, permission=v2.READ_WRITE, broker=broker, accept_message_types=accepted)
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
            respond: Callable[[AppendResults], v2s.SendMessageResponse] = send_response
            if len(messages.topics) == 1 and props.TIMER_DELIVER_MS in messages.properties[0]:
                respond = functools.partial(timed_send_response, messages, self.route.broker_name)
            if any(message.system_properties.message_type == v2.TRANSACTION for message in request.messages):
                respond = functools.partial(self._keeping_transactions, messages, respond)
            return await self.appender.append(messages, peer, respond)  # type: ignore[no-any-return]
        except Exception as error:  # every answer is a v2 status; a cancelled call is not an answer
            status = status_for(error)
            if status.code == v2.INTERNAL_SERVER_ERROR:
                log.exception("SendMessage failed")
            return v2s.SendMessageResponse(
                status=status, entries=[v2s.SendResultEntry(status=status) for _ in request.messages]
            )

    def _keeping_transactions(
        self, messages: MessageBatch, respond: Callable[[AppendResults], v2s.SendMessageResponse], results: AppendResults
    ) -> v2s.SendMessageResponse:
        """ProducerProcessor.fillTransactionData: each half message's offsets kept under
        its group and transaction id (its message id) for EndTransaction."""
        for row, topic in enumerate(results.topics):
            if topic == HALF_TOPIC:
                group = messages.properties[row].get(props.PGROUP, "")
                self.transaction_data.add(group, results.uniq_keys[row], results.queue_offsets[row], results.commitlog_offsets[row])
        return respond(results)

    def _settings(self, settings: v2.Settings) -> v2.Settings:
        """The client's settings as the writer wants them used."""
        answer = with_retry_policy(settings)
        if settings.WhichOneof("pub_sub") == "publishing" or settings.client_type == v2.PRODUCER:
            answer.publishing.max_body_size = self.writer.config.max_body_bytes
            answer.publishing.validate_message_type = settings.publishing.validate_message_type
        return answer

    def _consumer_settings(self, settings: v2.Settings) -> v2.Settings:
        """A consumer's settings as the writer wants them used: the group's retries
        (customized backoff, the one kind every official client reads), whether the group
        is FIFO, the long poll and batch of a push consumer."""
        group = settings.subscription.group.name
        try:
            check_group(group)
        except IllegalGroup as error:
            raise V2Refusal(v2.ILLEGAL_CONSUMER_GROUP, str(error)) from None
        answer = v2.Settings()
        answer.CopyFrom(settings)
        answer.backoff_policy.CopyFrom(
            v2.RetryPolicy(
                max_attempts=self.policy.max_attempts,
                customized_backoff=v2.CustomizedBackoff(
                    next=[duration_pb2.Duration(seconds=s) for s in self.policy.retry_delays_s]
                ),
            )
        )
        subscription = answer.subscription
        subscription.fifo = self.consumers.is_fifo(group)
        if not subscription.HasField("long_polling_timeout") or not (
            subscription.long_polling_timeout.seconds or subscription.long_polling_timeout.nanos
        ):
            subscription.long_polling_timeout.CopyFrom(duration_pb2.Duration(seconds=DEFAULT_LONG_POLL_MS // 1000))
        if not subscription.receive_batch_size:
            subscription.receive_batch_size = RECEIVE_BATCH_SIZE
        return answer

    async def Telemetry(
        self, request_iterator: AsyncIterator[v2s.TelemetryCommand | Answered], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2s.TelemetryCommand]:
        """Answer each Settings; the stream stays open until the client ends it. A
        producer's stream also carries the writer's RecoverOrphanedTransactionCommands to
        it (a check of its topic's transactions). The client's other commands (thread
        stack traces, verify results) are read and dropped."""
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        stream = id(inbox)

        async def read() -> None:
            try:
                async for command in self._until_stopping(request_iterator):
                    inbox.put_nowait(command)
            except StreamRefusal as refusal:  # a command that does not parse: after the answers before it
                inbox.put_nowait(refusal)
            finally:
                # Also when the client's stream fails: the answers end with it.
                inbox.put_nowait(_END_OF_STREAM)

        reader = asyncio.ensure_future(read())
        reader.add_done_callback(_collect)
        try:
            async for answer in self._telemetry_answers(inbox, stream):
                yield answer
        finally:
            reader.cancel()
            for topic, streams in list(self._producers.items()):
                streams.pop(stream, None)
                if not streams:
                    del self._producers[topic]

    async def _telemetry_answers(self, inbox: asyncio.Queue[Any], stream: int) -> AsyncIterator[v2s.TelemetryCommand]:
        while True:
            command = await inbox.get()
            if command is _END_OF_STREAM:
                return
            if isinstance(command, StreamRefusal):
                raise command
            if isinstance(command, _Outgoing):
                yield command.command
                continue
            if isinstance(command, Answered):  # refused by the ACL: its status-only reply
                yield command.response
                continue
            if command.WhichOneof("command") != "settings":
                continue
            settings = command.settings
            if settings.client_type not in v2.ClientType.values():
                yield v2s.TelemetryCommand(status=_unknown_client_type(settings.client_type), settings=settings)
                continue
            if settings.client_type in (v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER):
                try:
                    answer = self._consumer_settings(settings)
                except V2Refusal as refusal:
                    yield v2s.TelemetryCommand(status=status_for(refusal), settings=settings)
                    continue
                yield v2s.TelemetryCommand(status=ok_status(), settings=answer)
                continue
            if settings.client_type not in (v2.CLIENT_TYPE_UNSPECIFIED, v2.PRODUCER):
                name = v2.ClientType.Name(settings.client_type)
                yield v2s.TelemetryCommand(
                    status=v2.Status(code=v2.NOT_IMPLEMENTED, message=f"{name} clients are not served by rmqstore"),
                    settings=settings,
                )
                continue
            for topic in settings.publishing.topics:
                # A v2 producer's group is each topic it publishes (the proxy's
                # addTransactionSubscription(topic, topic)); only the writer's topics are
                # kept, so that no client grows the table with names.
                if self.writer.topics.queue_count(topic.name) is not None:
                    self._producers.setdefault(topic.name, {})[stream] = inbox
            yield v2s.TelemetryCommand(status=ok_status(), settings=self._settings(settings))

    async def _until_stopping(self, commands: AsyncIterator[T]) -> AsyncIterator[T]:
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

    async def QueryAssignment(
        self, request: v2s.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> v2s.QueryAssignmentResponse:
        """Every queue of the topic: the consumers of a group all read every queue, and
        invisibility keeps them from being handed the same message."""
        try:
            check_group(request.group.name)
            topic = _consumed_topic(request.topic)
            # Never created here: a consumer's right to read a topic is no right to make one.
            count = self.consumers.queue_count(topic)
        except Exception as error:
            return v2s.QueryAssignmentResponse(status=self._failed("QueryAssignment", error))
        broker = v2.Broker(name=self.route.broker_name, id=0, endpoints=self.route.endpoints())
        resource = v2.Resource(name=topic, resource_namespace=request.topic.resource_namespace)
        accepted = self.accepted_types(topic)
        return v2s.QueryAssignmentResponse(
            status=ok_status(),
            assignments=[
                v2.Assignment(
                    message_queue=v2.MessageQueue(
                        topic=resource, id=queue_id, permission=v2.READ_WRITE, broker=broker, accept_message_types=accepted
                    )
                )
                for queue_id in range(count)
            ],
        )

    def _failed(self, call: str, error: BaseException) -> v2.Status:
        status = status_for(error)
        if status.code == v2.INTERNAL_SERVER_ERROR:
            log.error("%s failed", call, exc_info=error)
        return status

    async def ReceiveMessage(
        self, request: v2s.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2s.ReceiveMessageResponse]:
        """Up to batch_size messages, after a long poll when none is visible; then the
        status (the clients wait for it), MESSAGE_NOT_FOUND when none came."""
        try:
            handed = await self._receive(request, context)
        except Exception as error:
            yield v2s.ReceiveMessageResponse(status=self._failed("ReceiveMessage", error))
            return
        if not handed:
            yield v2s.ReceiveMessageResponse(
                status=v2.Status(code=v2.MESSAGE_NOT_FOUND, message="no new message")
            )
            return
        resource = request.message_queue.topic
        pieces = _pieces(handed, lambda one: len(one.record.body))

        def make(items: list[Handed]) -> list[v2s.ReceiveMessageResponse]:
            return self._make_answers(items, resource)

        with _receive_span(request.group.name, handed):
            del handed  # each piece's records freed once its answers are sent
            try:
                piece = pieces.pop(0)
                answers = await self._made(functools.partial(make, piece.items), piece)
            except Exception as error:
                yield v2s.ReceiveMessageResponse(status=self._failed("ReceiveMessage", error))
                return
        yield v2s.ReceiveMessageResponse(status=ok_status())
        # When the batch left the server: the clients measure their receive latency from
        # it (the Python push consumer fails every message of a batch without it).
        yield v2s.ReceiveMessageResponse(delivery_timestamp=_timestamp(_now_ms()))
        # A later piece that cannot be made ends the call with an error; its messages stay
        # invisible until their time runs out, then are handed out again.
        async for answer in self._piece_by_piece(answers, pieces, make):
            yield answer

    async def _receive(self, request: v2s.ReceiveMessageRequest, context: grpc.aio.ServicerContext) -> list[Handed]:
        group = check_group(request.group.name)
        topic = _consumed_topic(request.message_queue.topic)
        tag_filter = _tag_filter(request.filter_expression)
        if not 0 < request.batch_size <= BATCH_MAX:
            raise V2Refusal(v2.BAD_REQUEST, f"batch_size {request.batch_size}: expected 1-{BATCH_MAX}")
        invisible_ms = self.auto_renew_invisible_ms if request.auto_renew and not request.HasField("invisible_duration") else (
            # The minimum binds a receive without auto_renew, as in Apache's proxy (which
            # ignores an auto-renewed receive's duration).
            _invisible_ms(request.invisible_duration, 0 if request.auto_renew else self.policy.min_invisible_ms)
        )
        poll_ms = (
            _duration_ms(request.long_polling_timeout, "long_polling_timeout", v2.ILLEGAL_POLLING_TIME, 0, LONG_POLL_MS_MAX)
            if request.HasField("long_polling_timeout")
            else DEFAULT_LONG_POLL_MS
        )
        count = self.consumers.queue_count(topic)
        queue_id = request.message_queue.id
        if not 0 <= queue_id < count:
            raise V2Refusal(v2.BAD_REQUEST, f"queue {queue_id}: topic {topic} has queues 0-{count - 1}")
        # Any queue of the topic, as Apache's proxy pops from every queue of the broker the
        # request names: the clients pick a queue per receive (the Python client at random),
        # and a receive sent to a drained queue would wait out its poll while others hold
        # messages. Each receive starts at the next queue in turn, so none is starved.
        start = self._next_queue.get((group, topic), 0) % count
        self._next_queue[(group, topic)] = start + 1
        queue_ids = [(start + i) % count for i in range(count)]
        loop = asyncio.get_running_loop()
        remaining_s = context.time_remaining()
        # Answer a little before the call's deadline, so the answer arrives in time.
        poll_s = poll_ms / 1000 if remaining_s is None else max(0.0, min(poll_ms / 1000, remaining_s - POLL_MARGIN_S))
        deadline = loop.time() + poll_s
        while True:
            picked, dead_picked = self.consumers.receive(group, topic, queue_ids, request.batch_size, invisible_ms, tag_filter)
            handed = await self._read_picked(group, topic, picked, tag_filter)
            dead = await self._read_picked(group, topic, dead_picked, tag_filter)
            for one in dead:
                try:
                    await self._to_dead_letters(group, topic, one.record, one.attempt, one.receipt_handle, peer_address(context))
                except StoreError as error:
                    # Held invisible, it is tried again when it comes back; the receive goes on.
                    log.error("moving a message of %s to %s%s failed: %s", topic, DLQ_PREFIX, group, error)
            left_s = deadline - loop.time()
            if handed or left_s <= 0 or self._stopping.is_set():
                return handed
            if picked:
                # Each was the filter's to skip (a SQL92 filter decides on the record): look
                # further at once, letting other calls run between rounds.
                await asyncio.sleep(0)
                continue
            visible_ms = self.consumers.next_visible_ms(group, topic, queue_ids)
            if visible_ms is not None:
                # A message in flight comes back then: wake for it (a few ms late, not early).
                left_s = min(left_s, max(0.0, (visible_ms - _now_ms()) / 1000) + 0.005)
            await self.wakeup.wait(topic, None, left_s)

    async def _read_picked(self, group: str, topic: str, picked: list[Picked], tag_filter: TagFilter) -> list[Handed]:
        """The records of the messages picked, read off the loop unless they are small;
        those the filter does not take after all, or retention removed, are unpicked."""
        if not picked:
            return []
        size = sum(one.size for one in picked)
        if size <= INLINE_READ_BYTES_MAX:
            records = self.consumers.read(picked)
        else:
            read = functools.partial(self._blocking, functools.partial(self.consumers.read, picked))
            records = await self._large.read(size, read)
        handed = []
        for one, record in zip(picked, records):
            if record is None or not tag_filter.admits(record):
                self.consumers.unpick(group, topic, one)
            else:
                handed.append(one.handed(record))
        return handed

    async def _piece_by_piece(self, answers: list[A], pieces: list[Piece[T]], make: Callable[[list[T]], list[A]]) -> AsyncIterator[A]:
        """``answers`` (the first piece's, made already), then each later piece's answers,
        made by ``make`` only once the piece before is sent; each answer freed once sent.
        A piece that cannot be made raises, ending the call with an error."""
        while True:
            answers.reverse()
            while answers:
                yield answers.pop()
            if not pieces:
                return
            piece = pieces.pop(0)
            answers = await self._made(functools.partial(make, piece.items), piece)

    async def _made(self, make: Callable[[], list[A]], piece: Piece[Any]) -> list[A]:
        """``make()``, the answers of ``piece``: on the loop when the piece is small, else
        on the executor, one large piece at a time node-wide (ANSWER_PIECE_BYTES)."""
        if piece.body_bytes <= INLINE_READ_BYTES_MAX:
            return make()
        async with self._large.lock:
            return await self._blocking(make)

    def _make_answers(self, handed: list[Handed], resource: v2.Resource) -> list[v2s.ReceiveMessageResponse]:
        """The batch's answers, made per batch where the messages share it: one clock read,
        each host's text once."""
        now = _now_ms()
        hosts: dict[SocketAddress, str] = {}
        answers = []
        for one in handed:
            answer = v2s.ReceiveMessageResponse()
            self._message(one, resource, answer.message, now, hosts)
            answers.append(answer)
        return answers

    def _message(
        self, one: Handed, resource: v2.Resource, into: v2.Message, now: int | None = None, hosts: dict[SocketAddress, str] | None = None
    ) -> None:
        """Write ``one`` as a v2 message into ``into`` (the answer's own field, set in place:
        its body is copied once); a batch passes its clock reading ``now`` and ``hosts``,
        the host texts made so far."""
        now = _now_ms() if now is None else now
        hosts = {} if hosts is None else hosts
        record = one.record
        system = into.system_properties
        system.message_id = record.uniq_key or offset_msg_id(record.store_host, record.commitlog_offset)
        # MD5 in upper-case hex is the one digest every official client checks alike:
        # for CRC32 the Java client expects unpadded hex, Python's padded hex and
        # Node.js's decimal, so any one spelling marks some client's messages corrupted.
        system.body_digest.type = v2.MD5
        system.body_digest.checksum = hashlib.md5(record.body).hexdigest().upper()
        system.body_encoding = v2.IDENTITY
        _set_ms(system.born_timestamp, record.born_timestamp_ms)
        properties = dict(record.properties)
        born_host = properties.pop(BORN_HOST, "")
        system.born_host = born_host or _host_text(record.born_host, hosts)
        _set_ms(system.store_timestamp, record.store_timestamp_ms)
        system.store_host = f"{_host_text(record.store_host, hosts)}:{record.store_host.port}"
        system.receipt_handle = one.receipt_handle
        system.queue_id = one.queue_id
        system.queue_offset = one.queue_offset
        _set_ms(system.invisible_duration, max(0, one.visible_at_ms - now))
        system.delivery_attempt = one.attempt
        tag = properties.pop(props.TAGS, "")
        if tag:
            system.tag = tag
        keys = properties.pop(props.KEYS, "")
        if keys:
            system.keys.extend(k for k in keys.split(props.KEY_SEPARATOR) if k)
        group = properties.pop(SHARDING_KEY, "")
        if group:
            system.message_group = group
        # Apache's proxy (GrpcConverter): a timed or delay-level message is DELAY, its due
        # time the delivery timestamp; the timer's own properties are not the user's.
        due = properties.get(props.TIMER_DELIVER_MS, "")
        if due.isdigit():
            _set_ms(system.delivery_timestamp, int(due))
        timed = any(name in properties for name in (props.DELAY, props.TIMER_DELIVER_MS, props.TIMER_DELAY_SEC))
        system.message_type = v2.DELAY if timed else v2.FIFO if group else v2.NORMAL
        for name in SCHEDULE_PROPERTIES:
            properties.pop(name, None)
        properties.pop(props.UNIQ_KEY, None)
        properties.pop(props.PGROUP, None)
        if properties.pop(props.TRAN_MSG, None) == "true":
            # GrpcConverter.buildMessage: a committed transaction's message (or a half
            # message a check shows) is a TRANSACTION message; these are system properties.
            system.message_type = v2.TRANSACTION
            properties.pop(props.REAL_TOPIC, None)
            properties.pop(props.REAL_QID, None)
        # The producer's trace context goes back where the RocketMQ 5 clients read it.
        trace_context = properties.pop(TRACEPARENT, "")
        if trace_context:
            system.trace_context = trace_context
        into.topic.CopyFrom(resource)
        if properties:
            into.user_properties.update(properties)
        into.body = record.body

    async def AckMessage(self, request: v2s.AckMessageRequest, context: grpc.aio.ServicerContext) -> v2s.AckMessageResponse:
        try:
            group = check_group(request.group.name)
            topic = _consumed_topic(request.topic)
            if not request.entries:
                raise V2Refusal(v2.BAD_REQUEST, "the request has no entries")
        except Exception as error:
            return v2s.AckMessageResponse(status=self._failed("AckMessage", error))
        response = v2s.AckMessageResponse()
        entries = response.entries
        ok = ok_status()
        for entry in request.entries:
            try:
                self.consumers.ack(group, topic, entry.receipt_handle)
                status = ok
            except Exception as error:
                status = self._failed("AckMessage", error)
            entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status)
        if self.consumers.is_fifo(group):
            # An acknowledgement in a FIFO group frees its message group's next message.
            self.wakeup.notify(topic)
        if any(answered.status.code == v2.OK for answered in entries):
            try:
                await self._progress_replicated()
            except Exception as error:
                # Taken here, not (yet) on enough replicas: answered as not taken. Sent
                # again, it is answered OK once they hold it; after a failover before
                # that, the message may come again.
                refused = self._failed("AckMessage", error)
                for answered in entries:
                    if answered.status.code == v2.OK:
                        answered.status.CopyFrom(refused)
        response.status.CopyFrom(_overall(entries))
        return response

    async def ChangeInvisibleDuration(
        self, request: v2s.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> v2s.ChangeInvisibleDurationResponse:
        try:
            group = check_group(request.group.name)
            topic = _consumed_topic(request.topic)
            invisible_ms = _invisible_ms(request.invisible_duration, 0)
            handle = self.consumers.change_invisible(group, topic, request.receipt_handle, invisible_ms)
        except Exception as error:
            return v2s.ChangeInvisibleDurationResponse(status=self._failed("ChangeInvisibleDuration", error))
        # A waiting poll recomputes when the next message in flight comes back.
        self.wakeup.notify(topic)
        return v2s.ChangeInvisibleDurationResponse(status=ok_status(), receipt_handle=handle)

    async def _to_dead_letters(
        self, group: str, topic: str, record: Record, attempt: int, handle: str, peer: SocketAddress | None
    ) -> None:
        """Store the record in the group's dead-letter topic, then acknowledge it: a crash
        in between leaves it in both (at-least-once), never in neither."""
        dlq = DLQ_PREFIX + group
        if self.writer.topics.queue_count(dlq) is None:
            await self._blocking(lambda: self.writer.topics.create(dlq, 1))
        batch = MessageBatch.of([_dead_letter(record, dlq, attempt)])
        await self.appender.append(batch, peer, lambda results: results)
        self.consumers.ack(group, topic, handle)
        if self.consumers.is_fifo(group):
            self.wakeup.notify(topic)
        await self._progress_replicated()

    async def ForwardMessageToDeadLetterQueue(
        self, request: v2s.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> v2s.ForwardMessageToDeadLetterQueueResponse:
        """Store the message in ``%DLQ%<group>`` (created with one queue, as Apache's
        broker creates it), with RocketMQ's dead-letter properties, then acknowledge it."""
        try:
            group = check_group(request.group.name)
            topic = _consumed_topic(request.topic)
            receipt, delivery = self.consumers.delivery_of(group, topic, request.receipt_handle)
            queue = self.writer.queues.find(topic, receipt.queue_id)
            unit = queue.read(receipt.queue_offset) if queue is not None else None
            if unit is None:
                raise V2Refusal(v2.MESSAGE_NOT_FOUND, f"the message at queue {receipt.queue_id} offset {receipt.queue_offset} is gone")
            record = self.writer.log.read(unit.commitlog_offset)
            await self._to_dead_letters(group, topic, record, delivery.attempt, request.receipt_handle, peer_address(context))
        except Exception as error:
            return v2s.ForwardMessageToDeadLetterQueueResponse(status=self._failed("ForwardMessageToDeadLetterQueue", error))
        return v2s.ForwardMessageToDeadLetterQueueResponse(status=ok_status())

    def _queue_of(self, queue: v2.MessageQueue) -> tuple[str, int]:
        """The topic and queue id a request names; both must exist."""
        topic = _consumed_topic(queue.topic)
        count = self.consumers.queue_count(topic)
        if not 0 <= queue.id < count:
            raise V2Refusal(v2.BAD_REQUEST, f"queue {queue.id}: topic {topic} has queues 0-{count - 1}")
        return topic, queue.id

    def _bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        queue = self.writer.queues.find(topic, queue_id)
        return (queue.min_offset, queue.max_offset) if queue is not None else (0, 0)

    async def GetOffset(self, request: v2s.GetOffsetRequest, context: grpc.aio.ServicerContext) -> v2s.GetOffsetResponse:
        """The group's committed offset in the queue (its oldest message for a new group)."""
        try:
            group = check_group(request.group.name)
            topic, queue_id = self._queue_of(request.message_queue)
            offset = self.consumers.committed(group, topic, queue_id)
        except Exception as error:
            return v2s.GetOffsetResponse(status=self._failed("GetOffset", error))
        return v2s.GetOffsetResponse(status=ok_status(), offset=offset)

    async def UpdateOffset(self, request: v2s.UpdateOffsetRequest, context: grpc.aio.ServicerContext) -> v2s.UpdateOffsetResponse:
        """Set the group's committed offset: anywhere from the queue's oldest message to its end."""
        try:
            group = check_group(request.group.name)
            topic, queue_id = self._queue_of(request.message_queue)
            low, high = self._bounds(topic, queue_id)
            if not low <= request.offset <= high:
                raise V2Refusal(v2.ILLEGAL_OFFSET, f"offset {request.offset}: queue {queue_id} of {topic} holds {low}-{high}")
            self.consumers.update_offset(group, topic, queue_id, request.offset)
        except Exception as error:
            return v2s.UpdateOffsetResponse(status=self._failed("UpdateOffset", error))
        self.wakeup.notify(topic)  # an offset moved back makes messages visible to a waiting poll
        try:
            await self._progress_replicated()
        except Exception as error:
            return v2s.UpdateOffsetResponse(status=self._failed("UpdateOffset", error))
        return v2s.UpdateOffsetResponse(status=ok_status())

    async def QueryOffset(self, request: v2s.QueryOffsetRequest, context: grpc.aio.ServicerContext) -> v2s.QueryOffsetResponse:
        """BEGINNING: the oldest offset; END: one past the newest; TIMESTAMP: the first
        offset stored at or after the time (the end when none is), the store's LOWER search."""
        try:
            topic, queue_id = self._queue_of(request.message_queue)
            low, high = self._bounds(topic, queue_id)
            policy = request.query_offset_policy
            if policy == v2.BEGINNING:
                offset = low
            elif policy == v2.END:
                offset = high
            elif policy == v2.TIMESTAMP:
                if not request.HasField("timestamp"):
                    raise V2Refusal(v2.BAD_REQUEST, "query_offset_policy TIMESTAMP needs a timestamp")
                timestamp_ms = request.timestamp.seconds * 1000 + request.timestamp.nanos // 1_000_000
                if timestamp_ms < 0:
                    raise V2Refusal(v2.BAD_REQUEST, f"timestamp {timestamp_ms} ms is before 1970")
                offset = self._offset_at(topic, queue_id, timestamp_ms)
            else:
                raise V2Refusal(v2.BAD_REQUEST, f"query_offset_policy {policy} is not BEGINNING, END or TIMESTAMP")
        except Exception as error:
            return v2s.QueryOffsetResponse(status=self._failed("QueryOffset", error))
        return v2s.QueryOffsetResponse(status=ok_status(), offset=offset)

    def _offset_at(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        queue = self.writer.queues.find(topic, queue_id)
        if queue is None:
            return 0
        log_ = self.writer.log
        return int(
            queue.offset_by_time(
                timestamp_ms,
                lambda unit: log_.store_timestamp(unit.commitlog_offset),
                Boundary.LOWER,
                commitlog_min_offset=log_.min_offset,
                bisect_file=log_.first_stored_after,
            )
        )

    async def PullMessage(
        self, request: v2s.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2s.PullMessageResponse]:
        """Up to batch_size messages from the offset on, for clients that keep their own
        offsets (no invisibility, no receipt handles): the status, the messages, then the
        offset to pull from next. Long-polls when the offset is the queue's end."""
        try:
            check_group(request.group.name)
            topic, queue_id = self._queue_of(request.message_queue)
            tag_filter = _tag_filter(request.filter_expression)
            if not 0 < request.batch_size <= BATCH_MAX:
                raise V2Refusal(v2.BAD_REQUEST, f"batch_size {request.batch_size}: expected 1-{BATCH_MAX}")
            poll_ms = (
                _duration_ms(request.long_polling_timeout, "long_polling_timeout", v2.ILLEGAL_POLLING_TIME, 0, LONG_POLL_MS_MAX)
                if request.HasField("long_polling_timeout")
                else 0
            )
            low, high = self._bounds(topic, queue_id)
            if not low <= request.offset <= high:
                raise V2Refusal(v2.ILLEGAL_OFFSET, f"offset {request.offset}: queue {queue_id} of {topic} holds {low}-{high}")
            records, next_offset = await self._pull(topic, queue_id, request.offset, request.batch_size, tag_filter, poll_ms, context)
            resource = v2.Resource(name=topic)
            pieces = _pieces(records, lambda one: len(one[1].body))
            del records  # each piece's records freed once its answers are sent

            def make(items: list[tuple[int, Record]]) -> list[v2s.PullMessageResponse]:
                return self._pulled_messages(items, queue_id, resource)

            piece = pieces.pop(0)
            messages = await self._made(functools.partial(make, piece.items), piece)
        except Exception as error:
            yield v2s.PullMessageResponse(status=self._failed("PullMessage", error))
            return
        if not messages:
            yield v2s.PullMessageResponse(status=v2.Status(code=v2.MESSAGE_NOT_FOUND, message="no new message"))
        else:
            yield v2s.PullMessageResponse(status=ok_status())
        # A later piece that cannot be made ends the call with an error (no next_offset: the
        # client pulls from where it was).
        async for message in self._piece_by_piece(messages, pieces, make):
            yield message
        yield v2s.PullMessageResponse(next_offset=next_offset)

    async def _pull(
        self, topic: str, queue_id: int, offset: int, batch_size: int, tag_filter: TagFilter, poll_ms: int,
        context: grpc.aio.ServicerContext,
    ) -> tuple[list[tuple[int, Record]], int]:  # fmt: skip
        """The queue offsets and records of the messages from ``offset`` on that pass the
        filter (up to the response budget), and the offset after the last unit looked at
        (past the filtered-out ones too)."""
        loop = asyncio.get_running_loop()
        remaining_s = context.time_remaining()
        poll_s = poll_ms / 1000 if remaining_s is None else max(0.0, min(poll_ms / 1000, remaining_s - POLL_MARGIN_S))
        deadline = loop.time() + poll_s
        codes = tag_filter.codes
        while True:
            queue = self.writer.queues.find(topic, queue_id)
            units: list[tuple[int, int]] = []  # (queue offset, commit log offset) to read
            size_bytes = 0  # theirs
            next_offset = offset
            if queue is not None:
                next_offset = min(queue.max_offset, offset + SCAN_UNITS_MAX)
                for position, unit in queue.units(offset, next_offset):
                    if len(units) >= batch_size or (units and size_bytes + unit.size > RECEIVE_BYTES_MAX):
                        next_offset = position
                        break
                    if codes is not None and unit.tags_code not in codes:
                        continue
                    units.append((position, unit.commitlog_offset))
                    size_bytes += unit.size
            left_s = deadline - loop.time()
            if units or next_offset > offset or left_s <= 0 or self._stopping.is_set():
                read = functools.partial(self._pulled_records, units, tag_filter)
                if size_bytes <= INLINE_READ_BYTES_MAX:
                    return read(), next_offset
                return await self._large.read(size_bytes, functools.partial(self._blocking, read)), next_offset
            await self.wakeup.wait(topic, queue_id, left_s)

    def _pulled_records(self, units: list[tuple[int, int]], tag_filter: TagFilter) -> list[tuple[int, Record]]:
        """The queue offsets and records of the messages at these units that pass the
        filter (a unit's tag hash may match a tag the filter does not take): the commit log
        only, so any thread may call it."""
        out = []
        for position, commitlog_offset in units:
            record = self.writer.log.read(commitlog_offset)
            if tag_filter.admits(record):
                out.append((position, record))
        return out

    def _pulled_messages(
        self, records: list[tuple[int, Record]], queue_id: int, resource: v2.Resource
    ) -> list[v2s.PullMessageResponse]:
        """The answers carrying ``records`` (queue offset, record)."""
        out = []
        for position, record in records:
            answer = v2s.PullMessageResponse()
            self._pulled(record, queue_id, position, resource, answer.message)
            out.append(answer)
        return out

    def _pulled(self, record: Record, queue_id: int, queue_offset: int, resource: v2.Resource, into: v2.Message) -> None:
        self._message(Handed(record, queue_id, queue_offset, 1, "", _now_ms()), resource, into)
        into.system_properties.ClearField("receipt_handle")
        into.system_properties.ClearField("invisible_duration")
        into.system_properties.ClearField("delivery_attempt")

    async def EndTransaction(
        self, request: v2s.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> v2s.EndTransactionResponse:
        """EndTransactionActivity and TransactionProcessor: the topic checked, the
        transaction data of (topic, transaction id) taken (its group is the topic), then
        the broker's EndTransactionProcessor on the half message it names. Apache's proxy
        sends that on one-way: once the data is found the answer is OK whatever the broker
        makes of it (a wrong group or offset, a resolution neither COMMIT nor ROLLBACK)."""
        try:
            topic = _topic(request.topic)
            if not request.transaction_id.strip():
                raise V2Refusal(v2.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
            data = self.transaction_data.poll(topic, request.transaction_id)
            if data is None:
                raise V2Refusal(
                    v2.INTERNAL_SERVER_ERROR, "org.apache.rocketmq.proxy.common.ProxyException: cannot found transaction data"
                )
            half_queue_offset, commitlog_offset = data
            if request.resolution in (v2.COMMIT, v2.ROLLBACK):
                end = functools.partial(
                    self.transactions.end,
                    topic,
                    half_queue_offset,
                    commitlog_offset,
                    request.resolution == v2.COMMIT,
                    request.source == v2.SOURCE_SERVER_CHECK,
                )
                refused = await self._blocking(end)
                if refused is not None:
                    log.warning("EndTransaction of %s on %s not applied: %s", request.transaction_id, topic, refused)
            return v2s.EndTransactionResponse(status=v2.Status(code=v2.OK, message="OK"))
        except Exception as error:
            status = status_for(error)
            if status.code == v2.INTERNAL_SERVER_ERROR and not isinstance(error, V2Refusal):
                log.exception("EndTransaction failed")
            return v2s.EndTransactionResponse(status=status)

    async def RecallMessage(self, request: v2s.RecallMessageRequest, context: grpc.aio.ServicerContext) -> v2s.RecallMessageResponse:
        """RocketMQ 5.3's recall (RecallMessageProcessor): a marker in the timer, due with
        the message, that cancels it. Refusals carry Apache's remarks, with the code its
        proxy gives a broker's refusal (INTERNAL_SERVER_ERROR)."""
        try:
            topic = _topic(request.topic)
            if self.writer.topics.queue_count(topic) is None:
                raise V2Refusal(v2.TOPIC_NOT_FOUND, f"recall failed, the topic[{topic}] not exist")
            topic_type = self.writer.topics.message_type(topic) or "NORMAL"
            if topic_type not in ("DELAY", "MIXED"):
                # ProducerProcessor.recallMessage validates the topic as a DELAY one first.
                raise V2Refusal(
                    v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                    "org.apache.rocketmq.proxy.common.ProxyException: TopicMessageType validate failed, "
                    f"the expected type is {topic_type}, but actual type is DELAY",
                )
            try:
                handle = parse_recall_handle(request.recall_handle)
            except InvalidArgument as error:
                raise V2Refusal(v2.INTERNAL_SERVER_ERROR, str(error)) from None
            if handle.topic != topic:
                raise V2Refusal(v2.INTERNAL_SERVER_ERROR, "recall failed, topic not match")
            if handle.broker_name != self.route.broker_name:
                raise V2Refusal(v2.INTERNAL_SERVER_ERROR, "recall failed, broker service not available")
            time_left_ms = handle.timestamp_ms - _now_ms()
            if handle.timestamp_ms < 0 or time_left_ms <= 0 or time_left_ms >= self.writer.config.timer_max_delay_ms:
                raise V2Refusal(v2.INTERNAL_SERVER_ERROR, "recall failed, timestamp invalid")
            marker = MessageBatch.of([recall_marker(handle, _now_ms())])
            try:
                await self._blocking(functools.partial(self.writer.append_released, marker, schedule=True))
            except InvalidArgument as error:
                raise V2Refusal(v2.INTERNAL_SERVER_ERROR, str(error)) from None
            return v2s.RecallMessageResponse(status=ok_status(), message_id=handle.message_id)
        except Exception as error:
            status = status_for(error)
            if status.code == v2.INTERNAL_SERVER_ERROR and not isinstance(error, V2Refusal):
                log.exception("RecallMessage failed")
            return v2s.RecallMessageResponse(status=status)

    async def SyncLiteSubscription(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> v2s.SyncLiteSubscriptionResponse:
        return v2s.SyncLiteSubscriptionResponse(status=_not_served("SyncLiteSubscription"))


def _consumed_topic(resource: v2.Resource) -> str:
    """A topic a consumer names: any valid name (a dead-letter topic too); it must exist."""
    problem = topic_problem(resource.name)
    if problem is not None:
        raise V2Refusal(v2.ILLEGAL_TOPIC, problem)
    return resource.name


def _tag_filter(expression: v2.FilterExpression) -> TagFilter:
    if expression.type == v2.SQL:
        return TagFilter.sql(expression.expression)
    if expression.type not in (v2.FILTER_TYPE_UNSPECIFIED, v2.TAG):
        raise V2Refusal(v2.ILLEGAL_FILTER_EXPRESSION, f"filter type {expression.type} is not TAG")
    return TagFilter.parse(expression.expression)


def _duration_ms(duration: duration_pb2.Duration, name: str, code: int, low_ms: int, high_ms: int) -> int:
    if duration.seconds < 0 or duration.nanos < 0 or duration.nanos >= 1_000_000_000:
        raise V2Refusal(code, f"{name} {duration.seconds}s {duration.nanos}ns is not a duration")
    value_ms = duration.seconds * 1000 + duration.nanos // 1_000_000
    if not low_ms <= value_ms <= high_ms:
        raise V2Refusal(code, f"{name} {value_ms} ms: expected {low_ms}-{high_ms} ms")
    return value_ms


def _invisible_ms(duration: duration_pb2.Duration, min_ms: int) -> int:
    """An invisible duration checked as Apache's proxy checks it (GrpcValidator.validateInvisibleTime),
    refused in its words."""
    if duration.seconds < 0 or duration.nanos < 0 or duration.nanos >= 1_000_000_000:
        raise V2Refusal(v2.ILLEGAL_INVISIBLE_TIME, f"invisible_duration {duration.seconds}s {duration.nanos}ns is not a duration")
    value_ms = duration.seconds * 1000 + duration.nanos // 1_000_000
    if value_ms < min_ms:
        raise V2Refusal(v2.ILLEGAL_INVISIBLE_TIME, f"the invisibleTime is too small. min is {min_ms}")
    if value_ms > INVISIBLE_MS_MAX:
        raise V2Refusal(v2.ILLEGAL_INVISIBLE_TIME, f"the invisibleTime is too large. max is {INVISIBLE_MS_MAX}")
    return value_ms


def _duration(ms: int) -> duration_pb2.Duration:
    ms = max(0, ms)
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _timestamp(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _set_ms(into: duration_pb2.Duration | timestamp_pb2.Timestamp, ms: int) -> None:
    """Set a Duration or Timestamp field in place (no message made and copied)."""
    into.seconds, rest = divmod(ms, 1000)
    into.nanos = rest * 1_000_000


def _host_text(address: SocketAddress, made: dict[SocketAddress, str]) -> str:
    """``address.host_text()``, made once a batch for each address."""
    text = made.get(address)
    if text is None:
        text = made[address] = address.host_text()
    return text


def _now_ms() -> int:
    return int(time.time() * 1000)


def _overall(entries: Sequence[v2s.AckMessageResultEntry]) -> v2.Status:
    """One entry's status is the request's; of several, OK when all are, else MULTIPLE_RESULTS."""
    if len(entries) == 1:
        return entries[0].status
    if all(entry.status.code == v2.OK for entry in entries):
        return ok_status()
    return v2.Status(code=v2.MULTIPLE_RESULTS, message="some entries failed: see each entry's status")


def _dead_letter(record: Record, dlq: str, attempt: int) -> MessageInput:
    """The record as its dead-letter copy: body, keys, tag, user properties and message id
    kept, and the properties RocketMQ adds on the way to a dead-letter topic."""
    properties = {k: v for k, v in record.properties.items() if k not in RESERVED_PROPERTIES}
    message_id = record.uniq_key or offset_msg_id(record.store_host, record.commitlog_offset)
    properties.update(
        {
            DLQ_ORIGIN_TOPIC: record.topic,
            DLQ_ORIGIN_MESSAGE_ID: message_id,
            RETRY_TOPIC: record.topic,
            ORIGIN_MESSAGE_ID: message_id,
            RECONSUME_TIMES: str(max(0, attempt - 1)),
        }
    )
    keys = record.properties.get(props.KEYS, "")
    return MessageInput(
        topic=dlq,
        body=record.body,
        keys=[k for k in keys.split(props.KEY_SEPARATOR) if k],
        tags=record.properties.get(props.TAGS, ""),
        properties=properties,
        queue_id=0,
        uniq_key=record.uniq_key or "",
        flag=record.flag,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=record.born_host,
    )


class TransactionData:
    """The proxy's TransactionDataManager: a half message's (queue offset, commit log
    offset) by (producer group, transaction id), each kept TRANSACTION_DATA_EXPIRE_MS and at
    most TRANSACTION_DATA_MAX per id; taken once. In memory, as in Apache's proxy: after a
    restart only a check brings a transaction's data back."""

    def __init__(self, expire_ms: int = TRANSACTION_DATA_EXPIRE_MS, max_per_id: int = TRANSACTION_DATA_MAX):
        self.expire_ms = expire_ms
        self.max_per_id = max_per_id
        self._lock = threading.Lock()
        self._data: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
        self._added = 0

    def add(self, group: str, transaction_id: str, half_queue_offset: int, commitlog_offset: int) -> None:
        now = _now_ms()
        with self._lock:
            kept = self._data.setdefault((group, transaction_id), [])
            kept.append((now + self.expire_ms, half_queue_offset, commitlog_offset))
            del kept[: -self.max_per_id]
            self._added += 1
            if self._added % 1024 == 0:
                self._drop_expired(now)

    def poll(self, group: str, transaction_id: str) -> tuple[int, int] | None:
        """pollNoExpireTransactionData: the newest unexpired entry, removed."""
        now = _now_ms()
        with self._lock:
            kept = self._data.get((group, transaction_id))
            found = None
            while kept:
                expire_ms, half_queue_offset, commitlog_offset = kept.pop()
                if expire_ms >= now:
                    found = (half_queue_offset, commitlog_offset)
                    break
            if not kept:
                self._data.pop((group, transaction_id), None)
            return found

    def _drop_expired(self, now: int) -> None:
        for key in [key for key, kept in self._data.items() if kept[-1][0] < now]:
            del self._data[key]

    def __len__(self) -> int:
        with self._lock:
            return sum(map(len, self._data.values()))


@dataclass(frozen=True)
class _Outgoing:
    """A command the writer sends on a Telemetry stream."""

    command: v2s.TelemetryCommand


_END_OF_STREAM = object()


def _collect(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _unknown_client_type(client_type: int) -> v2.Status:
    return v2.Status(code=v2.UNRECOGNIZED_CLIENT_TYPE, message=f"client_type {client_type} is not a client type")


def _not_served(call: str) -> v2.Status:
    return v2.Status(
        code=v2.NOT_IMPLEMENTED,
        message=f"{call} is not served by the rmqstore writer",
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


def acl_rules() -> dict[str, MethodRule]:
    """The ACL's rules for every MessagingService method, by full method name.

    No MessagingService call creates a topic (an unknown one is NotFound), so none needs
    Create. The consumer calls are authorized all the same, so that serving them later
    opens nothing unchecked."""

    def query_route(request: v2s.QueryRouteRequest) -> list[Requirement]:
        return [(("Pub", "Sub"), f"Topic:{request.topic.name}")]

    def send_message(request: v2s.SendMessageRequest) -> list[Requirement]:
        # Every message's topic, each once, in the order of the request.
        topics = list(dict.fromkeys(message.topic.name for message in request.messages))
        return [("Pub", f"Topic:{topic}") for topic in topics]

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
    # Telemetry: a refused command is answered on the open stream with a status-only
    # command, as Apache's proxy answers it (GrpcMessagingApplication.telemetry); the
    # clients act on it (the Node.js client's startup() fails with the status), where a
    # stream ended by a gRPC error only makes them reconnect.
    rules[_METHOD + "Telemetry"] = MethodRule(_telemetry_needs, _answer(v2s.TelemetryCommand))
    return rules
