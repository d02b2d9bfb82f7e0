"""Schedules and their fires in the store: the one place their rows are written and read.

Writes go through the writer thread (`StoreWriter.call`), so DuckDB keeps a single writer and
the caller still sees a failed write as an exception. Reads take a cursor, like store.queries.
"""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd

SCHEDULE_COLUMNS = ("schedule_id", "name", "kind", "trigger", "every_s", "cron", "params",
                    "misfire_grace_s", "busy_wait_s", "drift_threshold", "paused", "created_at")
FIRE_COLUMNS = ("fire_id", "schedule_id", "due_at", "started_at", "ended_at", "status", "reason",
                "run_ids", "n_star", "t_sat_s", "n_star_change", "t_sat_change", "drifted",
                "drift_note", "detail")


def _insert(table: str, row: dict):
    cols = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    values = [json.dumps(v) if isinstance(v, (list, dict)) else v for v in row.values()]
    return lambda con: con.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", values)


# --- schedules --------------------------------------------------------------------------------
def insert_schedule(store, row: dict) -> None:
    unknown = set(row) - set(SCHEDULE_COLUMNS)
    if unknown:
        raise ValueError(f"unknown schedule column(s) {', '.join(sorted(unknown))}")
    store.writer.call(_insert("schedules", row))


def set_paused(store, schedule_id: str, paused: bool) -> None:
    store.writer.call(lambda con: con.execute(
        "UPDATE schedules SET paused = ? WHERE schedule_id = ?", [paused, schedule_id]))


def set_invalid(store, schedule_id: str, reason: str | None) -> None:
    """Mark a schedule that cannot run (reason) or valid again (None)."""
    store.writer.call(lambda con: con.execute(
        "UPDATE schedules SET invalid = ? WHERE schedule_id = ?", [reason, schedule_id]))


def delete_schedule(store, schedule_id: str) -> None:
    """The schedule and its fire rows; the runs its fires made stay in the store."""
    def delete(con):
        con.execute("DELETE FROM schedule_fires WHERE schedule_id = ?", [schedule_id])
        con.execute("DELETE FROM schedules WHERE schedule_id = ?", [schedule_id])
    store.writer.call(delete)


def schedules(cur) -> list[dict]:
    df = cur.execute("SELECT * FROM schedules ORDER BY created_at, schedule_id").df()
    return [_clean(r) for r in df.to_dict("records")]


def schedule(cur, schedule_id: str) -> dict | None:
    df = cur.execute("SELECT * FROM schedules WHERE schedule_id = ?", [schedule_id]).df()
    return None if df.empty else _clean(df.iloc[0].to_dict())


# --- fires ------------------------------------------------------------------------------------
def insert_fire(store, row: dict) -> None:
    unknown = set(row) - set(FIRE_COLUMNS)
    if unknown:
        raise ValueError(f"unknown fire column(s) {', '.join(sorted(unknown))}")
    store.writer.call(_insert("schedule_fires", row))


def update_fire(store, fire_id: str, **values) -> None:
    unknown = set(values) - set(FIRE_COLUMNS)
    if unknown:
        raise ValueError(f"unknown fire column(s) {', '.join(sorted(unknown))}")
    sets = ", ".join(f"{k} = ?" for k in values)
    params = [json.dumps(v) if isinstance(v, (list, dict)) else v for v in values.values()]
    store.writer.call(lambda con: con.execute(
        f"UPDATE schedule_fires SET {sets} WHERE fire_id = ?", [*params, fire_id]))


def interrupt_running_fires(store, reason: str) -> int:
    """Fires still 'running' when a scheduler starts belong to one that stopped mid-fire."""
    def update(con):
        return con.execute(
            "UPDATE schedule_fires SET status = 'interrupted', reason = COALESCE(reason, ?), "
            "ended_at = COALESCE(ended_at, now()) WHERE status = 'running'",
            [reason]).fetchone()[0]
    return int(store.writer.call(update) or 0)


def last_due(cur, schedule_id: str) -> dt.datetime | None:
    """When the schedule last came due (fired, or was skipped or missed)."""
    row = cur.execute("SELECT max(due_at) FROM schedule_fires WHERE schedule_id = ?",
                      [schedule_id]).fetchone()
    return None if row is None or row[0] is None else row[0]


def fires(cur, schedule_id: str | None = None, limit: int = 50) -> pd.DataFrame:
    """Fires newest first (of one schedule, or of all)."""
    where = "WHERE schedule_id = ?" if schedule_id else ""
    params = [schedule_id] if schedule_id else []
    return cur.execute(
        f"SELECT * FROM schedule_fires {where} ORDER BY COALESCE(started_at, due_at) DESC, "
        f"due_at DESC LIMIT ?", [*params, limit]).df()


def previous_metrics(cur, schedule_id: str, before_fire: str) -> dict:
    """The latest N* and t_sat measured by an earlier finished fire of the schedule, each from
    the newest fire that measured it (None: never measured)."""
    out = {}
    for metric in ("n_star", "t_sat_s"):
        row = cur.execute(
            f"SELECT {metric} FROM schedule_fires WHERE schedule_id = ? AND fire_id <> ? "
            f"AND status = 'finished' AND {metric} IS NOT NULL "
            f"ORDER BY ended_at DESC LIMIT 1", [schedule_id, before_fire]).fetchone()
        out[metric] = None if row is None else float(row[0])
    return out


def latest_drift(cur) -> pd.DataFrame:
    """Per schedule, its newest finished fire's measurements and their change since the fire
    before (relative: +0.25 is 25 % up), and whether that moved past the schedule's threshold.
    One row per schedule that has finished a fire; for exporters (e.g. Prometheus gauges)."""
    return cur.execute(
        """
        SELECT s.schedule_id, s.name, s.kind, s.drift_threshold, f.fire_id,
               f.ended_at, f.n_star, f.t_sat_s, f.n_star_change, f.t_sat_change,
               COALESCE(f.drifted, false) AS drifted, f.drift_note
        FROM schedules s
        JOIN (SELECT *, row_number() OVER (PARTITION BY schedule_id ORDER BY ended_at DESC)
                        AS newest
              FROM schedule_fires WHERE status = 'finished') f
          ON f.schedule_id = s.schedule_id AND f.newest = 1
        ORDER BY s.created_at, s.schedule_id
        """).df()


def _clean(row: dict) -> dict:
    """NaN/NaT from pandas back to None, params JSON to a dict."""
    out = {k: (None if _missing(v) else v) for k, v in row.items()}
    if isinstance(out.get("params"), str):
        out["params"] = json.loads(out["params"])
    if out.get("created_at") is not None and hasattr(out["created_at"], "to_pydatetime"):
        out["created_at"] = out["created_at"].to_pydatetime()
    return out


def _missing(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False

