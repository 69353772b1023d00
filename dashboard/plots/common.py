"""Shared pieces of every figure: token labels, token axes, sizes, the template, HTML export.

Pure functions: data in, plain dicts / strings / Figures out; no streamlit.
"""

from __future__ import annotations

import hashlib
import html
import math
from collections.abc import Sequence

import numpy as np
import plotly.colors
import plotly.graph_objects as go

# Whitespace tokens would be invisible on an axis; show them as visible symbols.
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍", "": "∅"}
MAX_LABEL_CHARS = 14  # longer tokens (word level) are cut with an ellipsis on axes
MAX_TICKS = 64  # up to this many tokens every token gets a tick; beyond, every k-th

# Attention probabilities are in [0, 1]; every attention view uses one fixed range so
# colours mean the same number on every chart (log views: 1e-4 .. 1).
COLORSCALE = "Viridis"
LOG_FLOOR = 1e-4
MASKED_COLOR = "rgba(150, 150, 150, 0.85)"  # masked cells: grey, outside the colour scale
MARK_COLOR = "#ff7f0e"  # a head a training loss forced into its pattern (dashboard/marks.py)

# Axis titles of an attention matrix, (query axis, key axis) per attention kind.
AXIS_TITLES = {
    "enc_self": ("query: source tokens", "key: source tokens"),
    "dec_self": ("query: decoder input", "key: decoder input"),
    "cross": ("query: decoder input", "key: source tokens"),
}
# The Attention page spells out what the decoder input is.
ATTENTION_AXIS_TITLES = {
    "enc_self": ("query: source tokens", "key: source tokens"),
    "dec_self": ("query: decoder input (BOS + target)", "key: decoder input"),
    "cross": ("query: decoder input (BOS + target)", "key: source tokens"),
}
DECODER_ONLY_TITLES = ("query: tokens (prompt, then continuation)", "key: tokens")  # decoder-only models

# A small template: the default "plotly" template adds ~8 kB to every figure's JSON.
TEMPLATE = go.layout.Template(
    layout=dict(
        font=dict(family="Inter, Helvetica, Arial, sans-serif", size=12),
        paper_bgcolor="white",
        plot_bgcolor="white",
        margin=dict(l=70, r=20, t=60, b=60),
        title=dict(x=0.0, xanchor="left", font=dict(size=15)),
        hoverlabel=dict(font=dict(family="monospace")),
    )
)


MAX_MASK_RECTS = 8192  # masked cells drawn as one path of at most this many rectangles, else a uint8 overlay


def mask_rects(allowed: np.ndarray) -> list[tuple[int, int, int, int]] | None:
    """The masked cells of ``allowed`` (Q, K; True = may attend) as rectangles (q0, q1, k0, k1),
    rows q0..q1-1 x keys k0..k1-1: each row's runs of masked keys, rows with the same runs merged
    (PAD key columns: one rectangle; causal: one per row). Exactly the masked cells, each once.
    None past MAX_MASK_RECTS (a scattered mask: the caller draws a cell overlay instead)."""
    masked = ~np.asarray(allowed, dtype=bool)
    if not masked.any():
        return []
    edges = np.diff(np.pad(masked.astype(np.int8), ((0, 0), (1, 1))), axis=1)  # +1 run start, -1 run end
    starts_q, starts_k = np.nonzero(edges == 1)
    _, ends_k = np.nonzero(edges == -1)  # row-major order: ends pair with starts
    runs: dict[int, tuple] = {}
    for q, k0, k1 in zip(starts_q.tolist(), starts_k.tolist(), ends_k.tolist(), strict=True):
        runs.setdefault(q, ())
        runs[q] += ((k0, k1),)
    rects: list[tuple[int, int, int, int]] = []
    q, n_rows = 0, masked.shape[0]
    while q < n_rows:
        sig = runs.get(q, ())
        end = q + 1
        while end < n_rows and runs.get(end, ()) == sig:
            end += 1
        rects.extend((q, end, k0, k1) for k0, k1 in sig)
        if len(rects) > MAX_MASK_RECTS:
            return None
        q = end
    return rects


