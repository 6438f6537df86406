"""``rmqstore query serve`` and the lookups in RocketMQ's mqadmin habits.

Each lookup runs against a query node (``--endpoint HOST:PORT``) or directly on a store
directory (``--store DIR``), and prints RocketMQ-style text or, with ``--json``, one JSON
object per message.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from typing import Any

import grpc

from rmqstore.cli import exits
from rmqstore.cli.exits import EXIT_NOT_FOUND, EXIT_OK, LocalRpcError
from rmqstore.cli.store_tools import add_size_options, requested_sizes, sizes_from
from rmqstore.cli.writer_tools import (
    add_client_tls_options,
    add_server_tls_options,
    channel_from,
    listen_options_from,
)
from rmqstore.client.shown import message_json, message_rows
from rmqstore.common.errors import InvalidArgument, NotFound, Unavailable
from rmqstore.common.files.broker_config import MESSAGE_TYPES
from rmqstore.common.times import iso_time
from rmqstore.query.groups import BROKER_NAME_DEFAULT
from rmqstore.v1 import (
    messages_pb2,
    query_pb2,
    writer_pb2,
    writer_pb2_grpc,
)


def broker_name(text: str) -> str:
    """A broker name as the writer takes one: not empty, no spaces."""
    if not text or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a non-empty name without spaces")
    return text
KEY_PAGE_SIZE = 1000
BROKER_NAME_HELP = "through a proxy: the writer group (broker name) of the queue; needed when the proxy fronts several groups"


class Backend:
    """One interface over a query node or a local store directory."""

    # Through a proxy: the writer groups that did not answer a lookup, whose part of its
    # answer is missing (an empty page then ends the paging: only they could have more).
    unanswered: set[str]

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
            self.unanswered.update(response.unanswered_groups)
            for message in response.messages:
                yield message
                sent += 1
            if response.complete or not response.messages or (limit is not None and sent >= limit):
                return
            cursor = response.cursor

    def uniq_key(self, topic: str, uniq_key: str) -> Iterator[messages_pb2.StoredMessage]:
        """Every page of a UNIQ_KEY's messages."""
        cursor = ""
        while True:
            response = self.call("QueryByUniqKey", query_pb2.QueryByUniqKeyRequest(topic=topic, uniq_key=uniq_key, cursor=cursor))
            self.unanswered.update(response.unanswered_groups)
            yield from response.messages
            if response.complete or not response.cursor or not response.messages:
                return
            cursor = response.cursor

    def call(self, method: str, request: Any) -> Any:
        raise NotImplementedError

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class EndpointBackend(Backend):
    """A query node's calls through rmqstore.client."""

    def __init__(self, endpoint: str, timeout_s: float, channel: grpc.Channel | None = None):
        from rmqstore.client import QueryClient, connect

        self.unanswered = set()
        # A given channel (e.g. a TLS one) is owned from here on: close() closes it.
        self.client = QueryClient(channel if channel is not None else connect(endpoint), timeout_s)
        self.channel = self.client.channel
        self.timeout_s = timeout_s

    def call(self, method: str, request: Any) -> Any:
        return self.client.call(method, request)

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        return self.client.stream(method, request)

    def close(self) -> None:
        self.client.close()


class _LocalContext:
    """Enough of a ServicerContext for the servicer run in-process: errors raise."""

    def peer(self) -> str:
        return "local"

    def set_trailing_metadata(self, metadata: object) -> None:
        pass

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise LocalRpcError(code, details)


class StoreBackend(Backend):
    """The same servicer, in process, on a read-only view of a directory."""

    def __init__(self, args: argparse.Namespace):
        from rmqstore.query.service import QueryServicer
        from rmqstore.query.view import StoreView

        exits.existing_store(args.store, "--store")
        self.unanswered = set()
        self.view = StoreView(args.store, sizes_from(args, args.store))
        self.servicer = QueryServicer(self.view)

    def call(self, method: str, request: Any) -> Any:
        return getattr(self.servicer, method)(request, _LocalContext())

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        answers: Iterator[Any] = getattr(self.servicer, method)(request, _LocalContext())
        return answers

    def close(self) -> None:
        self.view.close()


