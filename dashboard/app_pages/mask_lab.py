"""Mask lab: inject a known mask bug into a core model's forward pass and see what it breaks."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnscope.core.analysis import analytics, bugs
from attnscope.core.errors import InputError
from attnscope.core.traces.trace import KIND_LABELS
from attnscope.dashboard import files, runs, state, ui, words
from attnscope.dashboard import keys as K
from attnscope.dashboard.plots import analytics as PA
from attnscope.dashboard.plots import attention as PT
from attnscope.dashboard.plots import audit as P
from attnscope.dashboard.plots.common import AXIS_TITLES

SHORT_COLUMNS = ["status", "check", "layer", "head", "detail"]

st.title("Mask lab")
st.markdown(
    "Pick a known mask bug and inject it into the model's **real forward pass** (the buggy masks are passed "
    "to attention exactly where the correct ones go; nothing is patched). Left: the correct run; right: the "
    "same inputs with the bug, teacher-forced on the correct model's output so positions line up. The output "
    "text on the right is what the buggy model generates on its own."
)
sel = state.current()
lm = state.model("The mask lab")
if not lm.injectable:
    st.warning(words.not_injectable_message(lm))
    st.stop()
state.check_inputs()  # the lab traces its own batch (below): no trace of the sidebar's input is needed
model_kinds = tuple(analytics.head_shapes(lm.cfg))  # the kinds of attention this core model has

names = [n for n in bugs.names() if lm.has_decoder or not bugs.get(n).needs_decoder]
ui.keep_valid(K.LAB_BUG, names)
c_bug, c_pad = st.columns([3, 2], vertical_alignment="bottom")
bug_name = c_bug.selectbox("Mask bug", names, key=K.LAB_BUG, format_func=words.bug_title)
add_copy = False
if len(sel.sources) == 1:
    st.session_state.setdefault(K.LAB_PAD, True)  # (no value=: a link may set it)
    add_copy = c_pad.toggle(
        "Add a shorter copy of the input (padding)",
        key=K.LAB_PAD,
        help="Padding bugs only show where there is PAD: the batch becomes your input plus its first half.",
    )
bug = bugs.get(bug_name)
title, buggy_code, correct_code, explanation = words.BUG_HELP[bug_name]
with st.container(border=True):
    st.markdown(f"**{title}** (`{bug_name}`). {explanation}")
    k1, k2 = st.columns(2)
    k1.caption("Buggy code")
    k1.code(buggy_code, language="python")
    k2.caption("Correct code")
    k2.code(correct_code, language="python")
    st.caption("Masks it changes: " + ", ".join(KIND_LABELS[k] for k in bug.kinds if k in model_kinds))
if len(names) < len(bugs.BUGS):
    st.caption(
        f"{len(bugs.BUGS) - len(names)} more bugs need a decoder (causal and cross-attention masks); "
        "this model is encoder-only."
    )

sources, targets, added = runs.lab_batch(lm, sel.sources, sel.targets, add_copy)
try:
    # The leak tests run in worker threads while this script draws the masks and maps below; the
    # verdicts are written above them when the tests are done.
    lab_key = sel.key.but(sources=sources, targets=targets, bug=bug_name)
    pending = runs.lab_reports_later(lab_key)
    traces_ok, traces_bad = runs.lab_traces(lab_key)
except (InputError, ValueError) as exc:
    st.error("The lab cannot run on this input: " + files.sentence(str(exc)))
    st.stop()
state.show_warnings(traces_ok, len(traces_ok) > 1)
if added:
    st.caption(f"Batch: your input and its shorter copy {sources[1]!r} (padded to the same length).")
verdicts = st.container()
with verdicts:
    waiting = st.empty()
    waiting.caption("Running the leak tests with and without the bug… (the masks and maps below are ready)")


def show_verdicts() -> None:
    """Verdicts and outputs, side by side: written into ``verdicts`` once the leak tests are done."""
    try:
        ok, bad = pending.result()
        out_ok, out_bad = runs.outputs(lab_key.plain(), ok), runs.outputs(lab_key, bad)
    except (InputError, ValueError) as exc:
        waiting.error("The lab cannot run on this input: " + files.sentence(str(exc)))
        return
    waiting.empty()
    generate = targets is None and lm.has_decoder
    left, right = st.columns(2)
    for col, report, outs, head in (
        (left, ok, out_ok, "Correct masks"),
        (right, bad, out_bad, "With the bug"),
    ):
        with col:
            st.subheader(head)
            (st.error if report.failed else st.success)(words.verdict_line(report))
            for i, text in enumerate(outs):
                num = f" {i}" if len(outs) > 1 else ""
                st.text(f"{'Generated' if generate else 'Output'}{num}: {text}")
                forced = report.traces[i].output_text
                if generate and report is bad and forced != text:
                    st.text(f"Teacher-forced on the correct output{num}: {forced}")
            table, height = ui.verdict_frame(
                [v for v in report.verdicts if v.status != "info"], SHORT_COLUMNS
            )
            st.dataframe(
                table,
                hide_index=True,
                key=f"lab_table_{'bug' if report is bad else 'ok'}",
                height=height,
                column_config={"detail": st.column_config.TextColumn("detail", width="large")},
            )
    newly = [v.name for v in bad.failed if v.name not in {w.name for w in ok.failed}]
    if newly and ok.failed:
        st.markdown("**Checks only the bug breaks:** " + ", ".join(f"`{n}`" for n in newly))
    elif not bad.failed:
        st.info(
            "The audit finds nothing on this input: the bug changes no mask entry here "
            + ("(turn on the shorter copy, or give a batch of different lengths, so there is padding)."
               if not added else "(try a longer input).")
        )  # fmt: skip


# -- masks and attention, correct vs buggy ---------------------------------------------------------------
st.subheader("Masks and attention")
kinds = list(traces_ok[0].kinds)
default_kind = next((k for k in bug.kinds if k in kinds), kinds[0])
if st.session_state.get(K.LAB_KIND_FOR_BUG) != bug_name:  # a new bug: show a mask it changes
    st.session_state[K.LAB_KIND] = default_kind
    st.session_state[K.LAB_KIND_FOR_BUG] = bug_name
ui.keep_valid(K.LAB_KIND, kinds, default_kind)
n = len(traces_ok)
pad = lm.cfg.pad_id
n_pad = [int((np.asarray(t.src_ids) == pad).sum()) for t in traces_ok]
ui.keep_valid(K.LAB_SEQ, list(range(n)), int(np.argmax(n_pad)))
c_kind, c_seq, c_layer, c_head = st.columns([3, 2, 1, 1])
kind = c_kind.radio("Attention kind", kinds, key=K.LAB_KIND, format_func=KIND_LABELS.get, horizontal=True)
seq = c_seq.selectbox(
    "Sequence",
    list(range(n)),
    key=K.LAB_SEQ,
    format_func=lambda i: f"{i}: {sources[i][:40]}" + (" (shorter copy)" if added and i == 1 else ""),
    disabled=n == 1,
)
tr_ok, tr_bad = traces_ok[seq], traces_bad[seq]
n_layers, n_heads = tr_ok.probs(kind).shape[:2]
layer, head = ui.layer_head_picker(K.LAB_LAYER, K.LAB_HEAD, n_layers, n_heads, columns=(c_layer, c_head))

where = words.where(traces_ok, seq)
q_tok, k_tok = tr_ok.axes(kind)
q_title, k_title = AXIS_TITLES[kind]
m_ok, m_bad = tr_ok.mask(kind, layer), tr_bad.mask(kind, layer)
# Two tabs, two charts each: what the bug changes (the mask, cell by cell, and the attention it moves),
# then the two attention maps. Only the open tab's figures are built and sent (at 512 tokens each chart
# is 262,144 cells for the browser to draw); switching tabs reruns the page on the cached runs.
change_tab, maps_tab = st.tabs(list(words.LAB_VIEWS.values()), key=K.LAB_VIEW, on_change="rerun")
figs = {}
if change_tab.open:
    diff = analytics.trace_difference(tr_ok, tr_bad, kind, layer, head)
    figs["buggy mask"] = P.mask_compare_figure(
        m_ok, m_bad, q_tok, k_tok, query_title=q_title, key_title=k_title,
        title=f"mask with {bug_name}, cell by cell against the correct one<br>{KIND_LABELS[kind]} · {where}",
    )  # fmt: skip
    figs["difference"] = PA.difference_figure(
        np.nan_to_num(diff, nan=0.0), q_tok, k_tok, query_title=q_title, key_title=k_title,
        value_name="bug - correct",
        title=f"with bug minus correct<br>{KIND_LABELS[kind]} · layer {layer} · head {head} · {where}"
        + (" (NaN drawn as 0)" if np.isnan(diff).any() else ""),
    )  # fmt: skip
    n_leak = int((m_bad & ~m_ok).sum())
    n_over = int((~m_bad & m_ok).sum())
    with change_tab:
        c1, c2 = st.columns(2)
        with c1:
            ui.chart(ui.side_by_side(figs["buggy mask"], len(k_tok)), key="lab_mask_bad")
            st.caption(
                f"The correct mask is every teal and orange cell. {n_leak} cells wrongly visible (red: the "
                f"query may read a key it must not), {n_over} wrongly masked (orange)."
                + (
                    " The -inf fill itself is not a mask entry: watch the attention."
                    if bug.neg_inf_fill
                    else ""
                )
            )
        with c2:
            ui.chart(ui.side_by_side(figs["difference"], len(k_tok)), key="lab_att_diff")
            st.caption("Red: the bug gives this (query, key) more weight; blue: less.")
if maps_tab.open:
    w_ok = PT.head_weights(tr_ok.probs(kind), layer, head)
    w_bad = PT.head_weights(tr_bad.probs(kind), layer, head)
    figs["correct attention"] = PT.head_heatmap(
        w_ok, q_tok, k_tok, mask=m_ok, query_title=q_title, key_title=k_title,
        title=f"correct attention<br>{KIND_LABELS[kind]} · layer {layer} · head {head} · {where}",
    )  # fmt: skip
    figs["buggy attention"] = PT.head_heatmap(
        w_bad, q_tok, k_tok, mask=m_bad, query_title=q_title, key_title=k_title,
        title=f"attention with {bug_name}<br>{KIND_LABELS[kind]} · layer {layer} · head {head} · {where}",
    )  # fmt: skip
    with maps_tab:
        c1, c2 = st.columns(2)
        with c1:
            ui.chart(ui.side_by_side(figs["correct attention"], len(k_tok)), key="lab_att_ok")
        with c2:
            ui.chart(ui.side_by_side(figs["buggy attention"], len(k_tok)), key="lab_att_bad")
            n_nan = int(np.isnan(w_bad).sum())
            if n_nan:
                st.caption(f"{n_nan} weights of this head are NaN (drawn blank).")
ui.downloads(tr_bad, seq, figs, key="lab_dl")

with verdicts:
    show_verdicts()
