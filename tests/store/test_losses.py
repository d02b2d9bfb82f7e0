"""Nothing lost silently: failed inserts are retried row by row, what still fails is counted
with its error, a full queue slows the producer and then counts, and a run reports it all."""

import threading

import pytest

from runtime import RunConfig, execute
from store import writer as writer_module
from store.queries import frame_counts
from store.writer import StoreWriter


def _frame(run_id, i, **over):
    row = {"run_id": run_id, "session_id": 0, "frame_idx": i, "t_submit": i * 0.08,
           "latency_ms": 10.0, "naive_latency_ms": 10.0, "tokens_out": 4, "tokens_expected": 4,
           "on_time": True, "naive_on_time": True, "silent": False, "skipped": False,
           "complete": True}
    return {**row, **over}


def test_a_bad_row_costs_only_itself(store):
    rows = [_frame("bad", i) for i in range(100)]
    rows[37]["session_id"] = "not a number"  # the batch insert fails on this one row
    store.writer.add_many("frames", rows)
    lost = store.writer.flush()
    assert lost == 1
    assert frame_counts(store.cursor(), "bad")["frames"] == 99
    health = store.writer.health()
    assert health["rows_lost"] == {"frames": 1} and "not a number" in health["errors"]["frames"]


class _FailingConnection:
    """A cursor whose inserts into `ticks` fail once the run passes tick 30: `error` is what
    the failing insert raises (a disk that filled up, or a value no row of the table takes)."""

    def __init__(self, con, error):
        self._con, self._batch, self._error = con, None, error

    def register(self, name, df):
        self._batch = df
        return self._con.register(name, df)

    def execute(self, sql, *args):
        if sql.startswith("INSERT INTO ticks ") and max(_values(self._batch, "tick")) >= 30:
            raise self._error
        return self._con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


def _values(batch, column) -> list:
    """A column of the registered batch: an Arrow table's, or a DataFrame's (store/batches.py)."""
    values = batch[column]
    return values.to_pylist() if hasattr(values, "to_pylist") else values.tolist()


def _ticks(store, run_id):
    return store.cursor().execute("SELECT count(*) FROM ticks WHERE run_id = ?",
                                  [run_id]).fetchone()[0]


def test_a_full_disk_fails_the_run_with_its_cause_and_keeps_what_reached_it(store):
    """Storage failure: no row-by-row retry (each batch costs one try), every row not written
    is counted, the run is failed with the cause, and the rows that reached the disk stay."""
    store.writer._con = _FailingConnection(store.writer._con,
                                           OSError("No space left on device (simulated)"))
    s = execute(RunConfig(engine="twin", policy="window", window=64, pool_blocks=64,
                          sessions=4, duration_s=5.0), store)
    assert s.status == "failed" and "No space left on device" in s.reason
    total = int(5.0 / 0.08 + 0.5)
    n_ticks = _ticks(store, s.run_id)
    assert n_ticks <= 30 and n_ticks + s.rows_lost == total  # every tick written or counted
    assert "No space left on device" in s.store_errors["ticks"]
    assert frame_counts(store.cursor(), s.run_id)["frames"] == s.frames
    status, reason = store.cursor().execute(
        "SELECT status, reason FROM runs WHERE run_id = ?", [s.run_id]).fetchone()
    assert status == "failed" and "No space left on device" in reason


def test_a_bad_value_costs_only_its_rows_and_the_run_goes_on(store):
    """A bad row (not storage): retried row by row, so the ticks before 30 are all written."""
    store.writer._con = _FailingConnection(store.writer._con,
                                           ValueError("Conversion Error: out of range"))
    s = execute(RunConfig(engine="twin", policy="window", window=64, pool_blocks=64,
                          sessions=4, duration_s=5.0), store)
    assert s.status == "finished"
    assert _ticks(store, s.run_id) == 30 and s.rows_lost == int(5.0 / 0.08 + 0.5) - 30


def test_a_streak_of_bad_rows_stops_the_row_by_row_retry(store, monkeypatch):
    """Every row bad (a value all rows share): the retry gives up after MAX_BAD_STREAK rows
    instead of paying ~12 ms for each of thousands, and still counts every row."""
    calls = []

    class _AllBad:
        def __init__(self, con):
            self._con = con

        def execute(self, sql, *args):
            if sql.startswith("INSERT INTO frames"):
                calls.append(1)
                raise ValueError("Conversion Error: INT32 out of range")
            return self._con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self._con, name)

    store.writer._con = _AllBad(store.writer._con)
    store.writer.add_many("frames", [_frame("streak", i) for i in range(1000)])
    assert store.writer.flush() == 1000
    assert len(calls) == 1 + writer_module.MAX_BAD_STREAK


