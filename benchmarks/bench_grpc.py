"""rmqstore through gRPC: real ``writer serve`` / ``query serve`` processes on 127.0.0.1,
loaded and queried by clients in other processes (or, for lookups, by this one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import native_client
from bench_common import Node, Nodes, quiet_env, run_client
from workload import KEY_PAGE_SIZE, QUEUES_PER_TOPIC, TOPICS, WorkloadSpec

from rmqstore.v1 import (
    messages_pb2,
    query_pb2,
    query_pb2_grpc,
    writer_pb2,
    writer_pb2_grpc,
)

RPC_TIMEOUT_S = 30.0
CLIENTS = Path(__file__).parent / "grpc_clients.py"


def _client_args(role: str, endpoint: str, spec: WorkloadSpec, *extra: str) -> list[str]:
    return [str(CLIENTS), role, "--endpoint", endpoint, "--messages", str(spec.messages),
            "--body-bytes", str(spec.body_bytes), "--seed", str(spec.seed), *extra]  # fmt: skip


def create_topics(endpoint: str) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        for topic in TOPICS:
            stub.CreateTopic(writer_pb2.CreateTopicRequest(name=topic, queue_count=QUEUES_PER_TOPIC), timeout=RPC_TIMEOUT_S)


def grpc_append_run(store: Path, spec: WorkloadSpec, log_dir: Path, batch: int) -> dict[str, Any]:
    """A fresh writer serving; the stream client (another process) sends the workload
    in batches over SendStream; figures from the client's clock (first send → last ack)."""
    shutil.rmtree(store, ignore_errors=True)
    with Nodes(log_dir) as nodes:
        writer = nodes.start("writer", store)
        create_topics(writer.endpoint)
        result = run_client(_client_args("stream", writer.endpoint, spec, "--batch", str(batch)), timeout_s=3600)
        writer.stop()
    if result["error"] or result["acked"] != spec.messages:
        raise RuntimeError(f"the gRPC stream did not ack every message: {result}")
    return result


SEND_FILE_ACKS = ("all", "summary", "none")


def write_send_file(workload: Any, path: Path) -> None:
    """The workload as `rmqstore send --file` reads it, one JSON object a line. The bodies
    are text (a user's JSON carries text): the base64 of the workload's bytes, cut to the
    body size, so every message keeps its size."""
    import base64

    size = workload.spec.body_bytes
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(
            json.dumps({"topic": workload.topic(i), "body": base64.b64encode(workload.body(i)).decode()[:size],
                        "keys": list(workload.keys[i]), "tags": workload.tag(i), "queueId": workload.queue_ids[i],
                        "uniqKey": workload.uniq_keys[i]}) + "\n"
            for i in range(len(workload))
        )  # fmt: skip


def send_file_run(store: Path, jsonl: Path, messages: int, log_dir: Path, acks: str, batch: int) -> dict[str, Any]:
    """A fresh ASYNC writer serving; `rmqstore send --file` run as a user runs it, timed
    from its start to its exit (the interpreter's start, reading, checking, sending and
    every ack written included); its acks are counted."""
    shutil.rmtree(store, ignore_errors=True)
    out = log_dir / f"send-file-{acks}.out"
    with Nodes(log_dir) as nodes:
        writer = nodes.start("writer", store)
        create_topics(writer.endpoint)
        command = [sys.executable, "-m", "rmqstore.cli.main", "send", "--endpoint", writer.endpoint,
                   "--file", str(jsonl), "--acks", acks, "--batch-size", str(batch)]  # fmt: skip
        with open(out, "wb") as stdout:
            started = time.perf_counter()
            done = subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, env=quiet_env(), timeout=3600, check=False)
            seconds = time.perf_counter() - started
        writer.stop()
    if done.returncode != 0:
        raise RuntimeError(f"rmqstore send --file failed ({done.returncode}): {done.stderr.decode(errors='replace')}")
    text = out.read_text(encoding="utf-8")
    if acks == "all":
        acked = text.count("\n")
    elif acks == "summary":
        acked = json.loads(text)["acked"]
    else:
        acked = messages if text == "" else -1
    if acked != messages:
        raise RuntimeError(f"rmqstore send --file --acks {acks} acknowledged {acked} of {messages}")
    return {"acks": acks, "messages": messages, "seconds": round(seconds, 3), "msgs_per_s": round(messages / seconds)}


SYNC_CALLS = ("stream", "send")
SYNC_CLIENTS = ("cpp", "python")


def sync_way(client: str, call: str) -> str:
    """``cpp_stream``: the C++ client's producers, each a SendStream of one message a request."""
    return f"{client}_{call}"


