"""``rmqstore query serve`` and the lookups in RocketMQ's mqadmin habits.

Each lookup runs against a query node (``--endpoint HOST:PORT``) or directly on a store
directory (``--store DIR``), and prints RocketMQ-style text or, with ``--json``, one JSON
object per message.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import grpc

from rmqstore.cli.store_tools import add_size_options, sizes_from
from rmqstore.cli.writer_tools import (
    access_from,
    add_client_tls_options,
    add_server_tls_options,
    channel_from,
    server_credentials_from,
    serving_tls_fields,
    stop_requested,
    wait_for_stop,
)
from rmqstore.common.errors import InvalidArgument
from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_ERROR = 2
SHUTDOWN_GRACE_S = 5.0
KEY_PAGE_SIZE = 1000


class Backend:
    """One interface over a query node or a local store directory."""

    def key(self, topic: str, key: str, begin: int | None, end: int | None, limit: int | None) -> Iterator[messages_pb2.StoredMessage]:
        cursor = ""
        sent = 0
        while True:
            page_size = KEY_PAGE_SIZE if limit is None else min(KEY_PAGE_SIZE, limit - sent)
            request = query_pb2.QueryByKeyRequest(topic=topic, key=key, page_size=page_size, cursor=cursor)
            if begin is not None:
                request.begin_ms = begin
            if end is not None:
                request.end_ms = end
            response = self.call("QueryByKey", request)
            for message in response.messages:
                yield message
                sent += 1
            if response.complete or (limit is not None and sent >= limit):
                return
            cursor = response.cursor

    def uniq_key(self, topic: str, uniq_key: str) -> Iterator[messages_pb2.StoredMessage]:
        """Every page of a UNIQ_KEY's messages."""
        cursor = ""
        while True:
            response = self.call("QueryByUniqKey", query_pb2.QueryByUniqKeyRequest(topic=topic, uniq_key=uniq_key, cursor=cursor))
            yield from response.messages
            if response.complete or not response.cursor:
                return
            cursor = response.cursor

    def call(self, method: str, request: Any) -> Any:
        raise NotImplementedError

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class EndpointBackend(Backend):
    def __init__(self, endpoint: str, timeout_s: float, channel: grpc.Channel | None = None):
        # A given channel (e.g. a TLS one) is owned from here on: close() closes it.
        self.channel = channel if channel is not None else grpc.insecure_channel(endpoint)
        self.stub = query_pb2_grpc.QueryServiceStub(self.channel)
        self.timeout_s = timeout_s

    def call(self, method: str, request: Any) -> Any:
        return getattr(self.stub, method)(request, timeout=self.timeout_s)

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        return getattr(self.stub, method)(request, timeout=self.timeout_s)

    def close(self) -> None:
        self.channel.close()


class _LocalContext:
    """Enough of a ServicerContext for the servicer run in-process: errors raise."""

    def peer(self) -> str:
        return "local"

    def set_trailing_metadata(self, metadata: object) -> None:
        pass

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise LocalRpcError(code, details)


class LocalRpcError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class StoreBackend(Backend):
    """The same servicer, in process, on a read-only view of a directory."""

    def __init__(self, args: argparse.Namespace):
        from rmqstore.query.service import QueryServicer
        from rmqstore.query.view import StoreView

        self.view = StoreView(args.store, sizes_from(args, args.store))
        self.servicer = QueryServicer(self.view)

    def call(self, method: str, request: Any) -> Any:
        return getattr(self.servicer, method)(request, _LocalContext())

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        return getattr(self.servicer, method)(request, _LocalContext())

    def close(self) -> None:
        self.view.close()


def _local_time(epoch_ms: int) -> str:
    moment = dt.datetime.fromtimestamp(epoch_ms / 1000)
    return moment.strftime("%Y-%m-%d %H:%M:%S,") + f"{epoch_ms % 1000:03d}"


