"""The repository stands alone: its docs, code and tests refer only to files it holds."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCOPE = ["README.md", "docs", "common", "writer", "query", "service", "cli", "client", "pipeline", "proxy", "benchmarks", "tests", "protos/rmqstore"]
# What a clone does not have: the planning notes outside the repository, and issue numbers.
# (Written so that this line does not match itself: "[ ]" is a space.)
OUTSIDE = re.compile(r"\.\./shared|FORMAT\.md|DESIGN\.md|issue[ ]#")
TEXT_SUFFIXES = {".md", ".py", ".c", ".proto", ".toml", ".sh", ".yaml", ".yml", ".txt", ".cc", ".json", ".jsonl"}


def _files() -> list[Path]:
    found = []
    for name in SCOPE:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        found += [p for p in candidates if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts]
    return found


def test_nothing_refers_outside_the_repository() -> None:
    hits = []
    for path in _files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert hits == []


def test_every_section_cited_exists() -> None:
    """Each "docs/format.md §N" or "docs/design.md §N" in code, tests and docs names a
    section heading the document has."""
    headings = {
        name: set(re.findall(r"^#+ (\d+(?:\.\d+)?)\.? ", (ROOT / "docs" / name).read_text(encoding="utf-8"), re.MULTILINE))
        for name in ("format.md", "design.md")
    }
    assert {"3.2", "7.3", "15"} <= headings["format.md"] and {"4", "8"} <= headings["design.md"]
    missing = []
    cite = re.compile(r"docs/(format|design)\.md[^§\n]{0,3}((?:§\s?\d+(?:\.\d+)?[.,]?\s*(?:and\s|,\s)?)+)")
    for path in _files():
        for match in cite.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for section in re.findall(r"§\s?(\d+(?:\.\d+)?)", match.group(2)):
                section = section.rstrip(".")
                if section not in headings[f"{match.group(1)}.md"]:
                    missing.append(f"{path.relative_to(ROOT)}: docs/{match.group(1)}.md §{section}")
    assert missing == []


def test_the_format_names_its_sources() -> None:
    text = (ROOT / "docs" / "format.md").read_text(encoding="utf-8")
    assert "rocketmq-all-4.9.8" in text
    for source in ("store/CommitLog.java", "store/ConsumeQueue.java", "store/index/IndexFile.java", "store/StoreCheckpoint.java"):
        assert source in text, source
