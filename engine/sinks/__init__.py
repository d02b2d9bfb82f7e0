"""Attention sinks + window KV inside vLLM, through its extension points (no fork).

Pieces, one job each:
  compaction  pure arithmetic: which blocks a query reads, how a chunk splits into sub-rows
  metadata    applies it to vLLM's CommonAttentionMetadata (shared by the CPU and CUDA builders)
  spec        the KV cache spec (bounded per-request memory) and the manager that frees gap blocks
  live        W and S changed while requests run, in step in the engine core and the workers
  rows        which request each batch row is, for builders after a live change
  support     what it can run on (vLLM version, attention backend) and the refusal otherwise
  plugin      the `vllm.general_plugins` entry point that wires them into every vLLM process
              (inert, loading none of the above, when the engine runs no sinks)

The engine turns the mode on per engine through two environment variables, set before vLLM
starts (spawned engine-core and worker processes inherit them); see `sink_env`. W and S then
move live (`live`): a utility call into the engine core, which forwards to the workers.
"""

from __future__ import annotations

import os

SINK_TOKENS_ENV = "METRONOME_SINK_TOKENS"
WINDOW_TOKENS_ENV = "METRONOME_WINDOW_TOKENS"


def sink_env(window_tokens: int | None, sink_tokens: int) -> dict[str, str | None]:
    """The environment for one engine: the mode on for a window (any S ≥ 0, so W and S can
    move live), else cleared (None). The window is block-granular like the sinks."""
    if window_tokens:
        return {WINDOW_TOKENS_ENV: str(window_tokens), SINK_TOKENS_ENV: str(sink_tokens)}
    return {WINDOW_TOKENS_ENV: None, SINK_TOKENS_ENV: None}


def apply_env(env: dict[str, str | None]) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def configured() -> tuple[int, int] | None:
    """(W, S) when this process's engine runs in sinks mode (the window is set), else None."""
    window = int(os.environ.get(WINDOW_TOKENS_ENV) or 0)
    sinks = int(os.environ.get(SINK_TOKENS_ENV) or 0)
    if window <= 0:
        return None
    if not 0 <= sinks < window:
        raise ValueError(f"{SINK_TOKENS_ENV}={sinks} must be in [0, "
                         f"{WINDOW_TOKENS_ENV}={window})")
    return window, sinks
