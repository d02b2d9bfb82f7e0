"""Readers while another process holds the database: through the holder.

DuckDB lets one process open a file for writing and no other process open it at all, so
`metronome runs` / `report` / `schedule list` against the console's (or serve's) database
would be refused for as long as it runs. The holder publishes a small read endpoint on the
server it already runs (`POST /api/store/sql`: one read-only statement, its rows back as an
Arrow IPC stream) and writes beside the database who it is (`<db>.holder.json`: pid, URL,
token). A reader refused with "in use by process N" finds that file, checks the pid is N,
and reads through it: the rows the holder's writer has committed (at most one batch, 0.5 s,
behind the run), at the cost of a query on the holder's connection.

Only SELECT statements are run (DuckDB's own parser says which), one per request; writers
other than the holder stay refused with one line.
"""

from __future__ import annotations

import io
import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

import duckdb

logger = logging.getLogger(__name__)

HOLDER_SUFFIX = ".holder.json"
TIMEOUT_S = 30.0
MAX_SQL_CHARS = 100_000


def holder_file(db: str) -> Path:
    return Path(str(Path(db).expanduser().resolve()) + HOLDER_SUFFIX)


def publish(db: str, url: str, token: str | None) -> Path:
    """The holder says where it reads for others (removed by `withdraw` at its end)."""
    path = holder_file(db)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "url": url, "token": token}))
    os.chmod(tmp, 0o600)  # the token is a secret of the user who runs the holder
    tmp.replace(path)
    return path


def withdraw(db: str) -> None:
    path = holder_file(db)
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def checked_select(sql: str) -> str:
    """The statement if it is one SELECT; ValueError otherwise (what and why)."""
    if not isinstance(sql, str) or not sql.strip() or len(sql) > MAX_SQL_CHARS:
        raise ValueError(f"a query is one SELECT statement of at most {MAX_SQL_CHARS} "
                         "characters")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ValueError(f"the query does not parse: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        kinds = ", ".join(s.type.name for s in statements)
        raise ValueError(f"only one SELECT is read through the holder, not {kinds}")
    return sql


def run_select(cursor, sql: str, params: list) -> bytes:
    """The holder's side: the rows as an Arrow IPC stream."""
    import pyarrow as pa

    table = cursor.execute(checked_select(sql), params or []).to_arrow_table()
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


class HolderStore:
    """A Store-like reader through the holder: `cursor()` gives cursors whose `execute`
    returns a DuckDB result over the rows that came back (fetchall, fetchone, df, fetchnumpy
    as from a local database). `path` and no writer: it only reads."""

    def __init__(self, path: str, url: str, token: str | None) -> None:
        self.path, self.url, self.token = path, url, token
        self._local = duckdb.connect()

    def cursor(self) -> _HolderCursor:
        return _HolderCursor(self)

    def close(self) -> bool:
        self._local.close()
        return True


class _HolderCursor:
    def __init__(self, store: HolderStore) -> None:
        self._store = store
        self._last = None  # the last result: `description`, fetch* as a DuckDB cursor has

    def __getattr__(self, name: str):
        if self._last is None:
            raise AttributeError(name)
        return getattr(self._last, name)

    def execute(self, sql: str, params=None):
        import pyarrow as pa

        store = self._store
        body = json.dumps({"sql": sql, "params": list(params or [])}, default=str).encode()
        request = urllib.request.Request(store.url, data=body, method="POST", headers={
            "content-type": "application/json",
            **({"authorization": f"Bearer {store.token}"} if store.token else {})})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            raise ValueError(f"the database's holder refused the read: "
                             f"{exc.read().decode(errors='replace').strip()[:300]}") from None
        except OSError as exc:
            raise ValueError(f"the database's holder at {store.url} did not answer: "
                             f"{exc}") from None
        local = store._local.cursor()  # one per result: a result pending blocks a connection
        local.register("_holder_rows", pa.ipc.open_stream(data).read_all())
        self._last = local.execute("SELECT * FROM _holder_rows")
        return self._last


def reader_for(path: str, holder_pid: int | None):
    """A HolderStore for `path` when its holder (process `holder_pid`) published one, else
    None (the caller keeps its own 'in use' error)."""
    try:
        info = json.loads(holder_file(path).read_text())
    except (OSError, ValueError):
        return None
    if holder_pid is not None and info.get("pid") != holder_pid:
        return None  # left by a process that is gone; the holder now is another
    return HolderStore(path, info["url"], info.get("token"))
