"""The cluster file (``proxy serve --cluster FILE``): the writer groups a proxy routes to,
each named by its writers' ``--broker-name``, with its writer and query endpoints. YAML::

    groups:
      - name: broker-a
        writers: ["10.0.0.1:8081"]
        queries: ["10.0.0.1:8082"]

Read whole and checked before use: a file that does not parse or breaks a rule is refused
with the rule it breaks, and a proxy reloading it keeps the groups it had."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rmqstore.common.errors import InvalidArgument
from rmqstore.common.transport import parse_endpoint

GROUPS_MAX = 1024


@dataclass(frozen=True)
class GroupEndpoints:
    """A writer group: its broker name, its writers (the first that answers takes the
    sends) and its query nodes."""

    name: str
    writers: tuple[str, ...]
    queries: tuple[str, ...] = ()


def parse_cluster(text: str, source: str = "the cluster file") -> tuple[GroupEndpoints, ...]:
    """The groups of a cluster file's text, in the file's order."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidArgument(f"{source} is not YAML: {error}") from None
    if not isinstance(document, dict) or set(document) != {"groups"}:
        raise InvalidArgument(f"{source}: expected a mapping with one key, groups")
    groups = document["groups"]
    if not isinstance(groups, list) or not groups:
        raise InvalidArgument(f"{source}: groups must be a non-empty list")
    if len(groups) > GROUPS_MAX:
        raise InvalidArgument(f"{source}: {len(groups)} groups; at most {GROUPS_MAX}")
    parsed = tuple(_group(entry, position, source) for position, entry in enumerate(groups, 1))
    names = [group.name for group in parsed]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise InvalidArgument(f"{source}: group {duplicated[0]} is named twice")
    return parsed


def _group(entry: Any, position: int, source: str) -> GroupEndpoints:
    where = f"{source}: group {position}"
    if not isinstance(entry, dict):
        raise InvalidArgument(f"{where}: expected a mapping with name, writers and queries")
    unknown = sorted(set(entry) - {"name", "writers", "queries"})
    if unknown:
        raise InvalidArgument(f"{where}: unknown field {unknown[0]} (expected name, writers, queries)")
    name = entry.get("name")
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise InvalidArgument(f"{where}: name must be a broker name without spaces")
    writers = _endpoints(entry.get("writers"), f"{source}: group {name}: writers")
    if not writers:
        raise InvalidArgument(f"{source}: group {name}: writers must list at least one endpoint")
    queries = _endpoints(entry.get("queries", []), f"{source}: group {name}: queries")
    return GroupEndpoints(name, writers, queries)


def _endpoints(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"{where}: expected a list of HOST:PORT strings")
    for endpoint in value:
        try:
            parse_endpoint(endpoint)
        except InvalidArgument as error:
            raise InvalidArgument(f"{where}: {error}") from None
    return tuple(value)


class ClusterFile:
    """A cluster file and the groups last read from it; :meth:`changed` reads it again
    when its modification time or size moved."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._stamp = self._stat()
        self.groups = self._read()

    def _stat(self) -> tuple[int, int]:
        try:
            stat = os.stat(self.path)
        except OSError as error:
            raise InvalidArgument(f"--cluster {self.path}: {error.strerror}") from None
        return stat.st_mtime_ns, stat.st_size

    def _read(self) -> tuple[GroupEndpoints, ...]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidArgument(f"--cluster {self.path}: {error}") from None
        return parse_cluster(text, f"--cluster {self.path}")

    def changed(self) -> bool:
        """Whether the file changed since last read, its new groups then in :attr:`groups`.
        Raises InvalidArgument for a changed file that is not a cluster file (the groups
        stay those last read) and for one that is gone."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        groups = self._read()
        if groups == self.groups:
            return False
        self.groups = groups
        return True
