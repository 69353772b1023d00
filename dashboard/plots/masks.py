"""Boolean mask figures: True = this query may attend to this key (SDPA's convention)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnscope.dashboard.plots.common import cell_gap, finish, matrix_height, token_axis, token_label

ALLOWED_COLOR = "#2a9d8f"  # True: may attend
MASKED_COLOR = "#e9e9e9"  # False: masked
MAX_MARKED = 40  # beyond this many rows/columns the ✕ marks would hide the colours
CONVENTION = "True (green, 1) = may attend / is a real token; False (grey, 0, ✕) = masked"


def _bool_heatmap(z: np.ndarray, hover: str, custom=None, x=None, y=None) -> go.Heatmap:
    return go.Heatmap(
        z=z.astype(np.uint8),  # one numeric array (base64, ~1.3 bytes a cell): 1 = True, 0 = False
        x=x,
        y=y,
        zmin=0,
        zmax=1,
        colorscale=[[0.0, MASKED_COLOR], [0.5, MASKED_COLOR], [0.5, ALLOWED_COLOR], [1.0, ALLOWED_COLOR]],
        colorbar=dict(
            tickvals=[0.25, 0.75], ticktext=["False: masked", "True: may attend"], thickness=12, len=0.5
        ),
        xgap=cell_gap(z),
        ygap=cell_gap(z),
        customdata=custom,
        hovertemplate=hover,
        name="mask",
    )


def _cross_marks(mask: np.ndarray, nrows: int, ncols: int, xs=None, ys=None) -> go.Scatter:
    """✕ on masked cells; ``xs``/``ys``: category labels of the columns/rows (else positions)."""
    qi, ki = np.nonzero(~mask)
    size = float(np.clip(420 / max(nrows, ncols), 4, 12))
    return go.Scatter(
        x=ki if xs is None else [xs[j] for j in ki],
        y=qi if ys is None else [ys[i] for i in qi],
        mode="markers",
        name="masked",
        hoverinfo="skip",
        showlegend=False,
        marker=dict(symbol="x-thin", size=size, line=dict(width=1.2, color="#888888")),
    )


def attention_mask_figure(
    mask: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    title: str,
    query_title: str,
    key_title: str,
) -> go.Figure:
    """``[Q, K]`` bool mask; rows = queries, columns = keys; masked cells also get a ✕.

    Categorical axes named "3 tok" (unique) carry the tokens for hover, and z is one uint8 array
    (1 = True = may attend): no per-cell text (~10 MB at 512 tokens before, ~0.4 MB now).
    """
    m = np.asarray(mask, dtype=bool)
    nq, nk = m.shape
    if (nq, nk) != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"mask is {nq}x{nk} but there are {len(query_tokens)}x{len(key_tokens)} tokens")
    ql = [f"{i} {token_label(t)}" for i, t in enumerate(query_tokens)]
    kl = [f"{j} {token_label(t)}" for j, t in enumerate(key_tokens)]
    hover = "query %{y}<br>key %{x}<br>mask %{z} (1 = True: may attend, 0 = False: masked)<extra></extra>"
    fig = go.Figure(_bool_heatmap(m, hover, x=kl, y=ql))
    if (~m).any() and max(nq, nk) <= MAX_MARKED:
        fig.add_trace(_cross_marks(m, nq, nk, xs=kl, ys=ql))
    fig.update_xaxes(**token_axis(key_tokens, key_title, rotate=True), type="category")
    fig.update_yaxes(**token_axis(query_tokens, query_title), type="category")
    fig.update_yaxes(range=[nq - 0.5, -0.5])
    fig.update_layout(margin=dict(l=90, r=20, t=60, b=90))
    return finish(fig, title, matrix_height(nq, min_px=300, extra=200))


def padding_mask_figure(
    mask: np.ndarray,
    tokens: Sequence[Sequence[str]],
    *,
    title: str,
    position_title: str,
) -> go.Figure:
    """``[batch, length]`` bool (True = real token, False = PAD); hover shows each cell's token."""
    m = np.asarray(mask, dtype=bool)
    b, n = m.shape
    custom = [
        [
            [f"sequence {r}", f"{j} {token_label(tokens[r][j])}", "real token" if m[r, j] else "PAD (masked)"]
            for j in range(n)
        ]
        for r in range(b)
    ]
    fig = go.Figure(
        _bool_heatmap(
            m,
            "%{customdata[0]}<br>position %{customdata[1]}<br>%{customdata[2]}<extra></extra>",
            custom=custom,
        )
    )
    if (~m).any() and n <= MAX_MARKED:
        fig.add_trace(_cross_marks(m, b, n))
    fig.update_traces(showscale=False, selector=dict(type="heatmap"))
    step = 1 if n <= 24 else 5 if n <= 120 else 10  # position numbers must not overlap
    fig.update_xaxes(
        title=dict(text=position_title),
        tickmode="array",
        tickvals=list(range(0, n, step)),
        ticktext=[str(j) for j in range(0, n, step)],
        range=[-0.5, n - 0.5],
        tickfont=dict(size=10),
        showgrid=False,
    )
    fig.update_yaxes(
        title=dict(text="sequence in the batch"),
        tickmode="array",
        tickvals=list(range(b)),
        ticktext=[f"seq {r}" for r in range(b)],
        range=[b - 0.5, -0.5],
        showgrid=False,
    )
    fig.update_layout(margin=dict(t=76))  # a title of two lines
    return finish(fig, title, int(min(640, 220 + 36 * b)))  # room for "sequence in the batch" at b = 1
