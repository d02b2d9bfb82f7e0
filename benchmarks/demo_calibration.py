"""Calibration on real vLLM: how long it takes, the compute limit N_c it finds, the demo it
derives, and where N* discovery (AIMD on a windowed pool) converges relative to N_c.

    .venv/bin/python benchmarks/demo_calibration.py [--nstar-duration 40] [--engine vllm]

Each figure is printed as measured and written to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

from benchmarks.report import machine, write_section  # noqa: E402


def _p95(summary: "RunSummary") -> str:  # noqa: F821 - runtime imported in main
    """The run's p95: a number, or "> budget (censored)" when its rank is among unanswered
    frames (the summary's null with p95_censored)."""
    if summary.p95_censored:
        return "> budget (censored)"
    return f"{summary.p95_ms} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "twin"], default="vllm")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--nstar-duration", type=float, default=40.0)
    parser.add_argument("--session-s", type=float, default=8.0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from services import calibration
    from services import demo
    from services import experiments
    from runtime import RunConfig, execute
    from store import Store, queries

    store = Store(os.path.join(tempfile.mkdtemp(), "calibration.duckdb"))
    try:
        cal = calibration.calibrate(args.engine, args.model, store, progress=lambda f, t: print(
            f"[{f:4.0%}] {t}", flush=True))
        settings = demo.derive(cal)
        print(f"calibration: {cal.seconds:.1f} s, N_c = {cal.n_c} (cost-model estimate "
              f"{cal.n_c_estimate}), step a={cal.a_ms:.2f} ms b={cal.b_ms_per_token:.4f} ms/token "
              f"c={cal.c_ms_per_resident_token:.6f} ms/resident token (r² {cal.r2:.2f}, "
              f"{cal.n_steps} steps)", flush=True)
        print(f"demo: {settings.sessions} sessions, pool {settings.pool_blocks} blocks, "
              f"predicted t_sat {settings.predicted_t_sat_s:.2f} s of {settings.duration_s:g} s",
              flush=True)
        # N* discovery: twice N_c offered at once (rate × session length), so the cap must
        # come down to what the machine serves; the pool holds every offered window.
        offered = 2 * max(1, cal.n_c)
        rate = round(offered / args.session_s, 2)
        pool = 2 * offered * demo.window_blocks(cal.window_tokens, cal.sink_tokens,
                                                cal.block_size)
        base = RunConfig(engine=args.engine, model=args.model, arrival_rate=rate,
                         session_s=args.session_s, duration_s=args.nstar_duration,
                         pool_blocks=pool)
        (config,) = experiments.n_star(base, cal.window_tokens, cal.sink_tokens)
        t0 = time.monotonic()
        summary = execute(config, store)
        nstar_s = time.monotonic() - t0
        store.writer.flush()
        ticks = queries.tick_buckets(store.cursor(), summary.run_id, 1.0)
        n_star = experiments.converged_cap(ticks)
        ratio = None if n_star is None or not cal.n_c else n_star / cal.n_c
        print(f"N* discovery: {rate} sessions/s × {args.session_s:g} s, pool {pool}, "
              f"{args.nstar_duration:g} s: N* = {n_star}, N*/N_c = "
              f"{'—' if ratio is None else f'{ratio:.2f}'}, p95 {_p95(summary)}, "
              f"silent {summary.silent_rate}, rejected {summary.rejected} "
              f"({nstar_s:.0f} s with the engine start)", flush=True)
    finally:
        store.close()
    if args.no_write:
        return
    probes = "\n".join(f"| {n} | {'> budget' if p95 is None else f'{p95:.1f}'} | "
                       f"{silent:.1%} | {'yes' if ok else 'no'} |"
                       for n, p95, silent, ok, _frame_ms in cal.probes)
    body = f"""
Command: `.venv/bin/python benchmarks/demo_calibration.py --engine {args.engine} --nstar-duration {args.nstar_duration:g} --session-s {args.session_s:g}`
Machine: {machine()}; {args.engine}, {args.model} model, 80 ms frames of 16 tokens in / 4 out,
W = {cal.window_tokens}, fixed load (every session submits together), target p95 ≤
{cal.target_ms:.0f} ms (0.8 of the budget) and ≤ 1 % silent frames.

Calibration took **{cal.seconds:.1f} s** (engine start included) and found the compute limit
**N_c = {cal.n_c}** sessions (the fitted step cost's analytic estimate: {cal.n_c_estimate};
step = {cal.a_ms:.2f} ms + {cal.b_ms_per_token:.4f} ms/token + {cal.c_ms_per_resident_token:.6f}
ms/resident token, r² {cal.r2:.2f} over {cal.n_steps} steps). Probes ({len(cal.probes)}):

| sessions | p95 (ms) | silent | within target |
|---:|---:|---:|:---|
{probes}

Derived demo: {settings.sessions} sessions, pool {settings.pool_blocks} blocks, predicted
t_sat {settings.predicted_t_sat_s:.2f} s of an {settings.duration_s:g} s run.

N* discovery (AIMD, windowed; {rate} sessions/s × {args.session_s:g} s ≈ {offered} offered at
once, {args.nstar_duration:g} s): converged cap **N* = {n_star}**, **N*/N_c =
{'—' if ratio is None else f'{ratio:.2f}'}** (p95 {_p95(summary)}, silent
{summary.silent_rate}, {summary.rejected} rejected). The machine was shared with other
jobs (2 cores): N_c is what it served at that moment.
"""
    write_section(f"Demo calibration ({args.engine})", body)
    print(f"written: docs/BENCHMARKS.md § Demo calibration ({args.engine})")


if __name__ == "__main__":
    main()
