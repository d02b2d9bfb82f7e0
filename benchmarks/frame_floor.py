"""The floor under a frame, and how close Metronome's frame path gets to it (issues 25, 39).

One vLLM engine (the tiny model, this machine's dtype, the backend's own engine arguments) is
started once; then, `--runs` times, at each load of `--sessions`: the raw driver, then
Metronome in each `--modes` (benchmarks/floor_drivers.py: full, nostore, notick, bare),
interleaved, so a ratio compares neighbours in time on a machine whose load moves.

Frame latency is from when the frame was due (its tick plus its session's phase) to its last
token, for both drivers (`--clock due`); `--clock submit` times each from its own submit stamp
instead, which hides raw's wait behind the other sessions' chunks (floor_drivers.CLOCKS).
Printed: one line per run and load, then per load and mode the medians over the runs of p50
and p95 and of the per-run ratios to raw (a ratio pairs a run with the raw run just before
it), the silent share, and whether raw kept the budget (p95 ≤ budget) where Metronome did
not. Every figure docs/BENCHMARKS.md quotes is printed here. `--profile N` then samples this
process with py-spy (GIL holders by thread, benchmarks/floor_profile.py) at N sessions, raw
and each mode.

The raw driver's sessions are due when Metronome's are: all at the tick (`--phase tick`,
Metronome's default) or phased over the period (`--phase stagger`, RunConfig.stagger). Until
2026-12-07 (seventh session) raw's were due 1 ms apart, a load Metronome never offers;
`--raw-phases 1ms` runs that driver beside the others.

    .venv/bin/python benchmarks/frame_floor.py [--duration 6] [--runs 3] [--sessions 1 2 4 8]
        [--modes full] [--frame-ms 80] [--phase tick|stagger] [--clock due|submit]
        [--raw-phases 1ms]
        [--bind auto|0-1|nobind] [--profile 4]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from floor_drivers import (CLOCKS, MODES, PHASES, StepTap,  # noqa: E402
                           metronome_frames, pct, raw_frames, spread_ms)


def start(frame_ms: float, duration_s: float, dtype: str | None, bind: str | None,
          stagger: bool = False):
    """(engine, base RunConfig, store) for a floor benchmark: the run defaults, unbounded."""
    if bind:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from runtime import RunConfig, make_engine
    from store import Store

    from engine.config import parse_vllm_args

    base = RunConfig(engine="vllm", model="tiny", policy="unbounded", pool_blocks=1024,
                     frame_ms=frame_ms, duration_s=duration_s, load="fixed", sessions=1,
                     stagger=stagger,
                     vllm_args=parse_vllm_args([f"dtype={dtype}"] if dtype else []))
    engine = make_engine(base)
    store = Store(os.path.join(tempfile.mkdtemp(), "floor.duckdb"))
    return engine, base, store


def machine_line(engine) -> str:
    load = os.getloadavg()
    return (f"vLLM {engine.dtype} ({engine.dtype_reason}); VLLM_CPU_OMP_THREADS_BIND="
            f"{os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')}; load average "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")


def _ms(x: float, budget: float) -> str:
    return "> budget" if math.isinf(x) or x >= 10 * budget else f"{x:.1f}"


def _ratio(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b):
        return 1.0
    return math.inf if b == 0 or math.isinf(a) else a / b


def measure(engine, base, store, sessions, modes, runs: int, out=print,
            raw_phases: tuple[str, ...] = (), clock: str = "due") -> list[dict]:
    """One row per run, load and driver: p50, p95, silent share, and (Metronome) rows lost.
    The raw driver's sessions are due when Metronome's are (`base.stagger`: floor_drivers
    .phase_s); each of `raw_phases` adds a raw driver `raw@PHASE` with its sessions due at
    that phase instead."""
    rows = []
    phase = "stagger" if base.stagger else "tick"
    for run in range(runs):
        for n in sessions:
            for raw_phase in (phase, *raw_phases):
                sent: dict = {}
                lags: list[float] = []
                with StepTap(engine) as tap:
                    raw = raw_frames(engine, n, base.frame_ms, base.duration_s,
                                     base.tokens_in, base.tokens_out, sent=sent,
                                     phase=raw_phase, clock=clock, lags=lags)
                rows.append({"run": run, "sessions": n,
                             "driver": "raw" if raw_phase == phase else f"raw@{raw_phase}",
                             "p50": pct(raw, 0.5), "p95": pct(raw, 0.95),
                             "silent": sum(math.isinf(x) for x in raw) / max(1, len(raw)),
                             "skipped": 0.0, "spread_ms": spread_ms(sent),
                             "lag_ms": pct(lags, 0.5),
                             **tap.per_period(base.frame_ms, base.duration_s)})
            for mode in modes:
                sent, lags = {}, []
                with StepTap(engine) as tap:
                    ours, summary, skipped = metronome_frames(
                        engine, replace(base, sessions=n), store, mode, sent=sent,
                        clock=clock, lags=lags)
                rows.append({"run": run, "sessions": n, "driver": mode, "p50": pct(ours, 0.5),
                             "p95": pct(ours, 0.95), "silent": summary.silent_rate or 0.0,
                             "skipped": skipped, "rows_lost": summary.rows_lost,
                             "spread_ms": spread_ms(sent), "lag_ms": pct(lags, 0.5),
                             **tap.per_period(base.frame_ms, base.duration_s)})
            line = " · ".join(f"{r['driver']} {_ms(r['p50'], base.budget)}/"
                              f"{_ms(r['p95'], base.budget)}"
                              for r in rows if r["run"] == run and r["sessions"] == n)
            steps = " · ".join(f"{r['driver']} {r['lag_ms']:.2f}/{r['spread_ms']:.1f}/"
                               f"{r['steps_per_period']:.2f}/"
                               f"{r['step_ms_p50']:.1f}/{r['gen_per_step']:.2f}/"
                               f"{r['first_step_requests']:g}"
                               for r in rows if r["run"] == run and r["sessions"] == n)
            out(f"run {run + 1} · {n} sessions · p50/p95 ms: {line} · load "
                f"{os.getloadavg()[0]:.2f}")
            out(f"    due to submit ms p50 / submit spread ms p50 / engine steps per period "
                f"/ step ms p50 / decoding requests per step / requests in a step after "
                f"idle, p50: {steps}")
    return rows


def table(rows: list[dict], budget: float, out=print) -> dict:
    """Medians over the runs per load and mode; returns the overall medians of the ratios."""
    out("| sessions | driver | p50 (ms) | p95 (ms) | p50 ratio | p95 ratio | silent (skipped) "
        "| raw in budget, this not | rows lost |")
    out("|---|---|---|---|---|---|---|---|---|")
    drivers = list(dict.fromkeys(r["driver"] for r in rows))
    ratios: dict = {d: {"p50": [], "p95": []} for d in drivers if d != "raw"}
    for n in sorted({r["sessions"] for r in rows}):
        raw = {r["run"]: r for r in rows if r["sessions"] == n and r["driver"] == "raw"}
        for driver in drivers:
            mine = [r for r in rows if r["sessions"] == n and r["driver"] == driver]
            p50 = statistics.median(r["p50"] for r in mine)
            p95 = statistics.median(r["p95"] for r in mine)
            silent = statistics.median(r["silent"] for r in mine)
            if driver == "raw":  # the runs' reference; a raw@PHASE driver gets ratios
                out(f"| {n} | {driver} | {_ms(p50, budget)} | {_ms(p95, budget)} | | | "
                    f"{silent:.1%} | | |")
                continue
            r50 = statistics.median(_ratio(r["p50"], raw[r["run"]]["p50"]) for r in mine)
            r95 = statistics.median(_ratio(r["p95"], raw[r["run"]]["p95"]) for r in mine)
            ratios[driver]["p50"].append(r50)
            ratios[driver]["p95"].append(r95)
            miss = sum(raw[r["run"]]["p95"] <= budget < r["p95"] for r in mine)
            skipped = statistics.median(r["skipped"] for r in mine)
            # Raw has no store; nostore and bare drop their bulk rows before the writer by
            # design, so a count of rows lost would say nothing of what they never kept.
            lost = sum(r["rows_lost"] for r in mine) if driver in MODES and driver not in (
                "nostore", "bare") else "–"
            out(f"| {n} | {driver} | {_ms(p50, budget)} | {_ms(p95, budget)} | {r50:.2f} "
                f"| {r95:.2f} | {silent:.1%} ({skipped:.1%}) | {miss} of {len(mine)} runs "
                f"| {lost} |")
    overall = {d: {q: round(statistics.median(v), 3) for q, v in r.items() if v}
               for d, r in ratios.items()}
    for driver, r in overall.items():
        out(f"{driver}: median over loads of the median ratios: p50 {r.get('p50')} · "
            f"p95 {r.get('p95')}")
    return overall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frame-ms", type=float, default=80.0)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--modes", nargs="+", default=["full"], choices=MODES)
    parser.add_argument("--phase", default="tick", choices=("tick", "stagger"),
                        help="when each session's frames are due, for raw and Metronome "
                        "alike: all at the tick (Metronome's default) or phased over the "
                        "period (--stagger)")
    parser.add_argument("--clock", default="due", choices=CLOCKS,
                        help="where a frame's latency starts: when it was due (both drivers "
                        "alike) or each driver's own submit stamp (the reading before "
                        "2026-12-07's seventh session)")
    parser.add_argument("--raw-phases", nargs="*", default=[], choices=PHASES,
                        help="also run the raw driver with its sessions due at these phases "
                        "(e.g. 1ms, the old driver's 1 ms apart), ratio to raw printed")
    parser.add_argument("--dtype", default=None, help="force vLLM's dtype (default: "
                        "engine/dtype.py's choice for this machine)")
    parser.add_argument("--bind", default=None,
                        help="VLLM_CPU_OMP_THREADS_BIND for the engine (default: vLLM's auto)")
    parser.add_argument("--profile", type=int, default=None, metavar="SESSIONS",
                        help="then sample this process with py-spy at this load")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    engine, base, store = start(args.frame_ms, args.duration, args.dtype, args.bind,
                                args.phase == "stagger")
    print(f"{machine_line(engine)}; {args.frame_ms:g} ms frames, {base.tokens_in} in / "
          f"{base.tokens_out} out, {args.duration:g} s per run, {args.runs} run(s) "
          f"interleaved; sessions due at phase {args.phase}; latency from {args.clock}",
          flush=True)
    try:
        raw_frames(engine, 1, args.frame_ms, 1.0, base.tokens_in, base.tokens_out)  # warm-up
        rows = measure(engine, base, store, args.sessions, args.modes, args.runs,
                       out=lambda s: print(s, flush=True),
                       raw_phases=tuple(p for p in args.raw_phases if p != args.phase),
                       clock=args.clock)
        overall = table(rows, base.budget)
        print(f"after: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": rows, "ratios": overall},
                                                  default=str, indent=1))
        if args.profile:
            from floor_profile import profile_phases

            print(json.dumps(profile_phases(engine, base, store, args.profile, args.modes),
                             indent=1))
    finally:
        engine.shutdown()
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
