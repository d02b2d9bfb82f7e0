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
if state.status != "running" or state.config is None:
    st.info("No run is running: start one on the Load page, then change it here.")
else:
    st.caption(f"run {state.run_id} · changes apply at the next tick and are recorded as "
               "events")
    controls.policy_section(host, state.config)
    controls.target_section(host, state.config)
    controls.limit_section(host, state.config)
    controls.stall_guard_section(host, state.config)
if state.run_id is not None:
    changes = queries.param_changes(store().cursor(), state.run_id)
    st.subheader("Changes recorded for this run")
    if changes.empty:
        st.caption("none yet")
    else:
        st.dataframe(changes[["t", "setting", "old", "new"]], hide_index=True)
