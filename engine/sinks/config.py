"""W and S inside the engine's own configuration: vLLM's `additional_config`.

vLLM pickles its `VllmConfig` to every process it starts (engine core, workers), so what rides
in `additional_config` reaches each of them with the engine it belongs to: two engines in one
process each carry their own, and nothing is left behind in the process environment. The
plugin's hooks read it from the config vLLM hands them (`policy_in`).

The value is the KVPolicy's wire form, {"window_tokens": W, "sink_tokens": S}, JSON because
vLLM hashes `additional_config` as JSON into its compilation cache key; the start value only:
live changes travel by the engine core's utility call (`engine.sinks.live`) and never touch
the config, so they need no recompilation.

Importing this module loads no vLLM code (the front end builds the engine arguments with it).
"""

from __future__ import annotations

from engine.contract import KVPolicy

KEY = "metronome_sinks"


def additional_config(policy: KVPolicy) -> dict:
    """The `additional_config` entries of an engine started with `policy`: the sinks mode for a
    window (any S ≥ 0, so W and S can move live), nothing for unbounded KV."""
    if policy.kind != "window":
        return {}
    return {KEY: {"window_tokens": policy.window_tokens, "sink_tokens": policy.sink_tokens}}


def policy_in(vllm_config) -> KVPolicy | None:
    """The start policy of the engine `vllm_config` belongs to when it runs sinks + window,
    else None. A malformed entry is a ValueError naming it."""
    extra = getattr(vllm_config, "additional_config", None)
    entry = extra.get(KEY) if isinstance(extra, dict) else None
    if entry is None:
        return None
    try:  # KVPolicy's rule for W and S (its one definition), on the wire form
        return KVPolicy("window", entry["window_tokens"], entry["sink_tokens"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"additional_config[{KEY!r}] = {entry!r}: {exc}; allowed: "
                         "{'window_tokens': W, 'sink_tokens': S} with 0 ≤ S < W") from None
