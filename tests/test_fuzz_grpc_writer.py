"""Hypothesis-fuzzed requests to every method of the writer's rmqstore.v1 methods, through
real gRPC servers on 127.0.0.1 (tests/support/fuzz_grpc.py): every answer is OK or one of the
documented codes, none UNKNOWN or INTERNAL, and the node keeps serving. Requests a method:
FUZZ_EXAMPLES, 1,000 by default; a release runs 10,000 (README.md, "Set-up"; what each count
costs: benchmarks/CI.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.fuzz_grpc import Nodes, fuzz, methods

from rmqstore.v1 import writer_pb2


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    nodes = Nodes(tmp_path_factory.mktemp("fuzz"))
    yield nodes
    nodes.close()


@pytest.mark.slow
@pytest.mark.parametrize("service, method", methods(writer_pb2))
def test_fuzzed_requests_get_only_documented_codes(fuzzed: Nodes, service: str, method: Any) -> None:
    fuzz(fuzzed.writer.channel, service, method, on_writer=True)
