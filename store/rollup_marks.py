"""What the charts mark and the gauges show, from the rollups (store/rollups.py) and a few
rows found through them: the latest tick, stall spans, the t_sat prediction and a window's
silent share, each equal to its exact version in store/queries.py without reading every tick
or frame of the run.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from store.queries import STALL_LABEL, prediction
from store.rollups import LEVELS, TSAT_RHO_MADE


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


def stall_spans(cur, run_id: str, summary: dict | None = None) -> pd.DataFrame:
    """store.queries.stall_spans from stall_ends (one row per stall, written as the ticks that
    end them arrive: store/stall_ends.py): each stall from its start to the first tick after
    its event that was not stalled, or to the last tick while it lasts."""
    rows = cur.execute(
        "SELECT e.t, e.detail, s.t_end FROM events e LEFT JOIN stall_ends s "
        "ON s.run_id = e.run_id AND s.t_event = e.t WHERE e.run_id = ? AND e.kind = 'stall' "
        "ORDER BY e.t", [run_id]).fetchall()
    if not rows:
        return pd.DataFrame(columns=SPAN_COLUMNS)
    last = (summary or tick_summary(cur, run_id))["t_last"]
    spans = []
    for t_event, detail, end in rows:
        d = json.loads(detail)
        spans.append({"t_start": float(d.get("since", t_event)),
                      "t_end": float(end if end is not None else last),
                      "label": d.get("label") or STALL_LABEL.format(ticks=d.get("ticks", 2))})
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