def sync_client_run(client: str, call: str, endpoint: str, spec: WorkloadSpec, requests: dict[str, Path],
                    producers: int, seconds: float) -> dict[str, Any]:  # fmt: skip
    """One run of a SYNC client (another process) against ``endpoint``: the C++ one
    (native_client.py, fed ``requests[call]``) or the Python asyncio one (grpc_clients.py)."""
    if client == "cpp":
        result = native_client.sync_run(endpoint, requests[call], call, producers, seconds)
    else:
        result = run_client(
            _client_args("sync", endpoint, spec, "--producers", str(producers), "--seconds", str(seconds), "--call", call),
            timeout_s=seconds * 10 + 120,
        )
    if result["errors"]:
        raise RuntimeError(f"SYNC producers ({client}, {call}) failed: {result['errors']}")
    return result


def sync_run(store: Path, spec: WorkloadSpec, requests: dict[str, Path], log_dir: Path, producers: list[int],
             seconds: float, clients: Sequence[str] = SYNC_CLIENTS) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """One writer with ``--flush sync`` on a fresh store, loaded in turn by each way of
    sending (client × call): the first of ``clients`` (the C++ one by default) at every
    producer count, the others at the largest. Each way's runs, in producer order."""
    shutil.rmtree(store, ignore_errors=True)
    runs: dict[str, list[dict[str, Any]]] = {}
    with Nodes(log_dir) as nodes:
        writer = nodes.start("writer", store, "--flush", "sync")
        create_topics(writer.endpoint)
        for client in clients:
            for call in SYNC_CALLS:
                counts = producers if client == clients[0] else [max(producers)]
                runs[sync_way(client, call)] = [
                    sync_client_run(client, call, writer.endpoint, spec, requests, count, seconds) for count in counts
                ]
        writer.stop()
    return runs


class GrpcLookups:
    """The query sets through a query node's gRPC API, one client, one call at a time."""

    def __init__(self, endpoint: str):
        self.channel = grpc.insecure_channel(endpoint)
        grpc.channel_ready_future(self.channel).result(timeout=RPC_TIMEOUT_S)
        self.stub = query_pb2_grpc.QueryServiceStub(self.channel)
        self._ping = query_pb2.PingRequest()

    def ping(self) -> None:
        self.stub.Ping(self._ping, timeout=RPC_TIMEOUT_S)

    def by_key(self, topic: str, key: str) -> Any:
        response = self.stub.QueryByKey(
            query_pb2.QueryByKeyRequest(topic=topic, key=key, page_size=KEY_PAGE_SIZE), timeout=RPC_TIMEOUT_S
        )
        return tuple(m.uniq_key for m in response.messages), response.complete

    def by_uniq_key(self, topic: str, uniq_key: str) -> Any:
        response = self.stub.QueryByUniqKey(
            query_pb2.QueryByUniqKeyRequest(topic=topic, uniq_key=uniq_key), timeout=RPC_TIMEOUT_S
        )
        return tuple(m.uniq_key for m in response.messages)

    def by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> Any:
        response = self.stub.QueryByQueueOffset(
            query_pb2.QueryByQueueOffsetRequest(topic=topic, queue_id=queue_id, queue_offset=queue_offset),
            timeout=RPC_TIMEOUT_S,
        )
        return (response.message.uniq_key,)

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int, boundary: str) -> Any:
        side = query_pb2.BOUNDARY_LOWER if boundary == "lower" else query_pb2.BOUNDARY_UPPER
        response = self.stub.SearchOffset(
            query_pb2.SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms, boundary=side),
            timeout=RPC_TIMEOUT_S,
        )
        return response.offset

    def close(self) -> None:
        self.channel.close()


def visibility_lag_run(
    store: Path, spec: WorkloadSpec, log_dir: Path, probes: int, interval_s: float, timeout_s: float
) -> dict[str, Any]:
    """A writer and a query node on one store; the stream client loads the writer
    while this process sends single probe messages (Send) and polls the query node
    (QueryByUniqKey) until each is visible: ack → visible."""
    shutil.rmtree(store, ignore_errors=True)
    stop_file = log_dir / "lag-load.stop"
    stop_file.unlink(missing_ok=True)
    with Nodes(log_dir) as nodes:
        writer = nodes.start("writer", store)
        create_topics(writer.endpoint)
        query = nodes.start("query", store)
        load = subprocess.Popen(
            [sys.executable, *_client_args("stream", writer.endpoint, spec, "--seconds", "3600",
                                            "--stop-file", str(stop_file))],  # fmt: skip
            cwd=CLIENTS.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=quiet_env(),
        )
        try:
            time.sleep(_load_warmup_s(spec))
            lags, timeouts, loaded = _probe(writer.endpoint, query.endpoint, load, probes, interval_s, timeout_s)
        finally:
            stop_file.touch()
            try:
                out, err = load.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                load.kill()
                out, err = load.communicate()
        if load.returncode != 0:
            raise RuntimeError(f"the load client failed:\n{err[-3000:]}")
        load_result = json.loads(out.strip().splitlines()[-1])
        query.stop()
        writer.stop()
    return {"probes": probes, "timeouts": timeouts, "probes_under_load": loaded, "load": load_result, "lags_ns": lags}


