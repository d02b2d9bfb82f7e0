"""Block-table compaction for sinks + window attention: pure arithmetic, no vLLM.

A request keeps its first `sink_blocks = ceil(S / bs)` blocks and, for a query at absolute
position p, the window from block `max(0, p - W + 1) // bs` on (the block holding the oldest key
of the last W tokens). The blocks in between are the gap: the KV manager frees them and attention
must not read them. The stock kernels attend over a block table and a `seq_len`; dropping the gap
from the row and shortening `seq_len` by the gap's tokens makes them compute exactly
sinks + window. Keys carry their rotary position from when they were written, so shifting their
index in the row changes nothing else.

All queries of one row must see the same gap, so a chunk is split into sub-rows wherever its
first kept window block changes (metadata only: the kernel just sees more, shorter rows).

The gap is derived from (seq_len, query_len, W, S, bs) alone, never from block ids: the worker's
block-table rows keep the stale ids of freed blocks, which other requests reuse.

After a live change of W or S, a request that was running keeps what it still has: its sink
blocks can only shrink (freed blocks are gone) and its window cannot reach back past the last
block already freed (`frontier`); the window refills as tokens arrive. Both are per-row inputs
here, and the KV manager applies the same rule, so the two sides agree block for block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def first_window_block(position, window: int, block_size: int, frontier=0):
    """Block of the oldest key a query at `position` reads (scalar or array); never before
    `frontier`, the first block a live W change left resident."""
    return np.maximum(np.maximum(0, np.asarray(position) - window + 1) // block_size, frontier)


def gap_blocks(position, window: int, sink_blocks, block_size: int, frontier=0):
    """Blocks skipped between the sink blocks and the window for a query at `position`."""
    return np.maximum(0, first_window_block(position, window, block_size, frontier)
                      - sink_blocks)


@dataclass(frozen=True)
class SubRows:
    """A batch re-cut into rows that each see one gap. Arrays have one entry per sub-row."""

    source: np.ndarray  # index of the request row it came from
    gap: np.ndarray  # gap blocks skipped by this sub-row
    sink_blocks: np.ndarray  # leading blocks this sub-row keeps before the gap
    query_start_loc: np.ndarray  # len(source) + 1 token offsets, as the kernel takes them
    seq_lens: np.ndarray  # compacted: the row's last position + 1 minus the gap's tokens

    @property
    def num_rows(self) -> int:
        return len(self.source)

    @property
    def query_lens(self) -> np.ndarray:
        return np.diff(self.query_start_loc)


def split_rows(query_start_loc, seq_lens, window: int, sink_blocks, block_size: int,
               frontier=0) -> SubRows:
    """Split each request's chunk where its gap changes and compact every piece.

    `query_start_loc` has num_reqs + 1 entries, `seq_lens` num_reqs (tokens including this
    step's queries); `sink_blocks` and `frontier` are scalars or one entry per request. A row
    with no queries (padding) passes through unchanged.
    """
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    lens = np.asarray(seq_lens, dtype=np.int64)
    q = np.diff(qsl)
    sinks = np.broadcast_to(np.asarray(sink_blocks, dtype=np.int64), q.shape)
    front = np.broadcast_to(np.asarray(frontier, dtype=np.int64), q.shape)
    first_pos = lens - q  # absolute position of the chunk's first query
    last_pos = lens - 1
    active = q > 0
    gap_first = np.where(active, gap_blocks(first_pos, window, sinks, block_size, front), 0)
    gap_last = np.where(active, gap_blocks(last_pos, window, sinks, block_size, front), 0)
    if q.max(initial=0) <= 1:  # decode-only batch (the hot path): one piece per request
        return SubRows(source=np.arange(len(q)), gap=gap_last, sink_blocks=sinks.copy(),
                       query_start_loc=qsl, seq_lens=lens - gap_last * block_size)
    # The window's first block max(fwb(p), frontier) rises one block at a time as p crosses
    # W - 1 + k·bs, so every gap value in between occurs: one piece per value. Past the first
    # piece the frontier no longer binds, so the positions where the gap grows are the same as
    # without one.
    pieces = gap_last - gap_first + 1
    source = np.repeat(np.arange(len(q)), pieces)
    j = np.arange(len(source)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    gap = gap_first[source] + j
    # First position whose gap is g > 0: the window's first block is sink_blocks + g.
    gap_start = (sinks[source] + gap) * block_size + window - 1
    start = np.where(j == 0, first_pos[source], gap_start)
    is_last = j == pieces[source] - 1
    end = np.where(is_last, last_pos[source], gap_start + block_size - 1)
    offsets = qsl[source] + (start - first_pos[source])
    new_qsl = np.append(offsets, qsl[-1])
    new_seq_lens = np.where(active[source], end + 1 - gap * block_size, lens[source])
    return SubRows(source=source, gap=gap, sink_blocks=sinks[source], query_start_loc=new_qsl,
                   seq_lens=new_seq_lens)


def compact_block_table(block_table: torch.Tensor, rows: SubRows) -> torch.Tensor:
    """A new table, one row per sub-row: [sink blocks | window blocks shifted left by the gap].

    Entries past a row's compacted length are leftovers the kernel never reads (it reads
    ceil(seq_len / bs) entries). The input is never written to: it is the runner's buffer.
    """
    width = block_table.shape[1]
    device = block_table.device
    source = torch.from_numpy(rows.source).to(device)
    gap = torch.from_numpy(rows.gap).to(device)
    sinks = torch.from_numpy(np.ascontiguousarray(rows.sink_blocks)).to(device)
    cols = torch.arange(width, device=device).unsqueeze(0)
    shifted = torch.where(cols < sinks.unsqueeze(1), cols,
                          cols + gap.unsqueeze(1)).clamp_(max=width - 1)
    return torch.gather(block_table.index_select(0, source), 1, shifted)


def kept_key_mask(num_tokens: int, window: int, sink_tokens: int, block_size: int,
                  sink_blocks: int | None = None, frontier: int = 0) -> np.ndarray:
    """[query, key] bool: the keys the design keeps for each query of a sequence of length n.

    The reference for tests: causal, the sink blocks, and the window from its first kept block
    (`sink_blocks` and `frontier` as a request carries them through a live change).
    """
    if sink_blocks is None:
        sink_blocks = -(-sink_tokens // block_size)
    p = np.arange(num_tokens)[:, None]
    k = np.arange(num_tokens)[None, :]
    window_from = first_window_block(p, window, block_size, frontier) * block_size
    return (k <= p) & ((k < sink_blocks * block_size) | (k >= window_from))
