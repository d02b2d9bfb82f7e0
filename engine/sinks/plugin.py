"""`vllm.general_plugins` entry point: wires sinks + window KV into every vLLM process.

vLLM runs general plugins once per process (front end, engine core, workers), before it hands
any engine's configuration to them, so `register` cannot know which engine it will serve: it
installs hooks that each read the mode from the `VllmConfig` vLLM hands them
(`engine.sinks.config.policy_in`: the `metronome_sinks` entry of `additional_config`, which
travels pickled with the config to every process) and pass through when it is absent. An
unbounded engine's config has no entry, so its KV spec stays vLLM's FullAttentionSpec, no
builder compacts and no group is checked: vLLM's own path, unchanged. On a vLLM version the
plugin was not tested with (`engine.sinks.support`) nothing is installed; the front end
refuses a sinks engine there before it starts. Installed, idempotently:

1. the KV-spec registry learns SinkWindowSpec → SinkWindowManager (engine core: the scheduler's
   KV manager frees the gap blocks);
2. `Attention.get_kv_cache_spec` returns a SinkWindowSpec for full-attention decoder layers of
   an engine whose config asks for sinks (so several engines in one process each keep theirs);
3. the CPU builder (on CPU) or the FlashAttention builder (on CUDA) compacts block tables for
   groups whose spec is a SinkWindowSpec, and is a pass-through for every other group;
4. every sinks attention group is checked as its builders are made (a backend whose builder
   was not wrapped is refused before the first step: it would read freed blocks), and each of
   its builders gets the W and S it applies (`engine.sinks.live`: their one source in the
   worker from then on, replaced by live changes);
5. live W/S (`engine.sinks.live`): `EngineCore.metronome_set_sinks`, a utility method the
   front end calls, and `EngineCore.metronome_sinks_in_workers`, what the workers apply.
"""

from __future__ import annotations

import functools
import logging

from engine.sinks.config import policy_in

logger = logging.getLogger(__name__)

_MARK = "_metronome_sinks"


def register() -> None:
    from engine.sinks import support

    try:
        support.check_vllm_version()
    except support.SinksUnsupported as exc:
        # Not an error here: this process may only ever serve unbounded engines.
        logger.info("sinks + window hooks not installed: %s", exc)
        return

    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    from engine.sinks.spec import SinkWindowManager, SinkWindowSpec

    # vLLM registers its built-in specs lazily, only while the registry is empty; registering
    # ours first would leave it without them. Both registrations are idempotent.
    register_all_kvcache_specs(None)
    KVCacheSpecRegistry.register(SinkWindowSpec, SinkWindowManager,
                                 uniform_type_base_spec=FullAttentionSpec)
    _patch_attention_spec()
    _patch_builders()
    _patch_group_check()
    _patch_live_setting()


def _already(obj, name: str) -> bool:
    return getattr(getattr(obj, name), _MARK, False)


