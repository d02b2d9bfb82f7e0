"""Trace files (CSV or Parquet) read and validated by DuckDB itself, in bounded memory.

A trace can be a gigabyte of per-frame rows. Nothing here holds a row as a Python object: the
checks are SQL aggregates over the file (one streaming pass), the session cap is checked
before anything per session is built (HyperLogLog first, so a file of ten million sessions
costs kilobytes to refuse), and only what a replay keeps is materialised: per session its
start, frame count and token counts, and per frame only the tokens in of sessions whose count
varies (two bytes a frame). DuckDB itself runs under a memory limit and spills to a temporary
folder beyond it. Measured: benchmarks/trace_memory.py.
"""

from __future__ import annotations

import array
import logging
import math
import tempfile

logger = logging.getLogger(__name__)

TRACE_COLUMNS = ("session_id", "start_s", "end_s", "tokens_in", "tokens_out")
TRACE_SUFFIXES = (".csv", ".parquet")
MAX_SESSIONS = 100_000
MAX_TOKENS_IN, MAX_TOKENS_OUT = 8192, 1024  # RunConfig's bounds; tokens in fit 'H' (uint16)
DUCKDB_MEMORY = "96MB"  # DuckDB's share while it reads a trace; beyond it, it spills
DUCKDB_THREADS = 1  # each scan thread holds its own buffers: one keeps the peak lowest
FETCH_ROWS = 65_536  # per-frame tokens are fetched in batches of this many rows
_INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT",
                  "USMALLINT", "UINTEGER", "UBIGINT")
_NUMBER_TYPES = _INTEGER_TYPES + ("FLOAT", "DOUBLE", "REAL")


def _bad() -> str:
    """SQL true for a row _check_row refuses (keep the two in step)."""
    return ("session_id IS NULL OR start_s IS NULL OR end_s IS NULL OR tokens_in IS NULL "
            "OR tokens_out IS NULL OR NOT isfinite(start_s) OR NOT isfinite(end_s) "
            "OR start_s < 0 OR end_s < 0 OR end_s <= start_s "
            f"OR tokens_in < 1 OR tokens_in > {MAX_TOKENS_IN} "
            f"OR tokens_out < 1 OR tokens_out > {MAX_TOKENS_OUT}")


def read_sessions(path: str, frame_ms: float) -> dict:
    """The trace's sessions as plain lists, by start: `starts`, `names`, `frames`,
    `tokens_in` (an int, or per frame a memoryview of unsigned shorts), `tokens_out` (one int for the whole
    trace), `rows`, `tokens_in_mode`. ValueError with one line for anything refused."""
    import duckdb

    try:
        return _read(_Source(path), path, frame_ms / 1e3)
    except duckdb.Error as exc:
        raise ValueError(f"trace file {path} cannot be read: {str(exc).splitlines()[0]}") \
            from None


class _Source:
    """Fresh DuckDB connections over the file: each pass starts from an empty buffer pool
    (memory DuckDB kept after one pass made the next run out of its limit)."""

    def __init__(self, path: str) -> None:
        self.reader = "read_parquet" if path.lower().endswith(".parquet") else "read_csv"
        self.quoted = "'" + path.replace("'", "''") + "'"
        self.view = None

    def connect(self):
        import duckdb

        con = duckdb.connect(config={
            "memory_limit": DUCKDB_MEMORY, "threads": DUCKDB_THREADS,
            "temp_directory": tempfile.gettempdir() + "/metronome-trace"})
        con.execute("SET enable_progress_bar = false")  # it prints to stdout: the JSON's
        if self.view is not None:
            con.execute(self.view)
        return con

    def one(self, sql: str) -> tuple:
        con = self.connect()
        try:
            return con.execute(sql).fetchone()
        finally:
            con.close()


