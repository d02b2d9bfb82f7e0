"""The audio-in model against the text stand-in (issue 36): every figure
docs/benchmarks/audio_model.md quotes is printed here.

Models (both built locally from seed 0):
- audio: `audio-tiny` (Qwen2-Audio: Whisper-style encoder + Qwen2 LM), frames through its
  processor and encoder, the encoder window one frame (engine/audio_plugin.py);
- text: the same Qwen2 LM alone (audio-tiny's language-model weights as a Qwen2ForCausalLM),
  fed the WAV load's stand-in ids at the same tokens per frame (4): the comparison isolates
  what the audio path adds, not a different LM.

Sections:
1. per chunk, one session, frames back to back (no frame period): the stock 30 s encoder window
   (every 80 ms frame padded to 3000 mel frames), the frame-sized window, and text; the feature
   extraction alone (the model's processor on one frame, in this process);
2. `Runner` runs with a WAV load (espeak-ng speech) at 1, 4 and 8 sessions, 80 ms frames,
   windowed, both engines up and taking turns (audio, text, text, audio): frame p50/p95, silent
   share, the encoder's ms per frame and share of the p50;
3. the CLI: `metronome run --engine vllm --model audio-tiny --load wav` windowed and unbounded
   with a small pool, their summaries' input and KV fields.

    PYTHONPATH=. .venv/bin/python benchmarks/audio_model.py [--duration 10] [--skip-cli]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SESSIONS = (1, 4, 8)
TOKENS_OUT = 4
SPEECH = {"a_fox.wav": "The quick brown fox jumps over the lazy dog.",
          "b_beat.wav": "Metronome keeps the beat while the model listens and answers.",
          "c_hello.wav": "Hello there, how are you today?"}


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def machine() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                  if line.startswith("Model name")), "unknown CPU")
    import vllm

    return (f"{model}, {len(os.sched_getaffinity(0))} cores, vllm {vllm.__version__}, "
            f"{dt.datetime.now():%Y-%m-%d %H:%M}")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def speech_dir(root: Path) -> Path:
    folder = root / "speech"
    folder.mkdir(exist_ok=True)
    for name, text in SPEECH.items():
        subprocess.run(["espeak-ng", "-w", str(folder / name), text], check=True)
    return folder


def lm_only(audio_folder: Path) -> Path:
    """audio-tiny's language model alone, as a Qwen2ForCausalLM folder (built once)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from engine.model_cache import cache_root

    out = cache_root() / f"{audio_folder.name}-lm"
    if (out / "model.safetensors").is_file():
        return out
    tmp = Path(tempfile.mkdtemp(dir=cache_root()))
    tensors = {}
    with safe_open(str(audio_folder / "model.safetensors"), "pt") as f:
        for name in f.keys():
            if name.startswith("language_model."):
                tensors[name[len("language_model."):]] = f.get_tensor(name)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((audio_folder / "config.json").read_text())["text_config"]
    config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", torch_dtype="float32")
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (audio_folder / name).is_file():
            shutil.copy(audio_folder / name, tmp / name)
    tmp.rename(out)
    return out


def frames_of(wav_dir: Path, n: int):
    from load_gen.wav import load_folder

    clip = load_folder(str(wav_dir), 16_000)[0].samples
    return [clip[i * 1280:(i + 1) * 1280] for i in range(n)]


def chunk_done(engine, session_id: int, audio, tokens_in_ids):
    """One chunk of a session, waited for: the frame's audio on an audio-in model, else the
    ids. Returns its handle."""
    if engine.frame_token_ids is not None:
        handle = engine.submit(session_id, list(engine.frame_token_ids), TOKENS_OUT,
                               audio=[audio])
    else:
        handle = engine.submit(session_id, tokens_in_ids, TOKENS_OUT)
    handle.wait(60)
    return handle


def back_to_back(engine, audio_frames, tokens_in_ids) -> list[float]:
    """One session, each frame submitted when the previous one is done: ms per chunk."""
    engine.open(77)
    out = []
    try:
        for audio in audio_frames:
            handle = chunk_done(engine, 77, audio, tokens_in_ids)
            out.append((handle.t_done - handle.t_submit) * 1e3)
    finally:
        engine.close(77)
    return out[5:]  # the first chunks warm caches up


