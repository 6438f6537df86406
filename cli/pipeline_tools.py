"""``rmqstore pipeline reindex|export|load|stats``: the batch jobs, on Spark.

Each job starts an embedded local Spark (``local[*]``, loopback only, no UI) unless given
``--master``, and runs unchanged under ``spark-submit`` (``python -m rmqstore.pipeline``
is the same command line). Progress goes to stderr (``--quiet`` hides it); Spark's own
logging is off unless ``--verbose``. Failures end in one ``rmqstore: error:`` line.
PySpark is imported only when a job runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from rmqstore.cli import exits
from rmqstore.cli.exits import EXIT_DISAGREE, EXIT_OK
from rmqstore.cli.store_tools import add_size_options, sizes_from


def _line(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")


def _with_spark(args: argparse.Namespace, name: str, job: Callable[[Any, Any], int]) -> int:
    """Start Spark, run ``job(spark, progress)``, stop Spark; Spark's failures become the
    store error behind them (one line, through ``main``)."""
    from rmqstore.pipeline import session
    from rmqstore.pipeline.progress import Progress

    owned = not session.has_active_session()  # a session someone else started stays up
    spark = session.start(args.master, app_name=f"rmqstore-{name}", verbose=args.verbose)
    try:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        try:
            return job(spark, Progress(spark, label=f"pipeline {name}", enabled=not args.quiet))
        except (PySparkException, Py4JError) as error:
            raise session.explain(error) from None
    finally:
        if owned:
            spark.stop()


def _needs_extra(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command``, run only once the ``pipeline`` extra is known to be installed: a job's
    modules import PySpark and pyarrow, which a plain install lacks (one error line naming
    the extra, exit 2)."""

    def run(args: argparse.Namespace) -> int:
        from rmqstore.pipeline import session

        session.require_extra()
        return command(args)

    return run


def _add_store(parser: argparse.ArgumentParser, *, several: bool = False) -> None:
    """The store, positional as the jobs have always taken it, or ``--store`` as the
    servers and lookups take it; a job that reads several (a cluster's writer groups)
    takes ``--store`` once per store, and ``--broker-name`` once per store, in the same
    order, to name each store's group in its output."""
    parser.add_argument("store", nargs="?", metavar="DIR", help="store directory to read (or --store DIR)")
    if not several:
        parser.add_argument("--store", dest="store_flag", metavar="DIR", help="the same directory, as a flag")
        return
    parser.add_argument(
        "--store", dest="store_flag", action="append", metavar="DIR",
        help="a store directory to read, as a flag; once per store to read several as one data set "
        "(a cluster's writer groups)",
    )  # fmt: skip
    parser.add_argument(
        "--broker-name", dest="broker_names", action="append", metavar="NAME",
        help="the broker name of each store (its writers' --broker-name), once per store in the order the "
        "stores are given; the output then names each row's group",
    )  # fmt: skip


def _store_root(args: argparse.Namespace) -> None:
    """The one store directory named; one that is missing or not a store is a usage error
    (exit 2), not a lookup that found nothing."""
    from rmqstore.common.errors import InvalidArgument
    from rmqstore.pipeline import splits

    given = [path for path in (args.store, args.store_flag) if path is not None]
    if not given:
        raise InvalidArgument("give the store directory: DIR or --store DIR")
    if len(given) == 2 and given[0] != given[1]:
        raise InvalidArgument(f"two store directories given ({given[0]} and --store {given[1]}); give one")
    args.store = splits.store_root(given[0], "store directory" if args.store is not None else "--store")


def _store_roots(args: argparse.Namespace) -> None:
    """The store directories named (``args.stores``) and their broker names
    (``args.broker_names``, or None): DIR alone, or ``--store`` once per store. Each must
    be a store (exit 2 otherwise), none given twice, and broker names, when given, one per
    store and distinct."""
    from rmqstore.common.errors import InvalidArgument
    from rmqstore.pipeline import splits

    flags: list[str] = args.store_flag or []
    if args.store is not None and flags:
        if flags != [args.store]:
            shown = " ".join(f"--store {path}" for path in flags)
            raise InvalidArgument(f"store directories given as DIR ({args.store}) and as {shown}; give one DIR, or every store as --store DIR")
        flags = []
    if args.store is None and not flags:
        raise InvalidArgument("give the store directory: DIR or --store DIR")
    if args.store is not None:
        args.stores = [splits.store_root(args.store, "store directory")]
    else:
        repeated = sorted({path for path in flags if flags.count(path) > 1})
        if repeated:
            raise InvalidArgument(f"--store {repeated[0]} is given twice")
        args.stores = [splits.store_root(path, "--store") for path in flags]
    names: list[str] | None = args.broker_names
    if names is not None:
        if len(names) != len(args.stores):
            raise InvalidArgument(f"{len(names)} --broker-name for {len(args.stores)} store(s): give one per store, in the stores' order")
        if any(not name or any(c.isspace() for c in name) for name in names):
            raise InvalidArgument("--broker-name: expected a non-empty name without spaces")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise InvalidArgument(f"--broker-name {repeated[0]} is given twice: each store is one writer group")
    args.store = args.stores[0]


