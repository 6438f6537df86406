"""``rmqstore writer serve`` and ``rmqstore send``."""

from __future__ import annotations

import argparse
import base64
import contextlib
import faulthandler
import gc
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from rmqstore.cli import exits
from rmqstore.cli.exits import EXIT_OK
from rmqstore.cli.store_tools import add_size_options, sizes_from
from rmqstore.common.errors import InvalidArgument
from rmqstore.v1 import messages_pb2

if TYPE_CHECKING:
    from rmqstore.service.acl import Acl
    from rmqstore.service.metrics import MetricsEndpoint

SHUTDOWN_GRACE_S = 10.0
# The whole stop, the final flush and checkpoint included, within this (else
# stop_watchdog ends the process): within the chart's default termination grace, 60 s.
STOP_WITHIN_S = 50.0


# Stopping on SIGTERM or SIGINT, shared with query_tools.

# The kernel hands a process's signal to any of its threads that does not block it (grpc's,
# the flusher), and CPython runs the Python handler only in the main thread, the next time
# that thread runs Python. A main thread blocked in an untimed wait would never run it, so
# it waits in slices this long.
STOP_POLL_S = 0.2


def stop_requested() -> threading.Event:
    """An event that SIGTERM and SIGINT set (their handlers are installed here)."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    return stopping


def wait_for_stop(stopping: threading.Event) -> None:
    """Block until ``stopping`` is set, running due signal handlers meanwhile."""
    while not stopping.wait(STOP_POLL_S):
        pass


def stop_watchdog(service: str, within_s: float) -> threading.Timer:
    """Armed once a node is told to stop: if the process is still running ``within_s``
    later, its stop has stalled somewhere (a thread that never returns). Then it says so
    in a log line, writes every thread's stack to stderr (where it stalled, for the
    report) and ends the process with :data:`~rmqstore.cli.exits.EXIT_STOP_STALLED`,
    rather than wait for the orchestrator's SIGKILL. A writer ended this way loses
    nothing acknowledged (docs/writer.md); its next start runs a longer recovery. The
    caller cancels it once its stop has finished (the command may run in a process
    that goes on)."""

    def stalled() -> None:
        logging.getLogger("rmqstore.stop").error(
            "the %s did not stop within %g s of being told to: every thread's stack follows; exiting with %d",
            service, within_s, exits.EXIT_STOP_STALLED,
        )  # fmt: skip
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(exits.EXIT_STOP_STALLED)

    timer = threading.Timer(within_s, stalled)
    timer.name = "stop-watchdog"
    timer.daemon = True
    timer.start()
    return timer


# TLS and listener options, shared with query_tools.

DEFAULT_WORKERS = 64


def add_server_tls_options(parser: argparse.ArgumentParser) -> None:
    tls = parser.add_argument_group("TLS (default: plaintext)")
    tls.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this PEM certificate (chain)")
    tls.add_argument("--tls-key", metavar="FILE", help="the certificate's PEM private key (unencrypted)")
    tls.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="require client certificates signed by this PEM CA (mutual TLS); needs --tls-cert",
    )
    parser.add_argument(
        "--health-port",
        type=exits.port,
        metavar="P",
        help="also serve grpc.health.v1 alone, in plaintext, on this port (for probes that cannot speak TLS)",
    )
    parser.add_argument(
        "--metrics-port",
        type=exits.port,
        metavar="P",
        help="with OTEL_METRICS_EXPORTER=prometheus: serve the Prometheus scrape endpoint (GET /metrics, plain HTTP)"
        " on --host at this port (default 9464; 0 takes a free one, named in the serving line)",
    )
    parser.add_argument(
        "--workers",
        type=exits.positive,
        default=DEFAULT_WORKERS,
        metavar="N",
        help=f"threads running handlers (default {DEFAULT_WORKERS}): a query node's lookups; a writer's Flush,"
        " Status and CreateTopic (appends, streams and waiting readers hold none)",
    )
    access = parser.add_argument_group("who may call (docs/security.md)")
    access.add_argument("--acl", metavar="FILE", help="users, secrets and policies (YAML): every call but health checks is signed and checked")
    access.add_argument(
        "--insecure-open",
        action="store_true",
        help="listen on a non-loopback --host with neither --acl nor mutual TLS: anyone who reaches the port may call",
    )


def server_credentials_from(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    """The server's TLS credentials from its options, None for plaintext; checks the files
    and the options' combinations first, so that a bad one stops the node before it starts."""
    from rmqstore.service.channels import load_server_credentials

    if args.workers < 1:
        raise InvalidArgument(f"--workers must be at least 1, got {args.workers}")
    if args.health_port is not None and args.health_port != 0 and args.health_port == args.port:
        raise InvalidArgument(f"--health-port {args.health_port} must differ from --port")
    if args.metrics_port:
        for option, other in (("--port", args.port), ("--health-port", args.health_port)):
            if args.metrics_port == other:
                raise InvalidArgument(f"--metrics-port {args.metrics_port} must differ from {option}")
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise InvalidArgument("give --tls-cert and --tls-key together")
    return load_server_credentials(args.tls_cert, args.tls_key, args.tls_client_ca)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def access_from(args: argparse.Namespace) -> Acl | None:
    """The node's ACL (None without --acl), after the rule that a node reachable from
    other hosts is closed to strangers: a non-loopback --host needs --acl, mutual TLS or
    an explicit --insecure-open."""
    from rmqstore.service.acl import load_acl

    if not _loopback(args.host) and args.acl is None and args.tls_client_ca is None and not args.insecure_open:
        raise InvalidArgument(
            f"--host {args.host} is not a loopback address: give --acl FILE or mutual TLS (--tls-client-ca), "
            "or --insecure-open to let anyone who reaches the port call"
        )
    return None if args.acl is None else load_acl(args.acl)


