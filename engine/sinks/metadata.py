"""Compaction applied to vLLM's CommonAttentionMetadata, shared by the CPU and CUDA builders.

Builders call their original `build` with the compacted copy, so everything they derive from
seq_lens (the CPU scheduler metadata, FlashAttention's AOT schedule) is recomputed for the new
rows. Token-level fields (slot_mapping, positions, logits indices) are untouched: new keys are
written through the runner's full block table, whose tail blocks are always live.

Every field of the metadata classes involved is classified below (an allow-list, not a list of
known exceptions): a release of vLLM that adds a per-request field would otherwise keep the old
row count in it and go unnoticed. The plugin wraps a builder only while the classes' fields
are exactly the classified ones (`field_mismatch`); otherwise sinks runs are refused.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from engine.sinks.compaction import compact_block_table, split_rows

# How a field of CommonAttentionMetadata goes through compaction.
ROWS = "per-request: re-cut into the sub-rows here"
KEPT = "per-token or batch-wide: the same after the re-cut"
RESET = "cache derived from the rows: cleared so the builder recomputes it"
UNSET = "per-request input this compaction cannot re-cut: refused when set"

COMMON_FIELDS = {
    "query_start_loc": ROWS,
    "query_start_loc_cpu": ROWS,
    "seq_lens": ROWS,
    "num_reqs": ROWS,
    "max_query_len": ROWS,
    "max_seq_len": ROWS,
    "block_table_tensor": ROWS,
    "seq_lens_cpu_upper_bound": ROWS,
    "is_prefilling": ROWS,
    "req_idx": ROWS,
    "num_actual_tokens": KEPT,
    "slot_mapping": KEPT,
    "positions": KEPT,
    "causal": KEPT,  # and must be plain causal (checked in `compact`)
    "_num_computed_tokens_cache": RESET,
    "_token_to_req_indices_cache": RESET,
    # KV-sharing fast prefill re-indexes logits per request; encoder, DCP, R-SWA, multimodal
    # prefix-LM and ReplaySSM state are per request and meaningless for a sub-row.
    "logits_indices_padded": UNSET,
    "num_logits_indices": UNSET,
    "max_logits_per_req": UNSET,
    "encoder_seq_lens": UNSET,
    "encoder_seq_lens_cpu": UNSET,
    "dcp_local_seq_lens": UNSET,
    "dcp_local_seq_lens_cpu_upper_bound": UNSET,
    "mm_req_doc_ranges": UNSET,
    "rswa_prefix_lens": UNSET,
    "replayssm_decode_base_cpu": UNSET,
}

# What the wrapped builders make from the compacted input. FROM_INPUT: derived by the original
# build from the (compacted) CommonAttentionMetadata alone. Per-request state the builder would
# take from elsewhere exists only with an UNSET input above set (DCP, R-SWA, multimodal ranges).
FROM_INPUT = "derived from the compacted input"
ONLY_WITH_UNSET = "only with an UNSET input (refused above)"

FLASH_ATTN_FIELDS = {
    "num_actual_tokens": FROM_INPUT,
    "max_query_len": FROM_INPUT,
    "query_start_loc": FROM_INPUT,
    "max_seq_len": FROM_INPUT,
    "seq_lens": FROM_INPUT,
    "block_table": FROM_INPUT,
    "slot_mapping": FROM_INPUT,
    "scheduler_metadata": FROM_INPUT,  # FA3's AOT schedule, from the compacted seq_lens
    "max_num_splits": FROM_INPUT,
    "causal": FROM_INPUT,
    "max_dcp_context_kv_len": ONLY_WITH_UNSET,
    "dcp_context_kv_lens": ONLY_WITH_UNSET,
    "num_decode_reqs": ONLY_WITH_UNSET,
    "num_prefill_reqs": ONLY_WITH_UNSET,
    "num_decode_tokens": ONLY_WITH_UNSET,
    "num_prefill_tokens": ONLY_WITH_UNSET,
    "mm_prefix_query_range_tensor": ONLY_WITH_UNSET,
    "rswa_prefix_lens": ONLY_WITH_UNSET,
    "rswa_window": ONLY_WITH_UNSET,
    "rswa_window_tensor": ONLY_WITH_UNSET,
}

CPU_ATTN_FIELDS = {
    "num_actual_tokens": FROM_INPUT,
    "max_query_len": FROM_INPUT,
    "query_start_loc": FROM_INPUT,
    "max_seq_len": FROM_INPUT,
    "seq_lens": FROM_INPUT,
    "block_table": FROM_INPUT,
    "slot_mapping": FROM_INPUT,
    "scheduler_metadata": FROM_INPUT,
    "causal": FROM_INPUT,
    "dynamic_causal": ONLY_WITH_UNSET,  # per-request causal tensor: refused in `compact`
    "use_sdpa_prefill": FROM_INPUT,
    "num_decode_tokens": FROM_INPUT,
    "sdpa_attn_masks": FROM_INPUT,
    "sdpa_start_loc": FROM_INPUT,
    "encoder_cache": ONLY_WITH_UNSET,
}


ROWS_FIELDS = frozenset(name for name, role in COMMON_FIELDS.items() if role == ROWS)
RESET_FIELDS = frozenset(name for name, role in COMMON_FIELDS.items() if role == RESET)
UNSET_FIELDS = tuple(name for name, role in COMMON_FIELDS.items() if role == UNSET)


def field_mismatch(cls, known: dict[str, str]) -> str | None:
    """Why `cls`'s dataclass fields are not exactly the classified ones, or None."""
    names = {f.name for f in dataclasses.fields(cls)}
    new, gone = sorted(names - known.keys()), sorted(known.keys() - names)
    if not new and not gone:
        return None
    parts = ([f"new unclassified field(s) {', '.join(new)}"] if new else []) + \
        ([f"field(s) {', '.join(gone)} no longer there"] if gone else [])
    return f"vLLM's {cls.__name__} changed: {'; '.join(parts)}"


