"""The only writer of the database: a thread that drains a queue and inserts DataFrame batches.

Rows (dicts) are buffered per table and inserted with one `INSERT ... BY NAME SELECT` per table
per flush (never executemany on the frame path). Statements (run rows, updates) go through the
same queue, after the rows queued before them, so the order of the queue is the order on disk.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict

import pandas as pd

from store.schema import TABLES

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5


class StoreWriter:
    def __init__(self, con, flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        self._con = con
        self._queue: queue.Queue = queue.Queue()
        self._buffers: dict[str, list[dict]] = defaultdict(list)
        self.flush_interval_s = flush_interval_s
        self.rows_written = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="metronome-store", daemon=True)
        self._thread.start()

    # --- called from any thread ---------------------------------------------------------------
    def add(self, table: str, row: dict) -> None:
        if table not in TABLES:
            raise ValueError(f"table {table!r} is not one of {', '.join(TABLES)}")
        self._queue.put(("row", table, row))

    def add_many(self, table: str, rows: list[dict]) -> None:
        if table not in TABLES:
            raise ValueError(f"table {table!r} is not one of {', '.join(TABLES)}")
        if rows:
            self._queue.put(("rows", table, rows))

    def execute(self, sql: str, params: list | tuple = ()) -> None:
        self._queue.put(("sql", sql, list(params)))

    def call(self, fn, timeout: float = 60.0):
        """Run `fn(connection)` in the writer thread, after everything queued before it, and
        return its result (its exception is raised here). For writes whose outcome the caller
        needs (schedule edits, retention's deletes): DuckDB keeps one writer, this thread."""
        if not self._thread.is_alive():
            raise RuntimeError("the store is closed")
        box: dict = {}
        done = threading.Event()
        self._queue.put(("call", fn, (box, done)))
        if not done.wait(timeout):
            raise TimeoutError(f"store writer did not run the call within {timeout} s")
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def flush(self, timeout: float = 30.0) -> None:
        """Block until everything queued so far is on disk."""
        done = threading.Event()
        self._queue.put(("flush", done, None))
        if not done.wait(timeout):
            raise TimeoutError(f"store writer did not flush within {timeout} s")

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(("stop", None, None))
            self._thread.join(timeout=30)

    # --- writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval_s
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, next_flush - time.monotonic()))
            except queue.Empty:
                item = None
            if item is not None:
                kind, a, b = item
                if kind == "row":
                    self._buffers[a].append(b)
                elif kind == "rows":
                    self._buffers[a].extend(b)
                elif kind == "sql":
                    self._write_buffers()
                    self._guard(lambda: self._con.execute(a, b), f"statement {a[:60]!r}")
                elif kind == "call":
                    self._write_buffers()
                    box, done = b
                    try:
                        box["result"] = a(self._con)
                    except Exception as exc:  # noqa: BLE001 - handed to the caller
                        box["error"] = exc
                    done.set()
                elif kind == "flush":
                    self._write_buffers()
                    a.set()
                elif kind == "stop":
                    self._write_buffers()
                    return
            if time.monotonic() >= next_flush:
                self._write_buffers()
                next_flush = time.monotonic() + self.flush_interval_s

    def _write_buffers(self) -> None:
        for table, rows in list(self._buffers.items()):
            if not rows:
                continue
            self._buffers[table] = []
            frame = pd.DataFrame(rows)

            def insert(frame=frame, table=table):
                self._con.register("_batch", frame)
                try:
                    self._con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _batch")
                finally:
                    self._con.unregister("_batch")

            if self._guard(insert, f"{len(rows)} rows into {table}"):
                self.rows_written += len(rows)

    def _guard(self, fn, what: str) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # noqa: BLE001 - the writer must outlive one bad batch
            self.last_error = f"{what}: {exc}"
            logger.error("store write failed: %s", self.last_error)
            return False
