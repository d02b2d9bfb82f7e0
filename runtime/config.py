"""RunConfig: every setting of one experiment, validated before anything starts."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from engine.config import EngineConfig
from engine.contract import KVPolicy
from load_gen.synthetic import LoadConfig

ENGINES = ("vllm", "twin")
ADMISSIONS = ("off", "aimd", "gradient")
MEMORY_GUARDS = ("off", "on")
STALL_GUARDS = ("off", "on")


def _positive(name: str, value: float, unit: str = "") -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} {value}{unit} must be > 0")


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
    admission: str = "off"
    target: float = 0.8
    stall_guard: str = "off"
    memory_guard: str = "off"
    control_interval_s: float = 1.0
    paced: bool = False  # twin only: run in wall-clock time instead of as fast as possible
    vllm_args: tuple = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        _positive("frame period", self.frame_ms, " ms")
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
        if not 0 < self.target <= 1:
            raise ValueError(f"target {self.target} must be in (0, 1] of the budget")
        if self.stall_guard not in STALL_GUARDS:
            raise ValueError(
                f"stall guard {self.stall_guard!r} is not one of {', '.join(STALL_GUARDS)}")
        if self.memory_guard not in MEMORY_GUARDS:
            raise ValueError(
                f"memory guard {self.memory_guard!r} is not one of {', '.join(MEMORY_GUARDS)}")
        _positive("control interval", self.control_interval_s, " s")
        if self.paced and self.engine != "twin":
            raise ValueError(f"paced applies to the twin engine only (engine is {self.engine})")
        if self.policy == "window" and self.window is None:
            raise ValueError("policy window needs --window (tokens, ≥ one block)")
        if self.policy == "unbounded" and self.window is not None:
            raise ValueError(f"window {self.window} only applies to policy window")
        self.engine_config()  # validates policy, pool and block size
        load = self.load_config()  # validates the load shape (a replay reads its trace once)
        if load.kind == "replay":
            from load_gen import replay

            replay.check_config(replay.trace_for(load), self.frame_ms, self.tokens_out,
                                self.stagger)

    @property
    def budget(self) -> float:
        return self.budget_ms if self.budget_ms is not None else self.frame_ms

    def kv_policy(self) -> KVPolicy:
        return KVPolicy(self.policy, self.window, self.sinks)

    def engine_config(self) -> EngineConfig:
        return EngineConfig(model=self.model, block_size=self.block_size,
                            pool_blocks=self.pool_blocks, policy=self.kv_policy(),
                            max_model_len=self.max_model_len, seed=self.seed,
                            vllm_args=tuple(self.vllm_args))

    def load_config(self) -> LoadConfig:
        return LoadConfig(self.load, self.sessions, self.arrival_rate, self.session_s,
                          self.duration_s, self.seed, frame_ms=self.frame_ms,
                          wav_dir=self.wav_dir, wav_loop=self.wav_loop,
                          mic_device=self.mic_device, replay_run=self.replay_run,
                          replay_trace=self.replay_trace, replay_db=self.replay_db)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["vllm_args"] = [list(kv) for kv in self.vllm_args]
        return d