def message_json(message: messages_pb2.StoredMessage, with_body: bool) -> dict[str, Any]:
    document: dict[str, Any] = {
        "commitLogOffset": message.commitlog_offset,
        "msgId": message.offset_msg_id,
        "topic": message.topic,
        "queueId": message.queue_id,
        "queueOffset": message.queue_offset,
        "storeTimestamp": message.store_timestamp_ms,
        "bornTimestamp": message.born_timestamp_ms,
        "keys": " ".join(message.keys) if message.keys else None,
        "tags": message.tags or None,
        "uniqKey": message.uniq_key or None,
        "properties": dict(sorted(message.properties.items())),
        "bodyLen": len(message.body),
        "bodySha256": hashlib.sha256(message.body).hexdigest(),
    }
    if with_body:
        try:
            document["body"] = message.body.decode("utf-8")
        except UnicodeDecodeError:
            document["body"] = None
        document["bodyBase64"] = base64.b64encode(message.body).decode()
    return document


def message_text(message: messages_pb2.StoredMessage) -> str:
    rows = [
        ("OffsetID:", message.offset_msg_id),
        ("Topic:", message.topic),
        ("Tags:", f"[{message.tags}]" if message.tags else "[]"),
        ("Keys:", f"[{' '.join(message.keys)}]" if message.keys else "[]"),
        ("Unique Key:", message.uniq_key),
        ("Queue ID:", message.queue_id),
        ("Queue Offset:", message.queue_offset),
        ("CommitLog Offset:", message.commitlog_offset),
        ("Reconsume Times:", message.reconsume_times),
        ("Born Timestamp:", _local_time(message.born_timestamp_ms)),
        ("Store Timestamp:", _local_time(message.store_timestamp_ms)),
        ("Born Host:", message.born_host),
        ("Store Host:", message.store_host),
        ("System Flag:", message.sys_flag),
        ("Properties:", json.dumps(dict(sorted(message.properties.items())), ensure_ascii=False)),
        ("Body Length:", len(message.body)),
        ("Body SHA-256:", hashlib.sha256(message.body).hexdigest()),
    ]
    return "\n".join(f"{label:<20} {value}" for label, value in rows) + "\n"


def _emit(messages: Iterator[messages_pb2.StoredMessage], args: argparse.Namespace, table: bool = False) -> int:
    count = 0
    if table and not args.json:
        sys.stdout.write(f"{'#Message ID':<50} {'#QID':>4} {'#Offset':>40}\n")
    for message in messages:
        count += 1
        if args.json:
            sys.stdout.write(json.dumps(message_json(message, args.body), ensure_ascii=False) + "\n")
        elif table:
            sys.stdout.write(f"{message.offset_msg_id:<50} {message.queue_id:>4} {message.queue_offset:>40}\n")
        else:
            if count > 1:
                sys.stdout.write("\n")
            sys.stdout.write(message_text(message))
    return count


def _backend(args: argparse.Namespace) -> Backend:
    if bool(args.endpoint) == bool(args.store):
        raise InvalidArgument("give exactly one of --endpoint HOST:PORT or --store DIR")
    if args.endpoint:
        return EndpointBackend(args.endpoint, args.timeout, channel_from(args, args.endpoint))
    if args.tls_ca or args.tls_client_cert or args.tls_client_key or args.tls_server_name:
        raise InvalidArgument("the --tls-* options apply to --endpoint, not to --store")
    return StoreBackend(args)


def _run(args: argparse.Namespace, action: Any) -> int:
    backend = _backend(args)
    try:
        return int(action(backend))
    except (grpc.RpcError, LocalRpcError) as error:
        code = error.code()  # type: ignore[union-attr]
        print(f"rmqstore: {code.name}: {error.details()}", file=sys.stderr)  # type: ignore[union-attr]
        return EXIT_NOT_FOUND if code == grpc.StatusCode.NOT_FOUND else EXIT_ERROR
    finally:
        backend.close()


