"""Head analytics over a corpus: open a stats file written by ``attnscope stats`` (core/analysis/corpus.py) and
show what each head does over all its inputs: the mean per head ("over 10,000 inputs"), the spread
across inputs, and the inputs where a head behaves most atypically, each one click from its own trace.

Files come from an upload or a path inside the allowed folders (as models and traces do); Parquet is
read with pyarrow, nothing is unpickled, and a bad file gets one sentence.
"""

from __future__ import annotations

import json

import streamlit as st

from attnscope.core.analysis import corpus
from attnscope.core.analysis.analytics import STAT_LABELS
from attnscope.core.traces.trace import KIND_LABELS
from attnscope.dashboard import files, loaders, ui
from attnscope.dashboard import keys as K
from attnscope.dashboard.plots import analytics as P

LABELS = {**STAT_LABELS, **corpus.STAT_LABELS}


def _keep(frame, meta, name: str) -> None:
    st.session_state[K.HA_CORPUS] = {"frame": frame, "meta": meta, "name": name}
    st.session_state[K.HA_CORPUS_MSG] = (
        "success",
        f"Opened {name}: statistics over {meta['n_inputs']:,} inputs.",
    )


def _fail(what: str, exc: BaseException) -> None:
    st.session_state[K.HA_CORPUS_MSG] = ("error", files.error_sentence(f"Cannot open {what}", exc))


def _open_upload() -> None:
    f = st.session_state.get(K.HA_CORPUS_UPLOAD)
    if f is None:
        st.session_state[K.HA_CORPUS_MSG] = ("error", "Choose a .parquet stats file to upload first.")
        return
    try:
        _keep(*corpus.read(files.upload_bytes(f), f.name), f.name)
    except Exception as exc:  # a hostile file: one sentence, the app keeps running
        _fail(getattr(f, "name", "the file"), exc)


def _open_path() -> None:
    text = (st.session_state.get(K.HA_CORPUS_PATH) or "").strip().strip("'\"")
    try:
        real = files.resolve_allowed_file(text, (".parquet",), "a .parquet stats file")
        _keep(*corpus.read(real), real.name)
    except Exception as exc:
        _fail(text or "the file", exc)


def _close() -> None:
    st.session_state[K.HA_CORPUS] = None


def _trace_input(text: str) -> None:
    """A "Trace" button: put that input in the sidebar (and the file's model, when the server has it
    by name), so the page below shows that input's own statistics and maps."""
    opened_file = st.session_state.get(K.HA_CORPUS) or {}
    model = str(opened_file.get("meta", {}).get("model", ""))
    if loaders.is_named_model(model):
        st.session_state[K.MODEL] = model
        st.session_state[K.TEXT_FOR_MODEL] = model  # keep the text: the model's examples must not replace it
    st.session_state[K.BATCH] = False
    st.session_state[K.SOURCE] = text
    st.session_state[K.HA_C_PICKED] = text


def section() -> None:
    """The 'Corpus statistics' box and, with a file open, the corpus view."""
    o = st.session_state.get(K.HA_CORPUS)
    msg = st.session_state.pop(K.HA_CORPUS_MSG, None)
    with st.expander(
        "Corpus statistics: open a file from `attnscope stats`", expanded=o is None and msg is not None
    ):
        st.caption(
            "`python -m attnscope stats --model NAME --input-file lines.txt --out stats.parquet` (or under "
            "`torchrun --nproc_per_node=N`) measures every head over every line; open its file here."
        )
        st.file_uploader("Upload a stats file (.parquet)", type=["parquet"], key=K.HA_CORPUS_UPLOAD)
        st.button("Open stats file", key=K.HA_CORPUS_UPLOAD_BUTTON, on_click=_open_upload)
        st.text_input("or its path", key=K.HA_CORPUS_PATH, placeholder="~/runs/stats.parquet")
        st.button("Open path", key=K.HA_CORPUS_PATH_BUTTON, on_click=_open_path)
    if msg is not None:
        (st.error if msg[0] == "error" else st.success)(msg[1])
    if o is not None:
        _view(o["frame"], o["meta"], o["name"])


def _parked_line(frame) -> str:
    """The heads parked over the corpus (weight on sinks >= 0.5, what moves from them <= half that)."""
    if "sink_moves" not in set(frame["stat"]):
        return "Parked heads: not measured (this file has no value-weighted statistics)."
    heads = corpus.parked_heads(frame)
    rule = (
        f"mean share of weight on sinks ≥ {corpus.SINK_WEIGHT:g}, mean share of what moves from them "
        f"≤ {corpus.SINK_RATIO:g} × that"
    )
    if not heads:
        return f"Parked heads ({rule}): none."
    listed = ", ".join(
        f"{KIND_LABELS[r['kind']]} layer {r['layer']} head {r['head']} "
        f"({r['sink_weight']:.2f} / {r['sink_moves']:.2f})"
        for r in heads[:12]
    )
    more = f" and {len(heads) - 12} more" if len(heads) > 12 else ""
    return f"Parked heads ({rule}): {len(heads)}: {listed}{more}."


