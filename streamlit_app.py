"""Entry point: `streamlit run streamlit_app.py`. The pages live in app/pages, their navigation
in app.console."""

import streamlit as st

from app.console import main

st.set_page_config(page_title="Metronome", layout="wide")
main()
