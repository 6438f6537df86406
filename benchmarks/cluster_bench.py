"""Cluster mode's price per message: our own unary v2 callers (the official client's
calls without its cost: rocketmq5_bench.py's ``own_callers_v2``) sending one message per
SendMessage, CONCURRENCY callers waiting each for its answer, once directly to a writer's
own gateway (local mode) and once through one ``rmqstore proxy serve`` in front of the
same kind of writer (cluster mode), alternating, ROUNDS times, a fresh writer each run.
Reported: the writer's CPU per client message each way (target through the proxy: at most
50 µs), the proxy's CPU per message, the rate, and each call's latency p50/p99.

With ``--consume N``, the same run also consumes: N messages stored first (v1 SendBatch,
not measured), then CONSUME_CONCURRENCY of our own unary v2 consumers of one group
receive batches of CONSUME_BATCH and acknowledge each message with its own AckMessage (as
the official clients do), once directly from the writer's gateway and once through one
proxy, alternating likewise: the writer's and the proxy's CPU per consumed message
(target for the writer through the proxy: at most 50 µs), the rate, each ack's latency.

With ``--batch-sizes`` (on by default), the writer's CPU a SendStream batch of each size,
beside a bare grpc stream's (the floor under it); ``--rounds 0`` measures only that.

    python benchmarks/cluster_bench.py [--messages N] [--concurrency C] [--rounds R]
        [--linger-ms MS] [--consume N [--consume-batch B] [--consume-concurrency C]]
        [--batch-sizes N ...] [--out benchmarks/CLUSTER.md]"""

from __future__ import annotations

import argparse
import json
import re
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

from bench_common import (  # noqa: E402
    Nodes,
    closed_loop,
    in_threads,
    latency_summary,
    load_average,
    machine_facts,
    quiet_env,
)
from rocketmq5_bench import _v2_sender, create_topic, process_cpu_s, v2_send_call  # noqa: E402

TARGET_WRITER_US = 50.0
TIMEOUT_S = 1800.0
ANALYSIS = "## What bounds the figure"
SERVING_TIMEOUT_S = 60.0


def own_callers(endpoint: str, topic: str, count: int, concurrency: int) -> dict[str, Any]:
    """``count`` one-message v2 sends from ``concurrency`` threads; each call's latency."""
    import grpc

    channel = grpc.insecure_channel(endpoint)
    send = _v2_sender(channel, topic)
    send(-1)  # the route and the channel warmed
    try:
        seconds, latencies_ns = closed_loop(send, count, concurrency, "sends")
    finally:
        channel.close()
    return {"messages": count, "seconds": seconds, "latency": latency_summary(latencies_ns)}


# Calls one paced caller has in flight at most: well below a node's streams a connection
# (service.limits' 128), past which a loaded node refused some with REFUSED_STREAM; as
# many as the closed loop's callers. A send due while these wait starts late, and its
# latency (from when it was due) says so.
PACED_IN_FLIGHT_MAX = 64


def paced_callers(endpoint: str, topic: str, count: int, rate: float) -> dict[str, Any]:
    """``count`` one-message v2 sends started at ``rate`` a second whatever the answers
    (an open loop, on one asyncio channel); each call's latency from the moment it was due,
    so a caller that falls behind shows in the figures rather than lowering the rate."""
    import asyncio

    import grpc

    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2_grpc

    async def sending() -> dict[str, Any]:
        channel = grpc.aio.insecure_channel(endpoint)
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
        call = v2_send_call(topic)
        latencies_ns: list[int] = []
        failures: list[str] = []

        in_flight = asyncio.Semaphore(PACED_IN_FLIGHT_MAX)

        async def one(n: int, due_ns: int) -> None:
            request, metadata = call(n)
            try:
                async with in_flight:
                    response = await stub.SendMessage(request, timeout=30, metadata=metadata)
            except grpc.aio.AioRpcError as error:
                failures.append(repr(error))
                return
            if response.status.code != v2.OK:
                failures.append(f"SendMessage answered {response.status.code}: {response.status.message}")
                return
            latencies_ns.append(time.perf_counter_ns() - due_ns)

        await one(-1, time.perf_counter_ns())  # the route and the channel warmed
        latencies_ns.clear()
        tasks = []
        started_ns = time.perf_counter_ns()
        for n in range(count):
            due_ns = started_ns + int(n * 1e9 / rate)
            ahead_s = (due_ns - time.perf_counter_ns()) / 1e9
            if ahead_s > 0:
                await asyncio.sleep(ahead_s)
            tasks.append(asyncio.get_running_loop().create_task(one(n, due_ns)))
        await asyncio.gather(*tasks)
        seconds = (time.perf_counter_ns() - started_ns) / 1e9
        await channel.close()
        if failures:
            raise RuntimeError(f"{len(failures)} sends failed, first: {failures[0]}")
        return {"messages": count, "seconds": seconds, "offered_rate": rate, "latency": latency_summary(latencies_ns)}

    return asyncio.run(sending())


