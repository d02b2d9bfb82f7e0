"""The dtype the model runs in follows the hardware: bf16 only where it is computed natively."""

from pathlib import Path

import pytest

from engine import dtype
from engine.config import EngineConfig, parse_vllm_args
from engine.vllm_args import engine_args

ZEN3 = frozenset({"avx", "avx2", "fma", "f16c"})  # the AVX2-only EPYC of issue 25
SAPPHIRE = ZEN3 | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
COOPER = ZEN3 | {"avx512f", "avx512_bf16"}


def test_bf16_only_where_the_cpu_computes_it_natively():
    assert dtype.choose(ZEN3).dtype == "float32"
    assert "no bf16 hardware" in dtype.choose(ZEN3).reason
    assert dtype.choose(SAPPHIRE) == dtype.DtypeChoice(
        "bfloat16", "bfloat16: the CPU computes bf16 natively (amx_bf16)")
    assert dtype.choose(COOPER).reason.endswith("(avx512_bf16)")
    assert dtype.choose(ZEN3 | {"avx512f"}).dtype == "float32"  # AVX-512 without BF16
    assert dtype.choose(frozenset()).dtype == "float32"  # unknown CPU: the safe one


def test_the_gpu_gets_its_native_type_and_an_override_always_wins():
    assert dtype.choose(ZEN3, cuda=True, cuda_bf16=True).dtype == "bfloat16"
    assert dtype.choose(ZEN3, cuda=True, cuda_bf16=False).dtype == "float16"
    forced = dtype.choose(ZEN3, override="bfloat16")
    assert forced.dtype == "bfloat16" and "--vllm-arg" in forced.reason
    assert dtype.choose(SAPPHIRE, override="float32").dtype == "float32"
    with pytest.raises(ValueError, match="dtype 'fp8' is not one of"):
        dtype.choose(ZEN3, override="fp8")


def test_engine_args_carry_the_choice_and_the_operators_dtype_last():
    cfg = EngineConfig()
    assert engine_args(cfg, "m", 2048, on_cpu=True, dtype="float32")["dtype"] == "float32"
    forced = EngineConfig(vllm_args=parse_vllm_args(["dtype=bfloat16"]))
    assert engine_args(forced, "m", 2048, on_cpu=True, dtype="float32")["dtype"] == "bfloat16"


def test_the_backends_choice_takes_the_operators_dtype():
    assert dtype.for_vllm_args(parse_vllm_args(["dtype=bfloat16"])).dtype == "bfloat16"
    assert dtype.for_vllm_args(()).dtype in ("float32", "bfloat16", "float16")


def test_this_hosts_flags_are_read():
    flags = dtype.host_cpu_flags()
    assert isinstance(flags, frozenset)
    expected = "bfloat16" if flags & set(dtype.NATIVE_BF16_FLAGS) else "float32"
    assert dtype.choose(flags).dtype == expected
    # the model name every machine line starts from (calibration key, suite line, benchmarks)
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "model name" in info:
        model = dtype.cpu_model()
        assert model and model == model.strip() and f": {model}\n" in info
    else:
        assert dtype.cpu_model() == ""


def test_flags_set_by_hand_replace_the_hosts(monkeypatch):
    """METRONOME_CPU_FLAGS (scripts/as_avx2.sh) makes this machine choose as an AVX2-only one,
    and says so wherever the machine is named (a calibration is keyed by that line)."""
    from services import machine

    def fresh():
        dtype.host_cpu_flags.cache_clear()
        machine.host_machine.cache_clear()

    monkeypatch.setenv(dtype.FLAGS_ENV, " ".join(sorted(ZEN3)))
    fresh()
    try:
        assert dtype.host_cpu_flags() == ZEN3
        assert dtype.choose(dtype.host_cpu_flags()).dtype == "float32"
        assert machine.host_machine().endswith("avx2 (flags from METRONOME_CPU_FLAGS)")
        monkeypatch.setenv(dtype.FLAGS_ENV, " ".join(sorted(SAPPHIRE)))
        fresh()
        assert dtype.choose(dtype.host_cpu_flags()).dtype == "bfloat16"
    finally:
        monkeypatch.delenv(dtype.FLAGS_ENV)
        fresh()
    assert dtype.flags_note() == ""
