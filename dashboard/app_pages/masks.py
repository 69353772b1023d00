"""Masks: every mask of the current batch, and an audit of attention that fell on masked keys.

Which tokens are real is read from the masks the trace carries (never from PAD ids: decoder-only
models have no source ids, and T5/Marian start the decoder with PAD), so every model family works:
encoder only (source masks), decoder only (decoder masks) and encoder-decoder (all).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from core.trace import KIND_LABELS
from dashboard import analysis, model_facts, state, ui
from dashboard.plots import masks as P

st.title("Masks")
st.markdown(
    "**Convention:** a mask is boolean, **True = this query (row) may attend to this key (column)** "
    "(PyTorch SDPA's convention; `nn.MultiheadAttention` uses the opposite). "
    "Padding masks are per token: True = real token, False = `<pad>`. "
    "Masked scores are filled before the softmax, so masked keys get weight exactly 0."
)
traces = state.traces()
arch = model_facts.trace_arch(traces[0])
has_encoder, has_decoder = arch != "decoder", arch != "encoder"
ui.run_caption(traces[0])
if not has_decoder:
    st.info(
        "This model has no decoder (encoder only): there is no causal, decoder self-attention or cross-attention mask."
    )
elif not has_encoder:
    st.info(
        "This model has no encoder (decoder only): there is no source padding, encoder self-attention or "
        "cross-attention mask; prompt and continuation are one sequence under the causal mask."
    )

figs = {}
pad_charts = []
if has_encoder:
    src_real = np.stack([model_facts.real_source(t) for t in traces])  # (B, S)
    figs["source padding"] = P.padding_mask_figure(
        src_real,
        [t.src_tokens for t in traces],
        position_title="source position",
        title=f"source padding mask [batch {len(traces)} × {src_real.shape[1]}]: green = real token, grey = PAD",
    )
    pad_charts.append(("source padding", "mask_src_pad"))
if has_decoder:
    tgt_real = np.stack([model_facts.real_decoder(t) for t in traces])  # (B, T)
    what = "sequence" if arch == "decoder" else "target"
    figs["target padding"] = P.padding_mask_figure(
        tgt_real,
        [t.tgt_tokens for t in traces],
        position_title="position (prompt, then continuation)"
        if arch == "decoder"
        else "decoder input position",
        title=f"{what} padding mask [batch {len(traces)} × {tgt_real.shape[1]}]: green = real token, grey = PAD",
    )
    pad_charts.append(("target padding", "mask_tgt_pad"))
for col, (name, key) in zip(st.columns(2), pad_charts, strict=False):
    with col:
        ui.chart(figs[name], key=key)

seq = state.sequence_picker(state.MASK_SEQ, traces)
tr = traces[seq]
where = f"sequence {seq}"
if has_decoder:
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
if has_decoder and has_encoder:
    figs["cross"] = P.attention_mask_figure(
        tr.cross_mask,
        tr.tgt_tokens,
        tr.src_tokens,
        query_title="query: decoder input",
        key_title="key: source tokens",
        title=f"cross-attention mask = real source key ({where})",
    )
if has_encoder:
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
