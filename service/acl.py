"""Who may do what: authentication and authorization of both nodes' calls, modelled on
RocketMQ 5's ACL 2.0 (``--acl FILE``).

The file (YAML)::

    users:
      - accessKey: ops            # the name a client signs with
        secretKey: "…"
        userType: Super           # Super: every action, and store paths in Status/Stats
      - accessKey: orders-app
        secretKey: "…"            # userType Normal (the default): only what a policy allows
    acls:
      - subject: User:orders-app  # or Cert:<client certificate common name> under mutual TLS
        policies:
          - resource: ["Topic:orders-*", "Group:orders"]
            actions: [Pub, Sub, Get]
            decision: Allow       # or Deny; a matching Deny wins over any Allow
            sourceIps: ["10.0.0.0/8"]   # optional: the entry applies only to these peers

Resources are ``Topic:<name>`` and ``Group:<name>`` (a trailing ``*`` matches any suffix,
``Topic:*`` every topic) and ``Cluster`` (the node itself: topic lists, status, flush).
Actions: Pub, Sub, Create, Update, Get, List. What is not allowed is denied.

A call is signed the way RocketMQ 5 clients sign theirs (common.signing; the client's side
is client.signing); a date-time further than ``CLOCK_SKEW_S`` from the node's clock is
refused.
Under mutual TLS a call without a signature is the certificate's subject,
``Cert:<common name>``. No credentials, a bad signature, an unknown key or a stale date:
UNAUTHENTICATED. An identified caller without the permission: PERMISSION_DENIED. Both are
counted (``rmqstore.acl.denials``). Health checks need no credentials (probes).

Services other than rmqstore's own bring their rules (:class:`MethodRule`, e.g. the
RocketMQ 5 gateway's), which may answer a refusal with a response of the protocol's own.
"""

from __future__ import annotations

import calendar
import contextvars
import hmac
import inspect
import ipaddress
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry import metrics

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.signing import (
    ALGORITHM,
    AUTHORIZATION_KEY,
    DATE_TIME_FORMAT,
    DATE_TIME_KEY,
    signature,
)
from rmqstore.service.errors import REASON_KEY, StreamRefusal
from rmqstore.service.guard import Malformed
from rmqstore.service.handlers import Handler, handler_behavior, handler_constructor

# grpc's stubs make contexts generic in request and response types; these
# wrappers serve every method alike.
Context = Any
AsyncContext = Any


ACTIONS = ("Pub", "Sub", "Create", "Update", "Get", "List")
DECISIONS = ("Allow", "Deny")
USER_TYPES = ("Super", "Normal")
CLOCK_SKEW_S = 300
_DATE_TIME = re.compile(r"\d{8}T\d{6}Z")
_AUTHORIZATION = re.compile(
    r"MQv2-HMAC-SHA1 Credential=(?P<credential>[^,\s]+), ?SignedHeaders=(?P<headers>[^,\s]+), ?Signature=(?P<signature>[0-9A-Fa-f]{40})"
)
_EMPTY_CREDENTIAL = re.compile(r"MQv2-HMAC-SHA1 Credential=,")
# Calls that need no identity: a probe cannot sign.
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})

# The caller of the call being handled, for handlers that answer admins more (Status, Stats).
current_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("rmqstore_principal", default=None)


@dataclass(frozen=True)
class Principal:
    subject: str  # User:<accessKey> or Cert:<common name>
    admin: bool


