"""Attention sinks + window KV inside vLLM, through its extension points (no fork).

Pieces, one job each:
  compaction  pure arithmetic: which blocks a query reads, how a chunk splits into sub-rows
  metadata    applies it to vLLM's CommonAttentionMetadata (shared by the CPU and CUDA builders)
  spec        the KV cache spec (bounded per-request memory) and the manager that frees gap blocks
  live        W and S changed while requests run, in step in the engine core and the workers
  rows        which request each batch row is, for builders after a live change
  support     what it can run on (vLLM version, attention backend) and the refusal otherwise
  config      the mode per engine: W and S in vLLM's own config (`additional_config`), which
              vLLM hands to every process it starts
  plugin      the `vllm.general_plugins` entry point that wires them into every vLLM process
              (each hook a pass-through for an engine whose config asks for no sinks)

The engine turns the mode on per engine in its engine arguments (`config.additional_config`,
engine/vllm_args.py), not in the process environment. W and S then move live (`live`): a utility
call into the engine core, which forwards to the workers.
"""

from engine.sinks.config import KEY, additional_config, policy_in

__all__ = ["KEY", "additional_config", "policy_in"]
