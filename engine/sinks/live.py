"""Changing W and S while sessions run: one setting, applied at the same step boundary in the
engine core (the KV manager) and in every worker (the metadata builder).

In a worker, W and S have one source: the `LiveSetting` on each sinks metadata builder. It is
made from the KV spec (the engine config's start values, `engine.sinks.config`) when the
builder is made, and replaced whole by each change; `build` reads nothing else.

Shape of a change (front end → engine core → workers):

    AsyncLLM.engine_core.call_utility_async("metronome_set_sinks", W, S)
      EngineCore.metronome_set_sinks        runs between two engine steps (busy loop)
        SinkWindowManager.set_policy        frees what the new setting drops, at once, and
                                            returns what each running request still holds
        collective_rpc(apply_in_worker)     queued behind every step already scheduled, so
                                            each step is built with the setting it was
                                            scheduled under

A request that was running keeps `Carried(sink_blocks, frontier)`: freed blocks never come back,
so its sinks only shrink and its window starts no earlier than the first block still resident;
both sides compute the same kept set from these, so no step reads a freed block. Requests
that start later use the new setting whole. The carried map only holds requests that were
running at the last change, so it stays bounded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from engine.contract import KVPolicy

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Carried:
    """What a request running at a change still holds: its first `sink_blocks` blocks and every
    block from `frontier_block` on."""

    sink_blocks: int
    frontier_block: int


@dataclass(frozen=True)
class LiveSetting:
    """What a worker's builders apply: the policy (W, S) and what running requests carry."""

    policy: KVPolicy
    carried: dict[str, Carried] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy.kind != "window":
            raise ValueError(f"a sinks builder applies a window policy, not {self.policy.label}")


def row_carry(setting: LiveSetting, num_reqs: int, sink_blocks: int):
    """Per-row (sink_blocks, frontier) for the batch being built, or scalars when no row
    carries anything from before a change."""
    import numpy as np

    from engine.sinks.rows import row_req_ids

    if not setting.carried:
        return sink_blocks, 0
    req_ids = row_req_ids()
    if req_ids is None:
        raise NotImplementedError("sinks + window after a live change needs the runner's row "
                                  "request ids (model runner hook not installed)")
    sinks = np.full(num_reqs, sink_blocks, dtype=np.int64)
    front = np.zeros(num_reqs, dtype=np.int64)
    for row, req_id in enumerate(req_ids[:num_reqs]):
        kept = setting.carried.get(req_id)
        if kept is not None:
            sinks[row], front[row] = kept.sink_blocks, kept.frontier_block
    return sinks, front


# The setting lives on the metadata builders of one engine's runner (not in a module global:
# tests run several in-process engines one after another in one process).
BUILDER_ATTR = "_metronome_live_setting"


def start_builder(builder) -> None:
    """A sinks builder, as it is made: its setting is its spec's start W and S."""
    spec = builder.kv_cache_spec
    setattr(builder, BUILDER_ATTR,
            LiveSetting(KVPolicy("window", spec.window_tokens, spec.sink_tokens)))


def builder_setting(builder) -> LiveSetting:
    setting = getattr(builder, BUILDER_ATTR, None)
    if setting is None:  # made outside AttentionGroup: it would not know its W and S
        raise AssertionError(f"{type(builder).__name__} serves sinks + window but was not "
                             "made through AttentionGroup.create_metadata_builders")
    return setting


def _sinks_groups(worker):
    import itertools

    from engine.sinks.spec import SinkWindowSpec

    # vLLM hands either the worker or its wrapper (which holds it as `.worker`).
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
    groups = itertools.chain.from_iterable(getattr(runner, "attn_groups", None) or [])
    return runner, [g for g in groups if isinstance(g.kv_cache_spec, SinkWindowSpec)]


def _runner_and_builders(worker):
    runner, groups = _sinks_groups(worker)
    return runner, [b for group in groups for b in group.metadata_builders]


def check_in_worker(worker) -> str | None:
    """collective_rpc target run before a change: why this worker cannot take one, or None."""
    from engine.sinks.support import group_refusal

    runner, groups = _sinks_groups(worker)
    if not any(group.metadata_builders for group in groups):
        return "no sinks + window metadata builders in this worker"
    if not hasattr(type(runner), "_build_attention_metadata"):
        return f"{type(runner).__name__} has no _build_attention_metadata to name batch rows"
    # Checked at start-up too; again here because a change is where carried rows start to
    # depend on every builder honouring them.
    return next((p for p in map(group_refusal, groups) if p), None)


def apply_in_worker(worker, policy: KVPolicy, carried: dict[str, tuple[int, int]]) -> int:
    """collective_rpc target: runs in each worker, between two model steps."""
    from engine.sinks.rows import name_batch_rows

    setting = LiveSetting(policy, {r: Carried(*kept) for r, kept in carried.items()})
    runner, builders = _runner_and_builders(worker)
    assert builders, "a sinks engine without sinks metadata builders"
    if carried:  # rows must be matched to requests from the next step on
        name_batch_rows(type(runner))
    for builder in builders:
        setattr(builder, BUILDER_ATTR, setting)
    logger.info("sinks + window now %s (%d running requests carried)", policy.label,
                len(carried))
    return len(carried)


def setting_in_worker(worker) -> list[tuple[int, int]]:
    """collective_rpc target: the distinct (W, S) this worker's sinks builders apply now."""
    _, builders = _runner_and_builders(worker)
    return sorted({(s.policy.window_tokens, s.policy.sink_tokens)
                   for s in map(builder_setting, builders)})


def set_sinks_in_engine_core(core, window_tokens: int, sink_tokens: int) -> dict:
    """Installed as `EngineCore.metronome_set_sinks` (a utility method the front end calls)."""
    from engine.sinks.spec import SinkWindowManager

    # KVPolicy's rule (its one definition) on the two integers the utility call carried,
    # before anything changes.
    policy = KVPolicy("window", window_tokens, sink_tokens)
    coordinator = core.scheduler.kv_cache_manager.coordinator
    managers = [m for m in coordinator.single_type_managers
                if isinstance(m, SinkWindowManager)]
    if not managers:
        raise ValueError("this engine does not run sinks + window KV; start it with a window")
    # Every worker must be able to follow before the scheduler side moves: a half-applied
    # change would have workers read blocks the manager already freed.
    problems = [p for p in core.collective_rpc(check_in_worker) if p]
    if problems:
        raise NotImplementedError(f"live W/S unsupported here: {problems[0]}")
    free_before = core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    results = [m.set_policy(policy.window_tokens, policy.sink_tokens) for m in managers]
    carried = results[0]
    # One KV group per attention type: groups of the same spec hold the same blocks layout.
    assert all(r == carried for r in results), "KV groups disagree on what requests hold"
    # The workers (not this process) build attention metadata.
    core.collective_rpc(apply_in_worker, args=(policy, carried))
    freed = core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() - free_before
    return {"freed_blocks": int(freed), "carried_requests": len(carried)}
