"""The Engine contract: the boundary between the runtime and a serving backend.

Shapes follow vLLM's scheduler/KV-manager split: the runtime owns sessions and deadlines, the
engine owns blocks. Running out of blocks is a normal outcome (frames wait, PoolStats shows it),
never an exception; misuse (unknown session, bad policy) is a ValueError.
"""

from __future__ import annotations

import math
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

POLICIES = ("unbounded", "window")
_LABEL = re.compile(r"window W=(\d+) S=(\d+)")


@dataclass(frozen=True)
class KVPolicy:
    """Per-session KV retention. `window`: keep the last `window_tokens` (+ `sink_tokens` first)."""

    kind: str = "unbounded"
    window_tokens: int | None = None
    sink_tokens: int = 0

    def __post_init__(self) -> None:
        if self.kind not in POLICIES:
            raise ValueError(f"policy {self.kind!r} is not one of {', '.join(POLICIES)}")
        if self.kind == "window":
            if self.window_tokens is None or self.window_tokens < 1:
                raise ValueError(f"window {self.window_tokens} must be ≥ 1 token with policy window")
        if self.sink_tokens < 0:
            raise ValueError(f"sinks {self.sink_tokens} must be ≥ 0")
        if self.kind == "window" and self.sink_tokens >= self.window_tokens:
            raise ValueError(f"sinks {self.sink_tokens} must be smaller than the window "
                             f"({self.window_tokens} tokens); allowed: 0 ≤ S < W")

    @property
    def label(self) -> str:
        """How the policy is named wherever a person reads it: "unbounded" or
        "window W=128 S=32" (the one spelling; metrics/run_state.py parses it back)."""
        if self.kind == "unbounded":
            return "unbounded"
        return f"window W={self.window_tokens} S={self.sink_tokens}"

    @classmethod
    def from_label(cls, text: str) -> KVPolicy:
        """The policy a `label` names (a recorded change read back); anything else is a
        ValueError naming the two spellings."""
        if text.strip() == "unbounded":
            return cls()
        match = _LABEL.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"policy label {text!r} is not 'unbounded' or 'window W=<tokens> "
                             "S=<tokens>'")
        return cls("window", int(match.group(1)), int(match.group(2)))

    def block_size_refusal(self, block_size: int) -> str | None:
        """Window and sink granularity is one block (see DESIGN: KV policy): why this policy
        does not fit `block_size` (one line), or None."""
        if self.kind == "window" and self.window_tokens < block_size:
            return (f"window {self.window_tokens} is smaller than one block ({block_size} "
                    f"tokens); allowed: window ≥ {block_size}")
        return None

    def check_block_size(self, block_size: int) -> None:
        refusal = self.block_size_refusal(block_size)
        if refusal:
            raise ValueError(refusal)

    def blocks_per_session(self, block_size: int) -> int | None:
        """Upper bound of resident blocks per session, None when unbounded."""
        if self.kind == "unbounded":
            return None
        sink_blocks = math.ceil(self.sink_tokens / block_size)
        return sink_blocks + math.ceil(self.window_tokens / block_size) + 1


@dataclass(frozen=True)
class PoolStats:
    """One sample of the engine's KV block pool."""

    t: float  # engine clock, seconds
    used_blocks: int
    total_blocks: int
    running: int
    waiting: int
    paused: int

    @property
    def occupancy(self) -> float:
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0


# FrameHandle.error of a frame its session's close cut off (the runtime closed it): not a failure.
CLOSED = "closed"


@dataclass(frozen=True)
class StepStats:
    """One engine step, as `Engine.drain_step_stats` reports it (the `steps` table; the twin's
    cost model is fitted on these)."""

    t: float  # engine clock at the step's end, seconds
    step_ms: float
    prompt_tokens: int
    gen_tokens: int
    used_blocks: int
    resident_tokens: int
    running: int

    def __post_init__(self) -> None:
        if self.step_ms < 0 or min(self.prompt_tokens, self.gen_tokens, self.used_blocks,
                                   self.resident_tokens, self.running) < 0:
            raise ValueError(f"step stats {self} must not be negative")