def cmd_query_by_key(args: argparse.Namespace) -> int:
    return _run(args, lambda b: _emit(b.key(args.topic, args.key, args.begin, args.end, args.max), args, table=True) * 0)


def cmd_query_by_uniq_key(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        if _emit(backend.uniq_key(args.topic, args.id), args) == 0:
            print(f"rmqstore: no message with unique key {args.id} in topic {args.topic}", file=sys.stderr)
            return EXIT_NOT_FOUND
        return EXIT_OK

    return _run(args, action)


def cmd_query_by_id(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        status = EXIT_OK
        for msg_id in args.id.split(","):
            try:
                response = backend.call("QueryByMsgId", query_pb2.QueryByMsgIdRequest(msg_id=msg_id.strip()))
            except (grpc.RpcError, LocalRpcError) as error:
                if error.code() != grpc.StatusCode.NOT_FOUND:  # type: ignore[union-attr]
                    raise
                print(f"rmqstore: NOT_FOUND: {error.details()}", file=sys.stderr)  # type: ignore[union-attr]
                status = EXIT_NOT_FOUND
                continue
            _emit(iter([response.message]), args)
        return status

    return _run(args, action)


def cmd_query_by_offset(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        request = query_pb2.QueryByQueueOffsetRequest(topic=args.topic, queue_id=args.queue, queue_offset=args.offset)
        _emit(iter([backend.call("QueryByQueueOffset", request).message]), args)
        return EXIT_OK

    return _run(args, action)


def cmd_search_offset(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        boundary = query_pb2.BOUNDARY_UPPER if args.boundary == "upper" else query_pb2.BOUNDARY_LOWER
        request = query_pb2.SearchOffsetRequest(
            topic=args.topic, queue_id=args.queue, timestamp_ms=args.timestamp, boundary=boundary
        )
        response = backend.call("SearchOffset", request)
        if args.json:
            print(json.dumps({"offset": response.offset, "found": response.found}))
        else:
            print(response.offset)
        return EXIT_OK

    return _run(args, action)


def cmd_print_msg(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        request = query_pb2.StreamByTimeRequest(topic=args.topic, queue_id=args.queue, begin_ms=args.begin, end_ms=args.end)
        _emit(backend.stream("StreamByTime", request), args)
        return EXIT_OK

    return _run(args, action)


def cmd_query_serve(args: argparse.Namespace) -> int:
    from rmqstore.query.service import SERVICE_NAME, AsyncQueryServicer
    from rmqstore.query.view import StoreView
    from rmqstore.service.server import AsyncServing
    from rmqstore.service.metrics import configure_metrics
    from rmqstore.service.telemetry import configure_tracing

    # TLS files and the ACL are checked before anything else.
    credentials = server_credentials_from(args)
    acl = access_from(args)
    stopping = stop_requested()
    configure_tracing("rmqstore-query")
    configure_metrics("rmqstore-query")
    budget = args.mapped_budget_mb
    if budget is not None and budget < 1:
        raise InvalidArgument(f"--mapped-budget-mb must be at least 1, got {budget}")
    view = StoreView(args.store, sizes_from(args, args.store), mapped_budget_bytes=None if budget is None else budget << 20)
    try:
        serving = AsyncServing(
            lambda s: query_pb2_grpc.add_QueryServiceServicer_to_server(AsyncQueryServicer(view), s),
            [SERVICE_NAME],
            host=args.host,
            port=args.port,
            credentials=credentials,
            health_port=args.health_port,
            workers=args.workers,
            acl=acl,
        )
    except BaseException:
        view.close()
        raise
    status = view.status()
    print(
        json.dumps(
            {
                "event": "serving",
                "service": "query",
                "port": serving.port,
                "store": args.store,
                "followsWriter": status.has_progress,
                "visibleOffset": status.visible_offset,
                **serving_tls_fields(args, serving.health_port),
            }
        ),
        flush=True,
    )
    wait_for_stop(stopping)
    serving.stop(SHUTDOWN_GRACE_S)
    view.close()
    print(json.dumps({"event": "stopped", "service": "query"}), flush=True)
    return EXIT_OK


def _lookup_parser(commands: argparse._SubParsersAction, name: str, help_text: str) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = commands.add_parser(name, help=help_text)
    where = parser.add_argument_group("where to look (exactly one)")
    where.add_argument("--endpoint", help="a query node, HOST:PORT")
    where.add_argument("--store", help="a store directory, read directly")
    parser.add_argument("--json", action="store_true", help="one JSON object per message")
    parser.add_argument("--body", action="store_true", help="with --json, include the body")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call to a node (default 30)")
    add_client_tls_options(parser)
    add_size_options(parser)
    return parser


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    query = commands.add_parser("query", help="the query node")
    query_commands = query.add_subparsers(dest="query_command", required=True)
    serve = query_commands.add_parser("serve", help="serve QueryService over gRPC on a store directory, read-only")
    serve.add_argument("--store", required=True, help="store directory (never written)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=0, help="port (default 0: any free port, printed at start)")
    serve.add_argument(
        "--mapped-budget-mb",
        type=int,
        metavar="MB",
        help="resident mapped store pages kept before they are dropped (default 96, query.view's "
        "MAPPED_RESIDENT_BUDGET_BYTES); lower keeps the RSS smaller, higher spares lookups re-mapping pages",
    )
    add_server_tls_options(serve)
    add_size_options(serve)
    serve.set_defaults(handler=cmd_query_serve)

    by_key = _lookup_parser(commands, "queryMsgByKey", "messages whose KEYS hold a key, newest first")
    by_key.add_argument("-t", "--topic", required=True)
    by_key.add_argument("-k", "--key", required=True)
    by_key.add_argument("--begin", type=int, help="earliest store time, epoch ms (inclusive)")
    by_key.add_argument("--end", type=int, help="latest store time, epoch ms (inclusive)")
    by_key.add_argument("--max", type=int, help="at most this many messages (default: all)")
    by_key.set_defaults(handler=cmd_query_by_key)

    by_uniq = _lookup_parser(commands, "queryMsgByUniqueKey", "messages with a UNIQ_KEY (client message id)")
    by_uniq.add_argument("-t", "--topic", required=True)
    by_uniq.add_argument("-i", "--id", required=True)
    by_uniq.set_defaults(handler=cmd_query_by_uniq_key)

    by_id = _lookup_parser(commands, "queryMsgById", "the message an offsetMsgId names (comma-separated list allowed)")
    by_id.add_argument("-i", "--id", required=True)
    by_id.set_defaults(handler=cmd_query_by_id)

    by_offset = _lookup_parser(commands, "queryMsgByOffset", "the message at a queue offset")
    by_offset.add_argument("-t", "--topic", required=True)
    by_offset.add_argument("-q", "--queue", type=int, required=True)
    by_offset.add_argument("-o", "--offset", type=int, required=True)
    by_offset.set_defaults(handler=cmd_query_by_offset)

    search = _lookup_parser(commands, "searchOffset", "a queue offset by store time (prints the offset)")
    search.add_argument("-t", "--topic", required=True)
    search.add_argument("-q", "--queue", type=int, required=True)
    search.add_argument("--timestamp", type=int, required=True, help="epoch ms")
    search.add_argument("--boundary", choices=["lower", "upper"], default="lower")
    search.set_defaults(handler=cmd_search_offset)

    print_msg = _lookup_parser(commands, "printMsg", "a queue's messages stored between two times")
    print_msg.add_argument("-t", "--topic", required=True)
    print_msg.add_argument("-q", "--queue", type=int, required=True)
    print_msg.add_argument("--begin", type=int, required=True, help="epoch ms (inclusive)")
    print_msg.add_argument("--end", type=int, required=True, help="epoch ms (inclusive)")
    print_msg.set_defaults(handler=cmd_print_msg)


