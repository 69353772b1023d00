"""Compare: the sidebar's run (A) against another input, another model, a mask bug or heads switched off (B);
or, with a run folder open (attnscope.watch), two of its watched steps."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnscope.core.analysis import analytics as A
from attnscope.core.analysis import bugs
from attnscope.core.errors import InputError, ModelLoadError
from attnscope.core.runs.runfile import RunFormatError
from attnscope.core.traces.trace import KIND_LABELS, AttentionTrace
from attnscope.dashboard import files, loaders, runs, state, ui, watched, words
from attnscope.dashboard import keys as K
from attnscope.dashboard.plots import analytics as P
from attnscope.dashboard.plots import attention as PT
from attnscope.dashboard.plots.common import AXIS_TITLES
from attnscope.models import registry

MODES = ("another input", "another model", "a mask bug", "heads switched off", "another training step")
RUN_MODE = "two steps of the open run"  # offered while a run folder is open
MOVES_MODE = "what the weights move"  # A: the weights; B: what moves (||alpha f(x)||, rows sum to 1)


def _what_moves(tr: AttentionTrace) -> AttentionTrace:
    """The trace with each kind's weights replaced by what moves (rows scaled to sum 1); kinds without
    value norms left out."""
    changes = {}
    for kind in tr.kinds:
        moved = tr.moves(kind, normalize=True)
        changes[kind] = moved
        if moved is None:
            changes[f"{kind}_scores"] = None
            changes[f"{kind}_learned"] = None
    return tr.replace(**changes)


def _pair_labels(a: tuple[str, ...], b: tuple[str, ...]) -> list[str]:
    """Position-by-position labels of two token lists: the token, or 'a→b' where they differ."""
    n = min(len(a), len(b))
    return [a[i] if a[i] == b[i] else f"{a[i]}→{b[i]}" for i in range(n)]


def _audit_lines(ca, cb, ok, bad) -> None:
    for col, report, name in ((ca, ok, "A"), (cb, bad, "B")):
        (col.error if report.failed else col.success)(f"Audit of {name}: {words.verdict_line(report)}")
    changed = [v.name for v in bad.failed if v.name not in {w.name for w in ok.failed}]
    if changed and ok.failed:
        st.markdown("**Checks that fail only in B:** " + ", ".join(f"`{n}`" for n in changed))


def _run_steps(o: watched.OpenRun) -> tuple[list[AttentionTrace], list[AttentionTrace], int, int, int]:
    """Two steps of the open run, picked here: (traces at A, traces at B, probe index, step A, step B)."""
    run = watched.open_run(o.path)
    steps = run.steps()
    if len(steps) < 2:
        st.info(f"The run {o.label} has {len(steps)} watched step(s) so far: comparing needs two.")
        st.stop()
    ui.keep_valid(K.CMP_RUN_A, steps, default=steps[0])
    ui.keep_valid(K.CMP_RUN_B, steps, default=steps[-1])
    c1, c2 = st.columns(2)
    fmt = "{:,}".format
    step_a = c1.select_slider("Step A", steps, key=K.CMP_RUN_A, format_func=fmt)
    step_b = c2.select_slider("Step B", steps, key=K.CMP_RUN_B, format_func=fmt)
    traces_a, traces_b = list(watched.step_traces(o.path, step_a)), list(watched.step_traces(o.path, step_b))
    if not traces_a or not traces_b:
        st.info(f"The run {o.label} keeps no probe traces (weights only): there is no attention to compare.")
        st.stop()
    probe = 0
    if len(traces_a) > 1:
        labels = watched.probe_labels(run, traces_a)
        ui.keep_valid(K.CMP_SEQ, list(range(len(traces_a))))
        probe = st.selectbox(
            "Probe input", list(range(len(traces_a))), key=K.CMP_SEQ, format_func=lambda i: labels[i]
        )
    return traces_a, traces_b, probe, step_a, step_b


st.title("Compare")
st.markdown(
    "**A** is the sidebar's run. **B** is the same model on another input, another model on the same input, "
    "the same model with a mask bug injected, with heads switched off, or the same zoo model at another step "
    "of its training. Both are shown side by side at the "
    "same kind, layer and head, with B − A below (positions compared index by index). With a run folder "
    "open (the sidebar's **Open a run**), A and B can be two of its watched steps."
)
open_run = watched.current()
modes = MODES + (MOVES_MODE,) + ((RUN_MODE,) if open_run is not None else ())
ui.keep_valid(K.CMP_MODE, list(modes), default=RUN_MODE if open_run is not None else None)
mode = st.radio("Compare A with", modes, key=K.CMP_MODE, horizontal=True)
ok = bad = None
out_a = out_b = None
b_what: object = None  # what B is (input, model, bug, heads off): a new B re-picks the head shown
if mode == RUN_MODE and open_run is not None:
    try:
        traces_a, traces_b, seq, step_a, step_b = _run_steps(open_run)
    except RunFormatError as exc:
        st.error(files.error_sentence(f"Cannot read the run {open_run.label}", exc))
        st.stop()
    tr_a, tr_b = traces_a[seq], traces_b[min(seq, len(traces_b) - 1)]
    where = f"probe input {seq}" if len(traces_a) > 1 else "probe input"
    label_a, label_b = f"A: {open_run.label} at step {step_a:,}", f"B: step {step_b:,}"
    b_what = (open_run.path, step_a, step_b)
    ca, cb = st.columns(2)
    ca.markdown(f"**{label_a}**")
    cb.markdown(f"**{label_b}**")
elif mode == MOVES_MODE:
    traces_a = state.traces()
    if not any(t.value_norms(k) is not None for t in traces_a[:1] for k in t.kinds):
        st.info(
            "This trace holds no value vectors, so what its weights move is not known: traces of attnscope's "
            "own models and MiniLM carry them (see the Attention page's toggle)."
        )
        st.stop()
    traces_b = [_what_moves(t) for t in traces_a]
    seq = state.sequence_picker(K.CMP_SEQ, traces_a) if len(traces_a) > 1 else 0
    tr_a, tr_b = traces_a[seq], traces_b[seq]
    where = words.where(traces_a, seq)
    label_a, label_b = "A: the weights α", "B: what moves, ‖α·f(x)‖ (each row scaled to sum 1)"
    b_what = MOVES_MODE
    ca, cb = st.columns(2)
    ca.markdown(f"**{label_a}**")
    cb.markdown(f"**{label_b}**")
    st.caption(
        "The same head twice: how much each query looks at each key (A), and how much of each key's value "
        "vector actually reaches the query (B). A key with a large weight and a short value vector (often "
        "a special token or punctuation) is strong in A and faint in B. The difference per head is how far "
        "apart the two rows are (total variation)."
    )
else:
    traces = state.traces()
    sel = state.current()
    lm = state.model("Compare")
    if mode in MODES[2:] and not lm.injectable:
        st.warning(words.not_injectable_message(lm))
        st.stop()

    name_b = sel.name
    try:
        if mode == "another input":
            if st.session_state.get(K.CMP_B_FOR_MODEL) != lm.name:
                ex = loaders.examples(lm, 3)
                st.session_state[K.CMP_SOURCE_B] = ex[1] if len(ex) > 1 else ex[0]
                st.session_state[K.CMP_TARGET_B] = sel.targets[0] if sel.targets else ""
                st.session_state[K.CMP_B_FOR_MODEL] = lm.name
            c1, c2 = st.columns(2)
            src_b = c1.text_input("Input B", key=K.CMP_SOURCE_B)
            tgt_b = None
            if sel.targets is not None:
                tgt_b = c2.text_input("Target B (teacher forcing)", key=K.CMP_TARGET_B)
            if not src_b.strip() or (tgt_b is not None and not tgt_b.strip()):
                st.warning("Input B is empty: type a text (and a target) for B.")
                st.stop()
            traces_a = traces
            traces_b = loaders.compute_traces(
                sel.key.but(sources=(src_b,), targets=None if tgt_b is None else (tgt_b,))
            )
            b_what = (src_b, tgt_b)
        elif mode == "another model":
            others = [m for m in loaders.model_choices() if m != sel.name]
            if not others:
                st.info("Only one model is available: there is no other model to compare with.")
                st.stop()
            ui.keep_valid(K.CMP_MODEL_B, others)
            name_b = st.selectbox("Model B", others, key=K.CMP_MODEL_B, format_func=loaders.picker_label)
            version_b = loaders.model_version(name_b)
            loaders.load_model(name_b, sel.device, version_b)
            traces_a = traces
            traces_b = loaders.compute_traces(sel.key.but(name=name_b, version=version_b))
            b_what = name_b
        elif mode == "another training step":
            base, step_a = registry.split_snapshot(sel.name)
            snaps = registry.snapshots(base) if base in registry.zoo_names() else []
            if not snaps:
                st.info(
                    f"{loaders.display_name(sel.name)} has no training snapshots: pick a zoo model "
                    "(or NAME@STEP) in the sidebar to compare two steps of its training."
                )
                st.stop()
            steps = [s["step"] for s in snaps]
            step_a = steps[-1] if step_a is None else step_a
            others = [s for s in steps if s != step_a] or steps
            ui.keep_valid(K.CMP_STEP_B, others, default=others[len(others) // 2])
            step_b = st.select_slider(
                f"Step B (A is step {step_a:,})", others, key=K.CMP_STEP_B, format_func=lambda s: f"{s:,}"
            )
            name_b = f"{base}@{step_b}"
            version_b = loaders.model_version(name_b)
            traces_a = traces
            traces_b = loaders.compute_traces(sel.key.but(name=name_b, version=version_b))
            b_what = name_b
        elif mode == "a mask bug":
            names = [n for n in bugs.names() if lm.has_decoder or not bugs.get(n).needs_decoder]
            ui.keep_valid(K.CMP_BUG, names)
            bug_name = st.selectbox("Mask bug in B", names, key=K.CMP_BUG, format_func=words.bug_title)
            st.caption(words.BUG_HELP[bug_name][3] + " (The Mask lab page explains each bug.)")
            key_b = sel.key.but(bug=bug_name)
            ok, bad = runs.audit_report(sel.key), runs.audit_report(key_b)
            out_a, out_b = runs.outputs(sel.key, ok), runs.outputs(key_b, bad)
            traces_a, traces_b = ok.traces, bad.traces
            b_what = bug_name
        else:
            options = runs.head_options(lm)
            off = st.multiselect(
                "Heads to switch off in B",
                options,
                key=K.CMP_OFF,
                format_func=runs.head_label,
                placeholder="pick heads (kind · layer · head)",
                help="A switched-off head still computes its attention, but its output is multiplied by 0.",
            )
            off_t = tuple(sorted((str(k), int(ly), int(h)) for k, ly, h in off))
            key_b = sel.key.but(off=off_t)
            ok, bad = runs.audit_report(sel.key), runs.audit_report(key_b)
            out_a, out_b = runs.outputs(sel.key, ok), runs.outputs(key_b, bad)
            traces_a, traces_b = ok.traces, bad.traces
            b_what = off_t
            if not off_t:
                st.info("No head is switched off yet: B equals A. Pick heads above.")
    except (InputError, ValueError) as exc:
        who = (
            f"Model B ({loaders.display_name(name_b)}) cannot read this input"
            if mode == MODES[1]
            else "B cannot run"
        )
        st.error(
            f"{who}: " + files.sentence(str(exc)) + (" Pick another model B." if mode == MODES[1] else "")
        )
        st.stop()
    except (ModelLoadError, OSError, RuntimeError) as exc:
        st.error(f"Cannot load model {loaders.display_name(name_b)!r}: {exc}")
        st.stop()

    # -- A and B: sequences, outputs, audits --------------------------------------------------------------
    seq = state.sequence_picker(K.CMP_SEQ, traces_a) if len(traces_a) > 1 else 0
    tr_a = traces_a[seq]
    tr_b = traces_b[min(seq, len(traces_b) - 1)]
    where = words.where(traces_a, seq)
    label_a = f"A: {loaders.display_name(sel.name)}"
    label_b = {
        "another input": "B: input B",
        "another model": f"B: {loaders.display_name(name_b)}",
        "a mask bug": f"B: with {st.session_state.get(K.CMP_BUG)}",
        "heads switched off": "B: heads off",
        "another training step": f"B: {name_b}",
    }[mode]
    ca, cb = st.columns(2)
    ca.markdown(f"**{label_a}**")
    cb.markdown(f"**{label_b}**")
    ca.text(f"Output: {out_a[seq] if out_a else tr_a.output_text}")
    cb.text(f"Output: {out_b[seq] if out_b else tr_b.output_text}")
    if ok is not None and bad is not None:
        _audit_lines(ca, cb, ok, bad)

kinds = [k for k in tr_a.kinds if k in tr_b.kinds]
if not kinds:
    st.warning("A and B have no attention kind in common (e.g. an encoder-only and a decoder-only model).")
    st.stop()
ui.keep_valid(K.CMP_KIND, kinds)
kind = st.radio("Attention kind", kinds, key=K.CMP_KIND, format_func=KIND_LABELS.get, horizontal=True)
pa, pb = tr_a.probs(kind), tr_b.probs(kind)
same_shape = pa.shape[:2] == pb.shape[:2]
figs = {}
if same_shape:
    per_head = A.head_difference(tr_a, tr_b, kind)
    figs["difference per head"] = P.stat_heatmap(
        per_head,
        title=f"{KIND_LABELS[kind]}: how much each head changed from A to B (mean total variation, "
        f"0 = same, 1 = disjoint) · {where}; click a cell",
        stat="score",
        label="mean TV distance",
    )
    event = ui.chart(figs["difference per head"], key=K.CMP_CHART, on_select="rerun", selection_mode="points")
    # A new B (or kind): show the head that changed most; a click on the heatmap picks another.
    b_key = (mode, kind, seq, b_what, float(per_head.sum()))
    if st.session_state.get(K.CMP_AUTO_FOR) != b_key and np.isfinite(per_head).any() and per_head.max() > 0:
        st.session_state[K.CMP_AUTO_FOR] = b_key
        top = np.unravel_index(int(np.nanargmax(per_head)), per_head.shape)
        st.session_state[K.CMP_LAYER], st.session_state[K.CMP_HEAD] = int(top[0]), int(top[1])
    ui.apply_click(event, K.CMP_CLICK_APPLIED, (mode, kind), K.CMP_LAYER, K.CMP_HEAD, P.parse_head_point)
else:
    st.info(
        f"A has {pa.shape[0]} layers × {pa.shape[1]} heads of {KIND_LABELS[kind]}, B has {pb.shape[0]} × "
        f"{pb.shape[1]}: the maps are shown side by side but cannot be subtracted."
    )
n_layers, n_heads = pa.shape[:2]
layer, head = ui.layer_head_picker(K.CMP_LAYER, K.CMP_HEAD, n_layers, n_heads)
q_title, k_title = AXIS_TITLES[kind]
layer_b, head_b = min(layer, pb.shape[0] - 1), min(head, pb.shape[1] - 1)


def _head_fig(tr: AttentionTrace, name: str, ly: int, h: int):
    q_tok, k_tok = tr.axes(kind)
    fig = PT.head_heatmap(
        tr.probs(kind)[ly, h], q_tok, k_tok, mask=tr.mask(kind, ly), query_title=q_title, key_title=k_title,
        title=f"{name}<br>{KIND_LABELS[kind]} · layer {ly} · head {h} · {where}",
    )  # fmt: skip
    return ui.side_by_side(fig, len(k_tok))


figs["A"] = _head_fig(tr_a, label_a, layer, head)
figs["B"] = _head_fig(tr_b, label_b, layer_b, head_b)
c1, c2 = st.columns(2)
with c1:
    ui.chart(figs["A"], key="cmp_a")
with c2:
    ui.chart(figs["B"], key="cmp_b")
if same_shape:
    diff = A.trace_difference(tr_a, tr_b, kind, layer, head)
    qa, ka = tr_a.axes(kind)
    qb, kb = tr_b.axes(kind)
    nq, nk = diff.shape
    cut = " (common positions only)" if (len(qa), len(ka)) != (len(qb), len(kb)) else ""
    figs["B - A"] = P.difference_figure(
        np.nan_to_num(diff, nan=0.0),
        _pair_labels(qa, qb)[:nq],
        _pair_labels(ka, kb)[:nk],
        query_title=q_title,
        key_title=k_title,
        title=f"B − A: {KIND_LABELS[kind]} · layer {layer} · head {head} · {where}{cut}",
    )
    ui.chart(figs["B - A"], key="cmp_diff")
    st.caption(
        "Red: B gives this (query, key) more weight than A; blue: less. Where the tokens differ the axis "
        "shows 'A token→B token'."
    )
ui.downloads(tr_b, seq, figs, key="cmp_dl")
