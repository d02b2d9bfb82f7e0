"""What this machine's vLLM serves, measured once per test session (tests/conftest.py's
`vllm_machine` fixture): the vLLM tests derive their frame period from it instead of hard-coding
a load only a fast CPU keeps up with.

A test asks for the shortest period of calibration.PERIODS_MS at which its sessions are at most
`share` of N_c (half by default: "few silent frames only where the load is ≤ half of N_c"),
never shorter than the period it was written for. N_c at a period the calibration did not
measure is the fitted step cost's analytic N_c, scaled by how far the measured N_c fell from the
analytic one where both are known (the fit ignores the front end and the scheduler's gaps).
A test whose load this machine cannot serve at any period is skipped with the measured reason.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from services import calibration
from engine.twin_cost import analytic_n_star


@dataclass(frozen=True)
class MachineLoad:
    cal: calibration.Calibration

    def n_c_at(self, frame_ms: float) -> float:
        measured = dict(self.cal.periods)
        if frame_ms in measured:
            return float(measured[frame_ms])
        cal = self.cal

        def analytic(period_ms: float) -> int:
            return analytic_n_star(cal.cost, calibration.TARGET_FRACTION * period_ms,
                                   cal.tokens_in, cal.tokens_out,
                                   cal.window_tokens + cal.sink_tokens, n_max=4096)

        # The longest measured period anchors the scale (the closest below a longer one).
        anchor_ms, anchor_n = max(self.cal.periods)
        scale = anchor_n / max(1, analytic(anchor_ms)) if anchor_n else 0.5
        return scale * analytic(frame_ms)

    def frame_ms_for(self, sessions: int, at_least_ms: float = 80.0, share: float = 0.5
                     ) -> float:
        """The shortest period ≥ at_least_ms at which `sessions` ≤ share · N_c (skip if none)."""
        for frame_ms in calibration.PERIODS_MS:
            if frame_ms >= at_least_ms and sessions <= share * self.n_c_at(frame_ms):
                return frame_ms
        pytest.skip(f"this machine's vLLM cannot serve {sessions} sessions at ≤ {share:g} of "
                    f"N_c at any frame period up to {calibration.PERIODS_MS[-1]:g} ms "
                    f"(measured N_c: {self.describe()})")

    def describe(self) -> str:
        return (", ".join(f"{n} at {f:g} ms" for f, n in self.cal.periods)
                + f"; dtype {self.cal.dtype}; step a={self.cal.a_ms:.1f} ms")


class EnginePool:
    """vLLM engines shared by the test session's modules: an engine start costs ~20-35 s on
    two cores, and most modules ask for one of a few configurations. Engines are keyed by what
    is fixed at their start (policy kind, pool, block size, max_model_len, vLLM arguments); W
    and S move live, so `get` sets the asked-for policy before handing a windowed engine out.
    At most `keep` stay alive (the least recently used is shut down): each costs ~1.5 GB, and
    an idle one ~1 % of a core (measured: 12 CPU ticks in 10 s). Four hold every configuration
    the suite's modules ask for (calibration, window and unbounded at 64 blocks, the rollover
    module's), so each starts once; with two kept, the admission module restarted both of its."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._engines: dict = {}  # key → engine, least recently used first
        self._processes: dict = {}  # key → the EngineCore processes its engine started
        self.starts = 0

    @staticmethod
    def key(config) -> tuple:
        ec = config.engine_config()
        # The seed only seeds sampling, and every frame is greedy: engines differ by the rest.
        # An audio-in model's encoder window is one frame: fixed at its start.
        return (ec.model, ec.policy.kind, ec.block_size, ec.pool_blocks, ec.max_model_len,
                ec.vllm_args, ec.data_parallel_size,
                ec.frame_ms if ec.model.startswith("audio") else None)

    def get(self, config):
        from runtime import make_engine

        key = self.key(config)
        engine = self._engines.pop(key, None)
        if engine is not None and engine.error() is not None:  # e.g. its processes died
            engine.shutdown()
            engine = None
        if engine is None:
            while len(self._engines) >= self.keep:
                oldest = next(iter(self._engines))
                self._engines.pop(oldest).shutdown()
            before = {p.pid for p in engine_core_processes()}
            engine = make_engine(config)
            self._processes[key] = [p for p in engine_core_processes() if p.pid not in before]
            self.starts += 1
        self._engines[key] = engine
        wanted = config.engine_config().policy
        if engine.policy != wanted:
            engine.begin_policy_change(wanted).result(timeout=30)  # W, S move live
        return engine

    def processes(self, config) -> list:
        """The EngineCore processes of the engine `get(config)` handed out (a fault test kills
        them; the next `get` replaces the dead engine)."""
        return list(self._processes.get(self.key(config), []))

    def close(self) -> None:
        """Shut every kept engine down at once: each waits seconds for its EngineCore process
        to exit (one after another that was ~19 s of the suite's last teardown)."""
        engines, self._engines = list(self._engines.values()), {}
        with ThreadPoolExecutor(max_workers=max(1, len(engines))) as pool:
            list(pool.map(lambda engine: engine.shutdown(), engines))


def engine_core_processes() -> list:
    """This process's live vLLM EngineCore children (psutil.Process)."""
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:  # earlier engines of this process may have left zombies behind
            if proc.status() != psutil.STATUS_ZOMBIE and \
                    "EngineCore" in " ".join(proc.cmdline() + [proc.name()]):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def measure(pool: EnginePool) -> MachineLoad:
    """One calibration of the tiny model on vLLM (one engine start and ~7 probes of 3 s), on
    an engine the pool keeps for the tests that probe the same configuration."""
    return MachineLoad(calibration.calibrate("vllm", "tiny", None, engine_factory=pool.get,
                                             keep_engine=True))
