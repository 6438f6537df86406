"""The Spark data source's read of a piece, two ways in one process: the records decoded
by ``columnar.decode`` and built into Arrow arrays with pyarrow's public API (the
working tree's ``pipeline/columns.py``), against the --baseline revision's
``pipeline/columns.py``, whose ``decode`` read the records straight into Arrow's buffers
in one compiled pass (``_speedups.arrow_columns``, which must still be in the installed
extension).

    python benchmarks/arrow_bench.py --baseline a494b25 --messages 200000 --rounds 5

The store is pipeline_bench.py's workload (--store, generated once). Each round reads the
whole commit log as the data source's reader does (``ColumnScan`` with CRCs checked,
then ``arrow_batch`` of each batch), both ways in turn; the batches are checked equal.
Rates are rows per second of the process's CPU time (all its threads): on a shared
machine, wall time measures the neighbours. Prints one JSON document: rows per CPU
second per round and the medians. Figures: benchmarks/SPEEDUPS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def baseline_columns(revision: str, directory: Path) -> Any:
    source = subprocess.run(["git", "show", f"{revision}:pipeline/columns.py"], cwd=REPO, capture_output=True, check=True).stdout
    path = directory / "baseline_columns.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("baseline_columns", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def read_all(store: Path, decode: Any, arrow_batch: Any, schema: Any) -> tuple[int, float, list[Any]]:
    from rmqstore.common.files.commitlog import CommitLog
    from rmqstore.common.files.scan import ColumnScan

    log = CommitLog(str(store / "commitlog"), 1 << 30)
    try:
        started = time.process_time()
        batches = [arrow_batch(decoded, str(store), schema) for decoded in ColumnScan(log, log.min_offset, log.max_file_offset, decode=decode)]
        elapsed = time.process_time() - started
    finally:
        log.close()
    return sum(batch.num_rows for batch in batches), elapsed, batches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--store", default=os.path.join(tempfile.gettempdir(), "rmqstore-arrow-bench-store"))
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from pipeline_bench import count_records, generate

    from rmqstore.common.codec import columnar
    from rmqstore.pipeline import columns

    store = Path(args.store)
    if count_records(store) != args.messages:
        generate(store, args.messages)
    schema = columns.arrow_schema()
    with tempfile.TemporaryDirectory() as directory:
        baseline = baseline_columns(args.baseline, Path(directory))
        ways = {
            "pyarrow_over_columnar_decode": (columnar.decode, columns.arrow_batch),
            "baseline_compiled_arrow_pass": (baseline.decode, baseline.arrow_batch),
        }
        rates: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            tables = []
            for name, (decode, arrow_batch) in ways.items():
                rows, elapsed, batches = read_all(store, decode, arrow_batch, schema)
                assert rows == args.messages, rows
                rates[name].append(round(rows / elapsed))
                tables.append(batches)
            import pyarrow as pa

            assert pa.Table.from_batches(tables[0]).equals(pa.Table.from_batches(tables[1]))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(
        json.dumps(
            {
                "command": " ".join(["python", "benchmarks/arrow_bench.py", *sys.argv[1:]]),
                "load_average": os.getloadavg(),
                "rows_per_cpu_s": rates,
                "median_rows_per_cpu_s": medians,
                "pyarrow_over_baseline_rate": round(medians["pyarrow_over_columnar_decode"] / medians["baseline_compiled_arrow_pass"], 3),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
