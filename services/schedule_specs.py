"""What a schedule is and what its fire measures: pure, no APScheduler jobs, no Streamlit.

A schedule runs one of the console's experiments, a canary, or retention at a cron time or an
interval. Run kinds become RunConfigs here (validated when the schedule is defined, not when it
fires); a fire's finished runs give N* (N* discovery) and t_sat (when the pool reaches ρ ≈ 1),
and `drift` compares them with the schedule's previous fire.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

from apscheduler.triggers.cron import CronTrigger

from services import experiments
from runtime import RunConfig
from runtime.trace_source import checked_trace
from store import queries

RUN_KINDS = ("canary", *experiments.KINDS)
KINDS = (*RUN_KINDS, "retention")
TRIGGERS = ("interval", "cron")
MIN_EVERY_S = 1.0
MAX_EVERY_S = 366 * 86400.0
MAX_WAIT_S = 3600.0
MAX_REPEATS = 100
# A canary's load when none is given: a fixed handful of sessions for a short while.
CANARY_LOAD = {"load": "fixed", "sessions": 8, "duration_s": 10.0, "arrival_rate": None,
               "session_s": None, "stagger": False, "paced": False}


def _number(name: str, value, low: float, high: float, unit: str = "") -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name} {value}{unit} must be in [{_text(low)}, {_text(high)}]{unit}")


def _text(x: float) -> str:
    return f"{x:.0f}" if x >= 1e6 and x == int(x) else f"{x:g}"


@dataclass(frozen=True)
class ScheduleSpec:
    """One recurring job. `params` by kind: run kinds take "settings" (RunConfig arguments:
    the canary's run, or the experiment's base) and, for experiments, "window", "sinks" and
    (collapse) "repeats"; retention takes "older_than_days"."""

    name: str
    kind: str
    trigger: str = "interval"
    every_s: float | None = None  # trigger interval
    cron: str | None = None  # trigger cron: five fields, minute hour day month weekday
    params: dict = field(default_factory=dict)
    misfire_grace_s: float = 60.0  # a fire reached later than this is recorded as missed
    busy_wait_s: float = 30.0  # how long a fire waits for a busy engine before it is skipped
    drift_threshold: float = 0.2  # relative change of N* or t_sat that counts as drift

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 1 <= len(self.name.strip()) <= 80:
            raise ValueError(f"schedule name {self.name!r} must be 1 to 80 characters")
        if self.kind not in KINDS:
            raise ValueError(f"schedule kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.trigger not in TRIGGERS:
            raise ValueError(f"trigger {self.trigger!r} is not one of {', '.join(TRIGGERS)}")
        if self.trigger == "interval":
            if self.every_s is None:
                raise ValueError("an interval schedule needs every (seconds)")
            _number("every", self.every_s, MIN_EVERY_S, MAX_EVERY_S, " s")
            if self.cron is not None:
                raise ValueError(f"cron {self.cron!r} only applies to trigger cron")
        else:
            if not self.cron:
                raise ValueError("a cron schedule needs a cron expression "
                                 "(minute hour day month weekday)")
            if self.every_s is not None:
                raise ValueError(f"every {self.every_s} s only applies to trigger interval")
            try:
                CronTrigger.from_crontab(self.cron)
            except ValueError as exc:
                raise ValueError(f"cron {self.cron!r}: {exc}") from None
        _number("misfire grace", self.misfire_grace_s, 1, 86400, " s")
        _number("busy wait", self.busy_wait_s, 0, MAX_WAIT_S, " s")
        if not isinstance(self.drift_threshold, (int, float)) or \
                not 0 < self.drift_threshold <= 10:
            raise ValueError(f"drift threshold {self.drift_threshold} must be in (0, 10] "
                             f"(a relative change: 0.2 is 20 %)")
        if self.kind == "retention":
            _number("retention age", self.params.get("older_than_days"), 0.0001, 36500,
                    " days")
        else:
            self.configs()  # a schedule that could never run is refused when it is defined

    def configs(self) -> list[RunConfig]:
        """The runs one fire makes (empty for retention)."""
        if self.kind == "retention":
            return []
        settings = self.params.get("settings") or {}
        if not isinstance(settings, dict):
            raise ValueError(f"settings must be RunConfig arguments, not {type(settings).__name__}")
        try:
            base = RunConfig.from_settings(settings)
            checked_trace(base)  # a replay's trace: read and checked with the settings
        except (TypeError, ValueError) as exc:
            raise ValueError(f"settings: {exc}") from None
        if self.kind == "canary":
            return [base]
        window = int(self.params.get("window", 128))
        sinks = int(self.params.get("sinks", 0))
        repeats = int(self.params.get("repeats", 1))
        _number("repeats", repeats, 1, MAX_REPEATS)
        return experiments.plan(self.kind, base, window, sinks, repeats)

    def trigger_text(self) -> str:
        if self.trigger == "cron":
            return f"cron {self.cron}"
        s = self.every_s
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if s >= size and s % size == 0:
                return f"every {s / size:g} {unit}"
        return f"every {s:g} s"

    def row(self) -> dict:
        """Its columns in the schedules table (store/schedules.py)."""
        return {"name": self.name.strip(), "kind": self.kind, "trigger": self.trigger,
                "every_s": self.every_s, "cron": self.cron,
                "params": json.dumps(self.params, default=str),
                "misfire_grace_s": self.misfire_grace_s, "busy_wait_s": self.busy_wait_s,
                "drift_threshold": self.drift_threshold}

    @classmethod
    def from_row(cls, row: dict) -> "ScheduleSpec":
        params = row["params"]
        return cls(name=row["name"], kind=row["kind"], trigger=row["trigger"],
                   every_s=row["every_s"], cron=row["cron"],
                   params=json.loads(params) if isinstance(params, str) else dict(params),
                   misfire_grace_s=row["misfire_grace_s"], busy_wait_s=row["busy_wait_s"],
                   drift_threshold=row["drift_threshold"])


def spec_or_problem(row: dict) -> tuple["ScheduleSpec | None", str | None]:
    """A stored schedule as a spec, or why it cannot be one now (a trace file deleted since,
    settings a newer version refuses): one bad row must not stop the listing or the others."""
    try:
        return ScheduleSpec.from_row(row), None
    except (ValueError, TypeError, KeyError) as exc:
        text = str(exc).strip()
        return None, text.splitlines()[0] if text else type(exc).__name__


def canary_settings(live: dict, sessions: int = 8, duration_s: float = 10.0) -> dict:
    """A canary on the live settings: everything a recorded run (or the Load page) used —
    engine, model, policy, W, S, pool, admission, guards — with a fixed load of its own, so
    fires stay comparable whatever load the live run had."""
    keep = {k: v for k, v in live.items()
            if k in RunConfig.__dataclass_fields__ and not k.startswith(("wav_", "mic_",
                                                                         "replay_"))}
    keep["vllm_args"] = tuple(tuple(kv) for kv in keep.get("vllm_args") or ())
    return {**keep, **CANARY_LOAD, "sessions": int(sessions), "duration_s": float(duration_s)}


def params_for(kind: str, settings: dict, window: int = 128, sinks: int = 0, repeats: int = 3,
               older_than_days: float | None = None) -> dict:
    """A schedule's params from a form: a canary gets its settings as they are; an experiment
    takes the Experiments page's defaults under the settings given; retention its age."""
    if kind == "retention":
        return {"older_than_days": older_than_days}
    if kind == "canary":
        return {"settings": dict(settings)}
    return {"settings": {**experiments.DEFAULTS, **settings}, "window": int(window),
            "sinks": int(sinks), "repeats": int(repeats)}


