"""`vllm.general_plugins` entry point: wires sinks + window KV into every vLLM process.

vLLM runs general plugins once per process (front end, engine core, workers). `register` is
idempotent and installs three hooks that act only when the engine asked for sinks:

1. the KV-spec registry learns SinkWindowSpec → SinkWindowManager (engine core: the scheduler's
   KV manager frees the gap blocks);
2. `Attention.get_kv_cache_spec` returns a SinkWindowSpec for full-attention decoder layers
   while METRONOME_WINDOW_TOKENS / METRONOME_SINK_TOKENS are set (read at call time, so forked
   children and several engines in one process each see their own engine's setting);
3. the CPU (and, on CUDA, FlashAttention) metadata builder compacts block tables for groups
   whose spec is a SinkWindowSpec, and is a pass-through for every other group;
4. live W/S (`engine.sinks.live`): `EngineCore.metronome_set_sinks`, a utility method the
   front end calls; the first change also makes the runner name each batch row's request.
"""

from __future__ import annotations

import functools
import logging

from engine.sinks import configured

logger = logging.getLogger(__name__)

_MARK = "_metronome_sinks"


def register() -> None:
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from engine.sinks.spec import SinkWindowManager, SinkWindowSpec

    # vLLM registers its built-in specs lazily, only while the registry is empty; registering
    # ours first would leave it without them. The built-in registration is idempotent.
    register_all_kvcache_specs(None)
    KVCacheSpecRegistry.register(SinkWindowSpec, SinkWindowManager,
                                 uniform_type_base_spec=FullAttentionSpec)
    _patch_attention_spec()
    _patch_cpu_builder()
    _patch_flash_builder()
    _patch_live_setting()


def _already(obj, name: str) -> bool:
    return getattr(getattr(obj, name), _MARK, False)


def _patch_attention_spec() -> None:
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from engine.sinks.spec import from_full

    if _already(Attention, "get_kv_cache_spec"):
        return
    original = Attention.get_kv_cache_spec

    @functools.wraps(original)
    def get_kv_cache_spec(self, vllm_config):
        spec = original(self, vllm_config)
        setting = configured()
        # Only plain full attention turns into sinks + window (exact type: subclasses such as
        # MLA or R-SWA carry their own semantics; a native sliding window keeps its own path).
        if setting is None or type(spec) is not FullAttentionSpec:
            return spec
        window, sinks = setting
        return from_full(spec, window, sinks, vllm_config.max_in_flight_tokens)

    setattr(get_kv_cache_spec, _MARK, True)
    Attention.get_kv_cache_spec = get_kv_cache_spec


def _compacting(original):
    """Wrap a builder's `build` so sinks groups see compacted metadata; others pass through."""
    from engine.sinks import live
    from engine.sinks.metadata import compact
    from engine.sinks.spec import SinkWindowSpec

    @functools.wraps(original)
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        spec = self.kv_cache_spec
        if isinstance(spec, SinkWindowSpec):
            # A live change overrides the spec's start-up values (see engine.sinks.live).
            setting = getattr(self, live.BUILDER_ATTR, None)
            if setting is None:
                window, sinks, frontier = spec.window_tokens, spec.sink_blocks, 0
            else:
                window = setting.window_tokens
                sinks, frontier = live.row_carry(setting, common_attn_metadata.num_reqs,
                                                 -(-setting.sink_tokens // spec.block_size))
            common_attn_metadata = compact(common_attn_metadata, window, sinks,
                                           spec.block_size, frontier)
            # A shared prefix across requests (cascade attention) is computed on the
            # uncompacted tables; prefix caching is off for sessions, so it is 0 anyway.
            common_prefix_len = 0
        return original(self, common_prefix_len, common_attn_metadata, fast_build)

    setattr(build, _MARK, True)
    return build


def _patch_live_setting() -> None:
    """Live W/S: the engine core's utility method (the workers' side is installed by the first
    change itself, see `live.apply_in_worker`)."""
    from vllm.v1.engine.core import EngineCore

    from engine.sinks import live

    if not hasattr(EngineCore, "metronome_set_sinks"):
        def metronome_set_sinks(self, window_tokens: int, sink_tokens: int) -> dict:
            return live.set_sinks_in_engine_core(self, window_tokens, sink_tokens)

        EngineCore.metronome_set_sinks = metronome_set_sinks


def _patch_cpu_builder() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder

    if not _already(CPUAttentionMetadataBuilder, "build"):
        CPUAttentionMetadataBuilder.build = _compacting(CPUAttentionMetadataBuilder.build)


def _patch_flash_builder() -> None:
    """FlashAttention's block-table path on CUDA, the same compaction.

    Why the same function is exact there: flash_attn_varlen_func with a block table reads, per
    row, keys [0, seqused_k) through `block_table[row]` and aligns queries causally to the row's
    end (query i of q attends keys ≤ seqused_k - q + i), exactly the CPU kernel's contract, so
    dropping gap blocks from the row and subtracting their tokens from seqused_k attends
    [sinks + window]; sub-rows add entries to cu_seqlens_q only. The builder's AOT scheduler
    metadata is recomputed from the compacted seq_lens by calling the original build.

    Not covered (refused rather than silently wrong): FULL CUDA graphs replay attention from the
    runner's persistent buffers, which these new tensors would bypass, so the engine must run
    attention outside graphs (cudagraph_mode PIECEWISE, or enforce_eager). Untested here: this
    machine has no GPU.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return
    try:
        from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder
    except ImportError:  # a build without FlashAttention: nothing to wrap
        logger.info("FlashAttention backend not importable; sinks compaction not installed")
        return
    if _already(FlashAttentionMetadataBuilder, "build"):
        return
    compacting = _compacting(FlashAttentionMetadataBuilder.build)

    @functools.wraps(compacting)
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        from engine.sinks.spec import SinkWindowSpec

        if isinstance(self.kv_cache_spec, SinkWindowSpec) and self.use_full_cuda_graph:
            raise NotImplementedError("sinks + window needs attention outside FULL CUDA graphs "
                                      "(cudagraph_mode PIECEWISE or enforce_eager)")
        return compacting(self, common_prefix_len, common_attn_metadata, fast_build)

    setattr(build, _MARK, True)
    FlashAttentionMetadataBuilder.build = build
