"""Build hook: generate the gRPC/protobuf stubs from protos/ at install time, and build
the codecs' compiled fast paths (common/codec/speedups_c/*.c, plain C on the Python API, one
extension module: rmqstore.common.codec._speedups).

Every install (regular or editable) compiles protos/rmqstore/v1/*.proto with grpcio-tools
(a build requirement) into protos/gen/, which is not committed and is installed as the
rmqstore.v1 package; and protos/apache/rocketmq/v2/*.proto (RocketMQ 5's protocol) into
the rmqstore.rocketmq_v2 package, its generated imports rewritten to that name: a
top-level ``apache`` package of ours would shadow (or be shadowed by) the copy that an
official RocketMQ 5 client installed beside rmqstore bundles. The files keep their proto
names (apache/rocketmq/v2/...), which is what reflection and the wire see; so both copies
cannot be loaded in one interpreter (protobuf's default pool takes a file name once), and
the official client runs in a process of its own.
It runs when setuptools loads this file, because the package directory must exist before
egg_info looks for it.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
PROTOS = ROOT / "protos"
GENERATED = PROTOS / "gen"
SPEEDUPS = Path("common") / "codec" / "speedups_c"


def generate_stubs() -> None:
    _compile(PROTOS / "rmqstore" / "v1", "rmqstore.v1", "rmqstore.v1")
    _compile(PROTOS / "apache" / "rocketmq" / "v2", "apache.rocketmq.v2", "rmqstore.rocketmq_v2")


def _compile(source_dir: Path, proto_package: str, python_package: str) -> None:
    import grpc_tools
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(PROTOS)) for p in source_dir.glob("*.proto"))
    package_dir = GENERATED / source_dir.relative_to(PROTOS)
    package_dir.mkdir(parents=True, exist_ok=True)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"-I{well_known}",
            f"--python_out={GENERATED}",
            f"--pyi_out={GENERATED}",
            f"--grpc_python_out={GENERATED}",
            *sources,
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status} on {sources}")
    if python_package != proto_package:
        # protoc names the imports between the files after the proto package's path.
        for generated in package_dir.glob("*_pb2*.py*"):
            text = generated.read_text()
            generated.write_text(text.replace(f"from {proto_package} import", f"from {python_package} import"))
    relative = source_dir.relative_to(PROTOS)
    (package_dir / "__init__.py").write_text(f'"""Generated from protos/{relative} at install time."""\n')


generate_stubs()
setup(
    ext_modules=[
        Extension(
            "rmqstore.common.codec._speedups",
            sorted(str(source.relative_to(ROOT)) for source in (ROOT / SPEEDUPS).glob("*.c")),
            depends=[str(SPEEDUPS / "speedups.h")],
            libraries=["z"],  # zlib's crc32(): the records' body CRC
            # The files share their helpers through speedups.h: hidden, so that none of
            # them can bind to (or be taken for) a symbol of the interpreter's.
            extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration", "-fvisibility=hidden"],
        )
    ]
)
