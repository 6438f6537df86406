"""RocketMQ 5 producers against the writer: the official Python client's send rate with
CONCURRENCY async sends in flight (apache.rocketmq.v2 SendMessage, one message each),
beside rmqstore's own ``WriterService.Send`` per message from CONCURRENCY Python threads,
each against a fresh writer (ASYNC flush) in the same run, alternating, ROUNDS times.
The figure is the ratio of the medians (target: at least 0.8).

A third sender splits the client's cost from the writer's: the same Python threads as
our own Send's, calling v2 SendMessage with the messages and the eight metadata headers
the official client sends. Its rate shows what the writer's v2 path allows a caller as
cheap as ours; its writer CPU a message is the v2 path's own.

    python benchmarks/rocketmq5_bench.py [--messages N] [--concurrency C] [--rounds R]
        [--out benchmarks/ROCKETMQ5.md]

The official client runs from its own virtualenv (``RMQSTORE_RMQ5_VENV``, default
.venv-rmq5, which test.sh makes). Both senders are separate processes, as the writer is."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_common import Nodes, closed_loop, load_average, machine_facts, quiet_env, ratio  # noqa: E402

TARGET = 0.8
TIMEOUT_S = 1800.0


def create_topic(endpoint: str, topic: str) -> None:
    """The topic, as ``rmqstore updateTopic -t TOPIC`` makes it (a NORMAL topic)."""
    import grpc

    from rmqstore.v1 import writer_pb2, writer_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        writer_pb2_grpc.WriterServiceStub(channel).CreateTopic(writer_pb2.CreateTopicRequest(name=topic), timeout=60)


def own_send(endpoint: str, topic: str, count: int, concurrency: int, protocol: str = "v1") -> dict[str, Any]:
    """``count`` one-message sends from ``concurrency`` threads, each waiting for its ack:
    WriterService.Send (``v1``), or v2 SendMessage as the official client makes it (``v2``)."""
    import grpc

    channel = grpc.insecure_channel(endpoint)
    send = _v2_sender(channel, topic) if protocol == "v2" else _v1_sender(channel, topic)
    send(-1)  # the topic and the channel warmed, as the client's are
    try:
        seconds, _ = closed_loop(send, count, concurrency, "sends")
    finally:
        channel.close()
    return {"messages": count, "seconds": seconds}


def _v1_sender(channel: Any, topic: str) -> Any:
    from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

    stub = writer_pb2_grpc.WriterServiceStub(channel)

    def send(n: int) -> None:
        # The same message the official client's benchmark sends: tag, two keys, two properties.
        request = writer_pb2.SendRequest(
            message=messages_pb2.Message(
                topic=topic, body=f"message {n} to {topic}".encode(), tags=f"Tag{n % 3}",
                keys=[f"order-{n}", f"customer-{n % 100}"], properties={"seq": str(n), "origin": "python-client"},
            )
        )  # fmt: skip
        stub.Send(request, timeout=30)

    return send


def _v2_sender(channel: Any, topic: str) -> Any:
    """v2 SendMessage with what the official Python client puts in each call: the message
    with its id, born time and host, and its eight metadata headers (a request id each)."""
    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2_grpc

    stub = service_pb2_grpc.MessagingServiceStub(channel)
    call = v2_send_call(topic)

    def send(n: int) -> None:
        request, metadata = call(n)
        response = stub.SendMessage(request, timeout=30, metadata=metadata)
        if response.status.code != v2.OK:
            raise RuntimeError(f"SendMessage answered {response.status.code}: {response.status.message}")

    return send


def v2_send_call(topic: str) -> Any:
    """n → (SendMessageRequest, metadata) of message ``n`` as the official Python client
    makes the call (for a sync or an asyncio stub alike)."""
    import socket
    import uuid

    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s

    born_host = socket.gethostbyname(socket.gethostname())
    client_id = f"{socket.gethostname()}@{os.getpid()}@0@{uuid.uuid4().hex[:10]}"
    signature = "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=" + "0" * 40

    def call(n: int) -> tuple[Any, tuple[tuple[str, str], ...]]:
        message = v2.Message(body=f"message {n} to {topic}".encode(), user_properties={"seq": str(n), "origin": "python-client"})
        message.topic.name = topic
        system = message.system_properties
        system.tag = f"Tag{n % 3}"
        system.keys.extend([f"order-{n}", f"customer-{n % 100}"])
        system.message_id = uuid.uuid4().hex.upper()
        system.born_timestamp.GetCurrentTime()
        system.born_host = born_host
        system.body_encoding = v2.IDENTITY
        system.message_type = v2.NORMAL
        metadata = (
            ("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"), ("x-mq-client-version", "5.1.2"),
            ("x-mq-date-time", time.strftime("%Y%m%dT%H%M%SZ")), ("x-mq-request-id", str(uuid.uuid4())),
            ("x-mq-client-id", client_id), ("x-mq-namespace", ""), ("authorization", signature),
        )  # fmt: skip
        return v2s.SendMessageRequest(messages=[message]), metadata

    return call


def process_cpu_s(pid: int) -> float:
    """User and system CPU a live process has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_sender(command: list[str], env: dict[str, str], writer_pid: int) -> dict[str, Any]:
    """Run a sender; its result with the CPU seconds the sender and the writer spent."""
    writer_before = process_cpu_s(writer_pid)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["sender_cpu_s"] = (children_after.ru_utime + children_after.ru_stime) - (
        children_before.ru_utime + children_before.ru_stime
    )
    result["writer_cpu_s"] = process_cpu_s(writer_pid) - writer_before
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the results as markdown here")
    parser.add_argument("--own-send", nargs=3, metavar=("PROTOCOL", "ENDPOINT", "TOPIC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.own_send:
        protocol, endpoint, topic = args.own_send
        print(json.dumps(own_send(endpoint, topic, args.messages, args.concurrency, protocol)), flush=True)
        return
    rmq5 = Path(os.environ.get("RMQSTORE_RMQ5_VENV", REPO / ".venv-rmq5")) / "bin" / "python"
    if not rmq5.exists():
        raise SystemExit(f"the official Python client's virtualenv is missing ({rmq5}): run test.sh once")
    rates: dict[str, list[float]] = {"official_python_client": [], "own_send": [], "own_callers_v2": []}
    # CPU a message costs each process: on a machine with few cores the two compete.
    cpu_us: dict[str, dict[str, list[float]]] = {way: {"sender": [], "writer": []} for way in rates}
    with tempfile.TemporaryDirectory(prefix="rocketmq5-bench-") as work_text:
        work = Path(work_text)
        client_env = {k: v for k, v in quiet_env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        client_env["HOME"] = str(work)  # the client's log goes under ~/logs
        with Nodes(work / "logs") as nodes:
            for round_number in range(args.rounds):
                for way, values in rates.items():
                    writer = nodes.start("writer", work / f"store-{way}-{round_number}")
                    create_topic(writer.endpoint, "Bench")  # RocketMQ 5 routes create none
                    if way == "official_python_client":
                        command = [str(rmq5), str(REPO / "tests" / "rocketmq5" / "python_producer.py"), "bench",
                                   writer.endpoint, "Bench", str(args.messages), str(args.concurrency)]  # fmt: skip
                        result = run_sender(command, client_env, writer.proc.pid)
                    else:
                        protocol = "v2" if way == "own_callers_v2" else "v1"
                        command = [sys.executable, __file__, "--own-send", protocol, writer.endpoint, "Bench",
                                   "--messages", str(args.messages), "--concurrency", str(args.concurrency)]  # fmt: skip
                        result = run_sender(command, quiet_env(), writer.proc.pid)
                    writer.stop()
                    values.append(result["messages"] / result["seconds"])
                    for side in ("sender", "writer"):
                        cpu_us[way][side].append(result[f"{side}_cpu_s"] / result["messages"] * 1e6)
    medians = {way: statistics.median(values) for way, values in rates.items()}
    figure = ratio(medians["official_python_client"], medians["own_send"])
    report = {
        "messages": args.messages,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "msgs_per_s": {way: [round(v, 1) for v in values] for way, values in rates.items()},
        "median_msgs_per_s": {way: round(v, 1) for way, v in medians.items()},
        "client_to_own_send": figure,
        "own_callers_v2_to_own_send": ratio(medians["own_callers_v2"], medians["own_send"]),
        # Each round's own pair: how far the machine's load moved the figure between rounds.
        "client_to_own_send_by_round": [
            ratio(client, own) for client, own in zip(rates["official_python_client"], rates["own_send"])
        ],
        "median_cpu_us_per_message": {
            way: {side: round(statistics.median(v), 1) for side, v in sides.items()} for way, sides in cpu_us.items()
        },
        "target": TARGET,
        "met": figure is not None and figure >= TARGET,
    }
    print(json.dumps(report), flush=True)
    if args.out:
        text = markdown(report, " ".join(["python", "benchmarks/rocketmq5_bench.py", *sys.argv[1:]]))
        args.out.write_text(text + kept_analysis(args.out))


ANALYSIS_HEADING = "\n## What bounds the figure"


def kept_analysis(out: Path) -> str:
    """The hand-written analysis at the end of an earlier report (from its heading on),
    kept when the figures above it are measured again."""
    if not out.exists():
        return ""
    earlier = out.read_text(encoding="utf-8")
    start = earlier.find(ANALYSIS_HEADING)
    return earlier[start:] if start >= 0 else ""


def markdown(report: dict[str, Any], command: str) -> str:
    facts = machine_facts(REPO)
    rows = "\n".join(
        f"| {way} | {' / '.join(f'{v:,.0f}' for v in values)} | {report['median_msgs_per_s'][way]:,.0f} |"
        for way, values in report["msgs_per_s"].items()
    )
    verdict = "met" if report["met"] else "missed"
    cpu_rows = "\n".join(
        f"| {way} | {sides['sender']:,.0f} | {sides['writer']:,.0f} |" for way, sides in report["median_cpu_us_per_message"].items()
    )
    return f"""# RocketMQ 5 producers: the official Python client against rmqstore's own Send

`{command}`

{report['messages']:,} messages a round, {report['concurrency']} in flight, {report['rounds']} rounds alternating,
each way against a fresh `rmqstore writer serve` (ASYNC flush) on 127.0.0.1; {facts['date_utc']}, commit
{facts['git_commit']}, {facts['cores']} cores ({facts['cpu']}), load average at the end {load_average()}.

| sender | msgs/s by round | median |
|---|---|---|
{rows}

Official client ÷ own `Send`: **{report['client_to_own_send']}** (target ≥ {report['target']}: {verdict}).
By round: {' / '.join(str(r) for r in report['client_to_own_send_by_round'])}.
Our own callers sending v2 `SendMessage` as the official client does (its messages and its
eight headers) ÷ own `Send`: {report['own_callers_v2_to_own_send']}.

CPU a message costs each process (median µs; user + system):

| sender | in the sender | in the writer |
|---|---|---|
{cpu_rows}
"""


if __name__ == "__main__":
    main()
