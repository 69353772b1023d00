"""Mask-audit figures: the verdict table and a correct-vs-buggy mask comparison.

Pure Plotly / pandas; verdicts come from ``attnscope.core.analysis.audit``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnscope.dashboard.plots.common import cell_gap, finish, indexed_labels, matrix_height, token_axis

# Plain symbols (no emoji): they render in every font, also in the table's canvas.
STATUS_ICON = {"pass": "✓ pass", "fail": "✗ fail", "skip": "– skip", "info": "ℹ info"}
STATUS_COLOR = {"pass": "#e3f4ea", "fail": "#fbe1e3", "skip": "#f1f1f1", "info": "#eef3fb"}
# Mask comparison categories: value -> (label, colour)
COMPARE = {
    0: ("masked in both", "#e9e9e9"),
    1: ("allowed in both", "#2a9d8f"),
    2: ("allowed, must be masked (leak)", "#e63946"),
    3: ("masked, must be allowed", "#f4a261"),
}
VERDICT_COLUMNS = ["status", "check", "kind", "layer", "head", "positions", "value", "detail"]


def verdict_table(verdicts: Sequence, icons: bool = True) -> pd.DataFrame:
    """One row per ``attnscope.core.analysis.audit.Verdict``: status, check, kind, layer, head, positions, value, detail."""
    rows = [
        {
            "status": STATUS_ICON.get(v.status, v.status) if icons else v.status,
            "check": v.name,
            "kind": v.kind or "",
            "layer": v.layer,
            "head": v.head,
            "positions": ", ".join(str(p) for p in v.positions),
            "value": v.value,
            "detail": v.detail,
        }
        for v in verdicts
    ]
    df = pd.DataFrame(rows, columns=VERDICT_COLUMNS)
    for col in ("layer", "head"):
        df[col] = df[col].astype("Int64")
    return df


def compare_codes(correct: np.ndarray, used: np.ndarray) -> np.ndarray:
    """(Q, K) int codes of ``COMPARE`` for the mask a model used against the correct one."""
    c, u = np.asarray(correct, bool), np.asarray(used, bool)
    codes = np.where(u & c, 1, 0)
    codes = np.where(u & ~c, 2, codes)
    return np.where(~u & c, 3, codes)


def mask_compare_figure(
    correct: np.ndarray,
    used: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    title: str,
    query_title: str = "query",
    key_title: str = "key",
) -> go.Figure:
    """The mask a (buggy) model used, cell by cell against the correct one: leaks red, over-masking orange."""
    codes = compare_codes(correct, used)
    nq, nk = codes.shape
    if (nq, nk) != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"mask is {nq}x{nk} but there are {len(query_tokens)}x{len(key_tokens)} tokens")
    n = len(COMPARE)
    scale = []
    for v, (_, colour) in COMPARE.items():
        scale += [[v / n, colour], [(v + 1) / n, colour]]
    # Categorical axes named "3 tok" carry the tokens for hover, and z is one uint8 array of codes:
    # no per-cell text (at 512 tokens that was 800,000 strings and seconds of work before a byte went out).
    ql, kl = indexed_labels(query_tokens), indexed_labels(key_tokens)
    legend = " · ".join(f"{v} = {label}" for v, (label, _) in COMPARE.items())
    fig = go.Figure(
        go.Heatmap(
            z=codes.astype(np.uint8), x=kl, y=ql, zmin=-0.5, zmax=n - 0.5, colorscale=scale, xgap=cell_gap(codes), ygap=cell_gap(codes),
            hovertemplate=f"{query_title} %{{y}}<br>{key_title} %{{x}}<br>state %{{z}} ({legend})<extra></extra>",
            showscale=False, name="mask",
        )
    )  # fmt: skip
    # A legend (one square per category) at the bottom instead of a colour bar: the matrix keeps
    # the width, which matters when two of these sit side by side.
    for label, colour in COMPARE.values():
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", name=label, showlegend=True, hoverinfo="skip",
                marker=dict(symbol="square", size=12, color=colour, line=dict(width=1, color="#bbbbbb")),
            )
        )  # fmt: skip
    fig.update_xaxes(**token_axis(key_tokens, key_title, rotate=True), type="category")
    fig.update_yaxes(**token_axis(query_tokens, query_title), type="category")
    fig.update_yaxes(range=[nq - 0.5, -0.5])
    fig.update_layout(
        margin=dict(l=90, r=20, t=60, b=170),
        legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", xanchor="left", x=0.0,
                    font=dict(size=11)),
    )  # fmt: skip
    return finish(fig, title, matrix_height(nq, min_px=340, extra=280))
