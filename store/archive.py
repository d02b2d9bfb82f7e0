"""Retention: old runs move to Parquet files beside the database, and can be read back.

Layout: `<db>.archive/<run_id>/<table>.parquet`, one file per table that has rows keyed by the
run. A run is written to `<run_id>.partial/`, each file's row count is checked against the
database, the folder is renamed, and only then are the run's rows deleted, in one transaction
that counts them again: a mismatch anywhere keeps the run in the database and says why in the
`archives` table. Nothing moved is lost; at worst a run is in both places.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from store.archive_fs import UnsafePath, checked_id, RUN_ID, durable_rename, remove_tree
from store import rollup_build, rollups
from store.schema import ROLLUP_SCHEMA, ROLLUP_TABLES, RUN_TABLES

logger = logging.getLogger(__name__)

MAX_AGE_S = 36500 * 86400.0  # a century: beyond it datetime arithmetic overflows


class ArchiveMismatch(RuntimeError):
    """Row counts differ between the database and what was written or is about to be deleted."""


@dataclass(frozen=True)
class ArchiveResult:
    run_id: str
    status: str  # "archived" | "failed"
    reason: str | None = None
    rows: dict = field(default_factory=dict)  # table -> rows moved
    path: str | None = None


def archive_dir(db_path: str) -> Path:
    """The folder archived runs go to: beside the database file, named after it."""
    if db_path == ":memory:":
        raise ValueError("an in-memory database has no folder to archive runs beside")
    return Path(str(Path(db_path).expanduser().resolve()) + ".archive")


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def old_runs(cur, max_age_s: float, now: dt.datetime | None = None) -> list[str]:
    """Runs that ended (or started, if they never recorded an end) more than max_age_s ago;
    a run still 'running' is never old."""
    if not 0 < max_age_s <= MAX_AGE_S:  # also refuses nan and inf
        raise ValueError(f"retention age {max_age_s} s must be in (0, {MAX_AGE_S:.0f}] s "
                         "(a century)")
    cutoff = (now or dt.datetime.now()) - dt.timedelta(seconds=max_age_s)
    rows = cur.execute(
        "SELECT run_id FROM runs WHERE status <> 'running' "
        "AND COALESCE(ended_at, started_at) < ? ORDER BY started_at", [cutoff]).fetchall()
    return [r[0] for r in rows]


def archive_older_than(store, max_age_s: float, now: dt.datetime | None = None
                       ) -> list[ArchiveResult]:
    """Move every run older than max_age_s to Parquet (see the module docstring)."""
    results = [archive_run(store, run_id) for run_id in old_runs(store.cursor(), max_age_s, now)]
    moved = sum(r.status == "archived" for r in results)
    if results:
        logger.info("retention: %d run(s) archived, %d kept (see the archives table)", moved,
                    len(results) - moved)
    return results


def archive_run(store, run_id: str) -> ArchiveResult:
    """Move one run's rows to Parquet, verified and fsynced, then delete them from the
    database. A run id that is not a safe folder name is kept in the database (status failed),
    never turned into a path."""
    root = archive_dir(store.path)
    partial = None
    try:
        checked_id(run_id)
        final = root / run_id
        partial = root / f"{run_id}.partial"
        # Rollups merged first: a compaction between counting and deleting would change them.
        store.writer.call(lambda con: rollups.compact(con, run_id, -math.inf), timeout=600)
        counts = _db_counts(store.cursor(), run_id)
        if counts["runs"] != 1:
            raise ArchiveMismatch(f"run {run_id} has {counts['runs']} rows in runs, expected 1")
        remove_tree(root, partial)
        partial.mkdir(parents=True)
        written = _write_parquet(store.cursor(), run_id, partial)
        if written != counts:
            raise ArchiveMismatch(f"Parquet rows {written} differ from the database's {counts}")
        # An earlier attempt got this far but its delete did not happen.
        remove_tree(root, final)
        durable_rename(partial, final)  # on disk before a single row is deleted
        store.writer.call(lambda con: _delete_counted(con, run_id, counts))
    except (ArchiveMismatch, UnsafePath, OSError, duckdb.Error) as exc:
        if partial is not None:
            try:
                remove_tree(root, partial)
            except OSError as cleanup:  # the real error is what the operator needs
                logger.warning("retention: could not remove %s: %s", partial, cleanup)
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        logger.warning("retention: run %s kept in the database: %s", run_id, reason)
        result = ArchiveResult(run_id, "failed", reason)
    else:
        result = ArchiveResult(run_id, "archived", None, counts, str(final))
    store.writer.call(lambda con: con.execute(
        "INSERT INTO archives (run_id, archived_at, status, reason, path, row_counts) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [run_id, dt.datetime.now(), result.status, result.reason, result.path,
         json.dumps(result.rows)]))
    return result


def _db_counts(cur, run_id: str) -> dict:
    return {t: cur.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
            for t in RUN_TABLES}


def _write_parquet(cur, run_id: str, folder: Path) -> dict:
    """COPY each table's rows of the run to folder/<table>.parquet; the rows read back."""
    written = {}
    for table in RUN_TABLES:
        path = folder / f"{table}.parquet"
        cur.execute(f"COPY (SELECT * FROM {table} WHERE run_id = ?) TO {_quote(path)} "
                    "(FORMAT parquet)", [run_id])
        written[table] = parquet_rows(path)
    return written


