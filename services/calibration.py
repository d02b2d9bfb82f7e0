"""Calibration: how fast this machine's engine steps, and its compute limit N_c.

N_c is the number of synchronised sessions at which frame p95 reaches the target (0.8 of the
budget) with KV bounded to a window, so memory never limits it: only compute does. Found by
short windowed runs of a fixed load (probes) on one engine: the first probe (2 sessions) gives
steps to fit the twin's cost model on (engine.twin_cost.fit_cost_model), the fit's analytic N_c is
where the search starts, then it brackets and bisects on measured p95 until the bracket is
within 10 % (at most MAX_PROBES probes); the load found is probed again for CONFIRM_TICKS
ticks, and one that fails there is over: the next 10 % under it is confirmed instead (at most
MAX_CONFIRMS). On vLLM, 2 cores: one engine start (~20 s), ~7 probes of 3 s and a confirm of
8 s at 80 ms frames, and on an AVX2-only CPU ~4 more probes and up to 3 confirms of 16 s at
160 ms: 71-129 s there (docs/benchmarks/log.md); on the twin, well under a second.

Probe runs go to a private in-memory store, so they never appear among the operator's runs;
only the calibration row is kept, per engine + model + machine (`store/calibrations.py`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
from dataclasses import dataclass, replace

from control.window import MAX_SILENT_SHARE  # a probe with more silent frames is over the limit
from engine.twin import CostModel
from engine.twin_cost import analytic_n_star, fit_cost_model
from runtime import RunConfig, execute, latest_cost_model, make_engine
from services.machine import machine_key
from services.probe_search import N_MAX
from services.probe_search import bracket as _bracket
from services.probe_search import next_probe as _next_probe
from store import Store, calibrations, queries

logger = logging.getLogger(__name__)

TARGET_FRACTION = 0.8  # of the budget: the same target N* discovery steers to by default
MAX_PROBES = 7  # at 80 ms frames
MAX_PROBES_LONGER = 4  # at each longer period: the cost fit of the probes so far starts it
PROBE_S = {"vllm": 3.0, "twin": 6.0}  # long enough for ~35 frames per session at 80 ms
# The periods real interaction models tick at (Moshi 80 ms; the omni models every 1-2 s),
# tried in order while N_c stays under DEMO_MIN_SESSIONS.
PERIODS_MS = (80.0, 160.0, 320.0, 640.0, 1000.0, 2000.0)
DEMO_MIN_SESSIONS = 4  # fewer make no convincing cliff vs slope pair
FIRST_PROBE_SESSIONS = 2
# The load found is probed again, at least CONFIRM_LENGTH probes and CONFIRM_TICKS ticks
# long, before it is N_c: a bisection keeps the largest load that passed once, and near the
# limit a 3 s probe passes or fails by noise (vLLM, 2 cores, one load of 18 sessions: 3 s
# p95s of 54-58 ms, single seconds 44-68 ms), so one pass overstated N_c (calibrated 21, 21,
# 23 where 20 s loads served 18, 18, 15: benchmarks/n_star_discovery.py --steady-s 20). A load
# that fails its confirm is over, and the next confirm is 10 % (at least one session) under
# it, at most MAX_CONFIRMS a period: going back to bisecting from the last short pass below
# it fell far (AVX2 Zen 3, 160 ms: 19 passed once and failed its confirm, 9 then failed its
# own at 129 ms against 128, and N_c came out 4 where 20 s loads served 13).
CONFIRM_LENGTH = 2
CONFIRM_TICKS = 100  # 8 s at 80 ms frames, 16 s at 160 ms
MAX_CONFIRMS = 3
WARM_UP_FRAMES = 12  # a discarded run before the first probe (about 1 s at 80 ms)
# The frame and window every probe (and the demo) uses: the defaults of a run.
FRAME = {"frame_ms": 80.0, "tokens_in": 16, "tokens_out": 4, "block_size": 32,
         "window": 128, "sinks": 0}


@dataclass(frozen=True)
class Calibration:
    engine: str
    model: str
    machine: str  # the CPU (model, cores, the flags that matter) and the GPU, if any
    dtype: str  # the type the model ran in (engine/dtype.py); "simulated" for the twin
    calibrated_at: dt.datetime
    n_c: int  # the largest load whose p95 held through its confirm (0: not even 1; after
    # MAX_CONFIRMS failed confirms, the step under the last, unconfirmed and logged)
    n_c_estimate: int  # the cost model's analytic N_c, where the search started
    target_ms: float
    frame_ms: float
    tokens_in: int
    tokens_out: int
    block_size: int
    window_tokens: int
    sink_tokens: int
    a_ms: float
    b_ms_per_token: float
    c_ms_per_resident_token: float
    r2: float
    n_steps: int
    # ((sessions, p95 ms or None when censored, silent rate, within target, frame_ms), ...)
    probes: tuple
    periods: tuple  # ((frame_ms, N_c), ...) in the order measured; the last is frame_ms's
    seconds: float  # how long the calibration took, engine start included

    def __post_init__(self) -> None:
        if not 0 <= self.n_c <= N_MAX:
            raise ValueError(f"N_c {self.n_c} must be in [0, {N_MAX}]")
        if not 0 < self.target_ms <= self.frame_ms:
            raise ValueError(f"target {self.target_ms} ms must be in (0, {self.frame_ms}] ms "
                             "(the frame period)")

    @property
    def cost(self) -> CostModel:
        return CostModel(self.a_ms, self.b_ms_per_token, self.c_ms_per_resident_token,
                         source="calibration")

    def label(self) -> str:
        return (f"calibrated on {self.calibrated_at:%Y-%m-%d %H:%M} for "
                f"{self.engine}/{self.model} on {self.machine}")

    def as_row(self) -> dict:
        row = {name: getattr(self, name) for name in self.__dataclass_fields__}
        row["probes"] = json.dumps([list(p) for p in self.probes])
        row["periods"] = json.dumps([list(p) for p in self.periods])
        return row

    def as_dict(self) -> dict:
        d = self.as_row()
        d["calibrated_at"] = self.calibrated_at.isoformat(timespec="seconds")
        d["probes"] = [list(p) for p in self.probes]
        d["periods"] = [list(p) for p in self.periods]
        return d

    @classmethod
    def from_row(cls, row: dict) -> "Calibration":
        d = {name: row[name] for name in cls.__dataclass_fields__}
        d["probes"] = tuple(tuple(p) for p in json.loads(d["probes"]))
        d["periods"] = tuple((float(f), int(n)) for f, n in json.loads(d["periods"]))
        d["calibrated_at"] = d["calibrated_at"].to_pydatetime() \
            if hasattr(d["calibrated_at"], "to_pydatetime") else d["calibrated_at"]
        for name in ("n_c", "n_c_estimate", "tokens_in", "tokens_out", "block_size",
                     "window_tokens", "sink_tokens", "n_steps"):
            d[name] = int(d[name])
        return cls(**d)


def engine_dtype(engine: str) -> str:
    """The dtype this engine runs the model in here (a calibration holds for that one only)."""
    if engine == "twin":
        return "simulated"
    from engine.dtype import for_host

    return for_host().dtype


def stored(cur, engine: str, model: str) -> Calibration | None:
    """The newest calibration of this engine, model and dtype for this machine (a store
    cursor): a database moved to another machine recalibrates rather than reuse its N_c."""
    row = calibrations.latest(cur, engine, model, machine_key(engine, cur),
                              engine_dtype(engine))
    return None if row is None else Calibration.from_row(row)


def ensure(store, engine: str, model: str, progress=None, recalibrate: bool = False,
           **kwargs) -> Calibration:
    """The stored calibration for this engine, model and machine, or a new one (kept)."""
    found = None if recalibrate else stored(store.cursor(), engine, model)
    if found is not None:
        logger.info("using the %s", found.label())
        return found
    return calibrate(engine, model, store, progress=progress, **kwargs)


def probe_base(engine: str, model: str, probe_s: float | None = None) -> RunConfig:
    """The windowed run every probe is a copy of (sessions and frame period aside)."""
    return RunConfig(engine=engine, model=model, policy="window", window=FRAME["window"],
                     sinks=FRAME["sinks"], block_size=FRAME["block_size"],
                     pool_blocks=N_MAX * (FRAME["window"] // FRAME["block_size"] + 2),
                     frame_ms=FRAME["frame_ms"], tokens_in=FRAME["tokens_in"],
                     tokens_out=FRAME["tokens_out"], load="fixed",
                     duration_s=probe_s or PROBE_S.get(engine, 3.0))


def calibrate(engine: str, model: str, store=None, *, engine_factory=None, progress=None,
              probe_s: float | None = None, cost: CostModel | None = None,
              keep_engine: bool = False, periods_ms: tuple[float, ...] | None = None,
              tokens_in: int | None = None) -> Calibration:
    """Measure and (with a store) keep a calibration. `progress(fraction, text)` is called
    after each probe (the console's progress bar; it may raise to abort). `engine_factory`
    (config → Engine) and `cost` (the twin's cost model) are for tests and the twin;
    `keep_engine` leaves the factory's engine running (a test session shares it).

    N_c is searched at 80 ms frames first; while it is under DEMO_MIN_SESSIONS, at the next
    longer period of PERIODS_MS (fewer probes each, started from the fitted cost model), so a
    slow machine still gets a period it serves a convincing load at; `periods_ms`: each of
    these instead, whatever N_c comes out (the last one's is the calibration's). Tokens in per
    frame: a text model's `tokens_in` (default FRAME's); an audio-in model's are what its
    processor makes of a frame (`frame_token_ids`), whatever is asked."""
    t0 = time.monotonic()
    if probe_s is not None and not 0 < probe_s <= 60:
        raise ValueError(f"probe length {probe_s} s must be in (0, 60]")
    if tokens_in is not None and not 1 <= tokens_in <= 4096:
        raise ValueError(f"tokens in per frame {tokens_in} must be in [1, 4096]")
    if periods_ms is not None and (not periods_ms or min(periods_ms) < PERIODS_MS[0]):
        raise ValueError(f"calibration periods {periods_ms} ms must be a non-empty list of "
                         f"periods ≥ {PERIODS_MS[0]:g} ms")
    ladder = periods_ms is None
    periods_ms = PERIODS_MS if ladder else tuple(periods_ms)
    base = probe_base(engine, model, probe_s)
    base = replace(base, frame_ms=periods_ms[0], tokens_in=tokens_in or base.tokens_in)
    if engine_factory is None and engine == "twin" and cost is None and store is not None:
        cost = latest_cost_model(store)
    if engine_factory is None:
        if engine == "twin" and cost is not None:
            from engine.twin import TwinEngine
            engine_factory = lambda config: TwinEngine(config.engine_config(), cost)  # noqa: E731
        else:
            engine_factory = make_engine
    note = progress or (lambda fraction, text: None)
    note(0.0, f"starting the {engine} engine")
    eng = engine_factory(base)
    search = _Search(base, eng, note, probe_s, engine_factory)
    periods: list[tuple[float, int, int]] = []  # (frame_ms, N_c, estimate)
    try:
        search.warm_up()
        for i, frame_ms in enumerate(periods_ms):
            n_c, estimate = search.n_c_at(frame_ms, MAX_PROBES if i == 0 else MAX_PROBES_LONGER)
            periods.append((frame_ms, n_c, estimate))
            if ladder and n_c >= DEMO_MIN_SESSIONS:
                break
    finally:
        if not keep_engine:
            eng.shutdown()
        search.close()
    frame_ms, n_c, estimate = periods[-1]
    cost_fit, facts = fit_cost_model(search.steps, source="calibration")
    cur = None if store is None else store.cursor()
    result = Calibration(
        engine=engine, model=model, machine=machine_key(engine, cur, cost),
        dtype=eng.dtype or "simulated",  # the Engine contract's; None for the twin
        calibrated_at=dt.datetime.now().replace(microsecond=0), n_c=n_c,
        n_c_estimate=estimate, target_ms=TARGET_FRACTION * frame_ms, frame_ms=frame_ms,
        tokens_in=search.base.tokens_in, tokens_out=base.tokens_out, block_size=base.block_size,
        window_tokens=base.window, sink_tokens=base.sinks, a_ms=cost_fit.a_ms,
        b_ms_per_token=cost_fit.b_ms_per_token,
        c_ms_per_resident_token=cost_fit.c_ms_per_resident_token, r2=facts["r2"],
        n_steps=facts["n_steps"], probes=tuple(search.probes),
        periods=tuple((f, n) for f, n, _ in periods),
        seconds=round(time.monotonic() - t0, 3))
    if store is not None:
        calibrations.save(store, result.as_row())
    note(1.0, f"calibrated: N_c = {result.n_c} sessions at {frame_ms:g} ms frames "
              f"({result.seconds:.0f} s)")
    logger.info("%s: N_c %d at %g ms (estimate %d) in %.1f s", result.label(), result.n_c,
                frame_ms, estimate, result.seconds)
    return result


class _Search:
    """Probes of one engine at one frame period after another; every probe's steps feed the
    cost fit that starts the next period's search."""

    def __init__(self, base: RunConfig, eng, note, probe_s: float | None,
                 engine_factory=None) -> None:
        self.eng, self.note, self.probe_s = eng, note, probe_s
        self.first_eng, self.engine_factory = eng, engine_factory
        self.base = self._frames_of(base, eng)
        self.store = Store(":memory:")  # probe runs never appear among the operator's runs
        self.steps: list[dict] = []
        self.probes: list[tuple] = []  # (sessions, p95 or None, silent rate, ok, frame_ms)

    @staticmethod
    def _frames_of(base: RunConfig, eng) -> RunConfig:
        ids = None if eng is None else eng.frame_token_ids  # an audio-in model's, recorded
        return base if ids is None else replace(base, tokens_in=len(ids))

    def _engine_for(self, frame_ms: float) -> None:
        """An audio-in engine's encoder window is one frame of the period it started at:
        another period gets an engine of its own (the first one is the caller's)."""
        if self.eng is None or self.eng.frame_token_ids is None or \
                frame_ms == self.base.frame_ms:
            return
        if self.eng is not self.first_eng:
            self.eng.shutdown()
        self.note(min(0.99, len(self.probes) / (MAX_PROBES + 2 * MAX_PROBES_LONGER)),
                  f"starting an engine for {frame_ms:g} ms frames (its encoder window)")
        self.base = replace(self.base, frame_ms=frame_ms)
        self.eng = self.engine_factory(self.base)
        self.base = self._frames_of(self.base, self.eng)
        self.warm_up()

    def close(self) -> None:
        if self.eng is not self.first_eng:
            self.eng.shutdown()
        self.store.close()

    def warm_up(self) -> None:
        """A discarded run first: a fresh vLLM engine's first requests are slow (seen: 2
        sessions at 80 ms censored right after the start, 1 session at 40 ms a probe later)."""
        execute(replace(self.base, sessions=FIRST_PROBE_SESSIONS,
                        duration_s=WARM_UP_FRAMES * self.base.frame_s),
                self.store, self.eng)

    def _probe(self, frame_ms: float, n: int, found: dict, max_probes: int,
               confirm: bool = False) -> bool:
        # Long enough for ~35 frames a session at 80 ms, and at least 24 at longer periods.
        duration = self.probe_s or max(self.base.duration_s, 24 * frame_ms / 1e3)
        if confirm:
            duration = max(CONFIRM_LENGTH * duration, CONFIRM_TICKS * frame_ms / 1e3)
        config = replace(self.base, sessions=n, frame_ms=frame_ms, duration_s=duration)
        target_ms = TARGET_FRACTION * config.budget
        s = execute(config, self.store, self.eng)
        self.steps.extend(queries.steps(self.store.cursor(), s.run_id))
        p95 = None if s.p95_censored or s.p95_ms is None else float(s.p95_ms)
        silent = float(s.silent_rate or 0.0)
        ok = s.status == "finished" and p95 is not None and p95 <= target_ms \
            and silent <= MAX_SILENT_SHARE
        found[n] = (n, p95, silent, ok)
        self.probes.append((n, p95, silent, ok, frame_ms))
        logger.info("calibration probe at %g ms: %d sessions, p95 %s ms, silent %.1f%% → %s",
                    frame_ms, n, p95, 100 * silent, "within target" if ok else "over")
        self.note(min(0.99, len(self.probes) / (MAX_PROBES + 2 * MAX_PROBES_LONGER)),
                  f"calibrating at {frame_ms:g} ms frames: {n} sessions → p95 "
                  + (f"{p95:.0f} ms" if p95 is not None else "> budget")
                  + f" (target {target_ms:.0f} ms), "
                  + (f"held {duration:.0f} s to confirm" if confirm
                     else f"probe {len(found)} of ≤ {max_probes}"))
        return ok

    def n_c_at(self, frame_ms: float, max_probes: int) -> tuple[int, int]:
        """(N_c, the cost model's estimate) at this frame period."""
        self._engine_for(frame_ms)
        found: dict[int, tuple] = {}
        target_ms = TARGET_FRACTION * frame_ms
        resident = self.base.window + self.base.sinks
        if not self.steps:
            self._probe(frame_ms, FIRST_PROBE_SESSIONS, found, max_probes)
        model_fit, _ = fit_cost_model(self.steps, source="calibration")
        estimate = max(1, min(N_MAX, analytic_n_star(
            model_fit, target_ms, self.base.tokens_in, self.base.tokens_out, resident)))
        lo, hi = _bracket(found)
        while len(found) < max_probes:
            n = _next_probe(lo, hi, estimate, found)
            if n is None:
                break
            self._probe(frame_ms, n, found, max_probes)
            lo, hi = _bracket(found)
        for _ in range(MAX_CONFIRMS):
            if lo == 0 or self._probe(frame_ms, lo, found, max_probes, confirm=True):
                return lo, estimate
            lo = min(lo - 1, math.floor(0.9 * lo))  # it failed: over; 10 % under it next
        logger.warning("calibration at %g ms: no load held its confirm; N_c %d, unconfirmed",
                       frame_ms, lo)
        return lo, estimate
