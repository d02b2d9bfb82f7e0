"""Telemetry on its own: a tick's pool samples (one monitor per rank; one rank is a fleet of
one), the stall rule, the overrun, the tick rows and what placement and the guard weigh."""

import pytest
from runtime_factories import ScriptedEngine, config, pool, recorder

from control.signals import STALL_TICKS
from engine.contract import KVPolicy, StepStats
from runtime.pools import TickCounts
from runtime.telemetry import EngineFailed, Telemetry


def _telemetry(cfg=None, **engine_kw):
    cfg = cfg or config(data_parallel_size=engine_kw.get("ranks", 1))
    engine = ScriptedEngine(policy=cfg.kv_policy(), **engine_kw)
    rec = recorder(cfg)
    return Telemetry(cfg, engine, rec), engine, rec


def _tick(tel, engine, k, tokens=0, owed=0):
    t = k * 0.08
    engine.clock = t
    return tel.measure(t, TickCounts(tokens, owed))


def test_a_full_pool_with_frames_owed_and_no_token_is_a_stall_after_stall_ticks():
    tel, engine, rec = _telemetry()
    engine.pools = [pool(64)]
    samples = [_tick(tel, engine, k, owed=3) for k in range(STALL_TICKS + 2)]
    assert [s.stalled for s in samples] == [False] * (STALL_TICKS - 1) + [True] * 3
    (stall,) = rec.writer.events("stall")  # one event for the stall, not one per tick
    assert stall["since"] == 0.0 and stall["ticks"] == STALL_TICKS and stall["frames_owed"] == 3
    assert tel.first_stall_at == 0.0 and rec.pool_full == {0: True, None: True}
    assert "rank" not in stall and stall["label"].startswith("pool full")  # a fleet of one


@pytest.mark.parametrize("used, tokens, owed", [(64, 1, 3), (64, 0, 0), (50, 0, 3)])
def test_no_stall_while_tokens_flow_nothing_is_owed_or_the_pool_has_room(used, tokens, owed):
    tel, engine, rec = _telemetry()
    engine.pools = [pool(used)]
    assert not any(_tick(tel, engine, k, tokens, owed).stalled for k in range(5))
    assert rec.writer.events("stall") == [] and tel.first_stall_at is None


def test_after_the_guard_evicted_the_detector_starts_again_the_first_stall_stays():
    tel, engine, rec = _telemetry()
    engine.pools = [pool(64)]
    for k in range(STALL_TICKS):
        _tick(tel, engine, k, owed=1)
    tel.reset_stall(0)
    assert not _tick(tel, engine, STALL_TICKS, owed=1).stalled
    assert tel.first_stall_at == 0.0


def test_a_tick_that_runs_late_is_an_overrun_and_an_engine_error_fails_the_run():
    tel, engine, rec = _telemetry()
    engine.clock = 0.16 + 0.05  # the tick due at 0.16 s ran 50 ms late (> half a frame)
    sample = tel.measure(0.16, TickCounts(0, 0))
    assert sample.overrun_ms == pytest.approx(50.0) and rec.totals.overruns == 1
    engine.failure = "engine core died"
    with pytest.raises(EngineFailed, match="engine core died"):
        tel.measure(0.24, TickCounts(0, 0))


def test_the_tick_row_and_the_engine_steps_on_the_run_clock():
    tel, engine, rec = _telemetry(config(policy="window", window=64, sinks=32))
    rec.t0 = 10.0
    engine.pools = [pool(16)]
    engine.clock = 10.08
    sample = tel.measure(0.08, TickCounts(5, 1))
    engine.steps = [StepStats(10.05, 3.0, 16, 4, 16, 512, 2)]
    tel.write_tick(1, sample, live=2, live_by_rank={0: 2}, limit=4, admitted=2, rejected=1,
                   p95_ms=30.0, n_star=None)
    (row,) = rec.writer.rows["ticks"]
    assert (row["tick"], row["occupancy"], row["tokens_out"], row["frames_waiting"]) == \
        (1, 0.25, 5, 1)
    assert (row["window_tokens"], row["sink_tokens"], row["live"], row["rejected"]) == \
        (64, 32, 2, 1)
    assert row["silent_rate"] is None  # no frame finalised since the last tick
    (step,) = rec.writer.rows["steps"]
    assert step["t"] == pytest.approx(0.05) and step["run_id"] == rec.run_id
    assert step["step_ms"] == 3.0 and step["resident_tokens"] == 512
    assert rec.writer.rows["rank_ticks"] == []  # one rank: the tick row is its row


