"""Controls: change the running run's KV policy, latency target, limit and stall guard live.

Each change goes through RunHost.apply → Runner.apply, which validates it at once (the reason
is shown next to the control), applies it at the next tick and records a param_change event.
"""

import streamlit as st

from console import controls
from console.shell import run_host, store
from store import queries

st.title("Controls")
host = run_host()
state = host.state()
live = host.live_settings()
if state.status != "running" or state.config is None or live is None:
    st.info("No run is running: start one on the Load page, then change it here.")
else:
    st.caption(f"run {state.run_id} · now: {live.policy_label}, target {live.target:.2f}, "
               f"limit {live.limit.kind} (cap {live.limit.limit}), stall guard "
               f"{'on' if live.stall_guard else 'off'} · changes apply at the next tick and "
               "are recorded as events")
    # Each form starts from what is in force now (the live settings), not the start config.
    controls.policy_section(host, live)
    controls.target_section(host, live)
    controls.limit_section(host, live, state.config.sessions)
    controls.stall_guard_section(host, live)
if state.run_id is not None:
    changes = queries.param_changes(store().cursor(), state.run_id)
    st.subheader("Changes recorded for this run")
    if changes.empty:
        st.caption("none yet")
    else:
        st.dataframe(changes[["t", "setting", "old", "new"]], hide_index=True)
