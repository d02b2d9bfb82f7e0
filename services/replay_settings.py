"""Replay from the CLI and the console: RunConfig arguments whose load follows a recording, and
the one line that says how a replay fared next to its original. No Streamlit here."""

from __future__ import annotations

import json
from dataclasses import fields

from load_gen.trace_load import RECORDED_FIELDS
from runtime import RunConfig
from runtime.trace_source import checked_trace, recording_settings

_DEFAULTS = {f.name: f.default for f in fields(RunConfig)}


def with_recorded_load(args: dict, given: set[str] | frozenset = frozenset()) -> dict:
    """RunConfig arguments for `args`: with load replay, every recorded load field the
    operator did not give (`given`) follows the recording, so the same sessions arrive at the
    same times with the same tokens; other loads pass through unchanged."""
    if args.get("load") != "replay":
        return dict(args)
    frame_ms = args.get("frame_ms")  # cuts a trace file's sessions into frames
    recorded = recording_settings(args.get("replay_run"), args.get("replay_trace"),
                                  args.get("replay_db"),
                                  frame_ms if frame_ms is not None else _DEFAULTS["frame_ms"])
    out = dict(args)
    for key in RECORDED_FIELDS:
        if key in recorded and key not in given:
            out[key] = recorded[key]
    out["arrival_rate"] = None  # arrivals are the trace's
    return out


# Load fields a caller may leave None ("not given"): a replay takes the recording's, any other
# load RunConfig's default. (RunConfig's own None means something else for some fields.)
UNSET_LOAD_FIELDS = ("seed", "frame_ms", "tokens_in", "tokens_out", "sessions", "duration_s",
                     "stagger")


def run_config(args: dict, given: set[str] | frozenset = frozenset()) -> RunConfig:
    """The one way from an operator's settings (the CLI's flags, the Load page's form) to a
    RunConfig: `with_recorded_load`, then RunConfig's defaults for load fields left None, and
    a replay's trace read and checked against it now (ValueError), so a form or the CLI
    refuses before anything starts. `given`: the fields the operator set, which a replay keeps
    (the Load page gives none: its replay follows the recording in every load field)."""
    values = with_recorded_load(args, given)
    config = RunConfig(**{key: _DEFAULTS[key] if value is None and key in UNSET_LOAD_FIELDS
                          else value for key, value in values.items()})
    checked_trace(config)
    return config


def headline(row: dict, original: dict | None = None) -> str:
    """'same load, W = 256: no stall, p95 41 ms' for a replay (with its original beside it),
    'original, unbounded: stalled at 2.1 s, p95 160 ms' for the run it replayed."""
    summary = json.loads(row["summary"]) if row.get("summary") else {}
    if row["policy"] == "window":
        policy = f"W = {row['window_tokens']}" + (f", S = {row['sink_tokens']}"
                                                  if row.get("sink_tokens") else "")
    else:
        policy = str(row["policy"])
    changed = []
    if original is not None:
        for key, label in (("pool_blocks", "pool"), ("admission", "admission"),
                           ("engine", "engine")):
            if row.get(key) != original.get(key):
                changed.append(f"{label} {row.get(key)}")
    what = ", ".join([policy, *changed])
    stall = summary.get("stall_at_s")
    fate = "no stall" if not summary.get("stalled") else f"stalled at {stall:.1f} s"
    p95 = summary.get("p95_ms")
    p95_text = "" if p95 is None else f", p95 {p95:.0f} ms"
    prefix = "original" if original is None else "same load"
    return f"{prefix}, {what}: {fate}{p95_text}"