# --- what a fire measured -----------------------------------------------------------------
def t_sat(summary: dict) -> float | None:
    """When the pool reached ρ ≈ 1 (observed), else the prediction at the stall; None for a
    run whose pool never filled and was not heading there."""
    for key in ("tsat_observed_s", "tsat_pred_s"):
        if summary.get(key) is not None:
            return float(summary[key])
    return None


def fire_metrics(cur, kind: str, rows: list[dict]) -> dict:
    """N* and t_sat of a fire's finished runs (queries.run_row rows)."""
    summaries = [(row, json.loads(row["summary"])) for row in rows if row.get("summary")]
    out = {"n_star": None, "t_sat_s": None}
    if kind == "N* discovery":
        for row, _ in summaries:
            out["n_star"] = experiments.converged_cap(queries.caps(cur, row["run_id"]))
    # The cliff's clock: unbounded runs where there are any (the windowed half of a cliff
    # vs slope never fills), every run otherwise.
    chosen = [s for r, s in summaries if r["policy"] == "unbounded"] or [s for _, s in summaries]
    values = [v for v in (t_sat(s) for s in chosen) if v is not None]
    if values:
        out["t_sat_s"] = statistics.median(values)
    return out


def drift(previous: dict, current: dict, threshold: float) -> tuple[dict, bool, str | None]:
    """Relative change of N* and t_sat since the previous fire, whether either moved more
    than `threshold`, and a line saying what moved (None when nothing did)."""
    changes, notes = {}, []
    for metric, label, unit in (("n_star", "N*", ""), ("t_sat_s", "t_sat", " s")):
        old, new = previous.get(metric), current.get(metric)
        if old is None or new is None or old == 0:
            changes[metric] = None
            continue
        change = (new - old) / abs(old)
        changes[metric] = change
        if abs(change) > threshold:
            notes.append(f"{label} moved {old:.3g}{unit} → {new:.3g}{unit} ({change:+.0%}, "
                         f"threshold ±{threshold:.0%})")
    return changes, bool(notes), "; ".join(notes) or None