def _read(src: _Source, path: str, frame_s: float) -> dict:
    con = src.connect()
    try:
        types = {r[0]: r[1] for r in con.execute(
            f"DESCRIBE SELECT * FROM {src.reader}({src.quoted})").fetchall()}
    finally:
        con.close()
    missing = [c for c in TRACE_COLUMNS if c not in types]
    if missing:
        raise ValueError(f"trace file {path} lacks column(s) {', '.join(missing)} (needs "
                         f"{', '.join(TRACE_COLUMNS)})")
    for column in TRACE_COLUMNS[1:]:
        allowed = _INTEGER_TYPES if column.startswith("tokens") else _NUMBER_TYPES
        if types[column] not in allowed and not (
                column.endswith("_s") and types[column].startswith("DECIMAL")):
            raise ValueError(f"trace file {path}: column {column} holds {types[column]}, "
                             f"not {'integers' if column.startswith('tokens') else 'numbers'}")
    order = "frame_idx" if "frame_idx" in types else "start_s"
    src.view = (f"CREATE VIEW trace AS SELECT CAST(session_id AS VARCHAR) AS session_id, "
                f"CAST(start_s AS DOUBLE) AS start_s, CAST(end_s AS DOUBLE) AS end_s, "
                f"tokens_in, tokens_out, {order} AS ord FROM {src.reader}({src.quoted})")
    # The cap first, before anything per session exists: an estimate (constant memory), then
    # the exact count only when the estimate is near the cap.
    estimate = src.one("SELECT approx_count_distinct(session_id) FROM trace")[0]
    if estimate > MAX_SESSIONS * 1.1:
        raise ValueError(f"trace file {path} has about {estimate} sessions; at most "
                         f"{MAX_SESSIONS}")
    n_rows, n_sessions, n_bad, out_lo, out_hi, mode = src.one(
        f"SELECT count(*), count(DISTINCT session_id), count(*) FILTER (WHERE {_bad()}), "
        "min(tokens_out), max(tokens_out), mode(tokens_in) FROM trace")
    if n_sessions > MAX_SESSIONS:
        raise ValueError(f"trace file {path} has {n_sessions} sessions; at most {MAX_SESSIONS}")
    if n_rows == 0:
        raise ValueError(f"trace file {path} has no rows")
    if n_bad:
        _refuse_first_bad(src, path)
    if out_lo != out_hi:
        # The runner answers every frame of a run with one tokens_out (RunConfig.tokens_out).
        raise ValueError(f"trace {path.rsplit('/', 1)[-1]} asks {out_lo}–{out_hi} tokens out "
                         "per frame; a run answers every frame with one tokens out")
    per_frame = n_rows > n_sessions
    con = src.connect()
    try:
        sessions = con.execute(
            "SELECT session_id, arg_min(start_s, ord) AS start_s, count(*) AS n, "
            "min(end_s - start_s) AS span, min(tokens_in) AS tin_lo, max(tokens_in) AS tin_hi "
            "FROM trace GROUP BY session_id ORDER BY start_s, session_id").fetchnumpy()
    finally:
        con.close()
    names = [str(x) for x in sessions["session_id"]]
    starts = [float(x) for x in sessions["start_s"]]
    if per_frame:
        frames = [int(x) for x in sessions["n"]]
    else:
        frames = [max(1, math.ceil(span / frame_s - 1e-9)) for span in sessions["span"]]
    tokens_in: list = [int(x) for x in sessions["tin_lo"]]
    varying = [i for i in range(len(names)) if sessions["tin_lo"][i] != sessions["tin_hi"][i]]
    if varying:
        _per_frame_tokens(src, names, frames, varying, tokens_in)
    logger.info("trace %s: %d sessions, %d rows", path, len(names), n_rows)
    return {"starts": starts, "names": names, "frames": frames, "tokens_in": tokens_in,
            "tokens_out": int(out_lo), "rows": n_rows, "tokens_in_mode": int(mode)}


