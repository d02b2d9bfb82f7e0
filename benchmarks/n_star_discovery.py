"""N*/N_c measured in one run of the script: calibrate the compute limit N_c on the chosen
engine, then run AIMD against Poisson arrivals of sessions long enough to settle, and print N*
(the live count held at the target, control/nstar.py), N_c, their ratio, the silent share of
frames at the cap and the p95 (censored printed as "> budget").

    .venv/bin/python benchmarks/n_star_discovery.py --engine twin
    .venv/bin/python benchmarks/n_star_discovery.py --engine vllm --duration 120 --session-s 60
    .venv/bin/python benchmarks/n_star_discovery.py --engine vllm --steady-s 20 \
        --control-interval 3     # also N_c from 20 s fixed loads; 3 s control samples
    .venv/bin/python benchmarks/n_star_discovery.py --engine vllm --steady-s 20 --repeats 3
        # three whole runs and the medians of their figures

Prints only; the figures for docs/BENCHMARKS.md are copied from vLLM runs with the command.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "twin"], default="vllm")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--duration", type=float, default=120.0, help="N* run length (s)")
    parser.add_argument("--session-s", type=float, default=60.0,
                        help="session length (s): long, so live holds still at the cap")
    parser.add_argument("--offered", type=float, default=2.0,
                        help="sessions offered at once (rate × session length) per N_c")
    parser.add_argument("--open-budget", type=int, default=2, help="session opens per tick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--control-interval", type=float, default=None,
                        help="seconds per control sample (default: RunConfig's)")
    parser.add_argument("--steady-s", type=float, default=0.0,
                        help="also measure N_c steadily: fixed loads of this many seconds "
                             "each (bisected, one engine), judged from their 3rd second on "
                             "(0: off)")
    parser.add_argument("--control-window", type=float, default=None,
                        help="seconds of frames each control sample judges (default: "
                             "RunConfig's)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="whole runs (calibration, N*, steady N_c), seeds seed, seed+1, "
                             "…; prints each run's figures, then their medians")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    runs = []
    for k in range(args.repeats):
        if args.repeats > 1:
            print(f"=== run {k + 1} of {args.repeats} (seed {args.seed + k})", flush=True)
        runs.append(one_run(args, args.seed + k))
    if args.repeats > 1:
        print_medians(runs)


def print_medians(runs: list[dict]) -> None:
    """Each figure's median over the runs (a run where it is unknown is left out, and said)."""
    import statistics

    print(f"=== medians over {len(runs)} runs")
    for key, label in (("n_c", "calibrated N_c"), ("steady_n_c", "steady N_c"),
                       ("n_star", "N*"), ("ratio", "N*/N_c"),
                       ("steady_ratio", "N*/steady N_c"), ("silent_at_cap", "silent at the cap"),
                       ("silent_rate", "silent, whole run")):
        values = [r[key] for r in runs if r.get(key) is not None]
        shown = ", ".join("—" if r.get(key) is None else f"{r[key]:.4g}" for r in runs)
        median = f"{statistics.median(values):.4g}" if values else "—"
        print(f"{label}: median {median} (runs: {shown})")


def one_run(args, seed: int) -> dict:
    """Calibrate, (with --steady-s) measure the steady N_c, then run N* discovery; print the
    figures and return them."""
    from services import calibration
    from services import demo
    from runtime import RunConfig
    from store import Store

    store = Store(os.path.join(tempfile.mkdtemp(), "n_star.duckdb"))
    try:
        t0 = time.monotonic()
        cal = calibration.calibrate(args.engine, args.model, store, progress=lambda f, t: print(
            f"[{f:4.0%}] {t}", flush=True))
        print(f"calibration: N_c = {cal.n_c} (target {cal.target_ms:.0f} ms, "
              f"{cal.seconds:.1f} s)", flush=True)
        steady = None
        if args.steady_s > 0:  # before the N* runs, so the offer can be sized from it
            steady = steady_n_c(args, cal, store, start=max(2, cal.n_c))
            loads = ", ".join(f"{n}: {ok_share:.1%} ≤ target, {silent:.2%} silent"
                              for n, ok_share, silent in steady[1])
            print(f"steady N_c = {steady[0]} ({args.steady_s:g} s fixed loads: {loads})",
                  flush=True)
        # More sessions offered than N_c can hold at once, so the cap (not the offer) binds,
        # N_c the larger of the two measures (a calibration that errs low must not cap N*);
        # the pool holds every offered window twice over, so memory never decides.
        offered = args.offered * max(1, cal.n_c, steady[0] if steady else 0)
        rate = round(offered / args.session_s, 3)
        pool = int(2 * offered * demo.window_blocks(cal.window_tokens, cal.sink_tokens,
                                                    cal.block_size)) + 1
        base = RunConfig(engine=args.engine, model=args.model, arrival_rate=rate,
                         session_s=args.session_s, duration_s=args.duration, pool_blocks=pool,
                         # N_c holds at the calibration's period (80 ms, or longer on a slow CPU)
                         frame_ms=cal.frame_ms, tokens_in=cal.tokens_in,
                         tokens_out=cal.tokens_out, block_size=cal.block_size,
                         target=calibration.TARGET_FRACTION, open_budget=args.open_budget,
                         seed=seed, **({} if args.control_interval is None else
                                       {"control_interval_s": args.control_interval}),
                         **({} if args.control_window is None else
                            {"control_window_s": args.control_window}))
        result = n_star_run(args, cal, store, base, steady)
    finally:
        store.close()
    print(f"{time.monotonic() - t0:.0f} s in all", flush=True)
    return result