def stock_window(model_path: Path, audio_frames) -> tuple[list[float], float]:
    """The bundled model in its stock 30 s window (no frame-sized config): ms per chunk and the
    encoder's ms per frame. The plugin only counts (its schema at the stock 3000)."""
    import asyncio

    from engine.audio_plugin import config_entry

    async def run():
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.engine.protocol import StreamingInput
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(
            model=str(model_path), dtype="float32", block_size=32, num_gpu_blocks_override=64,
            max_model_len=1024, enable_prefix_caching=False, enforce_eager=True,
            gpu_memory_utilization=0.3, mm_processor_cache_gb=0,
            additional_config=config_entry(3000)))  # the plugin counts, at the stock shape
        params = SamplingParams(max_tokens=TOKENS_OUT, min_tokens=TOKENS_OUT, ignore_eos=True,
                                temperature=0.0, output_kind=RequestOutputKind.DELTA)
        times, done = [], asyncio.Queue()

        async def chunks():
            for i, audio in enumerate(audio_frames):
                times.append(time.perf_counter())
                yield StreamingInput(prompt={
                    "prompt_token_ids": [3, 4, 5],
                    "multi_modal_data": {"audio": [(audio, 16_000)]},
                    "multi_modal_uuids": {"audio": [f"stock-{i}"]}}, sampling_params=params)
                await done.get()

        lat = []
        async for out in llm.generate(chunks(), params, "stock"):
            if out.outputs and out.outputs[0].finish_reason is not None:
                lat.append((time.perf_counter() - times[-1]) * 1e3)
                done.put_nowait(None)
        counts = await llm.engine_core.call_utility_async("metronome_audio_stats")
        llm.shutdown()
        return lat[5:], counts["encoder_ms"] / max(1, counts["frames"]), counts

    lat, enc, counts = asyncio.run(run())
    print(f"  stock window: mel frames per encoder item {counts['mel_frames'] // counts['frames']}"
          f", audio tokens per frame {counts['audio_tokens'] / counts['frames']:.1f}")
    return lat, enc


def feature_ms(model_path: Path, audio_frames, max_length: int | None,
               frame_path: bool = False) -> float:
    """ms per frame of the model's extractor as vLLM's processor calls it; `frame_path`: the
    engine's frame-sized log-mel (engine/audio_features.py) instead."""
    from transformers import AutoProcessor

    from engine.audio_features import frame_log_mel

    fe = AutoProcessor.from_pretrained(str(model_path)).feature_extractor
    kwargs = {"max_length": max_length} if max_length else {}
    start = time.perf_counter()
    for _ in range(3):
        for audio in audio_frames:
            if frame_path:
                frame_log_mel(audio[None, :], fe.mel_filters, fe.n_fft, fe.hop_length)
            else:
                original = getattr(type(fe).__call__, "__wrapped__", type(fe).__call__)
                original(fe, audio, sampling_rate=16_000, padding="max_length",
                         return_attention_mask=True, **kwargs)
    return (time.perf_counter() - start) * 1e3 / (3 * len(audio_frames))


def features(audio_path: Path, frames) -> None:
    print(f"  feature extraction per frame: stock 30 s {feature_ms(audio_path, frames, None):.2f}"
          f" ms, frame-sized {feature_ms(audio_path, frames, 1280):.2f} ms, the engine's frame "
          f"path {feature_ms(audio_path, frames, 1280, frame_path=True):.3f} ms "
          f"(torch threads {__import__('torch').get_num_threads()})")


def run(engine, model: str, n: int, wav_dir: Path, duration: float, store,
        frame_ms: float = 80.0, tokens_in: int = 4):
    """A RunSummary of `n` sessions of WAV load, window W=256 S=32 (audio_batching.py too)."""
    from runtime import RunConfig, Runner

    cfg = RunConfig(engine="vllm", model=model, load="wav", wav_dir=str(wav_dir), sessions=n,
                    duration_s=duration, policy="window", window=256, sinks=32,
                    pool_blocks=128, frame_ms=frame_ms, tokens_in=tokens_in,
                    tokens_out=TOKENS_OUT, open_budget=max(8, n))
    return Runner(cfg, engine, store).run()


def show(p, censored):
    return "> 80 (censored)" if censored or p is None else f"{p:.1f}"


