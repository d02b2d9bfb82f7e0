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
from store.rollups import CENSORED_BIN, LEVELS, TSAT_RHO_MADE, bin_edge

_EDGES = np.array([bin_edge(b) for b in range(CENSORED_BIN + 1)])
FRAME_COLUMNS = ["t", "p50_ms", "p95_ms", "p99_ms", "naive_p95_ms", "frames", "censored",
                 "silent_per_s", "miss_rate", "naive_miss_rate"]


def level_for(bucket_s: float) -> int:
    """The largest rollup level that divides `bucket_s` (a whole number of seconds)."""
    if bucket_s < 1 or bucket_s != int(bucket_s):
        raise ValueError(f"chart bucket {bucket_s} s is not a whole number of seconds ≥ 1")
    return max(level for level in LEVELS if int(bucket_s) % level == 0)


def _frame(result) -> pd.DataFrame:
    """A query's result as a DataFrame through numpy, cheaper than .df(); NULL is NaN in a
    numeric column, None in any other."""
    return pd.DataFrame({name: _unmasked(values) for name, values in
                         result.fetchnumpy().items()})


def _unmasked(values):
    if not np.ma.isMaskedArray(values):
        return values
    if not values.mask.any():
        return values.data
    if values.dtype.kind in "iuf":
        return np.ma.filled(values.astype(float), np.nan)
    return np.where(values.mask, None, values.data.astype(object))


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


def session_wall(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0) -> pd.DataFrame:
    """store.queries.session_wall from the rollups: sessions × buckets, tokens and the share
    of silent frames."""
    where, params = _where(bucket_s, since)
    return _frame(cur.execute(
        f"""
        SELECT session_id, floor(t / ?) * ? AS t, floor(t / ?) * ? + ? AS t_end,
               sum(tokens) AS tokens, sum(frames) AS frames,
               sum(silent) / sum(frames) AS silent_share
        FROM wall_rollups WHERE {where} GROUP BY 1, 2, 3 HAVING sum(frames) > 0 ORDER BY 1, 2
        """, [bucket_s, bucket_s, bucket_s, bucket_s, bucket_s, run_id, *params]))


def tick_buckets(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0) -> pd.DataFrame:
    """store.queries.tick_buckets from the rollups (the same values: last gauges by time,
    highest ρ, any stall, worst overrun), from the bucket edge `since` on."""
    where, params = _where(bucket_s, since)
    last = ", ".join(f"arg_max({c}, t_last) AS {c}" for c in (
        "live", "limit_sessions"))
    return _frame(cur.execute(
        f"""
        SELECT floor(t / ?) * ? AS t, {last}, max(occupancy) AS occupancy,
               arg_max(used_blocks, t_last) AS used_blocks,
               arg_max(total_blocks, t_last) AS total_blocks,
               arg_max(admitted, t_last) AS admitted, arg_max(rejected, t_last) AS rejected,
               arg_max(evicted, t_last) AS evicted, arg_max(tsat_s, t_last) AS tsat_s,
               arg_max(rho_slope_per_s, t_last) AS rho_slope_per_s, bool_or(stalled) AS stalled,
               max(max_overrun_ms) AS max_overrun_ms, arg_max(n_star, t_last) AS n_star
        FROM tick_rollups WHERE {where} GROUP BY 1 ORDER BY 1
        """, [bucket_s, bucket_s, run_id, *params]))


def tick_summary(cur, run_id: str) -> dict:
    """From the coarsest tick rollups: the last tick's time (t_last), the highest ρ
    (max_occupancy) and the first tick that could make the t_sat mark (tsat_made_t)."""
    row = cur.execute(f"SELECT max(t_last), max(occupancy), min(tsat_made_t) FROM tick_rollups "
                      f"WHERE run_id = ? AND level_s = {LEVELS[-1]}", [run_id]).fetchone()
    return dict(zip(("t_last", "max_occupancy", "tsat_made_t"), row))


def latest_tick(cur, run_id: str, summary: dict | None = None) -> dict | None:
    """The run's newest tick row (NULL as None): its time from the rollups, the row read
    where it is."""
    t = (summary or tick_summary(cur, run_id))["t_last"]
    if t is None:
        return None
    row = cur.execute("SELECT * FROM ticks WHERE run_id = ? AND t = ? LIMIT 1",
                      [run_id, t]).fetchone()
    return None if row is None else dict(zip((d[0] for d in cur.description), row))


