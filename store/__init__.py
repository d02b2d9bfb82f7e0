"""The DuckDB store: one file, one writer thread, cursors for readers in the same process."""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path

import duckdb

from store.schema import MIGRATIONS, ROLLUP_TABLES, RUN_STATUSES, SCHEMA, TABLES
from store.writer import StoreWriter

logger = logging.getLogger(__name__)

DEFAULT_DB = "metronome.duckdb"
DB_THREADS_ENV = "METRONOME_DB_THREADS"
# vLLM's engine core and its worker each keep a core busy (they poll each other's queue).
ENGINE_CORES = 2

__all__ = ["DB_THREADS_ENV", "DEFAULT_DB", "RUN_STATUSES", "TABLES", "Store", "StoreError",
           "db_path", "db_threads", "open_existing", "open_store"]


class StoreError(RuntimeError):
    """The database cannot be opened; the message is one line for the operator.
    `holder_pid`: the process holding it, when that is why."""

    def __init__(self, message: str, holder_pid: int | None = None) -> None:
        super().__init__(message)
        self.holder_pid = holder_pid


def db_path(explicit: str | None = None) -> str:
    """--db beats METRONOME_DB beats the default file in the working directory."""
    return explicit or os.environ.get("METRONOME_DB") or DEFAULT_DB


class Store:
    def __init__(self, path: str) -> None:
        self.path = path
        self._con = _connect(path)
        self._con.execute(SCHEMA)
        self._con.execute(MIGRATIONS)
        self._abort_orphans()
        self.writer = StoreWriter(self._con.cursor())
        self._closed = False

    def cursor(self):
        """A cursor for one reader thread (DuckDB cursors are per-thread connections)."""
        return self._con.cursor()

    def drop_bulk_rows(self) -> None:
        """Delete every run's frames, ticks and rollups (queued on the writer), keeping the runs
        and their summaries: for a private store whose runs are only needed for their summaries
        (a forecast's hundreds of twin runs), so it stays small."""
        for table in ("frames", "ticks", *ROLLUP_TABLES):
            self.writer.execute(f"DELETE FROM {table}")

    def _abort_orphans(self) -> None:
        # We hold the file lock, so a run still 'running' belongs to a process that died.
        # Its end time is its last recorded tick: when it stopped, not when we noticed.
        self._con.execute(
            "UPDATE runs SET status = 'aborted', "
            "ended_at = COALESCE(ended_at, started_at + to_microseconds(CAST(1e6 * ("
            "  SELECT max(t) FROM ticks WHERE ticks.run_id = runs.run_id) AS BIGINT)), now()), "
            "reason = COALESCE(reason, 'the process ended before the run finished') "
            "WHERE status = 'running'")

    def close(self) -> bool:
        """Stop the writer, then close the connection: never the other way round, and never
        under a writer still inside DuckDB (that aborts the process). False when the writer
        did not stop; the connection is then left to the process's end."""
        if self._closed:
            return True
        self._closed = True
        if not self.writer.close():
            logger.error("database %s left open: its writer is still busy", self.path)
            return False
        self._con.close()
        return True


def db_threads() -> int:
    """DuckDB's threads for the database a run writes: $METRONOME_DB_THREADS, else every core
    this process may use but the two an engine's processes keep busy, at least one. DuckDB's
    own default is every core; on two cores its second thread took CPU from the engine in the
    middle of frames (`benchmarks/frame_floor.py --modes full db1`, docs/benchmarks/
    frame_floor.md). Readers in the same process share the count (it is the database's)."""
    value = os.environ.get(DB_THREADS_ENV, "").strip()
    if not value:
        return max(1, len(os.sched_getaffinity(0)) - ENGINE_CORES)
    if not value.isdigit() or not 1 <= int(value) <= 1024:
        raise ValueError(f"{DB_THREADS_ENV}={value!r} must be a whole number of threads in "
                         "[1, 1024]")
    return int(value)


def _connect(path: str):
    if path != ":memory:":
        parent = Path(path).expanduser().resolve().parent
        if not parent.is_dir():
            raise StoreError(f"database folder {parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise StoreError(f"database folder {parent} is not writable")
    threads = db_threads()
    try:
        return duckdb.connect(path, config={"threads": threads})
    except duckdb.IOException as exc:
        text = str(exc)
        holder = re.search(r"PID (\d+)", text)
        if "lock" in text.lower():
            who = f"process {holder.group(1)}" if holder else "another process"
            raise StoreError(f"database {path} is in use by {who}; stop it or pass another --db",
                             int(holder.group(1)) if holder else None)
        raise StoreError(f"cannot open database {path}: {text.splitlines()[0]}") from None
    except duckdb.Error as exc:
        raise StoreError(f"cannot open database {path}: {str(exc).splitlines()[0]}") from None


_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def open_store(path: str | None = None) -> Store:
    """The process-wide Store for a path (DuckDB allows one writer process per file)."""
    resolved = db_path(path)
    key = resolved if resolved == ":memory:" else str(Path(resolved).expanduser().resolve())
    with _stores_lock:
        store = _stores.get(key)
        if store is None or store._closed:
            store = Store(resolved)
            _stores[key] = store
        return store


def open_reader(path: str | None = None):
    """open_existing for commands that only read (`runs`, `report`, `schedule list`): while
    another process holds the database, its rows through that process when it offers them
    (store/shared_reads.py), else the same one-line refusal."""
    from store.shared_reads import reader_for

    try:
        return open_existing(path)
    except StoreError as exc:
        reader = reader_for(db_path(path), exc.holder_pid) if exc.holder_pid else None
        if reader is None:
            raise
        logger.info("database %s is held by process %s: reading through it", db_path(path),
                    exc.holder_pid)
        return reader


def open_existing(path: str | None = None) -> Store:
    """open_store for commands that only read or maintain what is there (`runs`, `report`,
    `archive`, ...): a database that does not exist is a mistyped --db, refused rather than
    created empty."""
    resolved = db_path(path)
    if resolved != ":memory:" and not Path(resolved).expanduser().is_file():
        raise StoreError(f"database {resolved} does not exist (check --db or $METRONOME_DB)")
    return open_store(resolved)
