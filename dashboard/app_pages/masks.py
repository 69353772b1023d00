"""Masks: every mask of the current batch, and an audit of attention that fell on masked keys."""

from __future__ import annotations

import numpy as np
import streamlit as st

from core.trace import KIND_LABELS
from dashboard import analysis, state, ui
from dashboard.plots import masks as P

st.title("Masks")
st.markdown(
    "**Convention:** a mask is boolean, **True = this query (row) may attend to this key (column)** "
    "(PyTorch SDPA's convention; `nn.MultiheadAttention` uses the opposite). "
    "Padding masks are per token: True = real token, False = `<pad>`. "
    "Masked scores are filled before the softmax, so masked keys get weight exactly 0."
)
traces = state.traces()
lm = state.model()
pad = lm.cfg.pad_id
ui.run_caption(traces[0])

src_ids = np.stack([t.src_ids for t in traces])  # (B, S)
figs = {}
figs["source padding"] = P.padding_mask_figure(
    src_ids != pad,
    [t.src_tokens for t in traces],
    position_title="source position",
    title=f"source padding mask [batch {len(traces)} × {src_ids.shape[1]}]: green = real token, grey = PAD",
)
if lm.has_decoder:
    tgt_ids = np.stack([t.tgt_ids for t in traces])  # (B, T)
    figs["target padding"] = P.padding_mask_figure(
        tgt_ids != pad,
        [t.tgt_tokens for t in traces],
        position_title="decoder input position",
        title=f"target padding mask [batch {len(traces)} × {tgt_ids.shape[1]}]: green = real token, grey = PAD",
    )
c1, c2 = st.columns(2)
with c1:
    ui.chart(figs["source padding"], key="mask_src_pad")
if lm.has_decoder:
    with c2:
        ui.chart(figs["target padding"], key="mask_tgt_pad")

seq = state.sequence_picker(state.MASK_SEQ, traces)
tr = traces[seq]
where = f"sequence {seq}"
if lm.has_decoder:
    t_len = len(tr.tgt_tokens)
    causal = np.tril(np.ones((t_len, t_len), dtype=bool))
    figs["causal"] = P.attention_mask_figure(
        causal,
        tr.tgt_tokens,
        tr.tgt_tokens,
        query_title="query: decoder position",
        key_title="key: decoder position",
        title=f"causal mask [{t_len} × {t_len}]: key position ≤ query position",
    )
    figs["decoder self"] = P.attention_mask_figure(
        tr.dec_self_mask,
        tr.tgt_tokens,
        tr.tgt_tokens,
        query_title="query: decoder input",
        key_title="key: decoder input",
        title=f"decoder self-attention mask = causal AND real key ({where})",
    )
    figs["cross"] = P.attention_mask_figure(
        tr.cross_mask,
        tr.tgt_tokens,
        tr.src_tokens,
        query_title="query: decoder input",
        key_title="key: source tokens",
        title=f"cross-attention mask = real source key ({where})",
    )
figs["encoder self"] = P.attention_mask_figure(
    tr.enc_self_mask,
    tr.src_tokens,
    tr.src_tokens,
    query_title="query: source tokens",
    key_title="key: source tokens",
    title=f"encoder self-attention mask = real source key ({where})",
)
names = [n for n in ("causal", "decoder self", "cross", "encoder self") if n in figs]
for i in range(0, len(names), 2):
    cols = st.columns(2)
    for col, name in zip(cols, names[i : i + 2], strict=False):
        with col:
            ui.chart(figs[name], key=f"mask_{name.replace(' ', '_')}")

st.subheader("Audit: attention on masked positions (whole batch)")
table = analysis.masked_mass_table(traces)
bad = table[~table["ok"]]
if bad.empty:
    st.success(
        f"All {len(table)} (kind, layer, head) maps put exactly 0 attention on masked keys, "
        "and no query row was fully masked."
        if int(table["fully masked rows"].max()) == 0
        else f"All {len(table)} maps put exactly 0 attention on masked keys; fully masked rows came out all zero."
    )
else:
    kinds = ", ".join(sorted(set(bad["attention"])))
    st.error(f"{len(bad)} maps put attention on masked keys or left a fully masked row non-zero ({kinds}).")
st.dataframe(
    table,
    hide_index=True,
    key="mask_table",
    column_config={
        "max mass on masked keys (one query)": st.column_config.NumberColumn(format="%.3e"),
        "total mass on masked keys": st.column_config.NumberColumn(format="%.3e"),
    },
)
st.caption(
    "Per kind ("
    + ", ".join(KIND_LABELS[k] for k in traces[0].kinds)
    + "), layer and head over every sequence of "
    "the batch: the largest attention mass one query put on masked keys, the total, the number of query rows "
    "with no allowed key at all, and rows whose weights are all zero (must equal the fully masked rows)."
)
ui.downloads(tr, seq, figs, key="mask_dl")
