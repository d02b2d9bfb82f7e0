"""Compaction applied to vLLM's CommonAttentionMetadata, shared by the CPU and CUDA builders.

Builders call their original `build` with the compacted copy, so everything they derive from
seq_lens (the CPU scheduler metadata, FlashAttention's AOT schedule) is recomputed for the new
rows. Token-level fields (slot_mapping, positions, logits indices) are untouched: new keys are
written through the runner's full block table, whose tail blocks are always live.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from engine.sinks.compaction import compact_block_table, split_rows

# Per-request fields we expand row by row; anything else per-request we cannot honour.
_UNSUPPORTED = ("dcp_local_seq_lens", "rswa_prefix_lens", "mm_req_doc_ranges",
                "encoder_seq_lens", "replayssm_decode_base_cpu")


def _host_seq_lens(common) -> np.ndarray:
    num_reqs = common.num_reqs
    if common.seq_lens.device.type == "cpu":
        return common.seq_lens[:num_reqs].numpy()
    # On CUDA, avoid a device sync: the host upper bound is exact outside async spec decode,
    # which sessions do not use.
    if common.seq_lens_cpu_upper_bound is not None:
        return common.seq_lens_cpu_upper_bound[:num_reqs].numpy()
    return common.seq_lens[:num_reqs].cpu().numpy()


def compact(common, window: int, sink_blocks, block_size: int, frontier=0):
    """Return `common` re-cut into sub-rows that read [sink blocks + window blocks] only.

    `sink_blocks` and `frontier` are scalars or one entry per request row (see
    `engine.sinks.live`). Returns the same object when no query of the batch has a gap yet.
    """
    for name in _UNSUPPORTED:
        if getattr(common, name, None) is not None:
            raise NotImplementedError(f"sinks + window with {name} set")
    if isinstance(common.causal, torch.Tensor) or not common.causal:
        raise NotImplementedError("sinks + window needs causal decoder attention")
    num_reqs = common.num_reqs
    qsl_cpu = common.query_start_loc_cpu[: num_reqs + 1]
    seq_lens = _host_seq_lens(common)
    rows = split_rows(qsl_cpu.numpy(), seq_lens, window, sink_blocks, block_size, frontier)
    if rows.num_rows == num_reqs and not rows.gap.any():
        return common

    device = common.seq_lens.device
    source = torch.from_numpy(rows.source)
    qsl = torch.from_numpy(rows.query_start_loc).to(qsl_cpu.dtype)
    lens = torch.from_numpy(rows.seq_lens).to(common.seq_lens.dtype)
    changes = dict(
        num_reqs=rows.num_rows,
        query_start_loc_cpu=qsl,
        query_start_loc=qsl.to(device, non_blocking=True),
        seq_lens=lens.to(device, non_blocking=True),
        max_query_len=int(rows.query_lens.max(initial=0)),
        max_seq_len=int(rows.seq_lens.max(initial=0)),
        block_table_tensor=compact_block_table(common.block_table_tensor[:num_reqs], rows),
        # Caches derived from the old rows must be rebuilt from the new ones.
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
    )
    if common.seq_lens_cpu_upper_bound is not None:
        changes["seq_lens_cpu_upper_bound"] = lens.clone()
    if common.is_prefilling is not None:
        changes["is_prefilling"] = common.is_prefilling[source.to(common.is_prefilling.device)]
    if common.req_idx is not None:
        changes["req_idx"] = np.asarray(common.req_idx)[rows.source]
    return dataclasses.replace(common, **changes)
