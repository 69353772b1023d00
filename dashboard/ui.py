"""Small widgets several pages share: a chart with the standard config, download buttons."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from core.trace import AttentionTrace
from dashboard.loaders import display_name
from dashboard.plots.common import figure_html

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
    name = display_name(trace.model).replace(" ", "_") or "model"
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


def downloads(trace: AttentionTrace, seq: int, figures: Mapping[str, go.Figure], key: str) -> None:
    """Buttons: the trace as .npz / .json and each figure as standalone HTML (built on click)."""
    stem = _stem(trace, seq)
    with st.expander("Downloads", expanded=False):
        cols = st.columns(2 + len(figures))
        cols[0].download_button(
            "trace .npz",
            data=trace.to_npz_bytes,
            file_name=f"{stem}.npz",
            mime="application/octet-stream",
            key=f"{key}_npz",
            on_click="ignore",
            help="AttentionTrace.to_npz_bytes (numpy, no pickle)",
        )
        cols[1].download_button(
            "trace .json",
            data=trace.to_json,
            file_name=f"{stem}.json",
            mime="application/json",
            key=f"{key}_json",
            on_click="ignore",
            help="AttentionTrace.to_json",
        )
        _figure_buttons(cols[2:], figures, stem, key)


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
    mode = "teacher forcing" if trace.meta.get("teacher_forced") else "greedy output"
    ms = trace.meta.get("forward_ms")
    timing = f" · forward pass {ms:.2f} ms" if isinstance(ms, int | float) else ""
    st.caption(f"Model **{display_name(trace.model)}** on **{trace.device}**{timing} · decoder input: {mode}")
    if trace.output_text:
        st.text(f"Output: {trace.output_text}")
