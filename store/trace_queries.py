"""Queries that read what a recorded run offered, for replaying it (runtime/trace_source.py)."""

from __future__ import annotations

import pandas as pd


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


