"""The runtime on the twin: both shapes (cliff and slope) in milliseconds of wall time."""

import json
import time

import pytest

from engine.twin import CostModel, TwinEngine
from runtime import RunConfig, Runner, RunSummary, execute
from store.queries import events, frame_counts, occupancy, run_row

LOAD = dict(engine="twin", pool_blocks=64, sessions=12, duration_s=10.0, frame_ms=80.0)


def test_unbounded_stalls_and_window_plateaus(store):
    t = time.perf_counter()
    cliff = execute(RunConfig(policy="unbounded", **LOAD), store)
    slope = execute(RunConfig(policy="window", window=128, **LOAD), store)
    # Simulated time: the 2 × 10 s of load take less wall time than they simulate. About 1 s
    # on an idle 2-core machine, 6 s at load 10; the structural bound is real time itself.
    assert time.perf_counter() - t < 20
    assert cliff.stalled and cliff.max_occupancy == 1.0 and cliff.silent_rate > 0.5
    assert 0 < cliff.stall_at_s < 3
    assert cliff.tsat_pred_s == pytest.approx(cliff.stall_at_s, rel=0.3)
    assert not slope.stalled and slope.silent_frames == 0
    # The cliff's tail is censored, never drawn on the budget line; the slope's is numeric.
    assert cliff.censored_frames > 0 and cliff.p95_censored and cliff.p95_ms is None
    assert slope.censored_frames == 0 and not slope.p99_censored
    assert slope.p99_ms is not None and slope.p99_ms < 80.0
    assert slope.max_occupancy < 1.0 and slope.max_resident_blocks <= 5
    assert slope.stall_at_s is None and slope.on_time_rate == 1.0
    occ = occupancy(store.cursor(), slope.run_id)
    late = occ[occ.t > 5].occupancy
    assert late.max() - late.min() < 0.05  # a plateau, not a ramp
    row = run_row(store.cursor(), cliff.run_id)
    assert row["status"] == "finished" and row["simulated"]
    assert RunSummary.from_json(json.loads(row["summary"])) == cliff  # the store keeps it whole
    assert frame_counts(store.cursor(), cliff.run_id)["silent_frames"] == cliff.silent_frames


def test_wait_budget_hides_the_stall_from_naive_metrics(store):
    s = execute(RunConfig(policy="unbounded", wait_budget=0.5, **LOAD), store)
    assert s.naive_on_time_rate == 1.0  # the gateway always answered in time...
    assert s.silent_rate > 0.5  # ...with empty frames
    # The truthful p95 is not a number: its rank falls among unanswered frames ("> budget").
    assert s.naive_p95_ms <= 40.0 and s.p95_ms is None and s.p95_censored


def test_run_json_has_the_contract_fields(store):
    s = execute(RunConfig(policy="window", window=64, **LOAD), store)
    stored = s.to_json()  # the JSON the store and `metronome run --json` carry
    for key in ("run_id", "engine", "model", "policy", "window", "sinks", "block_size",
                "pool_blocks", "frame_ms", "budget_ms", "sessions_offered", "admitted",
                "rejected", "evicted", "frames", "silent_frames", "silent_rate", "on_time_rate",
                "p50_ms", "p95_ms", "p99_ms", "max_occupancy", "max_resident_blocks", "stalled",
                "stall_at_s", "tsat_pred_s", "final_limit", "duration_s"):
        assert key in stored, key
    assert s.frames == 12 * 125 and s.sessions_offered == 12 == s.admitted


class _FailingTwin(TwinEngine):
    """Fault injection: the engine dies after a number of frames."""

    def __init__(self, config, fail_after):
        super().__init__(config, CostModel())
        self.fail_after = fail_after
        self.submitted = 0

    def submit(self, session_id, token_ids, max_new):
        self.submitted += 1
        if self.submitted > self.fail_after:
            raise RuntimeError("injected engine fault")
        return super().submit(session_id, token_ids, max_new)


def test_failure_mid_run_is_recorded_and_keeps_the_data(store):
    cfg = RunConfig(policy="window", window=64, **LOAD)
    s = Runner(cfg, _FailingTwin(cfg.engine_config(), fail_after=200), store).run()
    assert s.status == "failed" and "injected engine fault" in s.reason
    row = run_row(store.cursor(), s.run_id)
    assert row["status"] == "failed" and row["ended_at"] is not None
    assert frame_counts(store.cursor(), s.run_id)["frames"] >= 150


def test_window_sessions_roll_over_before_max_model_len(store):
    cfg = RunConfig(policy="window", window=64, max_model_len=512, **LOAD)
    engine = TwinEngine(cfg.engine_config(), CostModel())
    s = Runner(cfg, engine, store).run()
    # 19 KV tokens per frame: ~25 frames per 512 tokens, 125 frames per session
    assert s.rollovers >= 12 * 4 and s.silent_frames == 0 and not s.stalled
    assert (events(store.cursor(), s.run_id).kind == "rollover").sum() == s.rollovers


def test_stall_guard_evicts_and_frames_flow_again(store):
    s = execute(RunConfig(policy="unbounded", stall_guard=True, **LOAD), store)
    assert s.evicted >= 1
    ev = events(store.cursor(), s.run_id)
    assert "stall guard" in ev[ev.kind == "evict"].detail.iloc[0]
    occ = occupancy(store.cursor(), s.run_id)
    assert not occ.stalled.iloc[-20:].all()


def test_operator_stop_ends_the_run_as_aborted(store):
    cfg = RunConfig(policy="window", window=64, **LOAD)
    runner = Runner(cfg, TwinEngine(cfg.engine_config(), CostModel()), store)
    runner.stop("test stop")
    s = runner.run()
    assert s.status == "aborted" and s.reason == "test stop"


def test_an_instants_frames_reach_the_writer_as_one_batch(store, monkeypatch):
    # Each put on the writer's queue wakes its thread; one per row, inside an instant's burst
    # of submits, took the GIL between them (benchmarks/frame_floor.py's due-to-submit lag).
    puts = []
    add_many = store.writer.add_many

    def counting(table, rows):
        puts.append((table, len(rows)))
        add_many(table, rows)

    monkeypatch.setattr(store.writer, "add_many", counting)
    s = execute(RunConfig(policy="window", window=128, **LOAD), store)
    frames = [n for table, n in puts if table == "frames"]
    assert sum(frames) == s.frames == frame_counts(store.cursor(), s.run_id)["frames"]
    # 12 sessions on the tick grid: an instant finalises several frames, put together (one
    # put per frame row would make len(frames) == s.frames).
    assert max(frames) >= 2 and len(frames) <= s.frames / 2
