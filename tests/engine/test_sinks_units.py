"""Sinks + window without an engine: compaction arithmetic, the metadata rewrite, the KV manager.

The compaction is checked the way a kernel would use it: each sub-row's compacted block table
and seq_len are turned back into the absolute positions its queries read, which must be exactly
the keys the design keeps (`kept_key_mask`).
"""

import dataclasses

import numpy as np
import pytest
import torch

from engine.sinks.compaction import (compact_block_table, gap_blocks, kept_key_mask,
                                     split_rows)

BS = 32


def _table(num_reqs: int, width: int) -> torch.Tensor:
    # Request r's logical block j lives in physical block 1000·r + j: decodable back to (r, j).
    return (torch.arange(num_reqs)[:, None] * 1000 + torch.arange(width)[None, :]).to(torch.int32)


def _positions_read(table, rows, r, i):
    """Absolute key positions sub-row r's i-th query reads, as the stock kernel would."""
    q = rows.query_lens[r]
    visible = rows.seq_lens[r] - q + i + 1  # causal, aligned to the row's end
    slots = np.arange(visible)
    blocks = table[r, slots // BS].numpy()
    assert (blocks // 1000 == rows.source[r]).all(), "read another request's block"
    return set((blocks % 1000) * BS + slots % BS)


CASES = [  # (W, S, [(seq_len, query_len), ...]): decode rows, chunks crossing the window edge
    (128, 16, [(1, 1), (129, 1), (160, 1), (161, 1), (700, 1)]),
    (128, 0, [(64, 64), (300, 64), (400, 400), (257, 1)]),
    (96, 32, [(160, 96), (513, 200), (33, 33), (1000, 17)]),
    (64, 63, [(640, 640)]),
]


@pytest.mark.parametrize("window,sinks,reqs", CASES)
def test_sub_rows_read_exactly_the_kept_keys(window, sinks, reqs):
    lens = np.array([n for n, _ in reqs])
    q = np.array([m for _, m in reqs])
    qsl = np.concatenate([[0], np.cumsum(q)])
    sink_blocks = -(-sinks // BS)
    width = -(-lens.max() // BS) + 2
    rows = split_rows(qsl, lens, window, sink_blocks, BS)
    table = compact_block_table(_table(len(reqs), width), rows)
    assert rows.query_start_loc[0] == 0 and rows.query_start_loc[-1] == qsl[-1]
    assert (rows.query_lens > 0).all()
    for r in range(rows.num_rows):
        src = rows.source[r]
        mask = kept_key_mask(int(lens[src]), window, sinks, BS)
        first_pos = lens[src] - q[src] + (rows.query_start_loc[r] - qsl[src])
        for i in range(rows.query_lens[r]):
            p = first_pos + i
            assert _positions_read(table, rows, r, i) == set(np.flatnonzero(mask[p])), (r, i, p)


CARRIED = [  # (W, [(seq_len, query_len, sink_blocks, frontier), ...]) after a live change
    # W grew 64 → 256 at position ~300: the window starts at the old frontier and refills.
    (256, [(301, 1, 1, 7), (330, 29, 1, 7), (600, 300, 1, 7), (20, 20, 1, 0)]),
    # S shrank 2 → 0 blocks, W shrank: sinks go at once, the frontier is below the new window.
    (64, [(500, 1, 0, 3), (500, 100, 0, 3), (200, 64, 2, 0)]),
    # S grew after the gap opened: the request keeps the one sink block it still has.
    (128, [(700, 90, 1, 10), (129, 129, 3, 0)]),
]


@pytest.mark.parametrize("window,reqs", CARRIED)
def test_carried_rows_read_exactly_what_the_request_still_holds(window, reqs):
    lens = np.array([r[0] for r in reqs])
    q = np.array([r[1] for r in reqs])
    sinks = np.array([r[2] for r in reqs])
    front = np.array([r[3] for r in reqs])
    qsl = np.concatenate([[0], np.cumsum(q)])
    width = -(-lens.max() // BS) + 2
    rows = split_rows(qsl, lens, window, sinks, BS, front)
    table = compact_block_table(_table(len(reqs), width), rows)
    assert rows.query_start_loc[-1] == qsl[-1] and (rows.query_lens > 0).all()
    for r in range(rows.num_rows):
        src = rows.source[r]
        mask = kept_key_mask(int(lens[src]), window, 0, BS, sink_blocks=int(sinks[src]),
                             frontier=int(front[src]))
        first_pos = lens[src] - q[src] + (rows.query_start_loc[r] - qsl[src])
        for i in range(rows.query_lens[r]):
            p = first_pos + i
            read = _positions_read(table, rows, r, i)
            assert read == set(np.flatnonzero(mask[p])), (r, i, p)
            # nothing below the frontier other than the sinks is ever read
            assert all(k < sinks[src] * BS or k >= front[src] * BS for k in read)


def test_a_chunk_splits_where_the_window_start_moves():
    # W=128, no sinks: the first kept block moves at positions 159, 191, ... (W - 1 + k·32).
    rows = split_rows(np.array([0, 64]), np.array([200]), 128, 0, BS)
    assert rows.query_start_loc.tolist() == [0, 23, 55, 64]  # positions 136 | 159 | 191..199
    assert rows.gap.tolist() == [0, 1, 2]
    assert rows.seq_lens.tolist() == [159, 191 - 32, 200 - 64]


def test_padding_rows_and_short_sequences_pass_through():
    rows = split_rows(np.array([0, 1, 1]), np.array([50, 0]), 128, 1, BS)
    assert rows.source.tolist() == [0, 1] and rows.gap.tolist() == [0, 0]
    assert rows.seq_lens.tolist() == [50, 0]


def test_the_runner_table_is_never_written():
    table = _table(2, 12)
    before = table.clone()
    rows = split_rows(np.array([0, 1, 2]), np.array([300, 301]), 128, 1, BS)
    compact_block_table(table, rows)
    assert torch.equal(table, before)


def test_gap_grows_one_block_per_block_of_tokens():
    p = np.arange(0, 2000)
    g = gap_blocks(p, 128, 1, BS)
    assert g[0] == 0 and set(np.diff(g)) <= {0, 1}
    assert g[-1] == (1999 - 127) // BS - 1


# --- with vLLM's classes (no engine) ------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_parts():
    pytest.importorskip("vllm")
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from engine.sinks.spec import SinkWindowManager, from_full

    def make(window, sinks, pool=256, in_flight=64):
        full = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=64,
                                 dtype=torch.float32)
        spec = from_full(full, window, sinks, in_flight)
        block_pool = BlockPool(num_gpu_blocks=pool, enable_caching=False,
                               hash_block_size=BS)
        manager = SinkWindowManager(spec, block_pool=block_pool, enable_caching=False,
                                    kv_cache_group_id=0, scheduler_block_size=BS)
        return spec, block_pool, manager

    return make


@pytest.mark.parametrize("window,sinks", [(128, 16), (128, 0), (96, 32)])
def test_manager_frees_the_gap_and_never_a_block_still_read(vllm_parts, window, sinks):
    spec, pool, manager = vllm_parts(window, sinks)
    free_at_start = pool.get_num_free_blocks()
    bound = -(-sinks // BS) + -(-window // BS) + 1
    mask = kept_key_mask(1200, window, sinks, BS)
    # A 100-token prompt in one chunk, then decode: free on the processed basis, then allocate.
    processed, step = 0, 100
    while processed < 1200:
        manager.remove_skipped_blocks("r", processed)
        n = min(processed + step, 1200)
        manager.allocate_new_blocks("r", n, n)
        blocks = manager.req_to_blocks["r"]
        live = {j for j, b in enumerate(blocks) if not b.is_null}
        needed = {int(k) // BS for p in range(processed, n) for k in np.flatnonzero(mask[p])}
        assert needed <= live, (processed, sorted(needed - live))
        if processed >= 100:
            assert len(live) <= bound, (processed, len(live))
        assert free_at_start - pool.get_num_free_blocks() == len(live)
        processed, step = n, 1
    manager.free("r")
    assert pool.get_num_free_blocks() == free_at_start


def _live_blocks(manager, request_id):
    return {j for j, b in enumerate(manager.req_to_blocks[request_id]) if not b.is_null}


def _decode(manager, request_id, start, end, window, carried):
    """Decode one token at a time from `start` to `end`, checking that every key the worker
    will read (same rule: carried sinks and frontier) is resident."""
    sinks, frontier = carried
    mask = kept_key_mask(end, window, 0, BS, sink_blocks=sinks, frontier=frontier)
    for processed in range(start, end):
        manager.remove_skipped_blocks(request_id, processed)
        manager.allocate_new_blocks(request_id, processed + 1, processed + 1)
        needed = {int(k) // BS for k in np.flatnonzero(mask[processed])}
        assert needed <= _live_blocks(manager, request_id), processed


def test_manager_changes_window_and_sinks_live(vllm_parts):
    spec, pool, manager = vllm_parts(128, 32, pool=512)
    free_at_start = pool.get_num_free_blocks()
    _decode(manager, "a", 0, 600, 128, (1, 0))
    before = len(_live_blocks(manager, "a"))
    assert before <= 1 + 4 + 1

    # Shrink W and drop the sinks: blocks go at once, before the request's next step.
    carried = manager.set_policy(64, 0)
    after = _live_blocks(manager, "a")
    assert 0 not in after and len(after) <= 64 // BS + 1 < before
    sinks, frontier = carried["a"]
    assert sinks == 0 and 0 < frontier <= min(after)
    _decode(manager, "a", 600, 700, 64, carried["a"])

    # Grow W and bring sinks back: "a" cannot get freed blocks back; its window refills as
    # tokens arrive, up to the new bound. A request opened now gets the new setting whole.
    carried = manager.set_policy(256, 32)
    assert carried["a"][0] == 0 and carried["a"][1] > 600 // BS
    grown = []
    for stop in range(720, 1100, 20):
        _decode(manager, "a", stop - 20 if stop > 720 else 700, stop, 256, carried["a"])
        grown.append(len(_live_blocks(manager, "a")))
    full = grown.index(max(grown))
    assert grown[0] <= 64 // BS + 2 and max(grown) == 256 // BS + 1
    assert grown[:full] == sorted(grown[:full]) and full >= 5  # filled gradually, not at once
    _decode(manager, "b", 0, 400, 256, (1, 0))
    assert 0 in _live_blocks(manager, "b")
    resident = len(_live_blocks(manager, "a")) + len(_live_blocks(manager, "b"))
    assert free_at_start - pool.get_num_free_blocks() == resident
    assert manager.max_admission_blocks_per_request == dataclasses.replace(
        spec, window_tokens=256).max_admission_blocks_per_request(spec.in_flight_tokens, 2**62)
    manager.free("a")
    manager.free("b")
    assert pool.get_num_free_blocks() == free_at_start and not manager._carried


def test_spec_bounds_memory_by_window_not_model_length(vllm_parts):
    spec, _, manager = vllm_parts(128, 32, in_flight=256)
    blocks = spec.max_admission_blocks_per_request(max_in_flight_tokens=256, max_model_len=8192)
    assert blocks == 1 + -(-(127 + 256) // BS) + 1
    assert manager.max_admission_blocks_per_request == blocks
    merged = type(spec).merge([spec, spec])
    assert merged == spec
    with pytest.raises(AssertionError):
        type(spec).merge([spec, vllm_parts(128, 0)[0]])


def test_metadata_compaction_rewrites_rows_only(vllm_parts):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from engine.sinks.metadata import compact

    qsl = torch.tensor([0, 1, 65], dtype=torch.int32)
    lens = torch.tensor([500, 300], dtype=torch.int32)
    table = _table(2, 20)
    common = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=lens, num_reqs=2,
        num_actual_tokens=65, max_query_len=64, max_seq_len=500, block_table_tensor=table,
        slot_mapping=torch.zeros(65, dtype=torch.int64))
    out = compact(common, 128, 1, BS)
    rows = split_rows(qsl.numpy(), lens.numpy(), 128, 1, BS)
    assert out.num_reqs == rows.num_rows > 2
    assert out.query_start_loc.tolist() == rows.query_start_loc.tolist()
    assert out.seq_lens.tolist() == rows.seq_lens.tolist()
    assert out.max_seq_len == int(rows.seq_lens.max()) and out.max_query_len < 64
    assert out.slot_mapping is common.slot_mapping and out.num_actual_tokens == 65
    assert out.seq_lens.dtype == torch.int32 and out.block_table_tensor.dtype == torch.int32
    short = common.replace(seq_lens=torch.tensor([100, 80], dtype=torch.int32), max_seq_len=100)
    assert compact(short, 128, 1, BS) is short  # no gap yet: untouched


def test_vllm_metadata_classes_are_exactly_the_classified_ones():
    pytest.importorskip("vllm")
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

    from engine.sinks import metadata

    # Fails when vLLM adds (or drops) a field: classify it in engine/sinks/metadata.py.
    assert metadata.field_mismatch(CommonAttentionMetadata, metadata.COMMON_FIELDS) is None
    assert metadata.field_mismatch(FlashAttentionMetadata, metadata.FLASH_ATTN_FIELDS) is None
    assert metadata.field_mismatch(CPUAttentionMetadata, metadata.CPU_ATTN_FIELDS) is None


def test_compaction_recuts_every_per_request_field(vllm_parts):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from engine.sinks.metadata import ROWS_FIELDS, compact

    qsl = torch.tensor([0, 1, 65], dtype=torch.int32)
    lens = torch.tensor([500, 300], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=lens, num_reqs=2,
        num_actual_tokens=65, max_query_len=64, max_seq_len=500,
        block_table_tensor=_table(2, 20), slot_mapping=torch.zeros(65, dtype=torch.int64),
        seq_lens_cpu_upper_bound=lens.clone(), is_prefilling=torch.tensor([False, True]),
        req_idx=np.array([7, 9]))
    out = compact(common, 128, 1, BS)
    rows = split_rows(qsl.numpy(), lens.numpy(), 128, 1, BS)
    for name in ROWS_FIELDS - {"num_reqs", "max_query_len", "max_seq_len"}:
        assert len(getattr(out, name)) == rows.num_rows + (name.startswith("query_start")), name
    assert rows.num_rows > 2 and out.num_reqs == rows.num_rows
    assert out.req_idx.tolist() == [7] + [9] * (rows.num_rows - 1)
    assert out.is_prefilling.tolist() == [False] + [True] * (rows.num_rows - 1)
    assert out.seq_lens_cpu_upper_bound.tolist() == rows.seq_lens.tolist()
    with pytest.raises(NotImplementedError, match="rswa_prefix_lens"):
        compact(common.replace(rswa_prefix_lens=lens), 128, 1, BS)


def test_the_sinks_mode_travels_in_the_engine_config_not_the_environment():
    import json
    import os
    from pathlib import Path
    from types import SimpleNamespace

    from engine.config import EngineConfig
    from engine.contract import KVPolicy
    from engine.sinks import KEY, additional_config, policy_in
    from engine.vllm_args import engine_args

    def config(extra):
        return SimpleNamespace(additional_config=extra)

    for window, sinks in ((128, 32), (128, 0)):  # a window without sinks still runs the mode
        extra = additional_config(KVPolicy("window", window, sinks))
        json.dumps(extra, sort_keys=True)  # vLLM hashes it as JSON into its compile cache key
        assert policy_in(config(extra)) == KVPolicy("window", window, sinks)
    assert additional_config(KVPolicy()) == {} and policy_in(config({})) is None
    for sinks in (128, 200, -1):  # 0 ≤ S < W, KVPolicy's rule, naming the entry
        with pytest.raises(ValueError, match=f"additional_config\\['{KEY}'\\]"):
            policy_in(config({KEY: {"window_tokens": 128, "sink_tokens": sinks}}))
    # The engine arguments carry it (beside an operator's own entries, never instead of W/S).
    cfg = EngineConfig(pool_blocks=64, policy=KVPolicy("window", 128, 32),
                       vllm_args=(("additional_config", {"other": 1}),))
    args = engine_args(cfg, "m", 1024, on_cpu=True)
    assert args["additional_config"] == {KEY: {"window_tokens": 128, "sink_tokens": 32},
                                         "other": 1}
    assert "additional_config" not in engine_args(EngineConfig(), "m", 1024, on_cpu=True)
    with pytest.raises(ValueError, match="--window W --sinks S"):
        engine_args(EngineConfig(vllm_args=(("additional_config", {KEY: {}}),)), "m", 1024,
                    on_cpu=True)
    # Nothing between the runtime and vLLM's processes reads or writes W/S in the environment.
    root = Path(__file__).resolve().parents[2]
    for path in (root / "engine").rglob("*.py"):
        text = path.read_text()
        for old in ("METRONOME_WINDOW_TOKENS", "METRONOME_SINK_TOKENS",
                    "METRONOME_AUDIO_MEL_FRAMES"):
            assert old not in text, f"{path.relative_to(root)} names {old}"
    assert not [k for k in os.environ if k.startswith(("METRONOME_WINDOW", "METRONOME_SINK_T"))]


def test_a_policy_has_one_label_and_reads_back_from_it():
    from engine.contract import KVPolicy

    for policy, label in ((KVPolicy(), "unbounded"),
                          (KVPolicy("window", 128, 32), "window W=128 S=32"),
                          (KVPolicy("window", 64), "window W=64 S=0")):
        assert policy.label == label and KVPolicy.from_label(label) == policy
    with pytest.raises(ValueError, match="must be smaller than the window"):
        KVPolicy.from_label("window W=64 S=64")  # read back through the one check
    with pytest.raises(ValueError, match="'bounded' is not 'unbounded' or 'window W="):
        KVPolicy.from_label("bounded")


def test_workers_that_cannot_follow_a_change_are_found_before_anything_moves():
    from types import SimpleNamespace

    from engine.sinks.live import check_in_worker

    bare = SimpleNamespace(worker=SimpleNamespace(model_runner=SimpleNamespace(attn_groups=[])))
    assert "no sinks + window metadata builders" in check_in_worker(bare)
    assert "no sinks" in check_in_worker(SimpleNamespace())


def test_a_named_runner_gives_builders_each_rows_carry_during_its_build_only():
    from engine.sinks.live import Carried, LiveSetting, row_carry
    from engine.sinks.rows import name_batch_rows, row_req_ids

    from engine.contract import KVPolicy

    setting = LiveSetting(KVPolicy("window", 128, 32), {"b": Carried(0, 9)})
    seen = []

    class Runner:
        def __init__(self):
            self.input_batch = type("Batch", (), {"req_ids": ["a", "b", "c"]})()

        def _build_attention_metadata(self, num_reqs):
            seen.append(row_carry(setting, num_reqs, 1))
            return "metadata"

    with pytest.raises(NotImplementedError):  # a carried request and no row names: refused
        Runner()._build_attention_metadata(3)
    name_batch_rows(Runner)
    name_batch_rows(Runner)  # idempotent: one wrapper
    assert Runner()._build_attention_metadata(3) == "metadata"
    sinks, front = seen[-1]
    assert sinks.tolist() == [1, 0, 1] and front.tolist() == [0, 9, 0]
    assert row_req_ids() is None  # only while a build runs


def test_sinks_modules_import_each_other_one_way():
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "engine" / "sinks"
    graph = {}
    for path in folder.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[path.stem] = {n.rsplit(".", 1)[1] for n in names
                            if n.startswith("engine.sinks.")} - {path.stem}

    def reaches(start, target, seen=()):
        return any(n == target or (n not in seen and reaches(n, target, (*seen, n)))
                   for n in graph.get(start, ()))

    cycles = sorted(m for m in graph if reaches(m, m))
    assert not cycles, {m: graph[m] for m in cycles}
    assert "plugin" not in graph["live"]
