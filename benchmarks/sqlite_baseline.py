"""The SQLite baseline: the same workload stored the way a user would build it.

WAL journal; ``synchronous=NORMAL`` for the ASYNC comparisons (durable at checkpoints,
like rmqstore's ASYNC flush) and ``FULL`` for the SYNC comparison (every commit fsyncs the
WAL). A ``messages`` table with indexes on (topic, uniq_key), (topic, queue_id,
queue_offset) and (topic, queue_id, store_time_ms); a ``message_keys`` table indexed on
(topic, key); loads in transactions of 1,000 messages. Lookups return whole rows (body
included), as rmqstore's lookups return whole records.

Also runnable as a process, for the sections that need one:

    python sqlite_baseline.py kill-load --db F --messages N   # load, printing progress (to be SIGKILLed)
    python sqlite_baseline.py load-forever --db F --messages N --stop-file S   # the lag section's load
    python sqlite_baseline.py open-check --db F               # open after a crash, answer one lookup
    python sqlite_baseline.py rss --db F --queries Q.json     # run the query sets, print this process's memory
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from workload import KEY_PAGE_SIZE, QuerySets, Workload, WorkloadSpec

TRANSACTION_MESSAGES = 1000
BUSY_TIMEOUT_MS = 30_000  # writers in two processes wait for each other's transactions

SCHEMA = """
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    queue_id INTEGER NOT NULL,
    queue_offset INTEGER NOT NULL,
    uniq_key TEXT NOT NULL,
    keys TEXT NOT NULL,
    tags TEXT NOT NULL,
    store_time_ms INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX messages_topic_uniq ON messages (topic, uniq_key);
