"""Head analytics: what each head does (statistics per layer x head), rollout, attribution, alignment."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnscope.core.analysis import analytics as A
from attnscope.core.analysis.audit import real_positions
from attnscope.core.traces.trace import KIND_LABELS
from attnscope.dashboard import corpus_view, marks, runs, state, trace_cache, ui, words
from attnscope.dashboard import keys as K
from attnscope.dashboard.plots import analytics as P
from attnscope.dashboard.plots import attention as PT
from attnscope.dashboard.plots.common import AXIS_TITLES

STAT_HELP = {
    "entropy": "how spread out each query's attention is (0 = one key, log n = uniform over n keys)",
    "distance": "how far, in positions, a query looks on average",
    "diagonal": "mean weight a query puts on its own position",
    "previous": "mean weight on the position just before",
    "next": "mean weight on the position just after",
    "first": "mean weight on the first real key (BOS / CLS, or the first source token)",
    "last": "mean weight on the last real key (EOS / SEP)",
    "monotonic": "Kendall tau between target position and its argmax source position (+1: reads the source "
    "left to right, -1: right to left, e.g. a reversing model)",
}
ROLLOUT = "ha_moves_rollout"  # session key of the attention | norm-based rollout switch (this page's own)
ROLLOUTS = {"attention": "attention rollout", "norm": "norm-based rollout"}
SINK_RULE = (
    f"**Sinks** are the first token, special tokens (`<bos>`, `[CLS]`, `<eos>`, `[SEP]`; PAD is masked, never a "
    f"sink) and punctuation. A head is **parked** when its weight share is at least {A.SINK_WEIGHT:g} (at "
    f"least half its weight is on sinks) but its share of what moves from them is at most {A.SINK_RATIO:g} × "
    "its weight share: it looks at the sinks, but what it takes from them is small. Both shares are means "
    "over real (non-PAD) query rows."
)
SINK_FORMULA = (
    r"\text{weight share} = \operatorname{mean}_i \sum_{j \in \text{sinks}} \alpha_{ij}, \qquad "
    r"\text{moves share} = \operatorname{mean}_i \frac{\sum_{j \in \text{sinks}} \alpha_{ij}\,\lVert f(x_j) "
    r"\rVert}{\sum_j \alpha_{ij}\,\lVert f(x_j) \rVert}"
)
NORM_ROLLOUT_FORMULA = (
    r"C^{(l)}_{ij} = \frac{\sum_h \alpha^{h}_{ij}\,\lVert f_h(x_j)\rVert + \delta_{ij}\,\lVert x_i\rVert}"
    r"{\sum_{k}\big(\sum_h \alpha^{h}_{ik}\,\lVert f_h(x_k)\rVert + \delta_{ik}\,\lVert x_i\rVert\big)}, "
    r"\qquad R^{(l)} = C^{(l)} C^{(l-1)} \cdots C^{(0)}"
)
ATTENTION_ROLLOUT_FORMULA = (
    r"A'^{(l)} = \operatorname{rownorm}\big(0.5\, I + 0.5\, \operatorname{mean}_h A^{h,(l)}\big), \qquad "
    r"R^{(l)} = A'^{(l)} A'^{(l-1)} \cdots A'^{(0)}"
)


def _select_from_table() -> None:
    """A table row picked: show that head (runs before the page, so the selectors may change)."""
    rows = st.session_state[K.HA_TABLE].selection.rows
    records = st.session_state.get(K.HA_RECORDS) or []
    if rows and rows[0] < len(records):
        r = records[rows[0]]
        st.session_state[K.HA_KIND] = r["kind"]
        st.session_state[K.HA_LAYER], st.session_state[K.HA_HEAD] = r["layer"], r["head"]


st.title("Head analytics")
st.markdown(
    "What each head does, as numbers: every statistic is averaged over real (non-PAD) query rows and counts "
    "real keys only. Click a cell of the heatmap (or pick a row of the table) to see that head's attention."
)
corpus_view.section()  # a stats file from `attnscope stats`: the heads over a whole corpus
traces = state.traces()
file = state.trace_file()  # a trace file: statistics of its maps (no model to run)
pad = state.pad_id()
kinds = list(traces[0].kinds)
c_kind, c_stat, c_seq = st.columns([3, 2, 2])
with c_kind:
    ui.keep_valid(K.HA_KIND, kinds)
    kind = st.radio("Attention kind", kinds, key=K.HA_KIND, format_func=KIND_LABELS.get, horizontal=True)
stats_names = list(A.CROSS_STATS if kind == "cross" else A.STATS)
with c_stat:
    ui.keep_valid(K.HA_STAT, stats_names)
    stat = st.selectbox("Statistic", stats_names, key=K.HA_STAT, format_func=A.STAT_LABELS.get)
with c_seq:
    seq = state.sequence_picker(K.HA_SEQ, traces)
tr = traces[seq]
where = words.where(traces, seq)
ui.run_caption(tr)

sel = state.current()
if file is not None:
    all_stats, records = runs.file_head_stats(file.digest, tr)
else:
    all_stats, records = runs.head_stats(sel.key, seq, pad)
stats = all_stats[kind]
hinted = marks.hinted({} if file is not None else state.model().meta, kind)
figs = {}
figs["statistic"] = P.stat_heatmap(
    stats[stat],
    title=f"{KIND_LABELS[kind]}: {A.STAT_LABELS[stat]} per head ({where}); click a cell",
    stat=stat,
    label=A.STAT_LABELS[stat],
    marks=hinted,
)
event = ui.chart(figs["statistic"], key=K.HA_CHART, on_select="rerun", selection_mode="points")
marks.caption(hinted)
ui.apply_click(event, K.HA_CLICK_APPLIED, (kind, stat, seq), K.HA_LAYER, K.HA_HEAD, P.parse_head_point)
st.caption(f"**{A.STAT_LABELS[stat]}**: {STAT_HELP[stat]}.")

probs = tr.probs(kind)
n_layers, n_heads = probs.shape[:2]
layer, head = ui.layer_head_picker(K.HA_LAYER, K.HA_HEAD, n_layers, n_heads)
q_tok, k_tok = tr.axes(kind)
q_title, k_title = AXIS_TITLES[kind]
weights, head_keys, head_mask = probs[layer, head], k_tok, tr.mask(kind, layer)
learned = tr.learned(kind)
if learned is not None:  # learned keys outside the sequence (memory key/values, a null key): extra columns
    labels, extra_w = learned
    weights = np.concatenate([weights, extra_w[layer, head]], axis=-1)
    head_keys = (*k_tok, *labels)
    if head_mask is not None:
        head_mask = np.concatenate(
            [head_mask, np.ones((head_mask.shape[0], len(labels)), dtype=bool)], axis=-1
        )
figs["head"] = PT.head_heatmap(
    weights,
    q_tok,
    head_keys,
    mask=head_mask,
    query_title=q_title,
    key_title=k_title,
    title=f"{KIND_LABELS[kind]} · layer {layer} · head {head} · {where}"
    + (f"<br><sup>▣ {marks.NOTE}: {hinted[(layer, head)]}</sup>" if (layer, head) in hinted else ""),
)
ui.chart(figs["head"], key="ha_head_chart")
if learned is not None:
    share = float(np.nanmean(learned[1][layer, head].sum(-1)))
    st.info(
        f"These queries also attend to {len(learned[0])} learned key(s) that are not tokens of the input "
        f"({', '.join(learned[0][:6])}{', …' if len(learned[0]) > 6 else ''}): the last columns of the head view. "
        f"They take {share:.0%} of this head's weight on average. The entropy counts them; the other "
        "statistics are about positions and count the tokens' keys only."
    )
st.caption(
    "This head: "
    + ", ".join(f"{A.STAT_LABELS[s]} {stats[s][layer, head]:.3f}" for s in stats_names)
    + ". ✕ marks masked keys."
)

st.subheader("Every head, sortable")
st.session_state[K.HA_RECORDS] = records
st.dataframe(
    P.head_table(records),
    hide_index=True,
    key=K.HA_TABLE,
    on_select=_select_from_table,
    selection_mode="single-row",
    column_config={s: st.column_config.NumberColumn(A.STAT_LABELS[s], format="%.3f") for s in A.CROSS_STATS},
)
st.caption(
    "Click a column header to sort; pick a row to show that head above. "
    "monotonic is for cross-attention only (empty elsewhere)."
)

# -- sinks: weight parked where nothing moves ------------------------------------------------------------
st.subheader("Sink heads: weight parked where little moves")
sink_rows = trace_cache.figures.get(tr, ("ha_sinks", pad), lambda: A.sink_records(tr, pad))
st.markdown(SINK_RULE)
st.latex(SINK_FORMULA)
st.caption(
    "f(x_j) is key j's value vector after the head's output projection: α_ij‖f(x_j)‖ is how much key j "
    "actually adds to query i (Kobayashi et al. 2020). A large weight on a short vector moves little."
)
sentence = A.parked_sentence(sink_rows, KIND_LABELS)
if sentence:
    st.markdown(sentence)
else:
    st.caption(
        "This trace holds no value vectors (a trace file saved without them, or a model whose heads' output "
        "is gated or gets a second term): the table gives "
        "the weight share only, and no head can be called parked."
    )
scopes = {k: tr.value_norms_scope(k) for k in kinds if tr.value_norms(k) is not None}
if "without the output projection" in scopes.values():
    st.caption(
        "The model's output projection could not be found for "
        + ", ".join(KIND_LABELS[k] for k, v in scopes.items() if v == "without the output projection")
        + ": what moves there uses the value vectors' norms ‖v_j‖, without the output projection."
    )
st.dataframe(
    P.sink_table(sink_rows),
    hide_index=True,
    key="ha_sink_table",
    column_config={
        c: st.column_config.NumberColumn(label, format="%.3f") for c, label in P.SINK_COLUMNS.items()
    },
)

# -- rollout, attribution, alignment -----------------------------------------------------------------------
method = "attention"
if "enc_self" in kinds:
    st.subheader("Attention rollout (encoder)")
    src_real = real_positions(tr, "src", pad)
    can_norm = A.has_norms(tr, "enc_self")
    if not can_norm:
        st.session_state[ROLLOUT] = "attention"
    method = (
        st.radio(
            "Rollout",
            list(ROLLOUTS),
            key=ROLLOUT,
            format_func=ROLLOUTS.get,
            horizontal=True,
            disabled=not can_norm,
            help="Norm-based: each layer mixes tokens by what moves (‖α·f(x)‖) plus the residual stream "
            "(‖x‖), not by the weights alone. Source attribution below follows this switch.",
        )
        or "attention"
    )
    if not can_norm:
        st.caption(
            "The norm-based rollout is not available: this trace holds no value or residual norms (the "
            "model's output projection or the residual stream it is added to could not be followed, or "
            "the trace file was saved without them)."
        )
    st.latex(NORM_ROLLOUT_FORMULA if method == "norm" else ATTENTION_ROLLOUT_FORMULA)
    roll = trace_cache.figures.get(
        tr, ("ha_rollout", method, pad), lambda: A.trace_rollout(tr, src_real, method=method)
    )
    n_enc = roll.shape[0]
    ui.keep_valid(K.HA_ROLL_LAYER, list(range(n_enc)), n_enc - 1)
    r_layer = st.selectbox(
        "Rollout after layer", list(range(n_enc)), key=K.HA_ROLL_LAYER,
        help="The last layer's rollout covers the whole encoder.",
    )  # fmt: skip
    toks = [t for t, r in zip(tr.src_tokens, src_real, strict=True) if r]
    figs["rollout"] = P.rollout_figure(
        roll[r_layer],
        toks,
        title=(
            f"encoder norm-based rollout through layers 0–{r_layer} (of {n_enc}), ‖α·f(x)‖ + ‖x‖ · {where}"
            if method == "norm"
            else f"encoder attention rollout through layers 0–{r_layer} (of {n_enc}), head mean · {where}"
        ),
    )
    ui.chart(figs["rollout"], key="ha_rollout")
    st.caption(
        (
            "Norm-based rollout (Kobayashi et al. 2021, residual-aware norms): per layer, how much each token "
            "adds to each position (the sum over heads of α·‖f(x)‖) plus the residual stream the position "
            "keeps (‖x_i‖ on the diagonal), rows scaled to sum 1, multiplied layer after layer as attention "
            "rollout is."
            if method == "norm"
            else "Rollout (Abnar & Zuidema, 2020): per layer the head-mean attention plus the residual "
            "connection (0.5 I + 0.5 A, rows normalised), multiplied layer after layer."
        )
        + " Row = encoder position after these layers, column = input token it draws on. PAD positions "
        "are left out."
    )

if "cross" in kinds:
    st.subheader("Source attribution through cross-attention")
    through = False  # a model without encoder self-attention (an RNN encoder): its states are the tokens'
    if "enc_self" in kinds:
        through = st.toggle(
            "Through the encoder (multiply by the encoder rollout)",
            key=K.HA_ATTR_ENCODER,
            value=True,
            help="Off: columns are encoder states (cross-attention alone); on: source tokens.",
        )
    else:
        st.caption(
            "This model has no encoder self-attention: the columns are its encoder's states, one per source token."
        )
    attr_method = method if A.has_norms(tr, "cross", "enc_self") else "attention"
    attr = A.source_attribution(tr, through_encoder=through, method=attr_method)
    t_real, s_real = real_positions(tr, "tgt", pad), real_positions(tr, "src", pad)
    figs["attribution"] = P.matrix_figure(
        attr,
        tr.tgt_tokens,
        tr.src_tokens,
        title=f"share of each source {'token' if through else 'state'} in each target step "
        f"(cross-attention, all layers and heads{', norm-based' if attr_method == 'norm' else ''}) · {where}",
        query_title="target step: decoder input",
        key_title="source token" if through else "source position (encoder state)",
        marks=A.alignment(attr, t_real, s_real),
        value_name="share",
    )
    ui.chart(figs["attribution"], key="ha_attribution")
    st.caption(
        "Row t is the decoder step that reads input token t and predicts output token t; each real row sums "
        "to 1. Circles: the source token with the largest share."
        + (
            " Norm-based (the rollout switch above): each decoder layer's cross-attention counts what moves "
            "(Σ_h α·‖f(e_j)‖, rows scaled to sum 1) and the encoder part is its norm-based rollout."
            if attr_method == "norm"
            else ""
        )
    )

    st.subheader("Cross-attention alignment")
    n_dec, n_h = tr.probs("cross").shape[:2]
    a1, a2, _ = st.columns([1, 1, 3])
    ui.keep_valid(K.HA_AL_LAYER, ["mean", *range(n_dec)])
    ui.keep_valid(K.HA_AL_HEAD, ["mean", *range(n_h)])
    al_layer = a1.selectbox(
        "Layer", ["mean", *range(n_dec)], key=K.HA_AL_LAYER,
        format_func=lambda x: "mean of layers" if x == "mean" else f"layer {x}",
    )  # fmt: skip
    al_head = a2.selectbox(
        "Head", ["mean", *range(n_h)], key=K.HA_AL_HEAD,
        format_func=lambda x: "mean of heads" if x == "mean" else f"head {x}",
    )  # fmt: skip
    weights, arg = A.cross_alignment(
        tr, None if al_layer == "mean" else al_layer, None if al_head == "mean" else al_head, pad
    )
    nt, ns = int(t_real.sum()), int(s_real.sum())
    which = (
        f"{'mean of layers' if al_layer == 'mean' else f'layer {al_layer}'}, "
        f"{'mean of heads' if al_head == 'mean' else f'head {al_head}'}"
    )
    figs["alignment"] = P.alignment_figure(
        tr.src_tokens[:ns],
        tr.tgt_tokens[:nt],
        weights[:nt, :ns],
        arg[:nt],
        title=f"cross-attention alignment, {which} · {where}: source (top) → target step (bottom)",
    )
    ui.chart(figs["alignment"], key="ha_alignment")
    tau = A.kendall_tau(arg[:nt].astype(np.float64)) if nt > 1 else float("nan")
    st.caption(
        "Each target step (bottom, decoder input token) is joined to the source tokens (top) it attends to; "
        f"orange: its argmax. Kendall tau of the argmax positions: {float(tau):.2f} "
        "(+1 monotonic left to right, -1 right to left)."
    )

if file is None and state.model().injectable:
    st.caption("Switch heads off and see what changes on the **Compare** page (mode: heads switched off).")
ui.downloads(tr, seq, figs, key="ha_dl")
