"""A batch's rollup deltas computed in Python: the rows `rollups.delta_sql` makes, without its
statement, then one plain INSERT per rollup table.

Why: on the frame path a DuckDB statement costs its planning however few rows it reads, and
delta_sql's are big (a CTE, a CASE per latency bin, every level joined in). With one DuckDB
thread on a 2-core EPYC a flush of one session's half second took 54.7 ms of CPU with them and
25.4 ms this way (benchmarks/writer_flush.py, docs/benchmarks/frame_floor.md), every half
second, on the cores the engine's frames run on.

The semantics are delta_sql's, NULLs included: a NaN is NULL (store/batches.py), a count
FILTER counts only TRUE, `arg_max` skips NULL values, a row without a time is not rolled up.
`tests/store/test_rollup_deltas.py` holds the two to the same rows. A value Python cannot
take the way DuckDB's CAST would (a string, a date) raises TypeError: the caller then uses
delta_sql, so an odd batch costs a statement, never a wrong rollup.
"""

from __future__ import annotations

import math
import numbers

from store import rollups
from store.batches import batch_of

_CAUSES = ("memory", "compute", "guard", "other")
_LOG_RATIO = math.log(rollups.BIN_RATIO)
_ARG_MAX = ("live", "limit_sessions", "used_blocks", "total_blocks", "admitted", "rejected",
            "evicted", "tsat_s", "rho_slope_per_s", "n_star")


def insert(con, table: str, rows: list[dict]) -> dict[str, float]:
    """INSERT the rollup deltas of `rows` (already inserted into `table`, in the caller's
    transaction). Returns, per run, the earliest time the rows touched (for compaction).
    Raises TypeError or ValueError, having written nothing, for a value it cannot read."""
    # Everything read before anything is written: a TypeError leaves nothing to undo.
    deltas = deltas_of(table, rows)
    earliest = touched(rows, rollups.TIME[table])
    for rollup, delta in deltas.items():
        if not delta:
            continue
        con.register("_delta", batch_of(delta))
        try:
            con.execute(f"INSERT INTO {rollup} BY NAME SELECT * FROM _delta")
        finally:
            con.unregister("_delta")
    return earliest


def deltas_of(table: str, rows: list[dict]) -> dict[str, list[dict]]:
    """Per rollup table of `table`, the delta rows of `rows` (delta_sql's rows)."""
    if table == "ticks":
        return {"tick_rollups": _tick_rollups(rows)}
    frames = [f for f in map(_frame, rows) if f is not None]  # read once for the three
    return {rollup: _levels(fn(frames)) for rollup, fn in _FRAME_DELTAS.items()}


def touched(rows: list[dict], column: str) -> dict[str, float]:
    """Per run, the earliest `column` of the rows (NULL and NaN left out, as min() in SQL)."""
    out: dict[str, float] = {}
    for row in rows:
        run_id, t = row.get("run_id"), _num(row.get(column))
        if run_id is None or t is None:
            continue
        run_id = str(run_id)
        out[run_id] = min(t, out.get(run_id, t))
    return out


# --- values as DuckDB's CAST reads them ------------------------------------------------------
def _num(v) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{v!r} is not a number")
    v = float(v)
    return None if v != v else v  # NaN: NULL


def _int(v) -> int | None:
    v = _num(v)
    if v is not None and not v.is_integer():
        raise TypeError(f"{v!r} is not a whole number")  # DuckDB's CAST would round it
    return None if v is None else int(v)


def _str(v) -> str | None:
    return None if v is None else str(v)


def _bool(v) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    if type(v).__name__ == "bool_":  # numpy's
        return bool(v)
    if isinstance(v, float) and v != v:
        return None
    raise TypeError(f"{v!r} is not a boolean")


def _levels(first: dict[tuple, dict]) -> list[dict]:
    """Level-1 rows (keyed run_id, t, extra keys; every other column a sum) and every coarser
    level merged from them, as delta_sql merges its level-1 aggregate."""
    out = list(first.values())
    for level in rollups.LEVELS[1:]:
        merged: dict[tuple, dict] = {}
        for (run_id, t1, *keys), row in first.items():
            t = float(math.floor(t1 / level) * level)
            into = merged.get((run_id, t, *keys))
            if into is None:
                merged[(run_id, t, *keys)] = {**row, "level_s": level, "t": t}
            else:
                for column, value in row.items():
                    if column not in _KEYS:
                        into[column] += value
        out.extend(merged.values())
    return out


def _buckets(t: float):
    """(level_s, bucket start) of every level for a row at run time t (level 1 first)."""
    t1 = math.floor(t)
    return [(level, float(math.floor(t1 / level) * level)) for level in rollups.LEVELS]


def _bin(x: float | None) -> int | None:
    if x is None:
        return None
    if x == math.inf:
        return rollups.CENSORED_BIN
    if x <= rollups.BIN_BASE_MS:
        return 0
    return int(min(rollups.MAX_BIN, math.ceil(math.log(x / rollups.BIN_BASE_MS) / _LOG_RATIO)))


