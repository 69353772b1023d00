"""attnscope dashboard entry point: page config, the shared sidebar, navigation.

Served by ``attnscope run`` (or ``make run``), which passes the package's server defaults
(``server.toml``); ``streamlit run dashboard/app.py`` from the repository root reads the same file
through ``.streamlit/config.toml``.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from attnscope.dashboard import links, loaders, state

loaders.configure_process()  # torch threads, the map pool, offline Hugging Face: once per process

HERE = Path(__file__).resolve().parent / "app_pages"

# Every page, in menu order; add new pages here.
PAGES = [
    st.Page(
        HERE / "attention.py",
        title="Attention",
        icon=":material/grid_on:",
        url_path="start",  # (served at "/": the default page's own path is never shown)
        default=True,
    ),
    st.Page(HERE / "decoding.py", title="Decoding", icon=":material/play_arrow:", url_path="decoding"),
    st.Page(HERE / "masks.py", title="Masks", icon=":material/visibility_off:", url_path="masks"),
    st.Page(HERE / "audit.py", title="Mask audit", icon=":material/fact_check:", url_path="mask-audit"),
    st.Page(HERE / "mask_lab.py", title="Mask lab", icon=":material/science:", url_path="mask-lab"),
    st.Page(
        HERE / "head_analytics.py", title="Head analytics", icon=":material/analytics:", url_path="heads"
    ),
    st.Page(HERE / "compare.py", title="Compare", icon=":material/compare:", url_path="compare"),
    st.Page(HERE / "training.py", title="Training", icon=":material/timeline:", url_path="training"),
    st.Page(
        HERE / "positional.py", title="Positional encoding", icon=":material/waves:", url_path="positional"
    ),
    st.Page(HERE / "bertviz_view.py", title="bertviz", icon=":material/share:", url_path="bertviz"),
    st.Page(HERE / "model_info.py", title="Model", icon=":material/info:", url_path="model"),
    # Streamlit serves the default page at "/" only: "/attention", the path a user types from the menu's
    # name (as every other page's path is its own), is the same page, out of the menu.
    st.Page(
        HERE / "attention.py",
        title="Attention",
        icon=":material/grid_on:",
        url_path="attention",
        visibility="hidden",
    ),
]

STALE_CSS = '<style>[data-stale="true"] { transition: opacity 0s linear 0.5s !important; }</style>'

# A local favicon: without one Streamlit uses the page's material icon, fetched from Google.
st.set_page_config(
    page_title="attnscope", page_icon=str(HERE.parent / "static" / "favicon.png"), layout="wide"
)
page = st.navigation(PAGES)
# Content that a rerun will replace dims after 0.5 s, as Streamlit does, but in one step instead of a
# 1 s fade: the fade repaints every chart on the page each frame (a 512-token heatmap is large), and on
# a browser without GPU compositing that took up to a core of CPU while the server computed.
st.html(STALE_CSS)
notes = st.container()  # what a link's parameters could not set, above the page
links.apply(page.url_path, notes.warning)
state.sidebar()
share = st.sidebar.empty()
links.share_box(share, links.publish(page.url_path))  # the clicks that started this run
page.run()  # (a page that stops early ends the run here)
links.share_box(share, links.publish(page.url_path))  # and what the page itself changed
links.report(notes.warning)
loaders.keep_collection_cheap()  # the collection Streamlit runs next walks only this run's objects
