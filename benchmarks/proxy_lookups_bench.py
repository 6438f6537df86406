"""Lookups through a proxy against the same lookups asked of the query node directly, in
one run: GROUPS writer groups (a writer and a query node each) with MESSAGES messages
each, one ``rmqstore proxy serve`` in front; then, alternating direct and through the
proxy call by call (the machine's load falls on both alike), LOOKUPS one-match key
lookups, message-id lookups, and first pages of PAGE messages of a key every message
holds. Reported: each kind's latency p50/p99 both ways and their ratio.

    python benchmarks/proxy_lookups_bench.py [--groups 3] [--messages 2000] [--lookups 500]
        [--page 100]"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import Nodes, latency_summary, load_average, quiet_env  # noqa: E402

TOPIC = "BenchLookups"
TIMEOUT_S = 30.0


def start_proxy(work: Path, cluster: str) -> tuple[subprocess.Popen[bytes], str]:
    path = work / "cluster.yaml"
    path.write_text(cluster)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmqstore.cli.main", "proxy", "serve", "--cluster", str(path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(work / "proxy.stderr", "wb"), env=quiet_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the proxy did not start: {(work / 'proxy.stderr').read_text()[-3000:]}")
    return proc, f"127.0.0.1:{json.loads(line)['port']}"


def main() -> None:
    import grpc

    from rmqstore.v1 import messages_pb2, query_pb2, query_pb2_grpc, writer_pb2, writer_pb2_grpc

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--messages", type=int, default=2000, help="per group")
    parser.add_argument("--lookups", type=int, default=500, help="of each kind, each way")
    parser.add_argument("--page", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="proxy-lookups-") as temp, Nodes(Path(temp) / "logs") as nodes:
        work = Path(temp)
        lines, sent = ["groups:"], {}
        queries = {}
        for index in range(args.groups):
            name = f"broker-{index}"
            store = work / name
            writer = nodes.start("writer", store, "--broker-name", name, "--store-host", f"127.0.0.{index + 1}:10911")
            query = nodes.start("query", store, "--broker-name", name)
            lines += [f"  - name: {name}", f'    writers: ["{writer.endpoint}"]', f'    queries: ["{query.endpoint}"]']
            with grpc.insecure_channel(writer.endpoint) as channel:
                stub = writer_pb2_grpc.WriterServiceStub(channel)
                stub.CreateTopic(writer_pb2.CreateTopicRequest(name=TOPIC, queue_count=4), timeout=TIMEOUT_S)
                batch = [
                    messages_pb2.Message(topic=TOPIC, body=b"x" * 100, keys=["all", f"{name}-{i}"])
                    for i in range(args.messages)
                ]
                answer = stub.SendBatch(writer_pb2.SendBatchRequest(messages=batch), timeout=TIMEOUT_S)
                sent[name] = list(answer.results)
            queries[name] = grpc.insecure_channel(query.endpoint)
        proxy, proxy_endpoint = start_proxy(work, "\n".join(lines) + "\n")
        try:
            through = query_pb2_grpc.QueryServiceStub(grpc.insecure_channel(proxy_endpoint))
            direct = {name: query_pb2_grpc.QueryServiceStub(channel) for name, channel in queries.items()}
            for name, stub in direct.items():  # the nodes caught up, every channel warm
                while len(stub.QueryByKey(query_pb2.QueryByKeyRequest(topic=TOPIC, key="all", page_size=args.messages), timeout=TIMEOUT_S).messages) < args.messages:
                    time.sleep(0.1)
                through.QueryByMsgId(query_pb2.QueryByMsgIdRequest(msg_id=sent[name][0].offset_msg_id), timeout=TIMEOUT_S)
            rng = random.Random(7)
            samples: dict[str, dict[str, list[int]]] = {}
            load_before = load_average()
            for _ in range(args.lookups):
                name = rng.choice(sorted(sent))
                index = rng.randrange(args.messages)
                kinds = {
                    "key (one match)": ("QueryByKey", query_pb2.QueryByKeyRequest(topic=TOPIC, key=f"{name}-{index}", page_size=32)),
                    "message id": ("QueryByMsgId", query_pb2.QueryByMsgIdRequest(msg_id=sent[name][index].offset_msg_id)),
                    f"key, first page of {args.page}": (
                        "QueryByKey", query_pb2.QueryByKeyRequest(topic=TOPIC, key="all", page_size=args.page),
                    ),
                }  # fmt: skip
                for kind, (method, request) in kinds.items():
                    for way, stub in (("direct", direct[name]), ("proxy", through)):
                        started = time.perf_counter_ns()
                        getattr(stub, method)(request, timeout=TIMEOUT_S)
                        samples.setdefault(kind, {}).setdefault(way, []).append(time.perf_counter_ns() - started)
            result: dict[str, Any] = {"groups": args.groups, "messages_per_group": args.messages, "lookups": args.lookups,
                                      "load_before": load_before, "load_after": load_average(), "kinds": {}}  # fmt: skip
            for kind, ways in samples.items():
                summary = {way: latency_summary(values) for way, values in ways.items()}
                summary["p50_ratio"] = round(summary["proxy"]["p50_us"] / summary["direct"]["p50_us"], 2)
                result["kinds"][kind] = summary
            print(json.dumps(result, indent=1))
        finally:
            proxy.terminate()
            proxy.wait(timeout=60)
            for channel in queries.values():
                channel.close()


if __name__ == "__main__":
    main()
