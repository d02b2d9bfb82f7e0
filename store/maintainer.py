"""The writer's side of the rollups (store/rollups.py): every batch in one transaction with
what it changes in the rollups (frames, ticks) and in stall_ends (ticks, events); compaction
now and then. The deltas are computed in Python (store/rollup_deltas.py: a delta_sql
statement's planning was most of a flush's CPU), by SQL for a value Python will not read as
DuckDB's CAST does."""

from __future__ import annotations

import logging
import time

import pandas as pd

from store import rollup_deltas
from store.batches import batch_of, columns_of
from store.rollups import COMPACT_EVERY_S, ROLLED, compact, insert_rollups, rollback
from store.stall_ends import OpenStalls

logger = logging.getLogger(__name__)


def _rollups(con, table: str, batch, rows: list[dict]) -> dict[str, float]:
    """The batch's rollup deltas inserted; per run, the earliest time it touched."""
    try:
        return rollup_deltas.insert(con, table, rows)
    except (TypeError, ValueError, OverflowError) as exc:  # nothing was written
        logger.debug("rollups of a %s batch by SQL: %s", table, exc)
        return insert_rollups(con, table, columns_of(batch))


class Maintainer:
    """One per writer, used from its thread only. Compaction failing costs nothing but size
    (logged; the run is retried later)."""

    def __init__(self, every_s: float | None = None) -> None:
        self.every_s = COMPACT_EVERY_S if every_s is None else every_s
        self._dirty: dict[str, float] = {}  # run → earliest time touched since compaction
        self._next = time.monotonic() + self.every_s
        self._stalls = OpenStalls()
        self._last_error: str | None = None  # a compaction's, logged once while it repeats

    def insert(self, con, table: str, rows: list[dict]) -> None:
        """Insert the rows into `table` with their rollups and stall ends, one transaction;
        raises what DuckDB raised, with none of them written."""
        if not rows:
            return
        batch = batch_of(rows)
        con.register("_batch", batch)
        try:
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _batch")
                touched = _rollups(con, table, batch, rows) if table in ROLLED else {}
                stalls = (self._stalls.on_ticks(con, rows) if table == "ticks" else
                          self._stalls.on_events(con, rows) if table == "events" else [])
                con.execute("COMMIT")
            except BaseException:
                rollback(con)
                raise
        finally:
            con.unregister("_batch")
        self._stalls.commit(stalls)
        for run_id, t in touched.items():
            self._dirty[run_id] = min(t, self._dirty.get(run_id, t))

    @staticmethod
    def probe(con, table: str, row: dict) -> None:
        """Raise what inserting this one row would raise; writes nothing (rolled back)."""
        con.register("_batch", pd.DataFrame([row]))
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _batch")
        finally:
            rollback(con)
            con.unregister("_batch")

    def maybe_compact(self, con, force: bool = False, before=None) -> None:
        """Compact what was written since the last compaction, when it is due (or `force`);
        `before()` is called first when it is (the writer's wait for an idle engine)."""
        if not self._dirty or (not force and time.monotonic() < self._next):
            return
        if before is not None:
            before()
        self._next = time.monotonic() + self.every_s
        for run_id, since in list(self._dirty.items()):
            try:
                compact(con, run_id, since)
                del self._dirty[run_id]
            except Exception as exc:  # noqa: BLE001 - rows stay valid uncompacted
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                (logger.debug if why == self._last_error else logger.warning)(
                    "rollups of run %s not compacted (retried later): %s", run_id, why)
                self._last_error = why
