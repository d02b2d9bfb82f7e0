"""Where an audio chunk's time goes, beside a token chunk (issue 36): one session, chunks
back to back, audio-tiny (frames through its processor and encoder) against the same LM as a
text model fed 4 ids. Printed per chunk (medians over the chunks after a warm-up):

1. vLLM's input processing alone (`InputProcessor.process_inputs` on the chunk's prompt, in
   this process, no engine step): what the multimodal front end costs before the engine
   core sees the chunk;
2. the chunk end to end (submission to its last token), its engine steps (the probe's
   StepStats between two chunks), their summed step time (also for the first and the second
   half of the chunks apart), and the time to the first token.

    PYTHONPATH=. .venv/bin/python benchmarks/audio_front_end.py [--chunks 40]
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

from audio_model import TOKENS_OUT, chunk_done  # noqa: E402 - beside this file

WARM_UP = 8


def med(values) -> float:
    return round(statistics.median(values), 2)


def process_inputs_ms(engine, make_prompt, n: int) -> list[float]:
    from vllm import SamplingParams

    processor = engine._llm.input_processor  # the benchmark reads vLLM's own step
    params = SamplingParams(max_tokens=TOKENS_OUT)
    out = []
    for i in range(n):
        prompt = make_prompt(i)
        start = time.perf_counter()
        processor.process_inputs(f"bench-{i}", prompt, params, ("generate",), resumable=True)
        out.append((time.perf_counter() - start) * 1e3)
    return out[WARM_UP:]


def chunks(engine, frames, ids) -> dict:
    engine.open(91)
    engine.drain_step_stats()
    total, first, steps, step_ms = [], [], [], []
    try:
        for audio in frames:
            handle = chunk_done(engine, 91, audio, ids)
            time.sleep(0.02)  # the probe's stats of the chunk's last step arrive
            done = engine.drain_step_stats()
            total.append((handle.t_done - handle.t_submit) * 1e3)
            first.append((handle.t_first - handle.t_submit) * 1e3)
            steps.append(len(done))
            step_ms.append(sum(s.step_ms for s in done))
    finally:
        engine.close(91)
    w, half = WARM_UP, WARM_UP + (len(total) - WARM_UP) // 2
    # The two halves apart: a cost that grows with the chunks the session already holds
    # (vLLM keeps every chunk's audio item on the request) shows as a later half slower.
    return {"chunk_ms": med(total[w:]), "first_token_ms": med(first[w:]),
            "steps": med(steps[w:]), "step_ms_sum": med(step_ms[w:]),
            "steps_ms_early": med(step_ms[w:half]), "steps_ms_late": med(step_ms[half:])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=40)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from audio_model import frames_of, lm_only, load_average, machine, speech_dir
    from engine import EngineConfig, KVPolicy, create_engine
    from engine.audio_model import build_audio_tiny

    print(f"machine: {machine()}; load average at start: {load_average()}")
    root = Path(tempfile.mkdtemp(prefix="audio-front-"))
    whole = [f for f in frames_of(speech_dir(root), args.chunks) if len(f) == 1280]
    frames = [whole[i % len(whole)] for i in range(args.chunks)]  # the clip may be shorter
    audio_path = build_audio_tiny(0)
    policy = KVPolicy("window", 256, 32)
    rows = {}
    for label, path in (("audio", audio_path), ("text", lm_only(audio_path))):
        engine = create_engine("vllm", EngineConfig(model=str(path), pool_blocks=128,
                                                    policy=policy, frame_ms=80.0))
        try:
            ids = [engine.vocab_size - 1 - i for i in range(4)]
            if engine.frame_token_ids is not None:
                audio_in = engine._audio  # the backend's own chunk builder

                def make(i, audio_in=audio_in):
                    return audio_in.chunk([frames[i]], [f"bench-a{i}"])
            else:
                def make(i, ids=ids):
                    return {"prompt_token_ids": ids}
            rows[label] = {"process_inputs_ms": med(process_inputs_ms(engine, make,
                                                                      args.chunks)),
                           **chunks(engine, frames, ids)}
        finally:
            engine.shutdown()
    print(f"per chunk, one session, back to back, medians over {args.chunks - WARM_UP}:")
    keys = ("process_inputs_ms", "chunk_ms", "first_token_ms", "steps", "step_ms_sum",
            "steps_ms_early", "steps_ms_late")
    print("  " + " | ".join(f"{k:>17}" for k in ("model", *keys)))
    for label, row in rows.items():
        print("  " + " | ".join(f"{v:>17}" for v in (label, *(row[k] for k in keys))))
    a, t = rows["audio"], rows["text"]
    print(f"  audio - text: chunk {a['chunk_ms'] - t['chunk_ms']:.2f} ms, of which input "
          f"processing {a['process_inputs_ms'] - t['process_inputs_ms']:.2f} ms and engine "
          f"steps {a['step_ms_sum'] - t['step_ms_sum']:.2f} ms "
          f"({a['steps']:g} steps against {t['steps']:g})")
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
