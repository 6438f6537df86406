"""The package's dependencies point one way (docs/design.md §2), read from the source with
``ast``: every module of every folder, every import in it (top level or inside a function,
relative or absolute, ``importlib.import_module`` of a literal name), and every attribute
read through an imported module.

* common is the store library and imports no other package (nor the generated contracts);
  within it the codecs never import the file layers.
* client and service build on common only: neither imports the other.
* writer and query build on common and service.
* console builds on client; pipeline on client, writer and query; proxy on common, service,
  writer (the writer's v2 gateway reader) and query (the query service's cursor digest and
  service name, for the lookups it fronts).
* cli may import anything, and nothing imports cli but a package's ``__main__`` (an entry
  point, like the command line itself).
* No module uses another module's private (underscore) name, except that a package's own
  modules share its compiled module (``_speedups``, as the json module uses ``_json``).

And what the processes the command line starts import on their way (read from
``PYTHONPROFILEIMPORTTIME``'s list), since every node and command the tests and a
deployment start pays for it (benchmarks/CI.md, "Ninth round"): numpy runs one OpenBLAS
thread, a node without ``--acl`` reads no YAML, ``send`` and a lookup through a query node
load no numpy, and ``--version`` no command's module.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cli import quiet_env, run_cli
from support.nodes import Nodes

ROOT = Path(__file__).resolve().parent.parent
# The folders installed as rmqstore.<name> (pyproject.toml's package-dir).
PACKAGES = ("common", "client", "service", "writer", "query", "console", "pipeline", "proxy", "cli")
# Compiled from protos/ at install: any package but common may use the contracts.
GENERATED = frozenset({"v1", "rocketmq_v2"})
# What each package may import besides itself and the generated contracts.
ALLOWED: dict[str, frozenset[str]] = {
    "common": frozenset(),
    "client": frozenset({"common"}),
    "service": frozenset({"common"}),
    "writer": frozenset({"common", "service"}),
    "query": frozenset({"common", "service"}),
    "console": frozenset({"common", "client"}),
    "pipeline": frozenset({"common", "client", "writer", "query"}),
    "proxy": frozenset({"common", "service", "writer", "query"}),
    "cli": frozenset(PACKAGES),
}
# Entry points (``python -m rmqstore.<package>``) are command lines: they may import cli.
ENTRY_POINT = "__main__"
# A package's compiled module, which its own modules share.
COMPILED_MODULES = frozenset({"_speedups"})

# Edges that break the rules today, each with the change that removes it. The list only
# shrinks: an edge that is gone must leave it (test_known_violations_are_still_there).
# Empty since the pipeline's Arrow builder left the compiled module.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    importer: str  # rmqstore.<package>.<module>
    imported: str  # the module, or module.name for a name imported from it
    line: int

    @property
    def where(self) -> str:
        return f"{self.importer}:{self.line} -> {self.imported}"


def package_of(module: str) -> str:
    return module.split(".")[1]


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_modules() -> dict[str, Path]:
    """Every module of the package folders, by its rmqstore name."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(["rmqstore", *parts])] = path
    return modules


