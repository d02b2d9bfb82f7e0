"""Reads of per-rank telemetry (data-parallel runs): the `rank_ticks` table."""

from __future__ import annotations

import duckdb
import pandas as pd

RANK_COLUMNS = ["t", "rank", "occupancy", "live", "stalled", "silent_frames", "tsat_s"]


def rank_occupancy(cur, run_id: str, since: float = 0.0) -> pd.DataFrame:
    """One row per rank per tick from `since` (t, rank, occupancy, live, stalled,
    silent_frames, tsat_s); empty for a single-rank run or an archive made before ranks."""
    try:
        return cur.execute(
            "SELECT t, rank, occupancy, live, stalled, silent_frames, tsat_s FROM rank_ticks "
            "WHERE run_id = ? AND t >= ? ORDER BY t, rank", [run_id, since]).df()
    except duckdb.CatalogException:
        return pd.DataFrame(columns=RANK_COLUMNS)


def rank_stalls(cur, run_id: str) -> pd.DataFrame:
    """Per rank: when it first stalled (None: never) and its silent frames."""
    try:
        return cur.execute(
            "SELECT rank, min(t) FILTER (WHERE stalled) AS stall_at_s, "
            "sum(silent_frames) AS silent_frames, max(occupancy) AS max_occupancy "
            "FROM rank_ticks WHERE run_id = ? GROUP BY rank ORDER BY rank", [run_id]).df()
    except duckdb.CatalogException:
        return pd.DataFrame(columns=["rank", "stall_at_s", "silent_frames", "max_occupancy"])


def rank_buckets(cur, run_id: str, bucket_s: float = 1.0, since: float = 0.0) -> pd.DataFrame:
    """Per rank per time bucket (from the bucket edge `since` on): the highest occupancy,
    whether it stalled, silent frames (what the Live page draws, one line per rank)."""
    try:
        return cur.execute(
            "SELECT floor(t / ?) * ? AS t, rank, max(occupancy) AS occupancy, "
            "bool_or(stalled) AS stalled, sum(silent_frames) AS silent_frames, "
            "max(live) AS live FROM rank_ticks WHERE run_id = ? AND t >= ? GROUP BY 1, 2 "
            "ORDER BY 1, 2", [bucket_s, bucket_s, run_id, since]).df()
    except duckdb.CatalogException:
        return pd.DataFrame(columns=["t", "rank", "occupancy", "stalled", "silent_frames",
                                     "live"])
