"""How a node's process is told to stop, and what ends it when its stop stalls.

SIGTERM (the orchestrator) and SIGINT (Ctrl-C) set one event; the main thread waits for
it and then stops the node under a watchdog."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading

# The exit code of a node whose stop did not finish in time (every thread's stack written
# to stderr); the command line's exit table (cli/exits.py) lists it.
EXIT_STOP_STALLED = 4

# The kernel hands a process's signal to any of its threads that does not block it (grpc's,
# the flusher), and CPython runs the Python handler only in the main thread, the next time
# that thread runs Python. A main thread blocked in an untimed wait would never run it, so
# it waits in slices this long.
STOP_POLL_S = 0.2


def stop_requested() -> threading.Event:
    """An event that SIGTERM and SIGINT set (their handlers are installed here; the main
    thread only)."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    return stopping


def wait_for_stop(stopping: threading.Event) -> None:
    """Block until ``stopping`` is set, running due signal handlers meanwhile."""
    while not stopping.wait(STOP_POLL_S):
        pass


def stop_watchdog(service: str, within_s: float) -> threading.Timer:
    """Armed once a node is told to stop: if the process is still running ``within_s``
    later, its stop has stalled somewhere (a thread that never returns). Then it says so
    in a log line, writes every thread's stack to stderr (where it stalled, for the
    report) and ends the process with :data:`EXIT_STOP_STALLED`, rather than wait for the
    orchestrator's SIGKILL. A writer ended this way loses nothing acknowledged
    (docs/writer.md); its next start runs a longer recovery. The caller cancels it once
    its stop has finished (the process may go on)."""

    def stalled() -> None:
        logging.getLogger("rmqstore.stop").error(
            "the %s did not stop within %g s of being told to: every thread's stack follows; exiting with %d",
            service, within_s, EXIT_STOP_STALLED,
        )  # fmt: skip
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(EXIT_STOP_STALLED)

    timer = threading.Timer(within_s, stalled)
    timer.name = "stop-watchdog"
    timer.daemon = True
    timer.start()
    return timer
