"""The only writer of the database: a thread that drains a queue and inserts DataFrame batches.

Rows (dicts) are buffered per table and inserted with one `INSERT ... BY NAME SELECT` per table
per flush (never executemany on the frame path; frames and ticks with their rollups, in one
transaction: store/rollups.py). Statements (run rows, updates) go through the same queue,
after the rows queued before them, so the order of the queue is the order on disk.

A failed batch is one of two things (store/faults.py). A bad row: the batch is retried row by
row so it costs only itself, and a streak of failing rows stops the retry (the failure is the
batch's shape, not one row). A storage failure (disk full, file too large, I/O error): no retry
at all, the batch is counted lost and `storage_error` says why, so the writer keeps up with the
producer instead of falling minutes behind; later batches still get one try each (a disk that
comes back is used again, and DuckDB still takes small writes such as a run's end).

Closing is ordered: stop, wait for the thread, only then close the connection. A writer that
does not stop in time abandons what it holds (counted lost) and says so; the caller must not
close the connection under it (that is a C++ terminate, SIGABRT).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from contextlib import suppress

from store.faults import first_line, is_storage_failure
from store.maintainer import Maintainer
from store.quiet import QuietWaits
from store.schema import TABLES

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5
# Items (rows or batches) waiting: minutes of a run's (a few hundred a second), bounded.
MAX_QUEUED = 100_000
BACKPRESSURE_S = 1.0  # how long add() waits for room before counting the row as lost
# Rows failing one after another in a row-by-row retry: past this the cause is not one row
# (a value every row shares), and the rest of the batch is counted lost with the same error.
MAX_BAD_STREAK = 32
CLOSE_TIMEOUT_S = 30.0


class StoreWriter:
    """One thread owns the connection; everyone else queues. Nothing is lost without a count:
    failed rows are counted per table (`rows_lost`) with the error (`errors`); a full queue
    first slows the producer (`backpressure_waits`), then counts what it could not take."""

    def __init__(self, con, flush_interval_s: float = FLUSH_INTERVAL_S,
                 max_queued: int = MAX_QUEUED) -> None:
        self._con = con
        self._queue: queue.Queue = queue.Queue(maxsize=max_queued)
        self._buffers: dict[str, list[dict]] = defaultdict(list)
        self.flush_interval_s = flush_interval_s
        self.rows_written = 0
        self.rows_lost: dict[str, int] = defaultdict(int)
        self.errors: dict[str, str] = {}  # table (or "statement") → the last error
        self.backpressure_waits = 0
        self.last_error: str | None = None
        self.storage_error: str | None = None  # set while the store itself fails to write
        self.storage_failures = 0  # writes refused by the store itself, over its lifetime
        self._count_lock = threading.Lock()
        self._abandon = threading.Event()
        self._rollups = Maintainer()
        self.quiet = QuietWaits()  # runs' waits for an idle engine before a timed flush's tables
        self._thread = threading.Thread(target=self._run, name="metronome-store", daemon=True)
        self._thread.start()

    # --- called from any thread ---------------------------------------------------------------
    def add(self, table: str, row: dict) -> None:
        self.add_many(table, [row])

    def add_many(self, table: str, rows: list[dict]) -> None:
        if table not in TABLES:
            raise ValueError(f"table {table!r} is not one of {', '.join(TABLES)}")
        if rows:
            self._put(("rows", table, rows), table, len(rows))

    def execute(self, sql: str, params: list | tuple = ()) -> None:
        self._put(("sql", sql, list(params)), "statement", 1)

    def _put(self, item: tuple, table: str, n_rows: int) -> None:
        with suppress(queue.Full):
            return self._queue.put_nowait(item)
        with self._count_lock:
            self.backpressure_waits += 1
        try:  # the store fell behind: slow the producer down a little rather than grow
            self._queue.put(item, timeout=BACKPRESSURE_S)
        except queue.Full:
            self._lose(table, n_rows, f"write queue full for {BACKPRESSURE_S} s "
                                      f"({self._queue.maxsize} items): the store fell behind")

    def call(self, fn, timeout: float = 60.0):
        """Run `fn(connection)` in the writer thread, after everything queued before it, and
        return its result (its exception is raised here). For writes whose outcome the caller
        needs (schedule edits, retention's deletes): DuckDB keeps one writer, this thread."""
        if not self._thread.is_alive():
            raise RuntimeError("the store is closed")
        box: dict = {}
        done = threading.Event()
        self._wait(("call", fn, (box, done)), done, timeout, "run the call")
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def flush(self, timeout: float = 30.0) -> int:
        """Block until everything queued so far is on disk (or counted lost). Returns the rows
        lost so far (all tables); raises TimeoutError when the writer does not get there."""
        done = threading.Event()
        self._wait(("flush", done, None), done, timeout, "flush")
        return self.lost_total

    def _wait(self, item: tuple, done: threading.Event, timeout: float, what: str) -> None:
        try:
            self._queue.put(item, timeout=timeout)
        except queue.Full:
            raise TimeoutError(f"store writer queue stayed full for {timeout} s") from None
        if not done.wait(timeout):
            raise TimeoutError(f"store writer did not {what} within {timeout} s")

    @property
    def lost_total(self) -> int:
        with self._count_lock:
            return sum(self.rows_lost.values())

    def health(self) -> dict:
        """What the console and the run summary show: rows lost per table and the errors."""
        with self._count_lock:
            return {"rows_written": self.rows_written, "rows_lost": dict(self.rows_lost),
                    "errors": dict(self.errors), "backpressure_waits": self.backpressure_waits,
                    "queued": self._queue.qsize(), "storage_error": self.storage_error,
                    "storage_failures": self.storage_failures}

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Write what is queued and stop the thread. True once the thread has ended (only
        then may the connection be closed); False if it is still inside a write after the
        timeout and a grace period for abandoning what it holds."""
        if not self._thread.is_alive():
            return True
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(("stop", None, None), timeout=timeout)
        except queue.Full:
            pass  # abandoned below: the stop could not even be queued
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            logger.error("store writer did not stop within %.0f s; abandoning %d queued "
                         "item(s) (counted lost)", timeout, self._queue.qsize())
            self._abandon.set()
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval_s
        while True:
            if self._abandon.is_set():
                self._drop_everything()
                return
            try:
                item = self._queue.get(timeout=max(0.0, next_flush - time.monotonic()))
            except queue.Empty:
                item = None
            if item is not None:
                kind, a, b = item
                if kind == "rows":
                    self._buffers[a].extend(b)
                elif kind == "sql":
                    self._write_buffers()
                    try:
                        self._con.execute(a, b)
                    except Exception as exc:  # noqa: BLE001 - the writer outlives one statement
                        self._storage(exc)
                        self._lose("statement", 1, f"{a[:60]!r}: {first_line(exc)}")
                elif kind == "call":
                    self._write_buffers()
                    box, done = b
                    try:
                        box["result"] = a(self._con)
                    except Exception as exc:  # noqa: BLE001 - handed to the caller
                        self._storage(exc)
                        box["error"] = exc
                    done.set()
                elif kind == "flush":
                    self._write_buffers()
                    a.set()
                elif kind == "stop":
                    self._write_buffers()
                    self._rollups.maybe_compact(self._con, force=True)
                    return
            if time.monotonic() >= next_flush:
                self._write_buffers(self.quiet.deadline())
                self._rollups.maybe_compact(self._con, before=self.quiet.wait)
                next_flush = time.monotonic() + self.flush_interval_s

    def _write_buffers(self, quiet_until: float | None = None) -> None:
        # Ticks last: a reader that sees a tick sees every row queued before it (the Live
        # page's settled edge is the latest tick less a margin, services/live_data.py).
        for table, rows in sorted(self._buffers.items(), key=lambda item: item[0] == "ticks"):
            if not rows:
                continue
            if quiet_until is not None:  # a timed flush: each table in an idle moment
                self.quiet.until(quiet_until)
            self._buffers[table] = []
            if self._abandon.is_set():
                self._lose(table, len(rows), "abandoned: the store was closed while the writer "
                                             "was still busy")
                continue
            try:
                self._rollups.insert(self._con, table, rows)
                written = len(rows)
                self._recovered()
            except Exception as exc:  # noqa: BLE001 - one bad row must not sink its batch
                if self._storage(exc):
                    self._lose(table, len(rows), first_line(exc))
                    continue
                logger.warning("batch of %d rows into %s failed (%s); retrying row by row",
                               len(rows), table, first_line(exc))
                written = self._insert_one_by_one(table, rows)
            with self._count_lock:
                self.rows_written += written

    def _insert_one_by_one(self, table: str, rows: list[dict]) -> int:
        """Each row tried alone (in a transaction rolled back: cheap, no rollups), then the
        good ones written together with their rollups."""
        good, streak = [], 0
        for i, row in enumerate(rows):
            try:
                self._rollups.probe(self._con, table, row)
                good.append(row)
                streak = 0
            except Exception as exc:  # noqa: BLE001 - counted, with the error
                streak += 1
                if self._storage(exc) or streak >= MAX_BAD_STREAK:
                    # Not one bad row: stop paying for each of the rest of the batch.
                    self._lose(table, len(rows) - i, first_line(exc))
                    break
                self._lose(table, 1, first_line(exc))
        try:
            self._rollups.insert(self._con, table, good)
        except Exception as exc:  # noqa: BLE001 - counted, with the error
            self._storage(exc)
            self._lose(table, len(good), first_line(exc))
            return 0
        return len(good)

    def _storage(self, exc: BaseException) -> bool:
        """Note a storage failure (logged once until the store writes again)."""
        if not is_storage_failure(exc):
            return False
        with self._count_lock:
            self.storage_failures += 1
            first = self.storage_error is None
            self.storage_error = first_line(exc)
        if first:
            logger.error("the store cannot write (%s): rows are counted lost, not retried "
                         "row by row, until a write succeeds again", first_line(exc))
        return True

    def _recovered(self) -> None:
        if self.storage_error is not None:
            logger.warning("the store writes again after: %s", self.storage_error)
            self.storage_error = None

    def _drop_everything(self) -> None:
        """Abandoned: count every buffered and queued row lost, release every waiter."""
        why = "abandoned: the store was closed while the writer was still busy"
        for table, rows in self._buffers.items():
            if rows:
                self._lose(table, len(rows), why)
        self._buffers.clear()
        while True:
            try:
                kind, a, b = self._queue.get_nowait()
            except queue.Empty:
                return
            if kind in ("rows", "sql"):
                self._lose(*((a, len(b)) if kind == "rows" else ("statement", 1)), why)
            elif kind == "call":
                b[0]["error"] = RuntimeError("the store is closed")
                b[1].set()
            elif kind == "flush":
                a.set()

    def _lose(self, table: str, n_rows: int, error: str) -> None:
        with self._count_lock:
            self.rows_lost[table] += n_rows
            repeated = self.errors.get(table) == error
            self.errors[table] = error
            self.last_error = f"{table}: {error}"
        # The same error again is counted, not logged again: a full disk must not also fill
        # the log with one line per row.
        (logger.debug if repeated else logger.error)("store lost %d row(s) of %s: %s",
                                                     n_rows, table, error)
