"""Read queries for the console, the CLI and reports. Aggregation happens in SQL."""

from __future__ import annotations

import json

import pandas as pd


def runs(cur, limit: int = 100) -> pd.DataFrame:
    return cur.execute(
        "SELECT run_id, started_at, ended_at, status, reason, engine, simulated, model, policy, "
        "window_tokens, sink_tokens, pool_blocks, sessions, frame_ms, summary "
        "FROM runs ORDER BY started_at DESC LIMIT ?", [limit]).df()


def run_row(cur, run_id: str) -> dict | None:
    df = cur.execute("SELECT * FROM runs WHERE run_id = ?", [run_id]).df()
    return None if df.empty else df.iloc[0].to_dict()


def latency_percentiles(cur, run_id: str, bucket_s: float = 1.0) -> pd.DataFrame:
    """p50/p95/p99 of true frame latency per time bucket, plus the naive gateway p95."""
    return cur.execute(
        """
        SELECT floor(t_submit / ?) * ? AS t,
               quantile_cont(latency_ms, [0.5, 0.95, 0.99]) AS q,
               quantile_cont(naive_latency_ms, 0.95) AS naive_p95_ms,
               count(*) AS frames
        FROM frames WHERE run_id = ? AND latency_ms IS NOT NULL
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


def silent_per_s(cur, run_id: str, bucket_s: float = 1.0) -> pd.DataFrame:
    return cur.execute(
        """
        SELECT floor(t_submit / ?) * ? AS t,
               sum(CASE WHEN silent THEN 1 ELSE 0 END) / ? AS silent_per_s,
               sum(CASE WHEN naive_on_time THEN 0 ELSE 1 END) / ? AS naive_misses_per_s,
               count(*) AS frames
        FROM frames WHERE run_id = ? GROUP BY 1 ORDER BY 1
        """, [bucket_s, bucket_s, bucket_s, bucket_s, run_id]).df()


def events(cur, run_id: str) -> pd.DataFrame:
    return cur.execute(
        "SELECT t, wall_at, kind, detail FROM events WHERE run_id = ? ORDER BY wall_at, t", [run_id]).df()


def frame_percentiles(cur, run_id: str) -> dict:
    """Whole-run p50/p95/p99 of true latency and p95 of the gateway's (naive) latency."""
    row = cur.execute(
        "SELECT quantile_cont(latency_ms, [0.5, 0.95, 0.99]), "
        "quantile_cont(naive_latency_ms, 0.95) FROM frames WHERE run_id = ?",
        [run_id]).fetchone()
    q = row[0] or [None, None, None]
    return {"p50_ms": q[0], "p95_ms": q[1], "p99_ms": q[2], "naive_p95_ms": row[1]}


def frame_counts(cur, run_id: str) -> dict:
    row = cur.execute(
        "SELECT count(*), sum(CASE WHEN silent THEN 1 ELSE 0 END) FROM frames WHERE run_id = ?",
        [run_id]).fetchone()
    return {"frames": int(row[0] or 0), "silent_frames": int(row[1] or 0)}


def steps(cur, run_id: str) -> list[dict]:
    return cur.execute(
        "SELECT t, step_ms, prompt_tokens, gen_tokens, used_blocks, resident_tokens, running "
        "FROM steps WHERE run_id = ? ORDER BY t", [run_id]).df().to_dict("records")


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
               max(overrun_ms) AS max_overrun_ms
        FROM ticks WHERE run_id = ? GROUP BY 1 ORDER BY 1
        """, [bucket_s, bucket_s, run_id]).df()


def frame_buckets(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0) -> pd.DataFrame:
    """Per time bucket, the truthful and the naive (gateway) view of the same frames: latency
    percentiles, silent frames, deadline misses. Columns as latency_percentiles plus
    silent_per_s, miss_rate (truthful) and naive_miss_rate (empty frames counted on time).
    `since` (a bucket edge) limits it to the buckets from there on, for incremental refresh."""
    df = cur.execute(
        """
        SELECT floor(t_submit / ?) * ? AS t,
               quantile_cont(latency_ms, [0.5, 0.95, 0.99]) AS q,
               quantile_cont(naive_latency_ms, 0.95) AS naive_p95_ms,
               count(*) AS frames,
               count(*) FILTER (WHERE silent) / ? AS silent_per_s,
               avg(CASE WHEN on_time THEN 0.0 ELSE 1.0 END) AS miss_rate,
               avg(CASE WHEN naive_on_time THEN 0.0 ELSE 1.0 END) AS naive_miss_rate
        FROM frames WHERE run_id = ? AND t_submit >= ? GROUP BY 1 ORDER BY 1
        """, [bucket_s, bucket_s, bucket_s, run_id, since]).df()
    if df.empty:
        return pd.DataFrame(columns=["t", "p50_ms", "p95_ms", "p99_ms", "naive_p95_ms", "frames",
                                     "silent_per_s", "miss_rate", "naive_miss_rate"])
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
                       [run_id]).fetch_arrow_table()


# --- replay: what a recorded run offered ------------------------------------------------------
def replay_frames(cur, run_id: str, frame_s: float) -> pd.DataFrame:
    """Per session of a run: frames recorded (the last index + 1), its first frame's time
    (frame k is due at start + k·T and is never submitted before it, so the least
    t_submit − k·T is the start, up to the engine's submit delay) and the tokens asked per
    frame, in frame order."""
    return cur.execute(
        """
        SELECT session_id, max(frame_idx) + 1 AS frames,
               min(t_submit - frame_idx * ?) AS start_s,
               list(tokens_expected ORDER BY frame_idx) AS tokens_out
        FROM frames WHERE run_id = ? GROUP BY session_id ORDER BY session_id
        """, [frame_s, run_id]).df()


def session_outcomes(cur, run_id: str) -> dict[int, str]:
    """Sessions the system turned away or closed early (reject, evict, session error,
    max_model_len), by session id: the event kind and its reason."""
    rows = cur.execute(
        "SELECT CAST(json_extract(detail, '$.session_id') AS INTEGER), kind, "
        "json_extract_string(detail, '$.reason') FROM events "
        "WHERE run_id = ? AND kind IN ('reject', 'close') ORDER BY t", [run_id]).fetchall()
    return {sid: f"{kind}: {reason}" for sid, kind, reason in rows if sid is not None}


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