def cli_runs(wav_dir: Path, duration: float, root: Path) -> None:
    base = [sys.executable, "-m", "cli.main", "run", "--json", "--engine", "vllm", "--model",
            "audio-tiny", "--load", "wav", "--wav-dir", str(wav_dir), "--duration",
            f"{duration:g}", "--db", str(root / "cli.duckdb")]
    for name, extra in (("windowed", ["--policy", "window", "--window", "128", "--sinks", "32",
                                      "--pool-blocks", "64", "--sessions", "4"]),
                        ("unbounded", ["--policy", "unbounded", "--pool-blocks", "24",
                                       "--sessions", "6"])):
        cmd = base + extra
        print(f"\n$ metronome {' '.join(cmd[3:])}")
        done = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path.cwd())})
        s = json.loads(done.stdout.strip().splitlines()[-1])
        keys = ("status", "input_path", "input", "tokens_in_per_frame", "frames_submitted",
                "encoder_passes", "encoder_frames", "encoder_frames_per_frame",
                "audio_tokens_per_frame", "encoder_ms_per_frame", "frames", "silent_rate",
                "silent_memory_frames", "p50_ms", "p95_ms", "max_occupancy",
                "max_resident_blocks", "stalled", "stall_at_s", "tsat_pred_s")
        for key in keys:
            print(f"  {key:>26}: {s.get(key)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--skip-cli", action="store_true")
    parser.add_argument("--features-only", action="store_true",
                        help="section 1's feature extraction lines only (no engine)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the figures
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from engine import EngineConfig, KVPolicy, create_engine
    from engine.audio_model import build_audio_tiny
    from store import Store

    print(f"machine: {machine()}")
    print(f"load average at start: {load_average()}")
    root = Path(tempfile.mkdtemp(prefix="audio-bench-"))
    wav_dir = speech_dir(root)
    audio_path = build_audio_tiny(0)
    text_path = lm_only(audio_path)
    frames = frames_of(wav_dir, 30)
    store = Store(str(root / "bench.duckdb"))

    print("\n1. per chunk, one session, back to back (ms; p50 / p95 over 25 chunks)")
    features(audio_path, frames)
    if args.features_only:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
        return
    stock, stock_enc = stock_window(audio_path, frames)
    print(f"  stock 30 s window: p50 {statistics.median(stock):.1f} p95 {pct(stock, .95):.1f},"
          f" encoder {stock_enc:.1f} ms/frame")
    policy = KVPolicy("window", 256, 32)
    engines = {label: create_engine("vllm", EngineConfig(model=str(path), pool_blocks=128,
                                                         policy=policy, frame_ms=80.0))
               for label, path in (("audio", audio_path), ("text", text_path))}
    # Both engines stay up and take turns, audio-text-text-audio, so a neighbour's load on the
    # shared cores falls on both alike.
    order = ("audio", "text", "text", "audio")
    try:
        chunk = {"audio": [], "text": []}
        before = engines["audio"].input_stats()
        for label in order:
            ids = [engines[label].vocab_size - 1 - i for i in range(4)]
            chunk[label] += back_to_back(engines[label], frames, ids)
        after = engines["audio"].input_stats()
        enc = (after["encoder_ms"] - before["encoder_ms"]) / \
            max(1, after["encoder_frames"] - before["encoder_frames"])
        for label in ("audio", "text"):
            note = f" (frame window), encoder {enc:.1f} ms/frame" if label == "audio" \
                else " (4 ids)"
            print(f"  {label}{note}: p50 {statistics.median(chunk[label]):.1f} "
                  f"p95 {pct(chunk[label], .95):.1f}")
        print(f"  audio/text p50 per chunk: "
              f"{statistics.median(chunk['audio']) / statistics.median(chunk['text']):.2f}x; "
              f"stock/frame window: {statistics.median(stock) / statistics.median(chunk['audio']):.1f}x")
        print(f"  load average: {load_average()}")

        print(f"\n2. WAV load, 80 ms frames, window W=256 S=32, {TOKENS_OUT} tokens out, "
              f"{args.duration:g} s a run, two runs a model in turns A-T-T-A (frame latency ms)")
        print("  sessions | model | p50 p95 silent, run 1 ; run 2 | encoder ms/frame, share of "
              "the p50 | load average")
        for n in SESSIONS:
            results = {"audio": [], "text": []}
            for label in order:
                results[label].append(run(engines[label], str(engines[label].model_path),
                                          n, wav_dir, args.duration, store))
            for label in ("audio", "text"):
                cells = " ; ".join(
                    f"{show(s.p50_ms, s.p50_censored)} "
                    f"{show(s.p95_ms, s.p95_censored)} {s.silent_rate:.3f}"
                    for s in results[label])
                enc = ""
                if label == "audio":
                    per = [s.audio.encoder_ms_per_frame for s in results[label]]
                    shares = [f"{e / s.p50_ms:.0%}" if e and s.p50_ms else "-"
                              for e, s in zip(per, results[label])]
                    enc = f" | {per[0]}, {shares[0]} ; {per[1]}, {shares[1]}"
                print(f"  {n:>8} | {label:>5} | {cells}{enc}")
            p50 = {label: [s.p50_ms for s in results[label]] for label in results}
            if all(v is not None for values in p50.values() for v in values):
                ratio = statistics.mean(p50["audio"]) / statistics.mean(p50["text"])
                print(f"           audio/text mean p50: {ratio:.2f}x")
            a = results["audio"][0]
            print(f"           audio: {a.input}; encoder frames per frame "
                  f"{a.audio.encoder_frames_per_frame}, audio tokens per frame "
                  f"{a.audio.audio_tokens_per_frame}; text: {results['text'][0].input}; "
                  f"load average {load_average()}")
    finally:
        for engine in engines.values():
            engine.shutdown()
    store.close()
    print(f"load average after the runs: {load_average()}")
    if not args.skip_cli:
        print("\n3. the CLI")
        cli_runs(wav_dir, args.duration, root)
        print(f"load average at the end: {load_average()}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
