"""Engine configuration shared by every backend."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from engine.contract import KVPolicy

BLOCK_SIZE_MULTIPLE = 32  # the CPU attention backend accepts only multiples of 32
MAX_DATA_PARALLEL = 1024  # ranks; the twin simulates each, so this bounds a run's memory


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"  # a named model (engine/models.py NAMED_MODELS) or a local folder
    block_size: int = 32
    pool_blocks: int = 256
    policy: KVPolicy = field(default_factory=KVPolicy)
    max_model_len: int | None = None  # None: derived from the pool and the model
    seed: int = 0
    vllm_args: tuple[tuple[str, object], ...] = ()
    # Data-parallel ranks, each with its own pool of `pool_blocks` (vLLM's data_parallel_size;
    # `--vllm-arg data_parallel_size=N` says the same thing for the vLLM backend).
    data_parallel_size: int = 1
    # The run's frame period: an audio-in model's encoder window is sized to one frame of it.
    frame_ms: float = 80.0

    def __post_init__(self) -> None:
        if not (isinstance(self.frame_ms, (int, float)) and 0 < self.frame_ms <= 10_000):
            raise ValueError(f"frame period {self.frame_ms} ms must be in (0, 10000]")
        if self.block_size < BLOCK_SIZE_MULTIPLE or self.block_size % BLOCK_SIZE_MULTIPLE:
            raise ValueError(
                f"block size {self.block_size} must be a positive multiple of "
                f"{BLOCK_SIZE_MULTIPLE} (32, 64, 96, ...)")
        if self.pool_blocks < 2:
            raise ValueError(f"pool blocks {self.pool_blocks} must be ≥ 2")
        self.policy.check_block_size(self.block_size)
        per_session = self.policy.blocks_per_session(self.block_size)
        if per_session is not None and self.pool_blocks < per_session:
            raise ValueError(
                f"pool of {self.pool_blocks} blocks is smaller than one session's window "
                f"({per_session} blocks of {self.block_size} tokens); allowed: pool ≥ {per_session}")
        dp_arg = dict(self.vllm_args).get("data_parallel_size")
        if not isinstance(self.data_parallel_size, int) or not \
                1 <= self.data_parallel_size <= MAX_DATA_PARALLEL:
            raise ValueError(f"data parallel size {self.data_parallel_size} must be an integer "
                             f"in [1, {MAX_DATA_PARALLEL}]")
        if dp_arg is not None and self.data_parallel_size != 1 and \
                dp_arg != self.data_parallel_size:
            raise ValueError(f"data parallel size {self.data_parallel_size} differs from the "
                             f"vLLM argument data_parallel_size={dp_arg}; give one of them")
        if self.max_model_len is not None and self.max_model_len < self.block_size:
            raise ValueError(f"max model len {self.max_model_len} must be ≥ {self.block_size}")
        dp_ranks(self)  # validates a data_parallel_size given as a vLLM argument


def dp_ranks(config: EngineConfig) -> int:
    """The data-parallel ranks a config asks for (the field or the vLLM argument)."""
    dp_arg = dict(config.vllm_args).get("data_parallel_size")
    if config.data_parallel_size == 1 and dp_arg is not None:
        if not isinstance(dp_arg, int) or not 1 <= dp_arg <= MAX_DATA_PARALLEL:
            raise ValueError(f"vLLM argument data_parallel_size={dp_arg!r} must be an integer "
                             f"in [1, {MAX_DATA_PARALLEL}]")
        return dp_arg
    return config.data_parallel_size


def parse_vllm_args(items: list[str] | tuple[str, ...]) -> tuple[tuple[str, object], ...]:
    """`key=value` strings to typed pairs: `tensor_parallel_size=2`, `gpu_memory_utilization=0.8`."""
    parsed = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or not key:
            raise ValueError(f"vLLM argument {item!r} must look like key=value")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        parsed.append((key, value))
    return tuple(parsed)
