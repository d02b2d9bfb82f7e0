"""The vLLM backend: one AsyncLLM, one streaming-input request per session, one chunk per frame.

Threads: the engine's asyncio loop runs in its own thread ("metronome-vllm"); the runtime calls
`submit/open/close` from its thread, which hand work over with `call_soon_threadsafe`. Frame
results flow back through FrameHandle objects stamped with `perf_counter` times, by each
session's stream consumer (engine/vllm_stream.py).

Pool stats come from a `StatLoggerBase` that vLLM calls once per engine step (the stats classes
are not a stable API, so engine/vllm_stats.py is the only place that reads them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import os
import threading
import time

from engine import dtype as dtypes
from engine import vllm_args
from engine.audio_input import (AUDIO_ENCODER, audio_input, entry_point_refusal, is_audio_model,
                                undriven_refusal)
from engine.audio_features import install as install_frame_features
from engine.audio_render import install as install_frame_render
from engine.audio_plugin import AudioWindowUnsupported, version_refusal
from engine.config import EngineConfig, dp_ranks
from engine.contract import (CLOSED, Engine, FrameHandle, KVPolicy, PoolStats, StepStats,
                             applied, check_frame)
from engine.models import model_info, resolve_model
from engine.sinks.support import check_vllm_version, refusals_surface
from engine.vllm_args import cuda_available
from engine.vllm_stats import PoolProbe, stat_logger_class
from engine.vllm_stream import StreamSession, consume

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0


def _one_frame_per_thread() -> None:
    """torch in this process at the thread count vLLM's CPU processes get (OMP_NUM_THREADS, one
    unless the operator set it). torch read its default, one thread per core, when this process
    first imported it (the model's processor, before any engine started); an audio frame's
    fallback feature extraction then waits on a second thread that the engine core and the
    worker hold (`benchmarks/audio_model.py --features-only` with OMP_NUM_THREADS=2 and 1 on 2
    loaded cores: 272 ms against 4.3 ms a frame, docs/benchmarks/audio_model.md)."""
    import torch

    torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))


class VLLMEngine(Engine):
    name = "vllm"
    simulated = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._policy = config.policy
        self.model_path = resolve_model(config.model, config.seed)
        self.tokenizer_dir = str(self.model_path)
        info = model_info(self.model_path)
        self._vocab_size = int(info["vocab_size"])
        refusal = undriven_refusal(self.model_path)
        if refusal:
            raise ValueError(refusal)
        # An audio-in model: each frame is its audio through the model's processor and encoder.
        self._audio = audio_input(self.model_path, config.frame_ms) \
            if is_audio_model(self.model_path) else None
        if self._audio is not None:
            self.input_path, self.frame_token_ids = AUDIO_ENCODER, self._audio.frame_ids
        self._item_names = itertools.count()  # a unique name per frame's audio item
        self._audio_submitted = 0  # audio items handed over (frames, with rollover prompts')
        self.max_model_len = vllm_args.derive_max_model_len(config, info)
        self._ranks = dp_ranks(config)  # each data-parallel engine has pool_blocks
        choice = dtypes.for_vllm_args(config.vllm_args)
        self.dtype, self.dtype_reason = choice.dtype, choice.reason
        logger.info("vLLM dtype %s", choice.reason)
        self._probe = PoolProbe(self._ranks)
        self._sessions: dict[int, StreamSession] = {}
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
    def engine_args(self) -> dict:
        """vLLM's engine arguments for this config (engine/vllm_args.py)."""
        return vllm_args.engine_args(self.config, str(self.model_path), self.max_model_len,
                                     on_cpu=not cuda_available(), dtype=self.dtype,
                                     model_args=self._audio.engine_args() if self._audio else None)

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
            if self._audio is not None:
                _one_frame_per_thread()
        # vLLM's processes start clean rather than as forks of this one: a fork inherits every
        # module this process imported (the console's, the microphone's cffi bindings), and the
        # worker's kernel rebinding walks them all at start-up.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        # W and S (and an audio model's encoder window) travel in the engine arguments'
        # additional_config (engine/vllm_args.py), with vLLM's config to every process.
        policy = self.config.policy
        if self._audio is not None:
            # Refused here, in one line, rather than as a shape error from the engine process.
            refusal = version_refusal() or entry_point_refusal()
            if refusal:
                raise AudioWindowUnsupported(refusal)
            # vLLM's input processor renders each frame (its features) in this process.
            install_frame_features()
            install_frame_render()
        surface = contextlib.nullcontext()
        if policy.kind == "window":
            # The plugin installs nothing on another vLLM version: refused here, in one line,
            # before anything starts.
            check_vllm_version()
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
                engine_args, stat_loggers=[stat_logger_class(self._probe)])
        logger.info("vLLM ready: %s", {k: v for k, v in args.items() if k != "hf_overrides"})

    # --- live KV policy -----------------------------------------------------------------------
    @property
    def policy(self) -> KVPolicy:
        return self._policy

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def policy_change_refusal(self, policy: KVPolicy) -> str | None:
        if policy.kind != self.config.policy.kind:
            # Unbounded vs windowed is the KV cache layout vLLM allocated at start-up.
            return (f"the vLLM engine started {self.config.policy.kind}; switching to "
                    f"{policy.kind} needs a new run (W and S of a windowed run move live)")
        if policy.kind == "unbounded":
            return None
        return policy.block_size_refusal(self.config.block_size) or \
            vllm_args.window_fit_refusal(self.config, policy, self._step_tokens)

    def _start_policy_change(self, policy: KVPolicy) -> concurrent.futures.Future:
        """W and S move between two engine steps (engine.sinks.live): the KV manager frees what
        the new values drop at once; running requests keep what they hold and their window
        refills. The run thread does not wait on it."""
        if policy.kind == "unbounded":  # unbounded to unbounded: nothing to do
            return applied()
        return asyncio.run_coroutine_threadsafe(self._set_sinks(policy), self._loop)

    async def _set_sinks(self, policy: KVPolicy) -> None:
        """On the engine's own loop: one utility call into the engine core, which applies the
        setting between two steps; the run thread is not waiting on it."""
        try:
            result = await self._llm.engine_core.call_utility_async(
                "metronome_set_sinks", policy.window_tokens, policy.sink_tokens)
        except Exception as exc:  # noqa: BLE001 - vLLM returns utility failures as Exception
            raise RuntimeError(f"vLLM refused W/S: {exc}") from exc
        self._policy = policy
        logger.info("KV policy now %s: %s", policy.label, result)

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
        session = StreamSession(session_id, asyncio.Queue(), rank)
        self._sessions[session_id] = session
        session.task = asyncio.create_task(consume(session, self._llm, self._probe, self._fatal))

    def submit(self, session_id: int, token_ids: list[int], max_new: int,
               audio: list | None = None) -> FrameHandle:
        session = self._sessions.get(session_id)
        if session is None:
            raise ValueError(f"session {session_id} is not open")
        check_frame(token_ids, max_new, self._vocab_size, audio, self.frame_token_ids)
        if self._audio is not None:  # the chunk names each frame's item: never shared
            prompt = self._audio.chunk(audio, [f"s{session_id}-a{next(self._item_names)}"
                                               for _ in audio])
            self._audio_submitted += len(audio)
        else:
            prompt = {"prompt_token_ids": list(token_ids)}  # vLLM's TokensPrompt (a TypedDict)
        handle = FrameHandle(session_id, time.perf_counter(), max_new)
        if self._error is not None:
            handle.finish(time.perf_counter(), self._error)
            return handle
        self._loop.call_soon_threadsafe(session.inputs.put_nowait,
                                        (prompt, len(token_ids), handle))
        return handle

    def input_stats(self) -> dict[str, float]:
        counts = self.encoder_counts()
        return {} if counts is None else {
            "frames_submitted": self._audio_submitted,
            "encoder_passes": counts["passes"], "encoder_frames": counts["frames"],
            "audio_tokens": counts["audio_tokens"], "encoder_ms": counts["encoder_ms"]}

    def encoder_counts(self) -> dict | None:
        """The audio encoder's counts in the engine's worker (engine/audio_plugin.py), with the
        digests of the last frames' input features; None for a text model."""
        if self._audio is None or self._llm is None:
            return None
        return asyncio.run_coroutine_threadsafe(
            self._llm.engine_core.call_utility_async("metronome_audio_stats"),
            self._loop).result(timeout=30)

    def sinks_in_workers(self) -> list[list[tuple[int, int]]]:
        """Per worker, the (W, S) its sinks metadata builders apply now (engine.sinks.live): what
        a live change reached, read back from where attention metadata is built."""
        if self.config.policy.kind != "window" or self._llm is None:
            return []
        workers = asyncio.run_coroutine_threadsafe(
            self._llm.engine_core.call_utility_async("metronome_sinks_in_workers"),
            self._loop).result(timeout=30)
        return [[tuple(pair) for pair in worker] for worker in workers]

    def close(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._close(session), self._loop)
        future.result(timeout=30)

    async def _close(self, session: StreamSession) -> None:
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
                handle.finish(now, CLOSED)
        while not session.inputs.empty():
            item = session.inputs.get_nowait()
            if item is not None:
                item[1].finish(now, CLOSED)

    def pool_ranks(self) -> list[PoolStats]:
        sessions = list(self._sessions.values())
        paused = [sum(1 for s in sessions if not s.pending and (s.rank == rank or self._ranks == 1))
                  for rank in range(self._ranks)]
        return self._probe.pools(self.config.pool_blocks, paused, idle=not sessions)

    def pool(self) -> PoolStats:
        pools = self.pool_ranks()
        # Paused sessions whose rank vLLM chose are counted here, not per rank.
        paused = sum(1 for s in self._sessions.values() if not s.pending)
        return PoolStats(pools[0].t, sum(p.used_blocks for p in pools),
                         sum(p.total_blocks for p in pools), sum(p.running for p in pools),
                         sum(p.waiting for p in pools), paused)

    def drain_step_stats(self) -> list[StepStats]:
        return self._probe.drain(self.config.pool_blocks, self.config.block_size)

    def _fatal(self, message: str) -> None:
        """The engine core died under a session's stream: every later frame fails with it."""
        self._error = message

    def error(self) -> str | None:
        llm = self._llm
        if self._error is None and llm is not None and llm.errored:
            # Died between runs (no session was there to see it): the next run must not start.
            self._error = "the vLLM engine core is no longer running"
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
