"""Decoding: step through greedy decoding; at each step, what the new position attended to.

Encoder-decoder models: the step's cross-attention over the source and self-attention over the
prefix. Decoder-only models (GPT-2 style): the prompt is continued greedily and each step's
self-attention over everything before it is shown (there is no cross-attention). Encoder-only
models have no decoder: the page says so and shows their output instead. Steps are counted from
the dec_self mask (T5 and Marian start the decoder with PAD, so PAD ids cannot tell).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnscope.dashboard import keys as K
from attnscope.dashboard import model_facts, state, ui
from attnscope.dashboard.plots import decoding as P

st.title("Decoding")
file = state.trace_file()  # a trace file: its own steps (no model to run)
lm = None if file else state.model()
arch = model_facts.trace_arch(file.trace) if file else model_facts.arch(lm)

if arch == "encoder":
    traces = state.traces()
    seq = state.sequence_picker(K.DEC_SEQ, traces)
    tr = traces[seq]
    head = [float(v) for v in tr.meta.get("embedding_head", [])]
    fig = None
    if tr.out_probs is not None:  # a classifier: its class probabilities instead
        st.info(
            "This model has no decoder (encoder-only classifier): there is nothing to decode and no "
            "decoder self-attention or cross-attention. Its class probabilities for the input:"
        )
        labels = tr.meta.get("labels") or [str(i) for i in range(len(tr.out_probs))]
        fig = P.class_probs_figure(labels, tr.out_probs, title=f"class probabilities (sequence {seq})")
    elif tr.output_text or head:  # an encoder without a head (sentence embedder): its pooled output
        st.info(
            "This model has no decoder and no classifier (an encoder that embeds text): there is nothing "
            "to decode and no decoder self-attention or cross-attention."
            + (f" Its output: {tr.output_text}." if tr.output_text else "")
        )
        if head:
            fig = P.values_figure(
                head, title=f"first {len(head)} values of the pooled embedding (sequence {seq})"
            )
    else:  # a trace of attention alone (captured from a model, or a file saved without outputs)
        st.info(
            "This model has no decoder (encoder only): there is nothing to decode and no decoder "
            "self-attention or cross-attention. This trace holds no output of the model to show (no class "
            "probabilities, no text, no embedding), only its attention."
        )
    if fig is not None:
        ui.chart(fig, key="dec_classes")
    ui.downloads(tr, seq, {} if fig is None else {"output": fig}, key="dec_dl")
    st.stop()

if file is not None:
    tr = file.trace
    if (
        tr.topk_ids is None
        or tr.topk_probs is None
        or tr.out_probs is None
        or (tr.dec_self_mask is None and tr.cross is None)
    ):
        state.model(
            "Decoding this trace (it holds no predictions)"
        )  # it holds no steps: says which model to load
    if tr.meta.get("teacher_forced"):
        st.info(
            "This trace was teacher-forced: each step reads the given target so far, and the new token is "
            "what the model predicted there (it may differ from the target's next token)."
        )
elif state.current().targets is not None:
    st.info(
        "This page always shows greedy decoding (the model's own choices), whatever the sidebar's decoder input."
    )
decoder_only = arch == "decoder"
if decoder_only:
    st.info(
        "This model has no encoder (decoder only): there is no cross-attention. The prompt is continued "
        "greedily; at each step the last position attends to the prompt and what was written so far."
    )
traces = state.traces(greedy=True)
c_seq, c_opts = st.columns([2, 3])
with c_seq:
    seq = state.sequence_picker(K.DEC_SEQ, traces)
tr = traces[seq]
ui.run_caption(tr)
steps = model_facts.decode_steps(tr)
n = steps.count
if n < 1:
    st.warning("This sequence has no decoding step to show.")
    st.stop()
with c_opts:
    log = st.toggle("Log colour scale", key=K.DEC_LOG)
if n > 1:
    if st.session_state.get(K.DEC_STEP, 1) > n:
        st.session_state[K.DEC_STEP] = n
    step = st.slider("Step", 1, n, key=K.DEC_STEP, help="Greedy step t generates token t of the output.")
else:
    step = 1
ds = model_facts.decode_step(tr, step - 1, None if lm is None else lm.tgt_tok.itos)
pos = steps.first + step - 1  # the decoder position whose output this step writes

st.markdown(f"**Step {step} of {n}.** The decoder reads the prefix below and writes the next token:")
st.code(
    f"prefix ({len(ds.prefix)} token{'s' if len(ds.prefix) > 1 else ''}): {' '.join(ds.prefix)}\nnew token: {ds.new_token}   (p = {ds.new_prob:.4f})",
    language=None,
)


def _self_figure():
    """The step's decoder self-attention over the prefix."""
    return P.step_figure(
        ds.dec_self,
        ds.prefix,
        log=log,
        key_title="key: prefix (prompt and tokens so far)"
        if decoder_only
        else "key: prefix (decoder input so far)",
        title=f"step {step}: decoder self-attention of position {pos} over the prefix (seq {seq})",
    )