def message_text(message: messages_pb2.StoredMessage) -> str:
    rows = message_rows(message)
    return "\n".join(f"{label:<20} {value}" for label, value in rows) + "\n"


def _emit(messages: Iterator[messages_pb2.StoredMessage], args: argparse.Namespace, table: bool = False) -> int:
    count = 0
    # The first page is fetched before the header is written: an error then stands alone.
    first = next(messages, None)
    if table and not args.json:
        sys.stdout.write(f"{'#Message ID':<50} {'#QID':>4} {'#Offset':>40}\n")
    if first is None:
        return 0
    for message in itertools.chain([first], messages):
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
    """Run a lookup; a node's status or the servicer's error ends it through main's table."""
    if getattr(args, "body", False) and not args.json:
        # The text output has no place for a body: the flag would do nothing.
        raise InvalidArgument("--body adds the body to --json output: give --json too")
    backend = _backend(args)
    try:
        status = int(action(backend))
    finally:
        backend.close()
    if backend.unanswered:
        groups = sorted(backend.unanswered)
        exits.fail(
            f"UNAVAILABLE: group{'s' if len(groups) > 1 else ''} {', '.join(groups)} did not answer: "
            "the answer holds the other groups' messages only"
        )
        return exits.STATUS_EXITS.get(grpc.StatusCode.UNAVAILABLE, exits.EXIT_USAGE)  # as an UNAVAILABLE node's
    return status


def _topic_infos(backend: Backend) -> dict[str, query_pb2.TopicInfo]:
    response = backend.call("ListTopics", query_pb2.ListQueryTopicsRequest())
    backend.unanswered.update(response.unanswered_groups)
    return {topic.name: topic for topic in response.topics}


def _topics(backend: Backend) -> dict[str, list[query_pb2.QueueInfo]]:
    return {name: list(topic.queues) for name, topic in _topic_infos(backend).items()}


def _known_topic_info(backend: Backend, topic: str) -> query_pb2.TopicInfo:
    info = _topic_infos(backend).get(topic)
    if info is None and backend.unanswered:
        # Through a proxy: the groups that did not answer may have it.
        groups = sorted(backend.unanswered)
        raise Unavailable(f"topic {topic} is in no group that answered; {', '.join(groups)} did not answer")
    if info is None:
        raise NotFound(f"topic {topic} does not exist in this store")
    return info


def _known_topic(backend: Backend, topic: str) -> list[query_pb2.QueueInfo]:
    return list(_known_topic_info(backend, topic).queues)


