"""The twin: a simulated engine with vLLM's block accounting and a fitted step-cost model.

It runs on a virtual clock, so a minute of load simulates in milliseconds. Shapes it keeps from
vLLM (see DESIGN.md, "stock behaviour to reproduce"):
- a session's resident tokens take ceil(tokens / block) blocks; `window` holds at most
  ceil(W / block) + 1 (+ sink blocks), like vLLM's SlidingWindowManager;
- a paused session (no frame in flight) keeps its blocks and is never preempted;
- a chunk that cannot get the blocks it needs waits; when every session waits, the pool is
  stalled with 0 running and nothing heals it.
Cost model per engine step: step_ms = a + b·tokens_in_step + c·resident_tokens.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.contract import Engine, FrameHandle, KVPolicy, PoolStats, check_frame


@dataclass(frozen=True)
class CostModel:
    a_ms: float = 4.0  # fixed cost of one step
    b_ms_per_token: float = 0.05  # per token computed in the step (prefill + decode)
    c_ms_per_resident_token: float = 0.0005  # per KV token the step's requests attend over
    source: str = "default"  # "default" or the run_id it was fitted from

    def __post_init__(self) -> None:
        for name in ("a_ms", "b_ms_per_token", "c_ms_per_resident_token"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"cost coefficient {name} = {value} must be finite and ≥ 0")
        if self.a_ms == 0 and self.b_ms_per_token == 0:
            raise ValueError("cost model needs a_ms > 0 or b_ms_per_token > 0 (steps take time)")

    def step_ms(self, tokens_in_step: int, resident_tokens: int) -> float:
        return (self.a_ms + self.b_ms_per_token * tokens_in_step
                + self.c_ms_per_resident_token * resident_tokens)


@dataclass
class _Chunk:
    handle: FrameHandle
    prompt_left: int
    out_left: int


@dataclass
class _TwinSession:
    session_id: int
    tokens: int = 0  # tokens whose KV exists (absolute count, grows forever)
    blocks: int = 0
    chunks: deque = field(default_factory=deque)


class TwinEngine(Engine):
    """Simulated engine; always labelled simulated in the UI and the data."""

    name = "twin"
    simulated = True
    live_policy = True

    def __init__(self, config: EngineConfig, cost: CostModel | None = None,
                 vocab_size: int = 2048, max_prefill_tokens: int = 2048,
                 paced: bool = False) -> None:
        self.config = config
        self.cost = cost or CostModel()
        self._policy = config.policy
        self._vocab_size = vocab_size
        self.max_model_len = config.max_model_len  # None: no limit
        self.max_prefill_tokens = max_prefill_tokens
        self._t = 0.0
        self._sessions: dict[int, _TwinSession] = {}
        self._free = config.pool_blocks
        self._running = 0
        self._waiting = 0
        self._steps: list[dict] = []
        # Paced: virtual time also waits for the wall clock, so a run lasts as long as it says
        # (live demos, soak tests); unpaced, a minute of load simulates in milliseconds.
        self.paced = paced
        self._wall0 = time.perf_counter()
        self.wall_lag_s = 0.0  # paced: how far the wall clock ran past the last sleep target

    # --- clock --------------------------------------------------------------------------------
    def now(self) -> float:
        return self._t

    def sleep_until(self, t: float) -> None:
        """Simulate engine steps until the clock reaches t (the last step may end after t)."""
        while self._t < t:
            if not self._step():
                self._t = t
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

    def set_policy(self, policy: KVPolicy) -> bool:
        policy.check_block_size(self.config.block_size)
        self._policy = policy
        for session in self._sessions.values():
            self._release_outside_window(session)
        return True

    def open(self, session_id: int) -> None:
        if session_id in self._sessions:
            raise ValueError(f"session {session_id} is already open")
        self._sessions[session_id] = _TwinSession(session_id)

    def submit(self, session_id: int, token_ids: list[int], max_new: int) -> FrameHandle:
        session = self._sessions.get(session_id)
        if session is None:
            raise ValueError(f"session {session_id} is not open")
        check_frame(token_ids, max_new, self._vocab_size)
        handle = FrameHandle(session_id, self._t, max_new)
        session.chunks.append(_Chunk(handle, len(token_ids), max_new))
        return handle

    def close(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        self._free += session.blocks
        for chunk in session.chunks:
            chunk.handle.finish(self._t, "closed")

    def pool(self) -> PoolStats:
        total = self.config.pool_blocks
        paused = sum(1 for s in self._sessions.values() if not s.chunks)
        return PoolStats(self._t, total - self._free, total, self._running, self._waiting, paused)

    def drain_step_stats(self) -> list[dict]:
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
            self._free += session.blocks - cap
            session.blocks = cap

    def _blocks_needed(self, session: _TwinSession, new_tokens: int) -> int:
        want = math.ceil((session.tokens + new_tokens) / self.config.block_size)
        cap = self._max_blocks()
        if cap is not None:
            want = min(want, cap)
        return max(0, want - session.blocks)

    def _step(self) -> bool:
        """One engine step at the current time; False when there is nothing to run."""
        scheduled: list[tuple[_TwinSession, _Chunk, int]] = []
        budget = self.max_prefill_tokens
        waiting = 0
        for session in self._sessions.values():
            if not session.chunks:
                continue
            chunk = session.chunks[0]
            n_tokens = min(chunk.prompt_left, budget) if chunk.prompt_left else 1
            if chunk.prompt_left and n_tokens == 0:
                waiting += 1
                continue
            need = self._blocks_needed(session, n_tokens)
            if need > self._free:
                waiting += 1  # no preemption of paused sessions: it simply waits
                continue
            self._free -= need
            session.blocks += need
            if chunk.prompt_left:
                budget -= n_tokens
            scheduled.append((session, chunk, n_tokens))
        self._running, self._waiting = len(scheduled), waiting
        if not scheduled:
            return False
        tokens_in_step = sum(n for _, _, n in scheduled)
        resident = sum(min(s.tokens + n, self._window_tokens(s)) for s, _, n in scheduled)
        dt_ms = self.cost.step_ms(tokens_in_step, resident)
        self._t += dt_ms / 1e3
        used = self.config.pool_blocks - self._free
        self._steps.append({"t": self._t, "step_ms": dt_ms,
                            "prompt_tokens": sum(n for _, c, n in scheduled if n > 1),
                            "gen_tokens": len(scheduled), "used_blocks": used,
                            "resident_tokens": used * self.config.block_size,
                            "running": len(scheduled)})
        if len(self._steps) > 100_000:
            del self._steps[:50_000]
        for session, chunk, n_tokens in scheduled:
            session.tokens += n_tokens
            if chunk.prompt_left:
                chunk.prompt_left -= n_tokens
                if chunk.prompt_left:
                    continue  # partial prefill samples nothing
            chunk.out_left -= 1
            chunk.handle.add_tokens(1, self._t)
            if chunk.out_left == 0:
                session.chunks.popleft()
                chunk.handle.finish(self._t)
            self._release_outside_window(session)
        return True

    def _window_tokens(self, session: _TwinSession) -> int:
        if self._policy.kind == "window":
            return self._policy.window_tokens + self._policy.sink_tokens
        return 1 << 62


def fit_cost_model(steps: list[dict], source: str = "fit") -> tuple[CostModel, dict]:
    """Least squares of step_ms on [1, tokens_in_step, resident_tokens], coefficients ≥ 0.

    Returns the model and fit facts (n_steps, r2). Raises ValueError with fewer than 20 steps.
    """
    import numpy as np

    if len(steps) < 20:
        raise ValueError(f"{len(steps)} engine steps are too few to fit the twin (need ≥ 20)")
    y = np.array([s["step_ms"] for s in steps], dtype=float)
    x = np.column_stack([
        np.ones(len(steps)),
        [s["prompt_tokens"] + s["gen_tokens"] for s in steps],
        [s["resident_tokens"] for s in steps],
    ]).astype(float)
    # Drop the slowest 5%: scheduler hiccups and GC pauses are not the cost model.
    keep = y <= np.quantile(y, 0.95)
    x, y = x[keep], y[keep]
    active = [0, 1, 2]
    while True:  # non-negative least squares by elimination (3 terms: at most 3 rounds)
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(coef)))
    full = np.zeros(3)
    full[active] = np.clip(coef, 0, None)
    pred = x @ full
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1.0
    if full[0] == 0 and full[1] == 0:
        full[0] = float(y.mean())
    model = CostModel(float(full[0]), float(full[1]), float(full[2]), source=source)
    return model, {"n_steps": int(len(y)), "r2": 1 - ss_res / ss_tot}


def synchronized_frame_ms(cost: CostModel, sessions: int, tokens_in: int, tokens_out: int,
                          resident_tokens: int) -> float:
    """Analytic frame latency when `sessions` submit together and each attends over
    `resident_tokens`: one prefill step for all chunks, then tokens_out − 1 decode steps."""
    prefill = cost.step_ms(sessions * tokens_in, sessions * resident_tokens)
    decode = cost.step_ms(sessions, sessions * resident_tokens)
    return prefill + (tokens_out - 1) * decode


def analytic_n_star(cost: CostModel, target_ms: float, tokens_in: int, tokens_out: int,
                    resident_tokens: int, n_max: int = 10_000) -> int:
    """The largest session count whose synchronized frame latency stays within target_ms."""
    n = 0
    while n < n_max and synchronized_frame_ms(cost, n + 1, tokens_in, tokens_out,
                                              resident_tokens) <= target_ms:
        n += 1
    return n
