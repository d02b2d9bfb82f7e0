"""Rollups: what the charts draw, aggregated per run and time bucket as the rows are written,
so a page reads O(seconds of run) rows instead of O(frames).

Four tables, each keyed by (run_id, level_s, t) where t is the start of a bucket of level_s
seconds (one of LEVELS) of run time (frames by t_submit, ticks by t):
  frame_rollups    frames, silent (and by cause), censored, late, misses, naive misses, tokens
  latency_rollups  + bin: histograms of latency in fixed log bins (`bin_sql`): frames whose
                   true latency is in the bin (n; censored ones in CENSORED_BIN: +inf) and
                   whose gateway (naive) latency is (naive_n)
  wall_rollups     + session_id: frames, silent frames and tokens per session
  tick_rollups     ticks: the bucket's last gauges and counters (by t_last), the highest ρ,
                   any stall, the worst overrun, the first tick that was not stalled, the
                   first tick that could make the t_sat mark

Every row is additive: rows with the same key merge (SPECS: sums, max, min, arg_max by
t_last), so the writer appends one *delta* row per key for each batch it inserts, in the
same transaction as the batch (a SIGKILL leaves rollups exactly matching the rows on disk),
and `compact` later merges each key's rows into one (also one transaction: nothing is lost
or counted twice however it is interrupted). Readers always merge, so they never see a
difference between compacted and not yet compacted rows. store/rollup_queries.py and
store/rollup_marks.py read them; `stall_ends`, kept in the same transactions, is
store/stall_ends.py's; a run recorded before rollups is rolled up by store/rollup_build.py.
"""

from __future__ import annotations

import logging
import math

from store.schema import ROLLUP_TABLES

logger = logging.getLogger(__name__)

LEVELS = (1, 10, 60, 300, 600, 3600)  # s; a chart bucket reads the largest level dividing it
# Latency bins: bin b holds (BASE·R^(b-1), BASE·R^b] ms, bin 0 everything ≤ BASE; a value above
# BASE·R^MAX_BIN (8.3 hours) is counted in MAX_BIN. A percentile read from the histograms
# (store/rollup_queries.py) is never below the exact one and less than 5 % above it.
BIN_BASE_MS = 0.1
BIN_RATIO = 1.05
MAX_BIN = 400
CENSORED_BIN = MAX_BIN + 1  # no answer by the time the frame was finalised: latency +inf
COMPACT_EVERY_S = 10.0
# The t_sat mark's "made at the first tick where ρ reached this with a finite t_sat"
# (store.queries.tsat_prediction's default), kept per bucket as tsat_made_t.
TSAT_RHO_MADE = 0.5

_COLUMNS = {  # the columns rollups read, typed as the tables declare them
    "frames": {"run_id": "VARCHAR", "session_id": "INTEGER", "t_submit": "DOUBLE",
               "latency_ms": "DOUBLE", "naive_latency_ms": "DOUBLE", "tokens_out": "INTEGER",
               "on_time": "BOOLEAN", "naive_on_time": "BOOLEAN", "silent": "BOOLEAN",
               "silent_cause": "VARCHAR", "censored": "BOOLEAN", "complete": "BOOLEAN"},
    "ticks": {"run_id": "VARCHAR", "t": "DOUBLE", "live": "INTEGER", "limit_sessions": "INTEGER",
              "occupancy": "DOUBLE", "used_blocks": "INTEGER", "total_blocks": "INTEGER",
              "admitted": "INTEGER", "rejected": "INTEGER", "evicted": "INTEGER",
              "tsat_s": "DOUBLE", "rho_slope_per_s": "DOUBLE", "stalled": "BOOLEAN",
              "overrun_ms": "DOUBLE", "n_star": "INTEGER"},
}
TIME = {"frames": "t_submit", "ticks": "t"}


def bin_sql(x: str) -> str:
    """SQL: the latency bin of the expression x (NULL for NULL or NaN: not counted)."""
    return (f"CASE WHEN {x} IS NULL OR isnan({x}) THEN NULL "
            f"WHEN {x} = 'infinity'::DOUBLE THEN {CENSORED_BIN} "
            f"WHEN {x} <= {BIN_BASE_MS} THEN 0 "
            f"ELSE least({MAX_BIN}, ceil(ln({x} / {BIN_BASE_MS}) / ln({BIN_RATIO}))) END")


