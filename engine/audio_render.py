"""A frame's render in vLLM's serving process without the HF processor's text side.

vLLM renders every streaming chunk inline on its event loop (`process_inputs`, before the chunk
goes to the engine core), so a tick's chunks reach the core one render apart; for an audio chunk
that render cost 3.2–3.6 ms against 0.3 ms for a text chunk of the same length
(docs/benchmarks/audio_model.md §9). For a token-id prompt vLLM calls the model's HF processor
on *dummy* text plus the audio (`_apply_hf_processor_main`) and keeps only the processor's audio
fields (`input_features`, `feature_attention_mask`): the text side (tokenizer, the processor's
kwargs merge, its audio-token expansion) is computed and thrown away.

`install()` wraps `Qwen2AudioMultiModalProcessor._apply_hf_processor_main` in this process: a
call whose items are all raw frame-sized audio arrays (exactly the window the engine set,
at its rate; no processor kwargs) is answered from the feature extractor alone, as the HF
processor calls it (`return_attention_mask`, `padding="max_length"`), with the processor's
output field renamed and cast as vLLM casts it. Any other call goes to vLLM's own path. The
first frame-sized call of each processor runs both and compares the fields vLLM keeps; on any
difference the wrapper logs it and leaves that processor on vLLM's path for good.

Installed only where the frame-sized encoder window runs (vLLM `engine.sinks.support.
TESTED_VLLM`; engine/vllm_backend.py refuses an audio engine on another version first).
"""

from __future__ import annotations

import functools
import logging

import numpy as np

logger = logging.getLogger(__name__)

_MARK = "_metronome_frame_render"
_OFF = "_metronome_frame_render_off"
_EXTRACTOR = "_metronome_feature_extractor"
FIELDS = ("input_features", "feature_attention_mask")  # what vLLM keeps of the processor's output


def _extractor(processor):
    """The processor's feature extractor, looked up once (vLLM's lookup merges the processor's
    kwargs on every call)."""
    found = processor.__dict__.get(_EXTRACTOR)
    if found is None:
        found = processor.__dict__[_EXTRACTOR] = processor.info.get_feature_extractor()
    return found


def _frame_audio(processor, mm_items, hf_kwargs) -> tuple[list, int] | None:
    """The call's audio arrays and the window (samples) when the frame path applies, else
    None. The window is the engine's `mm_processor_kwargs` `max_length` (engine/audio_input.py)
    or the extractor's own."""
    if hf_kwargs or set(mm_items) != {"audio"}:
        return None
    merged = processor.info.ctx.get_merged_mm_kwargs(hf_kwargs)
    if set(merged) - {"max_length"}:
        return None
    items = mm_items["audio"]
    if items.get_passthrough_data():  # embeddings, not audio
        return None
    audios = items.get_processor_data().get("audios")
    window = merged.get("max_length", _extractor(processor).n_samples)
    if not audios or not all(isinstance(a, np.ndarray) and a.shape == (window,)
                             and a.dtype.kind == "f" for a in audios):
        return None
    return list(audios), window


def frame_fields(processor, audios: list, window: int):
    """The processor's audio fields for `audios` of `window` samples each, from the feature
    extractor alone, cast as vLLM casts the HF processor's output."""
    from transformers import BatchFeature

    extractor = _extractor(processor)
    out = extractor(audios, sampling_rate=extractor.sampling_rate, return_attention_mask=True,
                    padding="max_length", max_length=window, return_tensors="pt")
    dtype = processor.info.ctx.model_config.dtype
    return BatchFeature({"input_features": out["input_features"].to(dtype),
                         "feature_attention_mask": out["attention_mask"]})


def _same(fast, stock) -> str | None:
    """Where `fast` differs from vLLM's own output on the fields vLLM keeps, or None."""
    for key in FIELDS:
        a, b = fast.get(key), stock.get(key)
        if a is None or b is None:
            return f"{key}: present {a is not None} vs {b is not None}"
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{key}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
        # Within float32 rounding, not bit-equal: should one path's extractor call fall back to
        # the extractor's own torch STFT (engine/audio_features.py), the two differ in rounding.
        if not np.allclose(a.float().numpy(), b.float().numpy(), atol=1e-4):
            return f"{key}: values differ"
    return None


def install() -> None:
    """Wrap Qwen2AudioMultiModalProcessor._apply_hf_processor_main (idempotent)."""
    from vllm.model_executor.models.qwen2_audio import Qwen2AudioMultiModalProcessor

    original = Qwen2AudioMultiModalProcessor._apply_hf_processor_main
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def main(self, mm_items, hf_kwargs):
        state = self.__dict__.get(_MARK)  # None: unchecked; True: checked; False: stock only
        off = state is False or self.__dict__.get(_OFF, False)
        frame = None if off else _frame_audio(self, mm_items, hf_kwargs)
        if frame is None:
            return original(self, mm_items, hf_kwargs)
        audios, window = frame
        fast = self._finalize_hf_mm_data({"audio": audios}, hf_kwargs, {},
                                         frame_fields(self, audios, window))
        if state is None:
            stock = original(self, mm_items, hf_kwargs)
            diff = _same(fast, stock)
            self.__dict__[_MARK] = diff is None
            if diff is not None:
                logger.warning("frame render differs from vLLM's (%s): vLLM's path kept", diff)
                return stock
            logger.info("frame render checked against vLLM's on its first frame: equal")
        return fast

    setattr(main, _MARK, True)
    Qwen2AudioMultiModalProcessor._apply_hf_processor_main = main


def use_frame_path(processor, on: bool) -> None:
    """Let `processor` take the frame path (where its check passed, or on its next frame's
    check) or keep it on vLLM's own (benchmarks time the two side by side). The check's
    outcome stands either way: it runs once per processor."""
    processor.__dict__[_OFF] = not on


def frame_path_checked(processor) -> bool | None:
    """True: the frame path matched vLLM's on its check and serves frames; False: it did not,
    and vLLM's path serves them for good; None: not checked yet (no frame-sized call)."""
    return processor.__dict__.get(_MARK)