def batch_request(size: int, start: int) -> Any:
    """A SendBatchRequest as a proxy's coalesced batch of ``size`` client messages (the
    columns :mod:`rmqstore.proxy.coalesce` fills from _v2_sender's messages)."""
    from rmqstore.v1 import writer_pb2

    numbers = range(start, start + size)
    columns = writer_pb2.MessageColumns(
        bodies=[b"message %d to Bench" % n for n in numbers], topics=["Bench"], queue_ids=[n % 8 for n in numbers],
        keys=[f"order-{n} customer-{n % 100}" for n in numbers], tags=[f"Tag{n % 3}" for n in numbers],
        uniq_keys=[f"{n:032X}" for n in numbers], born_timestamps_ms=[int(time.time() * 1000)] * size,
        born_hosts=["127.0.0.1:50000"] * size, property_counts=[2] * size,
        property_names=["seq", "origin"] * size, property_values=[v for n in numbers for v in (str(n), "python-client")],
    )  # fmt: skip
    return writer_pb2.SendBatchRequest(columns=columns, compact_results=True)


def serve_floor() -> None:
    """A bare SendStream server for the floor under the writer's cost a batch: grpc's
    asyncio server with no interceptor, on an event loop of its own thread as a node's,
    answering every request with the same compact response, storing nothing. Prints its
    port, serves until killed."""
    import asyncio

    import grpc

    from rmqstore.v1 import writer_pb2, writer_pb2_grpc

    class Floor(writer_pb2_grpc.WriterServiceServicer):
        async def SendStream(self, request_iterator: Any, context: Any) -> None:
            response = writer_pb2.SendBatchResponse()
            response.compact.SetInParent()
            async for _ in request_iterator:
                await context.write(response)

    async def serve(started: threading.Event, port: list[int]) -> None:
        server = grpc.aio.server()
        writer_pb2_grpc.add_WriterServiceServicer_to_server(Floor(), server)
        port.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        started.set()
        await server.wait_for_termination()

    started, port = threading.Event(), []
    threading.Thread(target=asyncio.run, args=(serve(started, port),), daemon=True).start()
    started.wait()
    print(json.dumps({"port": port[0]}), flush=True)
    threading.Event().wait()


