"""Offline tools over a store directory: dump, reindex, inspect, check (no server)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from rmqstore.cli import exits
from rmqstore.cli.exits import EXIT_DISAGREE, EXIT_OK
from rmqstore.common.errors import InvalidArgument

if TYPE_CHECKING:
    from rmqstore.common.codec.record import Record
    from rmqstore.common.files.store import RequestedSizes, StoreSizes

# The store's modules (and numpy under them) are imported by the commands that read a store,
# not when the command line is parsed: `rmqstore send` and the lookups over gRPC start in
# about half the time without them.


def add_size_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("store sizes (default: the files' own sizes, else RocketMQ's defaults)")
    group.add_argument("--commitlog-file-size", type=exits.size, metavar="BYTES", help="commit log file size (default 1073741824)")
    group.add_argument("--cq-file-units", type=exits.positive, metavar="K", help="units per consume queue file (default 300000)")
    group.add_argument("--index-slots", type=exits.positive, metavar="N", help="hash slots per index file (default 5000000)")
    group.add_argument("--index-entries", type=exits.positive, metavar="M", help="entries per index file (default 20000000)")


def add_store_argument(parser: argparse.ArgumentParser, what: str = "store directory") -> None:
    """The store directory, positional as the tools have always taken it, or ``--store`` as
    the lookups and the servers take it."""
    parser.add_argument("dir", nargs="?", metavar="DIR", help=f"{what} (or --store DIR)")
    parser.add_argument("--store", dest="store_flag", metavar="DIR", help="the same directory, as a flag")


def store_from(args: argparse.Namespace) -> str:
    """The one store directory the command line named; it must exist and be a directory."""
    given = [path for path in (args.dir, args.store_flag) if path is not None]
    if not given:
        raise InvalidArgument("give the store directory: DIR or --store DIR")
    if len(given) == 2 and given[0] != given[1]:
        raise InvalidArgument(f"two store directories given ({given[0]} and --store {given[1]}); give one")
    path = exits.existing_store(given[0], "store directory" if args.dir is not None else "--store")
    args.dir = path
    return path


def sizes_from(args: argparse.Namespace, root: str, *, reads_index: bool = True) -> StoreSizes:
    """The store's sizes (flags, else the writer's record, else the files, else RocketMQ's
    defaults), refused as a usage error when the first file of a kind is of another size."""
    from rmqstore.common.files.store import checked_sizes

    return checked_sizes(root, requested_sizes(args), reads_index=reads_index)


def requested_sizes(args: argparse.Namespace) -> RequestedSizes:
    """The store size options as given (None where not)."""
    from rmqstore.common.files.store import RequestedSizes

    return RequestedSizes(args.commitlog_file_size, args.cq_file_units, args.index_slots, args.index_entries)


def record_dump(record: Record) -> dict[str, Any]:
    """A record with the field names and value formats of Apache's lookMessageByOffset
    dump (fixtures' *-commitlog-dump.jsonl)."""
    from rmqstore.common.codec.msgid import offset_msg_id

    return {
        "commitLogOffset": record.commitlog_offset,
        "size": record.size,
        "msgId": offset_msg_id(record.store_host, record.commitlog_offset),
        "topic": record.topic,
        "queueId": record.queue_id,
        "queueOffset": record.queue_offset,
        "sysFlag": record.sys_flag,
        "flag": record.flag,
        "bodyCRC": record.body_crc,
        "bornTimestamp": record.born_timestamp_ms,
        "storeTimestamp": record.store_timestamp_ms,
        "bornHost": record.born_host.java_text(),
        "storeHost": record.store_host.java_text(),
        "reconsumeTimes": record.reconsume_times,
        "preparedTransactionOffset": record.prepared_transaction_offset,
        "bodyLen": len(record.body),
        "bodySha256": hashlib.sha256(record.body).hexdigest(),
        "properties": dict(sorted(record.properties.items())),
    }


def _line(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj, ensure_ascii=False))
    out.write("\n")


def cmd_dump_commitlog(args: argparse.Namespace) -> int:
    from rmqstore.common.files.commitlog import CommitLog, StopReason
    from rmqstore.common.files.store import StorePaths

    store_from(args)
    sizes = sizes_from(args, args.dir, reads_index=False)
    log = CommitLog(StorePaths(args.dir).commitlog, sizes.commitlog_file_size_bytes)
    try:
        records = log.records(args.start, check_crc=not args.no_crc)
        for record in records:
            _line(sys.stdout, record_dump(record))
    finally:
        log.close()
    stop = records.stop
    assert stop is not None
    if stop.reason is StopReason.END:
        return EXIT_OK
    print(f"rmqstore: {stop.describe()}", file=sys.stderr)
    return EXIT_OK if stop.reason is StopReason.TORN else EXIT_DISAGREE


def cmd_dump_consumequeue(args: argparse.Namespace) -> int:
    """Topics in the order Apache's consumeQueueTable (a ConcurrentHashMap) iterates them,
    queue ids ascending, as in the fixtures' *-consumequeue-dump.jsonl."""
    from rmqstore.common.codec.javahash import java_hashmap_order
    from rmqstore.common.files.consumequeue import ConsumeQueueSet
    from rmqstore.common.files.store import StorePaths

    store_from(args)
    sizes = sizes_from(args, args.dir, reads_index=False)
    queues = ConsumeQueueSet(StorePaths(args.dir).consumequeue, sizes.cq_file_units)
    try:
        found = queues.discover()
        topics = java_hashmap_order(sorted({topic for topic, _ in found}))
        for topic in topics:
            if args.topic is not None and topic != args.topic:
                continue
            for queue_id in sorted(q for t, q in found if t == topic):
                if args.queue is not None and queue_id != args.queue:
                    continue
                queue = queues.get(topic, queue_id)
                for queue_offset, unit in queue.units():
                    _line(
                        sys.stdout,
                        {
                            "topic": topic,
                            "queueId": queue_id,
                            "queueOffset": queue_offset,
                            "commitLogOffset": unit.commitlog_offset,
                            "size": unit.size,
                            "tagsCode": unit.tags_code,
                        },
                    )
    finally:
        queues.close()
    return EXIT_OK


