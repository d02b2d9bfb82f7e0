"""The cliff vs slope demo, sized for the machine it runs on (pure functions, no engine).

From a calibration (services/calibration.py): a fixed load below the compute limit N_c (so the
windowed run is clean and every session grows at once, a sharp cliff), a pool sized so the
unbounded run's predicted t_sat falls at a third of the run, the window well inside that pool,
and a gateway that answers after half the budget (so the naive dashboard's lie shows).
`cliff_problems` says before anything runs why settings typed by hand cannot show a cliff.
`preparation` is the run host's job for the one-click demo (calibrate if needed, then plan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from services import experiments
from services.calibration import DEMO_MIN_SESSIONS, TARGET_FRACTION
from runtime import RunConfig

# Of N_c: the windowed run keeps headroom for a shared machine's hiccups. 0.65 left the vLLM
# slope at p95 61 of 80 ms on 2 shared cores, where one slow step silences every session at
# once (1.8 % silent); at half, a hiccup costs a frame less often.
LOAD_FRACTION = 0.5
TSAT_FRACTION = 1 / 3  # of the run: the cliff, then twice as long to see what follows
DURATION_S = 18.0
WAIT_BUDGET = 0.5  # the gateway answers an empty frame after half the budget
DEMO_ENGINE_ENV = "METRONOME_DEMO_ENGINE"  # the console's demo engine (default vllm; CI: twin)
WINDOW_SHARE_MAX = 0.5  # the windowed sessions' blocks may take at most this share of the pool


def growth_tokens_per_s(tokens_in: int, tokens_out: int, frame_ms: float) -> float:
    """KV tokens a session adds per second: its input, and its output but the last token
    (which is sampled, not yet attended over)."""
    return (tokens_in + tokens_out - 1) / (frame_ms / 1e3)


def predicted_t_sat_s(sessions: int, pool_blocks: int, block_size: int, tokens_in: int,
                      tokens_out: int, frame_ms: float) -> float:
    """t_sat = (1 − ρ0)/(N·r) for N sessions that start together with unbounded KV: ρ0 the
    first frame's blocks, r the pool fraction one session adds per second."""
    if sessions < 1 or pool_blocks < 1:
        raise ValueError(f"sessions {sessions} and pool blocks {pool_blocks} must be ≥ 1")
    rho0 = min(1.0, sessions * math.ceil(tokens_in / block_size) / pool_blocks)
    r = growth_tokens_per_s(tokens_in, tokens_out, frame_ms) / (pool_blocks * block_size)
    return (1.0 - rho0) / (sessions * r)


def window_blocks(window: int, sinks: int, block_size: int) -> int:
    """Blocks one windowed session holds at most (like vLLM's sliding-window manager)."""
    return math.ceil(window / block_size) + 1 + math.ceil(sinks / block_size)


@dataclass(frozen=True)
class DemoSettings:
    sessions: int
    pool_blocks: int
    duration_s: float
    window: int
    sinks: int
    frame_ms: float
    tokens_in: int
    tokens_out: int
    block_size: int
    wait_budget: float
    predicted_t_sat_s: float
    n_c: int
    period_note: str = ""  # why this frame period (choose_period)

    def __post_init__(self) -> None:
        if not 1 <= self.sessions <= max(1, self.n_c):
            raise ValueError(f"demo sessions {self.sessions} must be in [1, N_c = {self.n_c}]")
        if not 0 < self.predicted_t_sat_s < self.duration_s:
            raise ValueError(f"predicted t_sat {self.predicted_t_sat_s:.1f} s must fall inside "
                             f"the run (0, {self.duration_s:g}) s")

    def base(self, engine: str, model: str, seed: int = 0) -> RunConfig:
        return RunConfig(engine=engine, model=model, seed=seed, load="fixed",
                         sessions=self.sessions, pool_blocks=self.pool_blocks,
                         duration_s=self.duration_s, frame_ms=self.frame_ms,
                         tokens_in=self.tokens_in, tokens_out=self.tokens_out,
                         block_size=self.block_size, wait_budget=self.wait_budget)

    def configs(self, engine: str, model: str, seed: int = 0) -> list[RunConfig]:
        """Unbounded, then windowed: the same seeded load (experiments.cliff_vs_slope)."""
        return experiments.cliff_vs_slope(self.base(engine, model, seed), self.window,
                                          self.sinks)


