"""Which floating-point type the model runs in on this machine, and why.

vLLM's CPU backend downcasts an fp32 checkpoint to bf16. A CPU computes bf16 natively only
with AMX (Sapphire Rapids and later) or AVX-512 BF16 (Cooper Lake, Zen 4); elsewhere (AVX2-only
Zen 3, most laptops and CI runners) bf16 is emulated and a decode step costs ~1.5–2.5× fp32's
(docs/benchmarks/log.md, "bf16 vs fp32"). On CUDA the GPU's own type: bf16 where it has bf16 units,
else fp16. An operator's `--vllm-arg dtype=…` always wins.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# /proc/cpuinfo flags that mean bf16 matrix work runs in hardware.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
DTYPES = ("float32", "bfloat16", "float16", "auto", "half", "float")  # vLLM's spellings


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str  # one of DTYPES, as vLLM's `dtype` argument spells it
    reason: str  # one line for the log, the run's row and the Live header

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")


def choose(cpu_flags: frozenset[str], *, cuda: bool = False, cuda_bf16: bool = False,
           override: str | None = None) -> DtypeChoice:
    """The dtype for these CPU flags (or this GPU); `override` (--vllm-arg dtype=…) wins."""
    if override is not None:
        return DtypeChoice(str(override), f"{override}: set by --vllm-arg dtype")
    if cuda:
        if cuda_bf16:
            return DtypeChoice("bfloat16", "bfloat16: the GPU computes bf16 natively")
        return DtypeChoice("float16", "float16: the GPU has no bf16 units")
    native = [flag for flag in NATIVE_BF16_FLAGS if flag in cpu_flags]
    if native:
        return DtypeChoice("bfloat16", f"bfloat16: the CPU computes bf16 natively ({native[0]})")
    return DtypeChoice("float32", "float32: the CPU has no bf16 hardware (no AMX, no "
                                  "AVX-512 BF16), where bf16 is emulated and slower")


# Space-separated flags to choose by instead of /proc/cpuinfo's: reproduces another machine's
# choice, its calibration key and its log lines (scripts/as_avx2.sh sets it).
FLAGS_ENV = "METRONOME_CPU_FLAGS"


@functools.lru_cache(maxsize=1)
def host_cpu_flags() -> frozenset[str]:
    """This machine's CPU flags (empty where /proc/cpuinfo cannot be read: fp32, the safe one),
    or those `METRONOME_CPU_FLAGS` names when it is set."""
    if os.environ.get(FLAGS_ENV) is not None:
        return frozenset(os.environ[FLAGS_ENV].split())
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def step_flags() -> list[str]:
    """The flags of this machine (or of METRONOME_CPU_FLAGS) that change what a step costs: the
    vector width and native bf16. They name the machine a calibration or a test run holds for."""
    return [f for f in ("avx2", "avx512f", *NATIVE_BF16_FLAGS) if f in host_cpu_flags()]


def flags_note() -> str:
    """"" for the real flags; a note to append to a machine line when they are set by hand."""
    return f" (flags from {FLAGS_ENV})" if os.environ.get(FLAGS_ENV) is not None else ""


def _cuda_bf16() -> tuple[bool, bool]:
    try:
        import torch

        if not torch.cuda.is_available():
            return False, False
        return True, bool(torch.cuda.is_bf16_supported())
    except Exception:  # noqa: BLE001 - any import problem means "no CUDA"
        return False, False


def for_host(override: str | None = None) -> DtypeChoice:
    """The dtype for this machine (see `choose`)."""
    cuda, bf16 = (False, False) if override is not None else _cuda_bf16()
    return choose(host_cpu_flags(), cuda=cuda, cuda_bf16=bf16, override=override)


def for_vllm_args(vllm_args) -> DtypeChoice:
    """The dtype for this machine unless the operator's --vllm-arg pairs name one."""
    override = dict(vllm_args).get("dtype")
    return for_host(None if override is None else str(override))


def torch_dtype(name: str):
    """The torch dtype for a DTYPES name ("auto": float32, the checkpoint's own here)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "auto": torch.float32}[name]