def serving_tls_fields(
    args: argparse.Namespace, health_port: int | None, metrics: MetricsEndpoint | None = None
) -> dict[str, Any]:
    """What the serving line says about TLS, access control, the health port and the
    Prometheus scrape endpoint."""
    fields: dict[str, Any] = {
        "tls": args.tls_cert is not None,
        "clientAuth": args.tls_client_ca is not None,
        "acl": args.acl is not None,
    }
    if health_port is not None:
        fields["healthPort"] = health_port
    if metrics is not None and metrics.scrape_port is not None:
        fields["metricsPort"] = metrics.scrape_port
    return fields


ACCESS_KEY_ENV = "RMQSTORE_ACCESS_KEY"
SECRET_KEY_ENV = "RMQSTORE_SECRET_KEY"


def free_port(host: str) -> int:
    """A port free on ``host`` now (the kernel's pick), for a node asked for any port."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, 0))
        except OSError as error:
            raise InvalidArgument(f"--host {host}: cannot listen there ({error.strerror or error})") from None
        return int(probe.getsockname()[1])


def _refuse_taken(host: str, port: int, option: str) -> None:
    # gRPC binds with SO_REUSEPORT and reports a taken port in a log line of its own and
    # an exception; a plain bind first turns that into one clear error.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            raise InvalidArgument(
                f"{option} {port}: cannot listen on {host} ({error.strerror or error}); is another process using it?"
            ) from None


def check_ports(args: argparse.Namespace) -> None:
    """Refuse a taken --port, --health-port or --metrics-port before the node opens its store."""
    for option, port in (("--port", args.port), ("--health-port", args.health_port), ("--metrics-port", args.metrics_port)):
        if port:
            _refuse_taken(args.host, port, option)


@contextlib.contextmanager
def listening(args: argparse.Namespace) -> Iterator[None]:
    """A server that cannot bind its ports is a usage error naming them."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        ports = f"--port {args.port}" + ("" if args.health_port is None else f" or --health-port {args.health_port}")
        raise InvalidArgument(f"{ports}: cannot listen on {args.host} ({error})") from None


def add_client_tls_options(parser: argparse.ArgumentParser) -> None:
    tls = parser.add_argument_group("TLS to the node (default: plaintext)")
    tls.add_argument("--tls-ca", metavar="FILE", help="connect with TLS, trusting this PEM CA")
    tls.add_argument("--tls-client-cert", metavar="FILE", help="present this PEM certificate (mutual TLS; implies TLS)")
    tls.add_argument("--tls-client-key", metavar="FILE", help="the client certificate's PEM private key")
    tls.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="expect this name in the server's certificate instead of the endpoint's host (e.g. via port-forward)",
    )
    signing = parser.add_argument_group("credentials, for a node with --acl")
    signing.add_argument("--access-key", metavar="KEY", help=f"sign every call as this user (default: ${ACCESS_KEY_ENV})")
    signing.add_argument("--secret-key", metavar="SECRET", help=f"the user's secret key (default: ${SECRET_KEY_ENV}; prefer it: arguments are visible to other local users)")