def _view(frame, meta: dict, name: str) -> None:
    n = int(meta.get("n_inputs", 0))
    st.subheader(f"Over {n:,} inputs")
    skipped = ", ".join(f"{v:,} {k}" for k, v in sorted((meta.get("skipped") or {}).items())) or "none"
    st.caption(
        f"`{name}`: model **{meta.get('model', '?')}**, input `{meta.get('input_file', '?')}` "
        f"({meta.get('n_lines', '?')} lines, {meta.get('world', 1)} process(es)); lines skipped: {skipped}."
    )
    st.button("Close the stats file", key=K.HA_CORPUS_CLOSE, on_click=_close)
    st.caption(_parked_line(frame))
    kinds = [k for k in KIND_LABELS if k in set(frame["kind"])]
    c1, c2 = st.columns([3, 2])
    ui.keep_valid(K.HA_C_KIND, kinds)
    kind = c1.radio("Attention kind", kinds, key=K.HA_C_KIND, format_func=KIND_LABELS.get, horizontal=True)
    stats = [s for s in corpus.STATS if s in set(frame[frame["kind"] == kind]["stat"])]
    ui.keep_valid(K.HA_C_STAT, stats)
    stat = c2.selectbox("Statistic", stats, key=K.HA_C_STAT, format_func=lambda s: LABELS.get(s, s))
    label = LABELS.get(stat, stat)
    mean = corpus.stat_matrix(frame, kind, stat, "mean")
    spread = corpus.stat_matrix(frame, kind, stat, "std")
    left, right = st.columns(2)
    with left:
        event = ui.chart(
            P.stat_heatmap(mean, title=f"{KIND_LABELS[kind]}: mean {label} over {n:,} inputs; click a cell",
                           stat=stat, label=f"mean {label}"),
            key=K.HA_C_CHART, on_select="rerun", selection_mode="points",
        )  # fmt: skip
    with right:
        ui.chart(
            P.stat_heatmap(spread, title=f"{KIND_LABELS[kind]}: spread of {label} across inputs (std)",
                           stat="distance", label="std across inputs"),
            key="ha_c_spread",
        )  # fmt: skip
    n_layers, n_heads = mean.shape
    ui.apply_click(event, K.HA_C_CLICK_APPLIED, (kind, stat), K.HA_C_LAYER, K.HA_C_HEAD, P.parse_head_point)
    ui.keep_valid(K.HA_C_LAYER, list(range(n_layers)))
    ui.keep_valid(K.HA_C_HEAD, list(range(n_heads)))
    s1, s2, _ = st.columns([1, 1, 3])
    layer = s1.selectbox("Layer", list(range(n_layers)), key=K.HA_C_LAYER)
    head = s2.selectbox("Head", list(range(n_heads)), key=K.HA_C_HEAD)
    row = frame[
        (frame["kind"] == kind)
        & (frame["stat"] == stat)
        & (frame["layer"] == layer)
        & (frame["head"] == head)
    ]
    if row.empty:
        st.info("No value for this head.")
        return
    r = row.iloc[0]
    st.markdown(
        f"**Layer {layer} · head {head}**: mean {r['mean']:.3f}, std {r['std']:.3f}, "
        f"min {r['min']:.3f}, max {r['max']:.3f} over {int(r['n']):,} inputs."
    )
    st.markdown("**The inputs where this head is most atypical** (Trace shows that input's own maps below)")
    ends = (("highest", json.loads(r["top_high"])), ("lowest", json.loads(r["top_low"])))
    for end, items in ends:
        for i, d in enumerate(items):
            c_end, c_val, c_text, c_btn = st.columns([1, 1, 6, 1], vertical_alignment="center")
            c_end.caption(f"{end} #{i + 1}")
            c_val.markdown(f"`{d['value']:.3f}`")
            c_text.text(f"line {d['line'] + 1}: {d.get('text', '')}")
            c_btn.button(
                "Trace", key=f"{K.HA_C_TRACE}_{end}_{i}", on_click=_trace_input, args=(d.get("text", ""),)
            )
    picked = st.session_state.get(K.HA_C_PICKED)
    if picked:
        st.caption(f"Traced below: {picked!r} (the sidebar's input).")
    st.divider()
