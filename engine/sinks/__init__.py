"""Attention sinks + window KV inside vLLM, through its extension points (no fork).

Pieces, one job each:
  compaction  pure arithmetic: which blocks a query reads, how a chunk splits into sub-rows
  metadata    applies it to vLLM's CommonAttentionMetadata (shared by the CPU and CUDA builders)
  spec        the KV cache spec (bounded per-request memory) and the manager that frees gap blocks
  live        W and S changed while requests run, in step in the engine core and the workers
  rows        which request each batch row is, for builders after a live change
  support     what it can run on (vLLM version, attention backend) and the refusal otherwise
  env         the mode per engine: W and S in the environment vLLM's processes inherit
  plugin      the `vllm.general_plugins` entry point that wires them into every vLLM process
              (inert, loading none of the above, when the engine runs no sinks)

The engine turns the mode on per engine through two environment variables, set before vLLM
starts (spawned engine-core and worker processes inherit them); see `sink_env`. W and S then
move live (`live`): a utility call into the engine core, which forwards to the workers.
"""

from engine.sinks.env import (SINK_TOKENS_ENV, WINDOW_TOKENS_ENV, apply_env, configured,
                              sink_env)

__all__ = ["SINK_TOKENS_ENV", "WINDOW_TOKENS_ENV", "apply_env", "configured", "sink_env"]
