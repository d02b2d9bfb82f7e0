"""The sinks mode of one engine, as environment variables set before vLLM starts: spawned
engine-core and worker processes inherit them, and the plugin reads them in each process."""

from __future__ import annotations

import os

from engine.contract import KVPolicy

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
    try:  # KVPolicy's rule for W and S (its one definition), on what the environment says
        KVPolicy("window", window, sinks)
    except ValueError as exc:
        raise ValueError(f"{WINDOW_TOKENS_ENV}={window} {SINK_TOKENS_ENV}={sinks}: {exc}") \
            from None
    return window, sinks
