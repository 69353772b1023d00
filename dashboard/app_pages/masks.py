"""Masks: every mask of the current batch, and an audit of attention that fell on masked keys.

Which tokens are real is read from the masks the trace carries (never from PAD ids: decoder-only
models have no source ids, and T5/Marian start the decoder with PAD), so every model family works:
encoder only (source masks), decoder only (decoder masks) and encoder-decoder (all).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnscope.core.analysis import tables as analysis
from attnscope.core.traces.trace import KIND_LABELS
from attnscope.dashboard import keys as K
from attnscope.dashboard import model_facts, state, ui
from attnscope.dashboard.plots import masks as P

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


def show_in_rows(charts: list[tuple[str, str]]) -> None:
    """(figure name, chart key) pairs of ``figs``, two charts to a row."""
    for i in range(0, len(charts), 2):
        for col, (name, key) in zip(st.columns(2), charts[i : i + 2], strict=False):
            with col:
                ui.chart(figs[name], key=key)


# Padding masks of the whole batch, one row per sequence:
# (figure name, chart key, shown, real tokens (B, N), tokens per sequence, position axis, whose padding)
padding_panels = [
    (
        "source padding",
        "mask_src_pad",
        has_encoder,
        np.stack([model_facts.real_source(t) for t in traces]),
        [t.src_tokens for t in traces],
        "source position",
        "source",
    ),
    (
        "target padding",
        "mask_tgt_pad",
        has_decoder,
        np.stack([model_facts.real_decoder(t) for t in traces]),
        [t.tgt_tokens for t in traces],
        "position (prompt, then continuation)" if arch == "decoder" else "decoder input position",
        "sequence" if arch == "decoder" else "target",
    ),
]
pad_charts = []
for name, key, shown, real, tokens, position_title, what in padding_panels:
    if shown:
        figs[name] = P.padding_mask_figure(
            real,
            tokens,
            position_title=position_title,
            title=f"{what} padding mask [batch {len(traces)} × {real.shape[1]}]<br>green = real token, grey = PAD",
        )
        pad_charts.append((name, key))
show_in_rows(pad_charts)

seq = state.sequence_picker(K.MASK_SEQ, traces)
tr = traces[seq]
note = model_facts.head_masks_note(tr)
if note:
    st.warning(note)
where = f"sequence {seq}"
# kinds whose layers were masked differently (sliding-window layers between global ones): a layer to show
differ = [k for k in tr.kinds if tr.masks_differ(k)]
mask_layer = None
if differ:
    n_layers = max(tr.probs(k).shape[0] for k in differ)
    mask_layer = st.selectbox(
        "Layer (masks differ between layers)",
        range(n_layers),
        key=K.MASK_LAYER,
        help="The layers of "
        + ", ".join(KIND_LABELS[k] for k in differ)
        + " applied different masks (a sliding "
        "window in some layers, a mask a layer forgot): each layer's is shown here, and the audit below reads "
        "each layer's own.",
    )
    st.info(
        f"The layers of {', '.join(KIND_LABELS[k] for k in differ)} were masked differently: the masks below are "
        f"layer {mask_layer}'s."
    )


def kind_mask(kind: str) -> np.ndarray | None:
    """The picked layer's mask of ``kind`` (its one mask where every layer used the same)."""
    if mask_layer is None or kind not in differ:
        return getattr(tr, f"{kind}_mask")
    return tr.mask(kind, min(mask_layer, tr.probs(kind).shape[0] - 1))


def mask_title(kind: str, rule: str) -> str:
    """A panel's title: the rule the kind's mask follows, or, where its layers were masked differently (a
    sliding window in some), the layer shown."""
    if mask_layer is None or kind not in differ:
        return f"{KIND_LABELS[kind]} mask = {rule} ({where})"
    return f"{KIND_LABELS[kind]} mask of layer {min(mask_layer, tr.probs(kind).shape[0] - 1)} ({where})"


t_len = len(tr.tgt_tokens)
# Attention masks of the picked sequence:
# (figure name, chart key, shown, mask (Q, K), query tokens, key tokens, query axis, key axis, title)
attention_panels = [
    (
        "causal",
        "mask_causal",
        has_decoder and tr.dec_self_mask is not None,
        np.tril(np.ones((t_len, t_len), dtype=bool)),
        tr.tgt_tokens,
        tr.tgt_tokens,
        "query: decoder position",
        "key: decoder position",
        f"causal mask [{t_len} × {t_len}]: key position ≤ query position",
    ),
    (
        "decoder self",
        "mask_decoder_self",
        has_decoder and tr.dec_self_mask is not None,
        kind_mask("dec_self"),
        tr.tgt_tokens,
        tr.tgt_tokens,
        "query: decoder input",
        "key: decoder input",
        mask_title("dec_self", "causal AND real key"),
    ),
    (
        "cross",
        "mask_cross",
        has_decoder and has_encoder and tr.cross_mask is not None,
        kind_mask("cross"),
        tr.tgt_tokens,
        tr.src_tokens,
        "query: decoder input",
        "key: source tokens",
        mask_title("cross", "real source key"),
    ),
    (
        "encoder self",
        "mask_encoder_self",
        has_encoder and tr.enc_self_mask is not None,  # a model may lack a kind (an RNN seq2seq: cross only)
        kind_mask("enc_self"),
        tr.src_tokens,
        tr.src_tokens,
        "query: source tokens",
        "key: source tokens",
        mask_title("enc_self", "real source key"),
    ),
]
mask_charts = []
for name, key, shown, mask, q_tokens, k_tokens, query_title, key_title, title in attention_panels:
    if shown:
        figs[name] = P.attention_mask_figure(
            mask, q_tokens, k_tokens, query_title=query_title, key_title=key_title, title=title
        )
        mask_charts.append((name, key))
show_in_rows(mask_charts)

st.subheader("Audit: attention on masked positions (whole batch)")
table = analysis.masked_mass_table(traces)
bad = table[~table["ok"]]
if int(table["NaN rows"].sum()):
    st.warning(
        f"{int(table['NaN rows'].sum())} query rows are NaN (not numbers, as the model computed them): they are "
        "left out of this check (the Mask audit's finite check counts them)."
    )
if bad.empty:
    of_numbers = " (of the rows that are numbers)" if int(table["NaN rows"].sum()) else ""
    st.success(
        f"All {len(table)} (kind, layer, head) maps put exactly 0 attention on masked keys{of_numbers}, "
        "and no query row was fully masked."
        if int(table["fully masked rows"].max()) == 0
        else f"All {len(table)} maps put exactly 0 attention on masked keys{of_numbers}; fully masked rows came "
        "out all zero."
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
