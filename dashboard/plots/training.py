"""Training replay figures: held-out curves, per-head statistics over training, and the attention
grid animated through the training snapshots (a Plotly play button, played in the browser); for a
run folder (``attnscope.watch``), its loss and metric curves and the choice of the animation's frames.

Pure functions: data in, ``plotly.graph_objects.Figure`` out. The zoo's steps are drawn on a log axis
(its snapshots are log-spaced; step 0 sits at 1 on that axis and is labelled 0); a run's on a linear
one (``log_steps=False``: it watched every N steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnscope.dashboard.plots.attention import GRID_MAX_TILE, grid_figure
from attnscope.dashboard.plots.common import MARK_COLOR, finish

CURRENT = "#d62728"  # the current step's marker line
FAILED = "#8b0000"  # the first failed audit's line
# The animation is one message to the browser: frames x layers x heads x queries x keys can pass
# Streamlit's server.maxMessageSize (and be slow to send long before that). replay_plan keeps a figure
# under REPLAY_MAX_BYTES by playing fewer steps (log-spaced) and, past that, coarser tiles.
REPLAY_MAX_BYTES = 5 * 2**20
MIN_FRAMES = 8  # thinning keeps at least this many steps (or all there are) before tiles get coarser
MAX_FRAMES = 48  # and at most this many (each frame is a grid to build: ~25 ms for a small model)
MIN_TILE = 4  # tiles are never coarser than this many cells a side
CURVE_POINTS = 4000  # points per curve; longer series are drawn every n-th step (the last one kept)
MAX_CURVES = 8  # subplots of one curves figure


def _x(steps: Sequence[int], log: bool = True) -> list[int]:
    return [max(int(s), 1) if log else int(s) for s in steps]


def _step_axis(fig: go.Figure, steps: Sequence[int], log: bool = True, **where) -> None:
    if not log:
        fig.update_xaxes(type="linear", title_text="training step", tickformat=",d", **where)
        return
    fig.update_xaxes(
        type="log",
        tickmode="array",
        tickvals=_x(steps),
        ticktext=[f"{s:,}" for s in steps],
        title_text="training step (log scale)",
        **where,
    )


def _mark_step(fig: go.Figure, step: int, log: bool = True, **where) -> None:
    fig.add_vline(x=max(step, 1) if log else step, line=dict(color=CURRENT, width=2, dash="dot"), **where)


def _mark_failed(fig: go.Figure, step: int, log: bool = True, **where) -> None:
    """A solid line at the first step whose mask audit failed, labelled."""
    fig.add_vline(
        x=max(step, 1) if log else step,
        line=dict(color=FAILED, width=2),
        annotation=dict(text=f"audit failed (step {step:,})", font=dict(color=FAILED, size=11)),
        annotation_position="top right",
        **where,
    )


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
    log_steps: bool = True,
    failed_step: int | None = None,
) -> go.Figure:
    """One line per head: ``values`` ``[step, layer, head]`` against the snapshot steps, so the step
    where a head "clicks" shows as a jump. Heads in ``marks`` ((layer, head) -> note) are drawn
    dashed and named "(trained)". ``log_steps``: a log step axis (the zoo's log-spaced snapshots),
    else linear (a run's steps); ``failed_step``: a solid line where the mask audit first failed."""
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
                    x=_x(steps, log_steps),
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
    _step_axis(fig, steps, log_steps)
    _mark_step(fig, step, log_steps)
    if failed_step is not None:
        _mark_failed(fig, failed_step, log_steps)
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
    max_tile: int = GRID_MAX_TILE,
) -> go.Figure:
    """The attention grid (all layers x heads, ``[L, H, Q, K]`` per snapshot) as one animated
    figure: a frame per snapshot step, a slider and a play button that the browser plays without a
    server round trip. Shows snapshot ``start`` (an index) until played. ``max_tile``: tiles with more
    queries or keys show blocks (grid_figure's; ``replay_plan`` picks it)."""
    if not probs_by_step or len(probs_by_step) != len(steps):
        raise ValueError(f"{len(probs_by_step)} grids for {len(steps)} steps")
    grids = [grid_figure(p, query_tokens, key_tokens, title="", max_tile=max_tile) for p in probs_by_step]
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


# -- runs (attnscope.watch) ------------------------------------------------------------------------


def series_order(names: Sequence[str]) -> list[str]:
    """Loss first, then the other scalars by name."""
    return sorted(names, key=lambda n: (n != "loss", n))


def _every_nth(xs: Sequence[int], ys: Sequence[float], limit: int) -> tuple[list[int], list[float]]:
    """At most about ``limit`` points: every n-th, the last one always kept."""
    if len(xs) <= limit:
        return list(xs), list(ys)
    n = math.ceil(len(xs) / limit)
    idx = list(range(0, len(xs), n))
    if idx[-1] != len(xs) - 1:
        idx.append(len(xs) - 1)
    return [xs[i] for i in idx], [ys[i] for i in idx]


def run_curves_figure(
    series: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    step: int | None,
    *,
    title: str,
    failed_step: int | None = None,
    max_curves: int = MAX_CURVES,
    max_points: int = CURVE_POINTS,
) -> go.Figure:
    """A run's scalars against the training step (``Run.series()``: name -> (steps, values)), one
    subplot each on a shared linear step axis, loss first, at most ``max_curves`` of them (the caller
    names the rest). A dotted line marks ``step``; a solid one ``failed_step``, the first step whose
    mask audit failed. Series longer than ``max_points`` are drawn every n-th point."""
    names = series_order([n for n, (xs, _) in series.items() if len(xs)])[:max_curves]
    rows = max(len(names), 1)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=min(0.08, 0.3 / rows))
    for row, name in enumerate(names, 1):
        xs, ys = _every_nth(*series[name], max_points)
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers" if len(xs) <= 60 else "lines",
                name=name,
                hovertemplate="step %{x:,}<br>" + name + " %{y:.4g}<extra></extra>",
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text=name, row=row, col=1)
    for row in range(1, rows + 1):
        _step_axis(fig, [], log=False, row=row, col=1)
        if row < rows:
            fig.update_xaxes(title_text=None, row=row, col=1)
        if step is not None:
            _mark_step(fig, step, log=False, row=row, col=1)
        if failed_step is not None:
            line = dict(color=FAILED, width=2)
            if row == 1:
                _mark_failed(fig, failed_step, log=False, row=row, col=1)
            else:
                fig.add_vline(x=failed_step, line=line, row=row, col=1)
    if not names:
        fig.add_annotation(text="no loss or metric logged yet", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")  # fmt: skip
    fig.update_layout(showlegend=False, margin=dict(l=70, r=20, t=60, b=50))
    return finish(fig, title, 120 + 170 * rows)


def log_spaced(steps: Sequence[int], n: int) -> list[int]:
    """``n`` of ``steps`` (sorted) spread evenly in log(1 + step): the first and the last always,
    more early (where training changes most) than late. All of them when there are no more than n."""
    steps = sorted(int(s) for s in steps)
    if n >= len(steps):
        return steps
    if n <= 1:
        return steps[-1:]
    x = np.log1p(np.asarray(steps, dtype=float))
    chosen: set[int] = set()
    for target in np.linspace(x[0], x[-1], n):
        for i in np.argsort(np.abs(x - target), kind="stable"):
            if int(i) not in chosen:
                chosen.add(int(i))
                break
    return [steps[i] for i in sorted(chosen)]


@dataclass(frozen=True)
class ReplayPlan:
    """What the animation of a run plays: ``steps`` (a log-spaced subset when ``thinned``), tiles of
    at most ``max_tile`` cells a side (``pooled``: coarser than the grid's own GRID_MAX_TILE, each cell
    the max of a block), and the estimated size of the figure."""

    steps: tuple[int, ...]
    max_tile: int
    thinned: bool
    pooled: bool
    frame_bytes: int
    total_bytes: int


def _blocks(n: int, tile: int) -> int:
    return max(1, math.ceil(n / tile))


def grid_bytes(n_layers: int, n_heads: int, n_queries: int, n_keys: int, max_tile: int) -> int:
    """Bytes one grid frame takes in the figure's JSON: its uint8 cells, base64-encoded (4/3), plus a
    frame's fixed overhead."""
    rows = n_layers * math.ceil(n_queries / _blocks(n_queries, max_tile))
    cols = n_heads * math.ceil(n_keys / _blocks(n_keys, max_tile))
    return math.ceil(rows * cols * 4 / 3) + 300


def _base_bytes(
    n_layers: int, n_heads: int, n_queries: int, n_keys: int, max_tile: int, n_frames: int
) -> int:
    """What the figure holds besides the frames: axis labels (one per grid row and column), tile
    separators, the slider's steps."""
    rows = n_layers * math.ceil(n_queries / _blocks(n_queries, max_tile))
    cols = n_heads * math.ceil(n_keys / _blocks(n_keys, max_tile))
    return 64 * (rows + cols) + 250 * (n_layers + n_heads) + 220 * n_frames + 20_000


def replay_plan(
    steps: Sequence[int],
    n_layers: int,
    n_heads: int,
    n_queries: int,
    n_keys: int,
    *,
    max_bytes: int = REPLAY_MAX_BYTES,
    min_frames: int = MIN_FRAMES,
    max_frames: int = MAX_FRAMES,
    max_tile: int = GRID_MAX_TILE,
) -> ReplayPlan:
    """Which steps the animation plays, and how coarse its tiles are, so that the figure stays under
    ``max_bytes``: every step at the grid's own resolution when they fit; else fewer steps, log-spaced
    (never fewer than ``min_frames`` before tiles get coarser); else coarser tiles (down to MIN_TILE);
    else fewer steps again (the first and the last at least). Never more than ``max_frames`` steps."""
    steps = sorted(int(s) for s in steps)
    if not steps:
        raise ValueError("no steps to play")

    def total(n: int, tile: int) -> int:
        return (n + 1) * grid_bytes(n_layers, n_heads, n_queries, n_keys, tile) + _base_bytes(
            n_layers, n_heads, n_queries, n_keys, tile, n
        )

    def most(tile: int) -> int:  # the most frames that fit at this tile size (total is linear in n)
        one, zero = total(1, tile) - total(0, tile), total(0, tile)
        return max(0, (max_bytes - zero) // max(one, 1))

    tile = max(int(max_tile), 1)
    n = min(len(steps), max_frames, max(most(tile), min(len(steps), max(min_frames, 2))))
    while total(n, tile) > max_bytes and tile > MIN_TILE:
        tile = max(MIN_TILE, tile * 3 // 4)
    n = max(min(n, most(tile)), min(2, len(steps)))
    chosen = log_spaced(steps, n)
    full = max(n_queries, n_keys) > tile and tile < max_tile
    return ReplayPlan(
        steps=tuple(chosen),
        max_tile=tile,
        thinned=len(chosen) < len(steps),
        pooled=full,
        frame_bytes=grid_bytes(n_layers, n_heads, n_queries, n_keys, tile),
        total_bytes=total(len(chosen), tile),
    )
