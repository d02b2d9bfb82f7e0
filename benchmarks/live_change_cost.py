"""What a live W or S change costs the sessions: silent frames and p99 latency in the second
after each change against the quiet seconds of the same run (no change in them or just before).

    .venv/bin/python benchmarks/live_change_cost.py            # vLLM tiny, windowed, ~30 s

One windowed vLLM run (6 sessions, 80 ms frames, pool 256 blocks, W=192) with changes that
shrink and grow W and S. Each change's timeline comes from its event: requested at the tick
`requested_t`, confirmed by the engine `confirm_ms` later (the run thread does not wait for
it), seen done at the tick `t`. Prints every figure docs/BENCHMARKS.md quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

CHANGES = ("5:window=64", "8:window=192", "11:sinks=32", "14:sinks=0", "17:window=96",
           "20:window=192", "23:sinks=64", "26:window=128")


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def measure(engine_kind: str, duration_s: float) -> dict:
    from runtime import RunConfig, Runner, make_engine
    from runtime.config import ScheduledChange
    from store import Store

    cfg = RunConfig(engine=engine_kind, model="tiny", policy="window", window=192,
                    pool_blocks=256, sessions=6, frame_ms=80.0, duration_s=duration_s,
                    changes=tuple(ScheduledChange.parse(c) for c in CHANGES
                                  if float(c.split(":")[0]) < duration_s - 2))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(os.path.join(tmp, "bench.duckdb"))
        engine = make_engine(cfg)
        try:
            summary = Runner(cfg, engine, store).run()
        finally:
            engine.shutdown()
        cur = store.cursor()
        frames = cur.execute(
            "SELECT t_submit, silent, censored, coalesce(latency_ms, latency_bound_ms) AS ms "
            "FROM frames WHERE run_id = ?", [summary.run_id]).df()
        events = cur.execute(
            "SELECT t, detail FROM events WHERE run_id = ? AND kind = 'param_change'",
            [summary.run_id]).df()
        store.close()
    changes = [{"t": float(t), **json.loads(d)} for t, d in zip(events.t, events.detail)]
    starts = [c.get("requested_t", c["t"]) for c in changes]
    after, quiet = [], []
    for second in range(2, int(duration_s) - 1):  # skip start-up
        window = frames[(frames.t_submit >= second) & (frames.t_submit < second + 1)]
        row = {"second": second, "frames": len(window), "silent": int(window.silent.sum()),
               "p99_ms": p99(window.ms.tolist())}
        # The second after a change: [t, t + 1) around its request; quiet: no change within
        # the second or the one before it.
        if any(second <= s < second + 1 for s in starts):
            after.append(row)
        elif not any(second - 1 <= s < second + 1 for s in starts):
            quiet.append(row)
    return {"summary": summary, "changes": changes, "after": after, "quiet": quiet}


def report(result: dict) -> str:
    after, quiet = result["after"], result["quiet"]
    lines = ["change | requested at (s) | engine confirmed after (ms) | seen at tick (s)",
             "---|---|---|---"]
    for c in result["changes"]:
        lines.append(f"{c['change']} | {c.get('requested_t', c['t']):.2f} | "
                     f"{c.get('confirm_ms', 0):.0f} | {c['t']:.2f}")
    med = statistics.median
    q_p99 = med([r["p99_ms"] for r in quiet if r["p99_ms"] is not None])
    a_p99 = med([r["p99_ms"] for r in after if r["p99_ms"] is not None])
    lines += [
        "",
        "seconds | n | silent frames (total) | frames | median p99 (ms)",
        "---|---|---|---|---",
        f"after a change | {len(after)} | {sum(r['silent'] for r in after)} | "
        f"{sum(r['frames'] for r in after)} | {a_p99:.1f}",
        f"quiet | {len(quiet)} | {sum(r['silent'] for r in quiet)} | "
        f"{sum(r['frames'] for r in quiet)} | {q_p99:.1f}",
        "",
        f"p99 after a change / quiet: {a_p99 / q_p99:.2f}x; "
        f"run: {result['summary'].frames} frames, "
        f"{result['summary'].silent_frames} silent, stalled {result['summary'].stalled}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "twin"], default="vllm")
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args()
    print(report(measure(args.engine, args.duration)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