def batch_costs(nodes: Nodes, work: Path, sizes: list[int], messages: int) -> dict[str, Any]:
    """The writer's CPU a batch of each size on one SendStream, one batch in flight (as a
    proxy sends them), about ``messages`` messages of each size; fitted as a cost a batch
    plus a cost a message (least squares over the sizes), less the writer's idle
    background. Then the same batches to :func:`serve_floor`'s bare server: what grpc's
    stream alone costs a batch."""
    import asyncio

    import grpc

    from rmqstore.v1 import writer_pb2_grpc

    async def stream(endpoint: str, requests: list[Any]) -> None:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            call = writer_pb2_grpc.WriterServiceStub(channel).SendStream()  # type: ignore[no-untyped-call]  # generated
            for request in requests:
                await call.write(request)
                await call.read()
            await call.done_writing()

    writer = nodes.start("writer", work / "store-batch-costs", "--broker-name", "broker-a")
    try:
        create_topic(writer.endpoint, "Bench")
        asyncio.run(stream(writer.endpoint, [batch_request(1, n) for n in range(50)]))  # warmed
        idle_before = process_cpu_s(writer.proc.pid)
        time.sleep(IDLE_S)
        idle_per_s = (process_cpu_s(writer.proc.pid) - idle_before) / IDLE_S
        per_size = {}
        for size in sizes:
            count = max(messages // size, 20)
            requests = [batch_request(size, 1_000_000 * size + k * size) for k in range(count)]
            before, started = process_cpu_s(writer.proc.pid), time.perf_counter()
            asyncio.run(stream(writer.endpoint, requests))
            cpu_s = process_cpu_s(writer.proc.pid) - before - idle_per_s * (time.perf_counter() - started)
            per_size[size] = {"batches": count, "writer_us_per_batch": round(cpu_s / count * 1e6, 1),
                              "writer_us_per_message": round(cpu_s / (count * size) * 1e6, 1)}  # fmt: skip
    finally:
        writer.stop()
    floor = subprocess.Popen([sys.executable, __file__, "--floor-server"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=quiet_env())
    try:
        assert floor.stdout is not None
        endpoint = f"127.0.0.1:{json.loads(floor.stdout.readline())['port']}"
        asyncio.run(stream(endpoint, [batch_request(1, n) for n in range(50)]))  # warmed
        for size in sizes:
            count = per_size[size]["batches"]
            requests = [batch_request(size, k * size) for k in range(count)]
            before = process_cpu_s(floor.pid)
            asyncio.run(stream(endpoint, requests))
            per_size[size]["floor_us_per_batch"] = round((process_cpu_s(floor.pid) - before) / count * 1e6, 1)
    finally:
        floor.kill()
        floor.wait()
    xs = sizes
    ys = [per_size[size]["writer_us_per_batch"] for size in sizes]
    slope, intercept = statistics.linear_regression(xs, ys) if len(xs) > 1 else (0.0, ys[0])
    return {"sizes": per_size, "us_per_batch": round(intercept, 1), "us_per_message": round(slope, 1),
            "idle_cpu_ms_per_s": round(idle_per_s * 1000, 1)}  # fmt: skip


CONSUME_GROUP = "BenchGroup"
PRELOAD_BATCH = 500


def preload(endpoint: str, topic: str, count: int) -> None:
    """``count`` small messages in ``topic``, by the writer's batch path."""
    import grpc

    from rmqstore.v1 import messages_pb2, writer_pb2, writer_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
        for start in range(0, count, PRELOAD_BATCH):
            messages = [messages_pb2.Message(topic=topic, body=b"m%d" % n) for n in range(start, min(start + PRELOAD_BATCH, count))]
            stub.SendBatch(writer_pb2.SendBatchRequest(messages=messages), timeout=60)


def receive_request(group: str, topic: str, batch: int) -> Any:
    """A v2 ReceiveMessageRequest of ``group`` for up to ``batch`` messages of queue 0 of
    ``topic``, every tag, invisible for 60 s, long-polling 1 s."""
    from google.protobuf import duration_pb2

    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s

    return v2s.ReceiveMessageRequest(
        group=v2.Resource(name=group), message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=batch,
        invisible_duration=duration_pb2.Duration(seconds=60), long_polling_timeout=duration_pb2.Duration(seconds=1),
    )  # fmt: skip


def own_consumers(endpoint: str, topic: str, count: int, concurrency: int, batch: int) -> dict[str, Any]:
    """``concurrency`` threads of one group receiving batches of ``batch`` and acknowledging
    each message with its own AckMessage until ``count`` messages are acknowledged; each
    acknowledgement's latency."""
    import grpc

    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s
    from rmqstore.rocketmq_v2 import service_pb2_grpc

    request = receive_request(CONSUME_GROUP, topic, batch)
    group, resource = request.group, request.message_queue.topic
    channel = grpc.insecure_channel(endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
    lock = threading.Lock()
    acked: set[str] = set()
    latencies_ns: list[int] = []
    failures: list[str] = []

    def consumer() -> None:
        mine: list[int] = []
        while not failures:
            with lock:
                if len(acked) >= count:
                    break
            messages = [a.message for a in stub.ReceiveMessage(request, timeout=30) if a.HasField("message")]
            for message in messages:
                system = message.system_properties
                entry = v2s.AckMessageEntry(message_id=system.message_id, receipt_handle=system.receipt_handle)
                started = time.perf_counter_ns()
                answer = stub.AckMessage(v2s.AckMessageRequest(group=group, topic=resource, entries=[entry]), timeout=30)
                mine.append(time.perf_counter_ns() - started)
                if answer.status.code != v2.OK:
                    failures.append(f"AckMessage answered {answer.status.code}: {answer.status.message}")
                    break
                with lock:
                    acked.add(system.message_id)
        with lock:
            latencies_ns.extend(mine)

    seconds = in_threads(consumer, concurrency)
    channel.close()
    if failures:
        raise RuntimeError(f"{len(failures)} acknowledgements failed, first: {failures[0]}")
    return {"messages": len(acked), "seconds": seconds, "latency": latency_summary(latencies_ns)}


class Proxy:
    """``rmqstore proxy serve`` in front of one writer."""

    def __init__(self, work: Path, writer_endpoint: str, linger_ms: float):
        cluster = work / f"cluster-{time.monotonic_ns()}.yaml"
        cluster.write_text(f'groups:\n  - name: broker-a\n    writers: ["{writer_endpoint}"]\n')
        self._stderr = open(work / f"proxy-{time.monotonic_ns()}.stderr", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rmqstore.cli.main", "proxy", "serve", "--cluster", str(cluster), "--linger-ms", str(linger_ms)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr, env=quiet_env(),
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the proxy did not start: {Path(self._stderr.name).read_text()[-3000:]}")
        self.endpoint = f"127.0.0.1:{json.loads(line)['port']}"

    def stop(self) -> dict[str, float]:
        """Stop it; the average batch it formed, from its log at stop: messages a send
        batch, acknowledgements an AckMessage (where it formed any)."""
        self.proc.terminate()
        self.proc.wait(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
        log = Path(self._stderr.name).read_text(encoding="utf-8", errors="replace")
        batches: dict[str, float] = {}
        for name, pattern in (("send_batch_avg", r"(\d+) messages sent in (\d+) batches"), ("ack_batch_avg", r"(\d+) acknowledgements in (\d+) calls"),
                               ("receive_batch_avg", r"(\d+) messages received in (\d+) writer receives")):
            found = re.search(pattern, log)
            if found and int(found.group(2)):
                batches[name] = round(int(found.group(1)) / int(found.group(2)), 2)
        return batches


IDLE_S = 2.0


def run(command: list[str], watched: dict[str, int]) -> dict[str, Any]:
    """The callers' run, with each watched process's CPU per message; and the writer's CPU
    a second idle just before (its background tasks), which the per-message figure holds."""
    idle_before = process_cpu_s(watched["writer"])
    time.sleep(IDLE_S)
    writer_idle_ms_per_s = (process_cpu_s(watched["writer"]) - idle_before) / IDLE_S * 1000
    before = {name: process_cpu_s(pid) for name, pid in watched.items()}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=quiet_env(), check=False)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the callers failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall_s
    for name, pid in watched.items():
        result[f"{name}_cpu_us_per_message"] = (process_cpu_s(pid) - before[name]) / result["messages"] * 1e6
    result["writer_idle_cpu_ms_per_s"] = writer_idle_ms_per_s
    # Less what the writer's background would have spent meanwhile: the cost the messages add.
    result["writer_net_cpu_us_per_message"] = result["writer_cpu_us_per_message"] - writer_idle_ms_per_s * wall_s / result["messages"] * 1000
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="0: only --batch-sizes' costs, printed as JSON")
    parser.add_argument("--linger-ms", type=float, default=2.0)
    parser.add_argument("--rates", type=float, nargs="*", default=[], metavar="R",
                        help="also send --messages at each of these rates a second (an open loop), each way")
    parser.add_argument("--consume", type=int, default=0, metavar="N", help="also consume N messages each way (0: not)")
    parser.add_argument("--consume-batch", type=int, default=16)
    parser.add_argument("--consume-concurrency", type=int, default=4)
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 8, 32, 128], metavar="N",
                        help="the writer's CPU a SendStream batch of each size (the cost a batch and a message)")
    parser.add_argument("--out", type=Path, help="write the results as markdown here")
    parser.add_argument("--callers", nargs=2, metavar=("ENDPOINT", "TOPIC"), help=argparse.SUPPRESS)
    parser.add_argument("--paced", nargs=3, metavar=("ENDPOINT", "TOPIC", "RATE"), help=argparse.SUPPRESS)
    parser.add_argument("--consumers", nargs=2, metavar=("ENDPOINT", "TOPIC"), help=argparse.SUPPRESS)
    parser.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        serve_floor()
        return
    if args.callers:
        print(json.dumps(own_callers(*args.callers, args.messages, args.concurrency)), flush=True)
        return
    if args.paced:
        endpoint, topic, rate = args.paced
        print(json.dumps(paced_callers(endpoint, topic, args.messages, float(rate))), flush=True)
        return
    if args.consumers:
        print(json.dumps(own_consumers(*args.consumers, args.consume, args.consume_concurrency, args.consume_batch)), flush=True)
        return
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "proxy": []}
    for rate in args.rates:
        runs.update({f"direct {rate:g}/s": [], f"proxy {rate:g}/s": []})
    if args.consume:
        runs.update({"consume direct": [], "consume proxy": []})
    load_before = load_average()
    if args.rounds == 0:  # the batch costs alone (their figures as JSON)
        with tempfile.TemporaryDirectory(prefix="cluster-bench-") as work_text, Nodes(Path(work_text) / "logs") as nodes:
            costs = batch_costs(nodes, Path(work_text), args.batch_sizes, args.messages)
        print(json.dumps({"batch_costs": costs, "load_average_before": load_before, "load_average_after": load_average(),
                          "machine": machine_facts(REPO)}, indent=2))  # fmt: skip
        return
    with tempfile.TemporaryDirectory(prefix="cluster-bench-") as work_text:
        work = Path(work_text)
        with Nodes(work / "logs") as nodes:
            for round_number in range(args.rounds):
                for way, results in runs.items():
                    store = work / f"store-{way.replace(' ', '-').replace('/', '')}-{round_number}"
                    writer = nodes.start("writer", store, "--broker-name", "broker-a")
                    create_topic(writer.endpoint, "Bench")
                    watched = {"writer": writer.proc.pid}
                    proxy = None
                    endpoint = writer.endpoint
                    if through_proxy(way):
                        proxy = Proxy(work, writer.endpoint, args.linger_ms)
                        watched["proxy"] = proxy.proc.pid
                        endpoint = proxy.endpoint
                    if way.startswith("consume"):
                        preload(writer.endpoint, "Bench", args.consume)
                        command = [sys.executable, __file__, "--consumers", endpoint, "Bench", "--consume", str(args.consume),
                                   "--consume-batch", str(args.consume_batch), "--consume-concurrency", str(args.consume_concurrency)]  # fmt: skip
                    elif way.endswith("/s"):
                        rate = way.split()[-1].removesuffix("/s")
                        command = [sys.executable, __file__, "--paced", endpoint, "Bench", rate, "--messages", str(args.messages)]
                    else:
                        command = [sys.executable, __file__, "--callers", endpoint, "Bench",
                                   "--messages", str(args.messages), "--concurrency", str(args.concurrency)]  # fmt: skip
                    try:
                        result = run(command, watched)
                    finally:
                        batches = proxy.stop() if proxy is not None else {}
                        writer.stop()
                    results.append({**result, **batches})
            costs = batch_costs(nodes, work, args.batch_sizes, args.messages) if args.batch_sizes else None
    report = summary(runs, args, load_before)
    if costs is not None:
        report["batch_costs"] = costs
    print(json.dumps(report, indent=2))
    if args.out:
        kept = ""
        if args.out.exists():  # the hand-written analysis below the figures stays
            _, marker, tail = args.out.read_text(encoding="utf-8").partition(ANALYSIS)
            kept = marker + tail
        text = markdown(report, " ".join(["python", "benchmarks/cluster_bench.py", *sys.argv[1:]]))
        args.out.write_text(text + ("\n" + kept if kept else ""), encoding="utf-8")