@dataclass(frozen=True)
class Period:
    """The frame period the demo ticks at, its N_c, and the sentence that says why."""

    frame_ms: float
    n_c: int
    sentence: str


def _serves(n_c: int, frame_ms: float) -> str:
    if n_c == 0:
        return f"cannot serve one session at {frame_ms:g} ms frames"
    return f"serves {n_c} session{'s' * (n_c != 1)} at {frame_ms:g} ms frames"


def choose_period(periods, min_sessions: int = DEMO_MIN_SESSIONS) -> Period:
    """The shortest measured period ((frame_ms, N_c), ...) with N_c ≥ min_sessions; when none
    has, the one with the largest N_c ≥ 1 (the shortest of ties); a ValueError with the
    measured numbers when not one period serves a session."""
    periods = sorted((float(f), int(n)) for f, n in periods)
    if not periods:
        raise ValueError("the calibration measured no frame period")
    first_ms, first_n = periods[0]
    good = [(f, n) for f, n in periods if n >= min_sessions]
    if good:
        frame_ms, n_c = good[0]
    else:
        frame_ms, n_c = max(periods, key=lambda p: (p[1], -p[0]))
        if n_c < 1:
            measured = ", ".join(f"{n} at {f:g} ms" for f, n in periods)
            raise ValueError(f"this engine cannot serve one session at any frame period up to "
                             f"{periods[-1][0]:g} ms (N_c: {measured}); there is no clean "
                             "windowed run to show")
    if frame_ms == first_ms:
        sentence = f"this machine {_serves(n_c, frame_ms)}"
    else:
        kind = "an omni" if frame_ms >= 1000 else "a slower"
        sentence = (f"this machine {_serves(first_n, first_ms)}; the demo ticks every "
                    f"{frame_ms:g} ms ({n_c} sessions), as {kind} interaction model would")
    return Period(frame_ms, n_c, sentence)


def derive(cal, duration_s: float | None = None) -> DemoSettings:
    """The demo for a calibration (services.calibration.Calibration): see the module docstring.
    The run lasts DURATION_S at 80 ms frames and as many frames at a longer period."""
    period = choose_period(cal.periods)
    if duration_s is None:
        duration_s = min(600.0, DURATION_S * max(1.0, period.frame_ms / 80.0))
    if not 3.0 <= duration_s <= 600.0:
        raise ValueError(f"demo duration {duration_s} s must be in [3, 600]")
    cal = replace(cal, frame_ms=period.frame_ms, n_c=period.n_c,
                  target_ms=TARGET_FRACTION * period.frame_ms)
    sessions = max(1, math.floor(LOAD_FRACTION * cal.n_c))
    bs = cal.block_size
    want_t_sat = TSAT_FRACTION * duration_s
    # Solve t_sat = P·bs·(1 − ρ0)/(N·g) for P, ρ0 = N·first-frame blocks / P.
    first = sessions * math.ceil(cal.tokens_in / bs)
    g = growth_tokens_per_s(cal.tokens_in, cal.tokens_out, cal.frame_ms)
    pool = math.ceil(want_t_sat * sessions * g / bs) + first
    pool = max(pool, math.ceil(sessions * window_blocks(cal.window_tokens, cal.sink_tokens, bs)
                               / WINDOW_SHARE_MAX), 8)
    return DemoSettings(
        sessions=sessions, pool_blocks=pool, duration_s=duration_s, window=cal.window_tokens,
        sinks=cal.sink_tokens, frame_ms=cal.frame_ms, tokens_in=cal.tokens_in,
        tokens_out=cal.tokens_out, block_size=bs, wait_budget=WAIT_BUDGET,
        predicted_t_sat_s=predicted_t_sat_s(sessions, pool, bs, cal.tokens_in, cal.tokens_out,
                                            cal.frame_ms),
        n_c=cal.n_c, period_note=period.sentence)


