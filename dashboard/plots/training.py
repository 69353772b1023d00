"""Training replay figures: held-out curves, per-head statistics over training, and the attention
grid animated through the training snapshots (a Plotly play button, played in the browser).

Pure functions: data in, ``plotly.graph_objects.Figure`` out. Steps are drawn on a log axis (the
snapshots are log-spaced); step 0 sits at 1 on that axis and is labelled 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnscope.dashboard.plots.attention import grid_figure
from attnscope.dashboard.plots.common import MARK_COLOR, finish

CURRENT = "#d62728"  # the current step's marker line


def _x(steps: Sequence[int]) -> list[int]:
    return [max(int(s), 1) for s in steps]


def _step_axis(fig: go.Figure, steps: Sequence[int], **where) -> None:
    fig.update_xaxes(
        type="log",
        tickmode="array",
        tickvals=_x(steps),
        ticktext=[f"{s:,}" for s in steps],
        title_text="training step (log scale)",
        **where,
    )


def _mark_step(fig: go.Figure, step: int, **where) -> None:
    fig.add_vline(x=max(step, 1), line=dict(color=CURRENT, width=2, dash="dot"), **where)


def curves_figure(
    curve: Sequence[dict], steps: Sequence[int], step: int, metric: str, *, title: str
) -> go.Figure:
    """Held-out ``metric`` (top) and loss (bottom, train and held-out) against the training step,
    from history.json's "curve" points; a dotted line marks ``step``. ``steps``: the snapshot steps
    (the tick labels)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    xs = _x([p["step"] for p in curve])
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=[p["heldout"] for p in curve],
            mode="lines+markers",
            name=f"held-out {metric}",
            customdata=[p["step"] for p in curve],
            hovertemplate="step %{customdata:,}<br>" + f"held-out {metric}" + " %{y:.1%}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    for key, name in (("heldout_loss", "held-out loss"), ("train_loss", "training loss")):
        pts = [p for p in curve if isinstance(p.get(key), int | float)]
        fig.add_trace(
            go.Scatter(
                x=_x([p["step"] for p in pts]),
                y=[p[key] for p in pts],
                mode="lines+markers",
                name=name,
                customdata=[p["step"] for p in pts],
                hovertemplate="step %{customdata:,}<br>" + name + " %{y:.4f}<extra></extra>",
            ),
            row=2,
            col=1,
        )
    fig.update_yaxes(title_text=f"held-out {metric}", tickformat=".0%", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(title_text="loss (cross-entropy)", type="log", row=2, col=1)
    for row in (1, 2):
        _step_axis(fig, steps, row=row, col=1)
        _mark_step(fig, step, row=row, col=1)
    fig.update_xaxes(title_text=None, row=1, col=1)  # the shared axis is titled once, under the bottom plot
    fig.update_layout(legend=dict(orientation="h", y=-0.15), margin=dict(l=70, r=20, t=60, b=60))
    return finish(fig, title, 480)


def head_lines_figure(
    steps: Sequence[int],
    values: np.ndarray,
    step: int,
    *,
    title: str,
    y_title: str,
    percent: bool = False,
    marks: dict[tuple[int, int], str] | None = None,
) -> go.Figure:
    """One line per head: ``values`` ``[step, layer, head]`` against the snapshot steps, so the step
    where a head "clicks" shows as a jump. Heads in ``marks`` ((layer, head) -> note) are drawn
    dashed and named "(trained)"."""
    values = np.asarray(values, dtype=float)
    _, n_layers, n_heads = values.shape
    fig = go.Figure()
    marks = marks or {}
    fmt = ".1%" if percent else ".3f"
    for layer in range(n_layers):
        for head in range(n_heads):
            marked = (layer, head) in marks
            name = f"L{layer} H{head}" + (" (trained to look like this)" if marked else "")
            fig.add_trace(
                go.Scatter(
                    x=_x(steps),
                    y=values[:, layer, head],
                    mode="lines+markers",
                    name=name,
                    line=dict(dash="dash", color=MARK_COLOR) if marked else None,
                    customdata=list(steps),
                    hovertemplate=f"layer {layer} · head {head}<br>step "
                    + "%{customdata:,}<br>%{y:"
                    + fmt
                    + "}<extra></extra>",
                )
            )
    _step_axis(fig, steps)
    _mark_step(fig, step)
    fig.update_yaxes(title_text=y_title, tickformat=".0%" if percent else None)
    fig.update_layout(margin=dict(l=70, r=20, t=60, b=50))
    return finish(fig, title, 380)


def replay_figure(
    probs_by_step: Sequence[np.ndarray],
    steps: Sequence[int],
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    title: str,
    start: int = 0,
) -> go.Figure:
    """The attention grid (all layers x heads, ``[L, H, Q, K]`` per snapshot) as one animated
    figure: a frame per snapshot step, a slider and a play button that the browser plays without a
    server round trip. Shows snapshot ``start`` (an index) until played."""
    if not probs_by_step or len(probs_by_step) != len(steps):
        raise ValueError(f"{len(probs_by_step)} grids for {len(steps)} steps")
    grids = [grid_figure(p, query_tokens, key_tokens, title="") for p in probs_by_step]
    fig = grids[start]
    fig.frames = [
        go.Frame(data=[go.Heatmap(z=g.data[0].z)], traces=[0], name=str(s))
        for g, s in zip(grids, steps, strict=True)
    ]
    play = dict(
        frame=dict(duration=700, redraw=True), transition=dict(duration=0), fromcurrent=True, mode="immediate"
    )
    fig.update_layout(
        updatemenus=[
            dict(
                type="buttons",
                direction="left",
                x=0.0,
                y=-0.02,
                xanchor="left",
                yanchor="top",
                showactive=False,
                buttons=[
                    dict(label="▶ Play", method="animate", args=[None, play]),
                    dict(
                        label="❚❚ Pause",
                        method="animate",
                        args=[[None], dict(frame=dict(duration=0, redraw=False), mode="immediate")],
                    ),
                ],
            )
        ],
        sliders=[
            dict(
                active=start,
                x=0.18,
                y=-0.02,
                len=0.82,
                xanchor="left",
                yanchor="top",
                currentvalue=dict(prefix="step ", visible=True),
                steps=[
                    dict(
                        label=f"{s:,}",
                        method="animate",
                        args=[[str(s)], dict(frame=dict(duration=0, redraw=True), mode="immediate")],
                    )
                    for s in steps
                ],
            )
        ],
    )
    fig.update_layout(margin=dict(l=80, r=20, t=120, b=90))
    fig.layout.height = (fig.layout.height or 400) + 70
    return finish(fig, title, fig.layout.height)