def through_proxy(way: str) -> bool:
    return "proxy" in way.split()


def summary(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, load_before: list[float]) -> dict[str, Any]:
    def median(way: str, pick: Any) -> float:
        return round(statistics.median(pick(r) for r in runs[way]), 1)

    per_way = {
        way: {
            "msgs_per_s": median(way, lambda r: r["messages"] / r["seconds"]),
            "writer_cpu_us_per_message": median(way, lambda r: r["writer_cpu_us_per_message"]),
            "writer_net_cpu_us_per_message": median(way, lambda r: r["writer_net_cpu_us_per_message"]),
            "latency_p50_ms": median(way, lambda r: r["latency"]["p50_us"] / 1000),
            "latency_p99_ms": median(way, lambda r: r["latency"]["p99_us"] / 1000),
            "writer_idle_cpu_ms_per_s": median(way, lambda r: r["writer_idle_cpu_ms_per_s"]),
        }
        for way in runs
    }
    for way in runs:
        if through_proxy(way):
            per_way[way]["proxy_cpu_us_per_message"] = median(way, lambda r: r["proxy_cpu_us_per_message"])
            batch = "ack_batch_avg" if way.startswith("consume") else "send_batch_avg"
            if all(batch in r for r in runs[way]):
                per_way[way]["batch_avg"] = median(way, lambda r, batch=batch: r[batch])
            if way.startswith("consume") and all("receive_batch_avg" in r for r in runs[way]):
                per_way[way]["receive_batch_avg"] = median(way, lambda r: r["receive_batch_avg"])
    writer_proxy = per_way["proxy"]["writer_cpu_us_per_message"]
    consumed: dict[str, Any] = {}
    if "consume proxy" in per_way:
        consume_proxy = per_way["consume proxy"]["writer_cpu_us_per_message"]
        consumed = {
            "consume": args.consume, "consume_batch": args.consume_batch, "consume_concurrency": args.consume_concurrency,
            "consume_writer_cpu_direct_to_proxy": (
                round(per_way["consume direct"]["writer_cpu_us_per_message"] / consume_proxy, 2) if consume_proxy else None
            ),
            "consume_met": consume_proxy <= TARGET_WRITER_US,
        }
    return {
        **consumed,
        "messages": args.messages, "concurrency": args.concurrency, "rounds": args.rounds, "linger_ms": args.linger_ms,
        "load_average_before": load_before, "load_average_after": load_average(),
        "medians": per_way, "runs": runs,
        "writer_cpu_direct_to_proxy": round(per_way["direct"]["writer_cpu_us_per_message"] / writer_proxy, 2) if writer_proxy else None,
        "target_writer_cpu_us": TARGET_WRITER_US, "met": writer_proxy <= TARGET_WRITER_US,
        "machine": machine_facts(REPO),
    }  # fmt: skip


