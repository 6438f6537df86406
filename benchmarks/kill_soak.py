"""Kill soak: SIGKILL a SYNC writer again and again while producers stream to it and a
query node follows the store, and count what went wrong.

    python benchmarks/kill_soak.py [--kills 1000] [--producers 3] [--out benchmarks/results/kill_soak.json]

Each cycle: start the writer on the same store, start ``--producers`` streams of batches
(tests/test_writer_crash.py's streamer: random topics, keys, bodies, queue ids), SIGKILL
the writer after a random delay past the first ack, restart it, and check at once (the
restarted writer idles) that every message acknowledged in the cycle is stored at its
acked offset, as sent; then ``check`` over the store. One query node serves the store the
whole time and is asked, between kills, for messages acknowledged in earlier cycles by
uniq key: each must be found. At the end: a clean stop, ``check``, every acknowledged
message stored and found on the query node, and (up to 15,000 messages) every record
looked up by every kind (verify_store). The result is written as JSON:
``acked_lost`` and ``checks_failed`` (targets 0 and 0), ``query_misses``, counts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_writer_crash import (
    KILL_DELAY_S,
    SIZE_ARGS,
    SIZES,
    Ack,
    Streamer,
    WriterProcess,
    assert_acks_stored,
    check_ok,
    verify_store,
)

from rmqstore.common.files.check import check_store
from rmqstore.v1 import query_pb2, query_pb2_grpc

FIRST_ACK_TIMEOUT_S = 30.0
QUERY_TIMEOUT_S = 10.0
# verify_store looks every record up by every kind through the index files in Python:
# minutes past this many messages (at the soak's small file sizes, hundreds of files).
VERIFY_ACKS_MAX = 15_000


def start_query_node(store: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_SDK_DISABLED"] = "true"
    with open(log, "ab") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rmqstore.cli.main", "query", "serve", "--store", str(store), "--port", "0", *SIZE_ARGS],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    assert proc.stdout is not None
    event = json.loads(proc.stdout.readline())
    assert event["event"] == "serving", event
    return proc, int(event["port"])


def query_misses(port: int, acks: list[Ack], rng: random.Random, count: int) -> int:
    """Look ``count`` acknowledged messages up by uniq key on the query node; how many
    it did not return."""
    misses = 0
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = query_pb2_grpc.QueryServiceStub(channel)
        for ack in rng.sample(acks, min(count, len(acks))):
            response = stub.QueryByUniqKey(
                query_pb2.QueryByUniqKeyRequest(topic=ack.result.topic, uniq_key=ack.result.uniq_key),
                timeout=QUERY_TIMEOUT_S,
            )
            if not any(m.commitlog_offset == ack.result.commitlog_offset for m in response.messages):
                misses += 1
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20251125)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "kill_soak.json"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.monotonic()
    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "kills": 0,
        "producers": args.producers,
        "acked": 0,
        "acked_lost": 0,
        "checks": 0,
        "checks_failed": 0,
        "check_failures": [],
        "query_lookups": 0,
        "query_misses": 0,
        "completed": False,
    }
    with tempfile.TemporaryDirectory(prefix="kill-soak-") as scratch:
        root = Path(scratch)
        store, logs = root / "store", root / "logs"
        logs.mkdir()
        writers: list[WriterProcess] = []

        def start() -> WriterProcess:
            writer = WriterProcess(store, "sync", logs, len(writers))
            writers.append(writer)
            writer.wait_serving()
            return writer

        writer = start()
        query, query_port = start_query_node(store, logs / "query.stderr")
        acks: list[Ack] = []
        try:
            for cycle in range(args.kills):
                streamers = [
                    Streamer(writer.port, cycle, rng.randrange(2**32), f"{cycle % 256:02X}{p:02X}SOAK").start()
                    for p in range(args.producers)
                ]
                for streamer in streamers:
                    streamer.first_ack.wait(FIRST_ACK_TIMEOUT_S)
                time.sleep(rng.uniform(*KILL_DELAY_S))
                writer.kill()
                result["kills"] += 1
                cycle_acks = []
                for streamer in streamers:
                    streamer.done.set()
                    streamer.join()
                    cycle_acks.extend(streamer.acks)
                writer = start()
                try:
                    assert_acks_stored(store, cycle_acks, f"cycle {cycle}")
                except AssertionError as error:
                    result["acked_lost"] += 1
                    print(f"cycle {cycle}: {error}", flush=True)
                result["checks"] += 1
                report = check_store(str(store), SIZES)
                if not report.ok:
                    result["checks_failed"] += 1
                    result["check_failures"].append(f"cycle {cycle}: {report.problems[:3]}")
                acks.extend(cycle_acks)
                result["acked"] = len(acks)
                if acks:
                    result["query_lookups"] += min(5, len(acks))
                    result["query_misses"] += query_misses(query_port, acks, rng, 5)
                write_result(args.out, result)
                if cycle % 10 == 0:
                    print(f"cycle {cycle}: {json.dumps({k: v for k, v in result.items() if k != 'check_failures'})}", flush=True)
            writer.stop()
            check_ok(store)
            assert_acks_stored(store, acks, "final")
            # Every acknowledged message, by uniq key, on the query node.
            result["final_query_misses"] = query_misses(query_port, acks, rng, len(acks))
            if len(acks) <= VERIFY_ACKS_MAX:
                result["final_records"] = verify_store(store).records
            else:
                result["final_records"] = "not looked up by every kind: over VERIFY_ACKS_MAX"
            result["completed"] = True
        finally:
            for process in writers:
                process.cleanup()
            if query.poll() is None:
                query.terminate()
                query.wait(timeout=30)
            if query.stdout is not None:
                query.stdout.close()
    result["seconds"] = round(time.monotonic() - started, 1)
    write_result(args.out, result)
    print(json.dumps(result, indent=2))


def write_result(path: str, result: dict[str, object]) -> None:
    """Written after every cycle too: a run cut short keeps what it counted."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
