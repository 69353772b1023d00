"""The Training page on an open run folder (``attnscope.watch``): the probe's attention at every
watched step, the loss and metric curves, each head's entropy over training, the grid animated
through the steps, and the mask audit's first failure, followed live while the run is written.

The view is one ``st.fragment``: while the run was written to within ``watched.LIVE_WINDOW_S`` it
reruns every ``watched.REFRESH_S`` seconds on its own (the rest of the page stays), so new steps
appear without a reload; the step slider stays where the user put it, unless it was on the newest
step, in which case it moves on to the next newest. Once the run goes quiet, the whole page reruns
once and the timer stops.
"""

from __future__ import annotations

import time

import streamlit as st

from attnscope.core.errors import InputError, ModelLoadError
from attnscope.core.runs.runfile import Run, RunFormatError
from attnscope.core.traces.trace import KIND_LABELS, AttentionTrace
from attnscope.dashboard import files, ui, watched
from attnscope.dashboard import keys as K
from attnscope.dashboard.plots import attention as PA
from attnscope.dashboard.plots import training as P

INTRO = (
    "A run folder written by `attnscope.watch` while a model trained: at every watched step the model "
    "read the same probe inputs, and their attention was kept. Move the slider to see the grid at a "
    "step, or press **▶ Play** to watch it form; the curves show the loss and metrics the training loop "
    "logged, with the step marked."
)


def show(o: watched.OpenRun) -> None:
    """The run's view (live while the run is being written)."""
    st.markdown(INTRO)
    try:
        run = watched.open_run(o.path)
    except RunFormatError as exc:
        st.error(files.error_sentence(f"Cannot read the run {o.label}", exc))
        return
    live = watched.is_live(run)
    st.fragment(_view, run_every=watched.REFRESH_S if live else None)(o.path, live)


def _follow(path: str, steps: list[int]) -> None:
    """Put the step slider's value where it belongs before it is drawn: kept where the user put it,
    moved on to the newest step when it was on the newest, the newest when this run is new to the
    slider (unless a link named a step), the nearest step when its step was thinned away."""
    latest = steps[-1]
    seen = st.session_state.get(K.TRAIN_LATEST)
    cur = st.session_state.get(K.TRAIN_STEP)
    linked = K.TRAIN_STEP in (st.session_state.get(K.LINK_VALUES) or {})
    seen_latest = seen[1] if isinstance(seen, tuple) and seen[0] == path else None
    if seen_latest is None and not (linked and cur in steps):
        cur = latest  # this run is new to the slider
    elif not isinstance(cur, int):
        cur = latest
    elif cur not in steps:
        picked: int = cur
        cur = min(steps, key=lambda s: abs(s - picked))  # thinned away: the nearest step kept
    elif cur == seen_latest:
        cur = latest  # on the newest step: follow
    st.session_state[K.TRAIN_STEP] = cur
    st.session_state[K.TRAIN_LATEST] = (path, latest)


def _header(run: Run, steps: list[int], live: bool) -> None:
    h = run.header
    every = h.get("every")
    facts = [f"model **{h.get('model') or '?'}**"] + ([str(h["arch"])] if h.get("arch") else [])
    if every:
        facts.append(f"watched every {every:,} steps")
    facts.append(f"{len(steps)} watched steps kept" + (f" (latest {steps[-1]:,})" if steps else ""))
    st.caption(" · ".join(facts))
    since = watched.ago(time.time() - watched.last_write(run))
    if live:
        st.caption(
            f"**Live**: last written {since} ago; new steps appear here as they are written "
            f"(checked every {watched.REFRESH_S:g} s)."
        )
    else:
        st.caption(f"Last written {since} ago (not followed: reload the page if it starts again).")


def _audit_message(audits: dict[int, dict], every: object) -> int | None:
    """The mask audit's verdicts in words; returns the first step whose audit failed (None: none)."""
    if not audits:
        return None
    failed = [(s, a) for s, a in sorted(audits.items()) if not a["passed"]]
    if not failed:
        could_not = [a for a in audits.values() if a["lines"]]
        if could_not:
            st.warning(files.sentence(could_not[-1]["lines"][0]))
        else:
            how = f" (every {every:,} steps)" if isinstance(every, int) and every else ""
            st.success(f"The mask audit passed at all {len(audits)} audited steps{how}.")
        return None
    step, audit = failed[0]
    checks = ", ".join(f"`{c}`" for c in audit["failed"]) or "a check"
    lines = audit["lines"][:6]
    more = len(audit["lines"]) - len(lines)
    text = (
        f"The mask audit first failed at step {step:,}: {checks} "
        f"({len(failed)} of {len(audits)} audited steps failed; the last audit, at step "
        f"{max(audits):,}, {'failed' if not audits[max(audits)]['passed'] else 'passed'})."
    )
    if lines:
        text += "\n\n" + "\n".join(f"- `{ln}`" for ln in lines) + (f"\n- and {more} more" if more > 0 else "")
    st.error(text)
    return step


