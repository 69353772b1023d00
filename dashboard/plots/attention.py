"""Attention figures: the layer x head grid (one heatmap trace) and one head's large heatmap.

Conventions: weights are ``[layer, head, query, key]`` (one sequence); rows = queries
(top to bottom), columns = keys (left to right); masks are bool, True = may attend.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from attnscope.dashboard.plots.common import (
    COLORSCALE,
    LOG_FLOOR,
    MARK_COLOR,
    MASKED_COLOR,
    color_values,
    colorbar,
    finish,
    grid_colorscale,
    mask_path,
    mask_rects,
    matrix_height,
    token_axis,
    token_label,
    zrange,
)

AGGREGATES = ("mean", "max")  # head-average and head-max per layer


def reduce_heads(probs: np.ndarray, how: str) -> np.ndarray:
    """``[layer, head, q, k]`` -> ``[layer, q, k]``: mean or max over heads."""
    if how == "mean":
        return probs.mean(axis=1)
    if how == "max":
        return probs.max(axis=1)
    raise ValueError(f"unknown head reduction {how!r}; use 'mean' or 'max'")


def head_weights(probs: np.ndarray, layer: int, head: int | str) -> np.ndarray:
    """``[q, k]`` weights of one head, or of the head-mean / head-max of a layer."""
    if isinstance(head, str):
        return reduce_heads(probs[layer : layer + 1], head)[0]
    return probs[layer, head]


def moves_shares(probs: np.ndarray, value_norms: np.ndarray) -> np.ndarray:
    """``[L, H, Q, K]`` rows of alpha_ij ||f_h(x_j)|| scaled to sum 1 (``AttentionTrace.moves(kind,
    normalize=True)``), float32, built in one array and divided in place: the what-moves grid costs one
    multiply over the maps (at 512 tokens ~10x less than allocating twice). Rows that move nothing stay
    0; a NaN row stays NaN (drawn white, as NaN weights are)."""
    m = np.multiply(probs, np.asarray(value_norms)[:, :, None, :], dtype=np.float32)
    total = m.sum(axis=-1, keepdims=True)
    np.divide(m, total, out=m, where=total > 0)
    return m


def head_moves(
    probs: np.ndarray, value_norms: np.ndarray, layer: int, head: int | str
) -> tuple[np.ndarray, np.ndarray]:
    """(share ``[q, k]``, raw ``[q, k]``) of what one head moves: raw = alpha_ij ||f_h(x_j)||, share =
    raw with each row scaled to sum 1 (rows that move nothing stay 0), float32 as
    ``AttentionTrace.moves``; for "mean"/"max" the head mean/max of the shares (and of the raws)."""
    if isinstance(head, str):
        pairs = [head_moves(probs, value_norms, layer, h) for h in range(probs.shape[1])]
        shares, raws = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
        return reduce_heads(shares[None], head)[0], reduce_heads(raws[None], head)[0]
    raw = (
        np.asarray(probs[layer, head], dtype=np.float32)
        * np.asarray(value_norms[layer, head], dtype=np.float32)[None, :]
    )
    total = raw.sum(axis=-1, keepdims=True)
    return np.divide(raw, total, out=np.zeros_like(raw), where=total > 0), raw


def head_name(head: int | str) -> str:
    return f"head {head}" if isinstance(head, int) else f"{head} of heads"


# -- grid ---------------------------------------------------------------------------

_X_RE = re.compile(r"^(?:head (\d+)|(mean|max) of heads) ·")
_Y_RE = re.compile(r"^layer (\d+) ·")


# The grid is an overview: exact numbers are in the one-head heatmap below it (hover, downloads).
GRID_LEVELS = 100  # weights sent as whole percent, uint8 0..100 (base64: ~1.33 bytes a cell, not ~5.3)
GRID_NAN = GRID_LEVELS + 1  # the z value of NaN weights: drawn white
SEPARATOR_PX = 2  # tiles abut; a white line this wide is drawn over each boundary (hover reads real cells)
GRID_MAX_TILE = 128  # beyond this many queries/keys a tile shows blocks (the max of each block)
MAX_MASK_MARKS = 5000  # one head's heatmap marks masked cells with an x up to this many, then greys them


def quantise(weights: np.ndarray, log: bool, levels: int = GRID_LEVELS) -> np.ndarray:
    """Weights in [0, 1] -> uint8 levels 0..levels (linear, or log10 from LOG_FLOOR to 1); NaN -> levels + 1."""
    w = np.asarray(weights, dtype=np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        if log:
            x = (np.log10(np.maximum(w, LOG_FLOOR)) - math.log10(LOG_FLOOR)) / -math.log10(LOG_FLOOR)
        else:
            x = w
        q = np.rint(np.clip(x, 0.0, 1.0) * levels)
    return np.where(np.isnan(w), levels + 1, q).astype(np.uint8)


def _blocks(n: int, max_n: int) -> int:
    """Cells per block so that n cells make at most max_n blocks."""
    return max(1, math.ceil(n / max_n))


def block_max(a: np.ndarray, bq: int, bk: int, fill: float = 0.0) -> np.ndarray:
    """Max over (bq x bk) blocks of the last two axes (the ends padded with ``fill``); NaN-safe."""
    if bq == bk == 1:
        return a
    *lead, nq, nk = a.shape
    mq, mk = math.ceil(nq / bq), math.ceil(nk / bk)
    if (mq * bq, mk * bk) == (nq, nk):
        padded = np.ascontiguousarray(a)  # no copy when the blocks tile the array
    else:
        padded = np.full((*lead, mq * bq, mk * bk), fill, dtype=a.dtype)
        padded[..., :nq, :nk] = a
    with np.errstate(invalid="ignore"):
        # Rows first: bq whole rows at a time (contiguous, vectorised), 1/bq of the data left for
        # the short key blocks (15x faster than reducing the innermost axis of size bk first).
        rows = np.fmax.reduce(padded.reshape(*lead, mq, bq, mk * bk), axis=-2)
        return np.fmax.reduce(rows.reshape(*lead, mq, mk, bk), axis=-1)


def _axis_labels(tokens: Sequence[str], what: str, block: int) -> list[str]:
    """'query 3 tok' per token, or 'queries 4–7 tokA … tokD' per block of ``block`` tokens."""
    toks = [token_label(t) for t in tokens]
    if block == 1:
        return [f"{what} {i} {t}" for i, t in enumerate(toks)]
    plural = {"query": "queries", "key": "keys"}[what]
    out = []
    for i0 in range(0, len(toks), block):
        i1 = min(i0 + block, len(toks)) - 1
        out.append(f"{plural} {i0}–{i1} {toks[i0]} … {toks[i1]}")
    return out


@dataclass(frozen=True)
class _Grid:
    """The grid's cells: tiles of ``nq`` x ``nk`` cells, row = layer, column = head then aggregate."""

    columns: list[int | str]
    n_layers: int
    nq: int
    nk: int
    z: np.ndarray  # (n_layers * nq, len(columns) * nk) uint8 weights (quantise)
    zm: np.ndarray | None  # same shape, 1 = masked; None when nothing is masked
    xs: list[str]  # one unique category name per column of cells
    ys: list[str]  # one per row of cells

    @property
    def n_rows(self) -> int:
        return self.n_layers * self.nq

    @property
    def n_cols(self) -> int:
        return len(self.columns) * self.nk

    def col_start(self, c: int) -> int:
        return c * self.nk

    def tick_x(self) -> list[str]:
        """The category at the centre of each column of tiles."""
        return [self.xs[self.col_start(c) + self.nk // 2] for c in range(len(self.columns))]

    def tick_y(self) -> list[str]:
        return [self.ys[layer * self.nq + self.nq // 2] for layer in range(self.n_layers)]


def masked_overlay(z: np.ndarray, x: Sequence[str], y: Sequence[str], name: str, **kw) -> go.Heatmap:
    """Grey where ``z`` is 1 (masked), transparent where 0: a uint8 trace (a quarter of a float32 one's
    JSON) over the weights; hover falls through to the weights underneath."""
    return go.Heatmap(
        z=z, x=x, y=y, zmin=0, zmax=1, colorscale=[[0, "rgba(0,0,0,0)"], [1, MASKED_COLOR]],
        showscale=False, hoverinfo="skip", name=name, **kw,
    )  # fmt: skip


def _grid_cells(probs, query_tokens, key_tokens, mask, log, aggregates, bq, bk) -> _Grid:
    """Every tile quantised and laid side by side, the masked overlay and the category names."""
    n_layers, n_heads = probs.shape[:2]
    columns: list[int | str] = list(range(n_heads)) + list(aggregates)
    per_head = block_max(probs, bq, bk)  # (L, H, Q', K'): every head in one pass over the maps
    tiles = [
        quantise(per_head[:, h] if isinstance(h, int) else block_max(reduce_heads(probs, h), bq, bk), log)
        for h in columns
    ]  # each (L, Q', K') uint8
    masked_tile = None  # (L or 1, Q', K'): one mask for every layer, or each layer's
    if mask is not None and not np.asarray(mask, dtype=bool).all():
        # 1 = masked; a block is masked when none of its cells may attend
        per_layer = np.asarray(mask, dtype=np.uint8).reshape(-1, *np.shape(mask)[-2:])
        masked_tile = (block_max(per_layer, bq, bk) == 0).astype(np.uint8)
    nq, nk = tiles[0].shape[1:]
    n_rows, n_cols = n_layers * nq, len(columns) * nk
    z = np.empty((n_rows, n_cols), dtype=np.uint8)
    zm = np.zeros((n_rows, n_cols), dtype=np.uint8) if masked_tile is not None else None
    for layer in range(n_layers):
        y0 = layer * nq
        for c in range(len(columns)):
            x0 = c * nk
            z[y0 : y0 + nq, x0 : x0 + nk] = tiles[c][layer]
            if zm is not None and masked_tile is not None:
                zm[y0 : y0 + nq, x0 : x0 + nk] = masked_tile[layer if len(masked_tile) > 1 else 0]
    klab = _axis_labels(key_tokens, "key", bk)
    qlab = _axis_labels(query_tokens, "query", bq)
    xs = [f"{head_name(head)} · {lab}" for head in columns for lab in klab]  # unique category names
    ys = [f"layer {layer} · {lab}" for layer in range(n_layers) for lab in qlab]
    return _Grid(columns, n_layers, nq, nk, z, zm, xs, ys)


def _grid_heatmaps(grid: _Grid, log: bool, blocks: bool, value_name: str = "weight") -> go.Figure:
    """The weights' heatmap (hover: query, key, weight) and, where something is masked, the grey
    overlay. ``value_name`` names what the cells hold (the weight, or the what-moves share)."""
    block_note = " (max of the block)" if blocks else ""
    nan_note = f"<br>({GRID_NAN} means NaN: drawn white)" if (grid.z == GRID_NAN).any() else ""
    value = (
        ("log colour level %{z} of 100 (1e-4 … 1)" if log else f"{value_name} ≈ %{{z}}%")
        + block_note
        + nan_note
        + "<br><i>exact numbers: click the tile</i>"
    )
    cb = colorbar(log, title=value_name)
    if log:
        exps = list(range(int(math.log10(LOG_FLOOR)), 1))
        cb.update(tickvals=[(e - math.log10(LOG_FLOOR)) * GRID_LEVELS / -math.log10(LOG_FLOOR) for e in exps])
    else:
        cb.update(tickvals=[0, 20, 40, 60, 80, 100], ticktext=["0", "0.2", "0.4", "0.6", "0.8", "1"])
    heat = go.Heatmap(
        z=grid.z,
        x=grid.xs,
        y=grid.ys,
        zmin=0,
        zmax=GRID_NAN,
        colorscale=grid_colorscale(GRID_LEVELS),
        colorbar=cb,
        name="attention",
        hovertemplate="%{y}<br>%{x}<br>" + value + "<extra></extra>",
    )
    fig = go.Figure(heat)
    if grid.zm is not None:
        fig.add_trace(masked_overlay(grid.zm, grid.xs, grid.ys, name="masked"))
    return fig


def _add_separators(fig: go.Figure, grid: _Grid) -> None:
    """White lines over the boundaries between tiles (twice as wide before the aggregate columns), in
    cell coordinates (category index): one path per width."""
    columns, nk = grid.columns, grid.nk
    wide = {
        c for c in range(1, len(columns)) if isinstance(columns[c], str) and isinstance(columns[c - 1], int)
    }
    for cs, width in (([c for c in range(1, len(columns)) if c not in wide], 1), (sorted(wide), 2)):
        if cs:
            path = " ".join(f"M{c * nk - 0.5},-0.5 L{c * nk - 0.5},{grid.n_rows - 0.5}" for c in cs)
            fig.add_shape(type="path", path=path, line=dict(color="white", width=SEPARATOR_PX * width),
                          layer="above")  # fmt: skip
    if grid.n_layers > 1:
        nq = grid.nq
        path = " ".join(
            f"M-0.5,{ly * nq - 0.5} L{grid.n_cols - 0.5},{ly * nq - 0.5}" for ly in range(1, grid.n_layers)
        )
        fig.add_shape(type="path", path=path, line=dict(color="white", width=SEPARATOR_PX), layer="above")


def _add_tile_markers(fig: go.Figure, grid: _Grid) -> None:
    """Plotly cannot select heatmap cells, so each tile gets one invisible, selectable marker at its
    centre; a click there is reported by Streamlit as the chart's selection. Elsewhere in the tile
    the heatmap's own hover (query, key, weight) shows."""
    xt, yt = grid.tick_x(), grid.tick_y()
    fig.add_trace(
        go.Scatter(
            x=[x for x in xt for _ in range(grid.n_layers)],
            y=[y for _ in xt for y in yt],
            mode="markers",
            marker=dict(size=12, opacity=0.0),
            name="tiles",
            showlegend=False,
            customdata=[[layer, head_name(h)] for h in grid.columns for layer in range(grid.n_layers)],
            hovertemplate="layer %{customdata[0]} · %{customdata[1]}<br>click to show it below<extra></extra>",
            selected=dict(marker=dict(opacity=0.0)),
            unselected=dict(marker=dict(opacity=0.0)),
        )
    )


def _grid_axes(fig: go.Figure, grid: _Grid) -> None:
    """Categorical axes labelled once per tile: heads on top, layers on the left."""
    fig.update_xaxes(
        title=dict(text="head (each tile: key tokens →)"),
        type="category",
        tickmode="array",
        tickvals=grid.tick_x(),
        ticktext=[head_name(h) for h in grid.columns],
        showgrid=False,
        side="top",
        range=[-0.5, grid.n_cols - 0.5],
    )
    fig.update_yaxes(
        title=dict(text="layer (each tile: query tokens ↓)"),
        type="category",
        tickmode="array",
        tickvals=grid.tick_y(),
        ticktext=[f"layer {layer}" for layer in range(grid.n_layers)],
        showgrid=False,
        range=[grid.n_rows - 0.5, -0.5],
    )
    fig.update_layout(
        margin=dict(l=80, r=20, t=120, b=20),
        clickmode="event+select",
        dragmode=False,
        hoverdistance=8,
    )


def _add_marks(fig: go.Figure, grid: _Grid, marks: Mapping[tuple[int, int], str]) -> None:
    """Tiles of heads a training loss forced into a pattern: outlined and labelled "trained"."""
    n_heads = sum(isinstance(h, int) for h in grid.columns)
    for (layer, head), note in marks.items():
        if not (0 <= layer < grid.n_layers and 0 <= head < n_heads):
            continue
        c = grid.columns.index(head)
        x0, y0 = grid.col_start(c) - 0.5, layer * grid.nq - 0.5
        fig.add_shape(
            type="rect",
            x0=x0,
            x1=x0 + grid.nk,
            y0=y0,
            y1=y0 + grid.nq,
            line=dict(color=MARK_COLOR, width=3),
            layer="above",
        )
        fig.add_annotation(  # inside the tile, at its foot (above it sit the head labels)
            x=x0 + grid.nk / 2, y=y0 + grid.nq, text="▣ trained", showarrow=False, yanchor="bottom",
            bgcolor="rgba(255,255,255,0.8)", font=dict(color=MARK_COLOR, size=10),
            hovertext=f"trained to look like this: {note}" if note else "trained to look like this",
        )  # fmt: skip


def grid_figure(
    probs: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    title: str,
    mask: np.ndarray | None = None,
    log: bool = False,
    aggregates: Sequence[str] = (),
    max_tile: int = GRID_MAX_TILE,
    marks: Mapping[tuple[int, int], str] | None = None,
    value_name: str = "weight",
) -> go.Figure:
    """All layers x heads as tiles of ONE heatmap trace on one colour scale (an overview).

    probs ``[L, H, Q, K]``. Tiles are laid out row = layer, column = head (then one column
    per aggregate in ``aggregates``), side by side; white lines drawn over the boundaries separate
    them (shapes: there are no gap cells, so hovering anywhere reads a real cell). z is uint8: the
    weight in whole percent (``quantise``; log: levels of log10 from 1e-4 to 1); NaN weights are
    GRID_NAN (white; the hover says so when there are any).
    Tiles with more than ``max_tile`` queries or keys show blocks of tokens, each the max of
    its cells. The x/y axes are categorical: each column's label names its head and key
    token(s), each row's its layer and query token(s), so hover text needs no per-cell data.
    ``mask`` ``[Q, K]``, or ``[L, Q, K]`` where layers were masked differently (True = may attend): masked cells (blocks: fully masked blocks) are
    drawn grey by a second, uint8 trace (1 = masked; 0 = transparent), left out when nothing
    is masked. ``parse_grid_point`` maps a clicked (x, y) back to (layer, head). ``marks``
    ((layer, head) -> note): tiles outlined and labelled "trained" (heads a training loss forced
    into a pattern; dashboard/marks.py). ``value_name``: what the cells are, in the hover and on the
    colour bar (e.g. "what-moves share" when ``probs`` are rows of alpha ||f(x)|| scaled to sum 1).
    """
    _, _, nq_full, nk_full = probs.shape
    if (nq_full, nk_full) != (len(query_tokens), len(key_tokens)):
        raise ValueError(
            f"probs are {nq_full}x{nk_full} but there are {len(query_tokens)}x{len(key_tokens)} tokens"
        )
    bq, bk = _blocks(nq_full, max_tile), _blocks(nk_full, max_tile)
    blocks = bq > 1 or bk > 1
    grid = _grid_cells(np.asarray(probs), query_tokens, key_tokens, mask, log, aggregates, bq, bk)
    fig = _grid_heatmaps(grid, log, blocks, value_name)
    _add_separators(fig, grid)
    width_px = 900  # about the width Streamlit gives a chart; keeps cells roughly square
    height = int(np.clip(grid.n_rows * width_px / max(grid.n_cols, 1) + 140, 260, 1400))
    _add_tile_markers(fig, grid)
    _grid_axes(fig, grid)
    _add_marks(fig, grid, marks or {})
    if blocks:  # say so where it shows: tiles are summaries past GRID_MAX_TILE tokens
        title += (
            f"<br><sup>each cell: the max of {bq}×{bk} tokens (exact {value_name}s in the head view)</sup>"
        )
    return finish(fig, title, height)


def parse_grid_point(x: str, y: str) -> tuple[int, int | str] | None:
    """Clicked grid cell (category labels) -> (layer, head or 'mean'/'max'); None for a gap."""
    mx, my = _X_RE.match(str(x)), _Y_RE.match(str(y))
    if not mx or not my:
        return None
    head: int | str = int(mx.group(1)) if mx.group(1) is not None else mx.group(2)
    return int(my.group(1)), head


# -- one head --------------------------------------------------------------------------


def masked_cells(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(query indices, key indices) of masked cells (mask False)."""
    qi, ki = np.nonzero(~np.asarray(mask, dtype=bool))
    return qi, ki


def head_heatmap(
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    title: str,
    query_title: str = "query",
    key_title: str = "key",
    mask: np.ndarray | None = None,
    log: bool = False,
    value_name: str = "weight",
    extra: Mapping[str, np.ndarray] | None = None,
) -> go.Figure:
    """Large heatmap of one head ``[Q, K]``: queries on y (top to bottom), keys on x.

    Hover: query token, key token, exact weight (the axes are categories "3 tok", ticks at
    their positions). ``mask`` (True = may attend): masked cells get an "x" marker (a separate
    trace named "masked ...", whose hover says so), so a masked 0 is told apart from a learned
    near-0; past MAX_MASK_MARKS masked cells they are greyed by rectangles (one path shape; a
    causal mask at 1,024 tokens is ~40 kB, a cell overlay was 1.4 MB and a second heatmap to draw),
    and a mask too scattered for MAX_MASK_RECTS rectangles by a uint8 overlay.
    ``value_name``: what ``weights`` are (hover and colour bar), e.g. "what-moves share". ``extra``
    (label -> ``[Q, K]``): more numbers per cell shown in the hover (the weight beside the what-moves
    share, the raw ‖α f(x)‖), sent as one float32 customdata array.
    """
    w = np.asarray(weights, dtype=np.float32)
    nq, nk = w.shape
    if (nq, nk) != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"weights are {nq}x{nk} but there are {len(query_tokens)}x{len(key_tokens)} tokens")
    for label, arr in (extra or {}).items():
        if np.shape(arr) != (nq, nk):
            raise ValueError(f"{label} is {np.shape(arr)} but the weights are {nq}x{nk}")
    # Categorical axes named "3 tok" (unique): hover shows the tokens without any per-cell text, and
    # the weights go out as one float32 array (exact; ~5.3 bytes a cell instead of ~45 of strings).
    ql = [f"{i} {token_label(t)}" for i, t in enumerate(query_tokens)]
    kl = [f"{j} {token_label(t)}" for j, t in enumerate(key_tokens)]
    allowed = np.ones_like(w, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    zmin, zmax = zrange(log)
    if extra:  # customdata (Q, K, 1 + n): the exact values, then each extra number
        custom = np.stack([w, *(np.asarray(a, dtype=np.float32) for a in extra.values())], axis=-1)
        shown = f"{value_name} %{{customdata[0]:.7g}}" + "".join(
            f"<br>{label} %{{customdata[{i + 1}]:.7g}}" for i, label in enumerate(extra)
        )
    else:
        custom = w if log else None  # the exact weights (z holds their log10)
        shown = f"{value_name} " + ("%{customdata:.7g}" if log else "%{z:.7g}")
    heat = go.Heatmap(
        z=color_values(w, log),
        x=kl,
        y=ql,
        zmin=zmin,
        zmax=zmax,
        colorscale=COLORSCALE,
        colorbar=colorbar(log, title=value_name),
        name="attention",
        hovertemplate="query %{y}<br>key %{x}<br>" + shown + "<extra></extra>",
    )
    if custom is not None:
        heat.customdata = custom
    fig = go.Figure(heat)
    if mask is not None:
        qi, ki = masked_cells(allowed)
        if len(qi) <= MAX_MASK_MARKS:
            size = float(np.clip(500 / max(nq, nk), 4, 14))
            fig.add_trace(
                go.Scatter(
                    x=[kl[j] for j in ki],
                    y=[ql[i] for i in qi],
                    mode="markers",
                    name="masked (may not attend)",
                    marker=dict(
                        symbol="x-thin", size=size, line=dict(width=1.5, color="#c8c8c8")
                    ),  # seen on dark cells and in the legend
                    hovertemplate="query %{y}<br>key %{x}<br>masked: may not attend (weight 0)<extra></extra>",
                    showlegend=True,
                )
            )
        elif (rects := mask_rects(allowed)) is not None:  # too many for markers: grey rectangles, one path
            fig.add_shape(
                type="path",
                path=mask_path(rects),
                fillcolor=MASKED_COLOR,
                line=dict(width=0),
                layer="above",
                name="masked (may not attend)",
                showlegend=True,
            )
        else:  # a scattered mask: a grey uint8 overlay (1 = masked, 0 = transparent)
            fig.add_trace(
                masked_overlay(
                    (~allowed).astype(np.uint8), kl, ql, name="masked (may not attend)", showlegend=True
                )
            )
        fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0))
    fig.update_xaxes(**token_axis(key_tokens, key_title, rotate=True), type="category")
    fig.update_yaxes(**token_axis(query_tokens, query_title), autorange=None, type="category")
    fig.update_yaxes(range=[nq - 0.5, -0.5])  # first query at the top
    fig.update_layout(margin=dict(l=90, r=20, t=70, b=90))
    return finish(fig, title, matrix_height(nq, min_px=360, extra=200))
