"""The console's Streamlit script, run for each browser session (streamlit_app.py serves it
with st.App). The pages live in console/pages, their navigation in console.shell. It sits at the
root: beside a `pages/` folder Streamlit would list that folder's files as pages of its own,
outside console.shell's navigation."""

import streamlit as st

from console.shell import main

st.set_page_config(page_title="Metronome", layout="wide")
main()
