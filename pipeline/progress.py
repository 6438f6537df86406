"""Progress of a long job on stderr: each phase, and the tasks of the Spark stages running.

On a terminal the task count is rewritten in place; otherwise a line is printed when it
changes, at most every ``LINE_INTERVAL_S``. Spark's own progress bar stays off.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

POLL_INTERVAL_S = 0.5
LINE_INTERVAL_S = 5.0


class Progress:
    def __init__(self, spark: Any, *, label: str = "pipeline", enabled: bool = True, stream: TextIO | None = None):
        self.spark = spark
        self.label = label
        self.enabled = enabled
        self.stream = stream or sys.stderr

    def note(self, text: str) -> None:
        if self.enabled:
            self._write(f"{self.label}: {text}\n")

    @contextmanager
    def phase(self, text: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        started = time.monotonic()
        self._write(f"{self.label}: {text}...\n")
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(stop,), name="rmqstore-progress", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()
        self._write(f"{self.label}: {text}: done in {time.monotonic() - started:.1f} s\n")

    def _tasks(self) -> str:
        tracker = self.spark.sparkContext.statusTracker()
        parts = []
        for stage_id in sorted(tracker.getActiveStageIds()):
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                parts.append(f"{info.numCompletedTasks}/{info.numTasks} tasks")
        return ", ".join(parts)

    def _watch(self, stop: threading.Event) -> None:
        from py4j.protocol import Py4JError

        interactive = self.stream.isatty()
        last_text = ""
        last_line_at = 0.0
        while not stop.wait(POLL_INTERVAL_S):
            try:
                text = self._tasks()
            except Py4JError:  # the context is stopping: nothing left to report
                return
            if not text or text == last_text:
                continue
            now = time.monotonic()
            if interactive:
                self._write(f"\r  {text:<60}")
            elif now - last_line_at >= LINE_INTERVAL_S:
                self._write(f"  {text}\n")
                last_line_at = now
            last_text = text
        if interactive and last_text:
            self._write("\r" + " " * 62 + "\r")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
