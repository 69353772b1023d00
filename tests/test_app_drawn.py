"""What the pages draw for every zoo and pretrained model is what the model computed: the tokens on
the axes and the selected head's values equal an independent trace of the same input (not only "no
exception"), on the Attention page (grid and head), Head analytics and Masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from apptest_helpers import ZOO, _array, assert_clean, figure, run_app

from attnscope.core.analysis import analytics as A
from attnscope.dashboard import keys as K
from attnscope.dashboard.plots import attention as PA
from attnscope.dashboard.plots.common import MAX_TICKS, token_labels
from attnscope.models import registry

HEADS_PAGE = "app_pages/head_analytics.py"


def _ticks(tokens) -> list[str]:
    """The tick labels a token axis must carry: every token, every k-th past MAX_TICKS."""
    return token_labels(tokens)[:: math.ceil(len(tokens) / MAX_TICKS)]


def _expected(model: str, source: str):
    return registry.load(model).trace([source])[0]


def _grid_tile(grid: dict, layer: int, head: int, n_heads: int, nq: int, nk: int) -> np.ndarray:
    z = _array(grid["data"][0]["z"])
    y0, x0 = layer * nq, head * nk  # tiles abut (white lines over the boundaries separate them)
    n_layers = len(grid["layout"]["yaxis"]["tickvals"])
    assert z.shape == (n_layers * nq, n_heads * nk)
    return z[y0 : y0 + nq, x0 : x0 + nk]


@pytest.mark.parametrize("model", ZOO)
def test_attention_page_draws_the_models_numbers(model):
    at = run_app(model)
    assert_clean(at)
    source = at.sidebar.text_input(key=K.SOURCE).value
    tr = _expected(model, source)
    for kind in tr.kinds:
        probs = tr.probs(kind)
        n_layers, n_heads, nq, nk = probs.shape
        layer, head = n_layers - 1, n_heads - 1  # not the default (0, 0)
        at.radio(key=K.ATT_KIND).set_value(kind).run()
        at.selectbox(key=K.ATT_LAYER).select(layer).run()
        at.selectbox(key=K.ATT_HEAD).select(head).run()
        assert_clean(at)
        q_tok, k_tok = tr.axes(kind)
        big = figure(at, f"· layer {layer} · head {head} ·")
        assert big["layout"]["xaxis"]["ticktext"] == _ticks(k_tok), kind
        assert big["layout"]["yaxis"]["ticktext"] == _ticks(q_tok), kind
        np.testing.assert_allclose(_array(big["data"][0]["z"]), probs[layer, head], atol=1e-6, err_msg=kind)
        grid = figure(at, "all ")
        if nq <= PA.GRID_MAX_TILE and nk <= PA.GRID_MAX_TILE:
            tile = _grid_tile(grid, layer, head, n_heads, nq, nk)
            np.testing.assert_array_equal(tile, PA.quantise(probs[layer, head], log=False), err_msg=kind)


@pytest.mark.parametrize("model", ["reverse", "brackets", *(["minilm"] if "minilm" in ZOO else [])])
def test_head_analytics_draws_the_models_statistics(model):
    at = run_app(model)
    source = at.sidebar.text_input(key=K.SOURCE).value
    at.switch_page(HEADS_PAGE).run()
    assert_clean(at)
    tr = _expected(model, source)
    kind = at.radio(key=K.HA_KIND).value
    probs = tr.probs(kind)
    layer, head = probs.shape[0] - 1, probs.shape[1] - 1
    at.selectbox(key=K.HA_LAYER).select(layer).run()
    at.selectbox(key=K.HA_HEAD).select(head).run()
    big = figure(at, f"· layer {layer} · head {head} ·")
    np.testing.assert_allclose(_array(big["data"][0]["z"]), probs[layer, head], atol=1e-6)
    stat = at.selectbox(key=K.HA_STAT).value
    heat = figure(at, "per head (")
    pad = registry.load(model).cfg.pad_id
    expected = A.trace_head_stats(tr, kind, pad)[stat]
    np.testing.assert_allclose(_array(heat["data"][0]["z"]), expected, atol=1e-6, equal_nan=True)
