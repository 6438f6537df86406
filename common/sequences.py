"""What the batch paths ask of a column of values (a request's topics, a scan's): one pass
each, in C where Python offers one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def all_equal(items: Sequence[object]) -> bool:
    """Whether ``items`` is not empty and every item equals its first: for a list or a
    tuple one pass in C (``count`` compares by identity first). A request's messages
    mostly share one topic and one properties mapping (its shared trace context), and the
    writer, its metrics and the client each ask so of a request."""
    return bool(items) and items.count(items[0]) == len(items)


def numbered(items: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct items in order of first appearance, and each item's number among them
    (int64): a column of few distinct values (a batch's topics) as a dictionary coding.
    numpy is imported here, not with the module: the command line asks all_equal without
    loading it."""
    import numpy as np

    numbers = {item: number for number, item in enumerate(dict.fromkeys(items))}
    return list(numbers), np.fromiter(map(numbers.__getitem__, items), dtype=np.int64, count=len(items))