def test_close_never_closes_the_connection_under_a_busy_writer(store):
    """A writer stuck inside a write when the store closes: close() abandons what is queued
    (counted lost), returns False, and leaves the connection open (closing it under the thread
    is a C++ terminate); once the write returns, the thread ends by itself."""
    gate = threading.Event()

    class _Stuck:
        def __init__(self, con):
            self._con = con

        def execute(self, sql, *args):
            gate.wait(20)
            return self._con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self._con, name)

    w = StoreWriter(_Stuck(store.cursor()), flush_interval_s=0.01)
    w.execute("SELECT 1")
    w.add_many("frames", [_frame("stuck", i) for i in range(10)])
    assert w.close(timeout=0.2) is False and w.alive
    gate.set()
    w._thread.join(5)
    assert not w.alive and w.health()["rows_lost"]["frames"] == 10


def test_a_full_queue_slows_the_producer_then_counts_what_it_could_not_take(monkeypatch, store):
    monkeypatch.setattr(writer_module, "BACKPRESSURE_S", 0.05)
    gate = threading.Event()

    class _Slow:
        def __init__(self, con):
            self._con = con

        def execute(self, sql, *args):
            gate.wait(10)
            return self._con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self._con, name)

    w = StoreWriter(_Slow(store.cursor()), flush_interval_s=0.01, max_queued=5)
    try:
        w.execute("SELECT 1")  # the writer thread blocks on it: the queue backs up
        for i in range(20):
            w.add("frames", _frame("full", i))
        health = w.health()
        assert health["backpressure_waits"] > 0 and health["rows_lost"]["frames"] > 0
        assert "write queue full" in health["errors"]["frames"]
        assert health["queued"] <= 5
    finally:
        gate.set()
        w.flush()
        w.close()
    written = frame_counts(store.cursor(), "full")["frames"]
    assert written + w.health()["rows_lost"]["frames"] == 20


def test_a_failed_statement_is_counted_too(store):
    store.writer.execute("UPDATE no_such_table SET x = 1")
    assert store.writer.flush() == 1
    assert "no_such_table" in store.writer.health()["errors"]["statement"]


@pytest.mark.parametrize("table", ["nope"])
def test_unknown_tables_are_misuse(store, table):
    with pytest.raises(ValueError, match=f"table {table!r}"):
        store.writer.add_many(table, [{}])


def test_a_run_whose_final_flush_times_out_ends_failed_not_running(monkeypatch, store):
    from runtime import loop

    monkeypatch.setattr(loop, "FINAL_FLUSH_TIMEOUT_S", 0.5)
    gate = threading.Event()

    class _Stuck:
        """A disk that stops answering once the run's frames start to arrive."""

        def __init__(self, con):
            self._con = con

        def execute(self, sql, *args):
            if sql.startswith("INSERT INTO frames"):
                gate.wait(30)
            return self._con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self._con, name)

    store.writer._con = _Stuck(store.writer._con)
    s = execute(RunConfig(engine="twin", policy="window", window=64, pool_blocks=64,
                          sessions=4, duration_s=2.0), store)
    assert s.status == "failed" and "did not flush" in s.reason
    gate.set()  # the disk comes back: what was queued, the run's end included, is written
    store.writer.flush()
    status, reason = store.cursor().execute(
        "SELECT status, reason FROM runs WHERE run_id = ?", [s.run_id]).fetchone()
    assert status == "failed" and "did not flush" in reason


class _InsertOrder:
    """A cursor that notes the table of every INSERT, in order."""

    def __init__(self, con):
        self._con, self.tables = con, []

    def execute(self, sql, *args):
        if sql.startswith("INSERT INTO "):
            self.tables.append(sql.split()[2])
        return self._con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


def test_a_tick_reaches_the_database_after_the_rows_queued_before_it(store):
    """The Live page keeps buckets older than the latest tick (less a margin) as settled
    (services/live_data.py): a flush that wrote a tick before the frames queued ahead of it
    would let a reader settle a bucket those frames still belong to."""
    execute(RunConfig(engine="twin", sessions=1, duration_s=0.5), store)
    (tick,) = store.cursor().execute("SELECT * FROM ticks LIMIT 1").df().to_dict("records")
    spy = store.writer._con = _InsertOrder(store.writer._con)
    store.writer.add("ticks", {**tick, "run_id": "order"})  # the ticks buffer exists first
    store.writer.flush()
    spy.tables.clear()
    store.writer.add("ticks", {**tick, "run_id": "order", "tick": 1})
    store.writer.add_many("frames", [_frame("order", i) for i in range(3)])
    assert store.writer.flush() == 0
    assert spy.tables.index("frames") < spy.tables.index("ticks"), spy.tables
