"""RocketMQ 5's one-message calls on the writer against the same calls on a no-op server:
what the writer itself adds to a ``SendMessage``, a ``ReceiveMessage`` and an
``AckMessage`` (issue 38, acceptance 2: at most 1.3× the no-op handler's CPU a call).

Both servers are ``grpc.aio`` servers (the writer's framework), each a process of its own on
127.0.0.1: ``rmqstore writer serve`` (ASYNC flush) and benchmarks/bare_receive.py's
MessagingService, whose handlers answer from messages made before it serves (no store,
no interceptor, no bookkeeping). The same client process, CONCURRENCY threads on one
channel each waiting for its answer, makes CALLS calls of each kind in three phases:
``send`` (SendMessage of one message, as the official client makes it: its id, born time
and host, its eight metadata headers), ``receive`` (ReceiveMessage of batch size 1, the
receipt handles kept) and ``ack`` (AckMessage of one entry, each handle received). The
server's CPU (user + system, /proc/PID/stat) over each phase, a call, is the figure; the
writer's background (its CPU a second idle, measured just before each phase) is reported,
and taken out of the "less idle" figure the target is read on. Servers alternate, ROUNDS
times, a fresh writer each round; medians.

    python benchmarks/one_call_bench.py [--calls N] [--concurrency C] [--rounds R]
        [--out benchmarks/ONE_CALL.md] [--json results/one-call-….json]"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bare_receive import BareReceive  # noqa: E402
from bench_common import Nodes, closed_loop, latency_summary, load_average, machine_facts, quiet_env  # noqa: E402
from rocketmq5_bench import create_topic, process_cpu_s, v2_send_call  # noqa: E402

TARGET = 1.3
TOPIC = "OneCallBench"
GROUP = "OneCallGroup"
PHASES = ("send", "receive", "ack")
IDLE_S = 2.0
TIMEOUT_S = 1800.0


def client_phase(phase: str, endpoint: str, calls: int, concurrency: int, handles: Path) -> dict[str, Any]:
    """``calls`` one-message calls of ``phase`` from ``concurrency`` threads on one channel;
    ``receive`` writes the receipt handles it got to ``handles``, ``ack`` acknowledges them."""
    import grpc
    from google.protobuf import duration_pb2

    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s
    from rmqstore.rocketmq_v2 import service_pb2_grpc

    channel = grpc.insecure_channel(endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
    group, topic = v2.Resource(name=GROUP), v2.Resource(name=TOPIC)
    send_call = v2_send_call(TOPIC)
    receive_request = v2s.ReceiveMessageRequest(
        group=group, message_queue=v2.MessageQueue(topic=topic, id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=1,
        invisible_duration=duration_pb2.Duration(seconds=600), long_polling_timeout=duration_pb2.Duration(seconds=1),
    )  # fmt: skip
    entries = [line.split(" ", 1) for line in handles.read_text().splitlines()] if phase == "ack" else []
    received: list[str] = []
    lock = threading.Lock()

    def one(n: int) -> None:
        if phase == "send":
            request, metadata = send_call(n)
            status = stub.SendMessage(request, timeout=30, metadata=metadata).status
        elif phase == "receive":
            status = v2.Status(code=v2.OK)
            got = []
            for answer in stub.ReceiveMessage(receive_request, timeout=30):
                if answer.HasField("message"):
                    system = answer.message.system_properties
                    got.append(f"{system.message_id} {system.receipt_handle}")
                elif answer.HasField("status"):
                    status = answer.status
            if len(got) != 1:
                raise RuntimeError(f"ReceiveMessage of batch 1 gave {len(got)} messages ({status.code}: {status.message})")
            with lock:
                received.extend(got)
        else:
            message_id, handle = entries[n]
            entry = v2s.AckMessageEntry(message_id=message_id, receipt_handle=handle)
            status = stub.AckMessage(v2s.AckMessageRequest(group=group, topic=topic, entries=[entry]), timeout=30).status
        if status.code != v2.OK:
            raise RuntimeError(f"{phase} answered {status.code}: {status.message}")

    try:
        seconds, latencies_ns = closed_loop(one, calls, concurrency, f"{phase} calls")
    finally:
        channel.close()
    if phase == "receive":
        handles.write_text("".join(line + "\n" for line in received))
    return {"calls": calls, "seconds": seconds, "latency": latency_summary(latencies_ns)}


def measure(server: str, pid: int, endpoint: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Each phase against one server: its CPU a call, whole and less its idle background."""
    handles = work / f"handles-{server}-{time.monotonic_ns()}.txt"
    handles.touch()
    figures: dict[str, Any] = {}
    for phase in PHASES:
        idle_before = process_cpu_s(pid)
        time.sleep(IDLE_S)
        idle_ms_per_s = (process_cpu_s(pid) - idle_before) / IDLE_S * 1000
        before = process_cpu_s(pid)
        command = [sys.executable, __file__, "--client", phase, endpoint, str(handles),
                   "--calls", str(args.calls), "--concurrency", str(args.concurrency)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=quiet_env(), check=False)
        cpu_s = process_cpu_s(pid) - before
        if done.returncode != 0:
            raise RuntimeError(f"the {phase} client against the {server} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        result["cpu_us_per_call"] = cpu_s / result["calls"] * 1e6
        result["idle_cpu_ms_per_s"] = idle_ms_per_s
        result["net_cpu_us_per_call"] = (cpu_s - idle_ms_per_s / 1000 * result["seconds"]) / result["calls"] * 1e6
        figures[phase] = result
    return figures


def one_round(args: argparse.Namespace, work: Path, round_no: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    order = ("noop", "writer") if round_no % 2 == 0 else ("writer", "noop")
    for server in order:
        if server == "noop":
            bare = BareReceive(args.calls, 1)
            try:
                results[server] = measure(server, bare.process.pid, bare.endpoint, args, work)
            finally:
                bare.close()
            continue
        with Nodes(work / "logs") as nodes:
            writer = nodes.start("writer", work / f"store-{round_no}", "--flush", "async")
            create_topic(writer.endpoint, TOPIC)
            results[server] = measure(server, writer.proc.pid, writer.endpoint, args, work)
            writer.stop()
    return results


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def median(server: str, phase: str, key: str) -> float:
        return statistics.median(r[server][phase][key] for r in rounds)

    table: dict[str, Any] = {}
    for phase in PHASES:
        row = {
            f"{server}_{key}": round(median(server, phase, key), 1)
            for server in ("writer", "noop")
            for key in ("cpu_us_per_call", "net_cpu_us_per_call", "idle_cpu_ms_per_s")
        }
        for server in ("writer", "noop"):
            row[f"{server}_calls_per_s"] = round(statistics.median(r[server][phase]["calls"] / r[server][phase]["seconds"] for r in rounds), 1)
            row[f"{server}_p50_ms"] = round(statistics.median(r[server][phase]["latency"]["p50_us"] for r in rounds) / 1000, 2)
            row[f"{server}_p99_ms"] = round(statistics.median(r[server][phase]["latency"]["p99_us"] for r in rounds) / 1000, 2)
        row["ratio"] = round(median("writer", phase, "net_cpu_us_per_call") / median("noop", phase, "net_cpu_us_per_call"), 2)
        row["ratio_whole"] = round(median("writer", phase, "cpu_us_per_call") / median("noop", phase, "cpu_us_per_call"), 2)
        row["met"] = row["ratio"] <= TARGET
        table[phase] = row
    return table


def markdown(report: dict[str, Any], command: str) -> str:
    facts = report["machine"]
    rows = "\n".join(
        f"| {phase} | {row['writer_net_cpu_us_per_call']:,.0f} ({row['writer_cpu_us_per_call']:,.0f}) "
        f"| {row['noop_net_cpu_us_per_call']:,.0f} ({row['noop_cpu_us_per_call']:,.0f}) | **{row['ratio']:.2f}×** ({row['ratio_whole']:.2f}×) "
        f"| {row['writer_calls_per_s']:,.0f} / {row['noop_calls_per_s']:,.0f} "
        f"| {row['writer_p50_ms']:.2f} / {row['writer_p99_ms']:.2f} | {row['noop_p50_ms']:.2f} / {row['noop_p99_ms']:.2f} "
        f"| {'met' if row['met'] else 'not met'} |"
        for phase, row in report["phases"].items()
    )
    return f"""## {report['started']}, commit {facts['git_commit']}

    {command}

{report['args']['calls']:,} calls of each kind a server a round, {report['args']['concurrency']} client threads,
{report['args']['rounds']} rounds, medians; {facts['cores']} cores ({facts['cpu']}); load average before
{report['load_before']}, after {report['load_after']}. Writer idle background: send
{report['phases']['send']['writer_idle_cpu_ms_per_s']:.0f} ms of CPU a second.

| call | writer CPU µs a call, less idle (whole) | no-op CPU µs a call, less idle (whole) | writer ÷ no-op (whole) | calls/s writer / no-op | writer p50 / p99 ms | no-op p50 / p99 ms | ≤ {TARGET}× |
|---|---:|---:|---:|---:|---:|---:|---|
{rows}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="append the results as markdown here")
    parser.add_argument("--json", type=Path, help="write the whole report as JSON here")
    parser.add_argument("--client", nargs=3, metavar=("PHASE", "ENDPOINT", "HANDLES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        phase, endpoint, handles = args.client
        print(json.dumps(client_phase(phase, endpoint, args.calls, args.concurrency, Path(handles))), flush=True)
        return
    command = "python benchmarks/one_call_bench.py " + " ".join(sys.argv[1:])
    load_before = load_average()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="one-call-") as tmp:
        rounds = [one_round(args, Path(tmp), n) for n in range(args.rounds)]
    report = {
        "started": started, "machine": machine_facts(REPO), "load_before": load_before, "load_after": load_average(),
        "args": {"calls": args.calls, "concurrency": args.concurrency, "rounds": args.rounds},
        "phases": summary(rounds), "rounds": rounds,
    }  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report, command)
    if args.out:
        with args.out.open("a", encoding="utf-8") as out:
            out.write("\n" + text)
    print(text)


if __name__ == "__main__":
    main()
