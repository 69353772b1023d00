"""bertviz: its head view and model view for the current input, offline and escaped.

attnscope.core.traces.bertviz_adapter.bertviz_args picks what goes to bertviz (layers, heads, and for inputs over
100 tokens a subset with a warning, so the browser never freezes); dashboard/bertviz_html renders
it offline. Works for encoder-only (enc_self), decoder-only (dec_self) and encoder-decoder traces.
"""

from __future__ import annotations

import streamlit as st

from attnscope.core.traces.bertviz_adapter import MAX_TOKENS, bertviz_args
from attnscope.core.traces.trace import KIND_LABELS
from attnscope.dashboard import bertviz_html, files, model_facts, state, ui
from attnscope.dashboard import keys as K

MAX_HEIGHT = 1800
MISSING = {
    "encoder": "This model has no decoder (encoder only): bertviz shows its encoder self-attention.",
    "decoder": "This model has no encoder (decoder only): bertviz shows its causal self-attention over "
    "prompt and continuation; there is no cross-attention.",
}

st.title("bertviz")
st.caption(
    "Jesse Vig's bertviz (head view: lines from each query token to the keys it attends to, one colour per "
    "head; model view: every layer × head as a thumbnail). Rendered from the installed bertviz package with "
    "require.js, d3 and jQuery served from dashboard/static/vendor/ (no internet needed). "
    f"Inputs over {MAX_TOKENS} tokens are shown as a subset of layers, heads or tokens."
)
st.caption(
    "bertviz draws attention **weights** only; to see what those weights actually move (‖α·f(x)‖), use the "
    "**Attention** page's *what moves* toggle."
)
traces = state.traces()
kinds = list(traces[0].kinds)
arch = model_facts.trace_arch(traces[0])
if arch in MISSING:
    st.caption(MISSING[arch])
c1, c2, c3 = st.columns([2, 3, 2])
view = c1.radio("View", ("head", "model"), key=K.BV_VIEW, format_func=lambda v: f"{v} view", horizontal=True)
if any(k not in kinds for k in st.session_state.get(K.BV_KINDS, [])):
    st.session_state[K.BV_KINDS] = kinds
chosen = c2.multiselect("Attention", kinds, default=kinds, key=K.BV_KINDS, format_func=KIND_LABELS.get)
with c3:
    seq = state.sequence_picker(K.BV_SEQ, traces)
tr = traces[seq]
n_layers = min(tr.probs(k).shape[0] for k in kinds)
n_heads = min(tr.probs(k).shape[1] for k in kinds)
o1, o2, o3 = st.columns([2, 3, 2], vertical_alignment="center")
for key, n in ((K.BV_LAYERS, n_layers), (K.BV_HEADS, n_heads)):
    if any(not 0 <= i < n for i in st.session_state.get(key, [])):
        st.session_state[key] = []
layers = o1.multiselect(
    "Layers", list(range(n_layers)), key=K.BV_LAYERS, placeholder="all (long inputs: the first)"
)
heads = o2.multiselect(
    "Heads", list(range(n_heads)), key=K.BV_HEADS, placeholder="all (long inputs: as many as fit)"
)
with o3:
    drop_pad = st.toggle("Hide padding", value=True, key=K.BV_PAD, help="Trailing PAD positions.")
if not chosen:
    st.warning("Choose at least one kind of attention to show.")
    st.stop()
ui.run_caption(tr)
shown = tr.replace(**{k: None for k in kinds if k not in chosen})
args = bertviz_args(
    shown,
    view=view,
    include_layers=sorted(layers) or None,
    include_heads=sorted(heads) or None,
    drop_padding=drop_pad,
)
for note in args.warnings:
    st.warning(files.sentence(note))
data = bertviz_html.data_from_args(args)
html = bertviz_html.render(view, data, layers=args.layers, heads=args.heads)
st.markdown(
    f"**bertviz {view} view** · {', '.join(KIND_LABELS[k] for k in chosen)} · sequence {seq} · "
    f"layer{'s' if len(args.layers) > 1 else ''} {', '.join(map(str, args.layers))} · "
    f"{len(args.heads)} of {n_heads} heads · "
    + ", ".join(f"{n} {'' if axis == 'tokens' else axis + ' '}tokens" for axis, n in args.n_tokens.items())
)
if view == "head" and args.heads != list(range(n_heads)):
    st.caption(f"Head colours follow the heads shown: {', '.join(map(str, args.heads))}.")
st.iframe(html, height=min(MAX_HEIGHT, bertviz_html.view_height(view, data)))
if len(data) > 1:
    st.caption("Use the view's 'Attention' menu to switch between encoder, decoder and cross attention.")
ui.downloads(tr, seq, {}, key="bv_dl", html_pages={f"bertviz {view} view": html})
