"""`audio-tiny`: a random-weight Qwen2-Audio built locally from a seed (no model hub).

The architecture is vLLM's `Qwen2AudioForConditionalGeneration`: a Whisper-style audio encoder
(two conv layers, `encoder_layers` transformer layers, a projector) whose output embeddings take
the places of `<|AUDIO|>` tokens in a Qwen2 language model. Sizes are tiny (hidden 128, two LM
layers, two encoder layers) so a CPU serves it; the layout is a real checkpoint's, so a real
Qwen2-Audio folder goes the same way (`--model PATH`).

What the folder holds, all built here:
- a byte-level BPE tokenizer trained on the seed's synthetic corpus (engine/models.py), with the
  architecture's special tokens and a ChatML chat template;
- a `WhisperFeatureExtractor` built from arguments (16 kHz, 128 mel bins, the stock 30 s window:
  the engine sizes the window to its frame per run, engine/audio_input.py);
- weights from `torch.manual_seed(seed)`, written by safetensors with sorted names, so two builds
  are byte-identical.

The weight-name trap: transformers 5.x's `save_pretrained` writes the LM under
`language_model.model.model.*`, a name vLLM's loader cannot place (`There is no module or
parameter named 'model' in Qwen2Model`). The builder writes the state dict itself under the
checkpoint names vLLM loads (`language_model.model.*`, `language_model.lm_head.*`), and
`checkpoint_names` is the one place that maps them.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)

AUDIO_TINY_VERSION = 1  # bump when the recipe changes, so caches rebuild
SAMPLE_RATE_HZ = 16_000
MEL_BINS = 128
HOP_SAMPLES = 160  # 10 ms of mel per frame at 16 kHz, Whisper's hop
AUDIO_TOKENS = ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>") + AUDIO_TOKENS
WEIGHTS = "model.safetensors"
# Written for this recipe, not copied: one ChatML turn per message; an audio item is the
# architecture's placeholder triple, a text item its text.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Renames, first match wins: transformers 5.x's in-memory names → the checkpoint names vLLM's
# Qwen2AudioForConditionalGeneration loads.
_RENAMES = (("language_model.model.model.", "language_model.model."),
            ("language_model.model.", "language_model.model."),
            ("model.language_model.", "language_model.model."),
            ("model.audio_tower.", "audio_tower."),
            ("model.multi_modal_projector.", "multi_modal_projector."),
            ("lm_head.", "language_model.lm_head."))


def checkpoint_names(names) -> dict[str, str]:
    """In-memory parameter name → the name a checkpoint must use for vLLM to load it.
    Raises ValueError naming a parameter that no rule places (a new transformers layout)."""
    out = {}
    for name in names:
        if name.startswith(("audio_tower.", "multi_modal_projector.", "language_model.lm_head.")):
            out[name] = name
            continue
        for old, new in _RENAMES:
            if name.startswith(old):
                out[name] = new + name[len(old):]
                break
        else:
            raise ValueError(f"parameter {name!r} has no checkpoint name; known prefixes: "
                             f"{', '.join(o for o, _ in _RENAMES)}")
    if len(set(out.values())) != len(out):
        raise ValueError("two parameters map to one checkpoint name: "
                         f"{sorted(out.values())}")
    return out


def build_audio_tiny(seed: int = 0, out_dir: Path | None = None) -> Path:
    """Build (once) the tiny Qwen2-Audio model for `seed` and return its folder."""
    from engine.model_cache import building, cache_root

    out = out_dir or cache_root() / f"audio-tiny-v{AUDIO_TINY_VERSION}-seed{seed}"
    if (out / "config.json").is_file() and (out / WEIGHTS).is_file():
        return out
    logger.info("building audio-tiny (seed %d) in %s", seed, out)
    with building(out, "audio-tiny") as tmp:
        tokenizer = _tokenizer(seed)
        _processor(tokenizer).save_pretrained(tmp)
        _write_model(tokenizer, seed, tmp)
    return out


def _tokenizer(seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from engine.model_cache import synthetic_corpus

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)
    # The processor finds the audio tokens by these names (Qwen2AudioProcessor).
    fast.audio_token, fast.audio_bos_token, fast.audio_eos_token = AUDIO_TOKENS[1], \
        AUDIO_TOKENS[0], AUDIO_TOKENS[2]
    return fast


def _processor(tokenizer):
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    # The stock 30 s window (Qwen2-Audio's): the engine narrows it to one frame per run.
    features = WhisperFeatureExtractor(feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE_HZ,
                                       hop_length=HOP_SAMPLES, chunk_length=30, n_fft=400,
                                       padding_value=0.0, return_attention_mask=True)
    return Qwen2AudioProcessor(feature_extractor=features, tokenizer=tokenizer,
                               chat_template=CHAT_TEMPLATE)


def _write_model(tokenizer, seed: int, folder: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen2AudioConfig(
        audio_config=dict(d_model=128, encoder_layers=2, encoder_attention_heads=2,
                          encoder_ffn_dim=256, num_mel_bins=MEL_BINS,
                          max_source_positions=1500),  # 30 s of mel / 2, the stock window
        text_config=dict(model_type="qwen2", vocab_size=len(tokenizer), hidden_size=128,
                         intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=10000.0, tie_word_embeddings=False,
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"]),
        audio_token_index=ids["<|AUDIO|>"], torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2AudioForConditionalGeneration(config).eval()
    state = model.state_dict()
    names = checkpoint_names(state)
    # contiguous copies: safetensors refuses views, and a fresh tensor per name never shares
    save_file({names[k]: v.detach().contiguous().clone() for k, v in sorted(state.items())},
              str(folder / WEIGHTS), metadata={"format": "pt"})
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    config.save_pretrained(folder)
