"""Positional-encoding figures: a table ``[position, dimension]`` in four views."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnscope.dashboard.plots.common import finish


def dim_name(d: int, sinusoidal: bool) -> str:
    """'dim 4 (sin, i=2)' for the paper's encoding, 'dim 4' for a learned table."""
    if not sinusoidal:
        return f"dim {d}"
    return f"dim {d} ({'sin' if d % 2 == 0 else 'cos'}, i={d // 2})"


def pe_curves(table: np.ndarray, dims: Sequence[int], *, title: str, sinusoidal: bool) -> go.Figure:
    """PE(pos, d) against position, one line per chosen dimension."""
    t = np.asarray(table, dtype=np.float32)
    pos = np.arange(t.shape[0])
    fig = go.Figure()
    for d in dims:
        fig.add_trace(
            go.Scatter(
                x=pos,
                y=t[:, d],
                mode="lines",
                name=dim_name(d, sinusoidal),
                hovertemplate=f"{dim_name(d, sinusoidal)}<br>position %{{x}}<br>value %{{y:.6f}}<extra></extra>",
            )
        )
    fig.update_xaxes(title=dict(text="position"))
    fig.update_yaxes(title=dict(text="PE(position, dimension)"))
    return finish(fig, title, 380)


def pe_heatmap(table: np.ndarray, *, title: str) -> go.Figure:
    """The table as a heatmap: positions on y (top to bottom), dimensions on x; 0 is white."""
    t = np.asarray(table, dtype=np.float32)
    # A robust range: a learned table's few outliers would otherwise wash everything out.
    lim = float(np.percentile(np.abs(t), 99.5)) or float(np.abs(t).max()) or 1.0
    clipped = bool(np.abs(t).max() > lim * 1.0001)
    fig = go.Figure(
        go.Heatmap(
            z=t,
            zmin=-lim,
            zmax=lim,
            colorscale="RdBu",
            reversescale=True,
            colorbar=dict(title=dict(text="value (clipped at 99.5%)" if clipped else "value")),
            hovertemplate="position %{y}<br>dimension %{x}<br>value %{z:.6f}<extra></extra>",
        )
    )
    fig.update_xaxes(title=dict(text="dimension"), showgrid=False)
    fig.update_yaxes(title=dict(text="position"), autorange="reversed", showgrid=False)
    return finish(fig, title, 460)


def similarity_figure(table: np.ndarray, *, title: str) -> go.Figure:
    """Dot product PE(p) . PE(q) for every pair of positions."""
    t = np.asarray(table, dtype=np.float32)
    sim = t @ t.T  # (P, P)
    lo, hi = (float(v) for v in np.percentile(sim, [0.5, 99.5]))
    if hi <= lo:
        lo, hi = float(sim.min()), float(sim.max())
    fig = go.Figure(
        go.Heatmap(
            z=sim,
            zmin=lo,
            zmax=hi,
            colorscale="Viridis",
            colorbar=dict(title=dict(text="dot product (0.5-99.5%)")),
            hovertemplate="position %{y} · position %{x}<br>dot product %{z:.4f}<extra></extra>",
        )
    )
    fig.update_xaxes(title=dict(text="position"), showgrid=False, scaleanchor="y", constrain="domain")
    fig.update_yaxes(title=dict(text="position"), autorange="reversed", showgrid=False, constrain="domain")
    return finish(fig, title, 480)


def wavelength_figure(wavelengths: np.ndarray, *, title: str, y_title: str, lines: bool = True) -> go.Figure:
    """Wavelength (or dominant period) of every dimension on a log axis."""
    w = np.asarray(wavelengths, dtype=np.float64)
    fig = go.Figure(
        go.Scatter(
            x=np.arange(len(w)),
            y=w,
            mode="markers+lines" if lines else "markers",
            name="wavelength",
            hovertemplate="dimension %{x}<br>%{y:.4g} positions<extra></extra>",
        )
    )
    fig.update_xaxes(title=dict(text="dimension"))
    fig.update_yaxes(title=dict(text=y_title), type="log", dtick=1)
    return finish(fig, title, 360)