def _host_seq_lens(common) -> np.ndarray:
    num_reqs = common.num_reqs
    if common.seq_lens.device.type == "cpu":
        return common.seq_lens[:num_reqs].numpy()
    # On CUDA, avoid a device sync: the host upper bound is exact outside async spec decode,
    # which sessions do not use.
    if common.seq_lens_cpu_upper_bound is not None:
        return common.seq_lens_cpu_upper_bound[:num_reqs].numpy()
    return common.seq_lens[:num_reqs].cpu().numpy()


def _recut(common, rows) -> dict:
    """The ROWS fields of `common` for the sub-rows (one entry per ROWS field)."""
    device = common.seq_lens.device
    qsl = torch.from_numpy(rows.query_start_loc).to(common.query_start_loc_cpu.dtype)
    lens = torch.from_numpy(rows.seq_lens).to(common.seq_lens.dtype)

    def by_source(values):  # a per-request array or tensor, one entry per sub-row
        if values is None:
            return None
        if isinstance(values, torch.Tensor):
            return values[torch.from_numpy(rows.source).to(values.device)]
        return np.asarray(values)[rows.source]

    return dict(
        num_reqs=rows.num_rows,
        query_start_loc_cpu=qsl,
        query_start_loc=qsl.to(device, non_blocking=True),
        seq_lens=lens.to(device, non_blocking=True),
        max_query_len=int(rows.query_lens.max(initial=0)),
        max_seq_len=int(rows.seq_lens.max(initial=0)),
        block_table_tensor=compact_block_table(common.block_table_tensor[:common.num_reqs],
                                               rows),
        seq_lens_cpu_upper_bound=None if common.seq_lens_cpu_upper_bound is None
        else lens.clone(),
        is_prefilling=by_source(common.is_prefilling),
        req_idx=by_source(common.req_idx),
    )


def compact(common, window: int, sink_blocks, block_size: int, frontier=0):
    """Return `common` re-cut into sub-rows that read [sink blocks + window blocks] only.

    `sink_blocks` and `frontier` are scalars or one entry per request row (see
    `engine.sinks.live`). Returns the same object when no query of the batch has a gap yet.
    """
    for name in UNSET_FIELDS:
        if getattr(common, name, None) is not None:
            raise NotImplementedError(f"sinks + window with {name} set")
    if isinstance(common.causal, torch.Tensor) or not common.causal:
        raise NotImplementedError("sinks + window needs causal decoder attention")
    num_reqs = common.num_reqs
    qsl_cpu = common.query_start_loc_cpu[: num_reqs + 1]
    rows = split_rows(qsl_cpu.numpy(), _host_seq_lens(common), window, sink_blocks,
                      block_size, frontier)
    if rows.num_rows == num_reqs and not rows.gap.any():
        return common
    changes = _recut(common, rows)
    # By construction: every per-request field is re-cut, none is left with the old rows.
    assert changes.keys() == ROWS_FIELDS, sorted(changes.keys() ^ ROWS_FIELDS)
    changes.update(dict.fromkeys(RESET_FIELDS))
    return dataclasses.replace(common, **changes)