@dataclass
class FrameHandle:
    """One submitted frame; the engine fills it in from its own thread.

    Times are on the engine's clock (seconds). Readers use timestamps, not completion order:
    `tokens_by(deadline)` is what the frame had produced when its deadline passed.
    """

    session_id: int
    t_submit: float
    max_new: int
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # the output ids, as they come
    t_done: float | None = None
    error: str | None = None
    _event: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _watcher: Callable[[int, list[int] | None, float], None] | None = field(default=None,
                                                                          repr=False)

    def add_tokens(self, n: int, t: float, ids: list[int] | None = None) -> None:
        """The engine's thread: `n` tokens came out at `t` (engine clock); `ids`, where the
        backend knows them (then `token_ids` holds every one, in order)."""
        assert ids is None or len(ids) == n, f"{n} tokens with {len(ids)} ids"
        with self._lock:
            if ids is not None:
                self.token_ids.extend(ids)
            self.token_times.extend([t] * n)
            watcher = self._watcher
        if watcher is not None:
            watcher(n, ids, t)

    def watch(self, watcher: Callable[[int, list[int] | None, float], None]) -> None:
        """Call `watcher(n, ids, t)` for this frame's tokens, those already out first, from
        whichever thread adds them (a gateway pushes a frame's words as they come)."""
        with self._lock:
            times = list(self.token_times)
            ids = list(self.token_ids) if len(self.token_ids) == len(times) else None
            self._watcher = watcher
        start = 0  # tokens out before the watch, grouped by their time as they came
        for i in range(1, len(times) + 1):
            if i == len(times) or times[i] != times[start]:
                watcher(i - start, None if ids is None else ids[start:i], times[start])
                start = i

    def finish(self, t: float, error: str | None = None) -> None:
        if self.t_done is not None:
            return  # the first outcome stands (an error is not undone by a late completion)
        self.t_done = t
        self.error = error
        self._event.set()

    @property
    def failed(self) -> bool:
        """Ended with an error other than its session's close (CLOSED)."""
        return self.error is not None and self.error != CLOSED

    def done_by(self, t: float) -> bool:
        return self.t_done is not None and self.t_done <= t

    def tokens_by(self, t: float) -> int:
        return sum(1 for x in list(self.token_times) if x <= t)

    @property
    def t_first(self) -> float | None:
        times = self.token_times
        return times[0] if times else None

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)


def check_frame(token_ids: list[int], max_new: int, vocab_size: int, audio=None,
                frame_token_ids: tuple[int, ...] | None = None) -> None:
    """One frame check for every backend: misuse (no tokens, ids outside the vocabulary,
    nothing to generate) is a ValueError. An audio-in engine (`frame_token_ids` set) takes
    whole frames: the ids are its frame ids once per frame, with one audio array each."""
    if max_new < 1:
        raise ValueError(f"tokens out {max_new} must be ≥ 1")
    if not token_ids or not all(isinstance(t, int) and 0 <= t < vocab_size for t in token_ids):
        raise ValueError(f"a frame needs ≥ 1 token id in [0, {vocab_size})")
    if frame_token_ids is None:
        if audio is not None:
            raise ValueError("this engine's model takes token ids, not audio")
        return
    frames = len(token_ids) // len(frame_token_ids)
    if audio is None or list(token_ids) != list(frame_token_ids) * frames or \
            len(audio) != frames:
        raise ValueError(f"an audio-in frame is its audio with the ids {list(frame_token_ids)} "
                         f"once per frame; got {len(token_ids)} ids and "
                         f"{'no' if audio is None else len(audio)} audio arrays")


def applied() -> Future:
    """The future of a live KV change a backend made at once."""
    done: Future = Future()
    done.set_result(None)
    return done


