"""A run's summary as one typed value: what `summarise` builds, `Runner.summary` holds and
`execute`/`run_series` return. Readers use attributes; JSON exists only at the store
(`runs.summary`, written by `write_run_end`) and at the CLI (`metronome run --json`).

The stored JSON stays flat and keyed as it always was, so a run recorded before this type
existed still reads: `from_json` gives a missing key its field's default and ignores a key it
does not know. `to_json` gives exactly the JSON a run has always stored, key order included
(the CLI prints it byte for byte): fields are declared in that order. Two groups are optional
as they always were: the data-parallel fields (present when `data_parallel_size` is set) and
the input fields (present when `input_path` is set; an audio-in model's encoder counts only
when `audio` is).

A remote load client's run (`engine` "remote", gateway/client_record.py) stores a summary of
another shape; it is not a RunSummary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from runtime.record import SILENT_CAUSES

__all__ = ["AudioInput", "RankSummary", "RunSummary"]

_RANK_KEYS = ("ranks", "stalled_rank", "data_parallel_size", "placement")
_INPUT_KEYS = ("input_path", "input")


@dataclass(frozen=True)
class RankSummary:
    """One data-parallel rank over the run (runtime/telemetry.py)."""

    rank: int
    max_occupancy: float
    stalled: bool
    stall_at_s: float | None
    frames: int
    silent_frames: int

    @classmethod
    def from_json(cls, d: dict) -> RankSummary:
        return cls(d.get("rank", 0), d.get("max_occupancy", 0.0), d.get("stalled", False),
                   d.get("stall_at_s"), d.get("frames", 0), d.get("silent_frames", 0))


@dataclass(frozen=True)
class AudioInput:
    """What an audio-in model's encoder did over the run (runtime/inputs.py); the JSON keeps
    these keys flat, after `input`."""

    tokens_in_per_frame: int
    frames_submitted: int
    encoder_passes: int
    encoder_frames: int
    encoder_frames_per_frame: float | None
    audio_tokens_per_frame: float | None
    encoder_ms_per_frame: float | None


_AUDIO_KEYS = tuple(f.name for f in fields(AudioInput))


@dataclass(frozen=True)
class RunSummary:
    """The run's summary; field names are the JSON keys (units in the names). A field a
    stored summary may predate (counted from a later version on) defaults to None, "not
    counted", never to a 0 that would read as measured; a new run sets every field."""

    run_id: str
    status: str  # finished, aborted, failed
    reason: str | None = None
    engine: str | None = None
    simulated: bool = False
    model: str | None = None
    dtype: str | None = None
    dtype_reason: str | None = None
    # The KV settings in force at the end; `changes` says how they got there.
    policy: str | None = None
    window: int | None = None
    sinks: int | None = None
    block_size: int | None = None
    pool_blocks: int | None = None
    frame_ms: float | None = None
    budget_ms: float | None = None
    wait_budget: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    sessions_offered: int = 0
    admitted: int = 0
    rejected: int = 0
    evicted: int = 0
    rollovers: int | None = None
    # Admitted sessions whose start waited for a tick with room in the open budget.
    open_budget: int | None = None
    opens_deferred: int | None = None
    # Each control sample judged this many seconds of frames (control/window.py).
    control_window_s: float | None = None
    frames: int = 0
    silent_frames: int = 0
    # Censored: no answer when finalised, latency unknown (≥ budget); a percentile whose rank
    # falls among them is null with its *_censored flag set: "> budget".
    censored_frames: int | None = None
    late_frames: int | None = None
    # Why frames went silent (they add up to silent_frames); None: a run from before the causes
    # were counted.
    silent_memory_frames: int | None = None
    silent_compute_frames: int | None = None
    silent_guard_frames: int | None = None
    silent_other_frames: int | None = None
    # Memory-caused silence with no total stall: some sessions starved while others ran.
    partial_stall: bool | None = None
    silence: str | None = None  # stall, partial stall, compute, guard, other, none
    silent_rate: float | None = None
    on_time_rate: float | None = None
    naive_on_time_rate: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p50_censored: bool = False
    p95_censored: bool = False
    p99_censored: bool = False
    naive_p95_ms: float | None = None
    max_occupancy: float = 0.0
    max_resident_blocks: int | None = None
    stalled: bool = False
    stall_at_s: float | None = None
    tsat_pred_s: float | None = None
    tsat_observed_s: float | None = None
    final_limit: int | None = None
    # The live count the controller held at the target over the last stable stretch
    # (control/nstar.py); None when it never settled there.
    n_star: int | None = None
    n_star_at_s: float | None = None
    n_star_for_s: float | None = None
    twin_cost_source: str | None = None
    tick_overruns: int | None = None
    max_overrun_ms: float | None = None
    target: float | None = None
    admission: str | None = None
    stall_guard: bool = False
    settings_at_start: dict | None = None  # policy, window, sinks, target, admission, stall_guard
    changes: tuple[dict, ...] = ()  # live changes in order: t, setting, change, old, new
    rows_lost: int = 0
    store_errors: dict | None = None  # table → the writer's last error, for tables that lost rows
    # Data parallel (absent from the JSON when data_parallel_size is None).
    ranks: tuple[RankSummary, ...] = ()
    stalled_rank: int | None = None  # the first rank to stall
    data_parallel_size: int | None = None
    placement: str | None = None
    # How frames entered the model (runtime/inputs.py; absent when input_path is None).
    input_path: str | None = None
    input: str | None = None
    audio: AudioInput | None = None  # an audio-in model's encoder counts
    duration_s: float = 0.0

    @property
    def silent_by_cause(self) -> dict[str, int | None]:
        """Silent frames per cause (record.SILENT_CAUSES), None where a run did not count."""
        counts = (self.silent_memory_frames, self.silent_compute_frames,
                  self.silent_guard_frames, self.silent_other_frames)
        return dict(zip(SILENT_CAUSES, counts))

    @property
    def ranked(self) -> bool:
        """More than one data-parallel rank."""
        return (self.data_parallel_size or 1) > 1

    def to_json(self) -> dict:
        """The summary as stored and printed: flat, in the keys and order it always had."""
        out = {}
        for name, value in vars(self).items():  # the fields, in their declared order
            if name in _RANK_KEYS and self.data_parallel_size is None:
                continue
            if name in _INPUT_KEYS and self.input_path is None:
                continue
            if name == "ranks":
                value = [asdict(r) for r in value]
            elif name == "changes":
                value = [dict(c) for c in value]
            elif isinstance(value, dict):  # a copy: the JSON's reader must not edit the run's
                value = dict(value)
            elif name == "audio":
                if value is not None:
                    out.update(asdict(value))
                continue
            out[name] = value
        return out

    @classmethod
    def from_json(cls, d: dict) -> RunSummary:
        """A stored summary (json.loads of `runs.summary`); tolerant of older rows."""
        known = {f.name for f in fields(cls)} - {"audio"}
        kw = {k: v for k, v in d.items() if k in known}
        kw.setdefault("run_id", "")
        kw.setdefault("status", "unknown")
        if "ranks" in kw:
            kw["ranks"] = tuple(RankSummary.from_json(r) for r in kw["ranks"] or ())
        if "changes" in kw:
            kw["changes"] = tuple(kw["changes"] or ())
        if any(k in d for k in _AUDIO_KEYS):
            kw["audio"] = AudioInput(**{k: d.get(k) for k in _AUDIO_KEYS})
        return cls(**kw)
