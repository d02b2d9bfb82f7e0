"""Sinks + window refuses rather than corrupts: what it runs on, checked without a GPU.

- an attention backend whose metadata builder the plugin did not wrap is refused (fake
  backends, through vLLM's own AttentionGroup), with one line naming it and what to do;
- the FlashAttention builder, driven with vLLM's real builder and metadata classes on CPU,
  reads exactly the kept keys through its compacted block table;
- every field of the metadata classes is classified; a new one stops the wrap;
- one vLLM version: a mismatch is one line; without sinks the plugin loads nothing.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.sinks import SINK_TOKENS_ENV, WINDOW_TOKENS_ENV
from engine.sinks.compaction import kept_key_mask, split_rows

BS = 32
ROOT = Path(__file__).resolve().parents[2]


def _table(num_reqs: int, width: int) -> torch.Tensor:
    # Request r's logical block j lives in physical block 1000·r + j: decodable back to (r, j).
    return (torch.arange(num_reqs)[:, None] * 1000 + torch.arange(width)[None, :]).to(torch.int32)


# --- without sinks, nothing; with them, the tested vLLM only ------------------------------------

def test_without_sinks_register_loads_no_sinks_code_and_no_vllm():
    code = """
import json, sys
from engine.sinks.plugin import register
register()
direct = sorted(m for m in sys.modules if m.startswith(("engine.sinks", "vllm")))
from vllm.plugins import load_general_plugins
load_general_plugins()  # what every vLLM process does: runs the installed entry point
print(json.dumps({"direct": direct,
                  "plugin": sys.modules["engine.sinks.plugin"].__file__,
                  "sinks": sorted(m for m in sys.modules if m.startswith("engine.sinks")),
                  "internals": [m for m in ("vllm.v1.kv_cache_spec_registry",
                                            "vllm.v1.attention.backends.cpu_attn",
                                            "vllm.v1.attention.backends.flash_attn")
                                if m in sys.modules]}))
