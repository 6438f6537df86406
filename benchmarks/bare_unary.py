"""A bare no-op unary call on plain grpcio servers: the floor a lookup through the query
node is read against (section 4).

    python benchmarks/bare_unary.py serve threaded|asyncio

serves QueryService with a ``Ping`` that returns an empty response and nothing else (no
interceptor, no option, no store) on ``grpc.server`` (a thread pool of 32 workers, handlers
inline on them) or on ``grpc.aio.server`` (an ``async def`` handler on the loop), on
127.0.0.1 and a port of its own, which it prints. The same client's ``Ping`` against it
costs what grpcio itself costs a unary call on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

KINDS = ("threaded", "asyncio")


def serve(kind: str) -> None:
    import grpc

    from rmqstore.v1 import query_pb2, query_pb2_grpc

    empty = query_pb2.PingResponse()
    if kind == "threaded":

        class Noop(query_pb2_grpc.QueryServiceServicer):
            def Ping(self, request: Any, context: Any) -> Any:
                return empty

        server = grpc.server(futures.ThreadPoolExecutor(32))
        query_pb2_grpc.add_QueryServiceServicer_to_server(Noop(), server)  # type: ignore[no-untyped-call]
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        server.start()
        server.wait_for_termination()
        return

    class AsyncNoop(query_pb2_grpc.QueryServiceServicer):
        async def Ping(self, request: Any, context: Any) -> Any:  # type: ignore[override]
            return empty

    async def main() -> None:
        server = grpc.aio.server()
        query_pb2_grpc.add_QueryServiceServicer_to_server(AsyncNoop(), server)  # type: ignore[no-untyped-call]
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


class BareServer:
    """A bare no-op server of ``kind`` in a process of its own; its endpoint."""

    def __init__(self, kind: str):
        self.kind = kind
        self.process = subprocess.Popen([sys.executable, __file__, "serve", kind], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.endpoint = f"127.0.0.1:{int(self.process.stdout.readline())}"

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve")
    serve_parser.add_argument("kind", choices=KINDS)
    args = parser.parse_args(argv)
    serve(args.kind)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
