"""A bare RocketMQ 5 receive, acknowledge and send on a plain ``grpc.aio`` server: the floor
the writer's consumer path and its one-message calls are read against
(benchmarks/consumer_bench.py, benchmarks/one_call_bench.py).

    python benchmarks/bare_receive.py serve COUNT BATCH

serves MessagingService with a ``ReceiveMessage`` that streams what the writer streams for
a batch (a status, a delivery timestamp, then BATCH messages, each one answer: the v2
protocol's one message a response) and an ``AckMessage`` that answers every entry OK, on
``grpc.aio.server`` (the writer's framework) with ``async def`` handlers and nothing else
(no interceptor, no store, no bookkeeping), and a ``SendMessage`` that answers each
message OK with its id and an offset. The COUNT messages are made before it serves,
with the fields, sizes and 100-byte bodies of the benchmark's stored messages and receipt
handles of a writer's length, so a call costs only grpcio's work: the same client's
receive of BATCH, one AckMessage or one SendMessage against it cost what grpcio itself
costs them here.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from typing import Any

BODY_BYTES = 100
# A version-2 receipt handle of the benchmark's group and topic is about this long.
HANDLE_CHARS = 96


def _messages(count: int) -> list[Any]:
    from google.protobuf import duration_pb2, timestamp_pb2

    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s

    answers = []
    for n in range(count):
        answer = v2s.ReceiveMessageResponse()
        message = answer.message
        message.topic.name = "ConsumeBench"
        message.body = f"{n:020d}".encode().ljust(BODY_BYTES, b".")
        system = message.system_properties
        system.message_id = f"{n:032X}"
        system.body_digest.type = v2.MD5
        system.body_digest.checksum = "0" * 32
        system.body_encoding = v2.IDENTITY
        system.born_timestamp.CopyFrom(timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=n % 1000 * 1_000_000))
        system.born_host = "127.0.0.1"
        system.store_timestamp.CopyFrom(timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=n % 1000 * 1_000_000))
        system.store_host = "127.0.0.1:10911"
        system.receipt_handle = f"{n:0{HANDLE_CHARS}d}"
        system.queue_offset = n
        system.invisible_duration.CopyFrom(duration_pb2.Duration(seconds=29, nanos=999_000_000))
        system.delivery_attempt = 1
        system.tag = "T"
        system.message_type = v2.NORMAL
        answers.append(answer)
    return answers


def serve(count: int, batch: int) -> None:
    import grpc
    from google.protobuf import timestamp_pb2

    from rmqstore.rocketmq_v2 import definition_pb2 as v2
    from rmqstore.rocketmq_v2 import service_pb2 as v2s
    from rmqstore.rocketmq_v2 import service_pb2_grpc

    messages = _messages(count)
    ok = v2s.ReceiveMessageResponse(status=v2.Status(code=v2.OK, message="OK"))
    stamp = v2s.ReceiveMessageResponse(delivery_timestamp=timestamp_pb2.Timestamp(seconds=1_700_000_000))
    none = v2s.ReceiveMessageResponse(status=v2.Status(code=v2.MESSAGE_NOT_FOUND, message="no new message"))
    acked = v2s.AckMessageResponse(status=v2.Status(code=v2.OK, message="OK"))
    handed = [0]

    class Bare(service_pb2_grpc.MessagingServiceServicer):
        async def ReceiveMessage(self, request: Any, context: Any) -> Any:  # type: ignore[override]
            start = handed[0]
            handed[0] = end = min(count, start + min(batch, request.batch_size))
            if start == end:
                yield none
                return
            yield ok
            yield stamp
            for n in range(start, end):
                yield messages[n]

        async def AckMessage(self, request: Any, context: Any) -> Any:  # type: ignore[override]
            answer = v2s.AckMessageResponse()
            answer.CopyFrom(acked)
            for entry in request.entries:
                answer.entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=acked.status)
            return answer

        async def SendMessage(self, request: Any, context: Any) -> Any:  # type: ignore[override]
            answer = v2s.SendMessageResponse(status=acked.status)
            for n, message in enumerate(request.messages):
                answer.entries.add(status=acked.status, message_id=message.system_properties.message_id, offset=n)
            return answer

    async def main() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_MessagingServiceServicer_to_server(Bare(), server)  # type: ignore[no-untyped-call]
        print(server.add_insecure_port("127.0.0.1:0"), flush=True)
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


class BareReceive:
    """The bare server in a process of its own, its ``count`` messages made; its endpoint and pid."""

    def __init__(self, count: int, batch: int):
        self.process = subprocess.Popen([sys.executable, __file__, "serve", str(count), str(batch)], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.endpoint = f"127.0.0.1:{int(self.process.stdout.readline())}"

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve")
    serve_parser.add_argument("count", type=int)
    serve_parser.add_argument("batch", type=int)
    args = parser.parse_args(argv)
    serve(args.count, args.batch)


if __name__ == "__main__":
    main()
