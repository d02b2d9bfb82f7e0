"""Where an audio frame's extra time goes (issue 36): py-spy over the audio model and the text
stand-in serving the same load, one after the other, in one command.

Each model is served in a child process (`--child`): one vLLM engine, a warm-up run, then a
`Runner` run of N sessions (synthetic load, 80 ms frames, 4 tokens in for text, audio-tiny's
own 4 for audio, 4 out) while py-spy samples that process and vLLM's processes under it
(`--subprocesses --nonblocking`: the processes are never paused, so the run keeps its pace).
Every sample is put in one category by the first marker found from the stack's leaf up (the
list below), and printed as CPU ms per frame offered, audio beside text, with the difference.

Categories (where each runs):
- feature extraction (Metronome's process, vLLM's input processor): the Whisper log-mel;
- HF processor other (same): the tokenizer call and the processor's own bookkeeping;
- vLLM multimodal processing other (same): prompt updates, hashing, the items' kwargs;
- input hand-over (same): the rest of the chunk's way into the engine core (ZMQ send);
- audio tower (vLLM's worker): the encoder and its projector (the encoder's own work);
- encoder scheduling (worker): batching the items, gathering and merging the embeddings;
- LM forward (worker), worker other (attention metadata, sampling, state updates);
- scheduler (engine core); busy-wait (the engine core and the worker poll each other's
  shared-memory queue, sched_yield: vLLM's, on both models);
- store writer, run loop (Metronome's threads), other.

    PYTHONPATH=. .venv/bin/python benchmarks/audio_profile.py [--sessions 4] [--duration 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RATE_HZ = 50  # py-spy samples per second per thread (100 took a core of the two)
# (category, markers): a sample goes to the first category one of whose markers is a frame of
# its stack; checked leaf first, so the busy-wait inside any caller counts as busy-wait.
CATEGORIES = (
    ("busy-wait (core/worker polling)", ("SpinCondition.wait", "sched_yield")),
    ("feature extraction", ("WhisperFeatureExtractor.__call__", "frame_log_mel")),
    ("HF processor other", ("ProcessorMixin.__call__",)),
    ("vLLM multimodal processing other", ("BaseMultiModalProcessor.apply",
                                          "BaseRenderer.render_cmpl")),
    ("input hand-over", ("AsyncLLM._add_streaming_input_request.<locals>.handle_inputs",)),
    ("audio tower", ("Qwen2AudioForConditionalGeneration._process_audio_input",)),
    ("encoder scheduling", ("GPUModelRunner._execute_mm_encoder",
                            "GPUModelRunner._gather_mm_embeddings",
                            "SupportsMultiModal.embed_input_ids")),
    ("LM forward", ("GPUModelRunner._model_forward",)),
    ("worker other", ("GPUModelRunner.execute_model", "GPUModelRunner.sample_tokens",
                      "WorkerProc.worker_busy_loop")),
    ("scheduler", ("Scheduler.schedule", "Scheduler.update_from_output")),
    ("engine core other", ("EngineCoreProc.run_busy_loop", "EngineCoreProc.process_input_sockets",
                           "EngineCoreProc.process_output_sockets")),
    ("store writer", ("StoreWriter._run",)),
    ("run loop", ("Runner.run",)),
)


def classify(frames: list[str]) -> str:
    names = [f.split(" (")[0] for f in frames]
    for label, markers in CATEGORIES:
        for name in reversed(names):
            if name in markers:
                return label
    return "other"


def child(model: str, sessions: int, duration: float, marker: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from dataclasses import replace

    from benchmarks.audio_model import lm_only
    from engine import EngineConfig, KVPolicy, create_engine
    from engine.audio_model import build_audio_tiny
    from runtime import RunConfig, Runner
    from store import Store

    path = build_audio_tiny(0)
    path = path if model == "audio" else lm_only(path)
    engine = create_engine("vllm", EngineConfig(model=str(path), pool_blocks=128,
                                                policy=KVPolicy("window", 256, 32),
                                                frame_ms=80.0))
    store = Store(":memory:")
    cfg = RunConfig(engine="vllm", model=str(path), load="fixed", sessions=sessions,
                    duration_s=3.0, policy="window", window=256, sinks=32, pool_blocks=128,
                    frame_ms=80.0, tokens_in=4, tokens_out=4, open_budget=8)
    try:
        Runner(cfg, engine, store).run()  # warm-up, not sampled
        marker.write_text(str(time.time()))
        s = Runner(replace(cfg, duration_s=duration), engine, store).run()
    finally:
        engine.shutdown()
        store.close()
    keys = ("frames", "p50_ms", "p95_ms", "silent_rate", "input")
    figures = {k: getattr(s, k) for k in keys}
    figures["encoder_ms_per_frame"] = s.audio.encoder_ms_per_frame if s.audio else None
    print("SUMMARY " + json.dumps(figures), flush=True)


def profile(model: str, sessions: int, duration: float, root: Path) -> tuple[dict, dict]:
    marker, raw = root / f"{model}.start", root / f"{model}.raw"
    cmd = [sys.executable, __file__, "--child", model, "--sessions", str(sessions),
           "--duration", f"{duration:g}", "--marker", str(marker)]
    env = {**os.environ, "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    while not marker.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the {model} child ended before its run (rc {proc.returncode})")
        time.sleep(0.2)
    spy = Path(sys.executable).with_name("py-spy")
    # Sampled over the run's middle: its start and end (opens, closes) are left out.
    time.sleep(1.0)
    subprocess.run([str(spy), "record", "--pid", str(proc.pid), "--subprocesses",
                    "--nonblocking", "--format", "raw", "-r", str(RATE_HZ), "-d",
                    f"{duration - 2:g}", "-o", str(raw)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out, _ = proc.communicate()
    summary = json.loads(next(line for line in out.splitlines()
                              if line.startswith("SUMMARY "))[len("SUMMARY "):])
    counts: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        counts[classify(stack.split(";"))] += int(n)
    return summary, dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--child", choices=("audio", "text"))
    parser.add_argument("--marker")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.sessions, args.duration, Path(args.marker))
        return
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    root = Path(tempfile.mkdtemp(prefix="audio-profile-"))
    sampled_s = args.duration - 2
    frames_per_s = args.sessions * 1e3 / 80.0
    results = {m: profile(m, args.sessions, args.duration, root) for m in ("audio", "text")}
    for model, (summary, _) in results.items():
        print(f"{model}: {summary}")
    print(f"\nCPU ms per frame offered ({args.sessions} sessions, 80 ms frames, py-spy "
          f"{RATE_HZ} Hz over {sampled_s:g} s; {frames_per_s:g} frames/s offered)")
    print(f"  {'category':<36} {'audio':>7} {'text':>7} {'audio-text':>10}")
    labels = [label for label, _ in CATEGORIES] + ["other"]
    per = {m: {k: v / RATE_HZ * 1e3 / (sampled_s * frames_per_s) for k, v in c.items()}
           for m, (_, c) in results.items()}
    for label in labels:
        a, t = per["audio"].get(label, 0.0), per["text"].get(label, 0.0)
        print(f"  {label:<36} {a:7.2f} {t:7.2f} {a - t:+10.2f}")
    total = {m: sum(v for k, v in per[m].items() if not k.startswith("busy-wait"))
             for m in per}
    print(f"  {'total without busy-wait':<36} {total['audio']:7.2f} {total['text']:7.2f} "
          f"{total['audio'] - total['text']:+10.2f}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