def test_memory_signals_floor_the_growth_at_the_load_token_rate():
    tel, _, _ = _telemetry(config(session_s=2.0))
    signals = tel.memory_signals(0, 0.0, live_here=0)
    # 19 KV tokens per 80 ms frame into 64 × 32 tokens.
    assert signals.growth_per_session_per_s == pytest.approx(19 / 0.08 / 2048)
    assert signals.plateau_per_session is None and signals.lifetime_s == 2.0
    assert signals.live is None  # a fleet of one: the guard counts the gate's sessions
    bounded, _, _ = _telemetry(config(policy="window", window=64, duration_s=4.0))
    assert bounded.memory_signals(0, 1.0, 0).plateau_per_session == pytest.approx(3 / 64)
    assert bounded.memory_signals(0, 1.0, 0).lifetime_s == 3.0  # what is left of the run


# --- per rank ---------------------------------------------------------------------------------

def test_one_full_rank_stalls_while_the_engine_mean_has_room():
    tel, engine, rec = _telemetry(ranks=2)
    engine.pools = [pool(64), pool(4)]
    for k in range(STALL_TICKS):
        engine.clock = k * 0.08
        sample = tel.measure(k * 0.08, TickCounts(3, 2, {0: 0, 1: 3}, {0: 2, 1: 0}))
    assert sample.pool.occupancy < 0.6 and tel.stalled_ranks() == [0]
    assert sample.stalled  # the engine-wide row: a stalled rank is a stall
    (stall,) = rec.writer.events("stall")
    assert stall["rank"] == 0 and stall["label"].startswith("rank 0: ")
    assert rec.pool_full == {0: True, 1: False, None: False}
    tel.write_tick(1, sample, live=3, live_by_rank={0: 2, 1: 1}, limit=4, admitted=3,
                   rejected=0, p95_ms=None)
    assert [(r["rank"], r["stalled"], r["live"]) for r in rec.writer.rows["rank_ticks"]] == \
        [(0, True, 2), (1, False, 1)]
    summary = tel.summary()
    assert [r.stalled for r in summary["ranks"]] == [True, False]
    assert summary["stalled_rank"] == 0 and tel.first_stall_at == 0.0
    tel.reset_stall(0)  # the guard evicted on rank 0: rank 1's detector is untouched
    assert tel.first_stall_at == 0.0


def test_a_fleet_of_one_summarises_its_one_rank():
    tel, engine, rec = _telemetry()
    engine.pools = [pool(64)]
    for k in range(STALL_TICKS):
        _tick(tel, engine, k, owed=1)
    (rank,) = tel.summary()["ranks"]
    assert rank.stalled and rank.stall_at_s == 0.0 and rank.max_occupancy == 1.0


def test_rank_memory_signals_weigh_the_rank_a_session_would_land_on():
    tel, engine, _ = _telemetry(ranks=2)
    engine.pools = [pool(32), pool(0)]
    loads = tel.loads({0: 1})
    assert [(x.rank, x.occupancy, x.live) for x in loads] == [(0, 0.5, 1), (1, 0.0, 0)]
    signals = tel.memory_signals(1, 0.0, 0)
    assert signals.live == 0 and signals.rho_now == 0.0
    engine._policy = KVPolicy("window", 64, 0)
    assert tel.plateau_per_session() == pytest.approx(3 / 64)
