"""The commit log's body CRCs through zlib's crc32() against a hand-written CRC-32, end to end.

    python benchmarks/crc_bench.py --baseline a494b25 --messages 200000 --rounds 5

Builds the codecs' extension twice, with the flags every install uses: from the working
tree (zlib's crc32()) and from the --baseline revision's common/codec/speedups_c (the
hand-written CRC it had: PCLMULQDQ folding where the CPU has it, slicing by 8 elsewhere).
Then, the two builds taking turns in fresh processes for --rounds rounds, times what a
user runs:

1. append: the writer, in process, appending --messages messages (256 random bytes of
   body, two keys, tags, 4 topics × 4 queues) in batches of 1,000 with ASYNC flush: every
   record's CRC is computed as it is encoded;
2. check: ``check_store`` of that store (``rmqstore check``): every record decoded and its
   CRC checked, the queues and index compared;
3. scan: the whole commit log through ``ColumnScan`` with CRCs checked (what recovery,
   reindex and the pipeline's fallback read).

Times are the process's CPU seconds (all its threads): on a shared machine, wall time
measures the neighbours. Prints one JSON document: each workload's median CPU seconds per
build and zlib ÷ baseline.
Figures and history: benchmarks/SPEEDUPS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SOURCES = "common/codec/speedups_c"
NAME = "rmqstore.common.codec._speedups"
SEED = 20261129
TOPICS = ("CrcA", "CrcB", "CrcC", "CrcD")
BATCH = 1000
BODY_BYTES = 256
WORKLOADS = ("append", "check", "scan")

_BUILD = """
from pathlib import Path
from setuptools import Extension, setup
setup(
    name="crc-bench",
    script_args=["build_ext", "--build-lib", "out", "--build-temp", "tmp", "--quiet"],
    ext_modules=[Extension({name!r}, sorted(str(p) for p in Path("src").glob("*.c")), libraries=["z"],
                           extra_compile_args=["-O2", "-Wall", "-fvisibility=hidden"])],
)
"""


def build(sources: Path, target: Path) -> Path:
    """The extension built from the .c files in sources, under target; its path."""
    shutil.copytree(sources, target / "src")
    subprocess.run([sys.executable, "-c", _BUILD.format(name=NAME)], cwd=target, check=True, capture_output=True)
    (built,) = (target / "out").rglob("_speedups*" + sysconfig.get_config_var("EXT_SUFFIX"))
    return built


def baseline_sources(revision: str, target: Path) -> Path:
    archive = subprocess.run(["git", "archive", revision, SOURCES], cwd=REPO, capture_output=True, check=True).stdout
    target.mkdir()
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / SOURCES


def load(extension: str) -> None:
    """The given build in the extension's place, before anything imports it."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(NAME, extension)
    spec = importlib.util.spec_from_file_location(NAME, extension, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[NAME] = module
    from rmqstore.common.codec.speedups import _speedups

    assert _speedups is module


def child(extension: str, store: Path, messages: int) -> dict[str, float]:
    """One round of the workloads with one build: seconds each."""
    load(extension)
    from rmqstore.common.files.check import check_store
    from rmqstore.common.files.commitlog import CommitLog
    from rmqstore.common.files.scan import ColumnScan
    from rmqstore.common.files.store import StorePaths, StoreSizes
    from rmqstore.writer.config import FlushPolicy, WriterConfig
    from rmqstore.writer.store import Writer
    from rmqstore.writer.validate import MessageInput

    rng = random.Random(SEED)
    batches = [
        [
            MessageInput(
                topic=TOPICS[n % len(TOPICS)],
                body=rng.randbytes(BODY_BYTES),
                keys=[f"order-{n}", f"customer-{n % 977}"],
                tags="TagA",
                queue_id=n % 4,
            )
            for n in range(first, min(first + BATCH, messages))
        ]
        for first in range(0, messages, BATCH)
    ]
    if store.exists():
        shutil.rmtree(store)
    sizes = StoreSizes()
    times: dict[str, float] = {}
    writer = Writer(WriterConfig(store=str(store), sizes=sizes, flush=FlushPolicy.ASYNC))
    try:
        for topic in TOPICS:
            writer.topics.create(topic, 4)
        started = time.process_time()
        for batch in batches:
            writer.append(batch)
        times["append"] = time.process_time() - started
    finally:
        writer.close()
    started = time.process_time()
    report = check_store(str(store), sizes)
    times["check"] = time.process_time() - started
    assert report.ok and report.records == messages, (report.problems, report.records)
    log = CommitLog(StorePaths(str(store)).commitlog, sizes.commitlog_file_size_bytes)
    try:
        started = time.process_time()
        rows = sum(batch.rows for batch in ColumnScan(log, log.min_offset, log.max_file_offset))
        times["scan"] = time.process_time() - started
    finally:
        log.close()
    assert rows == messages, rows
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="a revision whose speedups_c has the hand-written CRC")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", nargs=3, metavar=("EXTENSION", "STORE", "MESSAGES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        extension, store, messages = args.child
        print(json.dumps(child(extension, Path(store), int(messages))))
        return 0
    with tempfile.TemporaryDirectory(prefix="crc-bench-") as directory:
        work = Path(directory)
        builds = {
            "baseline": build(baseline_sources(args.baseline, work / "baseline-src"), work / "baseline"),
            "zlib": build(REPO / SOURCES, work / "zlib"),
        }
        seconds: dict[str, dict[str, list[float]]] = {name: {w: [] for w in WORKLOADS} for name in builds}
        for round_ in range(args.rounds):
            for name, extension in builds.items():
                done = subprocess.run(
                    [sys.executable, __file__, "--baseline", args.baseline, "--child", str(extension),
                     str(work / "store"), str(args.messages)],
                    capture_output=True, text=True, check=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
                )  # fmt: skip
                for workload, value in json.loads(done.stdout).items():
                    seconds[name][workload].append(value)
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    medians = {name: {w: statistics.median(values) for w, values in by.items()} for name, by in seconds.items()}
    result: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/crc_bench.py", *sys.argv[1:]]),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "load_average": os.getloadavg()},
        "messages": args.messages,
        "cpu_seconds": seconds,
        "median_cpu_seconds": medians,
        "median_msgs_per_cpu_s": {name: {w: round(args.messages / s) for w, s in by.items()} for name, by in medians.items()},
        "zlib_over_baseline_time": {w: round(medians["zlib"][w] / medians["baseline"][w], 3) for w in WORKLOADS},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
