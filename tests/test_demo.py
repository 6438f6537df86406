"""The README's main job, run as a user runs it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
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
    *_, checked, _, last = out.rstrip().splitlines()
    assert checked == "ok: 7 records, 7 consume queue units and 20 index keys agree"
    assert re.fullmatch(
        r"console: http://127\.0\.0\.1:\d+/ \(stopped with the nodes; `rmqstore demo --console` keeps it up until Ctrl-C\)", last
    ), last
    assert not (tmp_path / "demo-samples.jsonl").exists()


@pytest.mark.slow
def test_demo_console_serves_the_demo_store_until_interrupted(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "rmqstore.cli.main", "demo", "--store", str(tmp_path / "demo"), "--console"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        url = None
        deadline = time.monotonic() + 300
        while url is None and time.monotonic() < deadline:
            line = demo.stdout.readline()
            assert line, "the demo ended before it showed the console"
            found = re.fullmatch(r"console: (http://127\.0\.0\.1:\d+/)    \(Ctrl-C stops the console and both nodes\)\n", line)
            url = found.group(1) if found else None
        assert url is not None
        with urllib.request.urlopen(url + "api/topics", timeout=30) as response:
            topics = json.load(response)["topics"]
        assert {t["name"]: t["messages"] for t in topics} == {"Orders": 5, "Payments": 2}
        demo.send_signal(signal.SIGINT)
        rest, errors = demo.communicate(timeout=120)
        assert demo.returncode == 0, errors[-2000:]
        assert "ok: 7 records, 7 consume queue units and 20 index keys agree" in rest
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate(timeout=30)
