"""bertviz: its head view and model view for the current input, offline and escaped."""

from __future__ import annotations

import streamlit as st

from core.trace import KIND_LABELS
from dashboard import bertviz_html, state, ui

MAX_HEIGHT = 1800

st.title("bertviz")
st.caption(
    "Jesse Vig's bertviz (head view: lines from each query token to the keys it attends to, one colour per "
    "head; model view: every layer × head as a thumbnail). Rendered from the installed bertviz package with "
    "require.js, d3 and jQuery served from dashboard/static/vendor/ (no internet needed)."
)
traces = state.traces()
kinds = list(traces[0].kinds)
c1, c2, c3 = st.columns([2, 3, 2])
view = c1.radio(
    "View", ("head", "model"), key=state.BV_VIEW, format_func=lambda v: f"{v} view", horizontal=True
)
if any(k not in kinds for k in st.session_state.get(state.BV_KINDS, [])):
    st.session_state[state.BV_KINDS] = kinds
chosen = c2.multiselect("Attention", kinds, default=kinds, key=state.BV_KINDS, format_func=KIND_LABELS.get)
with c3:
    seq = state.sequence_picker(state.BV_SEQ, traces)
drop_pad = st.toggle("Hide <pad> positions", value=True, key=state.BV_PAD)
if not chosen:
    st.warning("Choose at least one kind of attention to show.")
    st.stop()
tr = traces[seq]
ui.run_caption(tr)
data = bertviz_html.attention_data(tr, [k for k in kinds if k in chosen], drop_pad=drop_pad)
html = bertviz_html.render(view, data)
st.markdown(f"**bertviz {view} view** · {', '.join(KIND_LABELS[k] for k in chosen)} · sequence {seq}")
st.iframe(html, height=min(MAX_HEIGHT, bertviz_html.view_height(view, data)))
if len(chosen) > 1:
    st.caption("Use the view's 'Attention' menu to switch between encoder, decoder and cross attention.")
ui.downloads(tr, seq, {}, key="bv_dl", html_pages={f"bertviz {view} view": html})