@dataclass(frozen=True)
class Entry:
    resources: tuple[str, ...]
    actions: frozenset[str]
    allow: bool
    sources: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    def matches(self, action: str, resource: str, peer_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        if action not in self.actions or not any(_resource_matches(p, resource) for p in self.resources):
            return False
        if not self.sources:
            return True
        return peer_ip is not None and any(peer_ip in network for network in self.sources)


@dataclass
class Acl:
    secrets: dict[str, bytes] = field(default_factory=dict)  # accessKey -> secret
    admins: set[str] = field(default_factory=set)  # subjects of Super users
    entries: dict[str, list[Entry]] = field(default_factory=dict)  # subject -> entries

    def allowed(self, principal: Principal, action: str, resource: str, peer_ip: Any) -> bool:
        if principal.admin:
            return True
        matching = [entry for entry in self.entries.get(principal.subject, ()) if entry.matches(action, resource, peer_ip)]
        return bool(matching) and all(entry.allow for entry in matching)


def _resource_matches(pattern: str, resource: str) -> bool:
    if pattern.endswith("*"):
        return resource.startswith(pattern[:-1])
    return pattern == resource


def _need(condition: bool, path: str, problem: str) -> None:
    if not condition:
        raise InvalidArgument(f"--acl {path}: {problem}")


def load_acl(path: str) -> Acl:
    """The ACL file, checked whole: any mistake is InvalidArgument naming the entry."""
    # Imported here: a node started without --acl (and every command line importing this
    # module for its rules) never reads YAML.
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except OSError as error:
        raise InvalidArgument(f"--acl {path}: cannot read: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise InvalidArgument(f"--acl {path}: not YAML ({error})") from None
    _need(isinstance(document, dict) and set(document) <= {"users", "acls"}, path, "the top level holds users and acls only")
    acl = Acl()
    for number, user in enumerate(document.get("users") or [], 1):
        where = f"user {number}"
        _need(isinstance(user, dict) and set(user) <= {"accessKey", "secretKey", "userType"}, path, f"{where}: fields are accessKey, secretKey, userType")
        access_key, secret = user.get("accessKey"), user.get("secretKey")
        _need(isinstance(access_key, str) and re.fullmatch(r"[A-Za-z0-9_.@-]{1,128}", access_key) is not None, path, f"{where}: accessKey must be 1-128 of [A-Za-z0-9_.@-]")
        _need(isinstance(secret, str) and len(secret) >= 8, path, f"{where}: secretKey must be a string of at least 8 characters")
        _need(access_key not in acl.secrets, path, f"{where}: accessKey {access_key} appears twice")
        user_type = user.get("userType", "Normal")
        _need(user_type in USER_TYPES, path, f"{where}: userType must be Super or Normal")
        acl.secrets[access_key] = secret.encode()
        if user_type == "Super":
            acl.admins.add(f"User:{access_key}")
    for number, rule in enumerate(document.get("acls") or [], 1):
        where = f"acl {number}"
        _need(isinstance(rule, dict) and set(rule) <= {"subject", "policies"}, path, f"{where}: fields are subject and policies")
        subject = rule.get("subject")
        _need(isinstance(subject, str) and subject.startswith(("User:", "Cert:")), path, f"{where}: subject must be User:<accessKey> or Cert:<common name>")
        if subject.startswith("User:"):
            _need(subject[5:] in acl.secrets, path, f"{where}: no user {subject[5:]}")
        for index, policy in enumerate(rule.get("policies") or [], 1):
            acl.entries.setdefault(subject, []).append(_entry(path, f"{where} policy {index}", policy))
    return acl


def _entry(path: str, where: str, policy: Any) -> Entry:
    _need(isinstance(policy, dict) and set(policy) <= {"resource", "actions", "decision", "sourceIps"}, path, f"{where}: fields are resource, actions, decision, sourceIps")
    resources = policy.get("resource")
    resources = [resources] if isinstance(resources, str) else resources
    _need(isinstance(resources, list) and bool(resources), path, f"{where}: resource must name at least one resource")
    for resource in resources:
        _need(
            isinstance(resource, str) and (resource == "Cluster" or re.fullmatch(r"(Topic|Group):[%|A-Za-z0-9_-]*\*?", resource) is not None),
            path,
            f"{where}: resource {resource!r} is not Topic:<name>, Group:<name> (optionally ending in *) or Cluster",
        )
    actions = policy.get("actions")
    _need(isinstance(actions, list) and bool(actions) and all(a in ACTIONS for a in actions), path, f"{where}: actions must be some of {', '.join(ACTIONS)}")
    decision = policy.get("decision", "Allow")
    _need(decision in DECISIONS, path, f"{where}: decision must be Allow or Deny")
    sources = policy.get("sourceIps") or []
    _need(isinstance(sources, list), path, f"{where}: sourceIps must be a list of CIDRs")
    networks = []
    for source in sources:
        try:
            networks.append(ipaddress.ip_network(str(source), strict=False))
        except ValueError:
            raise InvalidArgument(f"--acl {path}: {where}: {source!r} is not an IP network") from None
    return Entry(tuple(resources), frozenset(actions), decision == "Allow", tuple(networks))


# Checking (the node's side)


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason = code, reason


def _parse_date_time(text: str) -> float | None:
    if not _DATE_TIME.fullmatch(text):
        return None
    try:
        return float(calendar.timegm(time.strptime(text, DATE_TIME_FORMAT)))
    except ValueError:
        return None


def authenticate(acl: Acl, metadata: Iterable[tuple[str, Any]], certificate_name: str | None, now_s: float) -> Principal:
    headers = {key: value for key, value in metadata if isinstance(value, str)}
    authorization = headers.get(AUTHORIZATION_KEY)
    if authorization is not None and _EMPTY_CREDENTIAL.match(authorization):
        # RocketMQ 5's Python client signs every call, with an empty Credential when it was
        # given no access key: that is an unsigned call, not a forged one.
        authorization = None
    if authorization is None:
        if certificate_name is not None:
            subject = f"Cert:{certificate_name}"
            return Principal(subject, subject in acl.admins)
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "Unsigned", "this node needs signed calls: give an access key and secret key")
    match = _AUTHORIZATION.fullmatch(authorization)
    if match is None or match["headers"] != DATE_TIME_KEY:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "BadSignature", f"the authorization header is not {ALGORITHM} over {DATE_TIME_KEY}")
    # Some clients send Credential=<key>/<more>: the access key is its first part.
    access_key = match["credential"].split("/", 1)[0]
    signed_at = _parse_date_time(headers.get(DATE_TIME_KEY, ""))
    if signed_at is None:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "BadSignature", f"{DATE_TIME_KEY} must be YYYYMMDDTHHMMSSZ")
    secret = acl.secrets.get(access_key)
    # The same work for an unknown key as for a known one: the time taken does not say
    # which keys exist.
    expected = signature(secret if secret is not None else b"\x00" * 16, headers[DATE_TIME_KEY])
    if not hmac.compare_digest(expected, match["signature"].lower()) or secret is None:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "BadSignature", "unknown access key or wrong signature")
    if abs(now_s - signed_at) > CLOCK_SKEW_S:
        raise Refused(
            grpc.StatusCode.UNAUTHENTICATED,
            "StaleSignature",
            f"the call was signed at {headers[DATE_TIME_KEY]}, more than {CLOCK_SKEW_S} s from this node's clock",
        )
    subject = f"User:{access_key}"
    return Principal(subject, subject in acl.admins)


