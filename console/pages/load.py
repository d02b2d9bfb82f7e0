"""Load: set a run up (engine, KV policy, load shape, admission), start and stop it, and see
what is running."""

import streamlit as st

from console import run_form
from console import views
from services.replay_settings import run_config
from console.shell import run_host, store
from services.run_host import one_line
from console.mic_link import GATEWAY_URL_ENV, MIC_PAGE, default_gateway, mic_page_url
from store import StoreError

st.title("Load")
host = run_host()
left, right = st.columns([3, 2])
with left:
    with st.form("run_form"):
        config_args = run_form.settings_widgets()
        start = st.form_submit_button("Start", key="start", type="primary")
    if start:
        try:
            # RunConfig and the replay check validate everything; a ValueError is one line.
            if config_args["load"] == "replay" and config_args.get("replay_run"):
                config_args["replay_db"] = store().path
            host.start(run_config(config_args), store().path)
        except (ValueError, StoreError) as exc:
            st.error(one_line(exc))
        else:
            st.session_state["view_run"] = "live"
            st.success("started: follow it on the Live page")
    if st.button("Stop", key="stop"):
        host.stop()
with right:
    st.subheader("Running now")
    state = host.state()
    if state.run_id is None or state.config is None:
        st.caption("nothing")
    else:
        st.write(f"**{state.status}** · run {state.run_id} · "
                 f"{views.engine_label(state.engine)}")
        st.json(run_form.describe(state.config), expanded=True)

st.subheader("Operator's microphone")
st.caption(
    "Speak into this browser's microphone as one session of the run this console is running "
    "(on vLLM, or the twin with Paced on; the shape `gateway` is a run of remote clients only): "
    "the page is served by this console at /mic, and its frames appear on the Live page as "
    "origin `gateway`. Realtime clients (the OpenAI SDK) connect to /v1/realtime on this same "
    "port. Browsers offer the microphone only on https or localhost: from a laptop, tunnel the "
    "console's port (`ssh -L 8501:127.0.0.1:8501 gpu-host`) and open http://localhost:8501/mic.")
st.link_button("Open the microphone page", MIC_PAGE, type="primary")
with st.expander("A gateway elsewhere (a headless `metronome serve`)"):
    st.caption(f"Its address as serve printed it, or host:port (default from `${GATEWAY_URL_ENV}`).")
    gateway_address = st.text_input("Gateway address", value=default_gateway(),
                                    key="gateway_url")
    try:
        st.link_button("Open that server's microphone page", mic_page_url(gateway_address))
    except ValueError as exc:
        st.error(one_line(exc))