def _resolve(importer: str, is_package: bool, module: str | None, level: int) -> str:
    """The absolute module a ``from`` import names."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of an attribute chain on a name, None for anything else."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(names)])


def edges(module: str, source: str, is_package: bool) -> list[Edge]:
    """Every rmqstore module or name ``module`` imports, and every private attribute it
    reads through an imported rmqstore module or name."""
    tree = ast.parse(source)
    found: list[Edge] = []
    bound: dict[str, str] = {}  # local name -> the rmqstore module or name it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("rmqstore."):
                    found.append(Edge(module, alias.name, node.lineno))
                    if alias.asname:
                        bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source_module = _resolve(module, is_package, node.module, node.level)
            if source_module == "rmqstore" or source_module.startswith("rmqstore."):
                for alias in node.names:
                    target = f"{source_module}.{alias.name}"
                    found.append(Edge(module, target, node.lineno))
                    bound[alias.asname or alias.name] = target
        elif (
            isinstance(node, ast.Call)
            and _dotted(node.func) in ("importlib.import_module", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("rmqstore.")
        ):
            found.append(Edge(module, node.args[0].value, node.lineno))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            dotted = _dotted(node.value)
            if dotted is None:
                continue
            head, _, rest = dotted.partition(".")
            if head in bound:
                target = bound[head] + ("." + rest if rest else "")
            elif dotted.startswith("rmqstore."):
                target = dotted
            else:
                continue
            found.append(Edge(module, f"{target}.{node.attr}", node.lineno))
    return found


@dataclass(frozen=True)
class Violation:
    edge: Edge
    rule: str

    def __str__(self) -> str:
        return f"{self.edge.where}: {self.rule}"


def violations(modules: dict[str, Path]) -> list[Violation]:
    """Every edge of ``modules`` that breaks a rule."""
    broken = []
    for module, path in modules.items():
        broken += module_violations(module, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    return broken


def module_violations(module: str, source: str, is_package: bool) -> list[Violation]:
    found = ((edge, broken_rule(edge)) for edge in edges(module, source, is_package))
    return [Violation(edge, rule) for edge, rule in found if rule is not None]


def broken_rule(edge: Edge) -> str | None:
    importer, imported = edge.importer, edge.imported
    if imported == "rmqstore":
        return None
    source, target = package_of(importer), package_of(imported)
    names = imported.split(".")
    if target != source and target not in GENERATED:
        entry_point = importer.endswith(f".{ENTRY_POINT}") and target == "cli"
        if target not in ALLOWED[source] and not entry_point:
            return f"{source} may not import {target}"
    if source == "common" and target in GENERATED:
        return "common may not import the generated contracts"
    if importer.startswith("rmqstore.common.codec") and imported.startswith("rmqstore.common.files"):
        return "the codecs may not import the file layers"
    private = [name for name in names[2:] if is_private(name)]
    if private:
        owner = ".".join(names[: names.index(private[0])])
        shared_compiled = target == source and private == [names[-1]] and names[-1] in COMPILED_MODULES
        if owner != importer and not shared_compiled:
            return f"{private[0]} is private to {owner}"
    return None


def test_the_package_has_the_modules_this_test_reads() -> None:
    modules = package_modules()
    for package in PACKAGES:
        assert f"rmqstore.{package}" in modules, package
    assert "rmqstore.writer.node" in modules and "rmqstore.query.node" in modules
    assert len(modules) > 100


@functools.cache
def tree_violations() -> list[Violation]:
    return violations(package_modules())


def test_dependencies_point_one_way() -> None:
    unexpected = [str(v) for v in tree_violations() if not _known(v.edge)]
    assert unexpected == []


def test_known_violations_are_still_there() -> None:
    """An edge that was removed leaves the list, so that it cannot come back unnoticed."""
    broken = [v.edge for v in tree_violations()]
    gone = sorted(known for known in KNOWN_VIOLATIONS if not any(_matches(known, edge) for edge in broken))
    assert gone == []


def _matches(known: tuple[str, str], edge: Edge) -> bool:
    return edge.importer == known[0] and (edge.imported == known[1] or edge.imported.startswith(known[1] + "."))


def _known(edge: Edge) -> bool:
    return any(_matches(known, edge) for known in KNOWN_VIOLATIONS)


FORBIDDEN_EDGES = [
    pytest.param("service/acl.py", "from rmqstore.writer.store import Writer\n", "service may not import writer", id="service-writer"),
    pytest.param("service/listen.py", "from rmqstore.query import view\n", "service may not import query", id="service-query"),
    pytest.param("console/app.py", "from rmqstore.cli.query_tools import message_json\n", "console may not import cli", id="console-cli"),
    pytest.param("pipeline/load.py", "import rmqstore.cli.exits\n", "pipeline may not import cli", id="pipeline-cli"),
    pytest.param("client/__init__.py", "def f():\n    from rmqstore.service.acl import load_acl\n", "client may not import service", id="client-service"),
    pytest.param("service/acl.py", "from rmqstore.client.signing import sign\n", "service may not import client", id="service-client"),
    pytest.param("common/errors.py", "from rmqstore.writer import config\n", "common may not import writer", id="common-writer"),
    pytest.param("common/codec/record.py", "from ..files import commitlog\n", "the codecs may not import the file layers", id="codec-files"),
    pytest.param("writer/node.py", "from rmqstore.cli import exits\n", "writer may not import cli", id="writer-cli"),
    pytest.param("query/node.py", "from rmqstore.writer.validate import screen\n", "query may not import writer", id="query-writer"),
    pytest.param("writer/node.py", "from rmqstore.common.codec.dispatch import _tags_code_of\n", "_tags_code_of is private to rmqstore.common.codec.dispatch", id="private-name"),
    pytest.param("service/acl.py", "from rmqstore.service import guard\nguard._guarded\n", "_guarded is private to rmqstore.service.guard", id="private-attribute"),
    pytest.param("common/files/index.py", "import rmqstore.common.codec.index\nrmqstore.common.codec.index._x\n", "_x is private to rmqstore.common.codec.index", id="private-dotted"),
    pytest.param("cli/demo.py", "import importlib\nimportlib.import_module('rmqstore.writer.store')\n", None, id="cli-may-import-anything"),
    pytest.param("pipeline/__main__.py", "from rmqstore.cli.main import main\n", None, id="entry-point-imports-cli"),
    pytest.param("common/files/index.py", "from rmqstore.common.codec.speedups import _speedups\n", None, id="compiled-module-within-its-package"),
]


@pytest.mark.parametrize(("file", "added", "rule"), FORBIDDEN_EDGES)
def test_an_added_import_is_caught_or_allowed_by_its_rule(file: str, added: str, rule: str | None) -> None:
    """A forbidden import added to a module is caught by its rule (the test above would
    fail on it), and an allowed one passes."""
    path = ROOT / file
    module = next(name for name, found in package_modules().items() if found == path)
    source = path.read_text(encoding="utf-8")
    before = module_violations(module, source, path.name == "__init__.py")
    after = module_violations(module, source + "\n" + added, path.name == "__init__.py")
    assert sorted({v.rule for v in after} - {v.rule for v in before}) == ([] if rule is None else [rule])


def test_every_folder_of_modules_is_installed() -> None:
    """setuptools installs the packages pyproject.toml lists and no other: a folder of
    modules missing there imports from the source tree (tests, an editable install) but
    not from ``pip install .`` (the Dockerfile's, .ci/smoke's)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders: dict[str, str] = setuptools["package-dir"]
    listed = set(setuptools["packages"])
    found = set()
    for name, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    assert found - listed == set()
    assert set(folders) <= listed


