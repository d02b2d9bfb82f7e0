"""Do an audio model's frames still share engine steps? (issue 36's N_c gap: at 160 ms the
calibration found audio-tiny serving 6 sessions where its own LM as a text model serves 36.)

Each model (audio-tiny and its LM alone, both from seed 0) serves the same WAV load through
`Runner` (audio_model.py's `run`: window W=256 S=32, 4 tokens out) at the given sessions and
period, one run each, in turns audio-text-text-audio; then the run's `steps` rows (each vLLM
step's prompt and generated tokens, as the engine probe reports them) say how the frames were
batched:

- hand-over steps per frame period: steps charged with prompt tokens. The engine probe
  (engine/vllm_stats.py) charges every chunk handed over since the last step to the next step
  to end, whether or not the chunk reached the engine core before that step began; so a
  hand-over step is where the frames were *counted*, not where they were computed;
- frames per hand-over step: frames submitted (not skipped) over those steps;
- requests in a step after idle (median): the tokens out of a step that follows an idle engine,
  one per request in it: the chunks that reached the engine core before it started that step.
  The core starts a step on the first chunk it has; chunks rendered after that wait for the
  next step (vLLM renders each on its event loop, one after another);
- steps per frame period, the median step time, and the median time of a hand-over step;
- for the audio model, encoder frames per encoder pass (1.0: the tower ran once per frame;
  more: one call took several sessions' frames);
- vLLM's render of a chunk (`process_inputs`, inline on the engine's event loop before the
  chunk goes to the engine core; RenderTap): its median time, and how far apart the renders of
  one period's chunks end (first to last, median over periods): how long the last chunk of a
  tick reaches the core after the first.

`--vllm-render` adds the audio model on vLLM's own render of a chunk (engine/audio_render.py's
frame path off; label audio-v), in turns audio, audio-v, text, text, audio-v, audio on the same
engines, so the frame path's effect is read side by side.

    PYTHONPATH=. .venv/bin/python benchmarks/audio_batching.py [--sessions 6] [--frame-ms 160]
        [--duration 10] [--vllm-render]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from audio_model import lm_only, load_average, machine, run, speech_dir  # noqa: E402


class RenderTap:
    """vLLM's render of each streaming chunk (`input_processor.process_inputs` with
    `resumable=True`, called inline on the engine's event loop before the chunk is sent to the
    engine core): its (start, end) perf_counter times while the block runs."""

    def __init__(self, engine) -> None:
        self.processor = engine._llm.input_processor
        self.calls: list[tuple[float, float]] = []

    def __enter__(self) -> "RenderTap":
        render = type(self.processor).process_inputs

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return render(self.processor, *args, **kwargs)
            finally:
                if kwargs.get("resumable"):
                    self.calls.append((start, time.perf_counter()))

        self.processor.process_inputs = timed
        return self

    def __exit__(self, *exc) -> None:
        del self.processor.process_inputs

    def figures(self, frame_ms: float) -> dict:
        """The median render of a chunk, and the median spread (first to last render's end)
        of the chunks of one period: renders whose ends lie within a quarter period of the
        previous one's are one period's."""
        if not self.calls:
            return {"render_ms_p50": math.nan, "render_spread_ms_p50": math.nan}
        ends = sorted(end for _, end in self.calls)
        groups, group = [], [ends[0]]
        for t in ends[1:]:
            if t - group[-1] > frame_ms / 4e3:
                groups.append(group)
                group = []
            group.append(t)
        groups.append(group)
        spreads = [(g[-1] - g[0]) * 1e3 for g in groups if len(g) > 1]
        return {"render_ms_p50": statistics.median((e - s) * 1e3 for s, e in self.calls),
                "render_spread_ms_p50": statistics.median(spreads) if spreads else math.nan}


def one_run(engine, model: str, args, tokens_in: int, wav_dir: Path, store) -> dict:
    with RenderTap(engine) as tap:
        summary = run(engine, model, args.sessions, wav_dir, args.duration, store,
                      frame_ms=args.frame_ms, tokens_in=tokens_in)
    store.writer.flush(30.0)
    cur = store.cursor()
    submitted, first_submit = cur.execute(
        "SELECT count(*), min(t_submit) FROM frames WHERE run_id = ? AND NOT skipped",
        [summary.run_id]).fetchone()
    # The engine's steps before the run's first frame (an earlier run's last, drained by this
    # run's first poll) are not this run's: both clocks are the engine's.
    rows = cur.execute("SELECT t, step_ms, prompt_tokens, gen_tokens, running FROM steps "
                       "WHERE run_id = ? AND t >= ? ORDER BY t",
                       [summary.run_id, first_submit]).fetchall()
    assert rows, f"run {summary.run_id} recorded no steps"
    span_s = rows[-1][0] - first_submit
    periods = max(1.0, span_s * 1e3 / args.frame_ms)
    prefill = [r for r in rows if r[2] > 0]
    return {"p50_ms": summary.p50_ms, "p95_ms": summary.p95_ms,
            "silent": summary.silent_rate, "frames": submitted,
            "steps_per_period": len(rows) / periods,
            "prefill_steps_per_period": len(prefill) / periods,
            "frames_per_prefill_step": submitted / len(prefill) if prefill else None,
            "step_ms_p50": statistics.median(r[1] for r in rows),
            "prefill_step_ms_p50": statistics.median(r[1] for r in prefill) if prefill else None,
            "first_step_requests": statistics.median(
                [r[3] for prev, r in zip(rows, rows[1:]) if prev[4] == 0] or [0]),
            "frames_per_pass": (summary.audio.encoder_frames / summary.audio.encoder_passes
                                if summary.audio and summary.audio.encoder_passes else None),
            **tap.figures(args.frame_ms)}


def show(label: str, r: dict) -> str:
    def ms(v):
        return "> budget" if v is None else f"{v:.1f}"

    silent = "-" if r["silent"] is None else f"{r['silent']:.3f}"
    per_step = "-" if r["frames_per_prefill_step"] is None else \
        f"{r['frames_per_prefill_step']:.2f}"  # no hand-over step recorded: unknown
    return (f"  {label:>7} | {ms(r['p50_ms']):>8} {ms(r['p95_ms']):>8} {silent:>6} | "
            f"{r['frames']:>6} | {r['steps_per_period']:>6.2f} | "
            f"{r['prefill_steps_per_period']:>6.2f} | {per_step:>6} | "
            f"{r['first_step_requests']:>4g} | "
            f"{r['step_ms_p50']:>6.1f} | {ms(r['prefill_step_ms_p50']):>6} | "
            f"{'-' if r['frames_per_pass'] is None else format(r['frames_per_pass'], '.2f'):>6} | "
            f"{r['render_ms_p50']:>5.2f} | {r['render_spread_ms_p50']:>5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--frame-ms", type=float, default=160.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--vllm-render", action="store_true",
                        help="also run the audio model on vLLM's own render of a chunk "
                             "(engine/audio_render.py off: label audio-v), side by side")
    args = parser.parse_args()
    if args.sessions < 1 or args.duration <= 0 or args.frame_ms <= 0:
        parser.error("--sessions ≥ 1, --duration > 0 and --frame-ms > 0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the figures
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from engine import EngineConfig, KVPolicy, create_engine
    from engine.audio_input import audio_input
    from engine.audio_model import build_audio_tiny
    from engine.audio_render import frame_path_checked, use_frame_path
    from store import Store

    print(f"machine: {machine()}; load average at start: {load_average()}")
    root = Path(tempfile.mkdtemp(prefix="audio-batching-"))
    wav_dir = speech_dir(root)
    audio_path = build_audio_tiny(0)
    paths = {"audio": audio_path, "text": lm_only(audio_path)}
    # The text model takes as many ids a frame as the audio processor makes of one.
    tokens_in = len(audio_input(audio_path, args.frame_ms).frame_ids)
    store = Store(str(root / "bench.duckdb"))
    policy = KVPolicy("window", 256, 32)
    engines = {label: create_engine("vllm", EngineConfig(model=str(path), pool_blocks=128,
                                                         policy=policy,
                                                         frame_ms=args.frame_ms))
               for label, path in paths.items()}
    results: dict[str, list[dict]] = {"audio": [], "audio-v": [], "text": []}
    turns = ("audio", "audio-v", "text", "text", "audio-v", "audio") if args.vllm_render \
        else ("audio", "text", "text", "audio")
    processor = engines["audio"]._llm.renderer.get_mm_processor()
    try:
        for label in turns:
            engine = engines[label.split("-")[0]]
            use_frame_path(processor, label != "audio-v")
            results[label].append(one_run(engine, str(engine.model_path), args, tokens_in,
                                          wav_dir, store))
            # "audio" is the frame path only where it matched vLLM's (else vLLM's path served)
            assert label != "audio" or frame_path_checked(processor) is True, \
                "the frame render did not match vLLM's: the audio runs are on vLLM's path"
        use_frame_path(processor, True)
    finally:
        for engine in engines.values():
            engine.shutdown()
        store.close()
    print(f"{args.sessions} sessions, {args.frame_ms:g} ms frames, {tokens_in} tokens in, WAV "
          f"load, {args.duration:g} s a run, in turns {'-'.join(turns)}; per run (audio-v: the "
          "audio model on vLLM's own render of a chunk):")
    print("    model |    p50 ms   p95 ms silent | frames | steps/period | hand-over steps/period "
          "| frames/hand-over step | requests in a step after idle | step ms p50 "
          "| hand-over step ms p50 | frames/encoder pass | render ms a chunk p50 "
          "| a period's renders, first to last, ms p50")
    for label in ("audio", "audio-v", "text"):
        for r in results[label]:
            print(show(label, r))
    print("  median over a model's runs (a censored p50 or p95 counts as above every other):")
    medians = {label: {q: median_ms([r[q] for r in rs]) for q in ("p50_ms", "p95_ms")}
               for label, rs in results.items() if rs}
    for label, m in medians.items():
        print(f"  {label:>7} | p50 {fmt_ms(m['p50_ms'])} p95 {fmt_ms(m['p95_ms'])}")
    for a, b in (("audio", "text"), ("audio-v", "audio")):
        if a in medians and b in medians:
            print(f"  {a}/{b}: p50 {ratio(medians[a]['p50_ms'], medians[b]['p50_ms'])}, "
                  f"p95 {ratio(medians[a]['p95_ms'], medians[b]['p95_ms'])}")
    print(f"load average at the end: {load_average()}")


def median_ms(values: list) -> float | None:
    """The median of latencies where None (censored at the budget) sorts above every value;
    None when the median itself is censored."""
    ranked = sorted(values, key=lambda v: math.inf if v is None else v)
    n = len(ranked)
    mid = ranked[(n - 1) // 2: n // 2 + 1]
    return None if None in mid else statistics.mean(mid)


def fmt_ms(v: float | None) -> str:
    return "> budget" if v is None else f"{v:.1f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


if __name__ == "__main__":
    main()
