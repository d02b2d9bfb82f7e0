"""Read queries for the console, the CLI and reports. Aggregation happens in SQL."""

from __future__ import annotations

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
    q = df.pop("q")
    df["p50_ms"] = [x[0] for x in q]
    df["p95_ms"] = [x[1] for x in q]
    df["p99_ms"] = [x[2] for x in q]
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