def markdown(report: dict[str, Any], command: str) -> str:
    medians = report["medians"]

    def receives(m: dict[str, Any]) -> str:
        return f"{m.get('receive_batch_avg', '–')} | " if m is medians.get("consume direct") or m is medians.get("consume proxy") else ""

    def rows(ways: list[str]) -> str:
        return "\n".join(
            f"| {way} | {m['msgs_per_s']} | {m['writer_cpu_us_per_message']} | {m['writer_net_cpu_us_per_message']} | {m.get('proxy_cpu_us_per_message', '–')} | "
            f"{m.get('batch_avg', '–')} | {receives(m)}{m['latency_p50_ms']} | {m['latency_p99_ms']} | {m['writer_idle_cpu_ms_per_s']} |"
            for way, m in medians.items() if way in ways
        )

    paced = ""
    rated = [way for way in medians if way.endswith("/s")]
    if rated:
        paced = f"""
At a set rate (an open loop: sends started at the rate whatever the answers, latency from
each send's due moment; `--rates`), same rounds, medians:

| way | msgs/s | writer CPU µs/msg | writer CPU less idle µs/msg | proxy CPU µs/msg | messages per writer batch | latency p50 ms | latency p99 ms | writer idle CPU ms/s |
|---|---|---|---|---|---|---|---|---|
{rows(rated)}
"""
    costs = ""
    if "batch_costs" in report:
        c = report["batch_costs"]
        lines = "\n".join(
            f"| {size} | {v['batches']} | {v['writer_us_per_batch']} | {v['writer_us_per_message']} | {v['floor_us_per_batch']} |"
            for size, v in c["sizes"].items()
        )
        costs = f"""
## The writer's cost a batch and a message

Batches as a proxy sends them (columns, compact results, one in flight) on one SendStream
to a fresh writer, the writer's CPU less its idle background ({c['idle_cpu_ms_per_s']} ms a second), same run;
then the same batches to a bare grpc asyncio server that stores nothing (no interceptor, one
fixed answer): what the stream alone costs a batch:

| messages a batch | batches | writer CPU µs a batch | writer CPU µs a message | bare grpc stream CPU µs a batch |
|---|---|---|---|---|
{lines}

Fitted (least squares): **{c['us_per_batch']} µs a batch + {c['us_per_message']} µs a message**.
"""
    consumed = ""
    if "consume" in report:
        consumed = f"""
## Receive and acknowledge

{report['consume']} messages stored first (not measured), then consumed by
{report['consume_concurrency']} of our own unary v2 consumers of one group, each receiving
batches of {report['consume_batch']} and acknowledging each message with its own
AckMessage (as the official clients do), direct from the writer's gateway and through one
proxy (which coalesces the acknowledgements into multi-entry AckMessage calls); same
rounds, medians. Latency: each acknowledgement's.

| way | msgs/s | writer CPU µs/msg | writer CPU less idle µs/msg | proxy CPU µs/msg | acks per AckMessage to the writer | messages per writer receive | ack p50 ms | ack p99 ms | writer idle CPU ms/s |
|---|---|---|---|---|---|---|---|---|---|
{rows(["consume direct", "consume proxy"])}

Writer CPU per consumed message, direct / through the proxy: **{report['consume_writer_cpu_direct_to_proxy']}x**.
Target (writer ≤ {report['target_writer_cpu_us']:g} µs a consumed message through the proxy): **{'met' if report['consume_met'] else 'not met'}**.
"""
    return f"""# Cluster mode: the writer's cost per client message, local mode vs through a proxy

`{command}` — {report['messages']} one-message v2 SendMessage calls a run from
{report['concurrency']} of our own unary callers (the official client's calls without its
cost), direct to a writer's gateway and through one proxy (`--linger-ms {report['linger_ms']}`),
alternating, {report['rounds']} rounds, a fresh writer (ASYNC flush) each run; medians of the rounds.
Load average before/after: {report['load_average_before']} / {report['load_average_after']}
(a shared 2-core machine: the ratios matter, not the absolute figures).

| way | msgs/s | writer CPU µs/msg | writer CPU less idle µs/msg | proxy CPU µs/msg | messages per writer batch | latency p50 ms | latency p99 ms | writer idle CPU ms/s |
|---|---|---|---|---|---|---|---|---|
{rows(["direct", "proxy"])}
{paced}

Writer CPU per message, direct / through the proxy: **{report['writer_cpu_direct_to_proxy']}x**.
Target (writer ≤ {report['target_writer_cpu_us']:g} µs a client message through the proxy): **{'met' if report['met'] else 'not met'}**.

The callers, the writer and the proxy share the machine's two cores, so the rate is what
all three leave each other, not a proxy's ceiling; the writer's CPU per message is the
figure that says how many proxies' worth of messages one writer group can take.
{costs}{consumed}"""


if __name__ == "__main__":
    main()
