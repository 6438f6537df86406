"""`rmqstore send --file` end to end against SQLite, in one run (benchmarks/SEND_FILE.md).

The workload (seeded, the same bytes on every run): MESSAGES messages to one topic, each
with a 256-byte body, two keys given as a list, one of five tags and queue id i % 4, in
three files:

* ``binary``: the bodies random bytes, in ``bodyBase64``;
* ``text``: the bodies 256 characters of text, in ``body``;
* ``properties``: as ``binary``, each message also with two properties of its own.

Each round, for each file: a fresh ``rmqstore writer serve --flush async`` and the command
as users run it (``python -m rmqstore.cli.main send --endpoint … --file F``, ``--acks all``
by default, its acks written to a file and counted), timed from its start to its exit;
then SQLite loading the same messages as benchmarks/sqlite_baseline.py loads its
workload (WAL, synchronous=NORMAL, 1,000 a transaction, the same indexes; only the
inserts and commits timed). Also recorded: the command's CPU seconds (user + system) and
the writer's over the command's run, SQLite's over its inserts and commits, and the
command's peak RSS.

    python benchmarks/send_file_bench.py [--messages 100000] [--rounds 3] [--acks all] [--out results/F.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import resource
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import sqlite_baseline
from bench_common import Nodes, quiet_env

SEED = 20261129
TOPIC = "SendFileBench"
TAGS = ("TagA", "TagB", "TagC", "TagD", "TagE")
BODY_BYTES = 256
QUEUES = 4
KINDS = ("binary", "text", "properties")
TEXT_ALPHABET = string.ascii_letters + string.digits + " .,;:-_"


def messages(kind: str, count: int) -> list[dict[str, Any]]:
    """The workload's messages as the file's JSON objects (drawn from SEED alone: every
    kind has the same keys, tags and queue ids; the bodies differ in kind only)."""
    rng = random.Random(SEED)
    made = []
    for i in range(count):
        body = rng.randbytes(BODY_BYTES)
        document: dict[str, Any] = {"topic": TOPIC}
        if kind == "text":
            document["body"] = "".join(TEXT_ALPHABET[b % len(TEXT_ALPHABET)] for b in body)
        else:
            document["bodyBase64"] = base64.b64encode(body).decode()
        document["keys"] = [f"order-{i:010d}", f"customer-{rng.randrange(10_000):05d}"]
        document["tags"] = TAGS[i % len(TAGS)]
        document["queueId"] = i % QUEUES
        if kind == "properties":
            document["properties"] = {"source": f"exporter-{i % 7}", "traceId": f"{rng.getrandbits(64):016x}"}
        made.append(document)
    return made


def write_file(path: Path, documents: list[dict[str, Any]]) -> int:
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(document) + "\n" for document in documents)
    return path.stat().st_size


def process_cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def send_run(jsonl: Path, count: int, work: Path, acks: str) -> dict[str, Any]:
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    out = work / "acks.out"
    with Nodes(work / "logs") as nodes:
        writer = nodes.start("writer", store, "--flush", "async")
        command = [sys.executable, "-m", "rmqstore.cli.main", "send", "--endpoint", writer.endpoint,
                   "--file", str(jsonl), "--acks", acks]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        writer_before = process_cpu_s(writer.proc.pid)
        with open(out, "wb") as stdout:
            started = time.perf_counter()
            done = subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, env=quiet_env(), timeout=3600, check=False)
            seconds = time.perf_counter() - started
        writer_cpu_s = process_cpu_s(writer.proc.pid) - writer_before
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        writer.stop()
    if done.returncode != 0:
        raise RuntimeError(f"rmqstore send --file failed ({done.returncode}): {done.stderr.decode(errors='replace')}")
    text = out.read_text(encoding="utf-8")
    acked = {"all": text.count("\n"), "summary": json.loads(text)["acked"] if acks == "summary" else 0, "none": count}[acks]
    if acked != count:
        raise RuntimeError(f"rmqstore send --file acknowledged {acked} of {count}")
    return {
        "seconds": round(seconds, 3),
        "msgs_per_s": round(count / seconds),
        "client_cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3),
        "writer_cpu_s": round(writer_cpu_s, 3),
        "client_peak_rss_mb": round(after.ru_maxrss / 1024),
    }


def sqlite_run(documents: list[dict[str, Any]], work: Path) -> dict[str, Any]:
    """The messages loaded as sqlite_baseline.load loads its workload (store times and
    queue offsets made up as the writer would give them; properties, which its schema has
    no column for, left out)."""
    rows: list[sqlite_baseline.MessageRow] = []
    keys: list[tuple[str, str, int]] = []
    next_offsets = [0] * QUEUES
    rng = random.Random(SEED + 1)
    for i, document in enumerate(documents):
        body = document["body"].encode() if "body" in document else base64.b64decode(document["bodyBase64"])
        queue_id = document["queueId"]
        rows.append((i + 1, TOPIC, queue_id, next_offsets[queue_id], f"{rng.getrandbits(128):032X}",
                     " ".join(document["keys"]), document["tags"], 1_767_225_600_000 + i // 50, body))  # fmt: skip
        next_offsets[queue_id] += 1
        keys.extend((TOPIC, key, i + 1) for key in document["keys"])
    path = work / "baseline.sqlite"
    connection = sqlite_baseline.create(path, "NORMAL")
    elapsed_ns = cpu_ns = 0
    try:
        batch = sqlite_baseline.TRANSACTION_MESSAGES
        for start in range(0, len(rows), batch):
            chosen = rows[start : start + batch]
            chosen_keys = keys[2 * start : 2 * (start + len(chosen))]  # two keys a message
            began, began_cpu = time.perf_counter_ns(), time.process_time_ns()
            sqlite_baseline.insert_batch(connection, chosen, chosen_keys)
            elapsed_ns += time.perf_counter_ns() - began
            cpu_ns += time.process_time_ns() - began_cpu
    finally:
        connection.close()
    sqlite_baseline.remove_database(path)
    seconds = elapsed_ns / 1e9
    return {"seconds": round(seconds, 3), "msgs_per_s": round(len(rows) / seconds), "cpu_s": round(cpu_ns / 1e9, 3)}


def load_average() -> str:
    with open("/proc/loadavg", encoding="ascii") as handle:
        return " ".join(handle.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--acks", choices=["all", "summary", "none"], default="all")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma separated, of " + ", ".join(KINDS))
    parser.add_argument("--out", type=Path, help="also write the results here (JSON)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    work = Path(tempfile.mkdtemp(prefix="send-file-bench-"))
    results: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/send_file_bench.py", *sys.argv[1:]]),
        "messages": args.messages,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_start": load_average(),
        "kinds": {},
    }
    try:
        files = {}
        for kind in kinds:
            documents = messages(kind, args.messages)
            files[kind] = (work / f"{kind}.jsonl", documents)
            results["kinds"][kind] = {"file_bytes": write_file(files[kind][0], documents), "rounds": []}
        for round_number in range(1, args.rounds + 1):
            for kind in kinds:
                path, documents = files[kind]
                sent = send_run(path, args.messages, work, args.acks)
                baseline = sqlite_run(documents, work)
                # The CPU ratio holds better on a loaded machine than the wall one: SQLite's
                # CPU seconds over the command's and the writer's together.
                cpu_ratio = baseline["cpu_s"] / (sent["client_cpu_s"] + sent["writer_cpu_s"])
                entry = {"send": sent, "sqlite": baseline, "ratio": round(sent["msgs_per_s"] / baseline["msgs_per_s"], 2),
                         "cpu_ratio": round(cpu_ratio, 2), "load_average": load_average()}  # fmt: skip
                results["kinds"][kind]["rounds"].append(entry)
                print(f"round {round_number} {kind}: send --file {sent['msgs_per_s']:,} msgs/s ({sent['seconds']} s, "
                      f"client {sent['client_cpu_s']} s CPU, writer {sent['writer_cpu_s']} s CPU, "
                      f"{sent['client_peak_rss_mb']} MB), SQLite {baseline['msgs_per_s']:,} msgs/s ({baseline['cpu_s']} s CPU), "
                      f"{entry['ratio']}× SQLite ({entry['cpu_ratio']}× in CPU), load {entry['load_average']}", flush=True)  # fmt: skip
        for kind in kinds:
            rounds = results["kinds"][kind]["rounds"]
            results["kinds"][kind]["median"] = {
                "send_msgs_per_s": statistics.median(r["send"]["msgs_per_s"] for r in rounds),
                "sqlite_msgs_per_s": statistics.median(r["sqlite"]["msgs_per_s"] for r in rounds),
                "ratio": statistics.median(r["ratio"] for r in rounds),
                "cpu_ratio": statistics.median(r["cpu_ratio"] for r in rounds),
            }
            print(f"{kind}: median {results['kinds'][kind]['median']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_average_end"] = load_average()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
