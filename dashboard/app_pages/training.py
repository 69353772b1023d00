"""Training: watch heads form. The open run folder (attnscope.watch; dashboard/run_view.py), else the
sidebar's input run through every training snapshot of a zoo model."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnscope.core.errors import InputError, ModelLoadError
from attnscope.core.traces.trace import KIND_LABELS
from attnscope.dashboard import keys as K
from attnscope.dashboard import loaders, marks, run_view, runs, state, ui, watched
from attnscope.dashboard.plots import attention as PA
from attnscope.dashboard.plots import training as P
from attnscope.models import attention_rules as R
from attnscope.models import registry
from attnscope.models import tasks as T

st.title("Training")


def _zoo_view() -> None:
    """The sidebar's input through every training snapshot of the sidebar's zoo model."""
    st.markdown(
        "Each zoo model kept about a dozen snapshots of its weights while it trained, at log-spaced steps "
        "(step 0 is the random start). Here the sidebar's input runs through every one of them: move the "
        "slider, or press **▶ Play** on the animated grid, to watch the attention pattern form; the curves show "
        "when the model started to get the held-out inputs right. Your own training: a run folder written by "
        "`attnscope.watch` opens here from the sidebar's **Open a run** box."
    )
    sel = state.current()
    if sel.trace:
        state.model("Training replay")  # says which model to load, and stops
    base = registry.split_snapshot(sel.name)[0]
    try:
        snaps = registry.snapshots(base) if base in registry.zoo_names() else []
    except ModelLoadError as exc:
        st.error(f"The training history of {base} cannot be read: {exc}")
        st.stop()
    if not snaps:
        with_snaps = [n for n in registry.zoo_names() if registry.history(n)]
        st.warning(
            f"{loaders.display_name(sel.name)} has no training snapshots: training replay needs a zoo model "
            + (
                f"({', '.join(with_snaps)}); pick one in the sidebar."
                if with_snaps
                else "trained by models/train.py."
            )
        )
        st.stop()

    lm = state.model("Training")
    problems = [*sel.problems, *(sel.target_problems if sel.targets is not None else ())]
    for problem in problems:  # the same checks as every page: fix the input first
        st.warning(problem)
    if problems:
        st.stop()
    meta = lm.meta
    task = meta.get("task", "")
    history = registry.history(base)
    source = sel.sources[0]
    if len(sel.sources) > 1:
        st.caption(f"The first of the {len(sel.sources)} inputs: {source!r}.")
    target = None
    if lm.has_decoder:
        if sel.targets is not None:
            target = sel.targets[0]
        else:
            try:
                target = T.get(task).answer(source) if task in T.TASKS else None
            except ValueError as exc:
                st.warning(f"{source!r} is not an input of the {task} task ({exc}); type one in the sidebar.")
                st.stop()
        if target is not None:
            st.caption(
                f"Decoder input at every step: the right answer {target!r} (teacher forcing), so that every "
                "snapshot's maps have the same queries. An early snapshot would write something else."
            )
    try:
        steps, traces = runs.replay(base, sel.device, loaders.model_version(base), source, target)
    except (InputError, ValueError, ModelLoadError) as exc:
        st.warning(f"The snapshots cannot run this input: {exc}")
        st.stop()

    kinds = list(traces[-1].kinds)
    rule_kind, rows = (None, [])
    if task in T.TASKS:
        try:
            rule_kind, rows = R.right_keys(task, source)
        except ValueError:
            rule_kind, rows = None, []
    ui.keep_valid(K.TRAIN_KIND, kinds, default=rule_kind if rule_kind in kinds else None)
    c1, c2 = st.columns([2, 3])
    kind = c1.radio("Attention kind", kinds, key=K.TRAIN_KIND, format_func=KIND_LABELS.get, horizontal=True)
    ui.keep_valid(K.TRAIN_STEP, list(steps), default=steps[-1])
    step = c2.select_slider(
        "Training step",
        options=list(steps),
        key=K.TRAIN_STEP,
        format_func=lambda s: f"{s:,}",
        help="The snapshots are log-spaced: many early (where most of the change happens), few late.",
    )
    i = steps.index(step)
    snap = snaps[i]
    metric = "accuracy" if not lm.has_decoder else "exact match"
    m1, m2, m3 = st.columns(3)
    m1.metric("Step", f"{step:,} of {history.get('steps', steps[-1]):,}")
    m2.metric(
        f"Held-out {metric}",
        f"{snap['heldout']:.1%}",
        help="On never-seen inputs (models/tasks.heldout_set).",
    )
    m3.metric("Output at this step", traces[i].output_text or "—")

    hinted = marks.hinted(meta, kind)
    tr = traces[i]
    q_tok, k_tok = tr.axes(kind)
    grid = PA.grid_figure(
        tr.probs(kind),
        q_tok,
        k_tok,
        title=f"{KIND_LABELS[kind]} at step {step:,}: all layers × heads",
        marks=hinted,
    )
    ui.chart(grid, key="train_grid")
    marks.caption(hinted)

    st.subheader("Held-out curves")
    ui.chart(
        P.curves_figure(history.get("curve", []), steps, step, metric, title=f"{base}: learning curves"),
        key="train_curves",
    )

    st.subheader("Heads over training")
    stacks = [t.probs(kind) for t in traces]
    entropy = np.stack([R.entropy(s) for s in stacks])
    ui.chart(
        P.head_lines_figure(
            steps,
            entropy,
            step,
            title=f"{KIND_LABELS[kind]}: entropy per head (nats; lower = sharper)",
            y_title="mean row entropy (nats)",
            marks=hinted,
        ),
        key="train_entropy",
    )
    if kind == rule_kind and any(r is not None for r in rows):
        right = np.stack([R.head_scores(s, rows) for s in stacks])
        ui.chart(
            P.head_lines_figure(
                steps,
                right,
                step,
                title=f"{KIND_LABELS[kind]}: the task's right attention per head",
                y_title="mass on the right keys",
                percent=True,
                marks=hinted,
            ),
            key="train_right",
        )
        st.caption(
            "Right attention: the share of each query row's weight that lands on the keys the task's rule names "
            f"(model card: {T.get(task).attention}) averaged over the rows the rule covers. A head that learns the "
            "rule climbs to near 100%; a uniform head sits at 1/(number of keys)."
        )
    elif rule_kind:
        st.caption(
            f"The {task} task's right-attention rule is about {KIND_LABELS[rule_kind].lower()}: pick it above."
        )

    st.subheader("Watch it form")
    ui.chart(
        P.replay_figure(
            stacks, steps, q_tok, k_tok, title=f"{KIND_LABELS[kind]} through training: press ▶ Play"
        ),
        key="train_replay",
    )
    st.caption(
        "The animation plays in your browser from the snapshots above. Colours are weights in whole percent; "
        "hover a cell for its query and key. The slider under it picks a step."
    )


open_run = watched.current()
if open_run is not None:
    run_view.show(open_run)
else:
    _zoo_view()
