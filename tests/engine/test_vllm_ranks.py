"""The vLLM backend's per-rank pools from a faked two-engine stats feed: vLLM calls each stat
logger with an engine_idx; nothing here starts vLLM."""

import threading
from types import SimpleNamespace

import pytest

from engine.config import EngineConfig
from engine.vllm_backend import VLLMEngine
from engine.vllm_stream import StreamSession
from engine.vllm_stats import PoolProbe


def _sched(usage, running, waiting):
    return SimpleNamespace(kv_cache_usage=usage, num_running_reqs=running,
                           num_waiting_reqs=waiting)


def _engine(probe, sessions):
    """A VLLMEngine shell around a probe: what pool() and pool_ranks() read, no vLLM."""
    eng = VLLMEngine.__new__(VLLMEngine)
    eng.config = EngineConfig(pool_blocks=100, data_parallel_size=2)
    eng._ranks, eng._probe, eng._sessions = 2, probe, sessions
    return eng


def test_two_engines_stats_come_out_as_two_pools():
    probe = PoolProbe(ranks=2)
    probe.record(_sched(1.0, 0, 3), None, engine_idx=0)  # rank 0 full, everything waits
    probe.record(_sched(0.1, 2, 0), None, engine_idx=1)
    busy, paused = StreamSession(1, None, rank=0), StreamSession(2, None, rank=1)
    busy.pending.append(object())
    eng = _engine(probe, {1: busy, 2: paused})
    r0, r1 = eng.pool_ranks()
    assert (r0.used_blocks, r0.total_blocks, r0.running, r0.waiting) == (100, 100, 0, 3)
    assert (r1.used_blocks, r1.running, r1.waiting, r1.paused) == (10, 2, 0, 1)
    agg = eng.pool()
    assert (agg.used_blocks, agg.total_blocks, agg.paused) == (110, 200, 1)
    assert agg.occupancy == pytest.approx(0.55)  # the mean hides the full rank
    assert eng.ranks == 2 and eng.session_rank(1) == 0


def test_step_records_are_timed_per_engine_and_a_stray_index_is_ignored():
    probe = PoolProbe(ranks=2)
    it = SimpleNamespace(num_prompt_tokens=0, num_generation_tokens=1)
    probe.note_handover(16)
    for idx in (0, 1, 0, 1):
        probe.record(_sched(0.2, 1, 0), it, engine_idx=idx)
    probe.record(_sched(0.9, 1, 0), it, engine_idx=5)  # not an engine of this run
    assert [s["rank"] for s in probe.steps] == [0, 0, 1]  # rank 1's first step has no start
    assert [u for u, _, _ in probe.samples()] == [0.2, 0.2]
    assert probe.usage == 0.2 and probe.running == 1  # the one-engine view: rank 0


def test_the_stat_logger_forwards_the_engine_index():
    pytest.importorskip("vllm")
    from engine.vllm_stats import stat_logger_class

    probe = PoolProbe(ranks=2)
    logger = stat_logger_class(probe)(None, engine_index=1)
    logger.record(_sched(0.7, 1, 0), None, engine_idx=1)
    assert [u for u, _, _ in probe.samples()] == [0.0, 0.7]


def test_a_pinned_rank_outside_the_engines_is_refused():
    eng = _engine(PoolProbe(ranks=2), {})
    eng._loop, eng._lock = None, threading.Lock()
    with pytest.raises(ValueError, match=r"rank 2 is not one of this engine's ranks \[0, 1\]"):
        eng.open(7, rank=2)
