"""The SYNC section's C++ producers (``native/sync_client.cc``): built here, on first use,
with the machine's C++ compiler against gRPC's C++ library (Debian: ``libgrpc++-dev``),
and fed the benchmark's seeded workload as serialized requests.

Why a C++ client: a producer waiting for each ack sends one small message per request,
and Python's grpc spends about as much CPU sending one as the writer spends storing it
(the asyncio client takes a whole core of this 2-core machine at 17,000 one-message acks
a second); a C++ client driving its producers from one thread takes about a third of a
core, and leaves the writer the machine a remote producer would.

    python benchmarks/native_client.py --endpoint 127.0.0.1:PORT --call stream --producers 64 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "native" / "sync_client.cc"
BUILD_DIR = HERE / "native" / "build"
BINARY = BUILD_DIR / "sync_client"
INSTALL_HINT = "install gRPC's C++ library and pkg-config (Debian: apt-get install libgrpc++-dev pkg-config)"

sys.path.insert(0, str(HERE))

from workload import Workload, WorkloadSpec  # noqa: E402


class NativeClientUnavailable(RuntimeError):
    """The C++ client cannot be built on this machine (the reason says what is missing)."""


def build() -> Path:
    """The client's binary, compiled if it is missing or older than its source."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None or shutil.which("pkg-config") is None:
        raise NativeClientUnavailable(f"no C++ compiler or pkg-config: {INSTALL_HINT}")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "grpc++"], capture_output=True, text=True, check=False)
    if flags.returncode != 0:
        raise NativeClientUnavailable(f"pkg-config knows no grpc++: {INSTALL_HINT}")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=BUILD_DIR, prefix=".sync_client.", delete=False) as partial:
        target = Path(partial.name)
    try:
        compiled = subprocess.run(
            [compiler, "-O2", "-std=c++17", str(SOURCE), "-o", str(target), *flags.stdout.split()],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if compiled.returncode != 0:
            raise NativeClientUnavailable(f"{SOURCE.name} did not compile:\n{compiled.stderr[-3000:]}")
        target.replace(BINARY)  # whole or not at all: a concurrent build never runs half a file
    finally:
        target.unlink(missing_ok=True)
    return BINARY


def write_requests(path: Path, workload: Workload, call: str) -> None:
    """The workload's messages as the client sends them: a SendRequest each (``send``) or
    a SendBatchRequest of one (``stream``), each behind its length (u32, little-endian)."""
    from rmqstore.v1 import writer_pb2

    with open(path, "wb") as out:
        for message in workload.proto_messages(range(len(workload))):
            if call == "send":
                request = writer_pb2.SendRequest(message=message).SerializeToString()
            else:
                request = writer_pb2.SendBatchRequest(messages=[message]).SerializeToString()
            out.write(struct.pack("<I", len(request)))
            out.write(request)


def sync_run(endpoint: str, requests: Path, call: str, producers: int, seconds: float, warmup_s: float = 0.5) -> dict[str, Any]:
    """One run of the C++ producers; its JSON (grpc_clients.py sync's fields)."""
    done = subprocess.run(
        [str(build()), "--endpoint", endpoint, "--requests", str(requests), "--call", call,
         "--producers", str(producers), "--seconds", str(seconds), "--warmup", str(warmup_s)],
        capture_output=True, text=True, check=False, timeout=seconds * 10 + 120,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the C++ SYNC client failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--call", choices=["send", "stream"], default="stream")
    parser.add_argument("--producers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=20_000, help="workload size")
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        requests = Path(scratch) / "requests.bin"
        write_requests(requests, Workload(WorkloadSpec(args.messages, args.body_bytes, args.seed)), args.call)
        result = sync_run(args.endpoint, requests, args.call, args.producers, args.seconds)
    latencies = sorted(result.pop("latencies_ns"))
    if latencies:
        result["p50_ms"] = latencies[len(latencies) // 2] / 1e6
        result["p99_ms"] = latencies[int(len(latencies) * 0.99)] / 1e6
    result["msgs_per_s"] = round(result["acked"] / result["seconds"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
