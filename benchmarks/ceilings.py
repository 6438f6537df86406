"""Ceilings of SYNC one-message appends on this machine, with the store's work taken out:
what any Python store would reach here, beside which section 3's figures are read.

    python benchmarks/ceilings.py threads [--producers 64] [--seconds 3]
    python benchmarks/ceilings.py grpc [--producers 64] [--seconds 3]

``threads``: producer threads each queue one request and wait for it, as
``Writer.append`` does, and the thread at the front writes 100 bytes and ``fdatasync``s
for the whole queue: the group commit with no encoding, dispatch or validation.

``grpc``: a writer service whose ``Send`` and ``SendStream`` do nothing (each message
answered with an empty ack), once as a thread-pool server (64 workers) and once as an
asyncio server (as ``writer serve`` runs), loaded by each of the benchmark's SYNC
clients (another process: ``grpc_clients.py sync``, Python asyncio, and
``native_client.py``, C++) with each of their calls: a ``Send`` per message, and one
message per request on a ``SendStream`` per producer.

Each prints one JSON line of calls per second.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import native_client  # noqa: E402
from workload import Workload, WorkloadSpec  # noqa: E402


def threads(producers: int, seconds: float) -> dict[str, Any]:
    queue: collections.deque[list[Any]] = collections.deque()
    queue_lock = threading.Lock()
    acked = [0] * producers
    groups: list[int] = []
    stop_at = time.perf_counter() + seconds
    with tempfile.NamedTemporaryFile(dir=HERE.parent) as scratch:
        fd = scratch.fileno()

        def lead() -> None:
            with queue_lock:
                group = list(queue)
            groups.append(len(group))
            os.pwrite(fd, b"x" * 100, 0)
            os.fdatasync(fd)
            with queue_lock:
                for _ in group:
                    queue.popleft()
                leader = queue[0] if queue else None
            for request in group:
                request[1] = True
            for request in group[1:]:
                request[0].release()
            if leader is not None:
                leader[0].release()

        def produce(number: int) -> None:
            while time.perf_counter() < stop_at:
                wake = threading.Lock()
                wake.acquire()
                request = [wake, False]
                with queue_lock:
                    queue.append(request)
                    leads = len(queue) == 1
                if not leads:
                    wake.acquire()
                if not request[1]:
                    lead()
                acked[number] += 1

        started = time.perf_counter()
        workers = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - started
    return {
        "ceiling": "threads",
        "producers": producers,
        "calls_per_s": round(sum(acked) / elapsed),
        "mean_group": round(sum(groups) / len(groups), 1),
    }


def _serve(kind: str) -> None:
    """A writer service whose Send does nothing; prints its port."""
    import grpc

    from rmqstore.v1 import writer_pb2, writer_pb2_grpc

    empty = writer_pb2.SendResponse()
    acked = writer_pb2.SendBatchResponse()
    if kind == "sync":

        class Noop(writer_pb2_grpc.WriterServiceServicer):
            def Send(self, request: Any, context: Any) -> Any:
                return empty

            def SendStream(self, requests: Any, context: Any) -> Any:
                for _ in requests:
                    yield acked

        server = grpc.server(futures.ThreadPoolExecutor(64))
        writer_pb2_grpc.add_WriterServiceServicer_to_server(Noop(), server)
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        server.start()
        server.wait_for_termination()
        return

    class AsyncNoop(writer_pb2_grpc.WriterServiceServicer):
        async def Send(self, request: Any, context: Any) -> Any:
            return empty

        async def SendStream(self, requests: Any, context: Any) -> Any:
            async for _ in requests:
                yield acked

    async def main() -> None:
        server = grpc.aio.server()
        writer_pb2_grpc.add_WriterServiceServicer_to_server(AsyncNoop(), server)
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def grpc_noop(kind: str, call: str, producers: int, seconds: float, client: str = "python",
              requests: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """The SYNC client (``python``: grpc_clients.py; ``cpp``: native_client.py, fed the
    serialized ``requests``) against a no-op server of ``kind``."""
    server = subprocess.Popen([sys.executable, __file__, "serve", kind], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        endpoint = f"127.0.0.1:{int(server.stdout.readline())}"
        if client == "cpp":
            assert requests is not None
            result = native_client.sync_run(endpoint, requests, call, producers, seconds)
        else:
            done = subprocess.run(
                [sys.executable, str(HERE / "grpc_clients.py"), "sync", "--endpoint", endpoint,
                 "--messages", "5000", "--seed", "1", "--seconds", str(seconds), "--producers", str(producers),
                 "--call", call],
                capture_output=True, text=True, check=True, timeout=seconds * 10 + 60,
            )  # fmt: skip
            result = json.loads(done.stdout.splitlines()[-1])
    finally:
        server.kill()
        server.wait()
    if result["errors"]:
        raise RuntimeError(f"no-op {call} ({client} client) failed: {result['errors']}")
    return {"ceiling": f"grpc_{kind}_server", "client": client, "call": call, "producers": producers,
            "messages_per_s": round(result["acked"] / seconds)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["threads", "grpc", "serve"])
    parser.add_argument("kind", nargs="?", choices=["sync", "aio"], help=argparse.SUPPRESS)
    parser.add_argument("--producers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    if args.what == "serve":
        _serve(args.kind)
    elif args.what == "threads":
        print(json.dumps(threads(args.producers, args.seconds)))
    else:
        with tempfile.TemporaryDirectory() as scratch:
            requests = {}
            for call in ("send", "stream"):
                requests[call] = Path(scratch) / f"{call}.bin"
                native_client.write_requests(requests[call], Workload(WorkloadSpec(5000, 256, 1)), call)
            for client in ("python", "cpp"):
                for call in ("send", "stream"):
                    for kind in ("sync", "aio"):
                        figures = grpc_noop(kind, call, args.producers, args.seconds, client, requests[call])
                        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
