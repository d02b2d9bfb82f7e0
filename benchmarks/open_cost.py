"""What a burst of arriving sessions costs the sessions already live (issue 24, part 3).

    .venv/bin/python benchmarks/open_cost.py [--engine vllm] [--frame-ms 160] [--live 4]
        [--bursts 0 4 8 16] [--budgets 1024 2] [--repeats 2]

One engine for every run. Each run replays a trace file: `--live` sessions start together at
0 s, then a burst of m sessions arrives within one tick (the first at or after 3 s); all last to the end (6 s). The
live sessions' frames submitted in the burst's window (one frame before it to four after) are
compared with the same window of the run without a burst: their p50 / max latency (a silent
frame counts as the budget) and silent frames. The same burst with the per-tick open budget off
(1024: every open in the tick it arrives) and on (2, the default). Prints one JSON object with
every figure; the medians over --repeats are what docs/BENCHMARKS.md quotes.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

BURST_AT_S = 3.0
DURATION_S = 6.0


def _burst_start(frame_s: float) -> float:
    """The first tick edge at or after BURST_AT_S: the whole burst falls in one tick."""
    return math.ceil(BURST_AT_S / frame_s - 1e-9) * frame_s


def _trace(path: str, live: int, burst: int, frame_s: float) -> None:
    start = _burst_start(frame_s)
    with open(path, "w") as f:
        f.write("session_id,start_s,end_s,tokens_in,tokens_out\n")
        for i in range(live):
            f.write(f"live{i},0,{DURATION_S},16,4\n")
        for j in range(burst):  # all inside one tick
            f.write(f"burst{j},{start + (j + 1) * frame_s / (burst + 2):.4f},{DURATION_S},16,4\n")


def _window(cur, run_id: str, live: int, burst: int, frame_s: float) -> dict:
    """The live sessions' frames while the burst opens (its tick to the tick after the last
    open a budget of 2 would place) and once every burst session is decoding (the 5 ticks
    after): the difference of the two is what the opens cost, not the added sessions."""
    t0, opening = _burst_start(frame_s), math.ceil(burst / 2) + 1

    def frames(start: float, end: float) -> list:
        # A silent frame's latency is unknown (≥ the budget): +inf, so a statistic that
        # reaches it is None ("> budget"), never a number.
        return cur.execute(
            "SELECT CASE WHEN silent THEN 'infinity'::DOUBLE ELSE latency_ms END, silent "
            "FROM frames WHERE run_id = ? AND session_id < ? AND t_submit >= ? "
            "AND t_submit < ?", [run_id, live, start - 1e-6, end - 1e-6]).fetchall()

    def known(x: float) -> float | None:
        return round(x, 1) if math.isfinite(x) else None

    during = frames(t0, t0 + opening * frame_s)
    after = frames(t0 + opening * frame_s, t0 + (opening + 5) * frame_s)
    return {"frames": len(during), "silent": sum(bool(r[1]) for r in during),
            "max_ms": known(max(r[0] for r in during)),
            "p50_ms": known(statistics.median(r[0] for r in during)),
            "after_p50_ms": known(statistics.median(r[0] for r in after))}


def _median(values) -> float | None:
    """Median with None ("> budget") ranked above every number; None if it lands there."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    return ordered[(len(ordered) - 1) // 2] if len(ordered) % 2 else (
        None if None in ordered[len(ordered) // 2 - 1:len(ordered) // 2 + 1]
        else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "twin"], default="vllm")
    parser.add_argument("--frame-ms", type=float, default=160.0)
    parser.add_argument("--live", type=int, default=4)
    parser.add_argument("--bursts", type=int, nargs="+", default=[0, 4, 8, 16])
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 2])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from runtime import RunConfig, Runner, make_engine
    from store import Store

    tmp = tempfile.mkdtemp()
    store = Store(os.path.join(tmp, "open_cost.duckdb"))
    frame_s = args.frame_ms / 1e3
    engine, results = None, []
    try:
        for repeat in range(args.repeats):
            for burst in args.bursts:
                for budget in (args.budgets if burst else args.budgets[:1]):
                    path = os.path.join(tmp, f"trace_{burst}.csv")
                    _trace(path, args.live, burst, frame_s)
                    cfg = RunConfig(engine=args.engine, load="replay", replay_trace=path,
                                    policy="window", window=128, pool_blocks=512,
                                    frame_ms=args.frame_ms, duration_s=DURATION_S,
                                    admission="fixed", sessions=args.live + burst,
                                    open_budget=budget)
                    engine = engine or make_engine(cfg)
                    s = Runner(cfg, engine, store).run()
                    store.writer.flush()
                    w = _window(store.cursor(), s.run_id, args.live, burst, frame_s)
                    results.append({"repeat": repeat, "burst": burst, "open_budget": budget,
                                    "opens_deferred": s.opens_deferred, **w})
                    print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        if engine is not None:
            engine.shutdown()
        store.close()
    medians = []
    for burst in args.bursts:
        for budget in (args.budgets if burst else args.budgets[:1]):
            runs = [r for r in results if r["burst"] == burst and r["open_budget"] == budget]
            medians.append({"burst": burst, "open_budget": budget if burst else None,
                            **{k: _median(r[k] for r in runs)
                               for k in ("p50_ms", "max_ms", "after_p50_ms")},
                            "silent": statistics.median(r["silent"] for r in runs),
                            "frames": statistics.median(r["frames"] for r in runs)})
    print(json.dumps({"engine": args.engine, "frame_ms": args.frame_ms, "live": args.live,
                      "repeats": args.repeats, "medians": medians, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
