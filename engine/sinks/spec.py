"""The sinks + window KV cache spec and its manager (vLLM's KV-spec registry extension point).

The spec derives from FullAttentionSpec, so everything else in vLLM (runner, backend choice,
block-table layout) treats these layers as full attention; only the manager and the attention
metadata builder (see `metadata`) know about the gap.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from vllm.utils.math_utils import cdiv
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import FullAttentionSpec

from engine.sinks.compaction import first_window_block

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SinkWindowSpec(FullAttentionSpec):
    """Full-attention layout; a request keeps ceil(S/bs) sink blocks and the last W tokens."""

    window_tokens: int
    sink_tokens: int
    # The manager needs the scheduler's in-flight token bound for its admission cap, and is
    # built without the vLLM config, so the layer records it when it makes the spec.
    in_flight_tokens: int

    @property
    def sink_blocks(self) -> int:
        return cdiv(self.sink_tokens, self.block_size)

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int,
                                         max_model_len: int) -> int:
        """Most blocks one request holds: the sink blocks, the window's W - 1 older keys plus
        every token scheduled but not yet processed (gap blocks are freed on the processed
        basis), +1 because the window rarely starts on a block edge. Same reasoning as
        SlidingWindowSpec's bound, plus the sinks."""
        window_part = cdiv(self.window_tokens - 1 + max_in_flight_tokens, self.block_size) + 1
        return min(self.sink_blocks + window_part, cdiv(max_model_len, self.block_size))

    def max_memory_usage_bytes(self, vllm_config) -> int:
        # The inherited figure is max_model_len's worth of blocks: it would make vLLM refuse any
        # pool smaller than one full-length request, which bounded KV exists to avoid.
        blocks = self.max_admission_blocks_per_request(
            max_in_flight_tokens=vllm_config.max_in_flight_tokens,
            max_model_len=vllm_config.model_config.max_model_len)
        return blocks * self.page_size_bytes

    @classmethod
    def merge(cls, specs: list[SinkWindowSpec]) -> SinkWindowSpec:
        extra = {(s.window_tokens, s.sink_tokens, s.in_flight_tokens) for s in specs}
        if len(extra) != 1 or not all(isinstance(s, SinkWindowSpec) for s in specs):
            raise AssertionError(f"layers of one KV cache group disagree on sinks: {extra}")
        window, sinks, in_flight = extra.pop()
        base = FullAttentionSpec.merge(specs)
        return from_full(base, window, sinks, in_flight)


def from_full(spec: FullAttentionSpec, window_tokens: int, sink_tokens: int,
              in_flight_tokens: int) -> SinkWindowSpec:
    """The sinks spec with every field of a full-attention spec carried over."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(FullAttentionSpec)
              if f.init}
    return SinkWindowSpec(**fields, window_tokens=window_tokens, sink_tokens=sink_tokens,
                          in_flight_tokens=in_flight_tokens)


class SinkWindowManager(FullAttentionManager):
    """Frees the gap blocks between the sink blocks and the window, replacing them by the null
    block as SlidingWindowManager does for its head prefix.

    Only processed tokens count (vLLM passes the processed-token prefix): a query at position p
    reads from `first_window_block(p)` on, and every future query has p ≥ processed, so no
    block that attention may still read is ever freed. Resident blocks per request in decode:
    ceil(S/bs) + ceil(W/bs) + 1.

    W and S change live through `set_policy` (see `engine.sinks.live`); requests running at a
    change keep a `Carried` record that this manager and the workers' builders both honour.
    """

    def __init__(self, kv_cache_spec: SinkWindowSpec, **kwargs) -> None:
        # vLLM hands an admission cap only to the spec types it knows; ours has its own bound.
        kwargs["max_admission_blocks_per_request"] = _admission_cap(
            kv_cache_spec, kv_cache_spec.window_tokens, kv_cache_spec.sink_tokens)
        super().__init__(kv_cache_spec, **kwargs)
        self.window_tokens = kv_cache_spec.window_tokens
        self.sink_tokens = kv_cache_spec.sink_tokens
        self.sink_blocks = kv_cache_spec.sink_blocks
        self._carried: dict[str, tuple[int, int]] = {}  # request → (sink blocks, frontier)
        self._processed: dict[str, int] = {}  # request → processed tokens at the last free
        logger.info("sinks + window KV: W=%d, S=%d, block %d, at most %d blocks per request",
                    self.window_tokens, self.sink_tokens, self.block_size,
                    self.max_admission_blocks_per_request)

    def kept_range(self, request_id: str, processed_computed_tokens: int) -> tuple[int, int]:
        """(sink blocks, first window block) that request keeps for a query at `processed`."""
        sinks, frontier = self._carried.get(request_id, (self.sink_blocks, 0))
        first = int(first_window_block(processed_computed_tokens, self.window_tokens,
                                       self.block_size, frontier))
        return sinks, first

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        del num_prompt_tokens  # sinks are the first S tokens, not the prompt
        self._processed[request_id] = max(processed_computed_tokens,
                                          self._processed.get(request_id, 0))
        self._free_range(request_id, *self.kept_range(request_id, processed_computed_tokens))

    def _free_range(self, request_id: str, first_block: int, last_block: int) -> None:
        # vLLM's _remove_blocks_in_range stops at the first null block (a head prefix is freed
        # back to front); after S shrinks the gap has resident blocks below freed ones.
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        freed = []
        for i in range(first_block, min(last_block, len(blocks))):
            if blocks[i] is not self._null_block:
                freed.append(blocks[i])
                blocks[i] = self._null_block
        if freed:
            self.block_pool.free_blocks(freed)

    def free(self, request_id: str) -> None:
        self._carried.pop(request_id, None)
        self._processed.pop(request_id, None)
        super().free(request_id)

    def set_policy(self, window_tokens: int, sink_tokens: int) -> dict[str, tuple[int, int]]:
        """Switch to (W, S) between two engine steps. Blocks the new setting drops are freed at
        once (for each request, on the processed basis of its last step, so no scheduled step
        loses a block it reads). Returns {request: (sink blocks, frontier)} for the requests
        that lost blocks: what the workers must honour for them.
        """
        self.window_tokens = window_tokens
        self.sink_tokens = sink_tokens
        self.sink_blocks = cdiv(sink_tokens, self.block_size)
        self.max_admission_blocks_per_request = _admission_cap(
            self.kv_cache_spec, window_tokens, sink_tokens)
        carried: dict[str, tuple[int, int]] = {}
        for request_id, blocks in self.req_to_blocks.items():
            null = [i for i, b in enumerate(blocks) if b is self._null_block]
            if null:
                # Resident: the leading blocks before the first freed one, and everything
                # after the last freed one.
                carried[request_id] = (min(self.sink_blocks, null[0]), null[-1] + 1)
        self._carried = carried
        for request_id, processed in list(self._processed.items()):
            self.remove_skipped_blocks(request_id, processed)
        logger.info("sinks + window now W=%d S=%d; %d requests carry freed blocks",
                    window_tokens, sink_tokens, len(carried))
        return dict(carried)


def _admission_cap(spec: SinkWindowSpec, window_tokens: int, sink_tokens: int) -> int:
    return dataclasses.replace(spec, window_tokens=window_tokens, sink_tokens=sink_tokens)\
        .max_admission_blocks_per_request(max_in_flight_tokens=spec.in_flight_tokens,
                                          max_model_len=2**62)
