"""``rmqstore writer serve`` and ``rmqstore send``."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from rmqstore.cli import exits
from rmqstore.cli.exits import EXIT_OK
from rmqstore.cli.store_tools import add_size_options, requested_sizes
from rmqstore.common.errors import InvalidArgument
from rmqstore.service.listen import DEFAULT_WORKERS, ListenOptions
from rmqstore.v1 import messages_pb2

if TYPE_CHECKING:
    from rmqstore.writer.replication.group import PeerTls

# TLS and listener options, shared with query_tools.


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


def listen_options_from(args: argparse.Namespace) -> ListenOptions:
    """A node's listen options from its flags (add_server_tls_options, --host, --port)."""
    return ListenOptions(
        host=args.host,
        port=args.port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        workers=args.workers,
        acl=args.acl,
        insecure_open=args.insecure_open,
    )


ACCESS_KEY_ENV = "RMQSTORE_ACCESS_KEY"
SECRET_KEY_ENV = "RMQSTORE_SECRET_KEY"


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


def _peer_tls(args: argparse.Namespace) -> PeerTls | None:
    """How a replica dials the others (docs/replication.md, "TLS and ACL between replicas"):
    the replicas of a group serve alike, so one that serves TLS dials TLS."""
    from rmqstore.writer.replication.group import PeerTls

    if (args.replica_tls_cert is None) != (args.replica_tls_key is None):
        raise InvalidArgument("--replica-tls-cert and --replica-tls-key go together")
    if args.tls_cert is None:
        if any(v is not None for v in (args.replica_tls_ca, args.replica_tls_cert)):
            raise InvalidArgument("--replica-tls-* need --tls-cert: the replicas dial each other as they serve")
        if args.acl is not None:
            raise InvalidArgument(
                "--acl in a writer group needs mutual TLS between the replicas (--tls-cert, --tls-client-ca, "
                "--replica-tls-ca, --replica-tls-cert): a replica is known to the others by its certificate"
            )
        return None
    if args.replica_tls_ca is None:
        raise InvalidArgument("--tls-cert in a writer group needs --replica-tls-ca: the replicas dial each other over TLS")
    if args.tls_client_ca is not None and args.replica_tls_cert is None:
        raise InvalidArgument("--tls-client-ca in a writer group needs --replica-tls-cert and --replica-tls-key: the replicas present a certificate to each other")
    if args.acl is not None and args.tls_client_ca is None:
        raise InvalidArgument(
            "--acl in a writer group needs mutual TLS between the replicas (--tls-client-ca, --replica-tls-cert): "
            "a replica is known to the others by its certificate"
        )
    return PeerTls(args.replica_tls_ca, args.replica_tls_cert, args.replica_tls_key)


def cmd_writer_serve(args: argparse.Namespace) -> int:
    from rmqstore.writer.config import FlushPolicy
    from rmqstore.writer.node import WriterOptions, serve
    from rmqstore.writer.replication.group import GroupOptions, Replication, parse_replicas

    group = None
    peer_tls_flags = (args.replica_tls_ca, args.replica_tls_cert, args.replica_tls_key)
    if args.group is not None:
        if args.replica_id is None or args.replicas is None:
            raise InvalidArgument("--group needs --replica-id and --replicas")
        group = GroupOptions(
            name=args.group,
            replica_id=args.replica_id,
            replicas=parse_replicas(args.replicas),
            replication=Replication(args.replication),
            min_insync=args.min_insync,
            replica_lag_max_ms=args.replica_lag_max_ms,
            replica_pace_ms=args.replica_pace_ms,
            etcd=tuple(e for e in (args.etcd or "").split(",") if e),
            lease_ttl_s=args.lease_ttl_s,
            peer_tls=_peer_tls(args),
        )
    elif any(v is not None for v in (args.replica_id, args.replicas, args.etcd, *peer_tls_flags)):
        raise InvalidArgument("--replica-id, --replicas, --etcd and --replica-tls-* belong to a writer group: give --group too")
    serve(
        WriterOptions(
            store=args.store,
            init=args.init,
            listen=listen_options_from(args),
            sizes=requested_sizes(args),
            flush=FlushPolicy(args.flush),
            flush_interval_ms=args.flush_interval_ms,
            store_host=args.store_host,
            auto_create_topics=not args.no_auto_create,
            max_topics=args.max_topics,
            max_queues=args.max_queues,
            max_groups=args.max_groups,
            advertise=args.advertise,
            broker_name=args.broker_name,
            consumer_flush_interval_ms=args.consumer_flush_interval_ms,
            consumer_max_attempts=args.consumer_max_attempts,
            consumer_retry_delays_s=args.consumer_retry_delays,
            consumer_min_invisible_ms=args.consumer_min_invisible * 1000,
            fifo_groups=tuple(args.fifo_group),
            large_answer_bytes_per_s=args.large_answer_rate << 20,
            retention_hours=args.retention_hours,
            disk_clean_ratio=args.disk_clean_ratio,
            disk_full_ratio=args.disk_full_ratio,
            truncate_corrupt_tail=args.truncate_corrupt_tail,
            group=group,
            timer_max_delay_ms=args.timer_max_delay * 1000,
            transaction_timeout_ms=args.transaction_timeout_ms,
            transaction_check_interval_ms=args.transaction_check_interval_ms,
            transaction_check_max=args.transaction_check_max,
        )
    )
    return EXIT_OK


