"""The twin with data parallelism: each rank its own pool, clock and steps; a full rank stalls
only its own sessions; unpinned sessions follow vLLM's balancer."""

import pytest

from engine.balance import EngineLoad, vllm_pick
from engine.config import EngineConfig
from engine.twin import CostModel, TwinEngine


def _engine(ranks=2, pool=4):
    return TwinEngine(EngineConfig(pool_blocks=pool, data_parallel_size=ranks),
                      CostModel(4.0, 0.05, 0.0))


def test_each_rank_has_its_own_pool_and_a_full_one_stalls_only_its_sessions():
    eng = _engine()
    assert eng.ranks == 2
    for s in (1, 2):
        eng.open(s, rank=0)  # both on rank 0: its 4 blocks are theirs
    eng.open(3, rank=1)
    assert [eng.session_rank(s) for s in (1, 2, 3)] == [0, 0, 1]
    for _ in range(4):
        stuck = [eng.submit(s, [5] * 32, 1) for s in (1, 2)]
        served = eng.submit(3, [5] * 16, 1)
        eng.sleep_until(eng.now() + 1.0)
        eng.close(3)  # a fresh short session on rank 1 every second
        eng.open(3, rank=1)
    r0, r1 = eng.pool_ranks()
    assert r0.used_blocks == 4 and r0.running == 0 and r0.waiting == 2  # rank 0 stalled
    assert all(h.t_done is None for h in stuck)
    assert served.t_done is not None and r1.used_blocks == 0  # rank 1 kept serving
    agg = eng.pool()
    assert (agg.used_blocks, agg.total_blocks, agg.waiting) == (4, 8, 2)
    assert agg.occupancy == 0.5  # the mean reads half full while rank 0 is stuck


def test_a_rank_never_answers_before_a_frame_was_submitted():
    # Rank 0 runs long steps, so the engine clock runs ahead of idle rank 1; a frame submitted
    # to rank 1 at the engine's time must not be served in rank 1's past.
    eng = TwinEngine(EngineConfig(pool_blocks=64, data_parallel_size=2),
                     CostModel(30.0, 0.05, 0.0))
    eng.open(1, rank=0)
    eng.open(2, rank=1)
    eng.submit(1, [5] * 16, 4)
    eng.sleep_until(0.01)  # rank 0's first step ends at 30.8 ms
    h = eng.submit(2, [5] * 16, 4)
    assert h.t_submit == eng.now() > 0.01
    eng.sleep_until(1.0)
    assert h.t_first is not None and h.t_first > h.t_submit


def test_unpinned_sessions_follow_vllms_balancer():
    eng = _engine(ranks=3, pool=64)
    for s in range(6):
        eng.open(s)
    assert [eng.session_rank(s) for s in range(6)] == [0, 1, 2, 0, 1, 2]  # in flight, rotated
    # An engine whose requests queue on a full pool is penalised only past half usage.
    queued_full = EngineLoad(inflight=2, waiting=2, running=0, kv_usage=1.0)
    assert queued_full.score() == 2 + 2 * 6.0 * 0.5
    assert vllm_pick([queued_full, EngineLoad(3, 0, 3, 0.4)], start=0) == 1
    assert vllm_pick([EngineLoad(2, 0, 0, 1.0), EngineLoad(3, 0, 3, 0.4)], start=0) == 0


def test_rank_misuse_is_a_value_error():
    eng = _engine()
    with pytest.raises(ValueError, match=r"rank 2 is not one of this engine's ranks \[0, 1\]"):
        eng.open(1, rank=2)
    with pytest.raises(ValueError, match="session 9 is not open"):
        eng.session_rank(9)
    with pytest.raises(ValueError, match=r"data parallel size 0 must be an integer in \[1, 1024\]"):
        EngineConfig(data_parallel_size=0)
    with pytest.raises(ValueError, match="differs from the vLLM argument"):
        EngineConfig(data_parallel_size=2, vllm_args=(("data_parallel_size", 4),))
    assert TwinEngine(EngineConfig(vllm_args=(("data_parallel_size", 3),))).ranks == 3