def _view(path: str, was_live: bool) -> None:
    try:
        run = watched.open_run(path)
        steps = run.steps()
        series = watched.series(run)
        audits, watch_error = watched.audits(run)
        diverged = watched.not_finite(run)
    except RunFormatError as exc:
        st.error(files.error_sentence("The run cannot be read", exc))
        return
    live = watched.is_live(run)
    if was_live and not live:
        st.rerun(scope="app")  # the run went quiet: the page again, without the timer
    st.subheader(run.name)
    _header(run, steps, live)
    failed_step = _audit_message(audits, run.header.get("audit_every"))
    if watch_error:
        st.warning(f"The watcher could not probe a step: {files.sentence(watch_error)}")
    if diverged:
        st.warning(
            "Not finite (NaN or infinite) at some steps, which the curves leave out: "
            + ", ".join(f"{name} first at step {step:,}" for name, step in diverged.items())
            + "."
        )
    if not steps:
        st.info("No watched step yet: the first appears once the training loop reaches a watched step.")
        _curves(run, series, None, failed_step)
        return
    try:
        _steps_view(run, path, steps, series, failed_step)
    except RunFormatError as exc:  # a step thinned or rewritten while it was read: the next refresh
        st.warning(files.error_sentence("A step could not be read", exc))


def _curves(run: Run, series: dict, step: int | None, failed_step: int | None) -> None:
    st.markdown("#### Loss and metrics")
    if not series:
        st.caption("The training loop logged no loss or metric (`w.step(step, loss=...)`).")
        return
    ui.chart(
        P.run_curves_figure(series, step, title=f"{run.name}: loss and metrics", failed_step=failed_step),
        key="run_curves",
    )
    hidden = P.series_order(list(series))[P.MAX_CURVES :]
    if hidden:
        st.caption(f"Not drawn ({P.MAX_CURVES} curves at most): {', '.join(hidden)}.")


def _pickers(run: Run, path: str, steps: list[int]) -> tuple[int, list[AttentionTrace], int, str]:
    """The probe input, the kind and the step: (step, the step's traces, probe index, kind)."""
    ref = list(watched.step_traces(path, steps[-1]))
    c1, c2, c3 = st.columns([2, 2, 3])
    probe = 0
    if len(ref) > 1:
        labels = watched.probe_labels(run, ref)
        ui.keep_valid(K.TRAIN_PROBE, list(range(len(ref))))
        probe = c1.selectbox(
            "Probe input",
            list(range(len(ref))),
            key=K.TRAIN_PROBE,
            format_func=lambda i: labels[i],
            help="The inputs the model read at every watched step (the probe given to attnscope.watch).",
        )
    kinds = list(ref[probe].kinds) if ref else []
    kind = ""
    if kinds:
        ui.keep_valid(K.TRAIN_KIND, kinds)
        kind = c2.radio(
            "Attention kind", kinds, key=K.TRAIN_KIND, format_func=KIND_LABELS.get, horizontal=True
        )
    _follow(path, steps)
    step = c3.select_slider(
        "Training step",
        options=steps,
        key=K.TRAIN_STEP,
        format_func=lambda s: f"{s:,}",
        help="Every step the run kept. On the newest step, the slider follows new steps as they come.",
    )
    traces = ref if step == steps[-1] else list(watched.step_traces(path, step))
    return step, traces, probe, kind


def _shape_warning(shaped: watched.Shaped) -> None:
    """Steps whose maps are shaped unlike the latest step's, named, and what the page does about them."""
    groups: dict[watched.Shape, list[int]] = {}
    for s, shape in shaped.odd.items():
        groups.setdefault(shape, []).append(s)
    parts = [f"{'step' if len(g) == 1 else 'steps'} {watched.steps_text(g)} ({watched.shape_text(shape)})"
             for shape, g in list(groups.items())[:3]]  # fmt: skip
    if len(groups) > 3:
        parts.append(f"{len(groups) - 3} other shapes")
    st.warning(
        f"Some watched steps are shaped unlike the latest ({watched.shape_text(shaped.latest)}): "
        + "; ".join(parts)
        + ". The model changed (a layer or head more or fewer), or the run was continued with another "
        f"probe, so the heads over training and the animation draw only the {len(shaped.kept)} "
        f"step{'s' * (len(shaped.kept) != 1)} shaped as the latest; the slider shows each step's own maps."
    )