def cmd_query_by_key(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        messages = backend.key(args.topic, args.key, args.begin, args.end, args.max)
        first = next(messages, None)
        if first is None:
            # No match in a topic the store has is an empty table; in one it lacks, not
            # found (told before any header is printed).
            _known_topic(backend, args.topic)
        _emit(itertools.chain([] if first is None else [first], messages), args, table=True)
        return EXIT_OK

    return _run(args, action)


def cmd_query_by_uniq_key(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        messages = backend.uniq_key(args.topic, args.id)
        first = next(messages, None)
        if first is None:
            _known_topic(backend, args.topic)
            exits.fail(f"NOT_FOUND: no message with unique key {args.id} in topic {args.topic}")
            return EXIT_NOT_FOUND
        _emit(itertools.chain([first], messages), args)
        return EXIT_OK

    return _run(args, action)


def cmd_query_by_id(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        status = EXIT_OK
        for msg_id in args.id.split(","):
            try:
                response = backend.call("QueryByMsgId", query_pb2.QueryByMsgIdRequest(msg_id=msg_id.strip()))
            except (grpc.RpcError, LocalRpcError) as error:
                if error.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                # One id of a list not found: say so, and go on with the others.
                status = exits.status_exit(error)
                continue
            _emit(iter([response.message]), args)
        return status

    return _run(args, action)


def cmd_query_by_offset(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        request = query_pb2.QueryByQueueOffsetRequest(
            topic=args.topic, queue_id=args.queue, queue_offset=args.offset, broker_name=args.broker_name or ""
        )
        _emit(iter([backend.call("QueryByQueueOffset", request).message]), args)
        return EXIT_OK

    return _run(args, action)


def cmd_search_offset(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        boundary = query_pb2.BOUNDARY_UPPER if args.boundary == "upper" else query_pb2.BOUNDARY_LOWER
        request = query_pb2.SearchOffsetRequest(
            topic=args.topic, queue_id=args.queue, timestamp_ms=args.timestamp, boundary=boundary,
            broker_name=args.broker_name or "",
        )
        response = backend.call("SearchOffset", request)
        if args.json:
            print(json.dumps({"offset": response.offset, "found": response.found}))
        else:
            print(response.offset)
        return EXIT_OK

    return _run(args, action)


def cmd_print_msg(args: argparse.Namespace) -> int:
    """One queue's messages between two times, or (without -q) every queue's in turn, as
    mqadmin's printMsg prints a topic."""
    begin = 0 if args.begin is None else args.begin
    end = exits.INT64_MAX if args.end is None else args.end
    if end < begin:
        raise InvalidArgument(f"--end {iso_time(end)} is before --begin {iso_time(begin)}")

    def action(backend: Backend) -> int:
        if args.queue is not None:
            queues = [(args.broker_name or "", args.queue)]
        else:
            # Through a proxy, each group's queues under its broker name.
            queues = [
                (queue.broker_name, queue.queue_id)
                for queue in _known_topic(backend, args.topic)
                if args.broker_name is None or queue.broker_name == args.broker_name
            ]

        def messages() -> Iterator[messages_pb2.StoredMessage]:
            for broker, queue_id in queues:
                request = query_pb2.StreamByTimeRequest(
                    topic=args.topic, queue_id=queue_id, begin_ms=begin, end_ms=end, broker_name=broker
                )
                yield from backend.stream("StreamByTime", request)

        _emit(messages(), args)
        return EXIT_OK

    return _run(args, action)


def cmd_topic_list(args: argparse.Namespace) -> int:
    def action(backend: Backend) -> int:
        topics = _topic_infos(backend)
        names = sorted(topics)
        if args.json:
            print(json.dumps(names, ensure_ascii=False))
        else:
            # The name first, so that a script taking each line's first field keeps working.
            sys.stdout.write("".join(f"{name}  {topics[name].message_type}\n" for name in names))
        return EXIT_OK

    return _run(args, action)


def cmd_topic_status(args: argparse.Namespace) -> int:
    """Per queue: min and max offset and the store time of its newest message, as
    mqadmin's topicStatus shows them."""

    def action(backend: Backend) -> int:
        rows = []
        info = _known_topic_info(backend, args.topic)
        # Through a proxy the queues of several groups, each under its broker name (a
        # query node's have none).
        brokers = any(queue.broker_name for queue in info.queues)
        for queue in sorted(info.queues, key=lambda q: (q.broker_name, q.queue_id)):
            last_ms = 0
            if queue.max_offset > queue.min_offset:
                request = query_pb2.QueryByQueueOffsetRequest(
                    topic=args.topic, queue_id=queue.queue_id, queue_offset=queue.max_offset - 1, broker_name=queue.broker_name
                )
                last_ms = backend.call("QueryByQueueOffset", request).message.store_timestamp_ms
            rows.append((queue.broker_name, queue.queue_id, queue.min_offset, queue.max_offset, last_ms))
        if args.json:
            documents = [
                {**({"brokerName": b} if brokers else {}), "queueId": q, "minOffset": lo, "maxOffset": hi, "lastUpdateTimestamp": ms}
                for b, q, lo, hi, ms in rows
            ]
            print(json.dumps(documents))
            return EXIT_OK
        head = f"{'#Broker Name':<32} " if brokers else ""
        sys.stdout.write(f"{head}{'#QID':<6} {'#Min Offset':>20} {'#Max Offset':>20}  #Last Updated\n")
        for broker, queue_id, low, high, last_ms in rows:
            shown = f"{broker:<32} " if brokers else ""
            sys.stdout.write(f"{shown}{queue_id:<6} {low:>20} {high:>20}  {iso_time(last_ms, local=True) if last_ms else ''}\n")
        sys.stdout.write(f"#Message Type  {info.message_type}\n")
        return EXIT_OK

    return _run(args, action)


def _message_type_attribute(text: str) -> str:
    """The message type of mqadmin's ``-a`` (``+message.type=FIFO``): the one attribute
    rmqstore keeps; mqadmin's others (``queue.type``, ``cleanup.policy``, …) are refused."""
    found = None
    for item in text.strip().split(","):
        key, separator, value = item.strip().partition("=")
        if key != "+message.type" or not separator:
            raise InvalidArgument(
                f"-a {text}: rmqstore keeps one topic attribute, set as +message.type=NORMAL|FIFO|DELAY|TRANSACTION|MIXED"
            )
        if found is not None:
            raise InvalidArgument(f"-a {text}: message.type is given twice")
        found = value.strip()
    if found not in MESSAGE_TYPES:
        raise InvalidArgument(f"-a {text}: message.type must be one of {', '.join(MESSAGE_TYPES)}")
    return found


def cmd_update_topic(args: argparse.Namespace) -> int:
    """mqadmin's updateTopic: a topic's queue count and message type, through the writer.
    rmqstore keeps one queue count per topic, so -r and -w, when both given, must agree."""
    counts = {count for count in (args.read_queues, args.write_queues) if count is not None}
    if len(counts) > 1:
        raise InvalidArgument(
            f"-r {args.read_queues} and -w {args.write_queues} differ; rmqstore keeps one queue count per topic"
        )
    asked = counts.pop() if counts else 0
    message_type = _message_type_attribute(args.attributes) if args.attributes is not None else ""
    request = writer_pb2.CreateTopicRequest(name=args.topic, queue_count=asked, message_type=message_type)
    with channel_from(args, args.endpoint) as channel:
        response = writer_pb2_grpc.WriterServiceStub(channel).CreateTopic(request, timeout=args.timeout)  # type: ignore[no-untyped-call]  # generated, untyped
    document: dict[str, object] = {
        "topic": response.topic.name,
        "queueCount": response.topic.queue_count,
        "messageType": response.topic.message_type,
        "changed": response.created,
    }
    if asked and response.topic.queue_count > asked:
        # Not an error (the topic has at least the queues asked for), but not what was asked.
        document["note"] = (
            f"queue counts never shrink: {response.topic.name} keeps its {response.topic.queue_count} queues "
            "(their messages stay addressable)"
        )
    print(json.dumps(document, ensure_ascii=False))
    return EXIT_OK


def cmd_update_sub_group(args: argparse.Namespace) -> int:
    """mqadmin's updateSubGroup: a consumer group's configuration, through the writer; the
    one field rmqstore acts on is consumeMessageOrderly (-o true: the group consumes FIFO)."""
    request = writer_pb2.UpdateSubscriptionGroupRequest(group=args.group)
    if args.consume_orderly is not None:
        request.consume_orderly = args.consume_orderly
    with channel_from(args, args.endpoint) as channel:
        response = writer_pb2_grpc.WriterServiceStub(channel).UpdateSubscriptionGroup(request, timeout=args.timeout)  # type: ignore[no-untyped-call]  # generated, untyped
    document = {"groupName": response.group, "consumeMessageOrderly": response.consume_orderly, "changed": response.changed}
    print(json.dumps(document, ensure_ascii=False))
    return EXIT_OK


def _boolean(text: str) -> bool:
    """mqadmin's true|false."""
    if text not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return text == "true"


PROGRESS_HEADER = ("#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff")
GROUPS_HEADER = ("#Group", "#Topics", "#Diff Total")


def _progress_line(topic: object, broker: object, queue: object, broker_offset: object, consumer_offset: object, diff: object) -> str:
    # mqadmin consumerProgress's columns and widths; a longer name pushes the row on, as there.
    return f"{topic!s:<64}  {broker!s:<32}  {queue!s:<4}  {broker_offset!s:<20}  {consumer_offset!s:<20}  {diff}\n"


# A row whose consumer offset is past the queue's end: the group would skip the messages
# the queue receives up to its offset (the writer moves the offset back when it starts).
PAST_END_MARK = "PAST_END"


def _warn_past_end(response: query_pb2.GroupLagResponse) -> None:
    past = [q for q in response.queues if q.consumer_offset > q.broker_offset]
    if past:
        where = ", ".join(f"{q.topic}/{q.queue_id} ({q.consumer_offset} > {q.broker_offset})" for q in past[:10])
        more = f" and {len(past) - 10} more" if len(past) > 10 else ""
        sys.stderr.write(
            f"rmqstore: warning: group {response.group}: consumer offset past the queue's end in {where}{more}; "
            "the writer moves such an offset back to the end when it starts\n"
        )


def cmd_consumer_progress(args: argparse.Namespace) -> int:
    """A group's progress per queue as mqadmin's consumerProgress prints it (broker offset,
    consumer offset, diff, then the diff total); without -g, every group and its total."""

    def action(backend: Backend) -> int:
        if args.group is None:
            if args.topic is not None:
                raise InvalidArgument("-t/--topic needs -g/--group")
            groups = backend.call("ListGroups", query_pb2.ListGroupsRequest()).groups
            if args.json:
                documents = [{"group": g.group, "topics": list(g.topics), "diffTotal": g.lag_total} for g in groups]
                print(json.dumps(documents, ensure_ascii=False))
                return EXIT_OK
            lines = [f"{GROUPS_HEADER[0]:<64}  {GROUPS_HEADER[1]:<7}  {GROUPS_HEADER[2]}\n"]
            lines += [f"{g.group:<64}  {len(g.topics):<7}  {g.lag_total}\n" for g in groups]
            sys.stdout.write("".join(lines))
            return EXIT_OK
        request = query_pb2.GroupLagRequest(group=args.group, topic=args.topic or "")
        response = backend.call("GroupLag", request)
        if args.json:
            queues = [
                {
                    "topic": q.topic,
                    "brokerName": q.broker_name or response.broker_name,
                    "queueId": q.queue_id,
                    "brokerOffset": q.broker_offset,
                    "consumerOffset": q.consumer_offset,
                    "diff": q.lag,
                    "pastEnd": q.consumer_offset > q.broker_offset,
                }
                for q in response.queues
            ]
            document = {"group": response.group, "queues": queues, "diffTotal": response.lag_total}
            print(json.dumps(document, ensure_ascii=False))
            _warn_past_end(response)
            return EXIT_OK
        lines = [_progress_line(*PROGRESS_HEADER)]
        for q in response.queues:
            diff = f"{q.lag}  {PAST_END_MARK}" if q.consumer_offset > q.broker_offset else q.lag
            lines.append(_progress_line(q.topic, q.broker_name or response.broker_name, q.queue_id, q.broker_offset, q.consumer_offset, diff))
        lines.append(f"\nDiff Total: {response.lag_total}\n")
        sys.stdout.write("".join(lines))
        _warn_past_end(response)
        return EXIT_OK

    return _run(args, action)


def cmd_query_serve(args: argparse.Namespace) -> int:
    from rmqstore.query.node import QueryOptions, serve

    serve(
        QueryOptions(
            store=args.store,
            listen=listen_options_from(args),
            sizes=requested_sizes(args),
            mapped_budget_mb=args.mapped_budget_mb,  # at least 1: its argument type refuses less
            broker_name=args.broker_name,
        )
    )
    return EXIT_OK


def _lookup_parser(
    commands: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    help_text: str,
    json_help: str = "one JSON object per message",
    bodies: bool = True,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text)
    where = parser.add_argument_group("where to look (exactly one)")
    where.add_argument("--endpoint", type=exits.endpoint, metavar="HOST:PORT", help="a query node")
    where.add_argument("--store", help="a store directory, read directly")
    parser.add_argument("--json", action="store_true", help=json_help)
    if bodies:
        parser.add_argument("--body", action="store_true", help="with --json (needed), include the body")
    parser.add_argument("--timeout", type=exits.seconds, default=30.0, help="seconds per call to a node (default 30)")
    add_client_tls_options(parser)
    add_size_options(parser)
    parser.set_defaults(node="query node")
    return parser


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    query = commands.add_parser("query", help="the query node")
    query_commands = query.add_subparsers(dest="query_command", required=True, metavar="serve")
    serve = query_commands.add_parser("serve", help="serve QueryService over gRPC on a store directory, read-only")
    serve.add_argument("--store", required=True, help="store directory (never written)")
    serve.add_argument("--host", type=exits.host, default="127.0.0.1", help="address to listen on (default 127.0.0.1; an IPv6 one bare or in brackets)")
    serve.add_argument("--port", type=exits.port, default=0, help="port (default 0: any free port, printed at start)")
    serve.add_argument(
        "--mapped-budget-mb",
        type=exits.positive,
        metavar="MB",
        help="resident mapped store pages kept before they are dropped (default 96, query.view's "
        "MAPPED_RESIDENT_BUDGET_BYTES); lower keeps the RSS smaller, higher spares lookups re-mapping pages",
    )
    serve.add_argument(
        "--broker-name",
        type=broker_name,
        default=BROKER_NAME_DEFAULT,
        help=f"the broker name consumerProgress shows, the writer's --broker-name (default {BROKER_NAME_DEFAULT})",
    )
    add_server_tls_options(serve)
    add_size_options(serve)
    serve.set_defaults(handler=cmd_query_serve)

    by_key = _lookup_parser(commands, "queryMsgByKey", "messages whose KEYS hold a key, newest first")
    by_key.add_argument("-t", "--topic", required=True, help="the topic")
    by_key.add_argument("-k", "--key", required=True, help="one key (KEYS are split on spaces)")
    by_key.add_argument("--begin", type=exits.time_ms, metavar="TIME", help=f"earliest store time (inclusive): {exits.TIME_HELP}")
    by_key.add_argument("--end", type=exits.time_ms, metavar="TIME", help=f"latest store time (inclusive): {exits.TIME_HELP}")
    by_key.add_argument("--max", type=exits.positive, metavar="N", help="at most this many messages (default: all)")
    by_key.set_defaults(handler=cmd_query_by_key)

    by_uniq = _lookup_parser(commands, "queryMsgByUniqueKey", "messages with a UNIQ_KEY (client message id)")
    by_uniq.add_argument("-t", "--topic", required=True, help="the topic")
    by_uniq.add_argument("-i", "--id", required=True, help="the unique key (client message id)")
    by_uniq.set_defaults(handler=cmd_query_by_uniq_key)

    by_id = _lookup_parser(commands, "queryMsgById", "the message an offsetMsgId names (comma-separated list allowed)")
    by_id.add_argument("-i", "--id", required=True, help="offsetMsgId(s), comma-separated")
    by_id.set_defaults(handler=cmd_query_by_id)

    by_offset = _lookup_parser(commands, "queryMsgByOffset", "the message at a queue offset")
    by_offset.add_argument("-t", "--topic", required=True, help="the topic")
    by_offset.add_argument("-i", "-q", "--queue", type=exits.queue_id, required=True, help="queue id (-i as in mqadmin; -q too)")
    by_offset.add_argument("-o", "--offset", type=exits.offset, required=True, help="queue offset")
    by_offset.add_argument("-b", "--broker-name", type=broker_name, help=BROKER_NAME_HELP)
    by_offset.set_defaults(handler=cmd_query_by_offset)

    search = _lookup_parser(
        commands, "searchOffset", "a queue offset by store time (prints the offset)",
        json_help="print {offset, found} as JSON", bodies=False,
    )
    search.add_argument("-t", "--topic", required=True, help="the topic")
    search.add_argument("-q", "--queue", type=exits.queue_id, required=True, help="queue id")
    search.add_argument("--broker-name", type=broker_name, help=BROKER_NAME_HELP)
    search.add_argument("--timestamp", type=exits.time_ms, required=True, metavar="TIME", help=f"store time: {exits.TIME_HELP}")
    search.add_argument(
        "--boundary",
        choices=["lower", "upper"],
        default="lower",
        help="lower: the first offset stored at or after the time; upper: the last at or before it (default lower)",
    )
    search.set_defaults(handler=cmd_search_offset)

    print_msg = _lookup_parser(
        commands, "printMsg", "a topic's messages stored between two times, queue by queue (or one queue with -q)"
    )
    print_msg.add_argument("-t", "--topic", required=True, help="the topic")
    print_msg.add_argument("-q", "--queue", type=exits.queue_id, help="only this queue id (default: every queue)")
    print_msg.add_argument("-b", "--begin", type=exits.time_ms, metavar="TIME", help=f"earliest store time, {exits.TIME_HELP} (default: the start)")
    print_msg.add_argument("-e", "--end", type=exits.time_ms, metavar="TIME", help=f"latest store time, {exits.TIME_HELP} (default: now and on)")
    print_msg.add_argument(
        "--broker-name", type=broker_name,
        help="through a proxy: only this writer group's queues (needed with -q when the proxy fronts several groups)",
    )  # fmt: skip
    print_msg.set_defaults(handler=cmd_print_msg)

    topic_list = _lookup_parser(commands, "topicList", "the store's topics, one a line", json_help="print one JSON list", bodies=False)
    topic_list.set_defaults(handler=cmd_topic_list)

    topic_status = _lookup_parser(
        commands, "topicStatus", "per queue of a topic: min and max offset, time of the newest message",
        json_help="print one JSON list of queues", bodies=False,
    )
    topic_status.add_argument("-t", "--topic", required=True, help="the topic")
    topic_status.set_defaults(handler=cmd_topic_status)

    progress = _lookup_parser(
        commands, "consumerProgress",
        "a consumer group's progress per queue: broker offset, consumer offset, diff (without -g: every group)",
        json_help="print one JSON object (without -g: a list of groups)", bodies=False,
    )
    progress.add_argument("-g", "--group", help="the consumer group (default: list every group and its diff total)")
    progress.add_argument("-t", "--topic", help="only this topic of the group")
    progress.set_defaults(handler=cmd_consumer_progress)

    update = commands.add_parser(
        "updateTopic",
        help="create a topic or grow its queue count, through the writer",
        description="Create a topic, or grow its queue count (counts never shrink), through the writer. "
        "rmqstore keeps one queue count per topic: -r and -w set it, and must agree when both are given.",
    )
    update.add_argument("--endpoint", required=True, type=exits.endpoint, metavar="HOST:PORT", help="the writer")
    update.add_argument("-t", "--topic", required=True, help="the topic")
    update.add_argument("-r", "--read-queues", type=exits.positive, metavar="N", help="read queue count")
    update.add_argument("-w", "--write-queues", type=exits.positive, metavar="N", help="write queue count (default: the writer's, 8)")
    update.add_argument(
        "-a", "--attributes", metavar="+message.type=TYPE",
        help="the topic's message type, NORMAL, FIFO, DELAY, TRANSACTION or MIXED (default: a new topic is NORMAL, "
        "an existing one keeps its type)",
    )
    update.add_argument("--timeout", type=exits.seconds, default=30.0, help="seconds before giving up (default 30)")
    add_client_tls_options(update)
    update.set_defaults(handler=cmd_update_topic, node="writer")

    sub_group = commands.add_parser(
        "updateSubGroup",
        help="create a consumer group's configuration or change it, through the writer",
        description="Create or change a consumer group's configuration (config/subscriptionGroup.json), through "
        "the writer. -o true makes the group consume FIFO, as --fifo-group does.",
    )
    sub_group.add_argument("--endpoint", required=True, type=exits.endpoint, metavar="HOST:PORT", help="the writer")
    sub_group.add_argument("-g", "--group", "--groupName", required=True, help="the consumer group")
    sub_group.add_argument(
        "-o", "--consume-orderly", "--consumeMessageOrderly", type=_boolean, metavar="true|false",
        help="consume orderly (FIFO) or not (default: a new group is not orderly, an existing one keeps its setting)",
    )
    sub_group.add_argument("--timeout", type=exits.seconds, default=30.0, help="seconds before giving up (default 30)")
    add_client_tls_options(sub_group)
    sub_group.set_defaults(handler=cmd_update_sub_group, node="writer")