def sinks_spec(spec, vllm_config):
    """The KV spec a layer of the engine `vllm_config` belongs to gets: a SinkWindowSpec when
    its config asks for sinks + window and the layer is plain full attention, else vLLM's."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from engine.sinks.spec import from_full

    policy = policy_in(vllm_config)
    # Only plain full attention turns into sinks + window (exact type: subclasses such as
    # MLA or R-SWA carry their own semantics; a native sliding window keeps its own path).
    if policy is None or type(spec) is not FullAttentionSpec:
        return spec
    return from_full(spec, policy.window_tokens, policy.sink_tokens,
                     vllm_config.max_in_flight_tokens)


def _patch_attention_spec() -> None:
    from vllm.model_executor.layers.attention.attention import Attention

    if _already(Attention, "get_kv_cache_spec"):
        return
    original = Attention.get_kv_cache_spec

    @functools.wraps(original)
    def get_kv_cache_spec(self, vllm_config):
        return sinks_spec(original(self, vllm_config), vllm_config)

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
            # The builder's setting is W and S's one source in the worker: the start values
            # when the builder was made, each live change's after (see engine.sinks.live).
            setting = live.builder_setting(self)
            sinks, frontier = live.row_carry(setting, common_attn_metadata.num_reqs,
                                             -(-setting.policy.sink_tokens // spec.block_size))
            common_attn_metadata = compact(common_attn_metadata, setting.policy.window_tokens,
                                           sinks, spec.block_size, frontier)
            # A shared prefix across requests (cascade attention) is computed on the
            # uncompacted tables; prefix caching is off for sessions, so it is 0 anyway.
            common_prefix_len = 0
        return original(self, common_prefix_len, common_attn_metadata, fast_build)

    return build


def wrap_builder(builder_cls, output_cls, output_fields: dict[str, str],
                 common_cls=None) -> str | None:
    """Make `builder_cls.build` compact sinks groups. Leaves it alone, and returns why, when
    vLLM's metadata classes have fields the compaction does not classify (a sinks group it
    serves is then refused, see `support.group_refusal`). Idempotent."""
    from engine.sinks import support
    from engine.sinks.metadata import COMMON_FIELDS, field_mismatch

    if support.compacts(builder_cls):
        return None
    if common_cls is None:
        from vllm.v1.attention.backend import CommonAttentionMetadata as common_cls
    problem = field_mismatch(common_cls, COMMON_FIELDS) or \
        field_mismatch(output_cls, output_fields)
    if problem:
        support.note_not_wrapped(builder_cls.__name__, problem)
        return problem
    build = _compacting(builder_cls.build)
    support.mark_compacting(build)
    builder_cls.build = build
    return None


def _patch_builders() -> None:
    from vllm.platforms import current_platform

    from engine.sinks import metadata

    if current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import (CPUAttentionMetadata,
                                                         CPUAttentionMetadataBuilder)

        wrap_builder(CPUAttentionMetadataBuilder, CPUAttentionMetadata,
                     metadata.CPU_ATTN_FIELDS)
    elif current_platform.is_cuda():
        _patch_flash_builder()
    else:  # nothing wrapped: every sinks group is refused at start-up, naming its backend
        logger.warning("sinks + window: no compacting builder for platform %s",
                       type(current_platform).__name__)


def _patch_flash_builder() -> None:
    """FlashAttention's block-table path on CUDA, the same compaction.

    Why the same function is exact there: flash_attn_varlen_func with a block table reads, per
    row, keys [0, seqused_k) through `block_table[row]` and aligns queries causally to the row's
    end (query i of q attends keys ≤ seqused_k - q + i), exactly the CPU kernel's contract, so
    dropping gap blocks from the row and subtracting their tokens from seqused_k attends
    [sinks + window]; sub-rows add entries to cu_seqlens_q only. The builder's AOT scheduler
    metadata is recomputed from the compacted seq_lens by calling the original build. FULL CUDA
    graphs would replay uncompacted tables: refused at start-up (`support.group_refusal`).
    Driven on CPU with its real classes (tests/engine/test_sinks_support.py); on a GPU only by
    the tests marked `gpu` (scripts/gpu_check.sh).
    """
    from engine.sinks import metadata, support

    try:
        from vllm.v1.attention.backends.flash_attn import (FlashAttentionMetadata,
                                                           FlashAttentionMetadataBuilder)
    except ImportError as exc:  # refused at start-up by the group check, with this reason
        support.note_not_wrapped("FlashAttentionMetadataBuilder", f"not importable: {exc}")
        return
    wrap_builder(FlashAttentionMetadataBuilder, FlashAttentionMetadata,
                 metadata.FLASH_ATTN_FIELDS)


def check_groups(groups) -> None:
    """Refuse, in the worker, any sinks attention group that would not run exactly; give each
    builder of the others the start W and S of its spec."""
    from engine.sinks import live, support
    from engine.sinks.spec import SinkWindowSpec

    for group in groups:
        if not isinstance(group.kv_cache_spec, SinkWindowSpec):
            continue
        problem = support.group_refusal(group)
        if problem:
            support.record_refusal(problem)
            raise support.SinksUnsupported(problem)
        for builder in group.metadata_builders:
            # The runner reuses one group's metadata for another group of the same spec by
            # swapping in that group's (uncompacted) block table; sinks groups always build.
            builder.supports_update_block_table = False
            live.start_builder(builder)


def _patch_group_check() -> None:
    """Check each attention group as its metadata builders are made (both model runners make
    them through AttentionGroup), before any step builds attention metadata."""
    from vllm.v1.worker.utils import AttentionGroup

    if _already(AttentionGroup, "create_metadata_builders"):
        return
    original = AttentionGroup.create_metadata_builders

    @functools.wraps(original)
    def create_metadata_builders(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        check_groups([self])
        return result

    setattr(create_metadata_builders, _MARK, True)
    AttentionGroup.create_metadata_builders = create_metadata_builders


def _patch_live_setting() -> None:
    """Live W/S: the engine core's utility methods (the workers' side is installed by the first
    change itself, see `live.apply_in_worker`)."""
    from vllm.v1.engine.core import EngineCore

    from engine.sinks import live

    if not hasattr(EngineCore, "metronome_set_sinks"):
        def metronome_set_sinks(self, window_tokens: int, sink_tokens: int) -> dict:
            return live.set_sinks_in_engine_core(self, window_tokens, sink_tokens)

        EngineCore.metronome_set_sinks = metronome_set_sinks
    if not hasattr(EngineCore, "metronome_sinks_in_workers"):
        def metronome_sinks_in_workers(self) -> list:
            return self.collective_rpc(live.setting_in_worker)

        EngineCore.metronome_sinks_in_workers = metronome_sinks_in_workers