def _steps_view(run: Run, path: str, steps: list[int], series: dict, failed_step: int | None) -> None:
    step, traces, probe, kind = _pickers(run, path, steps)
    if not kind:
        st.info(
            "This run keeps no probe traces (its steps hold weights only: a zoo run, or attnscope.watch "
            "with an empty probe), so there is no attention to draw; its curves are below."
        )
        _curves(run, series, step, failed_step)
        return
    shaped = watched.shaped_like_latest(path, steps, probe, kind)
    if shaped.odd:
        _shape_warning(shaped)
    m1, m2, m3 = st.columns(3)
    m1.metric("Step", f"{step:,}", help=f"of {len(steps)} watched steps, the newest {steps[-1]:,}")
    loss = dict(zip(*series["loss"], strict=True)).get(step) if "loss" in series else None
    m2.metric("Loss at this step", "—" if loss is None else f"{loss:.4g}")
    audits, _ = watched.audits(run)
    verdict = audits.get(step)
    m3.metric("Mask audit at this step", "—" if verdict is None else "pass" if verdict["passed"] else "FAIL")

    if probe < len(traces) and kind in traces[probe].kinds:
        _step_grid(step, traces[probe], kind)
    else:
        st.info(
            f"Step {step:,} holds no {KIND_LABELS[kind]} maps of probe input {probe} (it has "
            f"{watched.shape_text(shaped.odd.get(step, shaped.latest))}): pick another step or input."
        )
    _other_input(run, path, step, kind)
    _curves(run, series, step, failed_step)

    st.markdown("#### Heads over training")
    entropy = watched.entropy_over_steps(path, shaped.kept, probe, kind)
    ui.chart(
        P.head_lines_figure(
            shaped.kept,
            entropy,
            step,
            title=f"{KIND_LABELS[kind]}: entropy per head (nats; lower = sharper)",
            y_title="mean row entropy (nats)",
            log_steps=False,
            failed_step=failed_step,
        ),
        key="run_entropy",
    )
    _replay(path, shaped.kept, probe, kind, watched.step_traces(path, steps[-1])[probe])


def _step_grid(step: int, tr: AttentionTrace, kind: str) -> None:
    """The grid of every layer × head at ``step``."""
    q_tok, k_tok = tr.axes(kind)
    ui.chart(
        PA.grid_figure(
            tr.probs(kind),
            q_tok,
            k_tok,
            title=f"{KIND_LABELS[kind]} at step {step:,}: all layers × heads",
            mask=tr.layer_masks(kind) if tr.masks_differ(kind) else tr.mask(kind),
        ),
        key="run_grid",
    )
    if tr.meta.get("capture_notes"):
        st.warning(
            "Capture's notes on these maps (what it could not verify, left out, or drew from another row or step): "
            + "; ".join(map(str, tr.meta["capture_notes"][:4]))
        )


OTHER = "run_other_input"  # the text box of "Another input at this step"


def _other_input(run: Run, path: str, step: int, kind: str) -> None:
    """Any input through the model as it was at this step (weights kept, and an adapter to build it)."""
    with st.expander("Another input at this step", expanded=bool(st.session_state.get(OTHER))):
        why = watched.can_replay(run, step)
        if why is not None:
            st.caption(why)
            return
        text = st.text_input("Input", key=OTHER, placeholder="type a text for the model at this step")
        if not text.strip():
            return
        try:
            tr = watched.replay_input(path, step, text)
        except (InputError, ModelLoadError, RunFormatError) as exc:
            st.warning(files.error_sentence("This input cannot run at this step", exc))
            return
        kinds = list(tr.kinds)
        shown = kind if kind in kinds else kinds[0]
        q_tok, k_tok = tr.axes(shown)
        ui.chart(
            PA.grid_figure(tr.probs(shown), q_tok, k_tok, mask=tr.layer_masks(shown) if tr.masks_differ(shown) else tr.mask(shown),
                           title=f"{KIND_LABELS[shown]} of {text!r} at step {step:,} (weights kept in float16)"),
            key="run_other_grid",
        )  # fmt: skip
        if tr.output_text:
            st.caption(f"The model's output at this step: {tr.output_text!r}")


def _replay(path: str, steps: list[int], probe: int, kind: str, tr: AttentionTrace) -> None:
    st.markdown("#### Watch it form")
    n_layers, n_heads, nq, nk = tr.probs(kind).shape
    plan = P.replay_plan(steps, n_layers, n_heads, nq, nk, max_bytes=P.REPLAY_MAX_BYTES)
    fig = watched.replay_figure(path, plan, probe, kind)
    ui.chart(fig, key="run_replay")
    notes = []
    if plan.thinned:
        notes.append(
            f"it plays {len(plan.steps)} of the {len(steps)} steps, log-spaced (more early, where "
            "training changes most; the first and the newest always)"
        )
    if plan.pooled:
        notes.append(
            f"tiles show blocks of tokens (at most {plan.max_tile} a side), each cell the max of its block"
        )
    size = (
        f"{plan.total_bytes / 2**20:.1f} MB"
        if plan.total_bytes >= 2**19
        else f"{plan.total_bytes // 1024:,} kB"
    )
    if notes:
        st.caption(
            "Thinned to stay small to send (about "
            + size
            + f", under {P.REPLAY_MAX_BYTES / 2**20:.0f} MB): "
            + "; ".join(notes)
            + ". The slider above shows every step."
        )
    else:
        st.caption(
            f"Every watched step, played in your browser ({size}). Colours are weights in whole percent; "
            "hover a cell for its query and key."
        )
