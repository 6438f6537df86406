"""gRPC producer processes of the benchmark (separate from the writer they load).

    python grpc_clients.py stream --endpoint H:P --messages N [--seconds S] [--progress]
    python grpc_clients.py sync --endpoint H:P --producers 64 --seconds S

``stream``: the workload in batches over one ``SendStream`` (client streaming of batches,
one acked response per batch). The batches are serialized before the clock starts, so
the window holds sending, the writer's work and the acks, not this client's protobuf
encoding (timed separately and reported). With ``--seconds`` it repeats the workload
until the time is up or ``--stop-file`` exists (the load of the visibility-lag
section); with ``--progress`` it prints the acked count after every batch (the recovery
section kills the writer part-way). The last line printed is one JSON document.

``sync``: ``--producers`` concurrent producers on one asyncio channel, each sending one
message and waiting for its ack before the next: throughput and ack latencies of the
window after a warm-up. With ``--call send`` each message is a ``Send`` call; with
``--call stream`` each producer keeps one ``SendStream`` open and sends each message as
a one-message batch on it (as a RocketMQ producer keeps its connection and sends
request after request).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).parent))

from workload import Workload, WorkloadSpec

from rmqstore.v1 import writer_pb2, writer_pb2_grpc

SEND_STREAM = "/rmqstore.v1.WriterService/SendStream"
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]


def _serialized_batches(workload: Workload, batch: int, compact: bool) -> tuple[list[bytes], list[int], float]:
    started = time.perf_counter_ns()
    payloads, counts = [], []
    for indexes in workload.batches(batch):
        request = writer_pb2.SendBatchRequest(messages=workload.proto_messages(indexes), compact_results=compact)
        payloads.append(request.SerializeToString())
        counts.append(len(indexes))
    return payloads, counts, (time.perf_counter_ns() - started) / 1e9


def stream(args: argparse.Namespace) -> dict[str, Any]:
    workload = Workload(WorkloadSpec(args.messages, args.body_bytes, args.seed))
    payloads, counts, encode_s = _serialized_batches(workload, args.batch, args.acks == "compact")
    sent = 0
    acked = 0
    deadline = None

    def requests() -> Any:
        nonlocal sent
        for payload, count in itertools.cycle(zip(payloads, counts)) if args.seconds else zip(payloads, counts):
            if deadline is not None and time.perf_counter() >= deadline:
                return
            if args.stop_file and os.path.exists(args.stop_file):
                return
            sent += count
            yield payload

    error = None
    with grpc.insecure_channel(args.endpoint, options=CHANNEL_OPTIONS) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        call = channel.stream_stream(
            SEND_STREAM,
            request_serializer=None,  # the requests are bytes already
            response_deserializer=writer_pb2.SendBatchResponse.FromString,
        )
        started = time.perf_counter_ns()
        if args.seconds:
            deadline = time.perf_counter() + args.seconds
        try:
            for response in call(requests(), timeout=args.timeout):
                acked += len(response.compact.uniq_keys) + len(response.results)
                if args.progress:
                    print(json.dumps({"acked": acked}), flush=True)
        except grpc.RpcError as rpc_error:
            error = f"{rpc_error.code().name}: {rpc_error.details()}"
        elapsed = (time.perf_counter_ns() - started) / 1e9
    return {
        "sent": sent,
        "acked": acked,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(acked / elapsed) if elapsed else None,
        "client_encode_seconds": round(encode_s, 3),
        "client_encode_msgs_per_s": round(len(workload) / encode_s) if encode_s else None,
        "error": error,
    }


async def _sync_producers(args: argparse.Namespace) -> dict[str, Any]:
    workload = Workload(WorkloadSpec(args.messages, args.body_bytes, args.seed))
    requests = [writer_pb2.SendRequest(message=m) for m in workload.proto_messages(range(len(workload)))]
    latencies: list[int] = []
    errors: list[str] = []
    if args.call == "stream":
        requests = [writer_pb2.SendBatchRequest(messages=[r.message]) for r in requests]
    async with grpc.aio.insecure_channel(args.endpoint, options=CHANNEL_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=30)
        stub = writer_pb2_grpc.WriterServiceStub(channel)
        start_at = time.perf_counter_ns() + int(args.warmup * 1e9)
        stop_at = start_at + int(args.seconds * 1e9)

        async def produce(p: int) -> None:
            call = stub.SendStream(timeout=args.timeout) if args.call == "stream" else None
            i = p
            try:
                while True:
                    begun = time.perf_counter_ns()
                    if begun >= stop_at:
                        break
                    if call is None:
                        await stub.Send(requests[i % len(requests)], timeout=args.timeout)
                    else:
                        await call.write(requests[i % len(requests)])
                        if await call.read() is grpc.aio.EOF:
                            raise RuntimeError("the stream ended before its ack")
                    if begun >= start_at:
                        latencies.append(time.perf_counter_ns() - begun)
                    i += args.producers
                if call is not None:
                    await call.done_writing()
                    if (code := await call.code()) != grpc.StatusCode.OK:
                        errors.append(f"{code.name}: {await call.details()}")
            except grpc.RpcError as error:
                errors.append(f"{error.code().name}: {error.details()}")  # type: ignore[attr-defined]

        await asyncio.gather(*(produce(p) for p in range(args.producers)))
    return {
        "producers": args.producers,
        "call": args.call,
        "acked": len(latencies),
        "seconds": args.seconds,
        "errors": errors[:5],
        "latencies_ns": latencies,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    roles = parser.add_subparsers(dest="role", required=True)
    for name in ("stream", "sync"):
        role = roles.add_parser(name)
        role.add_argument("--endpoint", required=True)
        role.add_argument("--messages", type=int, required=True, help="workload size")
        role.add_argument("--body-bytes", type=int, default=256)
        role.add_argument("--seed", type=int, required=True)
        role.add_argument("--seconds", type=float, default=0.0, help="stream: repeat until then; sync: window")
        role.add_argument("--timeout", type=float, default=600.0)
    roles.choices["stream"].add_argument("--batch", type=int, default=1000)
    roles.choices["stream"].add_argument("--progress", action="store_true")
    roles.choices["stream"].add_argument(
        "--acks", choices=["compact", "full"], default="compact", help="acks as columns (default) or one SendResult each"
    )
    roles.choices["stream"].add_argument("--stop-file", help="stop sending once this file exists")
    roles.choices["sync"].add_argument("--producers", type=int, required=True)
    roles.choices["sync"].add_argument("--warmup", type=float, default=0.5)
    roles.choices["sync"].add_argument("--call", choices=["send", "stream"], default="send")
    args = parser.parse_args(argv)
    if args.role == "stream":
        result = stream(args)
    else:
        result = asyncio.run(_sync_producers(args))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
