"""Experiments as series of runs: plans (lists of RunConfigs) and how their results read.

Pure functions, no Streamlit: the Experiments page starts a plan on the run host, and reads the
results back from the store by the run ids the host returned.

- cliff vs slope: the same seeded load, unbounded then windowed.
- collapse: that pair repeated over n seeds; how many of each stalled (the paper's 14/20 vs 0/20).
- N* discovery: Poisson arrivals with AIMD admission; N*, the live count it held at the target
  (control/nstar.py), against the calibrated compute limit N_c.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import pandas as pd

from runtime import RunConfig
from store import rollup_marks

KINDS = ("cliff vs slope", "collapse", "N* discovery")

# A Poisson load near the pool's edge: unbounded runs stall in some seeds and not in others
# (metastable), windowed runs never; measured on the twin: 5/8 vs 0/8 at these settings.
DEFAULTS = {"engine": "twin", "load": "poisson", "sessions": 30, "arrival_rate": 2.0,
            "session_s": 6.0, "duration_s": 15.0, "pool_blocks": 352}


def cliff_vs_slope(base: RunConfig, window: int, sinks: int) -> list[RunConfig]:
    """The base load twice with one seed: unbounded KV, then windowed (W, S)."""
    return [replace(base, policy="unbounded", window=None, sinks=0),
            replace(base, policy="window", window=window, sinks=sinks)]


def collapse(base: RunConfig, window: int, sinks: int, repeats: int) -> list[RunConfig]:
    """cliff_vs_slope over seeds base.seed … base.seed + repeats − 1."""
    if not 1 <= repeats <= 100:
        raise ValueError(f"repeats {repeats} must be in [1, 100]")
    return [config for i in range(repeats)
            for config in cliff_vs_slope(replace(base, seed=base.seed + i), window, sinks)]


def n_star(base: RunConfig, window: int, sinks: int) -> list[RunConfig]:
    """Poisson arrivals for the whole run (rate × duration sessions offered) with AIMD
    admission on a windowed pool: the cap rises while latency has headroom and settles around
    the schedulable concurrency N*. Windowed, so latency is a slope and no stall ends the climb;
    sessions end (session_s), so the cap can also come down to N* after an overshoot."""
    if base.arrival_rate is None:
        raise ValueError("N* discovery needs an arrival rate (sessions/s)")
    offered = max(1, math.ceil(base.arrival_rate * base.duration_s))
    return [replace(base, load="poisson", sessions=offered, admission="aimd", policy="window",
                    window=window, sinks=sinks)]


def n_star_report(summary: dict, n_c: int | None, silent_at_cap: float | None) -> dict:
    """What N* discovery reports: N* (the live count held at the target over the last stable
    stretch; None: it never settled), when and for how long, N_c and N*/N_c, the silent share
    of frames over that stretch (`silent_at_cap`, from the store) and the run's p95, censored
    shown as "> budget" (its rank among frames with no answer: not a number)."""
    n_star = summary.get("n_star")
    p95 = (f"> {summary['budget_ms']:g} ms (budget)" if summary.get("p95_censored")
           else None if summary.get("p95_ms") is None else f"{summary['p95_ms']:.1f} ms")
    return {"n_star": n_star, "n_star_at_s": summary.get("n_star_at_s"),
            "n_star_for_s": summary.get("n_star_for_s"), "n_c": n_c,
            "ratio": None if n_star is None or not n_c else round(n_star / n_c, 2),
            "silent_at_cap": silent_at_cap, "p95": p95, "silent_rate": summary["silent_rate"],
            "rejected": summary["rejected"], "admitted": summary["admitted"]}


def silent_at_cap(cur, summary: dict) -> float | None:
    """The silent share of the frames N*'s stretch judged (None: no N*): from one control
    window before its first sample (a run from before the window: one 1 s interval) to its end."""
    if summary.get("n_star") is None:
        return None
    judged_s = float(summary.get("control_window_s") or 1.0)
    end = float(summary["n_star_at_s"]) + float(summary["n_star_for_s"])
    return rollup_marks.silent_share(cur, summary["run_id"],
                                      float(summary["n_star_at_s"]) - judged_s, end)


def converged_cap(ticks: pd.DataFrame) -> int | None:
    """N*: the median cap over the last third of the run, after the climb (None: no ticks)."""
    if ticks.empty:
        return None
    tail = ticks.limit_sessions.iloc[2 * len(ticks) // 3:]
    return int(round(float(tail.median())))


def plan(kind: str, base: RunConfig, window: int, sinks: int, repeats: int) -> list[RunConfig]:
    if kind == "cliff vs slope":
        return cliff_vs_slope(base, window, sinks)
    if kind == "collapse":
        return collapse(base, window, sinks, repeats)
    if kind == "N* discovery":
        return n_star(base, window, sinks)
    raise ValueError(f"experiment {kind!r} is not one of {', '.join(KINDS)}")


def policy_label(row: dict) -> str:
    if row["policy"] == "window":
        return f"window W={row['window_tokens']} S={row['sink_tokens']}"
    return "unbounded"


def collapse_table(rows: list[dict]) -> pd.DataFrame:
    """Per policy: k/n runs stalled, partially stalled (memory-caused silence without a total
    stall) and compute-silent, the median stall time, the mean silent-frame rate.
    `rows` are runs rows (queries.run_row) of finished runs."""
    by_policy: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("summary"):
            by_policy.setdefault(policy_label(row), []).append(json.loads(row["summary"]))
    table = []
    for label, summaries in by_policy.items():
        stalls = [s["stall_at_s"] for s in summaries if s["stalled"]]
        silent = [s["silent_rate"] for s in summaries if s["silent_rate"] is not None]
        n = len(summaries)
        partial = sum(1 for s in summaries if s.get("silence") == "partial stall")
        compute = sum(1 for s in summaries if s.get("silence") == "compute")
        table.append({"policy": label, "stalled": len(stalls), "runs": n,
                      "k/n stalled": f"{len(stalls)}/{n}",
                      "k/n partially stalled": f"{partial}/{n}",
                      "k/n compute-silent": f"{compute}/{n}",
                      "median stall at (s)": statistics.median(stalls) if stalls else None,
                      "mean silent rate": statistics.fmean(silent) if silent else None})
    return pd.DataFrame(table, columns=["policy", "stalled", "runs", "k/n stalled",
                                        "k/n partially stalled", "k/n compute-silent",
                                        "median stall at (s)", "mean silent rate"])