def bin_edge(b: int) -> float:
    """The upper edge of bin b in ms (+inf for the censored bin)."""
    return math.inf if b >= CENSORED_BIN else BIN_BASE_MS * BIN_RATIO ** b


_CENSORED = "coalesce(censored, NOT complete, false)"
_T = "floor({t})"  # level-1 bucket of the source rows
# Per rollup table: the source table, its extra key columns, the level-1 aggregate of source
# rows `b` (SELECT list after run_id, t and the keys) and how rows of the table merge.
SPECS = {
    "frame_rollups": ("frames", (), {
        "frames": ("count(*)", "sum(frames)"),
        "silent": ("count(*) FILTER (WHERE silent)", "sum(silent)"),
        **{f"silent_{c}": (f"count(*) FILTER (WHERE silent AND silent_cause = '{c}')",
                           f"sum(silent_{c})") for c in ("memory", "compute", "guard", "other")},
        "censored": (f"count(*) FILTER (WHERE {_CENSORED})", "sum(censored)"),
        "late": ("count(*) FILTER (WHERE complete AND NOT on_time)", "sum(late)"),
        "misses": ("count(*) FILTER (WHERE NOT coalesce(on_time, false))", "sum(misses)"),
        "naive_misses": ("count(*) FILTER (WHERE NOT coalesce(naive_on_time, false))",
                         "sum(naive_misses)"),
        "tokens_out": ("coalesce(sum(tokens_out), 0)", "sum(tokens_out)")}),
    "latency_rollups": ("frames", ("bin",), {"n": ("sum(x)", "sum(n)"),
                                             "naive_n": ("sum(y)", "sum(naive_n)")}),
    "wall_rollups": ("frames", ("session_id",), {
        "frames": ("count(*)", "sum(frames)"),
        "silent": ("count(*) FILTER (WHERE silent)", "sum(silent)"),
        "tokens": ("coalesce(sum(tokens_out), 0)", "sum(tokens)")}),
    "tick_rollups": ("ticks", (), {
        "ticks": ("count(*)", "sum(ticks)"),
        "t_last": ("max(t)", "max(t_last)"),
        **{c: (f"arg_max({c}, t)", f"arg_max({c}, t_last)")
           for c in ("live", "limit_sessions", "used_blocks", "total_blocks", "admitted",
                     "rejected", "evicted", "tsat_s", "rho_slope_per_s", "n_star")},
        "occupancy": ("max(occupancy)", "max(occupancy)"),
        "stalled": ("bool_or(stalled)", "bool_or(stalled)"),
        "max_overrun_ms": ("max(overrun_ms)", "max(max_overrun_ms)"),
        "first_flowing_t": ("min(t) FILTER (WHERE NOT coalesce(stalled, false))",
                            "min(first_flowing_t)"),
        "tsat_made_t": (f"min(t) FILTER (WHERE isfinite(tsat_s) AND occupancy >= "
                        f"{TSAT_RHO_MADE} AND occupancy < 0.99)", "min(tsat_made_t)")}),
}
TABLES = tuple(SPECS)
assert set(SPECS) | {"stall_ends"} == set(ROLLUP_TABLES), "store/schema.py declares them"
ROLLED = {"frames": [t for t, s in SPECS.items() if s[0] == "frames"],
          "ticks": ["tick_rollups"]}


def merged(table: str) -> str:
    """The SELECT list that merges rows of a rollup table (after its grouping columns)."""
    return ", ".join(f"{m} AS {name}" for name, (_, m) in SPECS[table][2].items())


def source(table: str, relation: str, columns=None) -> str:
    """The rows of `relation` typed as `table` declares them; columns it lacks are NULL (a
    batch whose rows omit a column, as INSERT ... BY NAME allows)."""
    cols = ", ".join(f'CAST("{c}" AS {ty}) AS {c}' if columns is None or c in columns
                     else f"NULL::{ty} AS {c}" for c, ty in _COLUMNS[table].items())
    return f"SELECT {cols} FROM {relation}"


