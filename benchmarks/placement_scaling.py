"""Placement across data-parallel ranks on the twin: vLLM's own balancer (engine), fewest
sessions (count) and headroom, at 2, 8 and 64 ranks under the same per-rank load.

Each rank has its own pool; sessions arrive as a Poisson stream (`--rate-per-rank` sessions/s
per rank, so the load per rank is the same at every scale) with exponential lengths (mean
`--mean-s`, at least 0.4 s): most are short, a few are long, and a long one holds KV that grows
for its whole life. Unbounded KV, the twin's default cost model, one trace per seed shared by
the three placements, no admission cap. Prints, per ranks and placement: runs with a stalled rank, ranks that
stalled (mean per run), the silent share of all frames, the first stall's time (median over the
runs that stalled), and the highest engine-wide occupancy (mean over runs).

    .venv/bin/python benchmarks/placement_scaling.py [--ranks 2 8 64] [--seeds 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PLACEMENTS = ("engine", "count", "headroom")
HEADER = "session_id,start_s,end_s,tokens_in,tokens_out\n"


def poisson_trace(path: str, rate_per_s: float, mean_s: float, duration_s: float,
                  seed: int, min_s: float = 0.4) -> int:
    """A CSV trace (load replay): Poisson arrivals, exponential lengths. Returns sessions."""
    rng = random.Random(seed)
    t, rows = 0.0, []
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            break
        rows.append((t, t + max(min_s, rng.expovariate(1 / mean_s))))
    with open(path, "w") as f:
        f.write(HEADER + "".join(f"{i},{a:.4f},{b:.4f},16,4\n" for i, (a, b) in enumerate(rows)))
    return len(rows)


def skew_trace(path) -> str:
    """Two ranks of 64 blocks, 10 s: a long session A (0–7.5 s), a stream of short ones
    (0.5 s, one at a time), two shorts overlapping at 4.85 s, then a second long session C
    (5–10 s). Counting sessions puts C beside A, on the rank A has half filled, which then
    stalls while the other rank holds only shorts (the engine-wide pool reads under 0.6);
    headroom puts C on the other rank."""
    rows = [(0.0, 7.5), (0.01, 0.51)]
    rows += [(0.01 + 0.7 * j, 0.51 + 0.7 * j) for j in range(1, 7)]
    rows += [(4.85, 5.35), (4.9, 5.4), (5.0, 10.0)]
    rows += [(5.6 + 0.7 * j, 6.1 + 0.7 * j) for j in range(6)]
    with open(path, "w") as f:
        f.write(HEADER + "".join(f"{i},{a},{b},16,4\n" for i, (a, b) in enumerate(rows)))
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8, 64])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rate-per-rank", type=float, default=1.5)
    parser.add_argument("--mean-s", type=float, default=3.0)
    parser.add_argument("--pool-blocks", type=int, default=256, help="per rank")
    parser.add_argument("--duration-s", type=float, default=30.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    from runtime import RunConfig, execute
    from store import Store
    from store.queries import occupancy

    folder = tempfile.mkdtemp()
    store = Store(os.path.join(folder, "placement.duckdb"))
    print(f"twin, unbounded KV, {args.pool_blocks} blocks per rank, Poisson "
          f"{args.rate_per_rank:g} sessions/s per rank, exponential lengths mean "
          f"{args.mean_s:g} s, {args.duration_s:g} s runs, {args.seeds} seeds")
    print("| ranks | placement | runs with a stalled rank | stalled ranks per run | "
          "silent share | first stall (s, median) | max engine-wide ρ | wall s/run |")
    print("|---|---|---|---|---|---|---|---|")
    for ranks in args.ranks:
        results = {p: [] for p in PLACEMENTS}
        for seed in range(args.seeds):
            trace = os.path.join(folder, f"r{ranks}-s{seed}.csv")
            poisson_trace(trace, args.rate_per_rank * ranks, args.mean_s, args.duration_s, seed)
            for placement in PLACEMENTS:
                t0 = time.perf_counter()
                s = execute(RunConfig(
                    engine="twin", pool_blocks=args.pool_blocks, duration_s=args.duration_s,
                    load="replay", replay_trace=trace, data_parallel_size=ranks,
                    placement=placement, seed=seed, sessions=100_000), store)  # no cap
                wall = time.perf_counter() - t0
                mean_max = float(occupancy(store.cursor(), s.run_id).occupancy.max())
                results[placement].append((s, wall, mean_max))
        for placement in PLACEMENTS:
            runs = results[placement]
            stalled = [sum(r.stalled for r in s.ranks) for s, _, _ in runs]
            firsts = [s.stall_at_s for s, _, _ in runs if s.stall_at_s is not None]
            frames = sum(s.frames for s, _, _ in runs)
            silent = sum(s.silent_frames for s, _, _ in runs)
            print(f"| {ranks} | {placement} | {sum(n > 0 for n in stalled)}/{len(runs)} | "
                  f"{statistics.fmean(stalled):.1f} | {silent / frames:.2%} | "
                  f"{f'{statistics.median(firsts):.1f}' if firsts else '—'} | "
                  f"{statistics.fmean(m for _, _, m in runs):.2f} | "
                  f"{statistics.fmean(w for _, w, _ in runs):.1f} |", flush=True)
    store.close()


if __name__ == "__main__":
    main()