def channel_from(args: argparse.Namespace, endpoint: str, *, unary_spans: bool = True) -> grpc.Channel:
    """rmqstore.client's channel, from the command's TLS and credentials options
    (``unary_spans``: as :func:`rmqstore.client.connect` takes it)."""
    from rmqstore.client import Credentials, Tls, connect

    access_key = args.access_key or os.environ.get(ACCESS_KEY_ENV) or None
    secret_key = args.secret_key or os.environ.get(SECRET_KEY_ENV) or None
    if (access_key is None) != (secret_key is None):
        raise InvalidArgument(f"give an access key and a secret key together (--access-key/--secret-key or {ACCESS_KEY_ENV}/{SECRET_KEY_ENV})")
    tls = Tls(ca=args.tls_ca, client_cert=args.tls_client_cert, client_key=args.tls_client_key, server_name=args.tls_server_name)
    credentials = None if access_key is None or secret_key is None else Credentials(access_key, secret_key)
    return connect(endpoint, tls, credentials, unary_spans=unary_spans)


def retry_delays(text: str) -> tuple[int, ...]:
    """``--consumer-retry-delays``: whole seconds, 0-7200 each, comma separated."""
    try:
        delays = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole seconds separated by commas, e.g. 1,5,10") from None
    if not delays or any(not 0 <= d <= 7200 for d in delays):
        raise argparse.ArgumentTypeError(f"{text!r}: each delay must be 0-7200 seconds")
    return delays


