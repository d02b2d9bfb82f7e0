"""RunConfig: every setting of one experiment, validated before anything starts."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from control.limits import LIMITS, check_target
from control.placement import PLACEMENTS
from control.window import MAX_SILENT_SHARE, WindowedLimit, window_intervals
from engine import ENGINES
from engine.config import EngineConfig
from engine.contract import POLICIES, KVPolicy
from load_gen.synthetic import LoadConfig
from runtime.live_settings import LIVE_KEYS

MAX_DURATION_S = 7 * 24 * 3600.0  # a week: longer runs are a soak, split them into runs
# The shortest frame period: a speech frame is 10 ms at the finest (the usual feature hop;
# codecs use 20-80 ms), and each period is also a tick of the loop (telemetry, a store row, a
# pool sample). Below it a real engine's step cannot keep the beat, and a twin run of 10 s at
# 0.001 ms would be ten million ticks that never end in practice.
MIN_FRAME_MS = 10.0
# The store keeps seeds, block and token counts in 32-bit INTEGER columns (store/schema.py):
# validation admits only what those columns hold, so a run's row is never refused.
INT32_MAX = 2**31 - 1
# The W a form offers first when an operator picks policy window (RunConfig has no default W:
# a windowed run must say its window).
SUGGESTED_WINDOW_TOKENS = 256


@dataclass(frozen=True)
class ScheduledChange:
    """A live change a run applies to itself at `at_s` (run-relative): `--change 5:window=32`
    moves a run the way the Controls page does, for scripted experiments and tests."""

    at_s: float
    key: str
    value: object

    def __post_init__(self) -> None:
        if not isinstance(self.at_s, (int, float)) or not math.isfinite(self.at_s) \
                or self.at_s < 0:
            raise ValueError(f"change time {self.at_s} s must be ≥ 0")
        if self.key not in LIVE_KEYS:
            raise ValueError(f"change key {self.key!r} is not one of {', '.join(LIVE_KEYS)}")
        kinds = {"window": int, "sinks": int, "policy": str, "target": float, "limit": str,
                 "stall_guard": bool}
        if not isinstance(self.value, kinds[self.key]) or (
                kinds[self.key] is int and isinstance(self.value, bool)):
            raise ValueError(f"change {self.key}={self.value!r} needs a "
                             f"{kinds[self.key].__name__} value")

        if self.key in ("window", "sinks") and not 0 <= self.value <= INT32_MAX:
            raise ValueError(f"change {self.key}={self.value} must be in [0, {INT32_MAX}] tokens")
        if self.key == "target":
            check_target(self.value, "change target")
        if self.key == "limit" and self.value not in LIMITS:
            raise ValueError(f"change limit={self.value!r} is not one of {', '.join(LIMITS)}")
        if self.key == "policy" and self.value not in POLICIES:
            raise ValueError(f"change policy={self.value!r} is not one of {', '.join(POLICIES)}")

    @classmethod
    def parse(cls, text: str) -> "ScheduledChange":
        """`AT:KEY=VALUE`, e.g. `5:window=32`, `10:target=0.5`, `3:stall_guard=on`."""
        at, sep, rest = text.partition(":")
        key, eq, raw = rest.partition("=")
        if not sep or not eq or not raw:
            raise ValueError(f"change {text!r} is not AT:KEY=VALUE (e.g. 5:window=32)")
        key = key.strip().replace("-", "_")
        try:
            at_s = float(at)
            if key in ("window", "sinks"):
                value = int(raw)
            elif key == "target":
                value = float(raw)
            elif key == "stall_guard":
                if raw not in ("on", "off"):
                    raise ValueError(f"stall_guard {raw!r} is not one of on, off")
                value = raw == "on"
            else:
                value = raw
        except ValueError as exc:
            raise ValueError(f"change {text!r}: {exc}") from None
        return cls(at_s, key, value)


# Admission is a limit on live sessions: "fixed" caps at `sessions` (no control), "aimd" and
# "gradient" steer the cap by frame latency (control.limits).
ADMISSIONS = LIMITS


def _positive(name: str, value: float, unit: str = "") -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} {value}{unit} must be > 0")


def _int_in(name: str, value, low: int, high: int = INT32_MAX) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} {value!r} must be an integer in [{low}, {high}]")


def check_changes(cfg: "RunConfig") -> None:
    """Play the scheduled changes in order against the run's settings, so a change that
    could never apply (a window below one block, sinks ≥ the window, a window the pool cannot
    hold) is refused before the run starts, as every other flag is. What only the engine can
    judge (sinks on an unsupported backend) is still refused live, as a param_rejected event."""
    engine = cfg.engine_config()
    policy = engine.policy
    for change in sorted(cfg.changes, key=lambda c: c.at_s):
        if change.key not in ("window", "sinks", "policy"):
            continue
        fields = {"policy": policy.kind, "window": policy.window_tokens,
                  "sinks": policy.sink_tokens, change.key: change.value}
        where = f"change at {change.at_s:g} s ({change.key}={change.value})"
        try:  # the engine config's own checks: block size, a session's window in the pool
            policy = KVPolicy(fields["policy"], fields["window"], fields["sinks"])
            replace(engine, policy=policy)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class RunConfig:
    engine: str = "vllm"
    model: str = "tiny"
    seed: int = 0
    policy: str = "unbounded"
    window: int | None = None  # tokens; required with policy window
    sinks: int = 0
    block_size: int = 32
    pool_blocks: int = 256
    max_model_len: int | None = None
    frame_ms: float = 80.0
    budget_ms: float | None = None  # None: the frame period
    tokens_in: int = 16
    tokens_out: int = 4
    wait_budget: float | None = None  # gateway answers empty after wait_budget·budget
    load: str = "fixed"
    sessions: int = 8
    arrival_rate: float | None = None
    session_s: float | None = None
    duration_s: float = 10.0
    stagger: bool = False
    wav_dir: str | None = None  # load wav: folder of .wav files, replayed round-robin
    wav_loop: bool = True  # load wav: loop each file (else its session ends with it)
    mic_device: str | None = None  # load mic: PortAudio input index or name
    replay_run: str | None = None  # load replay: re-offer this recorded run's sessions
    replay_trace: str | None = None  # load replay: or a CSV/Parquet trace file's
    replay_db: str | None = None  # the database holding replay_run (None: $METRONOME_DB)
    admission: str = "fixed"
    target: float = 0.8
    stall_guard: bool = False  # evict the largest session when the pool stalls
    memory_guard: bool = False  # refuse sessions whose KV would fill the pool in their lifetime
    control_interval_s: float = 1.0
    # Each control sample judges the frames of the last control_window_s, and of at least 36
    # ticks (control/window.py): at 80 ms 3 s puts one slow tick at 2.7 %, under the p95's 5 %.
    control_window_s: float = 3.0
    # Session opens per tick (runtime/opens.py): the rest start at the next tick with room,
    # never rejected. 2: the 6/s ramp needs 0.48 opens per 80 ms tick, so steady
    # arrivals wait at most a tick, while a burst of 20 spreads over 10 ticks (0.8 s) instead
    # of putting 20 first chunks into the step every live session's frame shares.
    open_budget: int = 2
    paced: bool = False  # twin only: run in wall-clock time instead of as fast as possible
    # Data parallelism: ranks, each with its own pool of pool_blocks (the vLLM backend also
    # takes `--vllm-arg data_parallel_size=N`), and where a new session goes: "engine" (the
    # engine's own balancer), "count" (fewest sessions) or "headroom" (longest time to fill).
    data_parallel_size: int = 1
    placement: str = "engine"
    vllm_args: tuple = field(default_factory=tuple)
    changes: tuple = field(default_factory=tuple)  # ScheduledChange, applied live in order

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        _positive("frame period", self.frame_ms, " ms")
        if self.frame_ms < MIN_FRAME_MS:
            raise ValueError(f"frame period {self.frame_ms:g} ms must be ≥ {MIN_FRAME_MS:g} ms "
                             "(the shortest speech frame; each period is also a loop tick)")
        _int_in("seed", self.seed, 0)
        _int_in("pool blocks", self.pool_blocks, 2)
        _int_in("block size", self.block_size, 1)
        _int_in("data parallel size", self.data_parallel_size, 1)
        if self.pool_blocks * self.block_size * self.data_parallel_size > INT32_MAX:
            # ticks.total_blocks and steps.resident_tokens are 32-bit columns too
            raise ValueError(f"pool of {self.pool_blocks} blocks × {self.block_size} tokens × "
                             f"{self.data_parallel_size} rank(s) must hold at most {INT32_MAX} "
                             "tokens (the store's 32-bit columns)")
        if self.max_model_len is not None:
            _int_in("max model len", self.max_model_len, 1)
        for name, value in (("window", self.window), ("sinks", self.sinks)):
            if value is not None and (not isinstance(value, int) or abs(value) > INT32_MAX):
                # the sign is KVPolicy's to judge, the size the store's
                raise ValueError(f"{name} {value!r} must be an integer of at most {INT32_MAX}")
        if self.budget_ms is not None:
            _positive("budget", self.budget_ms, " ms")
        if not 1 <= self.tokens_in <= 8192:
            raise ValueError(f"tokens in {self.tokens_in} must be in [1, 8192]")
        if not 1 <= self.tokens_out <= 1024:
            raise ValueError(f"tokens out {self.tokens_out} must be in [1, 1024]")
        if self.wait_budget is not None and not 0 < self.wait_budget <= 1:
            raise ValueError(f"wait budget {self.wait_budget} must be in (0, 1] of the budget")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission {self.admission!r} is not one of {', '.join(ADMISSIONS)}")
        check_target(self.target)
        for name, flag in (("stall guard", self.stall_guard),
                           ("memory guard", self.memory_guard)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} {flag!r} must be true or false")
        _positive("control interval", self.control_interval_s, " s")
        _positive("control window", self.control_window_s, " s")
        if isinstance(self.open_budget, bool) or not isinstance(self.open_budget, int) \
                or not 1 <= self.open_budget <= 1024:
            raise ValueError(f"open budget {self.open_budget!r} must be an integer in [1, 1024] "
                             "sessions per tick")
        if not self.duration_s <= MAX_DURATION_S:
            raise ValueError(f"duration {self.duration_s:g} s must be in (0, {MAX_DURATION_S:.0f}] "
                             "(a week)")
        for change in self.changes:
            if not isinstance(change, ScheduledChange):
                raise ValueError(f"change {change!r} is not a ScheduledChange")
            if change.at_s >= self.duration_s:
                raise ValueError(f"change at {change.at_s} s is not before the run's end "
                                 f"({self.duration_s} s); allowed: [0, {self.duration_s})")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r} is not one of "
                             f"{', '.join(PLACEMENTS)}")
        if self.paced and self.engine != "twin":
            raise ValueError(f"paced applies to the twin engine only (engine is {self.engine})")
        if self.policy == "window" and self.window is None:
            raise ValueError("policy window needs --window (tokens, ≥ one block)")
        if self.policy == "unbounded" and self.window is not None:
            raise ValueError(f"window {self.window} only applies to policy window")
        check_changes(self)  # validates policy, pool and block size, then each change
        # The load's shape; a replay's trace is read where a run starts (runtime.trace_source).
        self.load_config()

    @property
    def frame_s(self) -> float:
        return self.frame_ms / 1e3

    @property
    def budget(self) -> float:
        return self.budget_ms if self.budget_ms is not None else self.frame_ms

    def kv_policy(self) -> KVPolicy:
        return KVPolicy(self.policy, self.window, self.sinks)

    def windowed_limit(self, limit_of) -> WindowedLimit:
        """The control sampler through which a run of this config feeds the limit in force
        (`limit_of()`, read from the run's live settings)."""
        intervals = window_intervals(self.control_window_s, self.control_interval_s, self.frame_s)
        return WindowedLimit(limit_of, self.control_interval_s, min_samples=5,
                             window_intervals=intervals,
                             max_silent_share=MAX_SILENT_SHARE)

    def engine_config(self) -> EngineConfig:
        return EngineConfig(model=self.model, block_size=self.block_size,
                            pool_blocks=self.pool_blocks, policy=self.kv_policy(),
                            max_model_len=self.max_model_len, seed=self.seed,
                            vllm_args=tuple(self.vllm_args),
                            data_parallel_size=self.data_parallel_size,
                            frame_ms=self.frame_ms)

    def load_config(self) -> LoadConfig:
        return LoadConfig(self.load, self.sessions, self.arrival_rate, self.session_s,
                          self.duration_s, self.seed, frame_ms=self.frame_ms,
                          wav_dir=self.wav_dir, wav_loop=self.wav_loop,
                          mic_device=self.mic_device, replay_run=self.replay_run,
                          replay_trace=self.replay_trace, replay_db=self.replay_db)

    @classmethod
    def from_settings(cls, settings: dict) -> "RunConfig":
        """A RunConfig from stored settings (`as_dict`, the runs table's JSON, a schedule's
        params): JSON lists back to tuples, changes back from their AT:KEY=VALUE text, and the
        vocabulary of runs recorded before guards were booleans ("on"/"off") and before the
        fixed limit was named fixed ("off"). Unknown keys are a ValueError."""
        d = dict(settings)
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)}")
        if "vllm_args" in d:
            d["vllm_args"] = tuple(tuple(kv) for kv in d["vllm_args"] or ())
        if "changes" in d:
            d["changes"] = tuple(c if isinstance(c, ScheduledChange) else ScheduledChange.parse(c)
                                 for c in d["changes"] or ())
        for guard in ("stall_guard", "memory_guard"):
            if d.get(guard) in ("on", "off"):
                d[guard] = d[guard] == "on"
        if d.get("admission") == "off":
            d["admission"] = "fixed"
        return cls(**d)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["vllm_args"] = [list(kv) for kv in self.vllm_args]
        d["changes"] = [f"{c['at_s']:g}:{c['key']}={c['value']}" for c in d["changes"]]
        return d