def _messages_topics(messages: Iterable[Any]) -> list[str]:
    return sorted({message.topic for message in messages})


def _batch_topics(request: Any) -> list[str]:
    """A SendBatchRequest's topics, sent as ``messages`` or as ``columns`` (where an
    empty topics column gives every message the empty topic, as an unset field does)."""
    columns = request.columns
    topics = set(columns.topics) or ({""} if columns.bodies else set())
    return sorted(topics.union(message.topic for message in request.messages))


# What each method asks for, from its request: (action, resource) pairs, every one needed.
# An action may be a tuple of alternatives, any one of which will do (RocketMQ 5 lets a
# route be read by a user who may publish or subscribe).
Requirement = tuple[str | tuple[str, ...], str]
Need = Callable[[Any], list[Requirement]]


@dataclass(frozen=True)
class MethodRule:
    """How a method is authorized: what it needs, and optionally how a refusal is answered.
    With ``answer``, a refused call gets ``answer(request, refused)`` as its response on an
    OK call rather than a gRPC error: for protocols whose clients read the status in the
    response (RocketMQ 5's). In a request stream, each refused item (every item, when the
    caller is not authenticated) reaches the handler as an :class:`Answered` in its place,
    which the handler sends, and the stream stays open (RocketMQ 5's Telemetry, whose
    clients act on a status-only reply). Without ``answer``, a refusal is a gRPC error."""

    need: Need
    answer: Callable[[Any, Refused], Any] | None = None


def _topic(action: str) -> Need:
    return lambda request: [(action, f"Topic:{request.topic}")]


def _cluster(action: str) -> Need:
    return lambda request: [(action, "Cluster")]