"""
    env = {k: v for k, v in os.environ.items() if k not in (WINDOW_TOKENS_ENV, SINK_TOKENS_ENV)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # The mode is read from the environment (env: os only), and no vLLM at all.
    assert seen["direct"] == ["engine.sinks", "engine.sinks.env", "engine.sinks.plugin"]
    assert Path(seen["plugin"]).resolve().is_relative_to(ROOT)  # this checkout's plugin ran
    assert seen["sinks"] == ["engine.sinks", "engine.sinks.env", "engine.sinks.plugin"]
    assert seen["internals"] == []


def test_a_mismatched_vllm_is_refused_in_one_line(monkeypatch):
    from engine.sinks import support
    from engine.sinks.plugin import register

    monkeypatch.setenv(WINDOW_TOKENS_ENV, "128")
    monkeypatch.setenv(SINK_TOKENS_ENV, "32")
    monkeypatch.setattr(support, "installed_vllm_version", lambda: "0.33.1")
    with pytest.raises(support.SinksUnsupported) as err:
        register()
    message = str(err.value)
    assert "\n" not in message and "0.33.1" in message and "vllm==0.32.0" in message
    support.check_vllm_version("0.32.0+cu129")  # a local build tag of the tested release
    with pytest.raises(support.SinksUnsupported):
        support.check_vllm_version("0.32.1")


def test_the_cli_shows_a_mismatched_vllm_as_one_line(monkeypatch, tmp_path, capsys):
    from cli.main import main
    from engine.sinks import support

    monkeypatch.setenv(WINDOW_TOKENS_ENV, "0")  # restored after: the engine sets it
    monkeypatch.setenv(SINK_TOKENS_ENV, "0")
    monkeypatch.setattr(support, "installed_vllm_version", lambda: "0.31.0")
    code = main(["run", "--engine", "vllm", "--policy", "window", "--window", "128",
                 "--sinks", "32", "--pool-blocks", "64", "--sessions", "1", "--duration", "1",
                 "--db", str(tmp_path / "m.duckdb")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("metronome: error: sinks + window is built for vLLM 0.32.0")
    assert "0.31.0" in err[-1] and "Traceback" not in "\n".join(err)


# --- refusal of builders the plugin did not wrap (fake backends) --------------------------------

class _FakeOutput:
    pass


@dataclasses.dataclass
class _FakeMetadata:
    block_table: torch.Tensor
    seq_lens: torch.Tensor


def _fake_backend(name: str, wrapped: bool):
    class Builder:
        supports_update_block_table = True
        requires_block_table_width = False

        def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
            self.kv_cache_spec = kv_cache_spec

        def build(self, common_prefix_len, common, fast_build=False):
            return _FakeMetadata(common.block_table_tensor, common.seq_lens)

    Builder.__name__ = f"{name.title()}Builder"

    class Backend:
        @staticmethod
        def get_name():
            return name

        @staticmethod
        def get_builder_cls():
            return Builder

    if wrapped:
        from engine.sinks.metadata import FROM_INPUT
        from engine.sinks.plugin import wrap_builder

        assert wrap_builder(Builder, _FakeMetadata, dict.fromkeys(
            ("block_table", "seq_lens"), FROM_INPUT)) is None
    return Backend


@pytest.fixture(scope="module")
def specs():
    pytest.importorskip("vllm")
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from engine.sinks.spec import from_full

    full = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=64, dtype=torch.float32)
    return full, from_full(full, 128, 32, 64)


@pytest.fixture(scope="module")
def checked_groups():
    """vLLM's AttentionGroup with the plugin's start-up check installed (as `register` does)."""
    pytest.importorskip("vllm")
    from vllm.v1.worker.utils import AttentionGroup

    from engine.sinks.plugin import _patch_group_check

    _patch_group_check()

    def make(backend, spec):
        group = AttentionGroup(backend, ["model.layers.0.self_attn"], spec, 0)
        group.create_metadata_builders(None, torch.device("cpu"))
        return group

    return make


@pytest.mark.parametrize("name", ["FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"])
def test_a_sinks_group_on_an_unwrapped_backend_is_refused_at_start(checked_groups, specs,
                                                                  name, tmp_path, monkeypatch):
    from engine.sinks.support import REFUSAL_FILE_ENV, SinksUnsupported

    monkeypatch.setenv(REFUSAL_FILE_ENV, str(tmp_path / "refusal.txt"))
    with pytest.raises(SinksUnsupported) as err:
        checked_groups(_fake_backend(name, wrapped=False), specs[1])
    message = str(err.value)
    assert "\n" not in message and name in message
    assert "attention_backend=FLASH_ATTN" in message and "--policy unbounded" in message
    # What the front end shows when this ran in an engine process.
    assert (tmp_path / "refusal.txt").read_text() == message


def test_wrapped_backends_and_other_groups_start(checked_groups, specs):
    full, sinks = specs
    group = checked_groups(_fake_backend("FAKE_COMPACTING", wrapped=True), sinks)
    # Sinks groups never reuse another group's metadata with a swapped, uncompacted table.
    assert group.metadata_builders[0].supports_update_block_table is False
    plain = checked_groups(_fake_backend("FLASHINFER", wrapped=False), full)  # no sinks: fine
    assert plain.metadata_builders[0].supports_update_block_table is True


def test_kernel_block_splits_and_full_cuda_graphs_are_refused(specs):
    from types import SimpleNamespace

    from engine.sinks.support import group_refusal

    backend = _fake_backend("FAKE_COMPACTING", wrapped=True)
    builder = backend.get_builder_cls()(specs[1], [], None, None)
    group = SimpleNamespace(backend=backend, metadata_builders=[builder],
                            kv_cache_spec=specs[1], kernel_block_size=None)
    assert group_refusal(group) is None
    split = SimpleNamespace(**{**vars(group), "kernel_block_size": 16})
    assert "16-token kernel blocks" in group_refusal(split)
    builder.use_full_cuda_graph = True
    assert "FULL CUDA graphs" in group_refusal(group)


def test_a_live_change_is_refused_on_an_unwrapped_backend(specs):
    from types import SimpleNamespace

    from engine.sinks.live import check_in_worker

    backend = _fake_backend("FLASHINFER", wrapped=False)
    group = SimpleNamespace(backend=backend, kv_cache_spec=specs[1], kernel_block_size=None,
                            metadata_builders=[backend.get_builder_cls()(specs[1], [], None,
                                                                         None)])
    runner = type("Runner", (), {"_build_attention_metadata": lambda self: None})()
    runner.attn_groups = [[group]]
    assert "FLASHINFER" in check_in_worker(SimpleNamespace(model_runner=runner))


def test_the_front_end_picks_flash_attention_on_cuda_and_refuses_another(monkeypatch):
    from engine import vllm_backend
    from engine.config import EngineConfig
    from engine.contract import KVPolicy

    monkeypatch.setattr(vllm_backend, "cuda_available", lambda: True)

    def args(policy, *extra):
        engine = object.__new__(vllm_backend.VLLMEngine)
        engine.config = EngineConfig(pool_blocks=64, policy=policy, vllm_args=tuple(extra))
        engine.model_path, engine.max_model_len = "m", 2048
        engine._audio = None  # a text model: no audio path's arguments
        return engine.engine_args()

    window = KVPolicy(kind="window", window_tokens=128, sink_tokens=32)
    assert args(window)["attention_backend"] == "FLASH_ATTN"
    assert args(window)["compilation_config"] == {"cudagraph_mode": "PIECEWISE"}
    assert "attention_backend" not in args(KVPolicy())  # unbounded: vLLM chooses
    assert args(KVPolicy(), ("attention_backend", "FLASHINFER"))["attention_backend"] == \
        "FLASHINFER"
    with pytest.raises(ValueError, match="FLASHINFER does not compact"):
        args(window, ("attention_backend", "FLASHINFER"))
    with pytest.raises(ValueError, match="TRITON_ATTN"):
        args(window, ("attention_config", {"backend": "TRITON_ATTN"}))
    assert args(window, ("attention_backend", "flash_attn"))["attention_backend"] == "flash_attn"


def test_an_engine_process_refusal_surfaces_as_its_line():
    from engine.sinks.support import (REFUSAL_FILE_ENV, SinksUnsupported, record_refusal,
                                      refusals_surface)

    with pytest.raises(SinksUnsupported, match="^sinks \\+ window refused: X$"):
        with refusals_surface():
            record_refusal("sinks + window refused: X")  # as the engine core would
            raise RuntimeError("Engine core initialization failed. See root cause above.")
    assert REFUSAL_FILE_ENV not in os.environ
    with pytest.raises(RuntimeError, match="initialization failed"):  # other failures as is
        with refusals_surface():
            raise RuntimeError("Engine core initialization failed.")


# --- every metadata field classified -------------------------------------------------------------

def test_a_new_per_request_field_stops_the_wrap_and_refuses_the_run(specs):
    from types import SimpleNamespace

    from vllm.v1.attention.backend import CommonAttentionMetadata

    from engine.sinks.plugin import wrap_builder
    from engine.sinks.support import compacts, group_refusal

    @dataclasses.dataclass
    class Grown(CommonAttentionMetadata):
        per_request_offsets: torch.Tensor | None = None

    backend = _fake_backend("GROWN", wrapped=False)
    builder_cls = backend.get_builder_cls()
    problem = wrap_builder(builder_cls, _FakeMetadata, {"block_table": "", "seq_lens": ""},
                           common_cls=Grown)
    assert "per_request_offsets" in problem and not compacts(builder_cls)
    group = SimpleNamespace(backend=backend, kv_cache_spec=specs[1], kernel_block_size=None,
                            metadata_builders=[builder_cls(specs[1], [], None, None)])
    assert "per_request_offsets" in group_refusal(group)
    # An output field nobody classified stops it too.
    problem = wrap_builder(builder_cls, _FakeMetadata, {"block_table": ""})
    assert "seq_lens" in problem and not compacts(builder_cls)


# --- the FlashAttention builder, real classes, on CPU --------------------------------------------

@pytest.fixture(scope="module")
def flash_builder():
    """vLLM's FlashAttentionMetadataBuilder (a subclass, wrapped as the plugin wraps the class
    on CUDA), with the state its `build` reads that __init__ would derive from a CUDA config:
    no AOT schedule (FA2), no FULL CUDA graphs, no DCP / R-SWA / multimodal prefix."""
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.flash_attn import (FlashAttentionMetadata,
                                                       FlashAttentionMetadataBuilder)

    from engine.sinks.metadata import FLASH_ATTN_FIELDS
    from engine.sinks.plugin import wrap_builder

    class Builder(FlashAttentionMetadataBuilder):
        pass

    assert wrap_builder(Builder, FlashAttentionMetadata, FLASH_ATTN_FIELDS) is None

    def make(spec):
        builder = object.__new__(Builder)
        vars(builder).update(kv_cache_spec=spec, aot_schedule=False, aot_sliding_window=None,
                             use_full_cuda_graph=False, max_cudagraph_size=None,
                             dcp_world_size=1, rswa_window=None,
                             mm_prefix_query_ranges_np=None)
        return builder

    return make, FlashAttentionMetadata


def _common(reqs):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    lens = torch.tensor([n for n, _ in reqs], dtype=torch.int32)
    qsl = torch.tensor(np.concatenate([[0], np.cumsum([m for _, m in reqs])]),
                       dtype=torch.int32)
    width = -(-int(lens.max()) // BS) + 2
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=lens,
        num_reqs=len(reqs), num_actual_tokens=int(qsl[-1]), max_query_len=int(qsl.diff().max()),
        max_seq_len=int(lens.max()), block_table_tensor=_table(len(reqs), width),
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64),
        seq_lens_cpu_upper_bound=lens.clone())


@pytest.mark.parametrize("window,sinks,reqs", [
    (128, 32, [(700, 1), (161, 1), (40, 1), (300, 64)]),  # decode rows and a chunk
    (96, 0, [(513, 200), (97, 97)]),
])
def test_flash_attention_builder_reads_exactly_the_kept_keys(flash_builder, specs, window,
                                                             sinks, reqs):
    from engine.sinks.spec import from_full

    make, FlashAttentionMetadata = flash_builder
    spec = from_full(specs[0], window, sinks, 64)
    common = _common(reqs)
    table_before = common.block_table_tensor.clone()
    out = make(spec).build(0, common)
    assert type(out) is FlashAttentionMetadata
    assert torch.equal(common.block_table_tensor, table_before)  # the runner's table untouched
    qsl, lens = out.query_start_loc.numpy(), out.seq_lens.numpy()
    assert out.num_actual_tokens == common.num_actual_tokens == qsl[-1]
    assert out.max_seq_len == lens.max() and out.max_query_len == np.diff(qsl).max()
    rows = split_rows(common.query_start_loc_cpu.numpy(), common.seq_lens.numpy(), window,
                      -(-sinks // BS), BS)
    assert len(lens) == rows.num_rows > len(reqs)  # the chunks crossing block edges split
    # Read each sub-row the way flash_attn_varlen_func does: keys [0, seqused_k) through the
    # row's block table, queries aligned causally to the row's end.
    for r in range(rows.num_rows):
        src = rows.source[r]
        seq_len, q_len = reqs[src]
        mask = kept_key_mask(seq_len, window, sinks, BS)
        first = seq_len - q_len + (qsl[r] - common.query_start_loc_cpu[src].item())
        for i in range(qsl[r + 1] - qsl[r]):
            visible = lens[r] - (qsl[r + 1] - qsl[r]) + i + 1
            slots = np.arange(visible)
            blocks = out.block_table[r, slots // BS].numpy()
            assert (blocks // 1000 == src).all(), "read another request's block"
            read = set((blocks % 1000) * BS + slots % BS)
            assert read == set(np.flatnonzero(mask[first + i])), (r, i)


def test_flash_attention_builder_passes_other_groups_through(flash_builder, specs):
    make, _ = flash_builder
    common = _common([(700, 1), (300, 64)])
    out = make(specs[0]).build(0, common)
    assert out.block_table is common.block_table_tensor and out.seq_lens is common.seq_lens
