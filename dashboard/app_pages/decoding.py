"""Decoding: step through greedy decoding; at each step, what the new position attended to."""

from __future__ import annotations

import numpy as np
import streamlit as st

from dashboard import analysis, state, ui
from dashboard.plots import decoding as P

st.title("Decoding")
lm = state.model()

if not lm.has_decoder:
    traces = state.traces()
    seq = state.sequence_picker(state.DEC_SEQ, traces)
    tr = traces[seq]
    if tr.out_probs is not None:  # a classifier: its class probabilities instead
        st.info(
            "This model has no decoder (encoder-only classifier): there is nothing to decode. "
            "Its class probabilities for the input:"
        )
        labels = tr.meta.get("labels") or [str(i) for i in range(len(tr.out_probs))]
        fig = P.class_probs_figure(labels, tr.out_probs, title=f"class probabilities (sequence {seq})")
    else:  # an encoder without a head (sentence embedder): its pooled output
        st.info(
            "This model has no decoder and no classifier (an encoder that embeds text): there is nothing "
            f"to decode. Its output: {tr.output_text}."
        )
        head = [float(v) for v in tr.meta.get("embedding_head", [])]
        fig = P.values_figure(
            head, title=f"first {len(head)} values of the pooled embedding (sequence {seq})"
        )
    ui.chart(fig, key="dec_classes")
    ui.downloads(tr, seq, {"output": fig}, key="dec_dl")
    st.stop()

if state.current().targets is not None:
    st.info(
        "This page always shows greedy decoding (the model's own choices), whatever the sidebar's decoder input."
    )
traces = state.traces(greedy=True)
c_seq, c_opts = st.columns([2, 3])
with c_seq:
    seq = state.sequence_picker(state.DEC_SEQ, traces)
tr = traces[seq]
ui.run_caption(tr)
n = analysis.n_steps(tr, lm.cfg.pad_id)
with c_opts:
    log = st.toggle("Log colour scale", key=state.DEC_LOG)
if n > 1:
    if st.session_state.get(state.DEC_STEP, 1) > n:
        st.session_state[state.DEC_STEP] = n
    step = st.slider("Step", 1, n, key=state.DEC_STEP, help="Greedy step t generates token t of the output.")
else:
    step = 1
ds = analysis.decode_step(tr, step - 1, lm.tgt_tok.itos)

st.markdown(f"**Step {step} of {n}.** The decoder reads the prefix below and writes the next token:")
st.code(
    f"prefix ({len(ds.prefix)} token{'s' if len(ds.prefix) > 1 else ''}): {' '.join(ds.prefix)}\nnew token: {ds.new_token}   (p = {ds.new_prob:.4f})",
    language=None,
)

left, right = st.columns(2)
cross = P.step_figure(
    ds.cross,
    tr.src_tokens,
    log=log,
    key_title="key: source tokens",
    title=f"step {step}: cross-attention of position {step - 1} over the source (seq {seq})",
)
self_fig = P.step_figure(
    ds.dec_self,
    ds.prefix,
    log=log,
    key_title="key: prefix (decoder input so far)",
    title=f"step {step}: decoder self-attention of position {step - 1} over the prefix (seq {seq})",
)
with left:
    ui.chart(cross, key="dec_cross")
with right:
    ui.chart(self_fig, key="dec_self")
topk = P.topk_figure(
    ds.topk_tokens, ds.topk_probs, title=f"step {step}: top-{len(ds.topk_probs)} next tokens (seq {seq})"
)
left, right = st.columns(2)
with left:
    ui.chart(topk, key="dec_topk")
with right:
    layers = list(range(tr.cross.shape[0]))
    if st.session_state.get(state.DEC_LAYER) not in layers:
        st.session_state[state.DEC_LAYER] = layers[-1]
    layer = st.selectbox(
        "Overview layer", layers, key=state.DEC_LAYER, help="Cross-attention of every step, mean of heads."
    )
    overview = P.steps_overview(
        tr.cross[layer, :, :n].mean(axis=0),
        tr.out_tokens[:n],
        tr.src_tokens,
        current=step - 1,
        log=log,
        key_title="key: source tokens",
        title=f"every step: cross-attention, layer {layer}, mean of heads (seq {seq})",
    )
    ui.chart(overview, key="dec_overview")
st.caption(
    f"Rows L·H are layer·head; 'mean' rows average a layer's heads. Top-5 mass: {float(np.sum(ds.topk_probs)):.4f}. "
    "Every label comes from the ids the model read and wrote (trace.tgt_tokens / trace.out_tokens)."
)
ui.downloads(tr, seq, {"cross": cross, "self": self_fig, "topk": topk, "overview": overview}, key="dec_dl")