SPAN_COLUMNS = ["t_start", "t_end", "label"]


def stall_spans(cur, run_id: str, summary: dict | None = None, ended: dict | None = None
                ) -> pd.DataFrame:
    """store.queries.stall_spans without reading every tick: each stall's end is the first
    tick after its event that was not stalled, from the ticks of the event's own second and
    the level-1 rollups after it (the last tick when it never flows again). `ended`: a cache
    of the spans that have ended (event t → span), read and filled: never looked up again."""
    known = {} if ended is None else ended
    starts = cur.execute("SELECT t, detail FROM events WHERE run_id = ? AND kind = 'stall' "
                         "ORDER BY t", [run_id]).fetchall()
    todo = sorted({float(t) for t, _ in starts if float(t) not in known})
    ends = dict(cur.execute(
        """
        WITH e AS (SELECT unnest(?::DOUBLE[]) AS te),
        inside AS (SELECT e.te, min(k.t) AS t FROM e JOIN ticks k
                   ON k.t > e.te AND k.t < floor(e.te) + 1
                   WHERE k.run_id = ? AND NOT coalesce(k.stalled, false) GROUP BY e.te),
        r AS (SELECT t, first_flowing_t FROM tick_rollups WHERE run_id = ? AND level_s = 1
              AND first_flowing_t IS NOT NULL),
        after AS (SELECT e.te, r.first_flowing_t AS t FROM e ASOF LEFT JOIN r
                  ON r.t >= floor(e.te) + 1)
        SELECT e.te, coalesce(inside.t, after.t) FROM e LEFT JOIN inside USING (te)
        LEFT JOIN after USING (te)
        """, [todo, run_id, run_id]).fetchall()) if todo else {}
    last = (summary or tick_summary(cur, run_id))["t_last"]
    spans = []
    for t_event, detail in starts:
        if float(t_event) in known:
            spans.append(known[float(t_event)])
            continue
        d = json.loads(detail)
        end = ends.get(float(t_event))
        spans.append({"t_start": float(d.get("since", t_event)),
                      "t_end": float(end if end is not None else last),
                      "label": d.get("label") or STALL_LABEL.format(ticks=d.get("ticks", 2))})
        if end is not None:
            known[float(t_event)] = spans[-1]
    return pd.DataFrame(spans, columns=SPAN_COLUMNS)


def tsat_prediction(cur, run_id: str, rho_made: float = TSAT_RHO_MADE,
                    tick: dict | None = None, summary: dict | None = None) -> dict | None:
    """store.queries.tsat_prediction from the rollups: whether the pool filled from their
    highest ρ, and the tick that made the prediction from their first candidate (other
    `rho_made`: searched from the first second that reached it); `tick`, `summary`: the
    latest tick and tick_summary when the caller has them."""
    summary = summary or tick_summary(cur, run_id)
    if summary["max_occupancy"] is None or summary["max_occupancy"] < 0.99:
        tick = tick if tick is not None else latest_tick(cur, run_id, summary)
        return prediction(None if tick is None else (tick["t"], tick["occupancy"],
                                                     tick["tsat_s"]))
    sql = ("SELECT t, occupancy, tsat_s FROM ticks WHERE run_id = ? AND t >= ? AND t < ? AND "
           "tsat_s IS NOT NULL AND isfinite(tsat_s) AND occupancy >= ? AND occupancy < 0.99 "
           "ORDER BY t LIMIT 1")
    if rho_made == TSAT_RHO_MADE:
        t = summary["tsat_made_t"]
        return None if t is None else prediction(
            cur.execute(sql, [run_id, t, t + 1.0, rho_made]).fetchone())
    row, width = None, 60.0
    lo = cur.execute("SELECT min(t) FROM tick_rollups WHERE run_id = ? AND level_s = 1 AND "
                     "occupancy >= ?", [run_id, rho_made]).fetchone()[0]
    while row is None and lo is not None and lo <= summary["t_last"]:
        row = cur.execute(sql, [run_id, lo, lo + width, rho_made]).fetchone()
        lo, width = lo + width, width * 4
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
