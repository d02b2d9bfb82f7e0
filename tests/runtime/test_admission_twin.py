"""Admission control on the twin: AIMD finds N*, latency-only control walks into the wall with
unbounded KV, the memory guard does not."""

import statistics

import pytest

from engine.twin import CostModel, TwinEngine
from engine.twin_cost import analytic_n_star, synchronized_frame_ms
from runtime import RunConfig, Runner
from store.queries import events, occupancy

COST = CostModel(4.0, 0.05, 0.0005)


def _run(store, cost=COST, **kw):
    cfg = RunConfig(engine="twin", **kw)
    return Runner(cfg, TwinEngine(cfg.engine_config(), cost), store).run()


def test_analytic_n_star_is_the_last_count_within_target():
    n = analytic_n_star(COST, 64.0, 16, 4, 128)
    assert synchronized_frame_ms(COST, n, 16, 4, 128) <= 64.0
    assert synchronized_frame_ms(COST, n + 1, 16, 4, 128) > 64.0


def test_aimd_converges_to_n_star_under_three_times_the_load(store):
    n_star = analytic_n_star(COST, 0.8 * 80.0, 16, 4, 128 + 16)
    offered = 3 * n_star
    s = _run(store, policy="window", window=128, pool_blocks=4096, frame_ms=80.0,
             load="poisson", sessions=4000, arrival_rate=offered / 20.0, session_s=20.0,
             duration_s=150.0, admission="aimd", target=0.8, seed=1)
    ticks = occupancy(store.cursor(), s.run_id)
    limits = store.cursor().execute(
        "SELECT t, limit_sessions, live FROM ticks WHERE run_id = ? AND t > 75 ORDER BY t",
        [s.run_id]).df()
    mean_live = statistics.fmean(limits.live)
    assert abs(mean_live - n_star) <= 0.1 * n_star, (mean_live, n_star)
    assert s.rejected > s.admitted  # 3× the load: most arrivals are turned away
    silent_late = store.cursor().execute(
        "SELECT count(*) FROM frames WHERE run_id = ? AND silent AND t_submit > 75",
        [s.run_id]).fetchone()[0]
    assert silent_late == 0
    assert not ticks.stalled.any()


# Attention over resident KV is cheap here, so latency stays flat until the pool is full:
# the paper's setting, where a latency signal cannot see the wall coming.
FLAT = CostModel(4.0, 0.05, 0.00002)
UNBOUNDED = dict(policy="unbounded", pool_blocks=1024, frame_ms=80.0, load="poisson",
                 sessions=4000, arrival_rate=3.0, session_s=30.0, duration_s=60.0,
                 admission="aimd", target=0.8, seed=2)


def test_latency_only_aimd_over_admits_unbounded_kv_and_stalls(store):
    s = _run(store, cost=FLAT, **UNBOUNDED)
    assert s.stalled and s.silent_rate > 0.2


def test_memory_guard_keeps_unbounded_kv_off_the_wall(store):
    s = _run(store, cost=FLAT, memory_guard=True, **UNBOUNDED)
    assert not s.stalled and s.silent_frames == 0
    assert s.max_occupancy < 1.0
    rejects = events(store.cursor(), s.run_id)
    rejects = rejects[rejects.kind == "reject"]
    assert rejects.detail.str.contains("memory_guard").any()


def test_live_limit_change_is_applied_and_recorded(store):
    cfg = RunConfig(engine="twin", policy="window", window=128, pool_blocks=1024,
                    sessions=40, load="ramp", arrival_rate=4.0, duration_s=20.0)
    runner = Runner(cfg, TwinEngine(cfg.engine_config(), COST), store)
    runner.status = "running"  # apply() validates against a live run
    msg = runner.apply(limit="fixed", limit_params={"limit": 5}, window=64)
    assert "limit fixed (cap 5)" in msg and "W=64" in msg
    with pytest.raises(ValueError, match="target 1.5"):
        runner.apply(target=1.5)
    with pytest.raises(ValueError, match="window 16 is smaller than one block"):
        runner.apply(window=16)
    s = runner.run()
    assert s.final_limit == 5 and s.admitted == 5
    ev = events(store.cursor(), s.run_id)
    changes = ev[ev.kind == "param_change"].detail.tolist()
    assert any('"setting": "limit"' in d for d in changes)
    assert any('"setting": "policy"' in d and "W=64" in d for d in changes)
    assert runner.engine.policy.window_tokens == 64


def test_rollover_prompts_follow_a_live_window_change(store):
    """A session keeps its last W input tokens for its rollover prompt; after W moves, the
    next rollover carries the new W, not the one the session started with."""
    import json
    import time

    cfg = RunConfig(engine="twin", paced=True, policy="window", window=128, pool_blocks=1024,
                    sessions=2, frame_ms=80.0, duration_s=4.0)
    engine = TwinEngine(cfg.engine_config(), COST, paced=True)
    engine.max_model_len = 300  # a rollover about every 1.2 s of 16-token frames
    runner = Runner(cfg, engine, store)
    thread = runner.start()
    time.sleep(1.9)
    runner.apply(window=64)
    thread.join()
    ev = events(store.cursor(), runner.summary.run_id)
    change_t = ev[ev.kind == "param_change"].t.iloc[0]
    rolls = [(t, json.loads(d)["prompt_tokens"]) for t, d in
             zip(ev[ev.kind == "rollover"].t, ev[ev.kind == "rollover"].detail)]
    assert {p for t, p in rolls if t < change_t} == {128}, rolls
    assert rolls[-1][0] > change_t and {p for t, p in rolls if t > change_t} == {64}, rolls
