import math
import random

import pytest

from engine.config import EngineConfig
from engine.contract import KVPolicy
from engine.twin import CostModel, TwinEngine
from engine.twin_cost import fit_cost_model


def _engine(policy=KVPolicy(), pool=64):
    return TwinEngine(EngineConfig(pool_blocks=pool, policy=policy), CostModel(4.0, 0.05, 0.0))


def test_a_frame_prefills_then_decodes_one_token_per_step():
    eng = _engine()
    eng.open(1)
    h = eng.submit(1, list(range(1, 17)), 4)
    eng.sleep_until(1.0)
    # step cost: prefill 4 + 0.05·16 = 4.8 ms, then 3 decode steps of 4.05 ms
    assert len(h.token_times) == 4
    assert math.isclose(h.t_done, (4.8 + 3 * 4.05) / 1e3, rel_tol=1e-9)
    # KV holds 16 prompt + 3 fed-back outputs = 19 tokens = 1 block of 32
    assert eng.pool().used_blocks == 1 and eng.pool().paused == 1


def test_paused_sessions_keep_blocks_and_a_full_pool_stalls_silently():
    eng = _engine(pool=4)
    for s in (1, 2):
        eng.open(s)
    for _ in range(4):
        hs = [eng.submit(s, [5] * 32, 1) for s in (1, 2)]
        eng.sleep_until(eng.now() + 1.0)
    pool = eng.pool()
    assert pool.used_blocks == 4 and pool.running == 0 and pool.waiting == 2
    assert all(h.t_done is None for h in hs)  # nothing heals: both wait forever
    eng.close(1)  # aborting one frees its blocks; the other resumes
    eng.sleep_until(eng.now() + 1.0)
    assert hs[1].t_done is not None


def test_window_caps_blocks_per_session_and_live_shrink_frees_at_once():
    eng = _engine(KVPolicy("window", 128), pool=64)
    eng.open(1)
    for _ in range(40):
        eng.submit(1, [3] * 16, 4)
        eng.sleep_until(eng.now() + 0.1)
    assert eng.pool().used_blocks == 5  # ceil(128/32) + 1
    assert eng.begin_policy_change(KVPolicy("window", 64)).done()  # the twin applies at once
    assert eng.pool().used_blocks == 3


def test_fit_recovers_known_coefficients():
    rng = random.Random(0)
    truth = CostModel(3.0, 0.04, 0.002)
    steps = []
    for _ in range(400):
        tokens, resident = rng.randint(1, 300), rng.randint(0, 4000)
        steps.append({"step_ms": truth.step_ms(tokens, resident) * rng.uniform(0.98, 1.02),
                      "prompt_tokens": tokens - 1, "gen_tokens": 1, "resident_tokens": resident})
    model, facts = fit_cost_model(steps, source="synthetic")
    assert model.a_ms == pytest.approx(3.0, rel=0.1)
    assert model.b_ms_per_token == pytest.approx(0.04, rel=0.1)
    assert model.c_ms_per_resident_token == pytest.approx(0.002, rel=0.1)
    assert facts["r2"] > 0.9
    with pytest.raises(ValueError, match="too few"):
        fit_cost_model(steps[:5])


def test_cost_model_names_bad_coefficients():
    with pytest.raises(ValueError, match="b_ms_per_token = -1"):
        CostModel(1.0, -1, 0.0)
