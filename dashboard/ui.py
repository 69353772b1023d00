"""Small widgets several pages share: a chart with the standard config, download buttons."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from attnscope.core.traces.trace import AttentionTrace
from attnscope.dashboard.loaders import display_name
from attnscope.dashboard.plots.attention import head_name
from attnscope.dashboard.plots.common import figure_html

# Plotly's camera button saves a PNG; no logo; scroll zoom off so the page scrolls.
PLOTLY_CONFIG = {
    "displaylogo": False,
    "scrollZoom": False,
    "toImageButtonOptions": {"format": "png", "scale": 2},
}


def chart(fig: go.Figure, key: str, **kwargs):
    """st.plotly_chart with the dashboard's config; the figure is shown exactly as built."""
    return st.plotly_chart(fig, key=key, config=PLOTLY_CONFIG, theme=None, **kwargs)


def _stem(trace: AttentionTrace, seq: int) -> str:
    # Model names may be 'org/model' (Hugging Face cache) or 'folder (model.pt)': file-name safe.
    name = re.sub(r"[^\w.-]+", "_", display_name(trace.model)).strip("_") or "model"
    return f"{name}-seq{seq}"


def _figure_buttons(cols, figures: Mapping[str, go.Figure], stem: str, key: str) -> None:
    for col, (fname, fig) in zip(cols, figures.items(), strict=True):
        col.download_button(
            f"{fname} .html",
            data=lambda fig=fig: figure_html(fig),
            file_name=f"{stem}-{fname}.html",
            mime="text/html",
            key=f"{key}_fig_{fname.replace(' ', '_')}",
            on_click="ignore",
            help="Standalone HTML (plotly.js inlined, works offline). The chart's camera button saves a PNG.",
        )


def downloads(
    trace: AttentionTrace,
    seq: int,
    figures: Mapping[str, go.Figure],
    key: str,
    html_pages: Mapping[str, str] | None = None,
) -> None:
    """Buttons: the trace as .npz / .json, each figure as standalone HTML (built on click), and
    any ready-made HTML pages (name -> document)."""
    stem = _stem(trace, seq)
    html_pages = html_pages or {}
    with st.expander("Downloads", expanded=False):
        cols = st.columns(2 + len(figures) + len(html_pages))
        formats = (
            (
                "npz",
                trace.to_npz_bytes,
                "application/octet-stream",
                "AttentionTrace.to_npz_bytes (numpy, no pickle)",
            ),
            ("json", trace.to_json, "application/json", "AttentionTrace.to_json"),
        )  # each file is written on click
        for col, (ext, data, mime, help_) in zip(cols[:2], formats, strict=True):
            col.download_button(f"trace .{ext}", data=data, file_name=f"{stem}.{ext}", mime=mime,
                                key=f"{key}_{ext}", on_click="ignore", help=help_)  # fmt: skip
        _figure_buttons(cols[2 : 2 + len(figures)], figures, stem, key)
        for col, (name, doc) in zip(cols[2 + len(figures) :], html_pages.items(), strict=True):
            col.download_button(
                f"{name} .html",
                data=doc,
                file_name=f"{stem}-{name.replace(' ', '-')}.html",
                mime="text/html",
                key=f"{key}_page_{name.replace(' ', '_')}",
                on_click="ignore",
            )


def figure_downloads(
    figures: Mapping[str, go.Figure], stem: str, key: str, table: np.ndarray | None = None
) -> None:
    """Buttons for figures that do not come from a trace (and optionally a numeric table as CSV)."""
    with st.expander("Downloads", expanded=False):
        cols = st.columns(len(figures) + (table is not None))
        if table is not None:
            cols[0].download_button(
                "table .csv",
                data=lambda: "\n".join(",".join(f"{v:.7g}" for v in row) for row in table),
                file_name=f"{stem}.csv",
                mime="text/csv",
                key=f"{key}_csv",
                on_click="ignore",
            )
        _figure_buttons(cols[1:] if table is not None else cols, figures, stem, key)


def run_caption(trace: AttentionTrace) -> None:
    """The model's answer, the device and the time of the forward pass."""
    ms = trace.meta.get("forward_ms")
    timing = f" · forward pass {ms:.2f} ms" if isinstance(ms, int | float) else ""
    mode = ""
    if trace.meta.get("decoder_only"):  # GPT-2 style: prompt and continuation are one sequence
        mode = " · continuation: " + (
            "teacher forcing (given)" if trace.meta.get("teacher_forced") else "greedy (the model's own)"
        )
    elif trace.tgt_tokens:
        mode = " · decoder input: " + (
            "teacher forcing" if trace.meta.get("teacher_forced") else "greedy output"
        )
    st.caption(f"Model **{display_name(trace.model)}** on **{trace.device}**{timing}{mode}")
    if trace.output_text:
        st.text(f"Output: {trace.output_text}")


def keep_valid(key: str, options: list, default=None) -> None:
    """Reset a widget's stored value when it is not among the options (new model, new batch)."""
    if st.session_state.get(key) not in options:
        st.session_state[key] = options[0] if default is None or default not in options else default


def layer_head_picker(
    layer_key: str,
    head_key: str,
    n_layers: int,
    heads: int | list,
    default: tuple | None = None,
    columns: tuple | None = None,
) -> tuple:
    """The Layer and Head boxes every page that shows one head uses: their stored values are kept
    valid for this trace (``default`` (layer, head) where the old one no longer exists), heads are
    named as the grid names them. ``heads``: the number of heads, or the options (aggregates
    included). ``columns``: the two containers to put them in (default: two narrow columns)."""
    layers = list(range(n_layers))
    options = list(range(heads)) if isinstance(heads, int) else list(heads)
    keep_valid(layer_key, layers, None if default is None else default[0])
    keep_valid(head_key, options, None if default is None else default[1])
    c1, c2 = columns if columns is not None else st.columns([1, 1, 3])[:2]
    layer = c1.selectbox("Layer", layers, key=layer_key)
    head = c2.selectbox("Head", options, key=head_key, format_func=head_name)
    return layer, head


def apply_click(event, applied_key: str, tag, layer_key: str, head_key: str, parse) -> None:
    """Copy a clicked (layer, head) from a chart's selection into the selectors, once per click."""
    points = list(getattr(getattr(event, "selection", None), "points", None) or [])
    if not points:
        return
    picked = parse(points[0].get("x"), points[0].get("y"))
    if picked is not None and st.session_state.get(applied_key) != (tag, picked):
        st.session_state[applied_key] = (tag, picked)
        st.session_state[layer_key], st.session_state[head_key] = picked


def side_by_side(fig, n_keys: int):
    """A chart shown in half the page's width: room for a two-line title (``line 1<br>line 2``),
    key labels turned upright once there are more than a few columns."""
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 60
    fig.update_layout(margin=dict(t=top + 22))
    if n_keys > 6:
        fig.update_xaxes(tickangle=-90)
    return fig


def verdict_frame(verdicts, columns: list[str] | None = None):
    """The verdict table (plots.audit.verdict_table) with each status cell coloured; its height fits every row."""
    from attnscope.dashboard.plots.audit import STATUS_COLOR, STATUS_ICON, verdict_table

    df = verdict_table(verdicts)
    if columns is not None:
        df = df[columns]
    colours = {STATUS_ICON[k]: c for k, c in STATUS_COLOR.items()}
    styled = df.style.map(lambda v: f"background-color: {colours.get(v, 'white')}", subset=["status"])
    return styled, min(38 + 35 * len(df), 900)
