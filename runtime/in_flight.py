"""The frames a run has handed to the engine and not yet seen done, and a wait for a moment with
none: the store's writer spends its flush in the engine's idle time rather than under a frame.

Why: at one session of 80 ms frames the engine is idle for the last ~20 ms of each period, and
a flush (tens of ms of CPU and DuckDB on the cores the engine computes on) that lands under a
frame pushed it past its budget (issue 39: benchmarks/frame_floor.py, full against nostore).
The wait is bounded by its caller: under load there is no idle moment and the flush goes ahead.
"""

from __future__ import annotations

import threading
import time

from engine.contract import FrameHandle

PRUNE_AT = 64  # handles kept before the done ones are dropped on the next add


class InFlight:
    def __init__(self) -> None:
        self._handles: list[FrameHandle] = []
        self._lock = threading.Lock()

    def add(self, handle: FrameHandle) -> None:
        """The run thread: `handle` was just submitted."""
        with self._lock:
            if len(self._handles) >= PRUNE_AT:
                self._handles = [h for h in self._handles if h.t_done is None]
            self._handles.append(handle)

    def pending(self) -> list[FrameHandle]:
        with self._lock:
            self._handles = [h for h in self._handles if h.t_done is None]
            return list(self._handles)

    def wait_idle(self, timeout_s: float) -> bool:
        """Any thread: block until no frame is in flight (True) or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while True:
            pending = self.pending()
            if not pending:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            pending[0].wait(left)