def _load_warmup_s(spec: WorkloadSpec) -> float:
    """The load client serializes its batches before it sends; wait for that (bounded)."""
    return min(2.0 + spec.messages / 150_000, 15.0)


def _probe(
    writer_endpoint: str, query_endpoint: str, load: subprocess.Popen[str], probes: int, interval_s: float, timeout_s: float
) -> tuple[list[int], int, int]:
    lags: list[int] = []
    timeouts = 0
    loaded = 0
    with grpc.insecure_channel(writer_endpoint) as writer_channel, grpc.insecure_channel(query_endpoint) as query_channel:
        send = writer_pb2_grpc.WriterServiceStub(writer_channel).Send
        lookup = query_pb2_grpc.QueryServiceStub(query_channel).QueryByUniqKey
        for n in range(probes):
            uniq_key = f"FEED{n:028X}"
            message = writer_pb2.SendRequest(
                message=messages_pb2.Message(topic=TOPICS[0], queue_id=n % QUEUES_PER_TOPIC, body=b"probe", uniq_key=uniq_key)
            )
            send(message, timeout=RPC_TIMEOUT_S)
            acked = time.perf_counter_ns()
            deadline = acked + int(timeout_s * 1e9)
            request = query_pb2.QueryByUniqKeyRequest(topic=TOPICS[0], uniq_key=uniq_key)
            while True:
                found = lookup(request, timeout=RPC_TIMEOUT_S).messages
                now = time.perf_counter_ns()
                if found:
                    lags.append(now - acked)
                    break
                if now > deadline:
                    timeouts += 1
                    break
            loaded += load.poll() is None
            time.sleep(interval_s)
    return lags, timeouts, loaded


def kill_recovery_run(store: Path, spec: WorkloadSpec, log_dir: Path, kill_at: float) -> dict[str, Any]:
    """Stream the workload into a writer, SIGKILL it once ``kill_at`` of it is acked,
    restart it and time the restart until its serving line (recovery included). The
    same start on an empty store is the floor (interpreter, imports, gRPC server)."""
    shutil.rmtree(store, ignore_errors=True)
    empty = store.with_name(store.name + "-empty")
    shutil.rmtree(empty, ignore_errors=True)
    with Nodes(log_dir) as nodes:
        floor = nodes.start("writer", empty)
        floor_s = floor.seconds_to_serving
        floor.stop()
        writer = nodes.start("writer", store)
        create_topics(writer.endpoint)
        acked_at_kill = _stream_until(writer, spec, int(spec.messages * kill_at))
        restarted = nodes.start("writer", store)
        seconds = restarted.seconds_to_serving
        recovered = restarted.serving["recovered"]
        restarted.stop()
    shutil.rmtree(empty, ignore_errors=True)
    log_bytes = int(recovered["endOffset"])
    return {
        "acked_at_kill": acked_at_kill,
        "recovered": recovered,
        "commitlog_bytes": log_bytes,
        "restart_seconds": round(seconds, 3),
        "empty_start_seconds": round(floor_s, 3),
        "seconds_per_gb": round(seconds / (log_bytes / 1e9), 2) if log_bytes else None,
        "net_seconds_per_gb": round(max(seconds - floor_s, 0) / (log_bytes / 1e9), 2) if log_bytes else None,
    }


def _stream_until(writer: Node, spec: WorkloadSpec, threshold: int) -> int:
    client = subprocess.Popen(
        [sys.executable, *_client_args("stream", writer.endpoint, spec, "--progress")],
        cwd=CLIENTS.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=quiet_env(),
    )
    acked = 0
    try:
        assert client.stdout is not None
        for line in client.stdout:
            document = json.loads(line)
            if "acked" in document and "sent" not in document:
                acked = document["acked"]
                if acked >= threshold:
                    writer.kill()
                    break
        client.wait(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        client.stdout and client.stdout.close()  # type: ignore[func-returns-value]
        client.stderr and client.stderr.close()  # type: ignore[func-returns-value]
    if writer.proc.poll() is None:
        raise RuntimeError(f"the stream ended at {acked} acked messages before the kill threshold {threshold}")
    return acked


def query_node_memory(node: Node) -> dict[str, int]:
    from bench_common import process_memory

    return process_memory(node.proc.pid)


def sigkill(proc: subprocess.Popen[Any]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
