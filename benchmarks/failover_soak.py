"""Failover soak of a writer group (issue 35, acceptance 2; benchmarks/FAILOVER.md).

Three replicas on 127.0.0.1 with a real etcd (Debian's etcd-server), ``--replication sync
--min-insync 2 --flush sync``, under load from ``--producers`` threads sending batches to
whichever replica is primary (tests/test_replication.py's Producer: each records every
acknowledged commit log offset and its message). ``--kills`` times the primary is
SIGKILLed and restarted; ``--stops`` times it is SIGSTOPped for its lease's TTL + 1 s (a
partition as the primary sees it), then SIGCONTinued: the two kinds interleaved, each
once the group has two replicas in sync again. At the end, with every replica caught up
and stopped:

* no offset acknowledged for two different messages (two primaries acknowledging in
  overlapping epochs would show here);
* every acknowledged message at its acknowledged offset on the final primary, and on
  every replica;
* every replica ``check``-clean, and the replicas byte-identical over their common length.

Failover time, per event: from the **lease's expiry** (this script watches the group's key
in etcd every 20 ms: the moment the key of the failed primary's term is gone) to the
**first acknowledged send** after it; and from the signal to that first send.

    python benchmarks/failover_soak.py [--kills 200] [--stops 20] [--producers 2]
        [--lease-ttl-s 5] [--max-seconds S] [--seed 1] [--out F.json]

``--max-seconds`` ends the soak early (after the event under way), the counts done are
reported as they are.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).parent))

import etcd3gw
from bench_common import load_average, machine_facts
from support.cli import run_cli
from support.etcd import Etcd
from support.nodes import Nodes
from support.wait import wait_until
from test_replication import Group, Producer, _another_primary, _assert_identical_over_common_length

from rmqstore.common.files.commitlog import CommitLog
from rmqstore.writer.replication.election import primary_key

ROOT = Path(__file__).resolve().parent.parent
COMMITLOG_FILE_BYTES = 256 * 1024  # tests/test_replication.py's SIZES
WATCH_INTERVAL_S = 0.02
EVENT_TIMEOUT_S = 60.0
# `rmqstore check` of a replica at the end reads every record: minutes on a loaded machine.
CHECK_TIMEOUT_S = 1800.0


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


class KeyWatch(threading.Thread):
    """The group's primary key in etcd, read every WATCH_INTERVAL_S: when each term's key
    (by create revision) was last seen and when it was found gone."""

    def __init__(self, endpoint: str, group: str):
        super().__init__(name="key-watch", daemon=True)
        host, port = endpoint.rsplit(":", 1)
        self.client = etcd3gw.client(host=host, port=int(port), timeout=2)
        self.key = primary_key(group)
        self.gone_at: dict[int, float] = {}  # create revision → time.monotonic() it was found gone
        self.stopped = threading.Event()

    def run(self) -> None:
        current: int | None = None
        while not self.stopped.is_set():
            try:
                found = self.client.get(self.key, metadata=True)
            except Exception:  # etcd busy on a loaded machine: read again
                time.sleep(WATCH_INTERVAL_S)
                continue
            now = time.monotonic()
            revision = int(found[0][1]["create_revision"]) if found else None
            if revision != current:
                if current is not None:
                    self.gone_at.setdefault(current, now)
                current = revision
            time.sleep(WATCH_INTERVAL_S)

    def revision(self) -> int:
        found = self.client.get(self.key, metadata=True)
        assert found, "no primary key in etcd"
        return int(found[0][1]["create_revision"])


def first_ack_after(producers: list[Producer], since: float) -> float:
    def found() -> float | None:
        times = [t for p in producers for t in p.ack_times[-2000:] if t > since]
        return min(times) if times else None

    return wait_until(found, EVENT_TIMEOUT_S, "an acknowledged send after the failover", 0.05)


def fail_over(group: Group, watch: KeyWatch, producers: list[Producer], event: str, primary: int, lease_ttl_s: int) -> tuple[float, float, float]:
    """SIGKILL (then restart) or SIGSTOP (then SIGCONT, past its lease) the primary, until
    it follows the new one: when the signal went, its term's key was gone and the first
    send after that was acknowledged (time.monotonic())."""
    revision = watch.revision()
    signalled = time.monotonic()
    if event == "kill":
        group.procs[primary].kill()
    else:
        group.procs[primary].proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _another_primary(group, primary), EVENT_TIMEOUT_S, "a new primary", 0.05)
        gone = wait_until(lambda: watch.gone_at.get(revision), EVENT_TIMEOUT_S, "the old term's key gone", 0.05)
        # Past the lease's expiry only the new primary acknowledges (the old one fenced itself
        # before it): an answer the old one sent before the signal may still be arriving.
        acked = first_ack_after(producers, gone)
        if event == "stop":
            # Stopped longer than its lease, whatever the election took.
            time.sleep(max(0.0, signalled + lease_ttl_s + 1 - time.monotonic()))
    finally:
        if event == "stop":
            group.procs[primary].proc.send_signal(signal.SIGCONT)
    if event == "kill":
        group.start(primary)
    wait_until(lambda: group.status(primary).role == "follower", EVENT_TIMEOUT_S, "the old primary to follow", 0.05)
    return signalled, gone, acked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--stops", type=int, default=20)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--lease-ttl-s", type=int, default=5, help="the replicas' --lease-ttl-s (default 5, the writer's default)")
    parser.add_argument("--max-seconds", type=float, default=None, help="end early, after the event under way")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the result JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the stores and logs")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    events = ["kill"] * args.kills + ["stop"] * args.stops
    rng.shuffle(events)
    work = Path(tempfile.mkdtemp(prefix="failover-soak-"))
    (work / "logs").mkdir()
    nodes = Nodes(work / "logs")
    etcd = Etcd(work)
    started = time.monotonic()
    loads = [load_average()[0]]
    done = {"kill": 0, "stop": 0}
    expiry_to_ack: dict[str, list[float]] = {"kill": [], "stop": []}
    signal_to_ack: dict[str, list[float]] = {"kill": [], "stop": []}
    producers: list[Producer] = []
    try:
        group = Group(
            nodes, work, 3, "--replication", "sync", "--min-insync", "2", "--flush", "sync",
            "--etcd", etcd.endpoint, "--lease-ttl-s", str(args.lease_ttl_s), "--replica-lag-max-ms", "1000",
        )  # fmt: skip
        group.start(0, 1, 2)
        watch = KeyWatch(etcd.endpoint, group.name)
        watch.start()
        producers = [Producer(group, n) for n in range(args.producers)]
        for producer in producers:
            producer.start()
        for number, event in enumerate(events):
            if args.max_seconds is not None and time.monotonic() - started > args.max_seconds:
                break
            primary = group.primary()
            group.in_sync(primary, 2)
            time.sleep(rng.uniform(0.3, 1.5))  # load on the settled group
            signalled, gone, acked = fail_over(group, watch, producers, event, primary, args.lease_ttl_s)
            expiry_to_ack[event].append(acked - gone)
            signal_to_ack[event].append(acked - signalled)
            done[event] += 1
            loads.append(load_average()[0])
            print(
                f"{number + 1}/{len(events)} {event} replica {primary}: lease expiry → first ack {acked - gone:.2f} s, "
                f"signal → first ack {acked - signalled:.2f} s",
                flush=True,
            )
        for producer in producers:
            producer.stopped.set()
        for producer in producers:
            producer.join(60)
        final = group.primary()
        end = group.status(final).end_offset
        wait_until(lambda: all(group.status(k).end_offset == end for k in range(3)), EVENT_TIMEOUT_S, "every replica to catch up")
        watch.stopped.set()
        group.stop(0, 1, 2)
        acked_by_offset: dict[int, str] = {}
        two_messages = 0
        for producer in producers:
            for offset, uniq_key in producer.acked.items():
                if acked_by_offset.setdefault(offset, uniq_key) != uniq_key:
                    two_messages += 1
        lost: dict[int, int] = {}
        for k in range(3):
            log = CommitLog(str(group.store(k) / "commitlog"), COMMITLOG_FILE_BYTES)
            try:
                lost[k] = sum(1 for offset, uniq_key in acked_by_offset.items() if log.read(offset).uniq_key != uniq_key)
            finally:
                log.close()
        checks = {k: run_cli(["check", str(group.store(k))], timeout_s=CHECK_TIMEOUT_S).returncode for k in range(3)}
        _assert_identical_over_common_length([group.store(k) for k in range(3)])
        every = expiry_to_ack["kill"] + expiry_to_ack["stop"]
        result: dict[str, Any] = {
            "command": " ".join(sys.argv),
            "machine": machine_facts(ROOT),
            "load_average_1m": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
            "seconds": round(time.monotonic() - started, 1),
            "asked": {"kills": args.kills, "stops": args.stops},
            "done": {"kills": done["kill"], "stops": done["stop"]},
            "lease_ttl_s": args.lease_ttl_s,
            "producers": args.producers,
            "acked_messages": len(acked_by_offset),
            "refused_batches": sum(p.refused for p in producers),
            "offsets_acked_for_two_messages": two_messages,
            "acked_lost_on_replica": {str(k): v for k, v in lost.items()},
            "final_primary": final,
            "check_exit_codes": {str(k): v for k, v in checks.items()},
            "identical_over_common_length": True,
            "expiry_to_first_ack_s": {
                "p50": percentile(every, 0.5), "p99": percentile(every, 0.99), "max": max(every, default=None),
                "kill_p50": percentile(expiry_to_ack["kill"], 0.5), "kill_p99": percentile(expiry_to_ack["kill"], 0.99),
                "stop_p50": percentile(expiry_to_ack["stop"], 0.5), "stop_p99": percentile(expiry_to_ack["stop"], 0.99),
            },  # fmt: skip
            "signal_to_first_ack_s": {
                "kill_p50": percentile(signal_to_ack["kill"], 0.5), "kill_p99": percentile(signal_to_ack["kill"], 0.99),
                "stop_p50": percentile(signal_to_ack["stop"], 0.5), "stop_p99": percentile(signal_to_ack["stop"], 0.99),
            },  # fmt: skip
        }
        print(json.dumps(result, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        failed = two_messages or any(lost.values()) or any(checks.values())
        sys.exit(1 if failed else 0)
    finally:
        for producer in producers:
            producer.stopped.set()
        nodes.close()
        etcd.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
