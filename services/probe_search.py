"""Where a calibration probes next: the bracket of the loads probed so far, and the next load
(up from the best within target, then bisecting) until the bracket is within 10 %."""

from __future__ import annotations

import math

N_MAX = 128  # the calibration pool holds this many windowed sessions


def bracket(probes: dict[int, tuple]) -> tuple[int, int | None]:
    """(largest load within target, smallest load over it above that; None: none yet)."""
    lo = max((n for n, p in probes.items() if p[3]), default=0)
    hi = min((n for n, p in probes.items() if not p[3] and n > lo), default=None)
    return lo, hi


def next_probe(lo: int, hi: int | None, estimate: int, probes: dict) -> int | None:
    """Up from the best load within target (to the estimate first, then ×1.5) until one is
    over; then bisect until the bracket is within 10 % of lo. None: done."""
    if hi is None:
        if lo >= N_MAX:
            return None
        n = estimate if estimate > lo else math.ceil(lo * 1.5)
        n = min(N_MAX, max(lo + 1, n))
    else:
        if hi - lo <= max(1, round(0.1 * lo)):
            return None
        n = (lo + hi) // 2 if lo else max(1, min(estimate, hi - 1) if estimate < hi
                                          else hi // 2)
    return None if n in probes else n