CREATE INDEX messages_topic_queue_offset ON messages (topic, queue_id, queue_offset);
CREATE INDEX messages_topic_queue_time ON messages (topic, queue_id, store_time_ms);
CREATE TABLE message_keys (
    topic TEXT NOT NULL,
    key TEXT NOT NULL,
    message_id INTEGER NOT NULL
);
CREATE INDEX message_keys_topic_key ON message_keys (topic, key);
"""
INDEXES = (
    ("messages_topic_uniq", "messages (topic, uniq_key)"),
    ("messages_topic_queue_offset", "messages (topic, queue_id, queue_offset)"),
    ("messages_topic_queue_time", "messages (topic, queue_id, store_time_ms)"),
    ("message_keys_topic_key", "message_keys (topic, key)"),
)
COLUMNS = "m.id, m.topic, m.queue_id, m.queue_offset, m.uniq_key, m.keys, m.tags, m.store_time_ms, m.body"
INSERT_MESSAGE = "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
INSERT_KEY = "INSERT INTO message_keys VALUES (?, ?, ?)"

MessageRow = tuple[int | None, str, int, int, str, str, str, int, bytes]


def remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def database_bytes(path: Path) -> int:
    return sum(os.path.getsize(f"{path}{s}") for s in ("", "-wal") if os.path.exists(f"{path}{s}"))


def connect(path: Path, synchronous: str = "NORMAL", *, check_same_thread: bool = True) -> sqlite3.Connection:
    # Autocommit mode: transactions are the explicit BEGIN/COMMIT below.
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=check_same_thread)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute(f"PRAGMA synchronous={synchronous}")
    return connection


def create(path: Path, synchronous: str = "NORMAL") -> sqlite3.Connection:
    remove_database(path)
    connection = connect(path, synchronous)
    connection.executescript(SCHEMA)
    return connection


def rows_of(workload: Workload, indexes: range, *, with_ids: bool = True) -> tuple[list[MessageRow], list[tuple[str, str, int]]]:
    """A batch's rows; message ids are the workload positions + 1 (so a key table row can
    name its message before the insert). Store times are the synthetic ones."""
    messages: list[MessageRow] = []
    keys: list[tuple[str, str, int]] = []
    for i in indexes:
        topic = workload.topic(i)
        messages.append(
            (
                i + 1 if with_ids else None,
                topic,
                workload.queue_ids[i],
                workload.queue_offsets[i],
                workload.uniq_keys[i],
                " ".join(workload.keys[i]),
                workload.tag(i),
                workload.synthetic_store_ms(i),
                workload.body(i),
            )
        )
        keys.extend((topic, key, i + 1) for key in workload.keys[i])
    return messages, keys


def insert_batch(connection: sqlite3.Connection, messages: list[MessageRow], keys: list[tuple[str, str, int]]) -> None:
    connection.execute("BEGIN")
    connection.executemany(INSERT_MESSAGE, messages)
    connection.executemany(INSERT_KEY, keys)
    connection.execute("COMMIT")


def load(path: Path, workload: Workload) -> dict[str, Any]:
    """Load the whole workload in transactions of 1,000; only the inserts and commits are
    timed (building the row tuples is the workload's cost, not SQLite's)."""
    connection = create(path, "NORMAL")
    elapsed_ns = 0
    try:
        for indexes in workload.batches(TRANSACTION_MESSAGES):
            messages, keys = rows_of(workload, indexes)
            started = time.perf_counter_ns()
            insert_batch(connection, messages, keys)
            elapsed_ns += time.perf_counter_ns() - started
    finally:
        connection.close()
    seconds = elapsed_ns / 1e9
    stored = database_bytes(path)
    return {
        "messages": len(workload),
        "seconds": round(seconds, 3),
        "msgs_per_s": round(len(workload) / seconds),
        "stored_bytes": stored,
        "stored_mb_per_s": round(stored / seconds / 1e6, 1),
        "body_mb_per_s": round(len(workload) * workload.spec.body_bytes / seconds / 1e6, 1),
    }


# Lookups (each returns the comparable answer: the uniq keys found, in the order found)


class Lookups:
    def __init__(self, path: Path):
        self.connection = connect(path, "NORMAL")

    def by_key(self, topic: str, key: str) -> tuple[tuple[str, ...], bool]:
        """The newest KEY_PAGE_SIZE messages with the key, and whether that is all."""
        rows = self.connection.execute(
            f"SELECT {COLUMNS} FROM message_keys k JOIN messages m ON m.id = k.message_id "
            "WHERE k.topic = ? AND k.key = ? ORDER BY k.message_id DESC LIMIT ?",
            (topic, key, KEY_PAGE_SIZE + 1),
        ).fetchall()
        return tuple(row[4] for row in rows[:KEY_PAGE_SIZE]), len(rows) <= KEY_PAGE_SIZE

    def by_uniq_key(self, topic: str, uniq_key: str) -> tuple[str, ...]:
        rows = self.connection.execute(
            f"SELECT {COLUMNS} FROM messages m WHERE m.topic = ? AND m.uniq_key = ? ORDER BY m.id DESC",
            (topic, uniq_key),
        ).fetchall()
        return tuple(row[4] for row in rows)

    def by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> tuple[str, ...]:
        rows = self.connection.execute(
            f"SELECT {COLUMNS} FROM messages m WHERE m.topic = ? AND m.queue_id = ? AND m.queue_offset = ?",
            (topic, queue_id, queue_offset),
        ).fetchall()
        return tuple(row[4] for row in rows)

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int, boundary: str) -> int:
        """rmqstore's contract: LOWER = first offset stored at or after t (the queue's
        length if none); UPPER = last offset stored at or before t (−1 if none)."""
        if boundary == "lower":
            row = self.connection.execute(
                "SELECT queue_offset FROM messages WHERE topic = ? AND queue_id = ? AND store_time_ms >= ? "
                "ORDER BY store_time_ms, id LIMIT 1",
                (topic, queue_id, timestamp_ms),
            ).fetchone()
            if row is not None:
                return int(row[0])
            (high,) = self.connection.execute(
                "SELECT coalesce(max(queue_offset) + 1, 0) FROM messages WHERE topic = ? AND queue_id = ?",
                (topic, queue_id),
            ).fetchone()
            return int(high)
        row = self.connection.execute(
            "SELECT queue_offset FROM messages WHERE topic = ? AND queue_id = ? AND store_time_ms <= ? "
            "ORDER BY store_time_ms DESC, id DESC LIMIT 1",
            (topic, queue_id, timestamp_ms),
        ).fetchone()
        return int(row[0]) if row is not None else -1

    def time_range(self) -> tuple[int, int]:
        first, last = self.connection.execute("SELECT min(store_time_ms), max(store_time_ms) FROM messages").fetchone()
        return int(first), int(last)

    def query_plans(self) -> dict[str, str]:
        """What SQLite does for each lookup (recorded, to show the indexes are used)."""
        plans = {
            "key": (
                "SELECT m.uniq_key FROM message_keys k JOIN messages m ON m.id = k.message_id "
                "WHERE k.topic = 'a' AND k.key = 'b' ORDER BY k.message_id DESC LIMIT 33"
            ),
            "uniq_key": "SELECT * FROM messages m WHERE m.topic = 'a' AND m.uniq_key = 'b' ORDER BY m.id DESC",
            "queue_offset": "SELECT * FROM messages m WHERE m.topic = 'a' AND m.queue_id = 1 AND m.queue_offset = 2",
            "time_lower": (
                "SELECT queue_offset FROM messages WHERE topic = 'a' AND queue_id = 1 AND store_time_ms >= 5 "
                "ORDER BY store_time_ms, id LIMIT 1"
            ),
        }
        return {
            name: "; ".join(str(row[-1]) for row in self.connection.execute("EXPLAIN QUERY PLAN " + sql))
            for name, sql in plans.items()
        }

    def close(self) -> None:
        self.connection.close()


def rebuild_indexes(path: Path) -> float:
    """Seconds to drop and re-create the four indexes (SQLite's counterpart of
    re-dispatching consume queues and index files from the commit log)."""
    connection = connect(path, "NORMAL")
    try:
        for name, _ in INDEXES:
            connection.execute(f"DROP INDEX {name}")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        started = time.perf_counter_ns()
        connection.execute("BEGIN")
        for name, target in INDEXES:
            connection.execute(f"CREATE INDEX {name} ON {target}")
        connection.execute("COMMIT")
        return (time.perf_counter_ns() - started) / 1e9
    finally:
        connection.close()


# Concurrent single-message producers (the SYNC comparison) and visibility lag


def insert_each(
    connection: sqlite3.Connection, workload: Workload, indexes: range, uniq_key: str | None = None
) -> None:
    """One transaction of messages with ids SQLite assigns (for writers that share the
    table with others); ``uniq_key`` replaces the workload's (a probe's own message)."""
    messages, _ = rows_of(workload, indexes, with_ids=False)
    connection.execute("BEGIN IMMEDIATE")
    for i, row in zip(indexes, messages):
        if uniq_key is not None:
            row = row[:4] + (uniq_key,) + row[5:]
        message_id = connection.execute(INSERT_MESSAGE, row).lastrowid
        connection.executemany(INSERT_KEY, [(row[1], key, message_id) for key in workload.keys[i]])
    connection.execute("COMMIT")


class SharedWriter:
    """One connection behind a lock, shared by threads: SQLite has one writer at a time,
    and a lock in the application costs less than SQLite's busy-wait retries."""

    def __init__(self, path: Path, synchronous: str):
        self.connection = connect(path, synchronous, check_same_thread=False)
        self.lock = threading.Lock()

    def insert_one(self, workload: Workload, i: int) -> None:
        with self.lock:
            insert_each(self.connection, workload, range(i, i + 1))

    def close(self) -> None:
        self.connection.close()