def mask_path(rects: list[tuple[int, int, int, int]]) -> str:
    """SVG path of ``rects`` (mask_rects) in cell coordinates (a category axis' serial numbers):
    cell (q, k) spans q-0.5..q+0.5."""
    return "".join(
        f"M{k0 - 0.5:g},{q0 - 0.5:g}H{k1 - 0.5:g}V{q1 - 0.5:g}H{k0 - 0.5:g}Z" for q0, q1, k0, k1 in rects
    )


def cell_gap(z) -> int:
    """Pixels between the cells of a heatmap of ``z``: 1 while cells are big enough to show it
    (up to MAX_TICKS a side); 0 beyond, where a gap would cover the cells and plotly would draw
    every cell as its own rectangle (a 512 x 512 mask took twice as long to draw)."""
    return 1 if max(np.shape(z)) <= MAX_TICKS else 0


def token_label(token: str) -> str:
    """Axis/hover text for one token: whitespace made visible, long tokens cut, HTML escaped.

    Plotly reads a few HTML tags in text (``<b>``, ``<br>``...), so ``<pad>`` or a user's
    ``<b>`` must be escaped to show literally (plotly decodes ``&lt;`` back to ``<``).
    """
    token = str(token)
    shown = _VISIBLE.get(token, token)
    if shown.isspace():
        shown = repr(shown)[1:-1]
    if len(shown) > MAX_LABEL_CHARS:
        shown = shown[: MAX_LABEL_CHARS - 1] + "…"
    return html.escape(shown, quote=False)


def token_labels(tokens: Sequence[str]) -> list[str]:
    return [token_label(t) for t in tokens]


def indexed_labels(tokens: Sequence[str]) -> list[str]:
    """``"3 'a'"``-style labels for hover text: position and token."""
    return [f"{i} {token_label(t)}" for i, t in enumerate(tokens)]


def tick_font_size(n: int) -> int:
    return 12 if n <= 24 else 10 if n <= 40 else 8


def token_axis(tokens: Sequence[str], title: str, rotate: bool = False, max_ticks: int = MAX_TICKS) -> dict:
    """Axis dict for a numeric axis 0..n-1 labelled with tokens (thinned past max_ticks).

    Numeric positions (not categories): repeated tokens ("l", "l") stay separate columns.
    """
    n = len(tokens)
    step = max(1, math.ceil(n / max_ticks))
    vals = list(range(0, n, step))
    labels = token_labels(tokens)
    axis = dict(
        title=dict(text=title),
        tickmode="array",
        tickvals=vals,
        ticktext=[labels[i] for i in vals],
        tickfont=dict(size=tick_font_size(n), family="monospace"),
        showgrid=False,
        zeroline=False,
        range=[-0.5, n - 0.5],
    )
    if rotate:  # upright while every label fits its column (about 12 columns of <= 6 characters)
        longest = max((len(html.unescape(t)) for t in labels), default=0)
        axis["tickangle"] = -90 if n > 12 or longest > 6 else 0
        # (the title below the labels turned upright, however long they are: `<pooled 0>`): plotly pushes the
        # margin to fit a title at a standoff it is given
        axis["automargin"] = True
        axis["title"] = dict(text=title, standoff=8)
    return axis


def matrix_height(
    n_rows: int, min_px: int = 300, max_px: int = 1400, per_row: float | None = None, extra: int = 170
) -> int:
    """Pixel height that gives each row room for its tick label (28 px for few rows, 12 px for many)."""
    if per_row is None:
        per_row = float(np.clip(480 / max(n_rows, 1), 12, 28))
    return int(min(max_px, max(min_px, n_rows * per_row + extra)))


def colorbar(log: bool, title: str = "weight") -> dict:
    if not log:
        return dict(title=dict(text=title), thickness=12)
    exps = list(range(int(math.log10(LOG_FLOOR)), 1))
    return dict(
        title=dict(text=f"{title} (log)"),
        thickness=12,
        tickvals=exps,
        ticktext=[f"1e{e}" if e else "1" for e in exps],
    )


