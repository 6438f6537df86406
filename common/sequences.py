"""A test the batch paths make of a request's columns, in C."""

from __future__ import annotations

from collections.abc import Sequence


def all_equal(items: Sequence[object]) -> bool:
    """Whether ``items`` is not empty and every item equals its first: for a list or a
    tuple one pass in C (``count`` compares by identity first). A request's messages
    mostly share one topic and one properties mapping (its shared trace context), and the
    writer, its metrics and the client each ask so of a request."""
    return bool(items) and items.count(items[0]) == len(items)
