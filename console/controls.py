"""The live controls' widgets: one form per setting group, each applied through the run host.

A form keeps a half-typed value from being applied by a rerun; its submit button applies the
group, shows the runtime's confirmation, or its one-line reason when the value is refused.
"""

from __future__ import annotations

import logging
from dataclasses import fields

import streamlit as st

from services.run_host import RunHost, one_line
from control.limits import LIMITS, AIMDConfig, GradientConfig
from engine.contract import POLICIES
from runtime import LiveSettings
from runtime.config import SUGGESTED_WINDOW_TOKENS

logger = logging.getLogger(__name__)


def _apply(host: RunHost, change: dict) -> None:
    try:
        message = host.apply(**change)
    except ValueError as exc:
        st.error(one_line(exc))
        return
    logger.info("applied %s", change)
    st.success(message, icon="✅")


def policy_section(host: RunHost, live: LiveSettings) -> None:
    st.subheader("KV policy")
    policy_now = live.policy
    with st.form("form_policy"):
        policy = st.selectbox("Policy", POLICIES, key="ctl_policy",
                              index=POLICIES.index(policy_now.kind))
        window = st.number_input("W: window tokens",
                                 value=policy_now.window_tokens or SUGGESTED_WINDOW_TOKENS,
                                 step=32, key="ctl_window")
        sinks = st.number_input("S: sink tokens", value=policy_now.sink_tokens, step=1,
                                key="ctl_sinks")
        if st.form_submit_button("Apply KV policy", key="apply_policy"):
            change = {"policy": policy}
            if policy == "window":
                change.update(window=int(window), sinks=int(sinks))
            _apply(host, change)


def target_section(host: RunHost, live: LiveSettings) -> None:
    st.subheader("Latency target")
    with st.form("form_target"):
        target = st.number_input("Target (fraction of the frame budget)", value=live.target,
                                 step=0.05, key="ctl_target",
                                 help="AIMD and gradient limits back off above target·budget.")
        if st.form_submit_button("Apply target", key="apply_target"):
            _apply(host, {"target": float(target)})


def limit_section(host: RunHost, live: LiveSettings, sessions: int) -> None:
    """`sessions`: the run's offered sessions, the most a cap may usefully be."""
    st.subheader("Admission limit")
    kind_now = live.limit.kind
    kind = st.selectbox("Limit type", LIMITS, key="ctl_limit",
                        index=LIMITS.index(kind_now) if kind_now in LIMITS else 0)
    with st.form("form_limit"):
        params = _limit_params(kind, live, sessions)
        if st.form_submit_button("Apply limit", key="apply_limit"):
            _apply(host, {"limit": kind, "limit_params": params})


def _limit_params(kind: str, live: LiveSettings, sessions: int) -> dict:
    """The limit type's parameters, each field starting at the limit config's own default (a
    fixed cap: the cap in force); the limit's own config checks them (the reason is shown)."""
    cap = max(sessions, 1)
    if kind == "fixed":
        return {"limit": int(st.number_input("Cap (sessions)", value=live.limit.limit, step=1,
                                             key="ctl_fixed_cap"))}
    d = {f.name: f.default for f in fields(AIMDConfig if kind == "aimd" else GradientConfig)}
    params = {
        "initial": int(st.number_input("Initial cap", value=min(d["initial"], cap), step=1,
                                       key=f"ctl_{kind}_initial")),
        "min_limit": int(st.number_input("Minimum cap", value=d["min_limit"], step=1,
                                         key=f"ctl_{kind}_min")),
        "max_limit": int(st.number_input("Maximum cap", value=cap, step=1,
                                         key=f"ctl_{kind}_max")),
        "target_fraction": float(st.session_state.get("ctl_target", live.target)),
    }
    if kind == "aimd":
        params["increase"] = int(st.number_input("Additive increase", value=d["increase"],
                                                 step=1, key="ctl_aimd_increase"))
        params["backoff"] = float(st.number_input("Multiplicative backoff", value=d["backoff"],
                                                  step=0.05, key="ctl_aimd_backoff"))
        params["headroom"] = int(st.number_input("Headroom (grow when inflight ≥ cap − k)",
                                                 value=d["headroom"], step=1,
                                                 key="ctl_aimd_headroom"))
    else:
        params["smoothing"] = float(st.number_input("Smoothing", value=d["smoothing"],
                                                    step=0.05, key="ctl_gradient_smoothing"))
        params["tolerance"] = float(st.number_input("Tolerance (× target)",
                                                    value=d["tolerance"], step=0.1,
                                                    key="ctl_gradient_tolerance"))
    return params


def stall_guard_section(host: RunHost, live: LiveSettings) -> None:
    st.subheader("Stall guard")
    with st.form("form_stall_guard"):
        guard = st.radio("Stall guard", ["off", "on"], key="ctl_stall_guard", horizontal=True,
                         index=int(live.stall_guard),
                         help="On: when the pool stalls, evict the session holding the most KV "
                              "(recorded as an evict event).")
        if st.form_submit_button("Apply stall guard", key="apply_stall_guard"):
            _apply(host, {"stall_guard": guard == "on"})