def color_values(weights, log: bool):
    """z for a colour scale: the weights themselves, or log10(max(w, LOG_FLOOR))."""
    w = np.asarray(weights, dtype=np.float32)
    if not log:
        return w
    with np.errstate(invalid="ignore"):
        return np.log10(np.maximum(w, LOG_FLOOR)).astype(np.float32)


def grid_colorscale(levels: int = 100) -> list:
    """COLORSCALE over z = 0..levels, white for z = levels + 1 (the grid's gaps; zmax = levels + 1)."""
    colors = plotly.colors.get_colorscale(COLORSCALE)
    top = levels / (levels + 1)
    scale = [[round(pos * top, 6), color] for pos, color in colors]
    return [*scale, [(levels + 0.5) / (levels + 1), "white"], [1.0, "white"]]


def zrange(log: bool) -> tuple[float, float]:
    return (math.log10(LOG_FLOOR), 0.0) if log else (0.0, 1.0)


def figure_html(fig: go.Figure) -> str:
    """A standalone HTML page for one figure, plotly.js inlined (works offline)."""
    return fig.to_html(include_plotlyjs=True, full_html=True, config={"displaylogo": False})


def _fill_unset(obj, defaults: dict) -> None:
    """Set each leaf of ``defaults`` on the plotly object ``obj`` where ``obj`` leaves it unset."""
    for name, value in defaults.items():
        if isinstance(value, dict):
            _fill_unset(obj[name], value)
        elif obj[name] is None:
            obj[name] = value


def _feed(h, value) -> None:
    """Feed a figure's JSON-like content (dicts, lists, numpy arrays, scalars) into the hash ``h``."""
    if isinstance(value, np.ndarray) and value.dtype.kind == "O":  # bytes would be object addresses
        h.update(f"nd-object{value.shape}".encode())
        _feed(h, value.ravel().tolist())
    elif isinstance(value, np.ndarray):
        h.update(f"nd{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        h.update(b"{")
        for key in sorted(value):
            h.update(repr(key).encode())
            _feed(h, value[key])
        h.update(b"}")
    elif isinstance(value, list | tuple):
        h.update(b"[")
        for item in value:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(value).encode())


def data_revision(fig: go.Figure) -> str:
    """A digest of everything the figure holds (data, layout, frames; not its datarevision): equal
    figures get equal revisions, any other number or label another one."""
    content = fig.to_plotly_json()
    content.get("layout", {}).pop("datarevision", None)
    content["frames"] = [f.to_plotly_json() for f in fig.frames]
    h = hashlib.blake2b(digest_size=12)
    _feed(h, content)
    return h.hexdigest()


def finish(fig: go.Figure, title: str, height: int | None = None) -> go.Figure:
    """Title, height, the template's styling, and a revision of its data.

    Every figure is drawn once in the browser, not twice: ``st.plotly_chart`` hands Plotly a second,
    equal copy of the figure right after the first draw, and ``Plotly.react`` redraws in full when
    the copy's ``layout.template`` is a new object or, with no ``layout.datarevision``, when a data
    array is (numpy arrays arrive as typed arrays, compared by identity). So the template's values go
    into the layout itself (where the figure leaves them unset, as a template would) and the layout
    carries a digest of the figure's content as its revision: a copy of it is not drawn again, other
    numbers in the same element are (their revision differs), and a rerun that builds the same figure
    sends the same element, which the browser leaves as it is. Call it last: it digests the figure."""
    fig.update_layout(title=dict(text=title, yref="container", y=1.0, yanchor="top", pad=dict(t=14)))
    if height is not None:
        fig.update_layout(height=height)
    _fill_unset(fig.layout, TEMPLATE.layout.to_plotly_json())
    fig.layout.template = None  # no template in the JSON (plotly.py would otherwise add its default)
    fig.layout.datarevision = data_revision(fig)
    return fig
