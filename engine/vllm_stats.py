"""What the vLLM backend reads of vLLM's own statistics: the latest scheduler sample of each
data-parallel engine and per-step records for the twin's cost fit. vLLM calls a
`StatLoggerBase` once per engine step; its stats classes are not a stable API, so this module is
the only place that reads them."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from engine.contract import PoolStats, StepStats

logger = logging.getLogger(__name__)


@dataclass
class _RankSample:
    """One data-parallel engine's latest scheduler sample (vLLM's engine_idx)."""

    usage: float = 0.0
    running: int = 0
    waiting: int = 0
    last_t: float | None = None  # perf_counter of its last step
    last_running: int = 0


class PoolProbe:
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

    def pools(self, pool_blocks: int, paused: list[int], idle: bool) -> list[PoolStats]:
        """Each engine's pool now; `paused[r]` sessions of rank r wait for their next frame.
        `idle`: no session is open, so no request holds blocks (prefix caching is off), but
        vLLM reports usage only when it steps: a new run must not start from the last one's."""
        now = time.perf_counter()
        return [PoolStats(now, 0 if idle else round(usage * pool_blocks), pool_blocks,
                          0 if idle else running, 0 if idle else waiting, paused[rank])
                for rank, (usage, running, waiting) in enumerate(self.samples())]

    def drain(self, pool_blocks: int, block_size: int) -> list[StepStats]:
        """The step records since the last call, as Engine.drain_step_stats returns them."""
        with self.lock:
            steps, self.steps = self.steps, []
        return [StepStats(s["t"], s["step_ms"], s["prompt_tokens"], s["gen_tokens"],
                          round(s["usage"] * pool_blocks),
                          round(s["usage"] * pool_blocks) * block_size, s["running"])
                for s in steps]

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


def stat_logger_class(probe: "PoolProbe"):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class MetronomeStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            probe.record(scheduler_stats, iteration_stats, engine_idx)

        def log_engine_initialized(self):
            pass

    return MetronomeStatLogger
