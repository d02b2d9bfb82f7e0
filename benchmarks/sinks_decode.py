"""Decode step time: sinks + window (engine.sinks) vs vLLM's native sliding window, side by side.

    .venv/bin/python -m benchmarks.sinks_decode [--reps 5] [--no-write]

Tiny model, CPU, in-process engines started one after the other in this process. Every request
has a 300-token prompt, past W + S, so each decode step reads a compacted block table. A decode
step's time is the difference of two runs that differ only in the number of generated tokens,
divided by that difference (prefill and start-up cancel out); medians over `--reps`.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random
import statistics
import sys
import time

logger = logging.getLogger(__name__)

WINDOW, SINKS, BLOCK = 128, 32, 32
PROMPT = 300
SHORT, LONG = 8, 40  # generated tokens of the two runs whose difference is timed
BATCHES = (1, 8, 32)


def engine_kwargs(model: str, sinks: bool) -> dict:
    from engine.contract import KVPolicy
    from engine.models import model_info
    from engine.sinks import additional_config

    # The plugin for sinks (as the vLLM backend runs a window); vLLM's own sliding window
    # (hf_overrides, plugin off) as the baseline.
    kwargs = dict(model=model, block_size=BLOCK, enforce_eager=True, enable_prefix_caching=False,
                  max_num_seqs=256, max_num_batched_tokens=2048, num_gpu_blocks_override=2048,
                  max_model_len=2048, gpu_memory_utilization=0.3, seed=0)
    if sinks:
        from engine.sinks.support import CUDA_BACKEND

        kwargs["additional_config"] = additional_config(KVPolicy("window", WINDOW, SINKS))
        if _on_cuda():
            kwargs["attention_backend"] = CUDA_BACKEND  # the backend engine.sinks compacts
    else:
        layers = int(model_info(model)["num_layers"])
        kwargs["hf_overrides"] = {"sliding_window": WINDOW,
                                  "layer_types": ["sliding_attention"] * layers}
    return kwargs


def _on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def step_ms(llm, batch: int, rng: random.Random) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(1, 2000) for _ in range(PROMPT)])
               for _ in range(batch)]

    def timed(n: int) -> float:
        params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0)
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0

    return (timed(LONG) - timed(SHORT)) / (LONG - SHORT) * 1e3


def measure(model: str, sinks: bool, reps: int) -> dict[int, float]:
    from vllm import LLM

    llm = LLM(**engine_kwargs(model, sinks))
    rng = random.Random(0)
    step_ms(llm, 8, rng)  # warm-up
    samples = {b: [] for b in BATCHES}
    for _ in range(reps):
        for b in BATCHES:
            samples[b].append(step_ms(llm, b, rng))
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return {b: statistics.median(v) for b, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the plugin then runs in this process
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from engine.models import build_tiny

    model = str(build_tiny(0))
    window = measure(model, sinks=False, reps=args.reps)
    sinks = measure(model, sinks=True, reps=args.reps)
    rows = [f"| {b} | {window[b]:.2f} | {sinks[b]:.2f} | {sinks[b] / window[b]:.2f}× |"
            for b in BATCHES]
    table = "\n".join(["| batch | sliding window ms/step | sinks + window ms/step | ratio |",
                       "|---:|---:|---:|---:|", *rows])
    print(table)
    if not args.no_write:
        from benchmarks.report import machine, write_section

        path = write_section("Sinks + window decode step (vLLM, CPU)", f"""
Command: `.venv/bin/python -m benchmarks.sinks_decode --reps {args.reps}`

Machine: {machine()}; `OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}`, in-process engines,
tiny model, block {BLOCK}. W={WINDOW}; sinks S={SINKS} through engine.sinks (KV manager frees
gap blocks, metadata builder compacts block tables) vs vLLM's native sliding window (S=0).
Each of `batch` requests has a {PROMPT}-token prompt; a step's time is
(time for {LONG} tokens − time for {SHORT}) / {LONG - SHORT}, median of {args.reps} runs. Target:
ratio ≤ 1.10×. The machine may be shared with other jobs: medians, not minima.

{table}
""")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
