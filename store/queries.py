"""Read queries for the console, the CLI and reports. Aggregation happens in SQL."""

from __future__ import annotations

import json
import math

import pandas as pd

from store.results import frame_of

# A frame's latency for percentiles: a censored frame (no answer by the time it was finalised)
# has an unknown latency ≥ budget, so it ranks above every answered frame: +infinity. A
# percentile whose rank reaches it comes out infinite, i.e. "> budget", never a number.
# Files written before `censored` existed: an incomplete frame carried its lower bound.
TRUE_LATENCY = ("CASE WHEN coalesce(censored, NOT complete, false) THEN 'infinity'::DOUBLE "
                "ELSE latency_ms END")


def runs(cur, limit: int = 100) -> pd.DataFrame:
    return cur.execute(
        "SELECT run_id, started_at, ended_at, status, reason, engine, simulated, model, policy, "
        "window_tokens, sink_tokens, pool_blocks, sessions, frame_ms, summary "
        "FROM runs ORDER BY started_at DESC LIMIT ?", [limit]).df()


def run_row(cur, run_id: str) -> dict | None:
    df = cur.execute("SELECT * FROM runs WHERE run_id = ?", [run_id]).df()
    return None if df.empty else df.iloc[0].to_dict()


def latency_percentiles(cur, run_id: str, bucket_s: float = 1.0) -> pd.DataFrame:
    """p50/p95/p99 of true frame latency per time bucket (inf: censored, "> budget"), plus
    the naive gateway p95."""
    return cur.execute(
        f"""
        SELECT floor(t_submit / ?) * ? AS t,
               quantile_cont({TRUE_LATENCY}, [0.5, 0.95, 0.99]) AS q,
               quantile_cont(naive_latency_ms, 0.95) AS naive_p95_ms,
               count(*) AS frames
        FROM frames WHERE run_id = ?
        GROUP BY 1 ORDER BY 1
        """, [bucket_s, bucket_s, run_id]).df().pipe(_split_quantiles)


