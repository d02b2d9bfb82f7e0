"""What vLLM's render of one streaming chunk costs, side by side: an audio chunk on the frame
path (engine/audio_render.py), the same chunk on vLLM's own path, and a text chunk of the same
length.

vLLM renders each chunk inline on its event loop (`input_processor.process_inputs`) before the
chunk goes to the engine core, so a tick's chunks reach the core one render apart
(docs/benchmarks/audio_model.md §9). Here that call is timed directly, with no engine step
running beside it: the engines are started (audio-tiny and its LM alone, seed 0, window
W=256 S=32) and the serving process renders speech frames of `--frame-ms` as the engine's own
chunks (each with its own fresh sampling parameters, as engine/vllm_stream.py makes them), in
blocks of `--block` chunks, the three kinds in turn (the order rotated each round) for
`--rounds` rounds. Printed: per kind the median render of a chunk, the median of the block
medians, and the median over rounds of each round's ratio to the frame path's block.

    PYTHONPATH=. .venv/bin/python benchmarks/audio_render.py [--frame-ms 160] [--rounds 12]
        [--block 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from audio_model import lm_only, load_average, machine, speech_dir  # noqa: E402

KINDS = ("audio, frame path", "audio, vLLM's path", "text, same tokens")


def render_ms(engine, prompts: list, tag: str) -> list[float]:
    """vLLM's render of each prompt, as the engine's stream hands it over: ms each."""
    from engine.vllm_stream import sampling_params

    processor = engine._llm.input_processor
    out = []
    for i, prompt in enumerate(prompts):
        params = sampling_params(4)
        start = time.perf_counter()
        processor.process_inputs(f"{tag}-{i}", prompt, params, supported_tasks=("generate",),
                                 resumable=True)
        out.append((time.perf_counter() - start) * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frame-ms", type=float, default=160.0)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=int, default=40)
    args = parser.parse_args()
    if args.rounds < 1 or args.block < 1 or args.frame_ms <= 0:
        parser.error("--rounds ≥ 1, --block ≥ 1 and --frame-ms > 0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the figures
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from engine import EngineConfig, KVPolicy, create_engine
    from engine.audio_model import build_audio_tiny
    from engine.audio_render import frame_path_checked, use_frame_path
    from load_gen.wav import load_folder

    print(f"machine: {machine()}; load average at start: {load_average()}")
    wav_dir = speech_dir(Path(tempfile.mkdtemp(prefix="audio-render-")))
    audio_path = build_audio_tiny(0)
    policy = KVPolicy("window", 256, 32)
    engines = {name: create_engine("vllm", EngineConfig(model=str(path), pool_blocks=128,
                                                        policy=policy, frame_ms=args.frame_ms))
               for name, path in (("audio", audio_path), ("text", lm_only(audio_path)))}
    audio = engines["audio"]
    samples = audio._audio.frame_samples
    processor = audio._llm.renderer.get_mm_processor()
    clips = [c.samples[i:i + samples]  # every whole frame of the speech clips, reused in turn
             for c in load_folder(str(wav_dir), audio._audio.sample_rate_hz)
             for i in range(0, len(c.samples) - samples + 1, samples)]
    assert len(clips) >= 10, f"{len(clips)} speech frames of {samples} samples"
    tokens = list(audio.frame_token_ids)
    times: dict[str, list[list[float]]] = {kind: [] for kind in KINDS}
    names = iter(range(10**9))
    try:
        render_ms(engines["text"], [{"prompt_token_ids": tokens}] * 10, "warm")
        use_frame_path(processor, True)  # checked against vLLM's on the warm-up's first chunk
        render_ms(audio, [audio._audio.chunk([clips[i]], [f"warm-{i}"]) for i in range(10)],
                  "warm")
        # A frame path that failed its check serves vLLM's path: nothing to compare.
        assert frame_path_checked(processor) is True, "the frame render did not match vLLM's"
        for r in range(args.rounds):
            for kind in KINDS[r % 3:] + KINDS[:r % 3]:
                if kind.startswith("text"):
                    engine, prompts = engines["text"], [{"prompt_token_ids": tokens}] * args.block
                else:
                    use_frame_path(processor, kind == KINDS[0])
                    engine = audio
                    prompts = [audio._audio.chunk([clips[(r * args.block + i) % len(clips)]],
                                                  [f"b-{next(names)}"])
                               for i in range(args.block)]
                times[kind].append(render_ms(engine, prompts, f"r{r}"))
        use_frame_path(processor, True)
    finally:
        for engine in engines.values():
            engine.shutdown()
    print(f"{args.frame_ms:g} ms frames ({samples} samples, {len(tokens)} tokens a chunk), "
          f"{args.rounds} rounds of {args.block} chunks a kind, kinds in rotated turns:")
    print("  kind                | render ms p50 | block p50s' median | ratio to frame path "
          "(median over rounds)")
    base = [statistics.median(b) for b in times[KINDS[0]]]
    for kind in KINDS:
        blocks = [statistics.median(b) for b in times[kind]]
        ratio = statistics.median(m / f for m, f in zip(blocks, base))
        flat = [t for b in times[kind] for t in b]
        print(f"  {kind:<19} | {statistics.median(flat):>13.3f} | "
              f"{statistics.median(blocks):>18.3f} | {ratio:>6.2f}")
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