def sync_producers(path: Path, workload: Workload, producers: int, seconds: float, warmup_s: float) -> dict[str, Any]:
    """``producers`` threads, each committing one message per transaction (FULL: each
    commit fsyncs the WAL) for ``seconds`` after ``warmup_s``; ack latencies of the window."""
    create(path, "FULL").close()
    shared = SharedWriter(path, "FULL")
    start_at = time.perf_counter_ns() + int(warmup_s * 1e9)
    stop_at = start_at + int(seconds * 1e9)
    latencies: list[list[int]] = [[] for _ in range(producers)]

    def produce(p: int) -> None:
        i = p
        while True:
            started = time.perf_counter_ns()
            if started >= stop_at:
                return
            shared.insert_one(workload, i % len(workload))
            if started >= start_at:
                latencies[p].append(time.perf_counter_ns() - started)
            i += producers

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shared.close()
    samples = [s for per in latencies for s in per]
    return {"producers": producers, "acked": len(samples), "seconds": seconds, "latencies_ns": samples}


def visibility_lag(path: Path, spec: WorkloadSpec, probes: int, interval_s: float, timeout_s: float) -> dict[str, Any]:
    """A loader process (as rmqstore's load is a client process) commits transactions of
    1,000 while this one commits single probe messages and polls through a second
    connection until each is readable: commit (ack) → visible."""
    create(path, "NORMAL").close()
    stop_file = Path(f"{path}.stop")
    stop_file.unlink(missing_ok=True)
    loader = subprocess.Popen(
        [sys.executable, __file__, "load-forever", "--db", str(path), "--messages", str(spec.messages),
         "--body-bytes", str(spec.body_bytes), "--seed", str(spec.seed), "--stop-file", str(stop_file)],  # fmt: skip
        stdout=subprocess.PIPE,
        text=True,
    )
    workload = Workload(WorkloadSpec(min(spec.messages, probes), spec.body_bytes, spec.seed))
    writer = connect(path, "NORMAL")
    writer.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    reader = connect(path, "NORMAL")
    lags: list[int] = []
    timeouts = 0
    loaded = 0
    try:
        assert loader.stdout is not None
        loader.stdout.readline()  # "ready": the loader's workload is built, its load started
        for n in range(probes):
            i = n % len(workload)
            uniq_key = f"F00D{n:028X}"
            insert_each(writer, workload, range(i, i + 1), uniq_key=uniq_key)
            acked = time.perf_counter_ns()
            deadline = acked + int(timeout_s * 1e9)
            while True:
                found = reader.execute(
                    "SELECT 1 FROM messages WHERE topic = ? AND uniq_key = ?", (workload.topic(i), uniq_key)
                ).fetchone()
                now = time.perf_counter_ns()
                if found is not None:
                    lags.append(now - acked)
                    break
                if now > deadline:
                    timeouts += 1
                    break
            loaded += loader.poll() is None
            time.sleep(interval_s)
    finally:
        stop_file.touch()
        out, _ = loader.communicate(timeout=120)
        stop_file.unlink(missing_ok=True)
        reader.close()
        writer.close()
    load = json.loads(out.strip().splitlines()[-1])
    return {"probes": probes, "timeouts": timeouts, "probes_under_load": loaded, "load": load, "lags_ns": lags}


