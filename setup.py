"""Build hook: generate the gRPC/protobuf stubs from protos/ at install time, and build
the codecs' compiled fast paths (common/codec/_speedups.c, plain C on the Python API).

Every install (regular or editable) compiles protos/rmqstore/v1/*.proto with grpcio-tools
(a build requirement) into protos/gen/, which is not committed and is installed as the
rmqstore.v1 package. It runs when setuptools loads this file, because the package
directory must exist before egg_info looks for it.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
PROTOS = ROOT / "protos"
GENERATED = PROTOS / "gen"


def generate_stubs() -> None:
    import grpc_tools
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / "rmqstore" / "v1").glob("*.proto"))
    package_dir = GENERATED / "rmqstore" / "v1"
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
    (package_dir / "__init__.py").write_text('"""Generated from protos/rmqstore/v1 at install time."""\n')


generate_stubs()
setup(
    ext_modules=[
        Extension(
            "rmqstore.common.codec._speedups",
            ["common/codec/_speedups.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
        )
    ]
)
