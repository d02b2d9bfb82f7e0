"""How a run's frames entered the model, for its summary: the input path (token ids, or an
audio-in model's audio encoder), what the load fed, and for an audio-in model what its encoder
did over the run (from the engine's counts at the start and the end of the run)."""

from __future__ import annotations

from engine.contract import Engine
from load_gen import input_feed
from runtime.run_summary import AudioInput


def input_summary(engine: Engine, load_kind: str, before: dict, after: dict) -> dict:
    """The summary's input fields (RunSummary's input_path, input and, for an audio-in model,
    audio). `before`/`after`: `engine.input_stats()` at the run's start
    and end (an engine serves several runs: its counts are since it started)."""
    audio_in = engine.frame_token_ids is not None
    fields = {"input_path": engine.input_path, "input": input_feed(load_kind, audio_in)}
    if not audio_in:
        return fields
    delta = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    encoded, handed = delta.get("encoder_frames", 0), delta.get("frames_submitted", 0)

    def per(value, n):
        return round(value / n, 3) if n else None

    fields["audio"] = AudioInput(
        tokens_in_per_frame=len(engine.frame_token_ids),  # what the processor makes of one
        frames_submitted=handed, encoder_passes=delta.get("encoder_passes", 0),
        encoder_frames=encoded,
        # One encode per frame handed over (a pass may batch several sessions' frames).
        encoder_frames_per_frame=per(encoded, handed),
        audio_tokens_per_frame=per(delta.get("audio_tokens", 0), encoded),
        encoder_ms_per_frame=per(delta.get("encoder_ms", 0.0), encoded))
    return fields
