"""The floor under a frame, and how close Metronome's frame path gets to it (issue 25).

One vLLM engine (the tiny model, this machine's dtype, the backend's own engine arguments) is
started once; at 1, 2, 4 and 8 sessions, in one process tree and one run:

- raw: vLLM's own async API alone — N streaming-input requests (the API Metronome drives),
  each appending `tokens_in` tokens every frame period and waiting for `tokens_out`, driven by
  a bare asyncio loop on the engine's thread: no run loop, no store, no ticks;
- metronome: the same load through `Runner` (sessions, recorder, telemetry, the DuckDB writer).

Frame latency is submission to the last token, as the store records it. Printed: p50/p95 of
each, the p50 ratio, and where Metronome's extra time goes, from timestamps on its handles:
the hand-over from the run thread to the engine's loop (submit → the chunk reaching vLLM) and
the engine time after it. Every figure docs/BENCHMARKS.md quotes is printed here.

    .venv/bin/python benchmarks/frame_floor.py [--bind auto|0-1|nobind] [--duration 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SESSIONS = (1, 2, 4, 8)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile; inf (a frame never answered) sorts last."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _raw_session(llm, sid: int, frames: int, period_s: float, t0: float,
                       tokens_in: int, tokens_out: int, vocab: int, out: list[float],
                       first_out: list[float]) -> None:
    from vllm import SamplingParams
    from vllm.engine.protocol import StreamingInput
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=tokens_out, min_tokens=tokens_out, ignore_eos=True,
                            temperature=0.0, output_kind=RequestOutputKind.DELTA)
    submitted: list[float] = []

    async def chunks():
        for k in range(frames):
            await asyncio.sleep(max(0.0, t0 + k * period_s - time.perf_counter()))
            submitted.append(time.perf_counter())
            ids = [(sid * 7919 + k * tokens_in + j) % vocab for j in range(tokens_in)]
            yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=ids),
                                 sampling_params=params)

    done, first_seen = 0, False
    async for result in llm.generate(chunks(), params, f"raw-{sid}-{time.monotonic_ns()}"):
        completion = result.outputs[0] if result.outputs else None
        if completion is None:
            continue
        if completion.token_ids and not first_seen:
            first_out.append((time.perf_counter() - submitted[done]) * 1e3)
            first_seen = True
        if completion.finish_reason is not None:
            out.append((time.perf_counter() - submitted[done]) * 1e3)
            done, first_seen = done + 1, False
    out.extend([float("inf")] * (frames - done))


def raw_frames(engine, sessions: int, frame_ms: float, duration_s: float, tokens_in: int,
               tokens_out: int) -> tuple[list[float], list[float]]:
    """(frame latencies, first-token latencies) in ms of `sessions` raw streaming requests on
    the engine's own loop."""
    frames = int(duration_s * 1e3 / frame_ms)
    out: list[float] = []
    first: list[float] = []

    async def drive():
        t0 = time.perf_counter() + 0.05
        await asyncio.gather(*(
            _raw_session(engine._llm, sid, frames, frame_ms / 1e3, t0 + sid * 1e-3, tokens_in,
                         tokens_out, engine.vocab_size, out, first) for sid in range(sessions)))

    asyncio.run_coroutine_threadsafe(drive(), engine._loop).result(timeout=duration_s + 120)
    return out, first


def metronome_frames(engine, config, store) -> tuple[list[float], list[float], dict]:
    """(frame latencies, first-token latencies) in ms of a Runner run, from the store."""
    from runtime import Runner

    summary = Runner(config, engine, store).run()
    store.writer.flush()
    rows = store.cursor().execute(
        "SELECT coalesce(latency_ms, 'inf'::DOUBLE), (t_first - t_submit) * 1e3 FROM frames "
        "WHERE run_id = ?", [summary.run_id]).fetchall()
    return [r[0] for r in rows], [r[1] for r in rows if r[1] is not None], summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frame-ms", type=float, default=80.0)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--dtype", default=None, help="force vLLM's dtype (default: "
                        "engine/dtype.py's choice for this machine)")
    parser.add_argument("--bind", default=None,
                        help="VLLM_CPU_OMP_THREADS_BIND for the engine (default: vLLM's auto)")
    args = parser.parse_args()
    if args.bind:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.bind
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from runtime import RunConfig, make_engine
    from store import Store

    from engine.config import parse_vllm_args

    base = RunConfig(engine="vllm", model="tiny", policy="unbounded", pool_blocks=1024,
                     frame_ms=args.frame_ms, duration_s=args.duration, load="fixed", sessions=1,
                     vllm_args=parse_vllm_args([f"dtype={args.dtype}"] if args.dtype else []))
    engine = make_engine(base)
    store = Store(os.path.join(tempfile.mkdtemp(), "floor.duckdb"))
    print(f"vLLM {engine.dtype} ({engine.dtype_reason}); "
          f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')}; "
          f"{args.frame_ms:g} ms frames, {base.tokens_in} in / {base.tokens_out} out, "
          f"{args.duration:g} s per run")
    print("| sessions | raw p50 | raw p95 | metronome p50 | metronome p95 | p50 ratio "
          "| first token p50 raw / metronome | silent (metronome) |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    try:
        raw_frames(engine, 1, args.frame_ms, 1.0, base.tokens_in, base.tokens_out)  # warm-up
        for n in SESSIONS:
            from dataclasses import replace

            raw, raw_first = raw_frames(engine, n, args.frame_ms, args.duration, base.tokens_in,
                                        base.tokens_out)
            ours, our_first, summary = metronome_frames(engine, replace(base, sessions=n), store)
            ratio = pct(ours, 0.5) / pct(raw, 0.5)
            ratios.append(ratio)

            def ms(x):
                return "> budget" if x == float("inf") or x >= 10 * args.frame_ms else f"{x:.1f}"
            print(f"| {n} | {ms(pct(raw, 0.5))} | {ms(pct(raw, 0.95))} | {ms(pct(ours, 0.5))} "
                  f"| {ms(pct(ours, 0.95))} | {ratio:.2f} | {ms(pct(raw_first, 0.5))} / "
                  f"{ms(pct(our_first, 0.5))} | {summary.silent_rate:.1%} |")
        print(f"median p50 ratio over {len(ratios)} loads: {statistics.median(ratios):.2f}")
    finally:
        engine.shutdown()
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