NEEDS: dict[str, Need] = {
    "/rmqstore.v1.WriterService/Send": lambda r: [("Pub", f"Topic:{r.message.topic}")],
    "/rmqstore.v1.WriterService/SendBatch": lambda r: [("Pub", f"Topic:{t}") for t in _batch_topics(r)],
    "/rmqstore.v1.WriterService/SendStream": lambda r: [("Pub", f"Topic:{t}") for t in _batch_topics(r)],
    "/rmqstore.v1.WriterService/CreateTopic": lambda r: [("Create", f"Topic:{r.name}")],
    "/rmqstore.v1.WriterService/ListTopics": _cluster("List"),
    "/rmqstore.v1.WriterService/UpdateSubscriptionGroup": lambda r: [("Update", f"Group:{r.group}")],
    "/rmqstore.v1.WriterService/Flush": _cluster("Update"),
    "/rmqstore.v1.WriterService/Status": _cluster("Get"),
    "/rmqstore.v1.QueryService/QueryByKey": _topic("Sub"),
    "/rmqstore.v1.QueryService/QueryByUniqKey": _topic("Sub"),
    # An offsetMsgId names no topic until the record is read: any topic, so the node.
    "/rmqstore.v1.QueryService/QueryByMsgId": _cluster("Sub"),
    "/rmqstore.v1.QueryService/QueryByQueueOffset": _topic("Sub"),
    "/rmqstore.v1.QueryService/Pull": _topic("Sub"),
    "/rmqstore.v1.QueryService/QueueBounds": _topic("Sub"),
    "/rmqstore.v1.QueryService/SearchOffset": _topic("Sub"),
    "/rmqstore.v1.QueryService/OffsetsByTime": _topic("Sub"),
    "/rmqstore.v1.QueryService/StreamByTime": _topic("Sub"),
    "/rmqstore.v1.QueryService/ListTopics": _cluster("List"),
    "/rmqstore.v1.QueryService/Stats": _cluster("Get"),
    # The node's group names, as ListTopics lists its topics.
    "/rmqstore.v1.QueryService/ListGroups": _cluster("List"),
    # One group's progress, as Apache's ACL guards a group's consume stats: Get on the group.
    "/rmqstore.v1.QueryService/GroupLag": lambda r: [("Get", f"Group:{r.group}")],
    "/rmqstore.v1.QueryService/Ping": lambda r: [],
    # A writer group's replicas, known to each other by their certificates (docs/replication.md):
    # the whole commit log and a primary's moves are the node's own business.
    "/rmqstore.v1.ReplicationService/Replicate": _cluster("Update"),
    "/rmqstore.v1.ReplicationService/ReplicaStatus": _cluster("Get"),
    "/rmqstore.v1.ReplicationService/Promote": _cluster("Update"),
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": lambda r: [],
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": lambda r: [],
}


