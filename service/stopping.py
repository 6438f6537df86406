"""How a node's process is told to stop, and what ends it when its stop stalls.

SIGTERM (the orchestrator) and SIGINT (Ctrl-C) set one stop request; the main thread
waits for it and then stops the node under a watchdog."""

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


class StopRequest:
    """Set once SIGTERM or SIGINT arrives; the main thread waits for it.

    A handler runs in the main thread between any two of its bytecodes, so it takes no
    lock: a ``threading.Event``'s ``set()`` takes the event's own lock, which the main
    thread holds for a moment inside each ``wait()``, and a signal in that moment left the
    handler waiting for itself and the node never stopping (benchmarks/CI.md, "Ninth
    round"). The handler sets a flag and releases a lock the main thread waits to take
    again; neither blocks."""

    def __init__(self) -> None:
        self.requested = False
        self._wake = threading.Lock()
        self._wake.acquire()

    def request(self, *_: object) -> None:
        """The signal handler."""
        self.requested = True
        try:
            self._wake.release()
        except RuntimeError:
            pass  # released already, by an earlier signal's handler

    def wait(self) -> None:
        """Block until requested, running due signal handlers meanwhile."""
        while not self.requested:
            self._wake.acquire(timeout=STOP_POLL_S)


def stop_requested() -> StopRequest:
    """A stop request that SIGTERM and SIGINT make (their handlers are installed here; the
    main thread only)."""
    stopping = StopRequest()
    signal.signal(signal.SIGTERM, stopping.request)
    signal.signal(signal.SIGINT, stopping.request)
    return stopping


def wait_for_stop(stopping: StopRequest) -> None:
    """Block until ``stopping`` is requested, running due signal handlers meanwhile."""
    stopping.wait()


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
