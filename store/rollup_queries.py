"""What the charts read, from the rollups (store/rollups.py): O(buckets) rows per query however
many frames the run has. A chart bucket of B seconds reads the largest rollup level that
divides B (`level_for`), so B must be a multiple of 1 s (app/live_data.py picks such sizes).

Counts are exact. Percentiles come from the latency histograms: per chart bucket, DuckDB's
quantile_cont interpolation between the frames of ranks ⌊h⌋+1 and ⌈h⌉+1 (h = q·(n−1)), each
frame read as the upper edge of its bin; so the result is never below the exact percentile
and less than one bin ratio (5 %) above it, and +inf ("> budget") exactly when the exact one
is (the censored frames rank above every answer, as store.queries.TRUE_LATENCY ranks them). Exact percentiles over raw frames stay in
store/queries.py (a run's summary, a chosen window).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from store.queries import STALL_LABEL, prediction
from store.rollups import CENSORED_BIN, LEVELS, bin_edge

_EDGES = np.array([bin_edge(b) for b in range(CENSORED_BIN + 1)])
FRAME_COLUMNS = ["t", "p50_ms", "p95_ms", "p99_ms", "naive_p95_ms", "frames", "censored",
                 "silent_per_s", "miss_rate", "naive_miss_rate"]


def level_for(bucket_s: float) -> int:
    """The largest rollup level that divides `bucket_s` (a whole number of seconds)."""
    if bucket_s < 1 or bucket_s != int(bucket_s):
        raise ValueError(f"chart bucket {bucket_s} s is not a whole number of seconds ≥ 1")
    return max(level for level in LEVELS if int(bucket_s) % level == 0)


def _where(bucket_s: float, since: float) -> tuple[str, list]:
    return "run_id = ? AND level_s = ? AND t >= ?", [level_for(bucket_s), since]


def histogram_percentiles(cur, run_id: str, bucket_s: float, since: float = 0.0
                          ) -> pd.DataFrame:
    """Per chart bucket t: p50_ms, p95_ms, p99_ms of true latency (inf: censored) and the
    gateway's naive_p95_ms, from the histograms (merged and walked in numpy: one scan)."""
    where, params = _where(bucket_s, since)
    raw = cur.execute(f"SELECT t, bin, n, naive_n FROM latency_rollups WHERE {where}",
                      [run_id, *params]).fetchnumpy()
    if len(raw["n"]) == 0:
        return pd.DataFrame(columns=["t", "p50_ms", "p95_ms", "p99_ms", "naive_p95_ms"])
    nbins = CENSORED_BIN + 1
    bucket = np.floor(np.asarray(raw["t"], dtype=float) / bucket_s).astype(np.int64)
    keys, inverse = np.unique(bucket * nbins + np.asarray(raw["bin"], dtype=np.int64),
                              return_inverse=True)
    groups, starts = np.unique(keys // nbins, return_index=True)
    edges = _EDGES[keys % nbins]
    out = {"t": groups * bucket_s}
    for column, names in (("n", {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99}),
                          ("naive_n", {"naive_p95_ms": 0.95})):
        counts = np.bincount(inverse, weights=np.asarray(raw[column], dtype=float))
        cum = np.cumsum(counts)  # over keys sorted by (bucket, bin): monotone across buckets
        before = np.concatenate(([0.0], cum))[starts]  # frames in the buckets before
        total = np.concatenate((cum[starts[1:] - 1], cum[-1:])) - before
        for name, q in names.items():
            out[name] = np.where(total > 0, _interpolated(cum, before, total, q, edges), np.nan)
    return pd.DataFrame(out)


def _interpolated(cum, before, total, q: float, edges) -> np.ndarray:
    """quantile_cont's interpolation between the frames of ranks ⌊h⌋+1 and ⌈h⌉+1, h = q·(n−1),
    each read as the upper edge of its bin: never below the exact value, and below one bin
    ratio (5 %) above it; +inf when the upper frame is censored and weighs anything."""
    h = (total - 1) * q
    last = len(cum) - 1
    lo = edges[np.minimum(np.searchsorted(cum, before + np.floor(h) + 0.5), last)]
    hi = edges[np.minimum(np.searchsorted(cum, before + np.ceil(h) + 0.5), last)]
    frac = h - np.floor(h)
    with np.errstate(invalid="ignore"):
        return np.where(frac == 0, lo, np.where(np.isinf(hi), np.inf, lo + frac * (hi - lo)))


def frame_buckets(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0
                  ) -> pd.DataFrame:
    """store.queries.frame_buckets from the rollups: per bucket the truthful and the naive
    view (percentiles from the histograms, counts exact)."""
    where, params = _where(bucket_s, since)
    counts = cur.execute(
        f"""
        SELECT floor(t / ?) * ? AS t, sum(frames) AS frames, sum(censored) AS censored,
               sum(silent) / ? AS silent_per_s, sum(misses) / sum(frames) AS miss_rate,
               sum(naive_misses) / sum(frames) AS naive_miss_rate
        FROM frame_rollups WHERE {where} GROUP BY 1 HAVING sum(frames) > 0 ORDER BY 1
        """, [bucket_s, bucket_s, bucket_s, run_id, *params]).df()
    if counts.empty:
        return pd.DataFrame(columns=FRAME_COLUMNS)
    q = histogram_percentiles(cur, run_id, bucket_s, since)
    df = counts.merge(q, on="t", how="left")
    for name in ("frames", "censored"):
        df[name] = df[name].astype("int64")
    return df[FRAME_COLUMNS]


def session_wall(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0) -> pd.DataFrame:
    """store.queries.session_wall from the rollups: sessions × buckets, tokens and the share
    of silent frames."""
    where, params = _where(bucket_s, since)
    return cur.execute(
        f"""
        SELECT session_id, floor(t / ?) * ? AS t, floor(t / ?) * ? + ? AS t_end,
               sum(tokens) AS tokens, sum(frames) AS frames,
               sum(silent) / sum(frames) AS silent_share
        FROM wall_rollups WHERE {where} GROUP BY 1, 2, 3 HAVING sum(frames) > 0 ORDER BY 1, 2
        """, [bucket_s, bucket_s, bucket_s, bucket_s, bucket_s, run_id, *params]).df()


def tick_buckets(cur, run_id: str, bucket_s: float = 1.0) -> pd.DataFrame:
    """store.queries.tick_buckets from the rollups (the same values: last gauges by time,
    highest ρ, any stall, worst overrun)."""
    where, params = _where(bucket_s, 0.0)
    last = ", ".join(f"arg_max({c}, t_last) AS {c}" for c in (
        "live", "limit_sessions"))
    return cur.execute(
        f"""
        SELECT floor(t / ?) * ? AS t, {last}, max(occupancy) AS occupancy,
               arg_max(used_blocks, t_last) AS used_blocks,
               arg_max(total_blocks, t_last) AS total_blocks,
               arg_max(admitted, t_last) AS admitted, arg_max(rejected, t_last) AS rejected,
               arg_max(evicted, t_last) AS evicted, arg_max(tsat_s, t_last) AS tsat_s,
               arg_max(rho_slope_per_s, t_last) AS rho_slope_per_s, bool_or(stalled) AS stalled,
               max(max_overrun_ms) AS max_overrun_ms, arg_max(n_star, t_last) AS n_star
        FROM tick_rollups WHERE {where} GROUP BY 1 ORDER BY 1
        """, [bucket_s, bucket_s, run_id, *params]).df()


def last_tick_t(cur, run_id: str) -> float | None:
    return cur.execute(f"SELECT max(t_last) FROM tick_rollups WHERE run_id = ? AND level_s = "
                       f"{LEVELS[-1]}", [run_id]).fetchone()[0]


def latest_tick(cur, run_id: str) -> dict | None:
    """The run's newest tick row: its time from the rollups, the row read where it is."""
    t = last_tick_t(cur, run_id)
    if t is None:
        return None
    df = cur.execute("SELECT * FROM ticks WHERE run_id = ? AND t >= ? ORDER BY t DESC LIMIT 1",
                     [run_id, t]).df()
    return None if df.empty else df.iloc[0].to_dict()


def stall_spans(cur, run_id: str) -> pd.DataFrame:
    """store.queries.stall_spans without reading every tick: each stall's end is the first
    tick after its event that was not stalled, found in the ticks of the event's second and
    in the level-1 rollups after it (the last tick when it never flows again)."""
    starts = cur.execute("SELECT t, detail FROM events WHERE run_id = ? AND kind = 'stall' "
                         "ORDER BY t", [run_id]).fetchall()
    if not starts:
        return pd.DataFrame(columns=["t_start", "t_end", "label"])
    ends = []
    for i in range(0, len(starts), 64):  # one statement for many stalls, bounded in size
        chunk = starts[i:i + 64]
        sql = " UNION ALL ".join(
            f"SELECT {j} AS i, coalesce((SELECT min(t) FROM ticks WHERE run_id = $r AND "
            f"t > $t{j} AND t < $e{j} AND NOT coalesce(stalled, false)), (SELECT "
            f"min(first_flowing_t) FROM tick_rollups WHERE run_id = $r AND level_s = 1 AND "
            f"t >= $e{j})) AS t_end" for j in range(len(chunk)))
        params = {"r": run_id}
        for j, (t, _) in enumerate(chunk):
            params.update({f"t{j}": float(t), f"e{j}": math.floor(t) + 1.0})
        ends.extend(t for _, t in sorted(cur.execute(sql, params).fetchall()))
    last = last_tick_t(cur, run_id)
    spans = []
    for (t_event, detail), end in zip(starts, ends):
        d = json.loads(detail)
        spans.append({"t_start": float(d.get("since", t_event)),
                      "t_end": float(end if end is not None else last),
                      "label": d.get("label") or STALL_LABEL.format(ticks=d.get("ticks", 2))})
    return pd.DataFrame(spans, columns=["t_start", "t_end", "label"])


def tsat_prediction(cur, run_id: str, rho_made: float = 0.5, tick: dict | None = None
                    ) -> dict | None:
    """store.queries.tsat_prediction from the rollups: whether the pool filled from their
    highest ρ, the tick that made the prediction searched from the first second that reached
    `rho_made`; `tick`: the run's latest tick when the caller has it."""
    top = cur.execute(f"SELECT max(occupancy), min(t) FILTER (WHERE occupancy >= ?) FROM "
                      f"tick_rollups WHERE run_id = ? AND level_s = 1",
                      [rho_made, run_id]).fetchone()
    if top[0] is not None and top[0] >= 0.99:
        row, lo, width = None, top[1], 60.0
        end = last_tick_t(cur, run_id)
        while row is None and lo is not None and lo <= end:
            row = cur.execute(
                "SELECT t, occupancy, tsat_s FROM ticks WHERE run_id = ? AND t >= ? AND t < ? "
                "AND tsat_s IS NOT NULL AND isfinite(tsat_s) AND occupancy >= ? AND "
                "occupancy < 0.99 ORDER BY t LIMIT 1",
                [run_id, lo, lo + width, rho_made]).fetchone()
            lo, width = lo + width, width * 4
    else:
        tick = tick if tick is not None else latest_tick(cur, run_id)
        row = None if tick is None else (tick["t"], tick["occupancy"], tick["tsat_s"])
    return prediction(row)


def silent_share(cur, run_id: str, t: float, until: float | None = None) -> float | None:
    """The share of frames submitted in [t, until) that went silent, exact: whole seconds
    from the rollups, the fractions at either end from the frames."""
    until = math.inf if until is None else until
    lo, hi = math.ceil(t), math.floor(until) if math.isfinite(until) else math.inf
    if hi <= lo:  # within one second: the frames themselves
        parts = [(t, until)]
        whole = (0, 0)
    else:
        parts = [(t, float(lo)), (float(hi), until)]
        whole = cur.execute(
            "SELECT coalesce(sum(frames), 0), coalesce(sum(silent), 0) FROM frame_rollups "
            "WHERE run_id = ? AND level_s = 1 AND t >= ? AND t < ?",
            [run_id, float(lo), float(hi)]).fetchone()
    n, silent = int(whole[0]), int(whole[1])
    for a, b in parts:
        if b > a:
            pn, ps = cur.execute(
                "SELECT count(*), count(*) FILTER (WHERE silent) FROM frames "
                "WHERE run_id = ? AND t_submit >= ? AND t_submit < ?", [run_id, a, b]).fetchone()
            n, silent = n + pn, silent + ps
    return silent / n if n else None
