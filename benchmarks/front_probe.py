"""Would front processes for the gRPC protocol lift section 3 (SYNC, 64 producers)?

The writer serves gRPC and group-commits on one event loop, under one GIL, and grpc's
own machinery takes about 25 us of it per stream message (LIMITS.md). The usual way out
of one GIL is more processes: fronts that speak gRPC and hand each request's bytes to
the process that owns the log. This measures that design before anyone builds it:

* ``writer``: ``rmqstore writer --flush sync``, as section 3 runs it;
* ``fronts``: one core process with the writer's own group commit (``Writer`` and the
  service's ``GroupAppender``, SYNC: appended, dispatched and fsynced before the ack) and
  ``--fronts`` processes serving ``SendStream`` on one port (SO_REUSEPORT), each passing
  the requests' bytes to the core over a Unix socket and its answers back.

Both are loaded alternately by the same C++ producers (native_client.py): 64 in all, in
``--clients`` processes, so that there are as many connections for the kernel to spread
over the fronts (one channel would land on one front). Prints one JSON line: each
round's acks a second, the records each store holds afterwards (every acked message and
those sent meanwhile) and the medians.

    python benchmarks/front_probe.py [--fronts 2] [--clients 2] [--rounds 3] [--seconds 2.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import native_client  # noqa: E402
from bench_common import Nodes  # noqa: E402
from bench_grpc import create_topics  # noqa: E402
from workload import QUEUES_PER_TOPIC, TOPICS, Workload, WorkloadSpec  # noqa: E402

# A frame between a front and the core: payload length, request id, status (0: ok), then
# a serialized SendBatchRequest (front to core) or SendBatchResponse / error text (back).
FRAME = struct.Struct("<IQB")
PRODUCERS = 64


def core(store: str, path: str) -> None:
    """The process that owns the log: the writer's group commit behind a Unix socket."""
    from rmqstore.v1 import writer_pb2
    from rmqstore.writer.config import FlushPolicy, WriterConfig
    from rmqstore.writer.intake import batch_response, request_batch
    from rmqstore.writer.service import WriterServicer
    from rmqstore.writer.store import Writer

    writer = Writer(WriterConfig(store=store, flush=FlushPolicy.SYNC))
    for topic in TOPICS:
        writer.topics.create(topic, QUEUES_PER_TOPIC)
    appender = WriterServicer(writer).appender
    parse = writer_pb2.SendBatchRequest.FromString

    class Front(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.pending = bytearray()

        def data_received(self, data: bytes) -> None:
            pending = self.pending
            pending += data
            at = 0
            while len(pending) - at >= FRAME.size:
                length, request_id, _ = FRAME.unpack_from(pending, at)
                if len(pending) - at - FRAME.size < length:
                    break
                request = parse(bytes(pending[at + FRAME.size : at + FRAME.size + length]))
                at += FRAME.size + length
                stored = appender.append(request_batch(request), None, batch_response)
                stored.add_done_callback(lambda done, request_id=request_id: self.answer(request_id, done))
            del pending[:at]

        def answer(self, request_id: int, done: asyncio.Future[Any]) -> None:
            error = done.exception()
            body = str(error).encode() if error else done.result().SerializeToString()
            self.transport.write(FRAME.pack(len(body), request_id, 1 if error else 0) + body)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_unix_server(Front, path)
        print("serving", flush=True)
        await server.serve_forever()

    asyncio.run(serve())


def front(path: str, port: int) -> None:
    """A gRPC front: SendStream's requests, as bytes, to the core and its answers back."""
    import grpc

    async def serve() -> None:
        reader, writer = await asyncio.open_unix_connection(path)
        loop = asyncio.get_running_loop()
        waiting: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        next_id = 0

        async def answers() -> None:
            try:
                while True:
                    length, request_id, status = FRAME.unpack(await reader.readexactly(FRAME.size))
                    waiting.pop(request_id).set_result((status, await reader.readexactly(length)))
            except asyncio.IncompleteReadError:
                return  # the core is gone: so is this front

        async def send_stream(requests: Any, context: Any) -> Any:
            nonlocal next_id
            async for request in requests:
                next_id += 1
                answer = waiting[next_id] = loop.create_future()
                writer.write(FRAME.pack(len(request), next_id, 0) + request)
                status, body = await answer
                if status:
                    await context.abort(grpc.StatusCode.INTERNAL, body.decode())
                yield body

        reading = asyncio.ensure_future(answers())
        handler = grpc.method_handlers_generic_handler(
            "rmqstore.v1.WriterService", {"SendStream": grpc.stream_stream_rpc_method_handler(send_stream)}
        )
        server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("serving", flush=True)
        stopped = asyncio.ensure_future(server.wait_for_termination())
        await asyncio.wait([reading, stopped], return_when=asyncio.FIRST_COMPLETED)

    asyncio.run(serve())


def load(endpoint: str, requests: Path, clients: int, seconds: float) -> int:
    """Acks a second of PRODUCERS producers in ``clients`` processes (connections)."""
    with ThreadPoolExecutor(clients) as pool:
        runs = list(
            pool.map(
                lambda _: native_client.sync_run(endpoint, requests, "stream", PRODUCERS // clients, seconds),
                range(clients),
            )
        )
    errors = [error for run in runs for error in run["errors"]]
    if errors:
        raise RuntimeError(f"the producers failed: {errors[:3]}")
    return round(sum(run["acked"] for run in runs) / seconds)


def _started(args: list[str]) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "serving":
        process.kill()
        raise RuntimeError(f"{args[0]} did not start (exit code {process.wait()})")
    return process


def stored_records(store: Path) -> int:
    """The records in a store's commit log (the acked ones and those sent meanwhile)."""
    from rmqstore.common.files.commitlog import CommitLog

    log = CommitLog(str(store / "commitlog"))
    try:
        return sum(1 for _ in log.records(check_crc=True))
    finally:
        log.close()


def fronts_round(work: Path, fronts: int, requests: Path, clients: int, seconds: float) -> tuple[int, int]:
    store, path = work / "fronts-store", str(work / "core.sock")
    shutil.rmtree(store, ignore_errors=True)
    Path(path).unlink(missing_ok=True)
    processes = [_started(["core", str(store), path])]
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        processes += [_started(["front", path, str(port)]) for _ in range(fronts)]
        acked = load(f"127.0.0.1:{port}", requests, clients, seconds)
    finally:
        for process in reversed(processes):  # the fronts first: they exit when the core does
            process.kill()
            process.wait()
    return acked, stored_records(store)


def writer_round(work: Path, requests: Path, clients: int, seconds: float) -> tuple[int, int]:
    store = work / "writer-store"
    shutil.rmtree(store, ignore_errors=True)
    with Nodes(work) as nodes:
        writer = nodes.start("writer", store, "--flush", "sync")
        create_topics(writer.endpoint)
        acked = load(writer.endpoint, requests, clients, seconds)
        writer.stop()
    return acked, stored_records(store)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", nargs="?", choices=["core", "front"], help=argparse.SUPPRESS)
    parser.add_argument("role_args", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--fronts", type=int, default=2)
    parser.add_argument("--clients", type=int, default=2, help="C++ client processes sharing the 64 producers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.5)
    args = parser.parse_args()
    if args.role == "core":
        core(*args.role_args)
        return
    if args.role == "front":
        front(args.role_args[0], int(args.role_args[1]))
        return
    if PRODUCERS % args.clients:
        parser.error(f"--clients must divide {PRODUCERS}")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        requests = work / "stream.bin"
        native_client.write_requests(requests, Workload(WorkloadSpec(5000, 256, 1)), "stream")
        rounds: dict[str, list[int]] = {"writer": [], "fronts": []}
        stored: dict[str, list[int]] = {"writer": [], "fronts": []}
        for _ in range(args.rounds):
            for name, run in (
                ("writer", lambda: writer_round(work, requests, args.clients, args.seconds)),
                ("fronts", lambda: fronts_round(work, args.fronts, requests, args.clients, args.seconds)),
            ):
                acked, records = run()
                rounds[name].append(acked)
                stored[name].append(records)
    medians = {name: statistics.median(figures) for name, figures in rounds.items()}
    print(
        json.dumps(
            {
                "fronts": args.fronts,
                "clients": args.clients,
                "producers": PRODUCERS,
                "seconds": args.seconds,
                "acked_per_s": rounds,
                "stored_records": stored,
                "median": medians,
                "fronts_to_writer": round(medians["fronts"] / medians["writer"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