# --- frames ----------------------------------------------------------------------------------
def _frame(row: dict) -> dict | None:
    """A frame row's values as the rollups read them; None where it has no time."""
    t = _num(row.get("t_submit"))
    if t is None:
        return None
    complete, on_time = _bool(row.get("complete")), _bool(row.get("on_time"))
    censored = _bool(row.get("censored"))
    censored = censored if censored is not None else (
        (not complete) if complete is not None else False)
    return {"run_id": _str(row.get("run_id")), "t": t, "session_id": _int(row.get("session_id")),
            "silent": _bool(row.get("silent")) is True, "cause": row.get("silent_cause"),
            "censored": censored, "late": complete is True and on_time is False,
            "miss": on_time is not True, "naive_miss": _bool(row.get("naive_on_time")) is not True,
            "tokens": _int(row.get("tokens_out")), "latency": _num(row.get("latency_ms")),
            "naive": _num(row.get("naive_latency_ms"))}


def _frame_rollups(frames: list[dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for f in frames:
        t = float(math.floor(f["t"]))
        r = out.get((f["run_id"], t))
        if r is None:
            r = out[(f["run_id"], t)] = {
                "run_id": f["run_id"], "level_s": 1, "t": t, "frames": 0, "silent": 0,
                **{f"silent_{c}": 0 for c in _CAUSES}, "censored": 0, "late": 0, "misses": 0,
                "naive_misses": 0, "tokens_out": 0}
        r["frames"] += 1
        r["silent"] += f["silent"]
        if f["silent"] and f["cause"] in _CAUSES:
            r[f"silent_{f['cause']}"] += 1
        r["censored"] += f["censored"]
        r["late"] += f["late"]
        r["misses"] += f["miss"]
        r["naive_misses"] += f["naive_miss"]
        r["tokens_out"] += f["tokens"] or 0
    return out


def _latency_rollups(frames: list[dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for f in frames:
        t = float(math.floor(f["t"]))
        true_bin = _bin(math.inf if f["censored"] else f["latency"])
        for column, b in (("n", true_bin), ("naive_n", _bin(f["naive"]))):
            if b is None:
                continue
            r = out.get((f["run_id"], t, b))
            if r is None:
                r = out[(f["run_id"], t, b)] = {"run_id": f["run_id"], "level_s": 1, "t": t,
                                                "bin": b, "n": 0, "naive_n": 0}
            r[column] += 1
    return out


def _wall_rollups(frames: list[dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for f in frames:
        t = float(math.floor(f["t"]))
        r = out.get((f["run_id"], t, f["session_id"]))
        if r is None:
            r = out[(f["run_id"], t, f["session_id"])] = {
                "run_id": f["run_id"], "level_s": 1, "t": t, "session_id": f["session_id"],
                "frames": 0, "silent": 0, "tokens": 0}
        r["frames"] += 1
        r["silent"] += f["silent"]
        r["tokens"] += f["tokens"] or 0
    return out


# --- ticks -----------------------------------------------------------------------------------
def _tick_rollups(rows: list[dict]) -> list[dict]:
    out: dict[tuple, dict] = {}
    latest: dict[tuple, float] = {}  # (key, column) → the t its arg_max value came from
    for row in rows:
        t_row = _num(row.get("t"))
        if t_row is None:
            continue
        occupancy, tsat = _num(row.get("occupancy")), _num(row.get("tsat_s"))
        stalled, overrun = _bool(row.get("stalled")), _num(row.get("overrun_ms"))
        values = {c: _num(row.get(c)) for c in _ARG_MAX}
        made = (tsat is not None and math.isfinite(tsat) and occupancy is not None
                and rollups.TSAT_RHO_MADE <= occupancy < 0.99)
        for level, t in _buckets(t_row):
            key = (_str(row.get("run_id")), level, t)
            r = out.setdefault(key, {
                "run_id": key[0], "level_s": level, "t": t, "ticks": 0, "t_last": None,
                **dict.fromkeys(_ARG_MAX), "occupancy": None, "stalled": None,
                "max_overrun_ms": None, "first_flowing_t": None, "tsat_made_t": None})
            r["ticks"] += 1
            r["t_last"] = _max(r["t_last"], t_row)
            for c, v in values.items():
                if v is not None and t_row >= latest.get((key, c), -math.inf):
                    latest[(key, c)] = t_row
                    r[c] = v
            r["occupancy"] = _max(r["occupancy"], occupancy)
            if stalled is not None:
                r["stalled"] = bool(r["stalled"]) or stalled
            r["max_overrun_ms"] = _max(r["max_overrun_ms"], overrun)
            if stalled is not True:
                r["first_flowing_t"] = _min(r["first_flowing_t"], t_row)
            if made:
                r["tsat_made_t"] = _min(r["tsat_made_t"], t_row)
    return list(out.values())


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


def _min(a, b):
    return b if a is None else a if b is None else min(a, b)


_KEYS = frozenset({"run_id", "level_s", "t", "bin", "session_id"})
_FRAME_DELTAS = {"frame_rollups": _frame_rollups, "latency_rollups": _latency_rollups,
                 "wall_rollups": _wall_rollups}
assert {*_FRAME_DELTAS, "tick_rollups"} == set(rollups.SPECS), "every rollup has its delta"
