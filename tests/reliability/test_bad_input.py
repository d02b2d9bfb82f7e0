"""Bad input through the Python API: one-line ValueErrors naming the value; nothing half-starts."""

import pytest

from engine.config import EngineConfig, parse_vllm_args
from engine.contract import KVPolicy
from runtime import RunConfig
from store import Store, StoreError

CASES = [
    (dict(policy="window", window=16), "window 16 is smaller than one block"),
    (dict(policy="window", window=64, sinks=64), "sinks 64 must be smaller than the window"),
    (dict(policy="window", window=64, sinks=-1), "sinks -1 must be ≥ 0"),
    (dict(policy="window", window=256, pool_blocks=4), "pool of 4 blocks"),
    (dict(policy="sliding"), "policy 'sliding' is not one of"),
    (dict(frame_ms=0.0), "frame period 0.0 ms"),
    (dict(frame_ms=float("nan")), "frame period nan ms"),
    (dict(budget_ms=-1.0), "budget -1.0 ms"),
    (dict(tokens_in=0), "tokens in 0"),
    (dict(tokens_out=5000), "tokens out 5000"),
    (dict(wait_budget=0.0), "wait budget 0.0"),
    (dict(engine="tgi"), "engine 'tgi' is not one of"),
    (dict(admission="pid"), "admission 'pid' is not one of"),
    (dict(target=2.0), "target 2.0"),
    (dict(stall_guard="maybe"), "stall guard 'maybe'"),
    (dict(memory_guard="maybe"), "memory guard 'maybe'"),
    (dict(paced=True, engine="vllm"), "paced applies to the twin engine only"),
    (dict(load="poisson"), "needs --arrival-rate"),
    (dict(sessions=-3), "sessions -3"),
    (dict(block_size=48), "block size 48"),
    (dict(window=128), "window 128 only applies to policy window"),
]


@pytest.mark.parametrize("kwargs, needle", CASES, ids=[c[1][:30] for c in CASES])
def test_run_config_rejects_with_one_line(kwargs, needle):
    with pytest.raises(ValueError) as err:
        RunConfig(**{"engine": "twin", **kwargs})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_engine_level_values():
    with pytest.raises(ValueError, match="pool blocks 1 must be ≥ 2"):
        EngineConfig(pool_blocks=1)
    with pytest.raises(ValueError, match="window None must be ≥ 1"):
        KVPolicy("window")
    with pytest.raises(ValueError, match="must look like key=value"):
        parse_vllm_args(["tensor_parallel_size"])
    assert parse_vllm_args(["--tensor-parallel-size=2", "dtype=float16"]) == (
        ("tensor_parallel_size", 2), ("dtype", "float16"))


def test_database_in_an_unusable_place_is_one_line():
    with pytest.raises(StoreError) as err:
        Store("/proc/metronome.duckdb")
    assert "database" in str(err.value) and "\n" not in str(err.value)