def n_star_run(args, cal, store, base, steady) -> dict:
    """One N* discovery run on `base`'s offer; its figures printed and returned."""
    from services import calibration
    from services import experiments
    from runtime import execute

    (config,) = experiments.n_star(base, cal.window_tokens, cal.sink_tokens)
    summary = execute(config, store)
    store.writer.flush()
    cur = store.cursor()
    rep = experiments.n_star_report(summary, cal.n_c, experiments.silent_at_cap(cur, summary))
    # What the controller held after the climb (the last two thirds of the run): the live
    # range, and how far single intervals' p95 strayed from the target there.
    after = cur.execute(
        "SELECT min(live), max(live), max(limit_sessions), quantile_cont(p95_ms, 0.05), "
        "quantile_cont(p95_ms, 0.95), count(*) FILTER (WHERE p95_ms > ?) / count(*) "
        "FROM ticks WHERE run_id = ? AND t >= ? AND p95_ms IS NOT NULL",
        [calibration.TARGET_FRACTION * cal.frame_ms, summary["run_id"],
         args.duration / 3]).fetchone()
    held = ("never settled at the target" if rep["n_star"] is None else
            f"from {rep['n_star_at_s']:.1f} s for {rep['n_star_for_s']:.1f} s")
    silent = "—" if rep["silent_at_cap"] is None else f"{rep['silent_at_cap']:.2%}"
    print(f"N* discovery ({args.engine}): "
          f"Poisson {config.arrival_rate}/s × {args.session_s:g} s sessions, "
          f"{args.duration:g} s, pool {config.pool_blocks}, open budget {args.open_budget}, "
          f"control interval {config.control_interval_s:g} s, window "
          f"{summary['control_window_s']:g} s")
    print(f"N* = {rep['n_star'] if rep['n_star'] is not None else '—'} ({held})")
    print(f"N_c = {rep['n_c']}")
    ratio = "—" if rep["ratio"] is None else f"{rep['ratio']:.2f}"
    print(f"N*/N_c = {ratio}")
    print(f"silent frames at the cap = {silent} (whole run {rep['silent_rate']})")
    if after[0] is not None:
        print(f"after the climb: live {after[0]}–{after[1]} (cap ≤ {after[2]}); interval p95 "
              f"{after[3]:.0f}–{after[4]:.0f} ms (5th–95th) against the "
              f"{calibration.TARGET_FRACTION * cal.frame_ms:.0f} ms target, "
              f"{after[5]:.0%} of ticks over it")
    result = {**rep, "steady_n_c": None, "steady_ratio": None}
    if steady is not None:
        result["steady_n_c"] = steady[0]
        result["steady_ratio"] = None if rep["n_star"] is None or not steady[0] else \
            round(rep["n_star"] / steady[0], 2)
        ratio = "—" if result["steady_ratio"] is None else f"{result['steady_ratio']:.2f}"
        print(f"N*/steady N_c = {ratio}")
    print(f"p95 = {rep['p95'] or '—'}; final cap {summary['final_limit']}, admitted "
          f"{rep['admitted']}, rejected {rep['rejected']}, opens deferred "
          f"{summary['opens_deferred']}", flush=True)
    return result


def steady_n_c(args, cal, store, start: int) -> tuple[int, list]:
    """The largest fixed load whose frames from the 3rd second on are ≥ 95 % within the target
    (a censored p95 ≤ target) with ≤ 1 % silent: the calibration's rule, on runs as long as the
    stretch N* is judged over instead of 3-second probes. From `start`, doubled until a load
    fails (a calibration that erred low must not cap it), then bisected, on one engine."""
    from services import calibration
    from control.window import MAX_SILENT_SHARE
    from runtime import execute, make_engine

    target_ms = calibration.TARGET_FRACTION * cal.frame_ms
    base = replace(calibration.probe_base(args.engine, args.model, args.steady_s),
                   frame_ms=cal.frame_ms)
    engine = make_engine(base, store)
    probes, best, hi, n = [], 0, None, start
    try:
        execute(replace(base, sessions=1, duration_s=1.0), store, engine)  # warm-up, discarded
        while n is not None:
            summary = execute(replace(base, sessions=n), store, engine)
            store.writer.flush()
            ok_share, silent = store.cursor().execute(
                "SELECT avg(CASE WHEN NOT silent AND latency_ms <= ? THEN 1.0 ELSE 0.0 END), "
                "avg(CASE WHEN silent THEN 1.0 ELSE 0.0 END) FROM frames "
                "WHERE run_id = ? AND t_submit >= 3.0", [target_ms, summary["run_id"]]
            ).fetchone()
            served = ok_share is not None and ok_share >= 0.95 and silent <= MAX_SILENT_SHARE
            if ok_share is None:  # no frame after the 3rd second: unknown, so not served
                print(f"steady probe: {n} sessions, no frames to judge", flush=True)
            else:
                probes.append((n, ok_share, silent))
                print(f"steady probe: {n} sessions, {ok_share:.1%} within {target_ms:.0f} ms, "
                      f"{silent:.2%} silent", flush=True)
            if served:
                best = n
            else:
                hi = n
            if hi is None:
                n = min(2 * n, calibration.N_MAX) if n < calibration.N_MAX else None
            else:
                n = (best + hi) // 2 if hi - best > 1 else None
    finally:
        engine.shutdown()
    return best, sorted(probes)


if __name__ == "__main__":
    main()
