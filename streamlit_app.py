"""Entry point: `streamlit run streamlit_app.py`. One process serves the console's pages
(console_app.py, which Streamlit runs for each browser session) and, on the same port,
the gateway's /v1/realtime, the microphone page /mic, /healthz and /metrics
(console/routes.py), all joining the console's one run host."""

from pathlib import Path

import streamlit as st

from console.routes import (announce, console_middleware, console_routes, lifespan,
                                publish_reads)
from gateway.door import Door

_address, _port = st.get_option("server.address") or "0.0.0.0", st.get_option("server.port")
_door = Door.for_host(_address)
announce(_door, _address, _port)
publish_reads(_door, _address, _port)
app = st.App(Path(__file__).parent / "console_app.py", routes=console_routes(),
             middleware=console_middleware(_door), lifespan=lifespan)
