"""The compiled fast paths (``speedups_c/``), or None where the extension is missing.

Every install of the project builds the extension. Without it (a source tree that was
never installed, or ``RMQSTORE_PURE_PYTHON=1`` for a comparison) the codecs run their
Python definitions, which give the same results more slowly."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_speedups: ModuleType | None
if os.environ.get("RMQSTORE_PURE_PYTHON") == "1":
    _speedups = None
else:
    try:
        _speedups = importlib.import_module("rmqstore.common.codec._speedups")
    except ImportError:
        _speedups = None