# What the processes import


THREADS = "import os, numpy; print(len(os.listdir('/proc/self/task')))"


def test_the_command_line_runs_numpy_with_one_openblas_thread() -> None:
    """Set by the command line's package before numpy's import, unless the environment
    sets it."""
    env = {k: v for k, v in quiet_env().items() if k != "OPENBLAS_NUM_THREADS"}

    def threads(code: str, **extra: str) -> str:
        return subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True, check=True).stdout.strip()

    assert threads("import rmqstore.cli.main; " + THREADS) == "1"
    assert threads("import os, rmqstore.cli.main; print(os.environ['OPENBLAS_NUM_THREADS'])", OPENBLAS_NUM_THREADS="2") == "2"
    if (os.cpu_count() or 1) > 1:
        # Without the command line numpy starts a thread per core: the first assert can fail.
        assert int(threads(THREADS)) > 1


def imported(stderr: str) -> set[str]:
    """The modules a process imported, from the list PYTHONPROFILEIMPORTTIME writes to its
    stderr (``import time: self | cumulative | name``)."""
    return {line.rpartition("|")[2].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def top_level(modules: set[str]) -> set[str]:
    return {module.split(".")[0] for module in modules}


IMPORT_LIST = {"PYTHONPROFILEIMPORTTIME": "1"}


def test_a_node_without_acl_reads_no_yaml_and_commands_through_nodes_load_no_numpy(tmp_path: Path, nodes: Nodes) -> None:
    writer = nodes.start("writer", tmp_path / "store", env=quiet_env(**IMPORT_LIST))
    sent = run_cli(["send", "--endpoint", writer.endpoint, "-t", "T", "-k", "K", "--body", "b"], env=quiet_env(**IMPORT_LIST))
    assert sent.returncode == 0, sent.stderr
    query = nodes.start("query", tmp_path / "store", env=quiet_env(**IMPORT_LIST))
    found = run_cli(["queryMsgByKey", "--endpoint", query.endpoint, "-t", "T", "-k", "K", "--json"], env=quiet_env(**IMPORT_LIST))
    assert found.returncode == 0 and len(found.json_lines()) == 1, found.stderr[-2000:]
    for node in (writer, query):
        node.stop()
        listed = top_level(imported(node.stderr_path.read_text(encoding="utf-8")))
        assert "grpc" in listed and "yaml" not in listed, node.service
    for command in (sent, found):
        listed = top_level(imported(command.stderr))
        assert "grpc" in listed and listed & {"numpy", "yaml"} == set()


def test_version_loads_no_command_module() -> None:
    done = run_cli(["--version"], env=quiet_env(**IMPORT_LIST))
    assert done.returncode == 0 and done.stdout.startswith("rmqstore ")
    listed = imported(done.stderr)
    assert "rmqstore.cli.exits" in listed
    assert sorted(m for m in listed if m.startswith("rmqstore.cli.") and m != "rmqstore.cli.exits") == []
    assert top_level(listed) & {"numpy", "yaml", "opentelemetry"} == set()
