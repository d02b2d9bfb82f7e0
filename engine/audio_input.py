"""What an audio-in model takes per frame, read from its own folder: the chunk each frame
becomes, the tokens its processor makes of it, and the vLLM settings that size the encoder's
window to one frame.

A frame is one streaming chunk: `<|audio_bos|><|AUDIO|><|audio_eos|>` with the frame's audio as
`multi_modal_data`. vLLM's input processor (in this process) runs the model's feature extractor
on it and expands `<|AUDIO|>` to the encoder's output length; the engine core schedules the
encoder for it and the LM computes only the chunk's new tokens (vLLM's streaming input,
`Scheduler._update_request_as_session`). `tokens_in` is what the processor makes of one frame:
`frame_ids` is taken from the model's own processor at start-up, never chosen.

The encoder window (engine/audio_plugin.py says why): the processor pads a frame to the frame's
own length (`max_length`), and the encoder's `max_source_positions` is half its mel frames, so
the encoder reads one frame of mel, not 30 s.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from engine.audio_plugin import config_entry

logger = logging.getLogger(__name__)

AUDIO_ENCODER = "audio encoder"  # Engine.input_path of an audio-in model
TOKEN_IDS = "token ids"  # Engine.input_path of a text model (the loads' stand-in ids)
# Architectures whose frames go through their encoder here (the plugin patches this one).
AUDIO_ARCHITECTURES = ("Qwen2AudioForConditionalGeneration",)


# Audio-in architectures not driven yet: served as text they would get ids they never saw.
UNDRIVEN_AUDIO = ("Qwen2_5OmniModel", "Qwen2_5OmniForConditionalGeneration",
                  "Qwen2_5OmniThinkerForConditionalGeneration",
                  "Qwen3OmniMoeForConditionalGeneration", "VoxtralForConditionalGeneration",
                  "VoxtralRealtimeGeneration", "Qwen3ASRForConditionalGeneration")


def _architectures(model_path: Path) -> list[str]:
    config = json.loads((Path(model_path) / "config.json").read_text())
    return list(config.get("architectures") or ())


def is_audio_model(model_path: Path) -> bool:
    return any(a in AUDIO_ARCHITECTURES for a in _architectures(model_path))


def undriven_refusal(model_path: Path) -> str | None:
    """Why this audio-in model cannot be served here (one line), or None."""
    found = [a for a in _architectures(model_path) if a in UNDRIVEN_AUDIO]
    if not found:
        return None
    return (f"model {model_path} is an audio-in {found[0]}, whose frames Metronome does not yet "
            f"send through its encoder (driven: {', '.join(AUDIO_ARCHITECTURES)}); served as "
            "a text model it would read ids it never learnt")


@dataclass(frozen=True)
class AudioInput:
    """One audio-in model at one frame period."""

    sample_rate_hz: int
    frame_samples: int  # samples per frame at the model rate
    mel_frames: int  # the encoder window: mel frames per frame
    chunk_ids: tuple[int, ...]  # the chunk's prompt before expansion: bos, AUDIO, eos
    frame_ids: tuple[int, ...]  # what the processor makes of a frame: bos, AUDIO × k, eos
    audio_token_id: int

    def __post_init__(self) -> None:
        if self.mel_frames < 2 or self.mel_frames % 2:
            raise ValueError(f"a frame of {self.frame_samples} samples is {self.mel_frames} mel "
                             "frames; the encoder needs an even number ≥ 2 (its two "
                             "convolutions halve it): allowed frame periods are multiples of "
                             "20 ms")
        if self.frame_ids.count(self.audio_token_id) < 1:
            raise ValueError(f"a frame of {self.frame_samples} samples makes no audio token "
                             f"(ids {list(self.frame_ids)}); allowed: frames ≥ 40 ms")

    @property
    def audio_tokens(self) -> int:
        """Audio tokens per frame (the encoder's output positions)."""
        return self.frame_ids.count(self.audio_token_id)

    def engine_args(self) -> dict:
        """vLLM arguments that make the model's encoder window one frame, and keep frames
        apart: no processor cache (every frame's audio is new), and each chunk names its own
        item (`chunk`), so two sessions' equal audio is never one encoder output. The window
        also rides in `additional_config`, where engine/audio_plugin.py reads it in the worker."""
        return {"hf_overrides": {"audio_config": {"max_source_positions": self.mel_frames // 2}},
                "mm_processor_kwargs": {"max_length": self.frame_samples},
                "mm_processor_cache_gb": 0,
                "additional_config": config_entry(self.mel_frames)}

    def chunk(self, audios, names):
        """The prompt of one chunk: `audios` (one array per frame, float32 mono at the model
        rate) each under its unique name. A rollover prompt carries several frames."""
        for audio in audios:
            if audio.shape != (self.frame_samples,):
                raise ValueError(
                    f"frame audio of shape {audio.shape} is not ({self.frame_samples},) samples "
                    f"at {self.sample_rate_hz} Hz: this engine's encoder window is one "
                    f"{self.frame_samples / self.sample_rate_hz * 1e3:g} ms frame; start an "
                    "engine for the run's frame period")
        # vLLM's TokensPrompt (a TypedDict): a plain dict, so this module loads no vLLM.
        return {"prompt_token_ids": list(self.chunk_ids) * len(audios),
                "multi_modal_data": {"audio": [(a, self.sample_rate_hz) for a in audios]},
                "multi_modal_uuids": {"audio": list(names)}}


def audio_input(model_path: Path, frame_ms: float) -> AudioInput:
    """The model's own processor, asked what one frame of `frame_ms` becomes."""
    import numpy as np
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_path))
    features = processor.feature_extractor
    rate = int(features.sampling_rate)
    samples = round(rate * frame_ms / 1e3)
    tokens = [processor.audio_bos_token, processor.audio_token, processor.audio_eos_token]
    text = "".join(tokens)
    out = processor(text=text, audio=np.zeros(samples, np.float32), sampling_rate=rate,
                    max_length=samples, return_tensors="np")
    chunk_ids = tuple(processor.tokenizer.convert_tokens_to_ids(tokens))
    info = AudioInput(rate, samples, int(out["input_features"].shape[-1]), chunk_ids,
                      tuple(int(i) for i in out["input_ids"][0]),
                      int(processor.audio_token_id))
    logger.info("audio input: %g ms frame = %d samples, %d mel frames, %d audio tokens",
                frame_ms, samples, info.mel_frames, info.audio_tokens)
    return info


def entry_point_refusal() -> str | None:
    """Why vLLM's processes would not load the audio plugin (one line), or None."""
    from importlib.metadata import entry_points

    from engine.audio_plugin import ENTRY_POINT

    if any(ep.name == ENTRY_POINT for ep in entry_points(group="vllm.general_plugins")):
        return None
    return (f"the audio plugin's vllm.general_plugins entry point {ENTRY_POINT!r} is not "
            "installed, so vLLM's processes would keep the 30 s encoder window: reinstall "
            "Metronome (bash scripts/setup.sh, or pip install -e .)")
