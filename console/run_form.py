"""The new-run form: widgets for every setting an operator picks, as RunConfig arguments.

No bounds on the inputs: RunConfig's checks are the single source of truth, and their messages
name the allowed range, so an invalid value is explained by the error shown under the form.
"""

from __future__ import annotations

from dataclasses import fields

import streamlit as st

from console.views import engine_label
from engine.contract import POLICIES
from engine.models import NAMED_MODELS
from runtime import ADMISSIONS, ENGINES, RunConfig
from runtime.config import MIN_FRAME_MS, SUGGESTED_WINDOW_TOKENS

SYNTHETIC_LOADS = ("fixed", "ramp", "poisson")


def load_choices() -> list[str]:
    """Synthetic shapes, plus WAV replay, the microphone and the replay of a recording once the
    runtime takes them (a RunConfig with a wav_dir / mic_device / replay_run field), and
    `gateway`: remote clients only (the browser microphone, the OpenAI SDK), N the cap."""
    have = {f.name for f in fields(RunConfig)}
    extra = [kind for kind, field in (("wav", "wav_dir"), ("mic", "mic_device"),
                                      ("replay", "replay_run")) if field in have]
    return [*SYNTHETIC_LOADS, *extra, "gateway"]


def settings_widgets() -> dict:
    """Every field starts at RunConfig's own default (one definition; the CLI reads them too)."""
    default = {f.name: f.default for f in fields(RunConfig)}
    a, b, c = st.columns(3)
    engine = a.selectbox("Engine", ENGINES, format_func=engine_label, key="engine")
    model = b.selectbox("Model", NAMED_MODELS, key="model")
    paced = c.checkbox("Paced (twin in real time)", key="paced",
                       help="The twin simulates a minute in milliseconds; paced, it runs as long "
                            "as it says, for live demos.")
    a, b, c = st.columns(3)
    policy = a.selectbox("KV policy", POLICIES, key="policy")
    window = b.number_input(
        "W: window tokens", value=SUGGESTED_WINDOW_TOKENS, step=32, key="window",
        help="Used with policy window. Kept KV is whole blocks (sinks + window from its first "
             "kept block), so it is not token-exact [0,S) ∪ (t−W, t].")
    sinks = c.number_input("S: sink tokens", value=default["sinks"], step=1, key="sinks",
                           help="Used with policy window: the session's first tokens, kept.")
    a, b, c = st.columns(3)
    frame_ms = a.number_input("Frame period (ms)", value=default["frame_ms"], step=10.0,
                              key="frame_ms",
                              min_value=MIN_FRAME_MS)  # RunConfig refuses shorter periods
    pool_blocks = b.number_input("Pool blocks", value=default["pool_blocks"], step=32,
                                 key="pool_blocks")
    duration_s = c.number_input("Duration (s)", value=default["duration_s"], step=5.0,
                                key="duration_s")
    st.markdown("**Load**")
    a, b, c = st.columns(3)
    load = a.selectbox("Shape", load_choices(), key="load",
                       help="fixed: N sessions at once; ramp and Poisson: N offered over time; "
                            "gateway: only remote clients (/mic, /v1/realtime), at most N. "
                            "Every run on vLLM or the paced twin also takes remote clients.")
    sessions = b.number_input("Sessions N", value=default["sessions"], step=1, key="sessions")
    arrival_rate = c.number_input("Arrival rate (sessions/s)", value=None, step=0.5,
                                  key="arrival_rate", placeholder="auto",
                                  help="ramp and Poisson arrivals")
    a, b, c = st.columns(3)
    session_s = a.number_input("Session length (s)", value=None, step=1.0, key="session_s",
                               placeholder="whole run")
    seed = b.number_input("Seed", value=default["seed"], step=1, key="seed")
    wait_budget = c.number_input(
        "Wait budget (fraction of the frame budget)", value=None, step=0.1, key="wait_budget",
        placeholder="off", help="Gateway mode: answer an empty frame after this fraction of "
                                "the budget.")
    audio = _audio_widgets(load)
    recorded = _replay_widgets(load)
    st.markdown("**Admission and guards**")
    a, b, c, d = st.columns(4)
    admission = a.selectbox("Admission", ADMISSIONS, key="admission")
    target = b.number_input("Target (fraction of budget)", value=default["target"], step=0.05,
                            key="target")
    stall_guard = c.selectbox("Stall guard", ["off", "on"], key="stall_guard")
    memory_guard = d.selectbox("Memory guard", ["off", "on"], key="memory_guard")
    windowed = policy == "window"
    return {"engine": engine, "model": model, "policy": policy,
            "window": int(window) if windowed else None, "sinks": int(sinks) if windowed else 0,
            "frame_ms": float(frame_ms), "pool_blocks": int(pool_blocks),
            "duration_s": float(duration_s), "load": load, "sessions": int(sessions),
            "arrival_rate": arrival_rate, "session_s": session_s, "seed": int(seed),
            "wait_budget": wait_budget, "admission": admission, "target": float(target),
            "stall_guard": stall_guard == "on", "memory_guard": memory_guard == "on",
            "paced": paced and engine == "twin", **audio, **recorded}


def _audio_widgets(load: str) -> dict:
    """The audio loads' inputs, drawn whenever the runtime offers them (a form does not rerun
    when the shape changes), passed only with their own load."""
    args = {}
    if "wav" in load_choices():
        wav_dir = st.text_input("WAV folder (load wav)", key="wav_dir") or None
        if load == "wav":
            args["wav_dir"] = wav_dir
    if "mic" in load_choices():
        device = st.text_input("Microphone (load mic: input index or name)", key="mic_device",
                               placeholder="default") or None
        if load == "mic":
            args["mic_device"] = device
    return args


def _replay_widgets(load: str) -> dict:
    """Load replay's source: a recorded run of this database, or a trace file. A replay's
    frame period, sessions, duration and seed follow the recording (services.replay_settings)."""
    if "replay" not in load_choices():
        return {}
    a, b = st.columns(2)
    run_id = a.text_input("Replay run (load replay: a recorded run id)", key="replay_run",
                          help="Its sessions arrive at the same times with the same tokens; "
                               "frame period, sessions, duration and seed follow it.") or None
    trace = b.text_input("Replay trace (load replay: CSV or Parquet file)", key="replay_trace",
                         help="Columns session_id, start_s, end_s, tokens_in, tokens_out; a "
                              "row per session or per frame.") or None
    if load != "replay":
        return {}
    return {"replay_run": run_id.strip() if run_id else None,
            "replay_trace": trace.strip() if trace else None}


def describe(config: RunConfig) -> dict:
    """The settings an operator reads in 'running now' (the rest are defaults)."""
    keys = ("engine", "model", "policy", "window", "sinks", "frame_ms", "pool_blocks", "load",
            "sessions", "arrival_rate", "session_s", "duration_s", "seed", "admission",
            "target", "stall_guard", "memory_guard", "wait_budget", "paced", "replay_run",
            "replay_trace")
    d = config.as_dict()
    return {k: d[k] for k in keys if d.get(k) is not None}
