"""``rmqstore writer serve`` and ``rmqstore send``."""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from rmqstore.cli.store_tools import add_size_options, sizes_from
from rmqstore.common.errors import InvalidArgument
from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

if TYPE_CHECKING:
    from rmqstore.service.acl import Acl

EXIT_OK = 0
EXIT_ERROR = 2
SHUTDOWN_GRACE_S = 10.0


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
        type=int,
        metavar="P",
        help="also serve grpc.health.v1 alone, in plaintext, on this port (for probes that cannot speak TLS)",
    )
    parser.add_argument(
        "--workers",
        type=int,
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
    from rmqstore.service.server import load_server_credentials

    if args.workers < 1:
        raise InvalidArgument(f"--workers must be at least 1, got {args.workers}")
    if args.health_port is not None and args.health_port != 0 and args.health_port == args.port:
        raise InvalidArgument(f"--health-port {args.health_port} must differ from --port")
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


def serving_tls_fields(args: argparse.Namespace, health_port: int | None) -> dict[str, Any]:
    """What the serving line says about TLS, access control and the health port."""
    fields: dict[str, Any] = {
        "tls": args.tls_cert is not None,
        "clientAuth": args.tls_client_ca is not None,
        "acl": args.acl is not None,
    }
    if health_port is not None:
        fields["healthPort"] = health_port
    return fields


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


def channel_from(args: argparse.Namespace, endpoint: str) -> grpc.Channel:
    from rmqstore.service.acl import signing_channel
    from rmqstore.service.server import open_channel

    access_key = args.access_key or os.environ.get(ACCESS_KEY_ENV) or None
    secret_key = args.secret_key or os.environ.get(SECRET_KEY_ENV) or None
    if (access_key is None) != (secret_key is None):
        raise InvalidArgument(f"give an access key and a secret key together (--access-key/--secret-key or {ACCESS_KEY_ENV}/{SECRET_KEY_ENV})")
    channel = open_channel(
        endpoint,
        ca=args.tls_ca,
        client_cert=args.tls_client_cert,
        client_key=args.tls_client_key,
        server_name=args.tls_server_name,
    )
    if access_key is None or secret_key is None:
        return channel
    return signing_channel(channel, access_key, secret_key)


def cmd_writer_serve(args: argparse.Namespace) -> int:
    from rmqstore.service.server import AsyncServing
    from rmqstore.service.metrics import configure_metrics
    from rmqstore.service.telemetry import configure_tracing
    from rmqstore.writer.config import FlushPolicy, WriterConfig
    from rmqstore.writer.service import SERVICE_NAME, WriterServicer
    from rmqstore.writer.store import Writer

    # TLS files and the ACL are checked before anything else: a bad one costs no recovery.
    credentials = server_credentials_from(args)
    acl = access_from(args)
    # Handlers first: a SIGTERM during recovery or right after the serving line must still
    # end in a clean stop (final flush, checkpoint, abort removed).
    stopping = stop_requested()
    configure_tracing("rmqstore-writer")
    configure_metrics("rmqstore-writer")
    config = WriterConfig(
        store=args.store,
        sizes=sizes_from(args, args.store),
        flush=FlushPolicy(args.flush),
        flush_interval_ms=args.flush_interval_ms,
        store_host=args.store_host or f"127.0.0.1:{args.port or 10911}",
        auto_create_topics=not args.no_auto_create,
        retention_hours=args.retention_hours,
        disk_clean_ratio=args.disk_clean_ratio,
        disk_full_ratio=args.disk_full_ratio,
        truncate_corrupt_tail=args.truncate_corrupt_tail,
    )
    writer = Writer(config)
    writer.start_background()
    servicer = WriterServicer(writer)
    try:
        serving = AsyncServing(
            lambda s: writer_pb2_grpc.add_WriterServiceServicer_to_server(servicer, s),
            [SERVICE_NAME],
            host=args.host,
            port=args.port,
            credentials=credentials,
            health_port=args.health_port,
            workers=args.workers,
            acl=acl,
        )
    except BaseException:
        servicer.close()
        writer.close()
        raise
    recovery = writer.recovery
    print(
        json.dumps(
            {
                "event": "serving",
                "service": "writer",
                "port": serving.port,
                "store": config.store,
                "flush": config.flush.value,
                **serving_tls_fields(args, serving.health_port),
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
    serving.stop(SHUTDOWN_GRACE_S)
    servicer.close()
    writer.close()
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
    message = messages_pb2.Message(
        topic=document["topic"],
        body=body,
        keys=keys,
        tags=document.get("tags") or "",
        properties=properties,
        uniq_key=document.get("uniqKey") or "",
    )
    if document.get("queueId") is not None:
        if not isinstance(document["queueId"], int):
            raise InvalidArgument(f"{where}: queueId must be an integer")
        message.queue_id = document["queueId"]
    return message


def read_jsonl(path: str) -> Iterator[messages_pb2.Message]:
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                document = json.loads(line)
            except ValueError as error:
                raise InvalidArgument(f"line {number}: not JSON: {error}") from None
            yield message_from_json(number, document)


def result_json(result: messages_pb2.SendResult) -> str:
    return json.dumps(
        {
            "offsetMsgId": result.offset_msg_id,
            "uniqKey": result.uniq_key,
            "topic": result.topic,
            "queueId": result.queue_id,
            "queueOffset": result.queue_offset,
            "commitLogOffset": result.commitlog_offset,
            "storeTimestamp": result.store_timestamp_ms,
        },
        ensure_ascii=False,
    )


def cmd_send(args: argparse.Namespace) -> int:
    if args.file:
        # Validate the whole file before sending anything, so a bad line costs nothing.
        for _ in read_jsonl(args.file):
            pass
        batches = _batches(read_jsonl(args.file), args.batch_size)
    else:
        if not args.topic:
            raise InvalidArgument("give -t TOPIC (with --body) or --file F.jsonl")
        message = messages_pb2.Message(
            topic=args.topic, body=(args.body or "").encode("utf-8"), keys=(args.keys or "").split(), tags=args.tags or ""
        )
        if args.queue is not None:
            message.queue_id = args.queue
        batches = iter([writer_pb2.SendBatchRequest(messages=[message])])
    with channel_from(args, args.endpoint) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        try:
            for response in stub.SendStream(batches, timeout=args.timeout):
                for result in response.results:
                    sys.stdout.write(result_json(result) + "\n")
        except grpc.RpcError as error:
            print(f"rmqstore: error: {error.code().name}: {error.details()}", file=sys.stderr)
            return EXIT_ERROR
    return EXIT_OK


def _batches(messages: Iterator[messages_pb2.Message], size: int) -> Iterator[writer_pb2.SendBatchRequest]:
    batch: list[messages_pb2.Message] = []
    for message in messages:
        batch.append(message)
        if len(batch) >= size:
            yield writer_pb2.SendBatchRequest(messages=batch)
            batch = []
    if batch:
        yield writer_pb2.SendBatchRequest(messages=batch)


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    writer = commands.add_parser("writer", help="the writer node")
    writer_commands = writer.add_subparsers(dest="writer_command", required=True)
    serve = writer_commands.add_parser("serve", help="own a store directory and serve WriterService over gRPC")
    serve.add_argument("--store", required=True, help="store directory (created if missing)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=0, help="port (default 0: any free port, printed at start)")
    serve.add_argument("--flush", choices=["sync", "async"], default="async", help="flush policy (default async)")
    serve.add_argument("--flush-interval-ms", type=int, default=500, help="ASYNC fsync interval (default 500)")
    serve.add_argument("--store-host", help="ip:port written into records and msgIds (default 127.0.0.1:PORT)")
    serve.add_argument("--no-auto-create", action="store_true", help="refuse messages to unknown topics")
    serve.add_argument("--retention-hours", type=float, default=72.0, help="commit log file reserved time (default 72)")
    serve.add_argument("--disk-clean-ratio", type=float, default=0.75, help="delete old files above this disk use")
    serve.add_argument("--disk-full-ratio", type=float, default=0.90, help="refuse writes above this disk use")
    serve.add_argument(
        "--truncate-corrupt-tail",
        action="store_true",
        help="accept losing everything after mid-log corruption found at start (default: refuse to start)",
    )
    add_server_tls_options(serve)
    add_size_options(serve)
    serve.set_defaults(handler=cmd_writer_serve)

    send = commands.add_parser("send", help="send messages to a writer")
    send.add_argument("--endpoint", required=True, help="writer HOST:PORT")
    send.add_argument("-t", "--topic", help="topic of the one message")
    send.add_argument("-k", "--keys", help='space-separated keys, e.g. "KEY1 KEY2"')
    send.add_argument("--tags", help="tags")
    send.add_argument("--body", help="body text")
    send.add_argument("-q", "--queue", type=int, help="queue id (default: the writer picks)")
    send.add_argument("--file", help="JSONL file, one message a line")
    send.add_argument("--batch-size", type=int, default=1000, help="messages per batch with --file (default 1000)")
    send.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up (default 600)")
    add_client_tls_options(send)
    send.set_defaults(handler=cmd_send)
