"""The twin: a simulated engine with vLLM's block accounting and a fitted step-cost model.

It runs on a virtual clock, so a minute of load simulates in milliseconds. Shapes it keeps from
vLLM (see DESIGN.md, "stock behaviour to reproduce"):
- a session's resident tokens take ceil(tokens / block) blocks; `window` holds at most
  ceil(W / block) + 1 (+ sink blocks), like vLLM's SlidingWindowManager;
- a paused session (no frame in flight) keeps its blocks and is never preempted;
- a chunk that cannot get the blocks it needs waits; when every session waits, the pool is
  stalled with 0 running and nothing heals it.
Cost model per engine step: step_ms = a + b·tokens_in_step + c·resident_tokens + open·opens,
`opens` the requests whose first chunk the step starts (a session's open, a rollover's reopen).
"""

from __future__ import annotations

import math
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from engine.balance import EngineLoad, vllm_pick
from engine.config import EngineConfig, dp_ranks
from engine.contract import (CLOSED, Engine, FrameHandle, KVPolicy, PoolStats, StepStats,
                             applied, check_frame)
# The cost model lives in its own module; its names stay importable from here.
from engine.twin_cost import (CostModel, analytic_n_star, fit_cost_model,  # noqa: F401
                              synchronized_frame_ms)


@dataclass
class _Chunk:
    handle: FrameHandle
    prompt_left: int
    out_left: int
    first: bool = False  # the session's first chunk: a new request, charged open_ms once


@dataclass
class _TwinSession:
    session_id: int
    rank: int = 0
    tokens: int = 0  # tokens whose KV exists (absolute count, grows forever)
    blocks: int = 0
    chunks: deque = field(default_factory=deque)
    generated: int = 0  # output tokens so far: where its next made-up id comes from


@dataclass
class _Rank:
    """One data-parallel rank: its own clock, pool and steps (ranks run side by side)."""

    index: int
    free: int
    t: float = 0.0
    running: int = 0
    waiting: int = 0
    sessions: dict = field(default_factory=dict)  # session_id → _TwinSession, in open order