def parquet_rows(path: Path) -> int:
    """Rows in a Parquet file, read back through DuckDB (what a reader of the archive sees)."""
    con = duckdb.connect()
    try:
        return con.execute(f"SELECT count(*) FROM read_parquet({_quote(path)})").fetchone()[0]
    finally:
        con.close()


def _delete_counted(con, run_id: str, expected: dict) -> None:
    """In the writer thread: delete the run's rows in one transaction, only if the rows there
    are still exactly the ones archived."""
    con.begin()
    try:
        now = _db_counts(con, run_id)
        if now != expected:
            raise ArchiveMismatch(f"rows changed while archiving: {now} vs archived {expected}")
        for table in RUN_TABLES:
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        con.commit()
    except BaseException as exc:
        try:  # a failed commit has already ended the transaction: rollback would say
            con.rollback()  # "no transaction is active" and hide the real error
        except duckdb.Error as rollback_error:
            logger.debug("rollback after %s: %s", type(exc).__name__, rollback_error)
        raise


# --- reading the archive back -----------------------------------------------------------------
def archived_runs(db_path: str) -> list[str]:
    """Run ids with a complete archive folder (newest first by id, which sorts by start)."""
    try:
        root = archive_dir(db_path)
    except ValueError:
        return []
    if not root.is_dir():
        return []
    return sorted((p.name for p in root.iterdir()
                   if p.is_dir() and RUN_ID.fullmatch(p.name)
                   and (p / "runs.parquet").is_file()), reverse=True)


def open_archived(db_path: str, run_id: str):
    """An in-memory DuckDB connection whose tables runs, frames, ticks, events, steps and the
    rollups are views over one archived run's Parquet files, so every query in store.queries
    and store.rollup_queries (and the console's views) reads it as if it were still in the
    database (a run archived before rollups is rolled up in memory). The caller closes it."""
    folder = archive_dir(db_path) / checked_id(run_id)
    if not (folder / "runs.parquet").is_file():
        raise ValueError(f"run {run_id} is not archived in {folder.parent}")
    con = duckdb.connect()
    for table in RUN_TABLES:
        if not (folder / f"{table}.parquet").is_file():
            continue  # archived before the table existed (rank_ticks): readers find it absent
        source = _quote(folder / f"{table}.parquet")
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({source})")
    if not all((folder / f"{t}.parquet").is_file() for t in ROLLUP_TABLES):
        # Archived before rollups: rolled up here, in this private connection's memory.
        for table in ROLLUP_TABLES:
            con.execute(f"DROP VIEW IF EXISTS {table}")
        con.execute(ROLLUP_SCHEMA)
        rollup_build.build_on(con, run_id)
    return con