def _peer_ip(peer: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    # grpc's peer strings: ipv4:1.2.3.4:5, ipv6:[::1]:5
    try:
        if peer.startswith("ipv4:"):
            return ipaddress.ip_address(peer[5:].rsplit(":", 1)[0])
        if peer.startswith("ipv6:"):
            return ipaddress.ip_address(peer[5:].rsplit(":", 1)[0].strip("[]").split("%")[0])
    except ValueError:
        return None
    return None


class _Denials:
    def __init__(self) -> None:
        self.counter = metrics.get_meter("rmqstore").create_counter(
            "rmqstore.acl.denials", unit="{call}", description="Calls refused by the ACL, by status code and reason"
        )
        self.counts: dict[tuple[str, str], int] = {}

    def add(self, code: grpc.StatusCode, reason: str) -> None:
        key = (code.name, reason)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.counter.add(1, {"rmqstore.code": code.name, "rmqstore.reason": reason})


class AsyncAclInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every call (but health checks) from its metadata or client
    certificate, and authorizes each request (each message of a stream) against the ACL
    before the handler sees it. A method it has no rule for is refused: a service added
    later is closed until its rules are written."""

    def __init__(self, acl: Acl, clock: Callable[[], float] = time.time, rules: Mapping[str, MethodRule] | None = None):
        """``rules``: the methods of services beyond rmqstore's own (a gateway on the port),
        by full method name."""
        self.acl = acl
        self.clock = clock
        self.denials = _Denials()
        self.rules = {method: MethodRule(need) for method, need in NEEDS.items()}
        self.rules.update(rules or {})

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method in OPEN_METHODS:
            return handler
        rule = self.rules.get(method)
        metadata = tuple(handler_call_details.invocation_metadata or ())
        return _checked(handler, self, rule, metadata)

    async def refuse(self, context: AsyncContext, refused: Refused) -> None:
        self.note(context, refused)
        await context.abort(refused.code, str(refused))

    def note(self, context: AsyncContext, refused: Refused) -> None:
        """Count a refusal and name its reason in the trailing metadata."""
        self.denials.add(refused.code, refused.reason)
        context.set_trailing_metadata(((REASON_KEY, refused.reason),))

    def principal(self, context: AsyncContext, metadata: Sequence[tuple[str, Any]]) -> Principal:
        names = list((context.auth_context() or {}).get("x509_common_name") or [])
        certificate = names[0].decode("utf-8", "replace") if names else None
        return authenticate(self.acl, metadata, certificate, self.clock())

    def authorize(self, principal: Principal, need: Need | None, request: Any, peer: str) -> None:
        if need is None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, "NoRule", "this method is not open to ACL users")
        peer_ip = _peer_ip(peer)
        for actions, resource in need(request):
            choices = (actions,) if isinstance(actions, str) else actions
            if not any(self.acl.allowed(principal, action, resource, peer_ip) for action in choices):
                wanted = " or ".join(choices)
                raise Refused(grpc.StatusCode.PERMISSION_DENIED, "Denied", f"{principal.subject} may not {wanted} {resource}")


class Answered:
    """A refusal answered with a response of the method's own (see MethodRule.answer)."""

    __slots__ = ("response",)

    def __init__(self, response: Any):
        self.response = response


def _checked(handler: Handler, acl: AsyncAclInterceptor, rule: MethodRule | None, metadata: Sequence[tuple[str, Any]]) -> Handler:
    behavior = handler_behavior(handler)
    generates = inspect.isasyncgenfunction(behavior)
    need = rule.need if rule is not None else None
    answer = rule.answer if rule is not None else None

    async def refused_with(context: AsyncContext, request: Any, refused: Refused) -> Answered:
        # A request that did not parse cannot shape an answer: it gets the gRPC error.
        if answer is not None and not handler.request_streaming and not isinstance(request, Malformed):
            acl.note(context, refused)
            return Answered(answer(request, refused))
        await acl.refuse(context, refused)
        raise refused  # not reached: the abort above ends the call by raising

    async def each(
        requests: AsyncIterator[Any], context: AsyncContext, principal: Principal | None, unauthenticated: Refused | None
    ) -> AsyncIterator[Any]:
        """A request stream's items, each authorized; ``principal`` None: the caller was not
        authenticated (``unauthenticated`` says why), which refuses every item."""
        async for item in requests:
            if isinstance(item, Malformed):  # the guard answers those
                yield item
                continue
            refused = unauthenticated
            if principal is not None:
                try:
                    acl.authorize(principal, need, item, context.peer())
                except Refused as denied:
                    refused = denied
            if refused is None:
                yield item
            elif answer is None:
                # Raised where the handler reads it, after its answers to the items before;
                # the guard's wrapper (innermost on every server: service.server) ends the call.
                acl.note(context, refused)
                raise StreamRefusal(refused.code, str(refused))
            else:
                acl.note(context, refused)
                yield Answered(answer(item, refused))

    async def admitted(request: Any, context: AsyncContext) -> Any:
        try:
            principal = acl.principal(context, metadata)
        except Refused as refused:
            if handler.request_streaming and answer is not None:
                return each(request, context, None, refused)
            return await refused_with(context, request, refused)
        current_principal.set(principal)
        if not handler.request_streaming:
            if not isinstance(request, Malformed):  # the guard answers those
                try:
                    acl.authorize(principal, need, request, context.peer())
                except Refused as refused:
                    return await refused_with(context, request, refused)
            return request
        return each(request, context, principal, None)

    if generates:

        async def generating(request: Any, context: AsyncContext) -> AsyncIterator[Any]:
            checked = await admitted(request, context)
            if isinstance(checked, Answered):
                yield checked.response
                return
            async for response in behavior(checked, context):
                yield response

        wrapped: Callable[..., Any] = generating
    else:

        async def answering(request: Any, context: AsyncContext) -> Any:
            checked = await admitted(request, context)
            if isinstance(checked, Answered):
                return checked.response
            return await behavior(checked, context)

        wrapped = answering
    return handler_constructor(handler)(wrapped, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


def may_see_paths() -> bool:
    """Whether the current caller may see the store's paths (Status, Stats): an admin, or
    anyone on a node without an ACL."""
    principal = current_principal.get()
    return principal is None or principal.admin
