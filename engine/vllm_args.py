"""How the vLLM backend starts vLLM: max_model_len and the engine arguments, from the config
alone (no engine needed, so they are unit-tested without one)."""

from __future__ import annotations

from engine.config import EngineConfig, dp_ranks
from engine.sinks import config as sinks_config
from engine.sinks.support import CUDA_BACKEND, backend_refusal


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - any import problem means "no CUDA"
        return False


def derive_max_model_len(cfg: EngineConfig, info: dict) -> int:
    """The max_model_len vLLM is started with: the config's, capped at the model's; for full
    attention no more than the pool holds (vLLM refuses a smaller pool)."""
    model_max = int(info.get("max_position_embeddings") or 2048)
    if cfg.max_model_len is not None:
        return min(cfg.max_model_len, model_max)
    if cfg.policy.kind == "unbounded":
        # Full attention: vLLM refuses a pool smaller than max_model_len (two blocks spare
        # for the null block and rounding).
        return max(cfg.block_size, min(model_max, (cfg.pool_blocks - 2) * cfg.block_size))
    return model_max


def engine_args(cfg: EngineConfig, model_path: str, max_model_len: int, on_cpu: bool,
                dtype: str = "auto", model_args: dict | None = None) -> dict:
    """vLLM's engine arguments for a config: an exact pool, no prefix caching, the dtype this
    machine computes fastest (engine/dtype.py), a step size that keeps a windowed session inside
    a small pool, the CUDA backend sinks compact, the model's own (`model_args`: an audio-in
    model's encoder window), the operator's --vllm-arg last. W and S ride in
    `additional_config` (engine/sinks/config.py), merged with the model's and the operator's
    entries. A sinks run with an unsupported backend is a ValueError."""
    args: dict = {
        "model": model_path,
        "dtype": dtype,
        "block_size": cfg.block_size,
        "num_gpu_blocks_override": cfg.pool_blocks,
        "max_model_len": max_model_len,
        "enable_prefix_caching": False,  # sessions never share prefixes; keep accounting exact
        "max_num_seqs": 256,  # paused streaming sessions count against this
        "seed": cfg.seed,
    }
    if on_cpu:
        # The CPU backend reserves this fraction of node memory up front; the pool itself is
        # fixed by num_gpu_blocks_override, so keep the reservation small.
        args.update(enforce_eager=True, gpu_memory_utilization=0.3)
    if cfg.policy.kind == "window":
        # vLLM sizes a windowed request as window (+ sink blocks) + one step's batch of
        # tokens; keep that inside the pool so a small pool is accepted (the whole point of
        # windowing). Small steps also chunk prefills, which keeps the per-session bound hard.
        pool_tokens = cfg.pool_blocks * cfg.block_size
        sink_tokens = -(-cfg.policy.sink_tokens // cfg.block_size) * cfg.block_size
        spare = pool_tokens - cfg.policy.window_tokens - sink_tokens - cfg.block_size
        # (x2: vLLM reserves for two in-flight batches; /3 leaves slack for the null block).
        step_tokens = spare // 3 // cfg.block_size * cfg.block_size
        args["max_num_batched_tokens"] = max(256, min(2048, step_tokens))
        if not on_cpu:
            # Full-attention layers; engine.sinks frees and hides the gap blocks (enabled
            # by additional_config, below). FULL CUDA graphs would replay
            # attention from buffers its compacted metadata bypasses, and FlashAttention
            # is the CUDA backend whose metadata it compacts.
            args["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
            args["attention_backend"] = CUDA_BACKEND
    ranks = dp_ranks(cfg)  # from the config alone: engine_args needs no started engine
    if ranks > 1:
        args["data_parallel_size"] = ranks  # num_gpu_blocks_override is per engine
    extra = sinks_config.additional_config(cfg.policy)
    for key, value in [*(model_args or {}).items(), *cfg.vllm_args]:
        if key == "additional_config":
            extra = _merged_extra(extra, value)
        else:
            args[key] = value
    if extra:
        args["additional_config"] = extra
    if cfg.policy.kind == "window" and not on_cpu:
        refusal = backend_refusal(args)
        if refusal:
            raise ValueError(refusal)
    return args


def _merged_extra(ours: dict, theirs) -> dict:
    """`additional_config` entries given as a vLLM argument, beside the engine's own: the
    sinks entry is the run's policy (--policy/--window/--sinks), never set by hand."""
    if not isinstance(theirs, dict):
        raise ValueError(f"vLLM argument additional_config={theirs!r} must be a dict")
    if sinks_config.KEY in theirs:
        raise ValueError(f"vLLM argument additional_config[{sinks_config.KEY!r}] is set by the "
                         "run's KV policy: give --policy window --window W --sinks S instead")
    return {**ours, **theirs}


def window_fit_refusal(cfg: EngineConfig, policy, step_tokens: int) -> str | None:
    """Why a W/S could never be scheduled in this pool (one line), or None: one session's blocks
    with a whole step of new tokens in flight (what vLLM reserves per request) must fit."""
    need = policy.blocks_per_session(cfg.block_size) + -(-step_tokens // cfg.block_size)
    if need > cfg.pool_blocks - 1:
        return (f"W={policy.window_tokens} S={policy.sink_tokens} needs up to {need} blocks for "
                f"one session (window + sinks + a {step_tokens}-token step); the pool has "
                f"{cfg.pool_blocks - 1}: allowed W + S up to about "
                f"{(cfg.pool_blocks - 3) * cfg.block_size - step_tokens} tokens")
    return None