def cliff_problems(base: RunConfig, window: int, sinks: int, n_c: int | None) -> list[str]:
    """Why these cliff vs slope settings cannot show a cliff and a clean slope (empty: they
    can). Fixed load: all sessions live from the start. Poisson: about rate × session length
    live at once, each holding on average half a session's KV (sessions end and free theirs)."""
    problems = []
    g = growth_tokens_per_s(base.tokens_in, base.tokens_out, base.frame_ms)
    pool_tokens = base.pool_blocks * base.block_size
    if base.load == "poisson" and base.arrival_rate and base.session_s:
        live = min(base.sessions, base.arrival_rate * base.session_s)
        demand = live * g * min(base.session_s, base.duration_s) / 2
        if demand < pool_tokens:
            problems.append(
                f"the pool never fills: about {live:.0f} sessions live at once hold "
                f"~{demand / base.block_size:.0f} blocks on average, under the pool's "
                f"{base.pool_blocks} (sessions end and free their KV first); lengthen the "
                f"sessions or shrink the pool")
    else:
        live = base.sessions
        t_sat = predicted_t_sat_s(base.sessions, base.pool_blocks, base.block_size,
                                  base.tokens_in, base.tokens_out, base.frame_ms)
        if t_sat >= base.duration_s:
            problems.append(f"predicted t_sat {t_sat:.1f} s is beyond the run's "
                            f"{base.duration_s:g} s: the unbounded run cannot reach the cliff")
    if n_c is not None and live > n_c:
        problems.append(f"{live:.0f} live sessions is over this machine's compute limit "
                        f"N_c = {n_c}: the windowed run will go silent too (for compute)")
    need = math.ceil(live) * window_blocks(window, sinks, base.block_size)
    if need > base.pool_blocks:
        problems.append(f"the window does not fit: {live:.0f} sessions × "
                        f"{window_blocks(window, sinks, base.block_size)} blocks = {need} "
                        f"blocks > the pool's {base.pool_blocks}")
    return problems



def demo_engine() -> str:
    """The engine the console's one-click demo uses: $METRONOME_DEMO_ENGINE, default vllm
    (the browser test sets twin, so CI needs no second vLLM start)."""
    import os

    from runtime import ENGINES

    engine = os.environ.get(DEMO_ENGINE_ENV, "").strip() or "vllm"
    if engine not in ENGINES:
        raise ValueError(f"{DEMO_ENGINE_ENV}={engine!r} is not one of {', '.join(ENGINES)}")
    return engine


def preparation(engine: str, model: str = "tiny", seed: int = 0, watched: bool = False):
    """The host job (RunHost.start_prepared, 2 runs): the stored calibration for this machine
    or a new one, then the demo's unbounded and windowed runs. `watched` (the console): the
    twin's runs are paced to the wall clock, so the pool fills and frames go silent while a
    stakeholder watches (vLLM's always are)."""
    def prepare(store, progress) -> list[RunConfig]:
        from services import calibration

        cal = calibration.ensure(store, engine, model, progress)
        settings = derive(cal)
        progress(1.0, f"demo: {settings.period_note}; {settings.sessions} sessions, pool "
                      f"{settings.pool_blocks} blocks, predicted t_sat "
                      f"{settings.predicted_t_sat_s:.1f} s ({cal.label()})")
        configs = settings.configs(engine, model, seed)
        if watched and engine == "twin":
            configs = [replace(c, paced=True) for c in configs]
        return configs
    return prepare


def recalibration(engine: str, model: str = "tiny"):
    """The host job for the Recalibrate button: a calibration alone (0 runs)."""
    def prepare(store, progress) -> list[RunConfig]:
        from services import calibration

        calibration.calibrate(engine, model, store, progress=progress)
        return []
    return prepare