def cmd_writer_serve(args: argparse.Namespace) -> int:
    from rmqstore.rocketmq_v2 import service_pb2_grpc as messaging_pb2_grpc
    from rmqstore.service.logs import configure_logging
    from rmqstore.service.metrics import configure_metrics
    from rmqstore.service.server import AsyncServing
    from rmqstore.service.telemetry import configure_tracing
    from rmqstore.v1 import writer_pb2_grpc
    from rmqstore.writer.config import FlushPolicy, WriterConfig
    from rmqstore.writer.consumers import ConsumerGroups, check_group
    from rmqstore.writer.rocketmq5 import (
        DEFAULT_RETRY_DELAYS_S,
        ConsumerPolicy,
        MessagingServicer,
        RouteConfig,
        acl_rules,
    )
    from rmqstore.writer.rocketmq5 import SERVICE_NAME as MESSAGING_SERVICE_NAME
    from rmqstore.writer.service import SERVICE_NAME, WriterServicer
    from rmqstore.writer.store import Writer

    # The store, TLS files and the ACL are checked before anything else: a bad one costs no recovery.
    credentials = server_credentials_from(args)
    acl = access_from(args)
    exits.creatable_dir(args.store, "--store")
    check_ports(args)
    if args.port == 0 and args.store_host is None:
        # Records and msgIds carry the store host's port: take the port now, so that they
        # name the one the node serves on rather than a placeholder.
        args.port = free_port(args.host)
    # Handlers first: a SIGTERM during recovery or right after the serving line must still
    # end in a clean stop (final flush, checkpoint, abort removed).
    stopping = stop_requested()
    configure_tracing("rmqstore-writer")
    configure_logging("rmqstore-writer")
    metrics = configure_metrics("rmqstore-writer", scrape_host=args.host, scrape_port=args.metrics_port)
    config = WriterConfig(
        store=args.store,
        sizes=sizes_from(args, args.store),
        flush=FlushPolicy(args.flush),
        flush_interval_ms=args.flush_interval_ms,
        store_host=args.store_host or f"127.0.0.1:{args.port}",
        auto_create_topics=not args.no_auto_create,
        retention_hours=args.retention_hours,
        disk_clean_ratio=args.disk_clean_ratio,
        disk_full_ratio=args.disk_full_ratio,
        truncate_corrupt_tail=args.truncate_corrupt_tail,
    )
    # Checked before recovery, like the TLS files; without --advertise the port is the
    # bound one, known once the server listens.
    route = RouteConfig.parse(args.advertise or f"{args.host}:{args.port or 1}", args.broker_name)
    for group in args.fifo_group:
        try:
            check_group(group)
        except InvalidArgument as error:
            raise InvalidArgument(f"--fifo-group: {error}") from None
    policy = ConsumerPolicy(max_attempts=args.consumer_max_attempts, retry_delays_s=args.consumer_retry_delays or DEFAULT_RETRY_DELAYS_S)
    writer = Writer(config)
    try:
        groups = ConsumerGroups(
            writer, writer.paths.config, flush_interval_ms=args.consumer_flush_interval_ms, fifo_groups=frozenset(args.fifo_group)
        )
    except BaseException:
        writer.close()
        raise
    writer.start_background()
    servicer = WriterServicer(writer)
    # RocketMQ 5's producers share the WriterService's group commit: one appender per loop.
    messaging = MessagingServicer(writer, servicer.appender, route, groups, policy)

    def register(server: grpc.aio.Server) -> None:
        writer_pb2_grpc.add_WriterServiceServicer_to_server(servicer, server)
        messaging_pb2_grpc.add_MessagingServiceServicer_to_server(messaging, server)

    try:
        with listening(args):
            serving = AsyncServing(
                register,
                [SERVICE_NAME, MESSAGING_SERVICE_NAME],
                host=args.host,
                port=args.port,
                credentials=credentials,
                health_port=args.health_port,
                workers=args.workers,
                acl=acl,
                acl_rules=acl_rules(writer),
            )
    except BaseException:
        servicer.close()
        writer.close()
        raise
    if not args.advertise:
        messaging.route = RouteConfig(route.advertise_host, serving.port, route.broker_name)
    serving.call(messaging.start_flushing())
    # A batch's columns are thousands of short-lived objects, freed by their reference
    # counts (no cycles), yet each 700 allocations set the cyclic collector off over the
    # young objects, and often enough over the whole heap (a few per cent of the intake's
    # CPU, profiled). What is alive once serving (modules, the store's state) is moved out of
    # its passes, and the youngest generation is collected every 10,000 allocations.
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    recovery = writer.recovery
    print(
        json.dumps(
            {
                "event": "serving",
                "service": "writer",
                "port": serving.port,
                "store": config.store,
                "flush": config.flush.value,
                "advertise": f"{messaging.route.advertise_host}:{messaging.route.advertise_port}",
                **serving_tls_fields(args, serving.health_port, metrics),
                "recovered": {
                    "uncleanShutdown": recovery.unclean,
                    "endOffset": recovery.stop.end_offset,
                    "stop": recovery.stop.reason.value,
                    "redispatchedRecords": recovery.redispatched_records,
                },
            }
        ),
        flush=True,
    )
    wait_for_stop(stopping)
    watchdog = stop_watchdog("writer", STOP_WITHIN_S)
    serving.call(messaging.end_streams())
    serving.stop(SHUTDOWN_GRACE_S)
    servicer.close()
    groups.flush()  # no handler runs now: the groups' progress as it stands
    writer.close()
    watchdog.cancel()
    print(json.dumps({"event": "stopped", "service": "writer"}), flush=True)
    return EXIT_OK


def message_from_json(line_number: int, document: Any) -> messages_pb2.Message:
    """One ``rmqstore send --file`` JSON line as a Message; errors name the line (the
    send tool and ``pipeline load --format json`` share this parser)."""
    where = f"line {line_number}"
    if not isinstance(document, dict):
        raise InvalidArgument(f"{where}: expected a JSON object")
    known = {"topic", "body", "bodyBase64", "keys", "tags", "queueId", "properties", "uniqKey"}
    unknown = set(document) - known
    if unknown:
        raise InvalidArgument(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
    if not isinstance(document.get("topic"), str):
        raise InvalidArgument(f"{where}: topic (a string) is required")
    if "body" in document and "bodyBase64" in document:
        raise InvalidArgument(f"{where}: give body or bodyBase64, not both")
    if "bodyBase64" in document:
        try:
            body = base64.b64decode(document["bodyBase64"], validate=True)
        except (ValueError, TypeError) as error:
            raise InvalidArgument(f"{where}: bodyBase64 is not base64: {error}") from None
    else:
        text = document.get("body", "")
        if not isinstance(text, str):
            raise InvalidArgument(f"{where}: body must be a string (use bodyBase64 for bytes)")
        body = text.encode("utf-8")
    keys = document.get("keys", [])
    if isinstance(keys, str):
        keys = keys.split()
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise InvalidArgument(f"{where}: keys must be a string or a list of strings")
    properties = document.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(v, str) for v in properties.values()):
        raise InvalidArgument(f"{where}: properties must be an object of strings")
    for field in ("tags", "uniqKey"):
        if document.get(field) is not None and not isinstance(document[field], str):
            raise InvalidArgument(f"{where}: {field} must be a string")
    message = messages_pb2.Message(
        topic=document["topic"],
        body=body,
        keys=keys,
        tags=document.get("tags") or "",
        properties=properties,
        uniq_key=document.get("uniqKey") or "",
    )
    queue_id = document.get("queueId")
    if queue_id is not None:
        if not isinstance(queue_id, int) or isinstance(queue_id, bool):
            raise InvalidArgument(f"{where}: queueId must be an integer")
        if not 0 <= queue_id <= exits.INT32_MAX:
            raise InvalidArgument(f"{where}: queueId {queue_id} is outside [0, {exits.INT32_MAX}]")
        message.queue_id = queue_id
    return message


