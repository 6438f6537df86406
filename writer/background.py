"""Background work of a running writer: the ASYNC flush, the thorough flush of queues and
index, and retention. Each is a small periodic task on its own thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

LOG = logging.getLogger("rmqstore.writer")


class PeriodicTask:
    """Call ``action`` every ``interval_ms`` until stopped. A failure is logged with its
    traceback and the task keeps its schedule: one bad run must not stop flushing."""

    def __init__(self, name: str, interval_ms: int, action: Callable[[], object]):
        self.name = name
        self.interval_s = interval_ms / 1000
        self.action = action
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> PeriodicTask:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.action()
            except Exception:
                self.failures += 1
                LOG.exception("%s failed", self.name)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