def _first_level(table: str, source: str) -> str:
    """Level-1 aggregate of the source rows: run_id, t, keys, the table's columns."""
    src, keys, cols = SPECS[table]
    t = _T.format(t=TIME[src])
    aggs = ", ".join(f"{first} AS {name}" for name, (first, _) in cols.items())
    if table == "latency_rollups":  # each frame twice: its true bin and its naive bin
        true = bin_sql(f"CASE WHEN {_CENSORED} THEN 'infinity'::DOUBLE ELSE latency_ms END")
        rows = (f"SELECT run_id, {t} AS t, {true} AS bin, 1 AS x, 0 AS y FROM b UNION ALL "
                f"SELECT run_id, {t} AS t, {bin_sql('naive_latency_ms')} AS bin, 0, 1 FROM b")
        return (f"SELECT run_id, t, bin, {aggs} FROM ({rows}) "
                f"WHERE bin IS NOT NULL AND t IS NOT NULL GROUP BY ALL")
    key = "".join(f", {k}" for k in keys)
    return (f"SELECT run_id, {t} AS t{key}, {aggs} FROM b WHERE {TIME[src]} IS NOT NULL "
            f"GROUP BY ALL")


def delta_sql(table: str, source: str, into: str | None = None,
              levels: tuple = LEVELS) -> str:
    """INSERT the rollup rows (of `levels`) of the typed source rows into `table` (or into
    `into`, a table of the same columns)."""
    keys = "".join(f", {k}" for k in SPECS[table][1])
    values = ", ".join(f"({lv})" for lv in levels)
    return (f"INSERT INTO {into or table} BY NAME WITH b AS ({source}), d AS "
            f"({_first_level(table, source)}) "
            f"SELECT run_id, l.level_s, floor(t / l.level_s) * l.level_s AS t{keys}, "
            f"{merged(table)} FROM d, (VALUES {values}) l(level_s) GROUP BY ALL")


def coarse_sql(table: str) -> str:
    """INSERT every level above 1 of run $r, merged from its level-1 rows, in level and time
    order (so a reader of one level skips the others' row groups)."""
    keys = "".join(f", {k}" for k in SPECS[table][1])
    values = ", ".join(f"({lv})" for lv in LEVELS[1:])
    return (f"INSERT INTO {table} BY NAME SELECT run_id, l.level_s, "
            f"floor(t / l.level_s) * l.level_s AS t{keys}, {merged(table)} FROM {table} r, "
            f"(VALUES {values}) l(level_s) WHERE r.run_id = $r AND r.level_s = 1 "
            f"GROUP BY ALL ORDER BY l.level_s, t")


def insert_rollups(con, table: str, columns) -> dict[str, float]:
    """INSERT the rollup deltas of the registered `_batch` of `table` by SQL (inside the
    caller's transaction): a run from before rollups, or a batch Python would not read as
    DuckDB's CAST does (store/maintainer.py tries store/rollup_deltas.py first). Returns, per
    run in the batch, the earliest time it touched (for `compact`)."""
    src = source(table, "_batch", set(columns))
    for rollup in ROLLED[table]:
        con.execute(delta_sql(rollup, src))
    touched = con.execute(f"SELECT run_id, min({TIME[table]}) FROM ({src}) "
                          "GROUP BY run_id").fetchall()
    return {run_id: t for run_id, t in touched if run_id is not None and t is not None}


def rollback(con) -> None:
    try:  # a failed COMMIT has ended the transaction already: rollback would say so
        con.execute("ROLLBACK")
    except Exception as exc:  # noqa: BLE001 - the original error is what matters
        logger.debug("rollback: %s", exc)


def compact(con, run_id: str, since: float) -> None:
    """Merge each key's rows of the run's buckets from `since` on into one row, every rollup
    table in one transaction (readers merge anyway: this only keeps the tables small)."""
    where = (f"run_id = ? AND t >= floor(? / {LEVELS[-1]}) * {LEVELS[-1]} "
             "AND t >= floor(? / level_s) * level_s")
    con.execute("BEGIN TRANSACTION")
    try:
        for table, (_, keys, _) in SPECS.items():
            group = "".join(f", {k}" for k in keys)
            con.execute(f"CREATE OR REPLACE TEMP TABLE _merged AS SELECT run_id, level_s, t"
                        f"{group}, {merged(table)} FROM {table} WHERE {where} "
                        f"GROUP BY run_id, level_s, t{group}", [run_id, since, since])
            con.execute(f"DELETE FROM {table} WHERE {where}", [run_id, since, since])
            # in level and time order: zone maps then skip what a reader of one level, or of
            # the last seconds, does not need
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _merged ORDER BY level_s, t")
        con.execute("DROP TABLE _merged")
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise
