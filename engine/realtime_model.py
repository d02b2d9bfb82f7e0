"""`asr-tiny`: a tiny random-weight speech model that vLLM's own `/v1/realtime` serves.

vLLM's realtime endpoint serves only architectures implementing its `SupportsRealtime`; the
smallest to build locally is `Qwen3ASRRealtimeGeneration` (vllm/model_executor/models/
qwen3_asr_realtime.py): an audio encoder whose frames replace `<|audio_pad|>` in a ChatML
prompt, and a Qwen3 decoder with M-RoPE. It buffers 5 s of audio per prompt and answers each
segment with up to 64 tokens. Built here from a seed, never downloaded:

- config.json in vLLM's own `qwen3_asr` format (`thinker_config` with `audio_config`,
  `text_config` and the audio token ids), which vLLM reads with its own config class;
- a byte-level BPE tokenizer trained on the seed's corpus (engine/model_cache.py) with the
  ChatML and audio special tokens the prompt and the processor name;
- the processor (Qwen3ASRProcessor with its feature extractor) saved from transformers' classes;
- weights initialised by transformers' Qwen3ASRForConditionalGeneration under `seed`, saved
  under the names vLLM's loader maps (`lm_head.weight` as `thinker.lm_head.weight`).

The result is deterministic: the same seed gives byte-identical files (tests/engine/
test_realtime_model.py hashes two builds).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.model_cache import building, synthetic_corpus

logger = logging.getLogger(__name__)

ASR_TINY_VERSION = 1  # bump when the recipe changes, so caches rebuild
# The tokens the realtime prompt spells out ("<|im_start|>user\n<|audio_start|><|audio_pad|>
# <|audio_end|><|im_end|>\n<|im_start|>assistant\n") and the end of text; ids 0..6 in order.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>",
                  "<|audio_pad|>", "<|audio_end|>", "<asr_text>")
MEL_BINS = 128  # Qwen3ASRFeatureExtractor's default; the encoder's convolutions are sized by it
FILES = ("config.json", "generation_config.json", "model.safetensors", "processor_config.json",
         "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class AsrTinyShape:
    """The model's sizes: small enough to build in seconds and step in milliseconds on a CPU."""

    vocab_tokens: int = 2048
    text_hidden: int = 128
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_head_dim: int = 32
    text_ffn: int = 384
    audio_hidden: int = 64
    audio_layers: int = 2
    audio_heads: int = 4
    audio_ffn: int = 128
    audio_conv_channels: int = 32
    max_positions: int = 4096

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not 1 <= value <= 65_536:
                raise ValueError(f"{name} {value} must be in [1, 65536]")
        if self.text_head_dim % 4:
            # M-RoPE splits head_dim / 2 rotary pairs into three sections.
            raise ValueError(f"text_head_dim {self.text_head_dim} must be a multiple of 4")
        if self.text_heads % self.text_kv_heads:
            raise ValueError(f"text_heads {self.text_heads} must be a multiple of text_kv_heads "
                             f"{self.text_kv_heads}")
        if self.audio_hidden % self.audio_heads:
            raise ValueError(f"audio_hidden {self.audio_hidden} must be a multiple of "
                             f"audio_heads {self.audio_heads}")

    def mrope_section(self) -> list[int]:
        """Temporal, height, width shares of the rotary pairs (summing to head_dim / 2), in the
        proportions of Qwen3-ASR's own [24, 20, 20]."""
        pairs = self.text_head_dim // 2
        side = pairs * 5 // 16
        return [pairs - 2 * side, side, side]


def asr_tiny_dirname(seed: int) -> str:
    return f"asr-tiny-v{ASR_TINY_VERSION}-seed{seed}"


def is_built(folder: Path) -> bool:
    return all((folder / name).is_file() for name in FILES)


def build_asr_tiny(seed: int, out: Path, shape: AsrTinyShape = AsrTinyShape()) -> Path:
    """Build (once) the model for `seed` into `out` and return it."""
    if is_built(out):
        return out
    logger.info("building asr-tiny (seed %d) in %s", seed, out)
    with building(out, "asr-tiny") as tmp:
        tokenizer = _save_tokenizer_and_processor(seed, shape, tmp)
        ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
        vocab = len(tokenizer)
        _save_weights(seed, shape, vocab, ids, tmp)
        (tmp / "config.json").write_text(_dump(vllm_config(shape, vocab, ids)))
        (tmp / "generation_config.json").write_text(_dump({
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"], "do_sample": False}))
    return out


def _dump(obj: dict) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def _save_tokenizer_and_processor(seed: int, shape: AsrTinyShape, folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen3_asr import Qwen3ASRFeatureExtractor, Qwen3ASRProcessor

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_tokens, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
    # The processor reads the audio tokens from these tokenizer attributes.
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens={"audio_token": "<|audio_pad|>",
                              "audio_bos_token": "<|audio_start|>",
                              "audio_eos_token": "<|audio_end|>"})
    processor = Qwen3ASRProcessor(
        feature_extractor=Qwen3ASRFeatureExtractor(feature_size=MEL_BINS), tokenizer=fast)
    processor.save_pretrained(folder)
    return fast


def _text_config(shape: AsrTinyShape, vocab: int, ids: dict) -> dict:
    return {
        "model_type": "qwen3", "vocab_size": vocab, "hidden_size": shape.text_hidden,
        "intermediate_size": shape.text_ffn, "num_hidden_layers": shape.text_layers,
        "num_attention_heads": shape.text_heads, "num_key_value_heads": shape.text_kv_heads,
        "head_dim": shape.text_head_dim, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": shape.max_positions, "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
        "rope_theta": 1_000_000.0, "attention_bias": False}


def _audio_config(shape: AsrTinyShape) -> dict:
    return {
        "num_mel_bins": MEL_BINS, "d_model": shape.audio_hidden,
        "encoder_layers": shape.audio_layers, "encoder_attention_heads": shape.audio_heads,
        "encoder_ffn_dim": shape.audio_ffn, "downsample_hidden_size": shape.audio_conv_channels,
        "output_dim": shape.text_hidden, "activation_function": "gelu",
        # 100 mel frames (1 s) per convolution chunk, attention over 8 chunks: Qwen3-ASR's.
        "n_window": 50, "n_window_infer": 800}


def vllm_config(shape: AsrTinyShape, vocab: int, ids: dict) -> dict:
    """config.json as vLLM's Qwen3ASRConfig reads it (vllm/transformers_utils/configs/
    qwen3_asr.py): everything under `thinker_config`."""
    text = _text_config(shape, vocab, ids)
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": shape.mrope_section(),
                            "mrope_interleaved": True, "interleaved": True}
    audio = {**_audio_config(shape), "conv_chunksize": 500, "max_source_positions": 1500}
    return {
        "architectures": ["Qwen3ASRRealtimeGeneration"], "model_type": "qwen3_asr",
        "torch_dtype": "float32", "support_languages": ["English"],
        "thinker_config": {
            "model_type": "qwen3_asr_thinker", "audio_config": audio, "text_config": text,
            "audio_token_id": ids["<|audio_pad|>"],
            "audio_start_token_id": ids["<|audio_start|>"],
            "user_token_id": ids["<|im_start|>"]}}


def _save_weights(seed: int, shape: AsrTinyShape, vocab: int, ids: dict, folder: Path) -> None:
    """Random weights from transformers' class of the same architecture (its parameter names
    are the ones vLLM's Qwen3-ASR loader maps), initialised under `seed`."""
    import torch
    from safetensors.torch import save_file
    from transformers.models.qwen3_asr import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

    config = Qwen3ASRConfig(
        audio_config={"model_type": "qwen3_asr_encoder", **_audio_config(shape)},
        text_config=_text_config(shape, vocab, ids), audio_token_id=ids["<|audio_pad|>"],
        pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    with torch.no_grad():
        model = Qwen3ASRForConditionalGeneration(config).float().eval()
    tensors = {}
    for name, tensor in model.state_dict().items():
        # vLLM maps `thinker.lm_head.` to its head; a bare `lm_head.` it would not load.
        key = "thinker.lm_head.weight" if name == "lm_head.weight" else name
        tensors[key] = tensor.detach().contiguous().clone()
    save_file(dict(sorted(tensors.items())), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
