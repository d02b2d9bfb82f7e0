"""What the charts read, from the rollups (store/rollups.py): O(buckets) rows per query however
many frames the run has. A chart bucket of B seconds reads the largest rollup level that
divides B (`level_for`), so B must be a multiple of 1 s (services/live_data.py picks such sizes).

Counts are exact. Percentiles come from the latency histograms: per chart bucket, DuckDB's
quantile_cont interpolation between the frames of ranks ⌊h⌋+1 and ⌈h⌉+1 (h = q·(n−1)), each
frame read as the upper edge of its bin; so the result is never below the exact percentile
and less than one bin ratio (5 %) above it, and +inf ("> budget") exactly when the exact one
is (the censored frames rank above every answer, as store.queries.TRUE_LATENCY ranks them).
Exact percentiles over raw frames stay in store/queries.py (a run's summary, a chosen window).
Rows are merged in numpy rather than by GROUP BY: a refresh makes a dozen small queries, and
DuckDB's aggregation costs milliseconds each however few the rows. The marks (last tick, stall
spans, the t_sat mark, a window's silent share) are store/rollup_marks.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

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


def _percentiles(cur, run_id: str, bucket_s: float, since: float) -> dict:
    """Per chart bucket (its index t // bucket_s, sorted): p50_ms, p95_ms, p99_ms of true
    latency (inf: censored) and the gateway's naive_p95_ms, from the histograms, merged and
    walked in numpy (one scan, no GROUP BY)."""
    where, params = _where(bucket_s, since)
    raw = cur.execute(f"SELECT t, bin, n, naive_n FROM latency_rollups WHERE {where}",
                      [run_id, *params]).fetchnumpy()
    nbins = CENSORED_BIN + 1
    bucket = np.floor(np.asarray(raw["t"], dtype=float) / bucket_s).astype(np.int64)
    keys, inverse = np.unique(bucket * nbins + np.asarray(raw["bin"], dtype=np.int64),
                              return_inverse=True)
    groups, starts = np.unique(keys // nbins, return_index=True)
    edges = _EDGES[keys % nbins]
    out = {"bucket": groups}
    for column, names in (("n", {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99}),
                          ("naive_n", {"naive_p95_ms": 0.95})):
        counts = np.bincount(inverse, weights=np.asarray(raw[column], dtype=float))
        cum = np.cumsum(counts)  # over keys sorted by (bucket, bin): monotone across buckets
        before = np.concatenate(([0.0], cum))[starts]  # frames in the buckets before
        total = np.concatenate((cum[starts[1:] - 1], cum[-1:])) - before
        for name, q in names.items():
            out[name] = np.where(total > 0, _interpolated(cum, before, total, q, edges), np.nan)
    return out


def histogram_percentiles(cur, run_id: str, bucket_s: float, since: float = 0.0
                          ) -> pd.DataFrame:
    """Per chart bucket t: p50_ms, p95_ms, p99_ms and naive_p95_ms from the histograms."""
    out = _percentiles(cur, run_id, bucket_s, since)
    return pd.DataFrame({"t": out.pop("bucket") * bucket_s, **out})


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
    raw = cur.execute(f"SELECT t, frames, censored, silent, misses, naive_misses FROM "
                      f"frame_rollups WHERE {where}", [run_id, *params]).fetchnumpy()
    if len(raw["t"]) == 0:
        return pd.DataFrame(columns=FRAME_COLUMNS)
    buckets, inverse = np.unique(np.floor(np.asarray(raw["t"], dtype=float) / bucket_s)
                                 .astype(np.int64), return_inverse=True)
    sums = {c: np.bincount(inverse, weights=np.asarray(raw[c], dtype=float))
            for c in ("frames", "censored", "silent", "misses", "naive_misses")}
    q = _percentiles(cur, run_id, bucket_s, since)
    at = np.searchsorted(q["bucket"], buckets)  # every bucket with frames has a histogram
    frames = sums["frames"]
    return pd.DataFrame({
        "t": buckets * bucket_s, **{name: q[name][at] for name in FRAME_COLUMNS[1:5]},
        "frames": frames.astype(np.int64), "censored": sums["censored"].astype(np.int64),
        "silent_per_s": sums["silent"] / bucket_s, "miss_rate": sums["misses"] / frames,
        "naive_miss_rate": sums["naive_misses"] / frames})[FRAME_COLUMNS]


def _grouped(raw: dict, key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows sorted by (key, t_last when there is one): the order, each group's key and the
    index of its first row in that order (for np.*.reduceat)."""
    order = np.lexsort((raw["t_last"], key)) if "t_last" in raw else np.argsort(key, kind="stable")
    keys, starts = np.unique(key[order], return_index=True)
    return order, keys, starts


def session_wall(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0) -> pd.DataFrame:
    """store.queries.session_wall from the rollups: sessions × buckets, tokens and the share
    of silent frames (rows merged in numpy; a frame without a session id has no row)."""
    where, params = _where(bucket_s, since)
    raw = {k: np.asarray(v) for k, v in cur.execute(
        f"SELECT session_id, t, frames, silent, tokens FROM wall_rollups WHERE {where} "
        "AND session_id IS NOT NULL", [run_id, *params]).fetchnumpy().items()}
    bucket = np.floor(raw["t"].astype(float) / bucket_s).astype(np.int64)
    span = int(bucket.max()) + 1 if len(bucket) else 1
    order, keys, starts = _grouped(raw, raw["session_id"].astype(np.int64) * span + bucket)
    sums = {c: np.add.reduceat(raw[c][order].astype(np.int64), starts) if len(keys) else
            np.zeros(0, np.int64) for c in ("frames", "silent", "tokens")}
    t = (keys % span) * bucket_s
    df = pd.DataFrame({"session_id": (keys // span).astype(np.int64), "t": t,
                       "t_end": t + bucket_s, "tokens": sums["tokens"], "frames": sums["frames"],
                       "silent_share": sums["silent"] / np.maximum(sums["frames"], 1)})
    return df[df.frames > 0].reset_index(drop=True)


_LAST = ("live", "limit_sessions", "used_blocks", "total_blocks", "admitted", "rejected",
         "evicted", "tsat_s", "rho_slope_per_s")
TICK_COLUMNS = ["t", *_LAST[:2], "occupancy", *_LAST[2:], "stalled", "max_overrun_ms", "n_star"]


def tick_buckets(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0) -> pd.DataFrame:
    """store.queries.tick_buckets from the rollups (the same values: each gauge's last non-NULL
    value by time, the highest ρ, any stall, the worst overrun), rows merged in numpy."""
    where, params = _where(bucket_s, since)
    raw = {k: _floats(v) for k, v in cur.execute(
        f"SELECT t, t_last, {', '.join(_LAST)}, n_star, occupancy, stalled, max_overrun_ms "
        f"FROM tick_rollups WHERE {where}", [run_id, *params]).fetchnumpy().items()}
    if len(raw["t"]) == 0:
        return pd.DataFrame(columns=TICK_COLUMNS)
    order, keys, starts = _grouped(raw, np.floor(raw["t"] / bucket_s).astype(np.int64))
    out = {"t": keys * bucket_s}
    index = np.arange(len(order))
    for c in (*_LAST, "n_star"):  # arg_max(c, t_last): the last row of its bucket with a value
        values = raw[c][order]
        last = np.maximum.reduceat(np.where(np.isnan(values), -1, index), starts)
        out[c] = np.where(last >= 0, values[np.maximum(last, 0)], np.nan)
    for c, how in (("occupancy", np.fmax), ("max_overrun_ms", np.fmax), ("stalled", np.fmax)):
        out[c] = how.reduceat(raw[c][order], starts)
    out["stalled"] = pd.array(np.where(np.isnan(out["stalled"]), None, out["stalled"] > 0),
                              dtype="boolean")
    return pd.DataFrame(out)[TICK_COLUMNS]


def _floats(values) -> np.ndarray:
    """A fetched column as floats, NULL as NaN (booleans as 0/1)."""
    return np.ma.filled(np.ma.asarray(values).astype(float), np.nan)