JSONL_FIELDS_HELP = (
    "one JSON object a line: topic (required); body (text) or bodyBase64 (bytes); keys (a list, or one "
    "space-separated string); tags; queueId; properties (an object of strings); uniqKey. Blank lines are skipped"
)


def client_limits() -> Any:
    from rmqstore.common.message_rules import DEFAULT_LIMITS

    return DEFAULT_LIMITS


def check_message(message: messages_pb2.Message, limits: Any, where: str) -> None:
    """The writer's rules for one message, checked here so that an error names the line
    (the writer names a message by its place in its batch); the writer checks again."""
    from rmqstore.common.message_rules import MessageInput, validate_message

    candidate = MessageInput(
        topic=message.topic,
        body=message.body,
        keys=tuple(message.keys),
        tags=message.tags,
        properties=dict(message.properties),
        queue_id=message.queue_id if message.HasField("queue_id") else None,
        uniq_key=message.uniq_key,
    )
    try:
        validate_message(candidate, limits)
    except InvalidArgument as error:
        raise InvalidArgument(f"{where}: {error}") from None


def _one_message(args: argparse.Namespace) -> messages_pb2.Message:
    if not args.topic:
        raise InvalidArgument("give -t TOPIC with --body TEXT or --body-file F, or --file F.jsonl")
    if args.body is not None and args.body_file is not None:
        raise InvalidArgument("give --body or --body-file, not both")
    if args.body_file is not None:
        try:
            with open(args.body_file, "rb") as handle:
                body = handle.read()
        except OSError as error:
            raise InvalidArgument(f"--body-file {args.body_file}: {error.strerror or error}") from None
    elif args.body is not None:
        body = args.body.encode("utf-8")
    else:
        raise InvalidArgument("give the body: --body TEXT or --body-file F (--body '' sends an empty one)")
    message = messages_pb2.Message(topic=args.topic, body=body, keys=(args.keys or "").split(), tags=args.tags or "")
    if args.queue is not None:
        message.queue_id = args.queue
    check_message(message, client_limits(), "the message")
    return message


class _Progress:
    """``send --file``'s progress line and summary on a terminal's stderr."""

    INTERVAL_S = 0.5

    def __init__(self, total: int, shown: bool, live: bool):
        self.total = total
        self.shown = shown
        # The line rewritten in place would be torn by acks printed to the same terminal.
        self.live = shown and live
        self.acked = 0
        self.started = time.monotonic()
        self.printed_at = 0.0

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.acked / elapsed if elapsed > 0 else 0.0

    def advance(self, count: int) -> None:
        self.acked += count
        now = time.monotonic()
        if self.live and now - self.printed_at >= self.INTERVAL_S:
            self.printed_at = now
            sys.stderr.write(f"\rsent {self.total}, acked {self.acked} ({self.acked * 100 // max(self.total, 1)}%), {self.rate():,.0f} msgs/s")
            sys.stderr.flush()

    def summary(self) -> dict[str, Any]:
        return {
            "sent": self.total,
            "acked": self.acked,
            "seconds": round(time.monotonic() - self.started, 3),
            "msgsPerSecond": round(self.rate(), 1),
        }

    def finish(self) -> None:
        if self.shown:
            summary = self.summary()
            sys.stderr.write(
                f"\rsent {summary['sent']}, acked {summary['acked']} in {summary['seconds']} s, "
                f"{summary['msgsPerSecond']:,.0f} msgs/s\n"
            )
            sys.stderr.flush()


