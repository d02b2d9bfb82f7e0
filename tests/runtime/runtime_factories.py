"""Small factories for the runtime's unit tests (as vLLM's core tests build a scheduler from
`create_scheduler` / `create_requests`): a scripted engine, a writer that keeps rows in lists,
a frame handle with its tokens at given times, a config and the runtime parts built on them.
Nothing here runs a loop: each test drives one part by hand, on a clock it sets."""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import Future

from control.admission import Gate, MemoryGuard, MemoryGuardConfig
from control.limits import make_limit
from control.window import WindowedLimit
from engine.contract import Engine, FrameHandle, KVPolicy, PoolStats
from runtime.config import RunConfig
from runtime.live_settings import LiveSettings, LiveState
from runtime.record import Recorder

RUN_ID = "unit-run"


def config(**kw) -> RunConfig:
    """A small twin config: 80 ms frames, 64 blocks of 32 tokens, 16 tokens in, 4 out."""
    base = dict(engine="twin", sessions=4, duration_s=4.0, frame_ms=80.0, pool_blocks=64)
    return RunConfig(**{**base, **kw})


def pool(used: int, total: int = 64, *, t: float = 0.0, running: int = 0, waiting: int = 0,
         paused: int = 0) -> PoolStats:
    return PoolStats(t, used, total, running, waiting, paused)


def handle(t_submit: float, token_at: tuple = (), done_at: float | None = None,
           error: str | None = None, session_id: int = 0, max_new: int = 4) -> FrameHandle:
    """A frame submitted at `t_submit` whose tokens came at `token_at` (engine clock), done at
    `done_at` (None: still owed) with `error`."""
    h = FrameHandle(session_id, t_submit, max_new)
    for t in token_at:
        h.add_tokens(1, t)
    if done_at is not None:
        h.finish(done_at, error)
    return h


class ListWriter:
    """The store writer's queue side, kept in lists: rows[table] in order."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict]] = defaultdict(list)
        self.statements: list[tuple[str, list]] = []
        self.puts: list[tuple[str, int]] = []  # (table, rows) per call: each wakes the writer

    def add(self, table: str, row: dict) -> None:
        self.add_many(table, [row])

    def add_many(self, table: str, rows) -> None:
        rows = list(rows)
        self.puts.append((table, len(rows)))
        self.rows[table].extend(rows)

    def execute(self, sql: str, params) -> None:
        self.statements.append((sql, list(params)))

    def events(self, kind: str | None = None) -> list[dict]:
        import json

        return [{"t": r["t"], "kind": r["kind"], **json.loads(r["detail"])}
                for r in self.rows["events"] if kind is None or r["kind"] == kind]


class ScriptedEngine(Engine):
    """An engine whose clock, pools, handles and policy changes the test sets by hand."""

    name = "scripted"
    simulated = True

    def __init__(self, *, ranks: int = 1, total_blocks: int = 64, policy: KVPolicy = KVPolicy(),
                 live_policy: bool = True, block_size: int = 32,
                 max_model_len: int | None = None,
                 place: dict | None = None) -> None:
        self.clock = 0.0
        self.pools = [pool(0, total_blocks) for _ in range(ranks)]
        self._policy = policy
        self.live_policy = live_policy  # False: refuses any live KV change, as the base does
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.place = dict(place or {})  # session id → the rank this engine puts it on
        self.rank_of: dict[int, int | None] = {}
        self.opened: list[tuple[int, int | None]] = []
        self.closed: list[int] = []
        self.submitted: list[tuple[int, list[int], FrameHandle]] = []
        self.steps: list = []  # StepStats, drained by the tick
        self.failure: str | None = None
        self.changes: list[tuple[KVPolicy, Future]] = []  # begin_policy_change, unresolved
        self.refuse_at_once: str | None = None  # begin_policy_change raises ValueError(this)

    # clock
    def now(self) -> float:
        return self.clock

    def sleep_until(self, t: float) -> None:
        self.clock = max(self.clock, t)

    # sessions
    def open(self, session_id: int, rank: int | None = None) -> None:
        self.opened.append((session_id, rank))
        self.rank_of[session_id] = rank if rank is not None else self.place.get(session_id, 0)

    def submit(self, session_id: int, token_ids: list[int], max_new: int) -> FrameHandle:
        h = FrameHandle(session_id, self.clock, max_new)
        self.submitted.append((session_id, list(token_ids), h))
        return h

    def close(self, session_id: int) -> None:
        self.closed.append(session_id)

    def session_rank(self, session_id: int) -> int | None:
        return self.rank_of[session_id]

    # pools
    @property
    def ranks(self) -> int:
        return len(self.pools)

    def pool_ranks(self) -> list[PoolStats]:
        return list(self.pools)

    def pool(self) -> PoolStats:
        p = self.pools
        return PoolStats(p[0].t, sum(x.used_blocks for x in p), sum(x.total_blocks for x in p),
                         sum(x.running for x in p), sum(x.waiting for x in p),
                         sum(x.paused for x in p))

    # policy
    @property
    def policy(self) -> KVPolicy:
        return self._policy

    def policy_change_refusal(self, policy: KVPolicy) -> str | None:
        if not self.live_policy:
            return super().policy_change_refusal(policy)
        return policy.block_size_refusal(self.block_size)

    def begin_policy_change(self, policy: KVPolicy) -> Future:
        if self.refuse_at_once:  # a refusal only the start can see (the request passed)
            raise ValueError(self.refuse_at_once)
        return super().begin_policy_change(policy)

    def _start_policy_change(self, policy: KVPolicy) -> Future:
        future: Future = Future()
        self.changes.append((policy, future))
        return future

    def resolve(self, applied: bool = True) -> None:
        """The engine finishes the oldest change under way (as vLLM's workers confirm one)."""
        policy, future = self.changes.pop(0)
        if applied:
            self._policy = policy
            future.set_result(None)
        else:
            future.set_exception(RuntimeError("the engine refused it"))

    @property
    def vocab_size(self) -> int:
        return 1000

    def drain_step_stats(self) -> list:
        out, self.steps = self.steps, []
        return out

    def error(self) -> str | None:
        return self.failure

    def shutdown(self) -> None:
        pass


def recorder(cfg: RunConfig | None = None, observers=()) -> Recorder:
    rec = Recorder(RUN_ID, cfg or config(), ListWriter(), observers)
    return rec


def live(cfg: RunConfig, policy=None) -> LiveState:
    """The run's live settings at its start (the owner of the limit the gate reads)."""
    limit = make_limit(cfg.admission, cfg.budget, cfg.sessions, cfg.target)
    return LiveState(LiveSettings.at_start(cfg, limit, policy or cfg.kv_policy()))


def gate(cfg: RunConfig, memory_guard: bool = False, state: LiveState | None = None) -> Gate:
    state = state or live(cfg)
    return Gate(state.limit, MemoryGuard(MemoryGuardConfig()) if memory_guard else None)


def control(g: Gate, cfg: RunConfig) -> WindowedLimit:
    return cfg.windowed_limit(lambda: g.limit)