topk = P.topk_figure(
    ds.topk_tokens, ds.topk_probs, title=f"step {step}: top-{len(ds.topk_probs)} next tokens (seq {seq})"
)
figs = {"topk": topk}
if ds.cross is not None:
    figs["cross"] = P.step_figure(
        ds.cross,
        tr.src_tokens,
        log=log,
        key_title="key: source tokens",
        title=f"step {step}: cross-attention of position {pos} over the source (seq {seq})",
    )
if ds.dec_self is None:  # no decoder self-attention (an RNN decoder): the step reads the source only
    left, right = st.columns(2)
    with left:
        ui.chart(figs["cross"], key="dec_cross")
    with right:
        ui.chart(topk, key="dec_topk")
    st.caption("This model has no decoder self-attention: each step attends to the source only.")
    left, right = st.columns(2)
elif ds.cross is not None:
    self_fig = _self_figure()
    figs["self"] = self_fig
    left, right = st.columns(2)
    with left:
        ui.chart(figs["cross"], key="dec_cross")
    with right:
        ui.chart(self_fig, key="dec_self")
    left, right = st.columns(2)
    with left:
        ui.chart(topk, key="dec_topk")
else:
    self_fig = _self_figure()
    figs["self"] = self_fig
    left, right = st.columns(2)
    with left:
        ui.chart(self_fig, key="dec_self")
    with right:
        ui.chart(topk, key="dec_topk")
    left, right = st.columns(2)
with right if ds.cross is not None and ds.dec_self is not None else left:
    overview_maps = tr.cross if ds.cross is not None else tr.dec_self
    layers = list(range(overview_maps.shape[0]))
    if st.session_state.get(K.DEC_LAYER) not in layers:
        st.session_state[K.DEC_LAYER] = layers[-1]
    what = "cross-attention" if ds.cross is not None else "decoder self-attention"
    layer = st.selectbox(
        "Overview layer",
        layers,
        key=K.DEC_LAYER,
        help=f"{what.capitalize()} of every step, mean of heads.",
    )
    rows = slice(steps.first, steps.first + n)
    keys = tr.src_tokens if ds.cross is not None else tr.tgt_tokens[: steps.first + n]
    figs["overview"] = P.steps_overview(
        overview_maps[layer, :, rows, : len(keys)].mean(axis=0),
        tr.out_tokens[rows],
        keys,
        current=step - 1,
        log=log,
        key_title="key: source tokens" if ds.cross is not None else "key: tokens (prompt, then continuation)",
        title=f"every step: {what}, layer {layer}, mean of heads (seq {seq})",
    )
    ui.chart(figs["overview"], key="dec_overview")
st.caption(
    f"Rows L·H are layer·head; 'mean' rows average a layer's heads. Top-5 mass: {float(np.sum(ds.topk_probs)):.4f}. "
    "Every label comes from the ids the model read and wrote (trace.tgt_tokens / trace.out_tokens)."
)
ui.downloads(tr, seq, figs, key="dec_dl")