@_needs_extra
def cmd_reindex(args: argparse.Namespace) -> int:
    from rmqstore.common.files.commitlog import StopReason
    from rmqstore.common.files.lockfile import holding_store_lock
    from rmqstore.pipeline import reindex

    _store_root(args)
    exits.creatable_dir(args.out, "--out")
    reindex.check_output(args.out)
    sizes = sizes_from(args, args.store)

    def job(spark: Any, progress: Any) -> int:
        summary = reindex.run(spark, args.store, args.out, sizes, progress=progress)
        _line(
            {
                "records": summary.records,
                "endOffset": summary.stop.end_offset,
                "stop": summary.stop.reason.value,
                "queues": summary.queues,
                "units": summary.units,
                "indexFiles": len(summary.index_files),
                "indexKeys": summary.index_keys,
            }
        )
        if summary.stop.reason is not StopReason.END:
            print(f"rmqstore: {summary.stop.describe()}", file=sys.stderr)
        return EXIT_DISAGREE if summary.stop.reason is StopReason.CORRUPT else EXIT_OK

    # OUT may be a store: never one a writer runs on.
    with holding_store_lock(args.out, "--out", create=False, refused="nothing was written"):
        return _with_spark(args, "reindex", job)


@_needs_extra
def cmd_export(args: argparse.Namespace) -> int:
    import os

    from rmqstore.common.errors import InvalidArgument
    from rmqstore.pipeline import export

    _store_roots(args)
    if os.path.exists(args.out):
        raise InvalidArgument(f"--out {args.out} already exists; export writes a new directory")

    def job(spark: Any, progress: Any) -> int:
        summary = export.run(
            spark,
            args.stores,
            args.out,
            broker_names=args.broker_names,
            topic=args.topic,
            begin_ms=args.begin,
            end_ms=args.end,
            file_size_bytes=args.commitlog_file_size,
            progress=progress,
        )
        _line(
            {
                "rows": summary.rows,
                "out": args.out,
                "partitions": [{"topic": t, "date": d, "rows": n} for t, d, n in summary.partitions],
            }
        )
        return EXIT_OK

    return _with_spark(args, "export", job)


@_needs_extra
def cmd_load(args: argparse.Namespace) -> int:
    import os

    from rmqstore.common.errors import InvalidArgument
    from rmqstore.pipeline import load

    if not os.path.exists(args.input):
        raise InvalidArgument(f"{args.input}: no such input")
    if args.target_store is not None:
        exits.existing_store(args.target_store, "--target-store")
    load.writer_status(args.endpoint)  # an unreachable writer fails before Spark starts

    def job(spark: Any, progress: Any) -> int:
        summary = load.run(
            spark,
            args.input,
            args.endpoint,
            input_format=args.format,
            target_store=args.target_store,
            query_endpoint=args.query_endpoint,
            queue_ids=args.queue_ids,
            skip_unsendable=args.skip_unsendable,
            batch_messages=args.batch_messages,
            index_slots=args.index_slots,
            index_entries=args.index_entries,
            progress=progress,
        )
        _line(
            {
                "input": summary.input_messages,
                "unsendableSkipped": summary.unsendable_skipped,
                "repeatedInInput": summary.repeated_in_input,
                "alreadyStored": summary.already_stored + summary.skipped_at_send,
                "sent": summary.sent,
                "dedupe": summary.dedupe,
            }
        )
        return EXIT_OK

    return _with_spark(args, "load", job)


@_needs_extra
def cmd_stats(args: argparse.Namespace) -> int:
    from rmqstore.common.errors import InvalidArgument
    from rmqstore.pipeline import stats

    _store_roots(args)
    sizes = sizes_from(args, args.store)
    for other in args.stores[1:]:
        if (other_sizes := sizes_from(args, other)) != sizes:
            raise InvalidArgument(f"--store {other} has other sizes than --store {args.store} ({other_sizes} and {sizes}): give stores of one geometry")

    def job(spark: Any, progress: Any) -> int:
        report = stats.run(spark, args.stores, sizes, top=args.top, broker_names=args.broker_names, progress=progress)
        if args.json:
            print(json.dumps(report, ensure_ascii=False, indent=2))
        else:
            print(stats.render(report))
        return EXIT_OK

    return _with_spark(args, "stats", job)