class Engine(ABC):
    """What the runtime needs from a backend. One instance serves many sessions.

    Everything the runtime reads is declared here; nothing is looked up by name. Backends keep
    their own state; the base class holds none."""

    name: str = "engine"
    simulated: bool = False
    # The most tokens one request may hold (prompt + generated); the runtime rolls a session
    # over before reaching it. None: no limit (the runtime never rolls over).
    max_model_len: int | None = None
    # How far the wall clock ran past the engine clock at the last sleep (a paced simulation
    # that cannot keep up); 0 for real engines, whose clock is the wall clock.
    wall_lag_s: float = 0.0
    # The floating-point type the model runs in and why (engine/dtype.py); None: simulated.
    dtype: str | None = None
    dtype_reason: str | None = None
    # The folder whose tokenizer.json encodes the model's input text and decodes its output
    # ids (a gateway's words); None: the engine's ids have no text.
    tokenizer_dir: str | None = None
    # How a frame enters the model: "token ids" (a text model: the load's ids, stand-ins for
    # audio) or "audio encoder" (an audio-in model: each frame's audio through its encoder).
    input_path: str = "token ids"
    # An audio-in model's ids for one frame, as its processor makes them (e.g. audio_bos,
    # AUDIO × k, audio_eos); None: the load's ids are the frame.
    frame_token_ids: tuple[int, ...] | None = None

    def wall_time(self, t: float) -> float | None:
        """The perf_counter time at which engine time `t` happens (real engines: `t` itself);
        None where the engine clock is not the wall's (an unpaced simulation)."""
        return t

    @abstractmethod
    def now(self) -> float:
        """The engine's clock in seconds (perf_counter for real engines, virtual for the twin)."""

    @abstractmethod
    def sleep_until(self, t: float) -> None:
        """Let time pass until `t` on the engine clock (the twin simulates meanwhile)."""

    @abstractmethod
    def open(self, session_id: int, rank: int | None = None) -> None:
        """Open a session; `rank` pins it to one data-parallel rank for its whole life
        (None: the engine's own balancer places it). A rank outside [0, ranks) is a ValueError."""

    @abstractmethod
    def submit(self, session_id: int, token_ids: list[int], max_new: int,
               audio: list | None = None) -> FrameHandle:
        """Hand one frame to an open session; misuse is a ValueError (see `check_frame`).
        An audio-in engine takes `audio` too: one float32 array per frame in `token_ids`."""

    def input_stats(self) -> dict[str, float]:
        """An audio-in engine's encoder counts since it started (encoder_passes,
        encoder_frames, audio_tokens, encoder_ms); {} for a text model."""
        return {}

    @abstractmethod
    def close(self, session_id: int) -> None: ...

    @abstractmethod
    def pool(self) -> PoolStats:
        """The whole engine's pool: with data parallelism, the sum over ranks."""

    # --- data parallelism: each rank has its own KV pool; a session lives on one rank -------
    @property
    def ranks(self) -> int:
        """Data-parallel ranks, each with its own block pool (1: no data parallelism)."""
        return 1

    def pool_ranks(self) -> list[PoolStats]:
        """One PoolStats per rank, in rank order; the aggregate `pool()` hides a full rank."""
        return [self.pool()]

    def session_rank(self, session_id: int) -> int | None:
        """The rank an open session lives on; None when the engine placed it and does not
        say which (e.g. vLLM's own balancer)."""
        return 0

    @property
    @abstractmethod
    def policy(self) -> KVPolicy:
        """The KV policy in force now (after live changes)."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    def cost_source(self) -> str | None:
        """Where a simulated engine's step-cost model came from ("default" or a run id);
        None for a real engine."""
        return None

    # --- live KV policy: one way in ----------------------------------------------------------
    def policy_change_refusal(self, policy: KVPolicy) -> str | None:
        """Why `policy` cannot be applied while sessions run (one line), or None if it can.
        The one check of a live W/S, made where the engine knows its pool; a backend that
        can change live overrides it."""
        return (f"the {self.name} engine cannot change W or S while running; "
                "start a new run with the new values")

    def begin_policy_change(self, policy: KVPolicy) -> Future:
        """Start a live KV change without waiting for it. Refused: a ValueError with
        `policy_change_refusal`'s line. Accepted: a future that resolves (to None) once the
        engine applies it, or raises why it could not."""
        refusal = self.policy_change_refusal(policy)
        if refusal:
            raise ValueError(refusal)
        return self._start_policy_change(policy)

    def _start_policy_change(self, policy: KVPolicy) -> Future:
        """Apply an accepted change (its future); only reached when the refusal is None."""
        raise AssertionError(f"the {self.name} engine accepted a live KV change it cannot make")

    def drain_step_stats(self) -> list[StepStats]:
        """Per-step samples since the last call. Used to fit the twin's cost model."""
        return []

    def error(self) -> str | None:
        """A fatal engine error, once one happened."""
        return None

    @abstractmethod
    def shutdown(self) -> None: ...
