"""On a CUDA GPU: sinks + window through vLLM's FlashAttention path (tests marked `gpu`).

Skipped without CUDA; `bash scripts/gpu_check.sh` installs the CUDA flavour and runs them,
printing each figure on a line starting `gpu_check:`. Written without a GPU to run them on:
the thresholds below come from CPU measurements, see each test.

1. The cliff/slope pair through the CLI, as a user runs it: unbounded KV stalls silently, the
   windowed run (sinks on, PIECEWISE CUDA graphs, FlashAttention) does not.
2. Prompt logprobs equal the masked reference (test_sinks_vllm's helpers), prefilled in chunks
   that cross the window's block edges, in fp16 on FlashAttention.
3. Decode step time: sinks + window vs vLLM's native sliding window (benchmarks.sinks_decode).
"""

import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.models import build_tiny
from engine.sinks import SINK_TOKENS_ENV, WINDOW_TOKENS_ENV
from engine.sinks.compaction import kept_key_mask
from engine.sinks.plugin import register
from engine.vllm_backend import cuda_available
from test_sinks_vllm import (BS, CHUNK, CONFIGS, decode_peak_blocks, prompt,  # noqa: F401
                             reference_logprobs, reference_model)

pytestmark = [pytest.mark.gpu, pytest.mark.vllm,
              pytest.mark.skipif(not cuda_available(),
                                 reason="needs a CUDA GPU: run scripts/gpu_check.sh on one")]

ROOT = Path(__file__).resolve().parents[2]
PAIR = ["--engine", "vllm", "--pool-blocks", "64", "--sessions", "8", "--frame-ms", "160",
        "--duration", "6", "--json",
        # Leaves room for this test process's own CUDA context (vLLM's default takes 0.9).
        "--vllm-arg", "gpu_memory_utilization=0.5"]


def _cli_run(db: Path, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", "import sys; from cli.main import main; "
                          "sys.exit(main())", "run", "--db", str(db), *PAIR, *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _step_ms(db: Path, run_id: str) -> float:
    from store import Store
    from store.queries import steps

    st = Store(str(db))
    try:
        return float(np.median([s["step_ms"] for s in steps(st.cursor(), run_id)]))
    finally:
        st.close()


# First in the module: the CLI's engines start in their own processes, before this one holds
# any GPU memory of its own.
def test_cliff_and_slope_on_cuda(tmp_path):
    db = tmp_path / "pair.duckdb"
    # Unbounded in eager mode: its stall is the pool filling, not a kernel matter, and eager
    # saves the compile; the windowed run keeps the default sinks set-up (PIECEWISE graphs).
    cliff = _cli_run(db, "--policy", "unbounded", "--vllm-arg", "enforce_eager=True")
    slope = _cli_run(db, "--policy", "window", "--window", "128", "--sinks", "32")
    for name, s in (("cliff (unbounded)", cliff), ("slope (window W=128 S=32)", slope)):
        print(f"gpu_check: {name}: stalled={s['stalled']} stall_at_s={s['stall_at_s']} "
              f"silent_rate={s['silent_rate']:.3f} frames={s['frames']} "
              f"median_step_ms={_step_ms(db, s['run_id']):.2f}")
    # As on CPU (test_vllm_unbounded, test_sinks_vllm): the pool's exhaustion is silent.
    assert cliff["status"] == "finished" and cliff["stalled"] is True
    assert cliff["silent_rate"] > 0.3
    assert slope["status"] == "finished", slope["reason"]
    assert slope["stalled"] is False and slope["silent_rate"] < 0.1


def _sinks_builders(worker):
    """collective_rpc target: (backend, builder, compacts) for each sinks group's builder."""
    from engine.sinks.live import _sinks_groups
    from engine.sinks.support import compacts

    _, groups = _sinks_groups(worker)
    return sorted({(g.backend.get_name(), type(b).__name__, compacts(type(b)))
                   for g in groups for b in g.metadata_builders})


@pytest.fixture(scope="module")
def cuda_logprobs(prompt):  # noqa: F811 - the fixture imported from test_sinks_vllm
    import torch

    results = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: builders inspectable
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        for window, sinks in CONFIGS:
            mp.setenv(WINDOW_TOKENS_ENV, str(window))
            mp.setenv(SINK_TOKENS_ENV, str(sinks))
            register()
            # fp16 rather than the CPU test's fp32: FlashAttention has no fp32 kernels.
            llm = LLM(model=str(build_tiny(0)), dtype="float16", block_size=BS,
                      enforce_eager=True, enable_prefix_caching=False,
                      attention_backend="FLASH_ATTN", max_num_batched_tokens=CHUNK,
                      max_num_seqs=8, num_gpu_blocks_override=64, max_model_len=2048,
                      gpu_memory_utilization=0.2, seed=0)
            builders = llm.collective_rpc(_sinks_builders)
            out = llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                               SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
            got = np.array([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], prompt[1:])])
            results[(window, sinks)] = (got, builders)
            if (window, sinks) == CONFIGS[0]:
                results["decode_peak"] = decode_peak_blocks(llm, prompt[:100], 300)
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    return results


@pytest.mark.parametrize("window,sinks", CONFIGS)
def test_prompt_logprobs_match_the_masked_reference_on_flash_attention(
        cuda_logprobs, reference_model, prompt, window, sinks):  # noqa: F811
    got, builders = cuda_logprobs[(window, sinks)]
    assert builders == [[("FLASH_ATTN", "FlashAttentionMetadataBuilder", True)]]
    kept = np.abs(got - reference_logprobs(reference_model, prompt,
                                           kept_key_mask(len(prompt), window, sinks, BS)))
    full = np.abs(got - reference_logprobs(reference_model, prompt,
                                           kept_key_mask(len(prompt), 10**6, 0, BS)))
    print(f"gpu_check: logprobs W={window} S={sinks}: max |vLLM - kept-keys reference| = "
          f"{kept.max():.4f}, vs full attention {full.max():.4f}")
    # The tiny model's fp16 reference differs from its fp32 one by ≤ 1.5e-3 (measured on CPU);
    # attending the wrong keys costs 0.3–0.8 here (full attention vs the kept keys).
    assert kept.max() < 2e-2
    assert full.max() > 0.1


def test_decode_holds_at_most_sinks_plus_window_plus_one_blocks_on_cuda(cuda_logprobs):
    window, sinks = CONFIGS[0]
    assert cuda_logprobs["decode_peak"] == -(-sinks // BS) + -(-window // BS) + 1


def test_decode_step_time_sinks_vs_native_sliding_window(monkeypatch):
    import torch

    from benchmarks.sinks_decode import BATCHES, measure

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv(WINDOW_TOKENS_ENV, "0")  # restored after: measure() sets them
    monkeypatch.setenv(SINK_TOKENS_ENV, "0")
    model = str(build_tiny(0))
    plain = measure(model, sinks=False, reps=3)
    torch.cuda.empty_cache()
    sinks = measure(model, sinks=True, reps=3)
    for b in BATCHES:
        print(f"gpu_check: decode step, batch {b}: native sliding window {plain[b]:.2f} ms, "
              f"sinks + window {sinks[b]:.2f} ms ({sinks[b] / plain[b]:.2f}x)")
    # A loose bound (CPU: ≤ 1.1x, docs/BENCHMARKS.md): on a GPU the host-side compaction is a
    # larger share of a short step; 3x would mean something pathological.
    assert all(0 < sinks[b] < 3 * plain[b] for b in BATCHES), (plain, sinks)