def cmd_send(args: argparse.Namespace) -> int:
    from rmqstore.client import tracing

    if args.file is not None:
        given = [flag for flag, value in (("-t", args.topic), ("-k", args.keys), ("--tags", args.tags), ("--body", args.body),
                                          ("--body-file", args.body_file), ("-q", args.queue)) if value is not None]
        if given:
            raise InvalidArgument(f"{', '.join(given)} describe one message; with --file every line gives its own")
        message = None
        topics: list[str] = []
    else:
        message = _one_message(args)
        topics = [message.topic]
    # With tracing asked for, the send is a span (the file's, or the message's) that each
    # message names in its traceparent property; it starts before the file is read.
    keys, tag = (list(message.keys), message.tags) if message is not None else ((), "")
    with tracing.producer_span(args.endpoint, "SendStream", topics, keys, tag) as span:
        return _send(args, message, span)


def _send(args: argparse.Namespace, message: messages_pb2.Message | None, span: Any) -> int:
    from rmqstore.client import WriterClient, send_file, tracing
    from rmqstore.common.conventions import TRACEPARENT

    # The send's trace context is stored with each message that has none of its own,
    # sent once a request (SendBatchRequest.shared_properties).
    shared = {} if span is None else {TRACEPARENT: tracing.traceparent(span)}
    if message is None:
        # The whole file is read and checked before anything is sent, so a bad line costs
        # nothing. Parsing makes a dict a line and no reference cycles: the cyclic
        # collector would only walk the growing heap again and again, so it is off
        # meanwhile, and what is kept is then moved out of its later passes.
        gc.disable()
        try:
            columns = send_file.read_file(args.file, client_limits(), shared)
        finally:
            gc.freeze()
            gc.enable()
        batch_size = args.batch_size
    else:
        columns, batch_size = send_file.one_message(message), 1
    topics, total = columns.topics, len(columns)
    sending: Iterator[bytes] = send_file.requests(columns, batch_size, shared)
    batches: tracing.BatchSpans | None = None
    if span is not None and message is None:
        tracing.describe_file(span, topics)
        batches = tracing.BatchSpans(span)
        sending = batches.requests(sending, topics, send_file.batch_sizes(total, batch_size))
    on_terminal = args.file is not None and sys.stderr.isatty()
    progress = _Progress(total, shown=on_terminal, live=not (args.acks == "all" and sys.stdout.isatty()))
    sys.stdout.flush()
    out = sys.stdout.buffer
    sent = 0
    try:
        # The stream only: its spans are the send's own (no unary call's span wrapper).
        with WriterClient(channel_from(args, args.endpoint, unary_spans=False), args.endpoint) as client:
            for response in client.send_stream(sending, args.timeout, tracing.metadata(span)):
                compact = response.compact
                count = len(compact.commitlog_offsets)
                if batches is not None:
                    batches.acked()
                elif span is not None and compact.uniq_keys:
                    tracing.acknowledged(span, compact.uniq_keys[0])
                if args.acks == "all":
                    out.write(send_file.ack_lines(compact, topics[sent : sent + count]))
                sent += count
                progress.advance(count)
    except KeyboardInterrupt:
        out.flush()
        progress.finish()
        if batches is not None:
            batches.close()
        where = "; their acks are above" if args.acks == "all" else ""
        print(
            f"{exits.PREFIX}interrupted: {progress.acked} of {progress.total} messages acknowledged "
            f"(stored{where}); the rest may or may not be stored",
            file=sys.stderr,
        )
        return exits.EXIT_INTERRUPTED
    except grpc.RpcError as error:
        out.flush()
        progress.finish()
        if batches is not None:
            batches.close(error)
        if span is not None:
            tracing.failed(span, error)
        note = f" ({progress.acked} of {progress.total} messages were acknowledged before it)" if progress.acked else ""
        return exits.status_exit(error, note)
    out.flush()
    progress.finish()
    if batches is not None:
        batches.close()
    if span is not None:
        tracing.succeeded(span)
    if args.acks == "summary":
        sys.stdout.write(json.dumps(progress.summary()) + "\n")
    return EXIT_OK


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    writer = commands.add_parser("writer", help="the writer node")
    writer_commands = writer.add_subparsers(dest="writer_command", required=True, metavar="serve")
    serve = writer_commands.add_parser(
        "serve",
        help="own a store directory and serve WriterService (and RocketMQ 5's MessagingService) over gRPC",
    )
    serve.add_argument("--store", required=True, help="store directory (created if missing)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=exits.port, default=0, help="port (default 0: any free port, printed at start)")
    serve.add_argument("--flush", choices=["sync", "async"], default="async", help="flush policy (default async)")
    serve.add_argument("--flush-interval-ms", type=exits.positive, default=500, help="ASYNC fsync interval (default 500)")
    serve.add_argument(
        "--store-host", help="ip:port written into records and msgIds (default 127.0.0.1:PORT, the port served on)"
    )
    serve.add_argument("--no-auto-create", action="store_true", help="refuse messages to unknown topics")
    serve.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="the endpoint RocketMQ 5 clients are routed to by QueryRoute (default: the listen address)",
    )
    serve.add_argument(
        "--broker-name",
        default="rmqstore-0",
        help="the broker name QueryRoute gives the writer (default rmqstore-0)",
    )
    consumers = serve.add_argument_group("RocketMQ 5 consumers")
    consumers.add_argument(
        "--consumer-flush-interval-ms",
        type=exits.positive,
        default=1000,
        help="write the consumer groups' progress (config/consumerOffset.json) this often (default 1000)",
    )
    consumers.add_argument(
        "--consumer-max-attempts",
        type=exits.positive,
        default=17,
        help="deliveries of a message before a push consumer moves it to %%DLQ%%<group> (default 17)",
    )
    consumers.add_argument(
        "--consumer-retry-delays",
        type=retry_delays,
        default=None,
        metavar="S,S,...",
        help="seconds before each retry of a failed message (default 1,5,10,30,60,...,7200: Apache's levels)",
    )
    consumers.add_argument(
        "--fifo-group",
        action="append",
        default=[],
        metavar="GROUP",
        help="a consumer group that consumes FIFO: a message group's next message waits for the one in flight (repeatable)",
    )
    serve.add_argument("--retention-hours", type=exits.hours, default=72.0, help="commit log file reserved time (default 72)")
    serve.add_argument("--disk-clean-ratio", type=exits.ratio, default=0.75, help="delete old files above this disk use (default 0.75)")
    serve.add_argument("--disk-full-ratio", type=exits.ratio, default=0.90, help="refuse writes above this disk use (default 0.90)")
    serve.add_argument(
        "--truncate-corrupt-tail",
        action="store_true",
        help="accept losing everything after mid-log corruption found at start (default: refuse to start)",
    )
    add_server_tls_options(serve)
    add_size_options(serve)
    serve.set_defaults(handler=cmd_writer_serve)

    send = commands.add_parser(
        "send",
        help="send messages to a writer",
        description="Send one message (-t with --body or --body-file) or a JSONL file of them (--file) to a writer; "
        "each ack is printed as one JSON line (--acks).",
        epilog=f"--file format: {JSONL_FIELDS_HELP}.",
    )
    send.add_argument("--endpoint", required=True, help="writer HOST:PORT")
    send.add_argument("-t", "--topic", help="topic of the one message")
    send.add_argument("-k", "--keys", help='space-separated keys, e.g. "KEY1 KEY2"')
    send.add_argument("--tags", help="tags")
    send.add_argument("--body", help="body text (UTF-8)")
    send.add_argument("--body-file", metavar="F", help="body bytes, read from this file")
    send.add_argument("-q", "--queue", type=exits.queue_id, help="queue id (default: the writer picks)")
    send.add_argument("--file", metavar="F.jsonl", help="JSONL file, one message a line (format below)")
    send.add_argument(
        "--batch-size", type=exits.positive, default=1000, metavar="N", help="messages per batch with --file (default 1000)"
    )
    send.add_argument(
        "--acks",
        choices=["none", "summary", "all"],
        default="all",
        help="print every ack as a JSON line (all, the default), one JSON summary line {sent, acked, seconds, "
        "msgsPerSecond} (summary), or nothing (none)",
    )
    send.add_argument("--timeout", type=exits.seconds, default=600.0, help="seconds before giving up (default 600)")
    add_client_tls_options(send)
    send.set_defaults(handler=cmd_send)