class TwinEngine(Engine):
    """Simulated engine; always labelled simulated in the UI and the data.

    With `data_parallel_size` N it simulates N ranks, each with its own pool of pool_blocks
    and its own step cost; a session lives on one rank. A session opened without a rank is
    placed by vLLM's own balancer (engine/balance.py)."""

    name = "twin"
    simulated = True

    def __init__(self, config: EngineConfig, cost: CostModel | None = None,
                 vocab_size: int = 2048, max_prefill_tokens: int = 2048,
                 paced: bool = False) -> None:
        self.config = config
        self.cost = cost or CostModel()
        self._policy = config.policy
        self._vocab_size = vocab_size
        self.max_model_len = config.max_model_len  # None: no limit
        self.max_prefill_tokens = max_prefill_tokens
        self._ranks = [_Rank(i, config.pool_blocks) for i in range(dp_ranks(config))]
        self._sessions: dict[int, _TwinSession] = {}
        self._balance_start = 0  # vLLM rotates where its balancer's scan starts
        self._steps: list[StepStats] = []
        # Paced: virtual time also waits for the wall clock, so a run lasts as long as it says
        # (live demos, soak tests); unpaced, a minute of load simulates in milliseconds.
        self.paced = paced
        self._wall0 = time.perf_counter()
        self.wall_lag_s = 0.0  # paced: how far the wall clock ran past the last sleep target

    @property
    def tokenizer_dir(self) -> str | None:
        """The model the twin stands in for decodes its made-up ids (built on first use)."""
        from engine.models import resolve_model

        return str(resolve_model(self.config.model, self.config.seed))

    def wall_time(self, t: float) -> float | None:
        return self._wall0 + t if self.paced else None

    # --- clock --------------------------------------------------------------------------------
    def now(self) -> float:
        # Ranks step independently; the engine's time is the furthest any rank got (one rank:
        # its clock, whose last step may end past the time asked for).
        return max(r.t for r in self._ranks)

    def sleep_until(self, t: float) -> None:
        """Simulate each rank's steps until its clock reaches t (a last step may end after t)."""
        for rank in self._ranks:
            while rank.t < t:
                if not self._step(rank):
                    # Idle until t, or until a chunk submitted later than this rank's clock
                    # (another rank's step ran further) becomes due.
                    due = [c.handle.t_submit for s in rank.sessions.values()
                           for c in list(s.chunks)[:1] if c.handle.t_submit > rank.t]
                    rank.t = min([t] + due)
        if self.paced:
            left = t - (time.perf_counter() - self._wall0)
            self.wall_lag_s = max(0.0, -left)
            if left > 0:
                time.sleep(left)

    # --- contract -----------------------------------------------------------------------------
    @property
    def policy(self) -> KVPolicy:
        return self._policy

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def cost_source(self) -> str | None:
        return self.cost.source

    @property
    def ranks(self) -> int:
        return len(self._ranks)

    def policy_change_refusal(self, policy: KVPolicy) -> str | None:
        return policy.block_size_refusal(self.config.block_size)

    def _start_policy_change(self, policy: KVPolicy) -> Future:
        self._policy = policy  # applied at once: what the new window drops is freed now
        for session in self._sessions.values():
            self._release_outside_window(session)
        return applied()

    def open(self, session_id: int, rank: int | None = None) -> None:
        if session_id in self._sessions:
            raise ValueError(f"session {session_id} is already open")
        if rank is None:
            rank = self._balance()
        elif not isinstance(rank, int) or not 0 <= rank < len(self._ranks):
            raise ValueError(f"rank {rank} is not one of this engine's ranks "
                             f"[0, {len(self._ranks) - 1}]")
        session = _TwinSession(session_id, rank)
        self._sessions[session_id] = session
        self._ranks[rank].sessions[session_id] = session

    def session_rank(self, session_id: int) -> int | None:
        session = self._sessions.get(session_id)
        if session is None:
            raise ValueError(f"session {session_id} is not open")
        return session.rank

    def _balance(self) -> int:
        total = self.config.pool_blocks
        loads = [EngineLoad(len(r.sessions), r.waiting, r.running, 1 - r.free / total)
                 for r in self._ranks]
        rank = vllm_pick(loads, self._balance_start)
        self._balance_start = (self._balance_start + 1) % len(self._ranks)
        return rank

    def submit(self, session_id: int, token_ids: list[int], max_new: int,
               audio: list | None = None) -> FrameHandle:  # noqa: ARG002 - costs are per token
        session = self._sessions.get(session_id)
        if session is None:
            raise ValueError(f"session {session_id} is not open")
        check_frame(token_ids, max_new, self._vocab_size)
        handle = FrameHandle(session_id, self.now(), max_new)
        first = session.tokens == 0 and not session.chunks
        session.chunks.append(_Chunk(handle, len(token_ids), max_new, first))
        return handle

    def close(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        rank = self._ranks[session.rank]
        del rank.sessions[session_id]
        rank.free += session.blocks
        for chunk in session.chunks:
            chunk.handle.finish(self.now(), CLOSED)

    def _rank_pool(self, rank: _Rank, t: float) -> PoolStats:
        total = self.config.pool_blocks
        paused = sum(1 for s in rank.sessions.values() if not s.chunks)
        return PoolStats(t, total - rank.free, total, rank.running, rank.waiting, paused)

    def pool_ranks(self) -> list[PoolStats]:
        now = self.now()
        return [self._rank_pool(r, now) for r in self._ranks]

    def pool(self) -> PoolStats:
        pools = self.pool_ranks()
        return PoolStats(pools[0].t, sum(p.used_blocks for p in pools),
                         sum(p.total_blocks for p in pools), sum(p.running for p in pools),
                         sum(p.waiting for p in pools), sum(p.paused for p in pools))

    def drain_step_stats(self) -> list[StepStats]:
        steps, self._steps = self._steps, []
        return steps

    def shutdown(self) -> None:
        for session_id in list(self._sessions):
            self.close(session_id)

    # --- simulation ---------------------------------------------------------------------------
    def _max_blocks(self) -> int | None:
        return self._policy.blocks_per_session(self.config.block_size)

    def _release_outside_window(self, session: _TwinSession) -> None:
        cap = self._max_blocks()
        if cap is not None and session.blocks > cap:
            self._ranks[session.rank].free += session.blocks - cap
            session.blocks = cap

    def _blocks_needed(self, session: _TwinSession, new_tokens: int) -> int:
        want = math.ceil((session.tokens + new_tokens) / self.config.block_size)
        cap = self._max_blocks()
        if cap is not None:
            want = min(want, cap)
        return max(0, want - session.blocks)

    def _step(self, rank: _Rank) -> bool:
        """One engine step of `rank` at its clock; False when it has nothing to run."""
        scheduled: list[tuple[_TwinSession, _Chunk, int]] = []
        budget = self.max_prefill_tokens
        waiting = 0
        for session in rank.sessions.values():
            if not session.chunks:
                continue
            chunk = session.chunks[0]
            if chunk.handle.t_submit > rank.t:
                continue  # submitted after this rank's clock (another rank ran further)
            n_tokens = min(chunk.prompt_left, budget) if chunk.prompt_left else 1
            if chunk.prompt_left and n_tokens == 0:
                waiting += 1
                continue
            need = self._blocks_needed(session, n_tokens)
            if need > rank.free:
                waiting += 1  # no preemption of paused sessions: it simply waits
                continue
            rank.free -= need
            session.blocks += need
            if chunk.prompt_left:
                budget -= n_tokens
            scheduled.append((session, chunk, n_tokens))
        rank.running, rank.waiting = len(scheduled), waiting
        if not scheduled:
            return False
        tokens_in_step = sum(n for _, _, n in scheduled)
        resident = sum(min(s.tokens + n, self._window_tokens(s)) for s, _, n in scheduled)
        opens = sum(1 for _, c, _ in scheduled if c.first)
        dt_ms = self.cost.step_ms(tokens_in_step, resident, opens)
        rank.t += dt_ms / 1e3
        used = self.config.pool_blocks - rank.free
        self._steps.append(StepStats(rank.t, dt_ms, sum(n for _, c, n in scheduled if n > 1),
                                     len(scheduled), used, used * self.config.block_size,
                                     len(scheduled)))
        if len(self._steps) > 100_000:
            del self._steps[:50_000]
        for session, chunk, n_tokens in scheduled:
            session.tokens += n_tokens
            chunk.first = False
            if chunk.prompt_left:
                chunk.prompt_left -= n_tokens
                if chunk.prompt_left:
                    continue  # partial prefill samples nothing
            chunk.out_left -= 1
            chunk.handle.add_tokens(1, rank.t, [self._next_id(session)])
            if chunk.out_left == 0:
                session.chunks.popleft()
                chunk.handle.finish(rank.t)
            self._release_outside_window(session)
        return True

    def _next_id(self, session: _TwinSession) -> int:
        # A made-up output id, the same for a session's n-th token in every run (no RNG: the
        # seeded digests stay as they were); spread over the vocabulary by a Knuth hash.
        session.generated += 1
        return (session.session_id * 40503 + session.generated * 2654435761) % self._vocab_size

    def _window_tokens(self, session: _TwinSession) -> int:
        policy = self._policy
        return policy.window_tokens + policy.sink_tokens if policy.kind == "window" else 1 << 62
