"""Recorder.frame on its own: where a frame's latency, silence and cause are decided."""

import pytest
from runtime_factories import config, handle, recorder

BUDGET_S = 0.08  # the frame period of factories.config: the default budget


def test_a_frame_answered_in_time_has_its_true_latency():
    rec = recorder()
    row = rec.frame(1, 0, 0.0, handle(0.0, (0.02,) * 4, done_at=0.03), now=0.16)
    assert row["latency_ms"] == pytest.approx(30.0) and row["on_time"] and not row["censored"]
    assert row["tokens_out"] == 4 and not row["silent"] and row["silent_cause"] is None
    assert rec.totals.frames == 1 and rec.totals.on_time == 1 and rec.totals.late == 0
    assert rec.writer.rows["frames"] == [row]


def test_tokens_after_the_deadline_are_silent_but_the_late_latency_is_known():
    rec = recorder()
    row = rec.frame(1, 0, 0.0, handle(0.0, (0.1,) * 4, done_at=0.12), now=0.16)
    assert row["silent"] and row["tokens_out"] == 0  # what it had by its deadline: nothing
    assert row["latency_ms"] == pytest.approx(120.0) and not row["censored"]
    assert not row["on_time"] and rec.totals.late == 1
    assert row["silent_cause"] == "compute"  # the pool had room: the step was too slow


def test_an_unanswered_frame_is_censored_with_a_lower_bound_never_a_value():
    rec = recorder()
    row = rec.frame(1, 0, 0.0, handle(0.0), now=0.2)
    assert row["censored"] and row["latency_ms"] is None
    assert row["latency_bound_ms"] == pytest.approx(200.0)  # waited so far: ≥ the budget
    assert rec.totals.censored == 1 and rec.totals.silent == 1


def test_a_skipped_frame_is_censored_at_the_budget_and_a_wait_budget_hides_it():
    plain = recorder().frame(1, 3, 0.24, None, now=0.4)
    assert plain["skipped"] and plain["censored"] and plain["latency_bound_ms"] == 80.0
    assert plain["naive_latency_ms"] == 80.0 and not plain["naive_on_time"]
    naive = recorder(config(wait_budget=0.5)).frame(1, 3, 0.24, None, now=0.4)
    # The gateway answered empty at half the budget and called it on time.
    assert naive["naive_latency_ms"] == 40.0 and naive["naive_on_time"] and naive["silent"]


@pytest.mark.parametrize("full, closing, error, cause", [
    (False, None, None, "compute"),
    (True, None, None, "memory"),
    (True, "evicted by stall guard", None, "guard"),  # the guard's, whatever the pool said
    (False, None, "RuntimeError: boom", "other"),
    (True, None, "closed", "memory"),  # cut off by its close: not a session failure
])
def test_the_cause_of_silence(full, closing, error, cause):
    rec = recorder()
    rec.pool_full = {0: full, None: full}
    h = handle(0.0, done_at=0.5 if error else None, error=error)
    row = rec.frame(1, 0, 0.0, h, now=0.2, closing=closing)
    assert row["silent"] and row["silent_cause"] == cause
    assert rec.totals.silent_by_cause[cause] == 1 and sum(rec.totals.silent_by_cause.values()) == 1


def test_a_silent_frame_reads_its_own_rank_pool_not_the_engine_mean():
    rec = recorder()
    rec.pool_full = {None: False, 0: False, 1: True}  # the mean has room, rank 1 has none
    on_full = rec.frame(1, 0, 0.0, handle(0.0), now=0.2, rank=1)
    on_room = rec.frame(2, 0, 0.0, handle(0.0), now=0.2, rank=0)
    unknown = rec.frame(3, 0, 0.0, handle(0.0), now=0.2, rank=None)  # placed by the engine
    assert (on_full["silent_cause"], on_room["silent_cause"]) == ("memory", "compute")
    assert unknown["silent_cause"] == "compute"  # the whole engine's pool had room
    assert rec.take_rank_tick(1) == (1, 1) and rec.take_rank_tick(0) == (1, 1)
    assert rec.take_rank_tick(1) == (0, 0)  # taken: counted once per tick


def test_the_tick_silent_rate_is_taken_once():
    rec = recorder()
    rec.frame(1, 0, 0.0, handle(0.0, (0.01,), done_at=0.01), now=0.16)
    rec.frame(2, 0, 0.0, handle(0.0), now=0.16)
    first = rec.take_tick_silent()
    assert first["silent_rate"] == 0.5 and first["silent_compute"] == 1
    again = rec.take_tick_silent()
    assert again["silent_rate"] is None and again["silent_compute"] == 0


def test_a_failing_observer_is_dropped_and_the_rows_still_go_to_the_store():
    seen = []

    class Broken:
        def observe(self, table, row):
            raise RuntimeError("metrics down")

    class Keeps:
        def observe(self, table, row):
            seen.append(table)

    rec = recorder(observers=(Broken(), Keeps()))
    rec.event(0.0, "start")
    rec.event(0.1, "tick")
    assert [r["kind"] for r in rec.writer.rows["events"]] == ["start", "tick"]
    assert seen == ["events", "events"] and len(rec.observers) == 1


def test_held_rows_reach_the_writer_in_one_batch_per_table_and_observers_at_once():
    seen = []

    class Keeps:
        def observe(self, table, row):
            seen.append(table)

    rec = recorder(observers=(Keeps(),))
    rec.hold(True)
    rows = [rec.frame(s, 0, 0.0, handle(0.0, (0.02,) * 4, done_at=0.03), now=0.16)
            for s in range(3)]
    rec.event(0.16, "open", session_id=3)
    # Held: the writer (whose every put wakes its thread) has nothing yet; observers have all.
    assert rec.writer.puts == [] and seen == ["frames"] * 3 + ["events"]
    rec.release()
    assert rec.writer.puts == [("frames", 3), ("events", 1)]
    assert rec.writer.rows["frames"] == rows
    rec.release()  # nothing held: nothing put
    rec.event(0.2, "close", session_id=3)
    rec.hold(False)  # off hands over what is held, then rows go straight through
    rec.event(0.3, "close", session_id=2)
    assert rec.writer.puts[2:] == [("events", 1), ("events", 1)]
    assert [r["kind"] for r in rec.writer.rows["events"]] == ["open", "close", "close"]
