"""What a hot customer's key page costs below Python: the floor under section 4's key
lookups on RocketMQ's files, for LIMITS.md.

For each hot-customer lookup of the query set (each key once, in the set's order, as
section 4 takes them), on a store of the workload written here:

* ``walk``: the compiled chain walk for the page's 33 candidates (32 and the one that
  says the page continues): one index entry, a likely cold page, per step;
* ``reads``: 33 preads of those records with their checks (layout, CRC, the key match),
  told to keep none, so no Python object is built: what any reader of these files pays;
* ``walk_and_reads``: the two together, per lookup;
* ``records``: the same reads again, now building the kept Records (warm this time);
* ``by_key``: StoreView.by_key itself, the page as section 4 times it, after the above.

Usage: python benchmarks/key_floor.py [--size 1000000] [--work DIR]. Prints JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import latency_summary  # noqa: E402
from bench_rmq import append_run  # noqa: E402
from workload import KEY_PAGE_SIZE, Workload, WorkloadSpec, build_query_sets  # noqa: E402

TIME_MAX_MS = 2**63 - 1


def measure(store: Path, workload: Workload, lookups: int) -> dict[str, Any]:
    from rmqstore.common.codec.javahash import topic_key_hash
    from rmqstore.common.codec.speedups import _speedups
    from rmqstore.common.files.commitlog import READ_AHEAD_BYTES
    from rmqstore.query.view import StoreView

    if _speedups is None:
        raise SystemExit("key_floor.py measures the compiled calls: build the extension (pip install -e .)")
    hot = [query for query in build_query_sets(workload, key_lookups=lookups).keys if query.kind == "hot"]
    view = StoreView(str(store))
    reading: contextlib.AbstractContextManager[int] | None = None
    try:
        if len(view.index.files) != 1 or len(view.log.files.files) != 1:
            raise SystemExit("key_floor.py reads one index file and one commit log file: use a smaller --size")
        index, log = view.index.files[0], view.log.files.files[0]
        reading = log.reading()
        descriptor, size, visible = reading.__enter__(), log.file_size_bytes, view.visible_offset
        clock = time.perf_counter_ns
        times: dict[str, list[int]] = {name: [] for name in ("walk", "reads", "walk_and_reads", "records", "by_key")}
        pages_agree = not_kept = 0
        for query in hot:
            key_hash = topic_key_hash(query.topic, query.key)
            keep = (query.topic.encode(), query.key.encode(), 0, TIME_MAX_MS, 0, visible)
            keep_none = (query.topic.encode(), b"\x02", 0, TIME_MAX_MS, 0, visible)  # 0x02 ends a property
            started = clock()
            found = _speedups.matching_offsets(index.mapped.buf, index.slots, index.entries, key_hash, 0, 0, KEY_PAGE_SIZE + 1)
            walked = clock()
            offsets = found[0] if found is not None else []
            _speedups.read_records(descriptor, offsets, size, log.start_offset, READ_AHEAD_BYTES, True, keep_none)
            read = clock()
            records = _speedups.read_records(descriptor, offsets, size, log.start_offset, READ_AHEAD_BYTES, True, keep)
            built = clock()
            page = view.by_key(query.topic, query.key, page_size=KEY_PAGE_SIZE)
            answered = clock()
            times["walk"].append(walked - started)
            times["reads"].append(read - walked)
            times["walk_and_reads"].append(read - started)
            times["records"].append(built - read)
            times["by_key"].append(answered - built)
            kept = [record for record in records if record]
            not_kept += len(offsets) - len(kept)  # another key with the same hash
            # The records read are the page's first ones (by_key reads on for the rest).
            pages_agree += page.records[: len(kept)] == kept[:KEY_PAGE_SIZE]
    finally:
        if reading is not None:
            reading.__exit__(None, None, None)
        view.close()
    return {
        "hot_lookups": len(hot),
        "pages_agree": pages_agree,
        "candidates_not_kept": not_kept,
        **{name: {**latency_summary(samples), "p96_us": _p96(samples)} for name, samples in times.items()},
    }


def _p96(samples_ns: list[int]) -> float | None:
    """The hot pages' p96: with hot customers a quarter of all key lookups, about where
    the p99 of all key lookups falls."""
    if len(samples_ns) < 2:
        return None
    return round(statistics.quantiles([s / 1000 for s in samples_ns], n=100, method="inclusive")[95], 2)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="messages in the store (default 1,000,000)")
    parser.add_argument("--lookups", type=int, default=10_000, help="key lookups drawn (a quarter are hot pages)")
    parser.add_argument("--work", type=Path, help="scratch directory for the store (default: a new one under /tmp)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="rmqstore-key-floor-"))
    store = work / "store"
    try:
        workload = Workload(WorkloadSpec(args.size))
        append_run(store, workload, keep_times=False)
        result = {"size": args.size, **measure(store, workload, args.lookups)}
    finally:
        shutil.rmtree(store, ignore_errors=True)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
