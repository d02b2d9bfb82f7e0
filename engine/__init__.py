"""Serving backends behind one contract. Nothing outside engine/ imports vLLM."""

from engine.config import EngineConfig, parse_vllm_args
from engine.contract import Engine, FrameHandle, KVPolicy, PoolStats

ENGINES = ("vllm", "twin")


def create_engine(kind: str, config: EngineConfig, cost=None, paced: bool = False) -> Engine:
    """Build a backend. `cost` (a twin CostModel) and `paced` (real-time twin) are twin-only."""
    if kind == "twin":
        from engine.models import NAMED_MODELS
        from engine.twin import TwinEngine

        if config.model not in NAMED_MODELS:
            from engine.models import resolve_model  # validates the path, builds nothing big

            resolve_model(config.model, config.seed)
        return TwinEngine(config, cost, paced=paced)
    if kind == "vllm":
        from engine.vllm_backend import VLLMEngine

        return VLLMEngine(config)
    raise ValueError(f"engine {kind!r} is not one of {', '.join(ENGINES)}")


__all__ = ["ENGINES", "Engine", "EngineConfig", "FrameHandle", "KVPolicy", "PoolStats",
           "create_engine", "parse_vllm_args"]
