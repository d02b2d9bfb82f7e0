"""Rolling up a run recorded before rollups existed (or whose rollups were cut short): once,
on first open, in the writer thread, a chunk of frames per call so the progress shows and
the writer keeps serving other runs between chunks.

`rolled_up` is the check (the rollups count exactly the run's frame and tick rows), `ensure`
the whole job: level-1 rollups chunk by chunk (whole seconds, so no bucket spans two chunks),
then every coarser level from them in level and time order; `build_on` does it on a private
connection (an archived run's, read from Parquet, which no writer owns).
"""

from __future__ import annotations

import logging
import math
import threading

from store import rollups, stall_ends
from store.rollups import SPECS
from store.schema import ROLLUP_TABLES

logger = logging.getLogger(__name__)

CHUNK_FRAMES = 1_000_000  # frames rolled up per writer call (about a second of work)
_lock = threading.Lock()  # one build at a time: two viewers opening one old run add up once
_known: set = set()  # (database, run) found rolled up in this process: not checked again


def counts(cur, run_id: str) -> dict:
    """Frame and tick rows of the run, and what its rollups count of them."""
    top = rollups.LEVELS[-1]
    row = cur.execute(
        "SELECT (SELECT count(t_submit) FROM frames WHERE run_id = $r), "
        "(SELECT coalesce(sum(frames), 0) FROM frame_rollups WHERE run_id = $r "
        f"AND level_s = {top}), "
        "(SELECT count(t) FROM ticks WHERE run_id = $r), "
        f"(SELECT coalesce(sum(ticks), 0) FROM tick_rollups WHERE run_id = $r AND level_s = {top})",
        {"r": run_id}).fetchone()
    return {"frames": row[0], "rolled_frames": int(row[1]), "ticks": row[2],
            "rolled_ticks": int(row[3])}


def rolled_up(cur, run_id: str) -> bool:
    c = counts(cur, run_id)
    return c["frames"] == c["rolled_frames"] and c["ticks"] == c["rolled_ticks"]


def _span(cur, run_id: str) -> tuple[float, float, int]:
    lo, hi, n = cur.execute(
        "SELECT min(lo), max(hi), sum(n) FROM ("
        "SELECT min(t_submit) lo, max(t_submit) hi, count(t_submit) n FROM frames "
        "WHERE run_id = $r UNION ALL "
        "SELECT min(t), max(t), count(t) FROM ticks WHERE run_id = $r)", {"r": run_id}).fetchone()
    return (0.0, 0.0, 0) if lo is None else (math.floor(lo), math.floor(hi) + 1.0, int(n))


def _chunks(lo: float, hi: float, n: int) -> list[tuple[float, float]]:
    k = max(1, math.ceil(n / CHUNK_FRAMES))
    step = max(1.0, math.ceil((hi - lo) / k))
    edges = [lo + i * step for i in range(k) if lo + i * step < hi] + [hi]
    return list(zip(edges[:-1], edges[1:]))


def _delete(con, run_id: str) -> None:
    for table in ROLLUP_TABLES:
        con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])


def _chunk(con, run_id: str, lo: float, hi: float) -> None:
    """Level-1 rollups of the run's rows with time in [lo, hi) (whole seconds: no bucket
    spans two chunks), one transaction."""
    _transaction(con, [(rollups.delta_sql(table, rollups.source(
        src, f"{src} WHERE run_id = $r AND {rollups.TIME[src]} >= $lo AND "
        f"{rollups.TIME[src]} < $hi"), levels=(1,)), {"r": run_id, "lo": lo, "hi": hi})
        for table, (src, _, _) in SPECS.items()])


def _coarse(con, run_id: str) -> None:
    """Every level above 1, from the level-1 rows, and the stall ends, one transaction (after
    all chunks: the check `rolled_up` reads the top level, so a build cut short before here
    is redone)."""
    _transaction(con, [(rollups.coarse_sql(table), {"r": run_id}) for table in SPECS]
                 + [(stall_ends.rows_sql(), {"r": run_id})])