def _spark_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Spark")
    group.add_argument("--master", help="Spark master URL (default: local[*], or spark-submit's)")
    group.add_argument("--quiet", action="store_true", help="no progress on stderr")
    group.add_argument("--verbose", action="store_true", help="show Spark's own logging")


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    pipeline = commands.add_parser("pipeline", help="batch jobs on Spark: reindex, export, load, stats")
    jobs = pipeline.add_subparsers(dest="pipeline_command", required=True, metavar="JOB")

    rebuild = jobs.add_parser(
        "reindex",
        help="rebuild consume queues and index files with Spark (byte-identical to `rmqstore reindex`)",
    )
    _add_store(rebuild)
    rebuild.add_argument("--out", required=True, help="directory that receives consumequeue/ and index/")
    add_size_options(rebuild)
    _spark_options(rebuild)
    rebuild.set_defaults(handler=cmd_reindex)

    export = jobs.add_parser(
        "export",
        help="write a store's records (or several stores', as one data set) as Parquet, partitioned by topic and date",
        description="Layout: OUT/topic=T/date=yyyy-MM-dd/part-*.parquet (date: UTC day of storeTimestamp). "
        "Columns: every record field of the rmqstore data source (commitLogOffset, size, msgId, queueId, "
        "queueOffset, sysFlag, flag, bodyCRC, bornTimestamp, storeTimestamp, bornHost, storeHost, "
        "reconsumeTimes, preparedTransactionOffset, keys, tags, uniqKey, properties, body, store), and brokerName "
        "with --broker-name; topic and date are in the path.",
    )
    _add_store(export, several=True)
    export.add_argument("--out", required=True, help="new directory for the Parquet dataset")
    export.add_argument("--topic", help="only this topic")
    export.add_argument("--begin", type=exits.time_ms, metavar="TIME", help=f"only records stored at or after this time: {exits.TIME_HELP}")
    export.add_argument("--end", type=exits.time_ms, metavar="TIME", help=f"only records stored at or before this time: {exits.TIME_HELP}")
    export.add_argument("--commitlog-file-size", type=int, metavar="BYTES", help="commit log file size (default: the files')")
    _spark_options(export)
    export.set_defaults(handler=cmd_export)

    load = jobs.add_parser(
        "load",
        help="send a dataset of messages to a writer, skipping what it already holds (by topic and UNIQ_KEY)",
    )
    load.add_argument("input", help="Parquet dataset (export layout) or JSON Lines (`rmqstore send --file` format)")
    load.add_argument("--endpoint", required=True, type=exits.endpoint, metavar="HOST:PORT", help="the writer")
    load.add_argument("--format", choices=["parquet", "json"], default="parquet", help="input format (default parquet)")
    load.add_argument(
        "--target-store",
        metavar="DIR",
        help="the writer's store directory as mounted here (default: the path the writer reports)",
    )
    load.add_argument("--query-endpoint", type=exits.endpoint, metavar="HOST:PORT", help="check each message with this query node instead")
    load.add_argument(
        "--queue-ids",
        choices=["keep", "auto"],
        default="keep",
        help="keep the data's queue ids (default; missing topics are created with enough queues) or let the writer pick",
    )
    load.add_argument("--skip-unsendable", action="store_true", help="skip records a writer cannot store instead of failing")
    load.add_argument("--batch-messages", type=exits.positive, default=1000, help="messages per batch (default 1000)")
    geometry = load.add_argument_group("the writer's index geometry (for the checks of retried tasks)")
    geometry.add_argument("--index-slots", type=int, metavar="N", help="hash slots per index file (default 5000000)")
    geometry.add_argument("--index-entries", type=int, metavar="M", help="entries per index file (default 20000000)")
    _spark_options(load)
    load.set_defaults(handler=cmd_load)

    stats = jobs.add_parser("stats", help="per topic and queue: counts, times, bytes, keys; index fill and chains")
    _add_store(stats, several=True)
    stats.add_argument("--json", action="store_true", help="print one JSON document")
    stats.add_argument("--top", type=int, default=5, help="hottest keys per topic (default 5)")
    add_size_options(stats)
    _spark_options(stats)
    stats.set_defaults(handler=cmd_stats)


def main(argv: list[str] | None = None) -> int:
    """``python -m rmqstore.pipeline JOB ...`` and ``spark-submit .../pipeline/__main__.py JOB ...``."""
    from rmqstore.cli.main import main as rmqstore_main

    return rmqstore_main(["pipeline", *(sys.argv[1:] if argv is None else argv)])

