"""The README's main job, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_runs_writer_and_query_node_and_every_lookup(tmp_path: Path) -> None:
    store = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "demo", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for command in ("queryMsgByKey", "queryMsgByUniqueKey", "queryMsgById", "queryMsgByOffset", "searchOffset", "printMsg"):
        assert f"$ rmqstore {command} --endpoint 127.0.0.1:" in out, command
    # order-42 has three Orders messages; the table lists them newest first.
    table = out.split("where are order 42's messages?")[1].split("$ rmqstore")[0].splitlines()[1:]
    rows = [line.split() for line in table if line.strip()]
    assert rows[0] == ["#Message", "ID", "#QID", "#Offset"]
    assert [row[-1] for row in rows[1:]] == ["2", "1", "0"]
    assert "Unique Key:          PAYMENT0001" in out
    assert out.rstrip().endswith("ok: 7 records, 7 consume queue units and 20 index keys agree")
    assert not (tmp_path / "demo-samples.jsonl").exists()