def cmd_reindex(args: argparse.Namespace) -> int:
    from rmqstore.common.files.commitlog import StopReason
    from rmqstore.common.files.lockfile import holding_store_lock
    from rmqstore.common.files.store import StorePaths, reindex

    store_from(args)
    exits.creatable_dir(args.out, "--out")
    log_dir = StorePaths(args.dir).commitlog
    if not os.path.isdir(log_dir) or not os.listdir(log_dir):
        raise InvalidArgument(f"store directory {args.dir}: no commit log files under commitlog/, nothing to reindex")
    sizes = sizes_from(args, args.dir)
    # OUT may be a store: never one a writer runs on.
    with holding_store_lock(args.out, "--out", create=False, refused="nothing was written"):
        result = reindex(args.dir, args.out, sizes)
    summary = {"records": result.records, "endOffset": result.stop.end_offset, "stop": result.stop.reason.value}
    _line(sys.stdout, summary)
    if result.stop.reason is not StopReason.END:
        print(f"rmqstore: {result.stop.describe()}", file=sys.stderr)
    return EXIT_DISAGREE if result.stop.reason is StopReason.CORRUPT else EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from rmqstore.common.files.inspect import inspect_store

    store_from(args)
    report = inspect_store(args.dir, sizes_from(args, args.dir))
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
        return EXIT_OK
    log = report["commitlog"]
    print(f"store        {report['store']}")
    # RocketMQ keeps the lock file after every exit and the abort marker while a writer
    # runs: only whether the lock is held tells a live writer from an unclean exit.
    if not report["abort"]:
        abort = "absent"
    elif report["lockHeld"]:
        abort = "present (a writer is running)"
    else:
        abort = "present (last exit was unclean)"
    print(f"abort marker {abort}")
    if not report["lock"]:
        lock = "absent"
    elif report["lockHeld"]:
        lock = "held by a running writer"
    else:
        lock = "present, not held (no writer running)"
    print(f"lock file    {lock}")
    print(
        f"commit log   {len(log['files'])} file(s) of {report['sizes']['commitlogFileSize']} B, "
        f"offsets [{log['minOffset']}, {log['endOffset']}): {log['stopDetail']}"
    )
    for name in log["files"]:
        print(f"  {name}")
    print(f"consume queues ({len(report['consumequeues'])}, {report['sizes']['cqFileUnits']} units per file)")
    for queue in report["consumequeues"]:
        print(
            f"  {queue['topic']}/{queue['queueId']}: offsets [{queue['minOffset']}, {queue['maxOffset']}) "
            f"in {queue['files']} file(s)"
        )
    print(f"index files ({len(report['index'])}, {report['sizes']['indexSlots']} slots, {report['sizes']['indexEntries']} entries)")
    for entry in report["index"]:
        print(
            f"  {entry['file']}: {entry['entriesUsed']} entries ({entry['fill']:.1%} full), "
            f"times [{entry['beginTimestamp']}, {entry['endTimestamp']}], "
            f"offsets [{entry['beginPhyOffset']}, {entry['endPhyOffset']}]"
        )
    checkpoint = report["checkpoint"]
    if checkpoint is None:
        print("checkpoint   absent")
    else:
        print(
            f"checkpoint   physic {checkpoint['physicMsgTimestamp']}, logics {checkpoint['logicsMsgTimestamp']}, "
            f"index {checkpoint['indexMsgTimestamp']}"
        )
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from rmqstore.common.files.check import check_store

    store_from(args)
    report = check_store(args.dir, sizes_from(args, args.dir))
    for note in report.notes:
        print(f"note: {note}")
    if report.ok:
        print(
            f"ok: {report.records} records, {report.units} consume queue units and "
            f"{report.index_keys} index keys agree"
        )
        return EXIT_OK
    print(f"FAIL: {report.problems[0]}")
    for problem in report.problems[1:]:
        print(f"  also: {problem}")
    if report.problem_count > len(report.problems):
        print(f"  … {report.problem_count - len(report.problems)} more")
    return EXIT_DISAGREE


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    dump = commands.add_parser("dump", help="dump a store's files as JSONL")
    dump_kinds = dump.add_subparsers(dest="kind", required=True, metavar="commitlog|consumequeue")
    dump_log = dump_kinds.add_parser("commitlog", help="every commit log record, one JSON object a line")
    add_store_argument(dump_log)
    dump_log.add_argument("--start", type=exits.offset, metavar="OFFSET", help="start at this record's commit log offset")
    dump_log.add_argument("--no-crc", action="store_true", help="do not check body CRCs")
    add_size_options(dump_log)
    dump_log.set_defaults(handler=cmd_dump_commitlog)
    dump_cq = dump_kinds.add_parser("consumequeue", help="every consume queue unit, one JSON object a line")
    add_store_argument(dump_cq)
    dump_cq.add_argument("--topic", help="only this topic")
    dump_cq.add_argument("--queue", type=exits.queue_id, help="only this queue id")
    add_size_options(dump_cq)
    dump_cq.set_defaults(handler=cmd_dump_consumequeue)

    rebuild = commands.add_parser("reindex", help="rebuild consume queues and index files from the commit log")
    add_store_argument(rebuild, "store directory to read")
    rebuild.add_argument("--out", required=True, help="directory that receives consumequeue/ and index/")
    add_size_options(rebuild)
    rebuild.set_defaults(handler=cmd_reindex)

    inspect = commands.add_parser("inspect", help="files, queue bounds, index fill, checkpoint, abort marker")
    add_store_argument(inspect)
    inspect.add_argument("--json", action="store_true", help="print one JSON document")
    add_size_options(inspect)
    inspect.set_defaults(handler=cmd_inspect)

    check = commands.add_parser("check", help="verify that commit log, consume queues and index agree")
    add_store_argument(check)
    add_size_options(check)
    check.set_defaults(handler=cmd_check)