def _split_quantiles(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame(columns=["t", "p50_ms", "p95_ms", "p99_ms", "naive_p95_ms", "frames"])
    # A bucket whose frames carry no latency (older files recorded never-submitted frames with
    # NULL) has no quantiles: NULL list, shown as a gap rather than failing the page.
    q = [x if isinstance(x, (list, tuple)) or hasattr(x, "__len__") else None
         for x in df.pop("q")]
    for i, name in enumerate(("p50_ms", "p95_ms", "p99_ms")):
        df[name] = [None if x is None else x[i] for x in q]
    return df


def occupancy(cur, run_id: str) -> pd.DataFrame:
    return cur.execute(
        "SELECT t, occupancy, used_blocks, total_blocks, live, running, waiting, paused, stalled "
        "FROM ticks WHERE run_id = ? ORDER BY t", [run_id]).df()


def events(cur, run_id: str) -> pd.DataFrame:
    return cur.execute(
        "SELECT t, wall_at, kind, detail FROM events WHERE run_id = ? ORDER BY wall_at, t", [run_id]).df()


def session_origins(cur, run_id: str) -> dict[int, str]:
    """Each session's origin (its `open` event): the run's load kind, or `gateway` for a
    remote client. Sessions of runs recorded before `open` events have none."""
    rows = cur.execute("SELECT CAST(json_extract(detail, '$.session_id') AS INTEGER), "
                       "json_extract_string(detail, '$.origin') FROM events "
                       "WHERE run_id = ? AND kind = 'open'", [run_id]).fetchall()
    return {int(sid): origin for sid, origin in rows if sid is not None}


def frame_percentiles(cur, run_id: str) -> dict:
    """Whole-run p50/p95/p99 of true latency and p95 of the gateway's (naive) latency.
    A percentile whose rank falls among censored frames is None with `pNN_censored` True."""
    row = cur.execute(
        f"SELECT quantile_cont({TRUE_LATENCY}, [0.5, 0.95, 0.99]), "
        "quantile_cont(naive_latency_ms, 0.95), "
        "count(*) FILTER (WHERE coalesce(censored, NOT complete, false)), "
        "count(*) FILTER (WHERE complete AND NOT on_time) "
        "FROM frames WHERE run_id = ?", [run_id]).fetchone()
    q = row[0] or [None, None, None]
    out = {"naive_p95_ms": row[1], "censored_frames": int(row[2] or 0),
           "late_frames": int(row[3] or 0)}
    for name, value in zip(("p50", "p95", "p99"), q):
        censored = value is not None and math.isinf(value)
        out[f"{name}_ms"] = None if censored else value
        out[f"{name}_censored"] = censored
    return out


def frame_counts(cur, run_id: str) -> dict:
    row = cur.execute(
        "SELECT count(*), sum(CASE WHEN silent THEN 1 ELSE 0 END) FROM frames WHERE run_id = ?",
        [run_id]).fetchone()
    return {"frames": int(row[0] or 0), "silent_frames": int(row[1] or 0)}


def steps(cur, run_id: str) -> list[dict]:
    return cur.execute(
        "SELECT t, step_ms, prompt_tokens, gen_tokens, used_blocks, resident_tokens, running "
        "FROM steps WHERE run_id = ? ORDER BY t", [run_id]).df().to_dict("records")


def silent_share_after(cur, run_id: str, t: float, until: float | None = None) -> float | None:
    """The share of frames submitted at or after t (and before `until`, run-relative s) that
    went silent."""
    n, silent = cur.execute("SELECT count(*), count(*) FILTER (WHERE silent) FROM frames "
                            "WHERE run_id = ? AND t_submit >= ? AND t_submit < ?",
                            [run_id, t, float("inf") if until is None else until]).fetchone()
    return silent / n if n else None


def latest_twin_model(cur) -> dict | None:
    df = cur.execute("SELECT * FROM twin_models ORDER BY fitted_at DESC LIMIT 1").df()
    return None if df.empty else df.iloc[0].to_dict()


# --- the console's Live view: one scan per table per refresh, bucketed so charts stay small ---
def latest_tick(cur, run_id: str) -> dict | None:
    """The run's newest tick (live sessions, cap, counters, ρ, t_sat), None before the first."""
    df = cur.execute("SELECT * FROM ticks WHERE run_id = ? ORDER BY t DESC LIMIT 1",
                     [run_id]).df()
    return None if df.empty else df.iloc[0].to_dict()


def tick_buckets(cur, run_id: str, bucket_s: float = 1.0) -> pd.DataFrame:
    """Ticks per time bucket: the bucket's last value of the gauges and counters, the highest
    occupancy (a stall must not be averaged away) and whether any tick in it was stalled."""
    return cur.execute(
        """
        SELECT floor(t / ?) * ? AS t,
               arg_max(live, t) AS live, arg_max(limit_sessions, t) AS limit_sessions,
               max(occupancy) AS occupancy, arg_max(used_blocks, t) AS used_blocks,
               arg_max(total_blocks, t) AS total_blocks,
               arg_max(admitted, t) AS admitted, arg_max(rejected, t) AS rejected,
               arg_max(evicted, t) AS evicted, arg_max(tsat_s, t) AS tsat_s,
               arg_max(rho_slope_per_s, t) AS rho_slope_per_s, bool_or(stalled) AS stalled,
               max(overrun_ms) AS max_overrun_ms, arg_max(n_star, t) AS n_star
        FROM ticks WHERE run_id = ? GROUP BY 1 ORDER BY 1
        """, [bucket_s, bucket_s, run_id]).df()


def frame_buckets(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0) -> pd.DataFrame:
    """Per time bucket, the truthful and the naive (gateway) view of the same frames: latency
    percentiles, silent frames, deadline misses. Columns as latency_percentiles plus
    silent_per_s, miss_rate (truthful) and naive_miss_rate (empty frames counted on time).
    `since` (a bucket edge) limits it to the buckets from there on, for incremental refresh."""
    df = cur.execute(
        f"""
        SELECT floor(t_submit / ?) * ? AS t,
               quantile_cont({TRUE_LATENCY}, [0.5, 0.95, 0.99]) AS q,
               quantile_cont(naive_latency_ms, 0.95) AS naive_p95_ms,
               count(*) AS frames,
               count(*) FILTER (WHERE coalesce(censored, NOT complete, false)) AS censored,
               count(*) FILTER (WHERE silent) / ? AS silent_per_s,
               avg(CASE WHEN on_time THEN 0.0 ELSE 1.0 END) AS miss_rate,
               avg(CASE WHEN naive_on_time THEN 0.0 ELSE 1.0 END) AS naive_miss_rate
        FROM frames WHERE run_id = ? AND t_submit >= ? GROUP BY 1 ORDER BY 1
        """, [bucket_s, bucket_s, bucket_s, run_id, since]).df()
    if df.empty:
        return pd.DataFrame(columns=["t", "p50_ms", "p95_ms", "p99_ms", "naive_p95_ms", "frames",
                                     "censored", "silent_per_s", "miss_rate",
                                     "naive_miss_rate"])
    return _split_quantiles(df)


def session_wall(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0) -> pd.DataFrame:
    """Sessions × time buckets: tokens produced and the share of silent frames in each cell
    (from the bucket edge `since` on)."""
    return cur.execute(
        """
        SELECT session_id, floor(t_submit / ?) * ? AS t, floor(t_submit / ?) * ? + ? AS t_end,
               sum(tokens_out) AS tokens, count(*) AS frames,
               avg(CASE WHEN silent THEN 1.0 ELSE 0.0 END) AS silent_share
        FROM frames WHERE run_id = ? AND t_submit >= ? GROUP BY 1, 2, 3 ORDER BY 1, 2
        """, [bucket_s, bucket_s, bucket_s, bucket_s, bucket_s, run_id, since]).df()


def param_changes(cur, run_id: str) -> pd.DataFrame:
    """Live setting changes of a run, newest first, with their JSON detail unpacked."""
    df = cur.execute(
        "SELECT t, wall_at, detail FROM events WHERE run_id = ? AND kind = 'param_change' "
        "ORDER BY wall_at DESC, t DESC", [run_id]).df()
    details = [json.loads(d) for d in df.pop("detail")] if not df.empty else []
    for key in ("setting", "old", "new"):
        df[key] = [None if d.get(key) is None else str(d.get(key)) for d in details]
    return df


# --- the Runs page ----------------------------------------------------------------------------
def run_history(cur, status: list[str] | None = None, engine: list[str] | None = None,
                policy: list[str] | None = None, text: str = "", limit: int = 500
                ) -> pd.DataFrame:
    """Recorded runs, newest first, filtered by status, engine, policy and a run-id substring."""
    where, params = [], []
    for column, values in (("status", status), ("engine", engine), ("policy", policy)):
        if values:
            where.append(f"{column} IN ({', '.join('?' for _ in values)})")
            params.extend(values)
    if text:
        where.append("run_id ILIKE ?")
        params.append(f"%{text}%")
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return cur.execute(
        "SELECT run_id, started_at, status, engine, simulated, policy, window_tokens, "
        "sink_tokens, sessions, load, admission, pool_blocks, frame_ms, duration_s, seed, "
        f"summary FROM runs {clause} ORDER BY started_at DESC LIMIT ?", [*params, limit]).df()


def run_frames(cur, run_id: str):
    """All frame rows of a run as an Arrow table (for Parquet/CSV export)."""
    return cur.execute("SELECT * FROM frames WHERE run_id = ? ORDER BY t_submit, session_id",
                       [run_id]).to_arrow_table()


# --- what the charts mark: stalls, live changes, the t_sat prediction --------------------------
STALL_LABEL = "pool full, no token for {ticks} ticks: silent stall"


def stall_spans(cur, run_id: str) -> pd.DataFrame:
    """Each stall as a span [t_start, t_end): from the start its event names (the first quiet
    tick) to the first tick that flows again (or the last tick, when it never does)."""
    ticks = cur.execute("SELECT t, stalled FROM ticks WHERE run_id = ? ORDER BY t",
                        [run_id]).df()
    starts = cur.execute(
        "SELECT t, detail FROM events WHERE run_id = ? AND kind = 'stall' ORDER BY t",
        [run_id]).df()
    spans = []
    for t_event, detail in zip(starts.t, starts.detail):
        d = json.loads(detail)
        after = ticks[(ticks.t > t_event) & ~ticks.stalled.fillna(False).astype(bool)]
        end = float(after.t.iloc[0]) if not after.empty else float(ticks.t.max())
        spans.append({"t_start": float(d.get("since", t_event)), "t_end": end,
                      "label": d.get("label") or STALL_LABEL.format(ticks=d.get("ticks", 2))})
    return pd.DataFrame(spans, columns=["t_start", "t_end", "label"])


def settings_history(cur, run_id: str) -> pd.DataFrame:
    """The run's settings as a time series: the start, then one row per applied live change
    (`change` says what moved, e.g. "W 128 → 32")."""
    return frame_of(cur.execute(
        "SELECT t, setting, change, policy, window_tokens, sink_tokens, target, admission, "
        "limit_sessions, stall_guard, memory_guard FROM settings_history WHERE run_id = ? "
        "ORDER BY t, setting = 'start' DESC", [run_id]))


def tsat_prediction(cur, run_id: str, rho_made: float = 0.5) -> dict | None:
    """The t_sat prediction to mark on the occupancy chart. When the pool filled (ρ ≥ 0.99),
    the one made at the first tick where ρ reached `rho_made` with a rising fit (what it said
    against what happened); when it did not, the last tick's, if it still predicted one (the
    pool is still filling). None otherwise: a bounded pool that levelled has no saturation."""
    filled = cur.execute("SELECT max(occupancy) >= 0.99 FROM ticks WHERE run_id = ?",
                         [run_id]).fetchone()[0]
    if filled:
        row = cur.execute(
            "SELECT t, occupancy, tsat_s FROM ticks WHERE run_id = ? AND tsat_s IS NOT NULL "
            "AND isfinite(tsat_s) AND occupancy >= ? AND occupancy < 0.99 ORDER BY t LIMIT 1",
            [run_id, rho_made]).fetchone()
    else:
        row = cur.execute(
            "SELECT t, occupancy, tsat_s FROM ticks WHERE run_id = ? ORDER BY t DESC LIMIT 1",
            [run_id]).fetchone()
    return prediction(row)


def prediction(row) -> dict | None:
    """The t_sat mark from a tick's (t, occupancy, tsat_s); None without a finite t_sat."""
    if row is None or row[2] is None or pd.isna(row[2]) or not math.isfinite(row[2]):
        return None
    t, rho, tsat = (float(x) for x in row)
    return {"t_made": t, "rho_made": rho, "t_full": t + tsat,
            "label": f"t_sat predicted at {t:.1f} s: full at {t + tsat:.1f} s"}
def replays(cur, limit: int = 200) -> pd.DataFrame:
    """Runs that replayed a recorded run: their id and the original's, newest first."""
    return cur.execute(
        "SELECT run_id, json_extract_string(settings, '$.replay_run') AS original "
        "FROM runs WHERE load = 'replay' AND json_extract_string(settings, '$.replay_run') "
        "IS NOT NULL ORDER BY started_at DESC LIMIT ?", [limit]).df()


def caps(cur, run_id: str) -> pd.DataFrame:
    """The admission cap at every tick of a run (N* discovery reads where it settled)."""
    return cur.execute("SELECT t, limit_sessions FROM ticks WHERE run_id = ? ORDER BY t",
                       [run_id]).df()
