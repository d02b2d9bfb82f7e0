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
    """A cursor whose inserts into `ticks` fail once the run passes tick 30 (a disk that filled
    up mid-run): every batch holding such a row fails, and so does each such row alone."""

    def __init__(self, con):
        self._con, self._batch = con, None

    def register(self, name, df):
        self._batch = df
        return self._con.register(name, df)

    def execute(self, sql, *args):
        if sql.startswith("INSERT INTO ticks ") and (self._batch["tick"] >= 30).any():
            raise OSError("No space left on device (simulated)")
        return self._con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


def test_a_run_reports_the_rows_it_lost_and_keeps_the_rest(store):
    store.writer._con = _FailingConnection(store.writer._con)
    s = execute(RunConfig(engine="twin", policy="window", window=64, pool_blocks=64,
                          sessions=4, duration_s=5.0), store)
    assert s["status"] == "finished"
    n_ticks = store.cursor().execute("SELECT count(*) FROM ticks WHERE run_id = ?",
                                     [s["run_id"]]).fetchone()[0]
    assert n_ticks == 30 and s["rows_lost"] == int(5.0 / 0.08 + 0.5) - 30
    assert "No space left on device" in s["store_errors"]["ticks"]
    # Every row that could be written was: all frames are there.
    assert frame_counts(store.cursor(), s["run_id"])["frames"] == s["frames"]


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
    assert s["status"] == "failed" and "did not flush" in s["reason"]
    gate.set()  # the disk comes back: what was queued, the run's end included, is written
    store.writer.flush()
    status, reason = store.cursor().execute(
        "SELECT status, reason FROM runs WHERE run_id = ?", [s["run_id"]]).fetchone()
    assert status == "failed" and "did not flush" in reason