JSONL_FIELDS_HELP = (
    "one JSON object a line: topic (required); body (text) or bodyBase64 (bytes), one of them required; keys (a list, or one "
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
        largest = client_limits().max_body_bytes
        try:
            with open(args.body_file, "rb") as handle:
                # The size first, then at most one byte past the limit: a body too large is
                # refused without reading it (a file that grows meanwhile, or a pipe, too).
                size = os.fstat(handle.fileno()).st_size
                if size > largest:
                    raise InvalidArgument(f"--body-file {args.body_file}: the body is {size} bytes; at most {largest} allowed")
                body = handle.read(largest + 1)
        except OSError as error:
            raise InvalidArgument(f"--body-file {args.body_file}: {error.strerror or error}") from None
        if len(body) > largest:
            raise InvalidArgument(f"--body-file {args.body_file}: the body is over {largest} bytes; at most {largest} allowed")
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


def cmd_writer_promote(args: argparse.Namespace) -> int:
    from rmqstore.cli import replica_tools

    return replica_tools.cmd_writer_promote(args)


def cmd_send(args: argparse.Namespace) -> int:
    from rmqstore.client import tracing

    if "," in args.endpoint:
        # A writer group's replicas: the primary among them takes the send.
        from rmqstore.cli.replica_tools import endpoints_of, find_primary

        args.endpoint = find_primary(args, endpoints_of(args.endpoint))[0]

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
    interrupted = threading.Event()

    def stop_interrupted() -> int:
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

    try:
        # The stream only: its spans are the send's own (no unary call's span wrapper).
        with WriterClient(channel_from(args, args.endpoint, unary_spans=False), args.endpoint) as client:
            responses = client.send_stream(sending, args.timeout, tracing.metadata(span))
            with _cancelled_by_ctrl_c(responses, interrupted):
                for response in responses:
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
    except KeyboardInterrupt:  # before the stream was under way
        return stop_interrupted()
    except grpc.RpcError as error:
        if interrupted.is_set():
            return stop_interrupted()
        out.flush()
        progress.finish()
        if batches is not None:
            batches.close(error)
        if span is not None:
            tracing.failed(span, error)
        note = f" ({progress.acked} of {progress.total} messages were acknowledged before it)" if progress.acked else ""
        return exits.status_exit(error, note, node="writer", endpoint=args.endpoint)
    out.flush()
    progress.finish()
    if batches is not None:
        batches.close()
    if span is not None:
        tracing.succeeded(span)
    if args.acks == "summary":
        sys.stdout.write(json.dumps(progress.summary()) + "\n")
    return EXIT_OK


@contextlib.contextmanager
def _cancelled_by_ctrl_c(call: grpc.Future, interrupted: threading.Event) -> Iterator[None]:
    """Ctrl-C cancels the stream ``call`` (and sets ``interrupted``) instead of raising
    KeyboardInterrupt in the main thread wherever it stands, grpc's iterator and its locks
    included: a send interrupted that way once did not exit within 60 s on a loaded CI
    run (test_ctrl_c_during_send_is_one_line). The cancel runs on a thread of its own,
    not in the handler, which interrupts the main thread at any point too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_ctrl_c(signum: int, frame: object) -> None:
        interrupted.set()
        threading.Thread(target=call.cancel, name="send-interrupted", daemon=True).start()

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    writer = commands.add_parser("writer", help="the writer node")
    writer_commands = writer.add_subparsers(dest="writer_command", required=True, metavar="serve|promote")
    serve = writer_commands.add_parser(
        "serve",
        help="own a store directory and serve WriterService (and RocketMQ 5's MessagingService) over gRPC",
    )
    serve.add_argument("--store", required=True, help="store directory: a store, or a new or empty directory (created if missing)")
    serve.add_argument(
        "--init",
        action="store_true",
        help="make a store in a --store directory that is neither a store nor empty (default: refuse it, writing nothing)",
    )
    serve.add_argument("--host", type=exits.host, default="127.0.0.1", help="address to listen on (default 127.0.0.1; an IPv6 one bare or in brackets)")
    serve.add_argument("--port", type=exits.port, default=0, help="port (default 0: any free port, printed at start)")
    serve.add_argument("--flush", choices=["sync", "async"], default="async", help="flush policy (default async)")
    serve.add_argument("--flush-interval-ms", type=exits.positive, default=500, help="ASYNC fsync interval (default 500)")
    serve.add_argument(
        "--store-host",
        type=exits.ip_endpoint,
        metavar="IP:PORT",
        help="the address written into records and msgIds (default 127.0.0.1:PORT, the port served on)",
    )
    serve.add_argument("--no-auto-create", action="store_true", help="refuse messages to unknown topics")
    serve.add_argument(
        "--max-topics",
        type=exits.positive,
        default=10_000,
        help="topics the writer makes at most, by any call (default 10000; past it: RESOURCE_EXHAUSTED, v2 TOO_MANY_REQUESTS)",
    )
    serve.add_argument(
        "--max-queues",
        type=exits.positive,
        default=100_000,
        help="queues of all topics at most (default 100000; past it a topic is neither made nor grown)",
    )
    serve.add_argument(
        "--advertise",
        type=exits.endpoint,
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
        "--consumer-min-invisible",
        type=exits.positive,
        default=10,
        metavar="S",
        help="the shortest invisible duration a receive may ask, in seconds (default 10: Apache's proxy's "
        "minInvisibleTimeMillsForRecv); shorter ones are refused ILLEGAL_INVISIBLE_TIME",
    )
    consumers.add_argument(
        "--max-groups",
        type=exits.positive,
        default=1_000,
        help="consumer groups the writer keeps progress for at most (default 1000; a receive of one more: TOO_MANY_REQUESTS)",
    )
    consumers.add_argument(
        "--large-answer-rate",
        type=exits.rate_mib,
        default=64,
        metavar="MIB_PER_S",
        help="answers over 256 KiB (receives and pulls of large messages) are read at most this many MiB a second, every "
        "client's together, so that they cannot starve sends of the cores (default 64; 0: no limit)",
    )
    consumers.add_argument(
        "--fifo-group",
        action="append",
        default=[],
        metavar="GROUP",
        help="a consumer group that consumes FIFO: a message group's next message waits for the one in flight (repeatable)",
    )
    serve.add_argument(
        "--timer-max-delay",
        type=exits.positive,
        default=259_200,
        metavar="SECONDS",
        help="how far ahead a timed message may be due, in seconds (default 259200, 3 days: Apache's timerMaxDelaySec)",
    )
    serve.add_argument(
        "--transaction-timeout-ms",
        type=exits.positive,
        default=6_000,
        metavar="MS",
        help="a transaction's half message is first checked with its producer once this old (default 6000: Apache's "
        "transactionTimeOut)",
    )
    serve.add_argument(
        "--transaction-check-interval-ms",
        type=exits.positive,
        default=30_000,
        metavar="MS",
        help="unresolved half messages are looked for this often (default 30000: Apache's transactionCheckInterval)",
    )
    serve.add_argument(
        "--transaction-check-max",
        type=exits.positive,
        default=15,
        metavar="N",
        help="a half message checked this many times is discarded to TRANS_CHECK_MAX_TIME_TOPIC (default 15: Apache's "
        "transactionCheckMax)",
    )
    serve.add_argument("--retention-hours", type=exits.hours, default=72.0, help="commit log file reserved time (default 72)")
    serve.add_argument("--disk-clean-ratio", type=exits.ratio, default=0.75, help="delete old files above this disk use (default 0.75)")
    serve.add_argument("--disk-full-ratio", type=exits.ratio, default=0.90, help="refuse writes above this disk use (default 0.90)")
    serve.add_argument(
        "--truncate-corrupt-tail",
        action="store_true",
        help="accept losing everything after mid-log corruption found at start (default: refuse to start)",
    )
    replication = serve.add_argument_group("a writer group: replicas and failover (docs/replication.md)")
    replication.add_argument("--group", metavar="NAME", help="the writer group this replica belongs to (default: a single node)")
    replication.add_argument("--replica-id", type=exits.queue_id, metavar="K", help="this replica's id in --replicas")
    replication.add_argument("--replicas", metavar="0=HOST:PORT,1=HOST:PORT,...", help="every replica of the group")
    replication.add_argument("--replication", choices=["sync", "async"], default="async", help="acknowledge after the in-sync replicas store a send (sync) or after the primary's own flush (async, the default)")
    replication.add_argument("--min-insync", type=exits.positive, default=1, help="sync: replicas, the primary included, that must be in sync for a send to be taken (default 1)")
    replication.add_argument("--replica-lag-max-ms", type=exits.positive, default=5000, help="a follower not caught up within this leaves the in-sync set (default 5000)")
    replication.add_argument(
        "--replica-pace-ms", type=exits.pace_ms, default=20,
        help="while the primary's event loop is busy, send each follower at most one chunk this often, 0 to 1000 (0: never paced; default 20)",
    )  # fmt: skip
    replication.add_argument("--etcd", type=exits.endpoints, metavar="HOST:PORT[,HOST:PORT...]", help="etcd v3 members: the primary is elected there (default: none; fail over with writer promote)")
    replication.add_argument("--lease-ttl-s", type=exits.positive, default=5, help="the primary's etcd lease, seconds (default 5)")
    replication.add_argument("--replica-tls-ca", metavar="FILE", help="with --tls-cert: the CA the other replicas' certificates are checked against")
    replication.add_argument("--replica-tls-cert", metavar="FILE", help="with --tls-client-ca: the client certificate this replica presents to the others")
    replication.add_argument("--replica-tls-key", metavar="FILE", help="--replica-tls-cert's PEM private key (unencrypted)")
    add_server_tls_options(serve)
    add_size_options(serve)
    serve.set_defaults(handler=cmd_writer_serve)
    promote = writer_commands.add_parser(
        "promote", help="make a replica of a writer group run without etcd its primary (manual failover)"
    )
    promote.add_argument("--endpoint", required=True, type=exits.endpoint, metavar="HOST:PORT", help="the replica to promote")
    promote.add_argument("--timeout", type=exits.seconds, default=30.0, help="seconds before giving up (default 30)")
    add_client_tls_options(promote)
    promote.set_defaults(handler=cmd_writer_promote)

    send = commands.add_parser(
        "send",
        help="send messages to a writer",
        description="Send one message (-t with --body or --body-file) or a JSONL file of them (--file) to a writer; "
        "each ack is printed as one JSON line (--acks).",
        epilog=f"--file format: {JSONL_FIELDS_HELP}.",
    )
    send.add_argument("--endpoint", required=True, type=exits.endpoints, metavar="HOST:PORT[,HOST:PORT...]", help="the writer, or a writer group's replicas (the primary among them takes the send)")
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
