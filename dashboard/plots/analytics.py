"""Head-analytics figures: layer x head statistic heatmaps, rollout, attribution, alignment, diffs.

Pure Plotly (numpy in, ``go.Figure`` out); the numbers come from ``attnscope.core.analysis.analytics``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnscope.dashboard.plots.common import (
    MARK_COLOR,
    finish,
    indexed_labels,
    matrix_height,
    token_axis,
    token_label,
)

DIVERGING = "RdBu_r"
_HEAD_RE = re.compile(r"^head (\d+)$")
_LAYER_RE = re.compile(r"^layer (\d+)$")


def stat_heatmap(
    values: np.ndarray,
    *,
    title: str,
    stat: str = "score",
    label: str | None = None,
    marks: Mapping[tuple[int, int], str] | None = None,
) -> go.Figure:
    """(layers, heads) values as a heatmap: rows = layers (0 on top), columns = heads, value written in each cell.

    Categorical axes "layer l" / "head h" so a clicked point maps back with ``parse_head_point``.
    Scores in [0, 1] share one scale; ``monotonic`` and differences use a diverging scale around 0.
    ``marks`` ((layer, head) -> note): cells outlined, heads a training loss forced into a pattern.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"expected (layers, heads) values, got shape {v.shape}")
    n_layers, n_heads = v.shape
    xs, ys = [f"head {h}" for h in range(n_heads)], [f"layer {ly}" for ly in range(n_layers)]
    finite = v[np.isfinite(v)]
    if stat in ("monotonic", "diff"):
        bound = 1.0 if stat == "monotonic" else max(float(np.abs(finite).max()) if finite.size else 0.0, 1e-9)
        scale, zmin, zmax = DIVERGING, -bound, bound
    elif stat in ("entropy", "distance"):
        scale, zmin, zmax = "Viridis", 0.0, max(float(finite.max()) if finite.size else 0.0, 1e-9)
    else:
        scale, zmin, zmax = "Viridis", 0.0, 1.0
    text = [["NaN" if not np.isfinite(x) else f"{x:.2f}" for x in row] for row in v]
    fig = go.Figure(
        go.Heatmap(
            z=v, x=xs, y=ys, zmin=zmin, zmax=zmax, colorscale=scale, text=text, texttemplate="%{text}",
            customdata=[[[ly, h] for h in range(n_heads)] for ly in range(n_layers)],
            hovertemplate="%{y}, %{x}<br>" + (label or stat) + " = %{text}<extra></extra>",
            colorbar=dict(title=dict(text=label or stat), thickness=12), xgap=2, ygap=2,
        )
    )  # fmt: skip
    # Plotly cannot select heatmap cells: one invisible, selectable marker per cell carries the
    # click (Streamlit reports it as the chart's selection; parse_head_point reads its x, y).
    fig.add_trace(
        go.Scatter(
            x=[x for _ in ys for x in xs], y=[y for y in ys for _ in xs], mode="markers", name="cells",
            marker=dict(size=max(10, min(40, 400 // max(n_heads, n_layers))), opacity=0.0), showlegend=False,
            text=[t for row in text for t in row],
            hovertemplate="%{y}, %{x}<br>" + (label or stat) + " = %{text}<br>click to show this head<extra></extra>",
            selected=dict(marker=dict(opacity=0.0)), unselected=dict(marker=dict(opacity=0.0)),
        )
    )  # fmt: skip
    for (ly, h), _note in (marks or {}).items():
        if 0 <= ly < n_layers and 0 <= h < n_heads:
            fig.add_shape(
                type="rect", x0=h - 0.5, x1=h + 0.5, y0=ly - 0.5, y1=ly + 0.5,
                line=dict(color=MARK_COLOR, width=3), layer="above",
            )  # fmt: skip
    fig.update_yaxes(autorange="reversed", type="category", title=dict(text="layer"), showgrid=False)
    fig.update_xaxes(type="category", side="top", title=dict(text="head"), showgrid=False)
    fig.update_layout(clickmode="event+select", dragmode=False, margin=dict(l=80, r=20, t=110, b=20))
    return finish(fig, title, int(np.clip(60 * n_layers + 170, 260, 900)))


def parse_head_point(x: str, y: str) -> tuple[int, int] | None:
    """Clicked cell of ``stat_heatmap`` ("head h", "layer l") -> (layer, head)."""
    mx, my = _HEAD_RE.match(str(x)), _LAYER_RE.match(str(y))
    return (int(my.group(1)), int(mx.group(1))) if mx and my else None


def head_table(records: Sequence[dict], digits: int = 3) -> pd.DataFrame:
    """``attnscope.core.analysis.analytics.head_records`` rows as a sortable DataFrame (statistics rounded)."""
    df = pd.DataFrame(list(records))
    if df.empty:
        return df
    num = [c for c in df.columns if c not in ("kind", "layer", "head")]
    df[num] = df[num].astype(float).round(digits)
    return df


def matrix_figure(
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    title: str,
    query_title: str = "query",
    key_title: str = "key",
    diverging: bool = False,
    marks: np.ndarray | None = None,
    value_name: str = "weight",
) -> go.Figure:
    """A (Q, K) matrix over tokens (rollout, attribution, a difference); ``marks`` (Q,) circles one key per row.

    The axes are categories named "3 tok" (unique), so hover shows the tokens without per-cell data,
    and the values go out as one float32 array (at 512 tokens: one typed array instead of half a
    million strings, which took seconds to build and send)."""
    w = np.asarray(weights, dtype=np.float32)
    nq, nk = w.shape
    if (nq, nk) != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"matrix is {nq}x{nk} but there are {len(query_tokens)}x{len(key_tokens)} tokens")
    finite = w[np.isfinite(w)]
    if diverging:
        bound = float(np.abs(finite).max()) if finite.size else 0.0
        bound = bound if bound > 1e-9 else 1.0  # all zero: a plain white map on a readable scale
        scale, zmin, zmax = DIVERGING, -bound, bound
    else:
        scale, zmin, zmax = "Viridis", 0.0, max(float(finite.max()) if finite.size else 0.0, 1e-9)
    ql, kl = indexed_labels(query_tokens), indexed_labels(key_tokens)
    fig = go.Figure(
        go.Heatmap(
            z=w, x=kl, y=ql, zmin=zmin, zmax=zmax, colorscale=scale,
            hovertemplate=f"{query_title} %{{y}}<br>{key_title} %{{x}}<br>{value_name} %{{z:.4f}}<extra></extra>",
            colorbar=dict(title=dict(text=value_name), thickness=12),
        )
    )  # fmt: skip
    if marks is not None:
        rows = [i for i, k in enumerate(np.asarray(marks)) if 0 <= k < nk]
        fig.add_trace(
            go.Scatter(
                x=[kl[int(marks[i])] for i in rows], y=[ql[i] for i in rows], mode="markers", name="argmax",
                hoverinfo="skip", marker=dict(symbol="circle-open", size=12, line=dict(width=2, color="#e76f51")),
            )
        )  # fmt: skip
    fig.update_xaxes(**token_axis(key_tokens, key_title, rotate=True), type="category")
    fig.update_yaxes(**token_axis(query_tokens, query_title), type="category")
    fig.update_yaxes(range=[nq - 0.5, -0.5])
    fig.update_layout(margin=dict(l=90, r=20, t=60, b=90), showlegend=False)
    return finish(fig, title, matrix_height(nq, min_px=300, extra=200))


def rollout_figure(
    rollout: np.ndarray, tokens: Sequence[str], *, title: str = "Attention rollout"
) -> go.Figure:
    """Encoder rollout (S, S): row = output position, column = input token it draws on."""
    return matrix_figure(rollout, tokens, tokens, title=title, query_title="position", key_title="input token",
                         value_name="rollout")  # fmt: skip


def difference_figure(
    diff: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    title: str = "Difference (B - A)",
    query_title: str = "query",
    key_title: str = "key",
    value_name: str = "B - A",
) -> go.Figure:
    """A (Q, K) difference of two attention maps on a diverging scale centred on 0."""
    return matrix_figure(diff, query_tokens, key_tokens, title=title, diverging=True, value_name=value_name,
                         query_title=query_title, key_title=key_title)  # fmt: skip


def alignment_figure(
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    weights: np.ndarray,
    argmax: np.ndarray | None = None,
    *,
    title: str = "Cross-attention alignment",
    min_weight: float = 0.05,
    bins: int = 4,
) -> go.Figure:
    """Source tokens on top, target tokens below, a line for each (target, source) weight >= min_weight.

    weights (T, S); line width and opacity grow with the weight (``bins`` line traces); the
    argmax source of each target position (``argmax`` (T,), -1 = skip) is drawn as a bold line.
    """
    w = np.nan_to_num(np.asarray(weights, dtype=np.float64))
    nt, ns = w.shape
    if (nt, ns) != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(f"weights are {nt}x{ns} but there are {len(tgt_tokens)}x{len(src_tokens)} tokens")
    fig = go.Figure()
    edges = np.linspace(min_weight, 1.0 + 1e-9, bins + 1)
    for b in range(bins):
        xs: list = []
        ys: list = []
        for t, s in np.argwhere((w >= edges[b]) & (w < edges[b + 1])):
            xs += [int(s), int(t), None]
            ys += [1, 0, None]
        if xs:
            mid = (edges[b] + edges[b + 1]) / 2
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                     line=dict(width=1 + 5 * mid, color=f"rgba(38, 70, 83, {0.15 + 0.6 * mid:.2f})")))  # fmt: skip
    if argmax is not None:
        xs, ys = [], []
        for t, s in enumerate(np.asarray(argmax)):
            if s >= 0:
                xs += [int(s), t, None]
                ys += [1, 0, None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="argmax", hoverinfo="skip",
                                 line=dict(width=2.5, color="#e76f51")))  # fmt: skip
    for row, toks, name in ((1, src_tokens, "source"), (0, tgt_tokens, "target")):
        fig.add_trace(
            go.Scatter(
                x=list(range(len(toks))), y=[row] * len(toks), mode="markers+text", name=name,
                text=[token_label(t) for t in toks], textposition="top center" if row else "bottom center",
                marker=dict(size=9, color="#2a9d8f" if row else "#264653"),
                hovertemplate=f"{name} %{{x}}: %{{text}}<extra></extra>", showlegend=False,
            )
        )  # fmt: skip
    fig.update_yaxes(
        range=[-0.4, 1.4], tickvals=[0, 1], ticktext=["target", "source"], showgrid=False, zeroline=False,
        title=dict(text="sequence"),
    )  # fmt: skip
    fig.update_xaxes(
        range=[-0.8, max(nt, ns) - 0.2], showgrid=False, zeroline=False, showticklabels=False,
        title=dict(text=f"token position (lines: cross-attention weight ≥ {min_weight:.2g}; orange: argmax source)"),
    )  # fmt: skip
    return finish(fig, title, 300)


SINK_COLUMNS = {"sink weight": "share of weight on sinks", "sink moves": "share of what moves from sinks"}


def sink_table(records: Sequence[dict], digits: int = 3) -> pd.DataFrame:
    """``attnscope.core.analysis.analytics.sink_records`` rows as a DataFrame, highest weight share first
    (shares rounded; "parked" a bool column)."""
    df = pd.DataFrame(list(records))
    if df.empty:
        return df
    df = df.sort_values("sink weight", ascending=False, kind="stable").reset_index(drop=True)
    for col in SINK_COLUMNS:
        df[col] = df[col].astype(float).round(digits)
    return df[["kind", "layer", "head", "sink weight", "sink moves", "parked", "main sink"]]