def _transaction(con, statements: list) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        for sql, params in statements:
            con.execute(sql, params)
        con.execute("COMMIT")
    except BaseException:
        rollups.rollback(con)
        raise


def build_on(con, run_id: str, progress=None) -> None:
    """Roll the run up from its rows on `con` (whatever rollups it had are replaced)."""
    lo, hi, n = _span(con, run_id)
    _delete(con, run_id)
    pieces = _chunks(lo, hi, n)
    for i, (a, b) in enumerate(pieces):
        _chunk(con, run_id, a, b)
        if progress is not None:
            progress((i + 1) / (len(pieces) + 1))
    _coarse(con, run_id)
    if progress is not None:
        progress(1.0)


def ensure(store, run_id: str, progress=None) -> bool:
    """Roll the run up unless its rollups already count all its rows; True when it had to.
    `progress(fraction)` is called after each chunk. Runs through the store's writer."""
    key = (store.path, run_id)
    if key in _known:
        return False
    with _lock:
        if rolled_up(store.cursor(), run_id):
            _known.add(key)
            return False
        c = counts(store.cursor(), run_id)
        logger.info("rolling up run %s (%d frames, %d ticks; its rollups had %d and %d)",
                    run_id, c["frames"], c["ticks"], c["rolled_frames"], c["rolled_ticks"])
        lo, hi, n = _span(store.cursor(), run_id)
        store.writer.call(lambda con: _delete(con, run_id))
        pieces = _chunks(lo, hi, n)
        for i, (a, b) in enumerate(pieces):
            store.writer.call(lambda con, a=a, b=b: _chunk(con, run_id, a, b), timeout=600)
            if progress is not None:
                progress((i + 1) / (len(pieces) + 1))
        store.writer.call(lambda con: _coarse(con, run_id), timeout=600)
        if progress is not None:
            progress(1.0)
        if rolled_up(store.cursor(), run_id):
            _known.add(key)
        return True


def differences(cur, run_id: str) -> dict[str, int]:
    """Per rollup table, how many merged rows of the run differ from rollups recomputed from
    its frames and ticks now (0 everywhere: consistent): the tests' check, and a file's by
    hand."""
    out = {}
    for table, (src, keys, _) in SPECS.items():
        cur.execute(f"CREATE OR REPLACE TEMP TABLE _expected AS FROM {table} LIMIT 0")
        cur.execute(rollups.delta_sql(table, rollups.source(src, f"{src} WHERE run_id = $r"),
                                      into="_expected"), {"r": run_id})
        group = ", ".join(("run_id", "level_s", "t", *keys))
        merged = (f"SELECT {group}, {rollups.merged(table)} FROM {{}} WHERE run_id = $r "
                  f"GROUP BY {group}")
        out[table] = cur.execute(
            f"SELECT count(*) FROM (({merged.format(table)} EXCEPT ALL "
            f"{merged.format('_expected')}) UNION ALL ({merged.format('_expected')} EXCEPT ALL "
            f"{merged.format(table)}))", {"r": run_id}).fetchone()[0]
    cur.execute("CREATE OR REPLACE TEMP TABLE _expected AS FROM stall_ends LIMIT 0")
    cur.execute(stall_ends.rows_sql().replace("INTO stall_ends", "INTO _expected"),
                {"r": run_id})
    mine = "SELECT t_event, t_end FROM {} WHERE run_id = $r"
    out["stall_ends"] = cur.execute(
        f"SELECT count(*) FROM (({mine.format('stall_ends')} EXCEPT ALL "
        f"{mine.format('_expected')}) UNION ALL ({mine.format('_expected')} EXCEPT ALL "
        f"{mine.format('stall_ends')}))", {"r": run_id}).fetchone()[0]
    cur.execute("DROP TABLE IF EXISTS _expected")
    return out
