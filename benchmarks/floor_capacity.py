"""Capacity, not only latency (issue 39): the compute limit N_c found with the raw driver and
with Metronome's frame path on the same engine, side by side, at 80 and 160 ms frames.

N_c is the calibration's (services/calibration.py): the most sessions at which frame p95 stays
within TARGET_FRACTION (0.8) of the budget with at most MAX_SILENT_SHARE (1 %) of frames
silent, on the calibration's windowed engine (W=128, S=0, 32-token blocks: memory never
limits it) with its frame (16 in / 4 out). Loads are probed up a ladder (1, 2, 3, … 8, then
+25 %), each load once per driver back to back (raw first), until both drivers have failed
twice in a row; a driver's N_c is the largest load below its first failure that passed.
Then each N_c and the load above it are probed again (`--confirms` times, interleaved), and a
load counts as passing when it passed in most of its probes. The table also gives each
driver's count load by load: the largest load up to which every load probed passed in most
of its probes (a first failure whose confirms passed does not end it). Frame latency and
silence as in benchmarks/floor_drivers.py: from when each frame was due, every session's due
at the tick, for both drivers (a frame with no answer, or never submitted, is silent).

    .venv/bin/python benchmarks/floor_capacity.py [--periods 80 160] [--probe-s 4]
        [--confirms 2] [--max-sessions 64]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from floor_drivers import metronome_frames, pct, raw_frames  # noqa: E402

TARGET_FRACTION = 0.8  # services/calibration.py's: N_c is where p95 reaches 0.8 x budget
DRIVERS = ("raw", "metronome")


def ladder(n: int) -> int:
    return n + 1 if n < 8 else max(n + 1, math.ceil(n * 1.25))


class Probes:
    """Every probe of one engine, by (driver, frame_ms, sessions): a list of (p95, silent, ok)."""

    def __init__(self, engine, base, store, probe_s: float) -> None:
        self.engine, self.base, self.store, self.probe_s = engine, base, store, probe_s
        self.seen: dict = {}

    def probe(self, driver: str, frame_ms: float, n: int) -> bool:
        from control.window import MAX_SILENT_SHARE

        config = replace(self.base, sessions=n, frame_ms=frame_ms, duration_s=self.probe_s)
        if driver == "raw":  # silent as Metronome counts it: no token by the deadline
            first: list[float] = []
            ms = raw_frames(self.engine, n, frame_ms, self.probe_s, config.tokens_in,
                            config.tokens_out, first)
            silent = sum(x > config.budget for x in first) / max(1, len(first))
        else:
            ms, summary, skipped = metronome_frames(self.engine, config, self.store, "full")
            # No frame recorded: its silence is unknown, and the probe cannot pass on it.
            silent = 1.0 if summary.silent_rate is None else float(summary.silent_rate)
            print(f"  (metronome skipped {skipped:.1%} of its frames: the "
                  "previous one still owed)", flush=True)
        p95 = pct(ms, 0.95)
        ok = p95 <= TARGET_FRACTION * config.budget and silent <= MAX_SILENT_SHARE
        self.seen.setdefault((driver, frame_ms, n), []).append(
            (None if math.isinf(p95) else round(p95, 1), round(silent, 4), ok))
        print(f"{frame_ms:g} ms · {n} sessions · {driver}: p95 "
              f"{'> budget' if math.isinf(p95) else f'{p95:.1f} ms'}, silent {silent:.1%} → "
              f"{'pass' if ok else 'over'} (load {os.getloadavg()[0]:.2f})", flush=True)
        return ok

    def passes(self, driver: str, frame_ms: float, n: int) -> bool:
        results = self.seen[(driver, frame_ms, n)]
        return sum(ok for _, _, ok in results) * 2 > len(results)


def n_c(probes: Probes, frame_ms: float, max_n: int, confirms: int) -> dict:
    """N_c per driver at this period (see the module's doc)."""
    fails = dict.fromkeys(DRIVERS, 0)
    first_fail: dict = dict.fromkeys(DRIVERS)
    n = 1
    while n <= max_n and any(fails[d] < 2 for d in DRIVERS):
        for driver in DRIVERS:
            if fails[driver] >= 2:
                continue
            if probes.probe(driver, frame_ms, n):
                fails[driver] = 0
            else:
                fails[driver] += 1
                first_fail[driver] = first_fail[driver] or n
        n = ladder(n)
    found = {}
    for driver in DRIVERS:
        passed = [m for (d, f, m) in probes.seen if d == driver and f == frame_ms
                  and probes.passes(d, f, m) and (first_fail[driver] is None
                                                  or m < first_fail[driver])]
        found[driver] = max(passed, default=0)
    for _ in range(confirms):  # the limit and the load above it, again, interleaved
        for m in sorted({x for v in found.values() for x in (v, ladder(v)) if 0 < x <= max_n}):
            for driver in DRIVERS:
                probes.probe(driver, frame_ms, m)
    for driver in DRIVERS:  # a limit that fails its confirms moves down
        m = found[driver]
        while m > 0 and not probes.passes(driver, frame_ms, m):
            m = max([x for (d, f, x) in probes.seen if d == driver and f == frame_ms
                     and x < m and probes.passes(d, f, x)], default=0)
        found[driver] = m
    return found


def load_by_load(probes: Probes, driver: str, frame_ms: float) -> int:
    """The largest load L such that every load probed up to L passed in most of its probes:
    one failed probe does not end the count where its confirms passed."""
    best = 0
    for m in sorted(x for (d, f, x) in probes.seen if d == driver and f == frame_ms):
        if not probes.passes(driver, frame_ms, m):
            break
        best = m
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--periods", type=float, nargs="+", default=[80.0, 160.0])
    ap.add_argument("--probe-s", type=float, default=4.0)
    ap.add_argument("--confirms", type=int, default=2)
    ap.add_argument("--max-sessions", type=int, default=64)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from runtime import RunConfig, make_engine
    from store import Store

    # services/calibration.py's probe engine: windowed, so memory never limits a load.
    base = RunConfig(engine="vllm", model="tiny", policy="window", window=128, sinks=0,
                     block_size=32, pool_blocks=128 * (128 // 32 + 2), frame_ms=80.0,
                     tokens_in=16, tokens_out=4, load="fixed", duration_s=args.probe_s)
    engine = make_engine(base)
    store = Store(os.path.join(tempfile.mkdtemp(), "capacity.duckdb"))
    load = os.getloadavg()
    print(f"vLLM {engine.dtype}; {os.cpu_count()} CPUs; load average {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f}; probes of {args.probe_s:g} s", flush=True)
    result = {}
    try:
        raw_frames(engine, 1, 80.0, 1.0, base.tokens_in, base.tokens_out)  # warm-up
        probes = Probes(engine, base, store, args.probe_s)
        for frame_ms in args.periods:
            result[frame_ms] = n_c(probes, frame_ms, args.max_sessions, args.confirms)
    finally:
        engine.shutdown()
        store.close()
    print("| frame | N_c raw | N_c Metronome | load by load: raw | load by load: Metronome |"
          "\n|---|---|---|---|---|")
    for frame_ms, found in result.items():
        print(f"| {frame_ms:g} ms | {found['raw']} | {found['metronome']} | "
              f"{load_by_load(probes, 'raw', frame_ms)} | "
              f"{load_by_load(probes, 'metronome', frame_ms)} |")
    print(f"after: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps({f"{k[0]} {k[1]:g} ms {k[2]}": v for k, v in probes.seen.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
