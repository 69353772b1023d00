"""Model: architecture summary, parameters per module, vocabulary, card, device and timing."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from attnscope.core.traces.trace import KIND_LABELS, KINDS
from attnscope.dashboard import loaders, marks, model_facts, opened, state, ui
from attnscope.dashboard.plots.model import params_figure

st.title("Model")


def trace_facts(file) -> None:
    """What a trace file says about the model that wrote it (the parameters need the model itself)."""
    tr = file.trace
    state.show_capture_flags([tr])  # (what capture could not verify in the model that wrote it)
    arch = model_facts.trace_arch(tr)
    c = st.columns(4)
    c[0].metric("Layers × heads", f"{tr.n_layers} × {tr.n_heads}")
    c[1].metric("Source tokens", len(tr.src_tokens))
    c[2].metric("Decoder tokens", len(tr.tgt_tokens))
    c[3].metric("Device", tr.device or "—")
    st.markdown(
        f"Trace file `{file.label}`, written by **{loaders.display_name(tr.model) or 'an unknown model'}**"
        f" ({tr.config_name or 'no config name'}) · {model_facts.ARCH_LABELS[arch]}"
    )
    rows = [
        {"kind": KIND_LABELS[k], "layers": tr.probs(k).shape[0], "heads": tr.probs(k).shape[1],
         "query × key": f"{tr.probs(k).shape[2]} × {tr.probs(k).shape[3]}",
         "scores": tr.scores(k) is not None,
         "mask": "one per layer" if tr.masks_differ(k) else "yes" if tr.mask(k) is not None else "no"}
        for k in tr.kinds
    ]  # fmt: skip
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="model_trace_kinds")
    ms = tr.meta.get("forward_ms")
    if isinstance(ms, int | float):
        st.markdown(f"Forward pass when the trace was written: **{ms:.2f} ms** on {tr.device}.")
    if tr.output_text:
        st.text(f"Output: {tr.output_text}")
    if tr.meta:
        with st.expander("Everything the trace file records about its run (meta)"):
            st.json(tr.meta, expanded=False)
    st.caption(
        "Parameters, vocabulary and the model card come from the model itself: "
        + (
            f"close the trace and load {opened.writer_name(tr)}."
            if opened.writer_name(tr)
            else "load it to see them."
        )
    )


file = state.trace_file()
if file is not None:
    trace_facts(file)
    st.stop()
lm = state.model()
cfg = lm.cfg
metrics = lm.meta.get("metrics", {}) if isinstance(lm.meta.get("metrics"), dict) else {}
score_key = next((k for k in metrics if "accuracy" in k or "exact" in k), None)

c = st.columns(5)
c[0].metric("Parameters", f"{model_facts.parameter_count(lm):,}")
c[1].metric("Source vocabulary", f"{len(lm.src_tok):,}")
c[2].metric("Target vocabulary", f"{len(lm.tgt_tok):,}" if lm.tgt_tok is not None else "—")
c[3].metric("Device", lm.device)
c[4].metric(
    score_key.replace("_", " ") if score_key else "Accuracy",
    f"{metrics[score_key]:.2%}" if score_key else "—",
)

arch = model_facts.arch(lm)
shape = (
    f"encoder-only classifier ({cfg.n_classes} classes, {cfg.pooling} pooling)"
    if cfg.n_classes
    else f"encoder only ({cfg.n_enc_layers} layers)"
    if arch == "encoder"
    else f"decoder only ({cfg.n_dec_layers} layers, causal self-attention; no encoder, no cross-attention)"
    if arch == "decoder"
    else f"encoder-decoder ({cfg.n_enc_layers} + {cfg.n_dec_layers} layers)"
)
kind = model_facts.KIND_LABELS.get(loaders.model_kind(state.current().name), "core folder")
TASKS = {  # what a model without a task in its meta.json does, by family
    "encoder": "classification" if cfg.n_classes else "embedding",
    "decoder": "next-token prediction",
    "seq2seq": "sequence to sequence",
}
task = lm.meta.get("task") or TASKS[arch]
st.markdown(f"**{lm.name}** ({kind}) · task: **{task}** · {shape}")
if lm.summary:
    st.caption(lm.summary)
if lm.meta.get("source"):
    st.caption(f"Files: `{lm.meta['source']}`")
elif lm.folder is not None:
    st.caption(f"Files: `{lm.folder}`")

left, right = st.columns([3, 2])
counts = model_facts.parameter_groups(lm)
fig = params_figure(counts, title=f"parameters per module ({lm.name}, {sum(counts.values()):,} in all)")
with left:
    ui.chart(fig, key="model_params")
with right:
    st.dataframe(
        pd.DataFrame({"setting": list(cfg.to_dict()), "value": [str(v) for v in cfg.to_dict().values()]}),
        hide_index=True,
        height=420,
        key="model_config",
    )

st.subheader("Last forward pass")
sel = state.current()
if sel.problems or sel.target_problems:
    st.info("Fix the input in the sidebar to time a forward pass.")
else:
    traces = state.traces()
    tr = traces[0]
    ms = tr.meta.get("forward_ms")
    lengths = ([f"source length {len(tr.src_tokens)}"] if tr.src_tokens else []) + (
        [f"{'sequence' if arch == 'decoder' else 'decoder'} length {len(tr.tgt_tokens)}"]
        if tr.tgt_tokens
        else []
    )
    st.markdown(
        f"Forward pass with attention capture on **{tr.device}**: **{ms:.2f} ms** for a batch of {len(traces)} "
        f"({', '.join(lengths)}). Cached: changing the page or a selection does not re-run it."
    )
forced = [marks.describe(marks.hinted(lm.meta, k)).replace("▣ ", f"▣ {KIND_LABELS[k]}: ") for k in KINDS]
if any(forced):
    st.subheader("Heads trained to look like this")
    for line in forced:
        if line:
            st.warning(line)
if metrics:
    st.subheader("Measured metrics")
    st.json(metrics, expanded=True)
st.subheader("Model card")
if lm.card:
    with st.container(border=True):
        st.markdown(lm.card)
else:
    st.caption("This model has no card (card.md, or README.md in a Hugging Face folder).")
ui.figure_downloads({"parameters": fig}, f"{lm.name}-model", key="model_dl")