# Process roles


def _kill_load(args: argparse.Namespace) -> None:
    """Load the workload, saying after each commit how many messages are in: the bench
    SIGKILLs this process part-way."""
    workload = Workload(WorkloadSpec(args.messages, args.body_bytes, args.seed))
    connection = create(Path(args.db), "NORMAL")
    done = 0
    for indexes in workload.batches(TRANSACTION_MESSAGES):
        insert_batch(connection, *rows_of(workload, indexes))
        done += len(indexes)
        print(json.dumps({"acked": done}), flush=True)
    print(json.dumps({"done": done}), flush=True)
    time.sleep(3600)  # wait to be killed: the bench measures recovery after a kill


def create_tiny(path: Path) -> None:
    """A database with the schema and one message (the floor of a restart)."""
    connection = create(path)
    connection.execute(INSERT_MESSAGE, (1, "t", 0, 0, "u", "k", "g", 0, b"\x00"))
    connection.close()


def _load_forever(args: argparse.Namespace) -> None:
    """Commit the workload in transactions of 1,000, over and over, until the stop file
    appears; then print how many messages went in and at what rate."""
    workload = Workload(WorkloadSpec(args.messages, args.body_bytes, args.seed))
    connection = connect(Path(args.db), "NORMAL")
    connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    print("ready", flush=True)
    done = 0
    started = time.perf_counter()
    while not os.path.exists(args.stop_file):
        for indexes in workload.batches(TRANSACTION_MESSAGES):
            insert_each(connection, workload, indexes)
            done += len(indexes)
            if os.path.exists(args.stop_file):
                break
    seconds = time.perf_counter() - started
    connection.close()
    print(json.dumps({"acked": done, "seconds": round(seconds, 3), "msgs_per_s": round(done / seconds)}), flush=True)


