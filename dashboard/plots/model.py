"""Model summary figures."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from attnscope.dashboard.plots.common import finish


def params_figure(counts: Mapping[str, int], *, title: str) -> go.Figure:
    """Horizontal bar chart: parameters per top-level module (largest on top)."""
    items = sorted(counts.items(), key=lambda kv: kv[1])
    total = sum(counts.values()) or 1
    fig = go.Figure(
        go.Bar(
            x=[v for _, v in items],
            y=[k for k, _ in items],
            orientation="h",
            text=[f"{v:,} ({100 * v / total:.1f}%)" for _, v in items],
            textposition="auto",
            hovertemplate="%{y}<br>%{x:,} parameters<extra></extra>",
        )
    )
    fig.update_xaxes(title=dict(text="parameters"))
    fig.update_yaxes(title=dict(text="module", standoff=12), type="category", automargin=True)
    fig.update_layout(margin=dict(l=130))
    return finish(fig, title, int(180 + 32 * len(items)))
