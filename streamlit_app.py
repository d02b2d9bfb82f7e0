"""Entry point: `streamlit run streamlit_app.py`. The page itself lives in app.console."""

import streamlit as st

from app.console import main

st.set_page_config(page_title="Metronome", layout="wide")
main()
