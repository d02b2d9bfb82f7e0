"""Waits the store's writer makes before each table of a timed flush, so that its CPU lands in
the engines' idle time (runtime/in_flight.py). Each run registers its own wait for as long as it
runs; a flush waits at most `budget_s` in all, so the Live page's data is never more than that
later than the flush interval makes it. A flush or call asked of the writer while it waits is
answered after the wait (so within the budget too): the writer has one thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

QUIET_BUDGET_S = 0.25  # at most this much waiting per timed flush (the flush interval is 0.5 s)


class QuietWaits:
    def __init__(self, budget_s: float = QUIET_BUDGET_S) -> None:
        if not 0 <= budget_s <= 10:
            raise ValueError(f"budget_s={budget_s} must be in [0, 10] s")
        self.budget_s = budget_s
        self._waits: list[Callable[[float], bool]] = []
        self._lock = threading.Lock()

    def add(self, wait: Callable[[float], bool]) -> None:
        """`wait(timeout_s)` blocks until its run's engine is idle or the timeout passes."""
        with self._lock:
            self._waits.append(wait)

    def remove(self, wait: Callable[[float], bool]) -> None:
        with self._lock:
            if wait in self._waits:
                self._waits.remove(wait)

    def until(self, deadline: float) -> None:
        """The writer thread: wait for every registered run to be idle, until `deadline`."""
        with self._lock:
            waits = list(self._waits)
        for wait in waits:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            wait(left)

    def deadline(self) -> float:
        return time.monotonic() + self.budget_s

    def wait(self) -> None:
        """The writer thread: wait for every registered run to be idle, at most the budget."""
        self.until(self.deadline())
