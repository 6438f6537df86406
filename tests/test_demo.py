"""The README's main job, run as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from support.cli import console_demo

from rmqstore.cli.demo import DEMO_MARKER, prepare_store
from rmqstore.cli.main import main


@pytest.mark.slow
def test_demo_runs_writer_and_query_node_and_every_lookup(tmp_path: Path) -> None:
    store = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "rmqstore.cli.main", "demo", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
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
    # On small files: a few MB of disk, where RocketMQ's default sizes took 1.4 GB.
    geometry = json.loads((store / "config" / "rmqstore-geometry.json").read_text())
    assert (geometry["commitLogFileSize"], geometry["cqFileUnits"], geometry["indexSlots"], geometry["indexEntries"]) == (
        1 << 20, 1000, 1000, 4000
    )
    disk_bytes = sum(path.stat().st_blocks * 512 for path in store.rglob("*") if path.is_file())
    assert disk_bytes < 4 << 20, disk_bytes


@pytest.mark.slow
def test_demo_console_serves_the_demo_store_until_interrupted(tmp_path: Path) -> None:
    with console_demo(tmp_path / "demo", tmp_path) as demo:
        found = re.fullmatch(r"console: (http://127\.0\.0\.1:\d+/)    \(Ctrl-C stops the console and both nodes\)\n", demo.console_line)
        assert found is not None, demo.console_line
        with urllib.request.urlopen(found.group(1) + "api/topics", timeout=30) as response:
            topics = json.load(response)["topics"]
        assert {t["name"]: t["messages"] for t in topics} == {"Orders": 5, "Payments": 2}
        assert "ok: 7 records, 7 consume queue units and 20 index keys agree" in demo.interrupt()


def test_demo_refuses_a_non_empty_directory_and_deletes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "mine"
    store.mkdir()
    (store / "notes.txt").write_text("keep me")
    assert main(["demo", "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"rmqstore: error: --store {store} is not empty and is not a demo store (no .rmqstore-demo file); "
        "nothing was deleted: give a new or empty directory\n"
    )
    assert sorted(p.name for p in store.iterdir()) == ["notes.txt"]
    assert (store / "notes.txt").read_text() == "keep me"


def test_demo_refuses_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "f"
    target.write_text("x")
    assert main(["demo", "--store", str(target)]) == 2
    assert capsys.readouterr().err == (
        f"rmqstore: error: --store {target} exists and is not a directory; give a new or empty directory\n"
    )
    assert target.read_text() == "x"


def test_demo_recreates_only_its_own_store(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_store(str(empty))
    assert sorted(p.name for p in empty.iterdir()) == [DEMO_MARKER]
    # A previous demo's store (its marker beside old files) is emptied and marked again.
    (empty / "commitlog").mkdir()
    (empty / "commitlog" / "00000000000000000000").write_bytes(b"\0" * 16)
    prepare_store(str(empty))
    assert sorted(p.name for p in empty.iterdir()) == [DEMO_MARKER]
    fresh = tmp_path / "new" / "store"
    prepare_store(str(fresh))
    assert sorted(p.name for p in fresh.iterdir()) == [DEMO_MARKER]


FAKE_PIP = """#!/usr/bin/env bash
echo "pip $*" >> "$(dirname "$0")/../calls.log"
"""
FAKE_RMQSTORE = """#!/usr/bin/env bash
echo "rmqstore $*" >> "$(dirname "$0")/../calls.log"
"""
REAL_RMQSTORE = f"""#!/usr/bin/env bash
exec {sys.executable} -m rmqstore.cli.main "$@"
"""


def test_run_sh_on_a_non_empty_directory_refuses_it_and_deletes_nothing(tmp_path: Path) -> None:
    """The repository's run.sh, with a venv whose pip only logs and whose rmqstore is this
    installation's: a directory with a notes file is refused, and kept."""
    repo = Path(__file__).resolve().parent.parent
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    for name, text in (("pip", FAKE_PIP), ("rmqstore", REAL_RMQSTORE)):
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    done = subprocess.run(
        ["bash", str(repo / "run.sh"), str(mine)], env={**os.environ, "RMQSTORE_VENV": str(venv)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"rmqstore: error: --store {mine} is not empty and is not a demo store (no .rmqstore-demo file); "
        "nothing was deleted: give a new or empty directory\n"
    )
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"


def test_test_sh_skips_the_install_on_the_same_inputs_as_run_sh() -> None:
    """test.sh installs into the same virtualenv as run.sh, under the same stamp: both
    must hash the same build inputs and look for the same built files."""
    repo = Path(__file__).resolve().parent.parent

    def stamp_lines(script: str) -> list[str]:
        lines = (repo / script).read_text().splitlines()
        return [line.strip() for line in lines if line.strip().startswith(("STAMP=", "current=", "built()"))]

    assert len(stamp_lines("run.sh")) == 3
    assert stamp_lines("test.sh") == stamp_lines("run.sh")


def test_run_sh_installs_only_when_its_inputs_changed(tmp_path: Path) -> None:
    """run.sh on a copy of the repository's install inputs, with a venv whose pip and
    rmqstore only log their calls: the first run installs, the second does not, a changed
    build input installs again."""
    repo = Path(__file__).resolve().parent.parent
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("run.sh", "pyproject.toml", "setup.py"):
        shutil.copy(repo / name, work / name)
    shutil.copytree(repo / "protos" / "rmqstore", work / "protos" / "rmqstore")
    shutil.copytree(repo / "common" / "codec" / "speedups_c", work / "common" / "codec" / "speedups_c")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    for name, text in (("pip", FAKE_PIP), ("rmqstore", FAKE_RMQSTORE)):
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    env = {**os.environ, "RMQSTORE_VENV": str(venv)}

    def run() -> list[str]:
        log = venv / "calls.log"
        log.unlink(missing_ok=True)
        done = subprocess.run(["bash", str(work / "run.sh"), "somewhere"], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return log.read_text().splitlines()

    installed = ["pip install --upgrade pip", "pip install -e .[test]", "rmqstore demo --store somewhere"]
    # What an install builds (the fake pip builds nothing): compiled stubs and codecs.
    (work / "protos" / "gen" / "rmqstore" / "v1").mkdir(parents=True)
    built = work / "common" / "codec" / "_speedups.cpython-311-x86_64-linux-gnu.so"
    built.write_bytes(b"")
    assert run() == installed
    assert run() == ["rmqstore demo --store somewhere"]
    with open(work / "pyproject.toml", "a", encoding="utf-8") as handle:
        handle.write("# changed\n")
    assert run() == installed
    assert run() == ["rmqstore demo --store somewhere"]
    built.unlink()  # built files gone: installed again, though the inputs did not change
    assert run() == installed
