"""Figures for one greedy decoding step: what the new position attended to, and what came next."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnscope.dashboard.plots.attention import head_heatmap
from attnscope.dashboard.plots.common import (
    COLORSCALE,
    color_values,
    colorbar,
    finish,
    matrix_height,
    token_axis,
    token_label,
    token_labels,
    zrange,
)


def step_rows(weights: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """``[layer, head, K]`` -> (rows ``[L*(H+1)+1, K]``, row names).

    Per layer: one row per head, then that layer's head mean; last row: mean over all.
    """
    n_layers, n_heads, _ = weights.shape
    rows, names = [], []
    for layer in range(n_layers):
        for h in range(n_heads):
            rows.append(weights[layer, h])
            names.append(f"L{layer} H{h}")
        rows.append(weights[layer].mean(axis=0))
        names.append(f"L{layer} mean")
    rows.append(weights.mean(axis=(0, 1)))
    names.append("all mean")
    return np.stack(rows).astype(np.float32), names


def step_figure(
    weights: np.ndarray,
    key_tokens: Sequence[str],
    *,
    title: str,
    key_title: str,
    log: bool = False,
) -> go.Figure:
    """Attention of ONE query (the step's position) ``[layer, head, K]`` as rows per layer/head."""
    if weights.shape[-1] != len(key_tokens):
        raise ValueError(f"weights have {weights.shape[-1]} keys but there are {len(key_tokens)} tokens")
    z, names = step_rows(weights)
    kl = [f"{j} {token_label(t)}" for j, t in enumerate(key_tokens)]
    custom = [
        [[names[r], kl[j], f"{float(z[r, j]):.7g}"] for j in range(z.shape[1])] for r in range(z.shape[0])
    ]
    zmin, zmax = zrange(log)
    fig = go.Figure(
        go.Heatmap(
            z=color_values(z, log),
            zmin=zmin,
            zmax=zmax,
            colorscale=COLORSCALE,
            colorbar=colorbar(log),
            customdata=custom,
            name="attention",
            hovertemplate="%{customdata[0]}<br>key %{customdata[1]}<br>weight %{customdata[2]}<extra></extra>",
        )
    )
    fig.update_xaxes(**token_axis(key_tokens, key_title, rotate=True))
    fig.update_yaxes(
        title=dict(text="layer / head"),
        tickmode="array",
        tickvals=list(range(len(names))),
        ticktext=names,
        range=[len(names) - 0.5, -0.5],
        showgrid=False,
        tickfont=dict(size=10),
    )
    fig.update_layout(margin=dict(l=80, r=20, t=60, b=90))
    return finish(fig, title, matrix_height(len(names), min_px=260, per_row=16, extra=180))


def topk_figure(tokens: Sequence[str], probs: Sequence[float], *, title: str) -> go.Figure:
    """Bar chart of the k most likely next tokens (most likely first)."""
    labels = token_labels(tokens)
    # Unique category names even if two entries render alike.
    xs = [f"{i + 1}. {lab}" for i, lab in enumerate(labels)]
    fig = go.Figure(
        go.Bar(
            x=xs,
            y=[float(p) for p in probs],
            text=[f"{float(p):.3f}" for p in probs],
            textposition="auto",
            marker_color=["#440154"] + ["#21918c"] * (len(xs) - 1),
            hovertemplate="%{x}<br>probability %{y:.6f}<extra></extra>",
        )
    )
    fig.update_xaxes(
        title=dict(text="next token (rank. token)"), type="category", tickfont=dict(family="monospace")
    )
    fig.update_yaxes(title=dict(text="probability"), range=[0, 1])
    return finish(fig, title, 320)


def class_probs_figure(labels: Sequence[str], probs: Sequence[float], *, title: str) -> go.Figure:
    """Bar chart of a classifier's class probabilities."""
    fig = go.Figure(
        go.Bar(
            x=token_labels(labels),
            y=[float(p) for p in probs],
            text=[f"{float(p):.3f}" for p in probs],
            textposition="auto",
            hovertemplate="%{x}<br>probability %{y:.6f}<extra></extra>",
        )
    )
    fig.update_xaxes(title=dict(text="class"), type="category")
    fig.update_yaxes(title=dict(text="probability"), range=[0, 1])
    return finish(fig, title, 320)


def steps_overview(
    weights: np.ndarray,
    out_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    current: int,
    title: str,
    key_title: str,
    log: bool = False,
) -> go.Figure:
    """Every step at once: ``[steps, K]`` (row t = the query of step t+1, labelled with the token
    it wrote), the current step (0-based) outlined."""
    if weights.shape[0] != len(out_tokens):
        raise ValueError(f"{weights.shape[0]} rows but {len(out_tokens)} output tokens")
    fig = head_heatmap(
        weights,
        out_tokens,
        key_tokens,
        title=title,
        log=log,
        query_title="step (token it wrote)",
        key_title=key_title,
    )
    fig.add_shape(
        type="rect",
        x0=-0.5,
        x1=len(key_tokens) - 0.5,
        y0=current - 0.5,
        y1=current + 0.5,
        line=dict(color="#e4572e", width=3),
        name="current step",
    )
    return fig


def values_figure(values: Sequence[float], *, title: str) -> go.Figure:
    """Bar chart of a vector's leading values (an embedding's first dimensions)."""
    fig = go.Figure(
        go.Bar(
            x=[str(i) for i in range(len(values))],
            y=[float(v) for v in values],
            hovertemplate="dimension %{x}<br>value %{y:.6f}<extra></extra>",
        )
    )
    fig.update_xaxes(title=dict(text="dimension"), type="category")
    fig.update_yaxes(title=dict(text="value"))
    return finish(fig, title, 320)