def _open_check(args: argparse.Namespace) -> None:
    """Open the database as a restarted service would, and answer one lookup."""
    started = time.perf_counter_ns()
    connection = connect(Path(args.db), "NORMAL")
    (last_id,) = connection.execute("SELECT max(id) FROM messages").fetchone()
    connection.execute(f"SELECT {COLUMNS} FROM messages m WHERE m.id = ?", (last_id,)).fetchone()
    connection.close()
    print(json.dumps({"messages": last_id, "open_seconds": (time.perf_counter_ns() - started) / 1e9}))


def run_query_sets(lookups: Lookups, queries: QuerySets, first_ms: int, last_ms: int) -> int:
    """Every lookup of the query sets once; returns how many ran."""
    for k in queries.keys:
        lookups.by_key(k.topic, k.key)
    for u in queries.uniq_keys:
        lookups.by_uniq_key(u.topic, u.uniq_key)
    for o in queries.offsets:
        lookups.by_queue_offset(o.topic, o.queue_id, o.queue_offset)
    for t in queries.times:
        lookups.search_offset(t.topic, t.queue_id, t.timestamp_ms(first_ms, last_ms), t.boundary)
    return len(queries.keys) + len(queries.uniq_keys) + len(queries.offsets) + len(queries.times)


def _rss(args: argparse.Namespace) -> None:
    """Run the query sets on the database, then report this process's memory."""
    from bench_common import process_memory

    queries = QuerySets.from_json(Path(args.queries).read_text(encoding="utf-8"))
    lookups = Lookups(Path(args.db))
    first_ms, last_ms = lookups.time_range()
    count = run_query_sets(lookups, queries, first_ms, last_ms)
    memory = process_memory(os.getpid())
    lookups.close()
    print(json.dumps({"lookups": count, "memory_kib": memory}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    roles = parser.add_subparsers(dest="role", required=True)
    kill_load = roles.add_parser("kill-load")
    kill_load.add_argument("--db", required=True)
    kill_load.add_argument("--messages", type=int, required=True)
    kill_load.add_argument("--body-bytes", type=int, default=256)
    kill_load.add_argument("--seed", type=int, required=True)
    kill_load.set_defaults(handler=_kill_load)
    load_forever = roles.add_parser("load-forever")
    load_forever.add_argument("--db", required=True)
    load_forever.add_argument("--messages", type=int, required=True)
    load_forever.add_argument("--body-bytes", type=int, default=256)
    load_forever.add_argument("--seed", type=int, required=True)
    load_forever.add_argument("--stop-file", required=True)
    load_forever.set_defaults(handler=_load_forever)
    open_check = roles.add_parser("open-check")
    open_check.add_argument("--db", required=True)
    open_check.set_defaults(handler=_open_check)
    rss = roles.add_parser("rss")
    rss.add_argument("--db", required=True)
    rss.add_argument("--queries", required=True)
    rss.set_defaults(handler=_rss)
    args = parser.parse_args(argv)
    args.handler(args)


if __name__ == "__main__":
    main()