def _per_frame_tokens(src: _Source, names: list[str], frames: list[int], varying: list[int],
                      tokens_in: list) -> None:
    """Give each session of `varying` (indices) its tokens in per frame, in frame order: one
    flat array('H') of two bytes a frame, each session a memoryview slice of it.

    The rows are streamed in file order (one DuckDB thread keeps it) and placed by their rank
    within their session, all vectorised per batch. DuckDB's ORDER BY would need the whole
    file sorted under its memory limit; the format asks for frame order anyway, so order is
    checked instead, and a file out of order is sorted by DuckDB (small files) or refused."""
    import numpy as np
    import pandas as pd

    lengths = np.array([frames[i] for i in varying], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    flat = array.array("H", bytes(2 * int(lengths.sum())))
    out = np.frombuffer(flat, dtype=np.uint16)  # a writable view: filled in place
    index = pd.Index([names[i] for i in varying])
    seen = np.zeros(len(varying), dtype=np.int64)
    last = np.full(len(varying), -np.inf)
    con = src.connect()
    try:
        for order in ("", " ORDER BY session_id, ord"):
            seen[:], last[:] = 0, -np.inf
            # A plain scan (rows of other sessions are dropped in _place): a join or a sort
            # would hold state beside the scan's own buffers.
            rows = con.sql("SELECT session_id, CAST(ord AS DOUBLE), tokens_in FROM trace"
                           + order)
            if all(_place(batch, index, seen, last, offsets, out)
                   for batch in rows.to_arrow_reader(FETCH_ROWS)):
                break
            logger.info("trace rows are not in frame order within their sessions: sorting")
    finally:
        con.close()
    view = memoryview(flat)
    for k, i in enumerate(varying):
        tokens_in[i] = view[offsets[k]:offsets[k] + lengths[k]]


def _place(batch, index, seen, last, offsets, out) -> bool:
    """One batch into `out`; False when a session's frames go backwards (out of order)."""
    import numpy as np

    codes = index.get_indexer(batch.column(0).to_numpy(zero_copy_only=False))
    keep = codes >= 0  # sessions whose tokens vary; the others hold one count
    codes = codes[keep]
    ords = batch.column(1).to_numpy(zero_copy_only=False)[keep]
    tokens = batch.column(2).to_numpy(zero_copy_only=False)[keep]
    if not len(codes):
        return True
    by = np.argsort(codes, kind="stable")  # file order kept within each session
    c, o, t = codes[by], ords[by], tokens[by]
    same = c[1:] == c[:-1]
    starts = np.concatenate(([0], np.flatnonzero(~same) + 1))
    if np.any(np.diff(o)[same] < 0) or np.any(o[starts] < last[c[starts]]):
        return False
    rank = np.arange(len(c)) - np.repeat(starts, np.diff(np.append(starts, len(c))))
    out[offsets[c] + seen[c] + rank] = t
    np.add.at(seen, c, 1)
    ends = np.append(starts[1:], len(c)) - 1
    last[c[ends]] = o[ends]
    return True


def _refuse_first_bad(src: _Source, path: str) -> None:
    """Only on the error path: find the first refused row (in file order) for the message."""
    row = src.one(f"SELECT * FROM (SELECT row_number() OVER () AS i, * FROM trace) "
                  f"WHERE {_bad()} ORDER BY i LIMIT 1")
    i, sid, start, end, tin, tout, _ = row
    _check_row(path, int(i) - 1, {"session_id": sid, "start_s": start, "end_s": end,
                                  "tokens_in": tin, "tokens_out": tout})
    raise ValueError(f"trace file {path} row {i} is invalid")


def _check_row(path: str, i: int, r: dict) -> None:
    where = f"trace file {path} row {i + 1}"
    for key in TRACE_COLUMNS:
        if r[key] is None:
            raise ValueError(f"{where}: {key} is empty")
    for key in ("start_s", "end_s"):
        if not math.isfinite(r[key]) or r[key] < 0:
            raise ValueError(f"{where}: {key} {r[key]:g} must be a number ≥ 0")
    if r["end_s"] <= r["start_s"]:
        raise ValueError(f"{where}: end_s {r['end_s']:g} must be after start_s "
                         f"{r['start_s']:g}")
    if not 1 <= r["tokens_in"] <= MAX_TOKENS_IN:
        raise ValueError(f"{where}: tokens_in {r['tokens_in']} must be in [1, {MAX_TOKENS_IN}]")
    if not 1 <= r["tokens_out"] <= MAX_TOKENS_OUT:
        raise ValueError(f"{where}: tokens_out {r['tokens_out']} must be in "
                         f"[1, {MAX_TOKENS_OUT}]")
