"""Attention: every layer x head as small multiples, then one head (or head mean/max) large."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnscope.core.traces.trace import KIND_LABELS
from attnscope.dashboard import keys as K
from attnscope.dashboard import marks, model_facts, state, trace_cache, ui
from attnscope.dashboard.plots import attention as P
from attnscope.dashboard.plots.common import ATTENTION_AXIS_TITLES, DECODER_ONLY_TITLES

MISSING = {  # what a model family has no attention of, said on the page
    "encoder": "This model has no decoder (encoder only): there is no decoder self-attention or cross-attention.",
    "decoder": "This model has no encoder (decoder only): its one attention is causal self-attention over "
    "the prompt and the continuation; there is no encoder self-attention or cross-attention.",
}
MODE = K.ATT_SHOW  # session key of the weight | what-moves toggle
MODES = {"weight": "weight", "moves": "what moves (‖α·f(x)‖, each row scaled to sum 1)"}
MOVES_NAME = "what-moves share"
NO_VALUES = (
    "What moves is not available: this trace holds no value vectors (a trace file saved without them, or a "
    "model whose heads' output is gated or gets a second term, so that what moves from a key is not its "
    "value vector alone)."
)


st.title("Attention")
traces = state.traces()

kinds = list(traces[0].kinds)
arch = model_facts.trace_arch(traces[0])
if arch in MISSING:
    st.caption(MISSING[arch])
c_kind, c_seq = st.columns([3, 2])
with c_kind:
    ui.keep_valid(K.ATT_KIND, kinds)
    kind = st.radio("Attention kind", kinds, key=K.ATT_KIND, format_func=KIND_LABELS.get, horizontal=True)
with c_seq:
    seq = state.sequence_picker(K.ATT_SEQ, traces)
o1, o2, o3, _ = st.columns([1, 1, 2, 1], vertical_alignment="center")
log = o1.toggle("Log colour scale", key=K.ATT_LOG, help="Colour = log10(weight), from 1e-4 to 1.")
st.session_state.setdefault(K.ATT_MASK, True)  # (no value=: a link may set it)
show_mask = o2.toggle(
    "Show mask",
    key=K.ATT_MASK,
    help="Masked cells (may not attend) are drawn grey in the grid and marked ✕ in the heatmap.",
)
aggregates = o3.multiselect(
    "Grid: add per-layer columns",
    list(P.AGGREGATES),
    key=K.ATT_AGG,
    format_func=lambda a: f"head {a}",
    placeholder="head mean / head max",
)

tr = traces[seq]
ui.run_caption(tr)
norms = tr.value_norms(kind)
if norms is None:  # nothing to switch to: the toggle stays on the weights, disabled
    st.session_state[MODE] = "weight"
mode = (
    st.radio(
        "Show",
        list(MODES),
        key=MODE,
        format_func=MODES.get,
        horizontal=True,
        disabled=norms is None,
        help="A weight says how much a query looks at a key; what moves says how much of the key's "
        "value actually reaches the query: the weight times the length of the vector it multiplies.",
    )
    or "weight"
)
if norms is None:
    st.caption(NO_VALUES)
elif mode == "moves":
    scope = tr.value_norms_scope(kind)
    st.caption(
        "**What moves**: a head adds α_ij·f(x_j) to query i, where f(x_j) is key j's value vector"
        + (" after the output projection" if scope == "with the output projection" else "")
        + ". A large weight on a key whose vector is short moves little. Each cell is ‖α_ij·f(x_j)‖, "
        "each row scaled to sum 1, so it reads as the share of what this query receives that comes from "
        "that key (Kobayashi et al. 2020)."
        + (
            " The model's output projection could not be found: these are the norms of the value "
            "vectors ‖v_j‖ **without the output projection**."
            if scope == "without the output projection"
            else ""
        )
    )
moves_on = mode == "moves" and norms is not None
probs = tr.probs(kind)
q_tok, k_tok = tr.axes(kind)
mask = tr.mask(kind)
layer_masks = (
    tr.layer_masks(kind) if tr.masks_differ(kind) else None
)  # layers masked differently: each its own
n_layers, n_heads = probs.shape[:2]
where = f"sequence {seq}" if len(traces) > 1 else "input"
hinted = marks.hinted({} if state.current().trace else state.model().meta, kind)

grid_title = (
    f"{KIND_LABELS[kind]}{': what moves' if moves_on else ''}: all {n_layers} layers × {n_heads} heads "
    f"({where}); click a tile"
)
grid = trace_cache.figures.get(  # built once per trace and options: picking a head does not rebuild it
    tr,
    ("grid", kind, moves_on, show_mask, log, tuple(aggregates), grid_title, tuple(sorted(hinted.items()))),
    lambda: P.grid_figure(
        P.moves_shares(probs, norms) if moves_on else probs,
        q_tok,
        k_tok,
        mask=(mask if layer_masks is None else layer_masks) if show_mask else None,
        log=log,
        aggregates=aggregates,
        title=grid_title,
        marks=hinted,
        **({"value_name": MOVES_NAME} if moves_on else {}),
    ),
)
event = ui.chart(grid, key=K.ATT_GRID, on_select="rerun", selection_mode="points")
marks.caption(hinted)

# A click on a tile picks that layer and head (applied once, so the selectors stay usable).
ui.apply_click(event, K.ATT_GRID_APPLIED, kind, K.ATT_LAYER, K.ATT_HEAD, P.parse_grid_point)

heads: list[int | str] = list(range(n_heads)) + list(P.AGGREGATES)
layer, head = ui.layer_head_picker(K.ATT_LAYER, K.ATT_HEAD, n_layers, heads)

weights = P.head_weights(probs, layer, head)
mask = tr.mask(kind, layer)  # this layer's (the kind's one mask where every layer used it)
head_keys, head_mask = k_tok, mask
extra: dict[str, np.ndarray] = {}
if norms is not None:  # hover: both numbers, and the raw ‖α f(x)‖
    share, raw = P.head_moves(probs, norms, layer, head)
    extra = {MOVES_NAME: share, "‖α·f(x)‖": raw}
    if moves_on:
        extra = {"weight": weights, "‖α·f(x)‖": raw}
        weights = share
learned = tr.learned(kind)
if learned is not None and moves_on:  # learned keys have no value norms here: the tokens' columns only
    st.caption(
        f"The learned keys ({', '.join(learned[0][:6])}) carry no value norms: the what-moves view shows "
        "the tokens' columns only."
    )
    learned = None
if learned is not None:  # learned keys outside the sequence (memory key/values, a null key): extra columns
    labels, extra_w = learned
    weights = np.concatenate([weights, P.head_weights(extra_w, layer, head)], axis=-1)
    head_keys = (*k_tok, *labels)
    extra = {}  # the what-moves numbers cover the tokens' columns only
    if mask is not None:
        head_mask = np.concatenate([mask, np.ones((mask.shape[0], len(labels)), dtype=bool)], axis=-1)
q_title, k_title = DECODER_ONLY_TITLES if arch == "decoder" else ATTENTION_AXIS_TITLES[kind]
big = P.head_heatmap(
    weights,
    q_tok,
    head_keys,
    mask=head_mask if show_mask else None,
    log=log,
    query_title=q_title,
    key_title=k_title,
    title=f"{KIND_LABELS[kind]} · layer {layer} · {P.head_name(head)} · {where}"
    + (" · what moves" if moves_on else "")
    + (f"<br><sup>▣ {marks.NOTE}: {hinted[(layer, head)]}</sup>" if (layer, head) in hinted else ""),
    **({"value_name": MOVES_NAME} if moves_on else {}),
    extra=extra or None,
)
ui.chart(big, key="att_head_chart")
if learned is not None:
    share = float(np.nanmean(learned[1].sum(-1)))
    st.info(
        f"These queries also attend to {len(learned[0])} learned key(s) that are not tokens of the input "
        f"({', '.join(learned[0][:6])}{', …' if len(learned[0]) > 6 else ''}): the last columns of the head view. "
        f"They take {share:.0%} of the weight on average; the grid shows the tokens' columns only, so its rows "
        "sum to the rest."
    )
st.caption(
    "Rows: queries (each row sums to 1 over the keys it may attend to). Columns: keys. "
    + ("Hover a cell for its weight, its what-moves share and ‖α·f(x)‖. " if extra else "")
    + "PAD positions are shown; with 'Show mask' on, ✕ marks keys the mask forbids (their weight is exactly 0)."
    + (
        f" Positions 0–{model_facts.prompt_len(tr) - 1} are the prompt, the rest the continuation."
        if arch == "decoder" and model_facts.real_decoder(tr).sum() > model_facts.prompt_len(tr)
        else ""
    )
)
ui.downloads(tr, seq, {"grid": grid, "head": big}, key="att_dl")
