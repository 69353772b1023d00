"""Pure dashboard functions, tested on the figures and numbers they return (no Streamlit)."""

from __future__ import annotations

import hashlib
import html
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from attnscope.core.analysis import tables as analysis
from attnscope.core.transformer.decode import greedy_decode
from attnscope.core.transformer.model import count_parameters, parameters_by_module
from attnscope.core.transformer.positional import sinusoidal_table, wavelengths
from attnscope.dashboard import bertviz_html, model_facts
from attnscope.dashboard.plots import attention as PA
from attnscope.dashboard.plots import decoding as PD
from attnscope.dashboard.plots import masks as PM
from attnscope.dashboard.plots import positional as PP
from attnscope.dashboard.plots.common import (
    LOG_FLOOR,
    MAX_MASK_RECTS,
    MAX_TICKS,
    figure_html,
    mask_path,
    mask_rects,
    token_label,
    token_labels,
)
from attnscope.dashboard.plots.model import params_figure

INJECTION = "</script><script>alert(1)</script>"


@pytest.fixture(scope="module")
def batch_traces(tiny_model):
    """A padded batch of two, teacher-forced, so every kind has PAD rows/columns."""
    return tiny_model.trace(["hello world", "abc"], ["dlrow olleh", "cba"])


def z_of(trace) -> np.ndarray:
    return np.asarray(trace.z, dtype=np.float64)


# -- token labels --------------------------------------------------------------------------


def test_token_labels_are_visible_and_escaped():
    assert token_label("a") == "a"
    assert token_label(" ") == "␣"
    assert token_label("<pad>") == "&lt;pad&gt;"
    assert html.unescape(token_label("<b>")) == "<b>"  # plotly would otherwise render bold
    assert token_label("x" * 40).endswith("…") and len(token_label("x" * 40)) <= 14


# -- grid ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["enc_self", "dec_self", "cross"])
def test_grid_tiles_hold_every_layer_and_head(batch_traces, kind):
    tr = batch_traces[1]  # the shorter sequence: PAD on its keys
    probs, (q_tok, k_tok), mask = tr.probs(kind), tr.axes(kind), tr.mask(kind)
    fig = PA.grid_figure(probs, q_tok, k_tok, title="grid", mask=mask, aggregates=("mean", "max"))
    heat, masked, tiles = fig.data
    assert [d.type for d in fig.data] == [
        "heatmap",
        "heatmap",
        "scatter",
    ]  # weights, mask overlay, click targets
    picked = {PA.parse_grid_point(x, y) for x, y in zip(tiles.x, tiles.y, strict=True)}
    assert picked == {
        (layer, h) for layer in range(probs.shape[0]) for h in [*range(probs.shape[1]), "mean", "max"]
    }
    z, zm = z_of(heat), z_of(masked)
    xs, ys = list(heat.x), list(heat.y)
    n_layers, n_heads = probs.shape[:2]
    for layer in range(n_layers):
        rows = [i for i, y in enumerate(ys) if y.startswith(f"layer {layer} ·")]
        assert len(rows) == len(q_tok)
        assert [y.split(" ", 5)[-1] for y in (ys[r] for r in rows)] == token_labels(q_tok)
        for head in [*range(n_heads), "mean", "max"]:
            cols = [j for j, x in enumerate(xs) if x.startswith(f"{PA.head_name(head)} ·")]
            assert len(cols) == len(k_tok)
            want = PA.head_weights(probs, layer, head)  # z: whole percent (the overview; exact below)
            np.testing.assert_allclose(
                z[np.ix_(rows, cols)] / PA.GRID_LEVELS, want, rtol=0, atol=0.005 + 1e-6
            )
            tile_mask = zm[np.ix_(rows, cols)]
            assert np.array_equal(tile_mask == 1, ~mask)  # masked cells marked, only those
            assert PA.parse_grid_point(xs[cols[0]], ys[rows[-1]]) == (layer, head)
    # No gap cells: every cell belongs to a tile (hover anywhere reads a real weight); white lines
    # over the boundaries separate the tiles, twice as wide before the aggregate columns.
    n_cells = n_layers * (n_heads + 2) * len(q_tok) * len(k_tok)
    assert z.size == n_cells and int((z <= PA.GRID_LEVELS).sum()) == n_cells
    assert int(zm.sum()) == n_layers * (n_heads + 2) * int((~mask).sum())
    nk, nq = len(k_tok), len(q_tok)
    starts = {  # (line width, direction) -> where each white line starts ("M x,y")
        (sh.line.width, "v" if sh.path.split(" ")[1].startswith("L" + sh.path.split(",")[0][1:]) else "h"):
            [tuple(float(v) for v in m[1:].split(",")) for m in sh.path.split(" ") if m.startswith("M")]
        for sh in fig.layout.shapes if sh.type == "path" and sh.line.color == "white"
    }  # fmt: skip
    assert starts == {
        (PA.SEPARATOR_PX, "v"): [(c * nk - 0.5, -0.5) for c in [*range(1, n_heads), n_heads + 1]],
        (2 * PA.SEPARATOR_PX, "v"): [(n_heads * nk - 0.5, -0.5)],  # before "mean of heads"
        (PA.SEPARATOR_PX, "h"): [(-0.5, ly * nq - 0.5) for ly in range(1, n_layers)],
    }
    assert PA.parse_grid_point(xs[0], "·0") is None


@pytest.mark.parametrize(
    "shape,bq,bk", [((2, 3, 16, 16), 4, 4), ((2, 3, 17, 10), 4, 3), ((1, 1, 5, 7), 1, 2)]
)
def test_block_max_is_the_max_of_each_block_ignoring_nan(shape, bq, bk):
    """Every output cell is the NaN-ignoring max of its block (blocks past the end padded with the
    fill), checked cell by cell against a plain loop, with and without blocks that tile exactly."""
    rng = np.random.default_rng(sum(shape))
    a = rng.random(shape, dtype=np.float32)
    a[0, 0, 1, 1] = np.nan  # one NaN in a block: ignored
    a[..., :bq, -bk:] = np.nan  # whole blocks of NaN stay NaN only where nothing pads them
    got = PA.block_max(a, bq, bk, fill=-1.0)
    nq, nk = shape[-2:]
    mq, mk = -(-nq // bq), -(-nk // bk)
    assert got.shape == (*shape[:-2], mq, mk)
    for idx in np.ndindex(*shape[:-2], mq, mk):
        *lead, i, j = idx
        block = a[(*lead, slice(i * bq, (i + 1) * bq), slice(j * bk, (j + 1) * bk))]
        padded = block.size < bq * bk
        vals = block[~np.isnan(block)]
        want = max([*vals.tolist(), *([-1.0] if padded else [])], default=np.nan)
        if np.isnan(want):
            assert np.isnan(got[idx]), idx
        else:
            assert got[idx] == np.float32(want), idx


def test_grid_log_scale_levels(batch_traces):
    tr = batch_traces[0]
    probs = tr.probs("cross")
    fig = PA.grid_figure(probs, *tr.axes("cross"), title="g", log=True)
    z, ys, xs = z_of(fig.data[0]), list(fig.data[0].y), list(fig.data[0].x)
    rows = [i for i, y in enumerate(ys) if y.startswith("layer 1 ·")]
    cols = [j for j, x in enumerate(xs) if x.startswith("head 2 ·")]
    levels = -np.log10(LOG_FLOOR)  # decades on the log scale, 1e-4 .. 1
    want = (np.log10(np.maximum(probs[1, 2], LOG_FLOOR)) + levels) / levels * PA.GRID_LEVELS
    np.testing.assert_allclose(z[np.ix_(rows, cols)], want, atol=0.5 + 1e-4)
    assert fig.data[0].zmin == 0 and fig.data[0].zmax == PA.GRID_NAN


def test_grid_json_stays_small():
    """6 layers x 8 heads x 60 x 60: numpy arrays go out as base64, labels once per row/column."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(60), size=(6, 8, 60)).astype(np.float32)
    toks = [chr(97 + i % 26) for i in range(60)]
    fig = PA.grid_figure(probs, toks, toks, title="big", mask=np.tril(np.ones((60, 60), bool)))
    size = len(fig.to_json())
    assert size < 1_600_000, size  # base64 float32 + uint8 mask: ~7 bytes/cell, not ~20 chars/cell


# -- one head ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["enc_self", "dec_self", "cross"])
def test_head_heatmap_z_ticks_hover_and_mask(batch_traces, kind):
    tr = batch_traces[1]
    probs, (q_tok, k_tok), mask = tr.probs(kind), tr.axes(kind), tr.mask(kind)
    fig = PA.head_heatmap(probs[1, 2], q_tok, k_tok, title=f"{kind} L1 H2", mask=mask)
    heat = fig.data[0]
    assert z_of(heat).shape == probs.shape[2:]
    np.testing.assert_array_equal(z_of(heat), probs[1, 2])
    assert list(fig.layout.xaxis.ticktext) == token_labels(k_tok)
    assert list(fig.layout.yaxis.ticktext) == token_labels(q_tok)
    assert list(fig.layout.xaxis.tickvals) == list(range(len(k_tok)))
    assert "<pad>" in k_tok and "&lt;pad&gt;" in fig.layout.xaxis.ticktext  # PAD columns visible
    # Hover: query token, key token (the category labels) and the exact weight (z) of that cell.
    i, j = len(q_tok) - 1, 0
    xs, ys = list(heat.x), list(heat.y)
    assert ys[i].endswith(token_label(q_tok[i])) and xs[j].endswith(token_label(k_tok[j]))
    assert "%{x}" in heat.hovertemplate and "%{y}" in heat.hovertemplate and "%{z:.7g}" in heat.hovertemplate
    # Masked cells: the "masked" trace marks exactly the cells the mask forbids.
    marks = [d for d in fig.data if d.name and d.name.startswith("masked")]
    assert len(marks) == 1
    got = sorted(zip([ys.index(y) for y in marks[0].y], [xs.index(x) for x in marks[0].x], strict=True))
    assert got == sorted(map(tuple, np.argwhere(~mask).tolist()))
    assert got, "the short sequence must have masked (PAD) keys"
    assert "masked" in marks[0].hovertemplate
    assert "layer" not in fig.layout.title.text or "L1" in fig.layout.title.text


def test_head_heatmap_without_mask_has_no_marks_and_log_z(batch_traces):
    tr = batch_traces[0]
    w = tr.probs("enc_self")[0, 0]
    fig = PA.head_heatmap(w, *tr.axes("enc_self"), title="t", log=True)
    assert len(fig.data) == 1
    np.testing.assert_allclose(z_of(fig.data[0]), np.log10(np.maximum(w, LOG_FLOOR)), atol=1e-6)


def test_sixty_tokens_all_labelled_and_rotated():
    toks = [chr(97 + i % 26) + str(i) for i in range(60)]
    w = np.full((60, 60), 1 / 60, dtype=np.float32)
    fig = PA.head_heatmap(w, toks, toks, title="60")
    assert list(fig.layout.xaxis.ticktext) == toks and fig.layout.xaxis.tickangle == -90
    assert fig.layout.xaxis.tickfont.size <= 10 and fig.layout.height >= 60 * 12
    many = [f"t{i}" for i in range(130)]
    fig = PA.head_heatmap(np.zeros((130, 130), np.float32), many, many, title="130")
    assert len(fig.layout.xaxis.ticktext) <= 64 and fig.layout.xaxis.ticktext[0] == "t0"  # thinned


def test_heatmap_rejects_mislabelled_axes(batch_traces):
    tr = batch_traces[0]
    q_tok, k_tok = tr.axes("cross")
    with pytest.raises(ValueError, match="tokens"):
        PA.head_heatmap(tr.probs("cross")[0, 0], q_tok[:-1], k_tok, title="one row short")
    with pytest.raises(ValueError, match="tokens"):
        PA.grid_figure(tr.probs("cross"), q_tok, k_tok[1:], title="one column short")


# -- decoding --------------------------------------------------------------------------------


def test_decode_steps_match_greedy_decoding(tiny_model):
    """The page's per-step data (read from the greedy trace) equals greedy decoding step by step:
    the token greedy_decode chose, and a forward pass on the prefix the step had."""
    src_text = "hello"
    tr = tiny_model.trace([src_text])[0]
    ids = torch.tensor([tiny_model.prepare(src_text).ids])
    res = greedy_decode(tiny_model.model, ids)
    n = res.lengths[0]
    assert model_facts.decode_steps(tr).count == n
    for t in range(n):
        with torch.no_grad():  # the step's own forward pass: decoder input = BOS + tokens so far
            step = tiny_model.model(ids, res.ids[:, : t + 1], return_attn=True)
        prob, token_id = step.logits[0, t].softmax(-1).max(-1)
        assert int(token_id) == int(res.out_ids[0, t])
        ds = model_facts.decode_step(tr, t, tiny_model.tgt_tok.itos)
        assert ds.prefix == tuple(tiny_model.tgt_tok.tokens(res.ids[0, : t + 1].tolist()))
        assert ds.new_token == tiny_model.tgt_tok.itos[int(token_id)] == ds.topk_tokens[0]
        np.testing.assert_allclose(ds.cross, step.attn["cross"].probs[0, :, :, t].numpy(), atol=1e-5)
        np.testing.assert_allclose(
            ds.dec_self, step.attn["dec_self"].probs[0, :, :, t, : t + 1].numpy(), atol=1e-5
        )
        assert ds.new_prob == pytest.approx(float(prob), abs=1e-5)
        assert np.all(np.diff(ds.topk_probs) <= 0)


def test_step_figure_rows_and_topk(tiny_model):
    tr = tiny_model.trace(["abc"])[0]
    ds = model_facts.decode_step(tr, 1, tiny_model.tgt_tok.itos)
    fig = PD.step_figure(ds.cross, tr.src_tokens, title="cross", key_title="source")
    z = z_of(fig.data[0])
    n_layers, n_heads, n_src = ds.cross.shape
    assert z.shape == (n_layers * (n_heads + 1) + 1, n_src)
    np.testing.assert_allclose(z[0], ds.cross[0, 0], atol=1e-7)
    np.testing.assert_allclose(z[n_heads], ds.cross[0].mean(0), atol=1e-6)
    np.testing.assert_allclose(z[-1], ds.cross.mean((0, 1)), atol=1e-6)
    assert list(fig.layout.xaxis.ticktext) == token_labels(tr.src_tokens)
    fig = PD.step_figure(ds.dec_self, ds.prefix, title="self", key_title="prefix")
    assert list(fig.layout.xaxis.ticktext) == token_labels(ds.prefix) and len(ds.prefix) == 2
    n = model_facts.decode_steps(tr).count
    over = PD.steps_overview(
        tr.cross[1, :, :n].mean(0),
        tr.out_tokens[:n],
        tr.src_tokens,
        current=1,
        title="all steps",
        key_title="source",
    )
    np.testing.assert_allclose(z_of(over.data[0]), tr.cross[1, :, :n].mean(0), atol=1e-7)
    assert list(over.layout.yaxis.ticktext) == token_labels(tr.out_tokens[:n])
    assert (over.layout.shapes[0].y0, over.layout.shapes[0].y1) == (0.5, 1.5)  # the current step outlined
    bars = PD.topk_figure(ds.topk_tokens, ds.topk_probs, title="top")
    assert [x.split(". ", 1)[1] for x in bars.data[0].x] == token_labels(ds.topk_tokens)
    np.testing.assert_allclose(bars.data[0].y, ds.topk_probs, atol=1e-7)


# -- masks -----------------------------------------------------------------------------------


def test_mask_figures(batch_traces):
    tr = batch_traces[1]
    fig = PM.attention_mask_figure(
        tr.dec_self_mask, tr.tgt_tokens, tr.tgt_tokens, title="dec", query_title="q", key_title="k"
    )
    np.testing.assert_array_equal(z_of(fig.data[0]), tr.dec_self_mask.astype(int))
    assert list(fig.layout.yaxis.ticktext) == token_labels(tr.tgt_tokens)
    # Hover: query and key tokens come from the category axes ("3 tok"), the value from z; no per-cell text.
    labels = [f"{i} {t}" for i, t in enumerate(token_labels(tr.tgt_tokens))]
    heat = fig.data[0]
    assert list(heat.x) == labels and list(heat.y) == labels and heat.customdata is None
    assert "%{x}" in heat.hovertemplate and "%{y}" in heat.hovertemplate and "%{z}" in heat.hovertemplate
    marks = fig.data[1]
    assert sorted(
        (labels.index(y), labels.index(x)) for x, y in zip(marks.x, marks.y, strict=True)
    ) == sorted(map(tuple, np.argwhere(~tr.dec_self_mask).tolist()))
    src = np.stack([t.src_ids for t in batch_traces]) != 0
    fig = PM.padding_mask_figure(src, [t.src_tokens for t in batch_traces], title="pad", position_title="pos")
    np.testing.assert_array_equal(z_of(fig.data[0]), src.astype(int))
    assert fig.data[0].customdata[1][-1][1].endswith("&lt;pad&gt;")


def test_masked_mass_table_is_zero_and_catches_leaks(batch_traces):
    table = analysis.masked_mass_table(batch_traces)
    kinds, layers, heads = 3, 2, 4
    assert len(table) == kinds * layers * heads
    assert table["ok"].all() and (table["max mass on masked keys (one query)"] == 0).all()
    assert (table["fully masked rows"] == 0).all()
    leaky = batch_traces[1].cross.copy()
    leaky[1, 3, :, -1] = 0.25  # put weight on a PAD key (masked) in layer 1 head 3
    bad = analysis.masked_mass_table([batch_traces[0], batch_traces[1].replace(cross=leaky)])
    flagged = bad[~bad["ok"]]
    assert list(zip(flagged["layer"], flagged["head"], strict=True)) == [(1, 3)]
    assert flagged["max mass on masked keys (one query)"].iloc[0] == pytest.approx(0.25)


# -- positional ------------------------------------------------------------------------------


def test_positional_figures_and_periods():
    table = sinusoidal_table(128, 16).numpy()
    heat = PP.pe_heatmap(table, title="pe")
    assert z_of(heat.data[0]).shape == (128, 16)
    curves = PP.pe_curves(table, [0, 1, 6], title="c", sinusoidal=True)
    assert [d.name for d in curves.data] == ["dim 0 (sin, i=0)", "dim 1 (cos, i=0)", "dim 6 (sin, i=3)"]
    np.testing.assert_allclose(curves.data[2].y, table[:, 6], atol=1e-7)
    sim = PP.similarity_figure(table, title="s")
    np.testing.assert_allclose(z_of(sim.data[0]), table @ table.T, rtol=1e-5, atol=1e-4)
    wl = wavelengths(16).numpy()
    wave = PP.wavelength_figure(wl, title="w", y_title="wavelength")
    assert wave.layout.yaxis.type == "log"
    # The FFT estimate (used for learned tables) recovers the true wavelengths it can resolve.
    est = analysis.dominant_period(table)
    short = wl < 128 / 2
    assert short.sum() >= 4
    np.testing.assert_allclose(est[short], wl[short], rtol=0.15)


def test_params_figure_counts_every_parameter(tiny_model):
    counts = parameters_by_module(tiny_model.model)
    fig = params_figure(counts, title="p")
    assert sum(fig.data[0].x) == count_parameters(tiny_model.model)
    assert set(fig.data[0].y) == set(counts)


def test_figure_html_is_standalone(batch_traces):
    tr = batch_traces[0]
    page = figure_html(PA.head_heatmap(tr.probs("enc_self")[0, 0], *tr.axes("enc_self"), title="t"))
    parser = _Scripts()
    parser.feed(page)
    assert parser.scripts and not any("src" in s for s in parser.scripts)  # nothing loaded from a URL
    assert len(page) > 1_000_000  # plotly.js is inlined


# -- bertviz ---------------------------------------------------------------------------------


class _Scripts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.scripts: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts.append(dict(attrs))


@pytest.mark.parametrize("view", ["head", "model"])
def test_bertviz_html_is_offline_and_escapes_tokens(tiny_model, view):
    tr = tiny_model.trace([INJECTION + " hi"])[0]
    data = bertviz_html.attention_data(tr, tr.kinds)
    assert [d["name"] for d in data] == ["Encoder", "Decoder", "Cross"]
    assert INJECTION in "".join(data[0]["left_text"])  # the tokens themselves are untouched
    page = bertviz_html.render(view, data)
    parser = _Scripts()
    parser.feed(page)
    assert len(parser.scripts) == 3  # vendored libraries, AMD shim, bertviz: no script from the text
    nonce = parser.scripts[0]["nonce"]
    assert all(s.get("nonce") == nonce and "src" not in s for s in parser.scripts)
    assert f"script-src 'nonce-{nonce}'" in page and "default-src 'none'" in page
    assert "<script>alert" not in page and "alert(1)" not in page.replace("alert(1)\\u003c", "")
    assert "cdnjs" not in page and not re.search(r"""src=["']https?:""", page)
    # The parameters decode back to exactly the tokens and weights given.
    start = page.index("const params = ") + len("const params = ")
    params = json.JSONDecoder().raw_decode(page[start:])[0]
    assert params["attention"][0]["left_text"] == data[0]["left_text"]
    np.testing.assert_allclose(params["attention"][2]["attn"], np.round(tr.cross, 4), atol=1e-9)


def test_bertviz_encoder_only_and_pad_dropping(tiny_clf):
    traces = tiny_clf.trace(["hello world", "ab"])
    short = traces[1]
    kept = bertviz_html.attention_data(short, ["enc_self"], drop_pad=False)[0]
    dropped = bertviz_html.attention_data(short, ["enc_self"], drop_pad=True)[0]
    assert kept["name"] is None and "<pad>" in kept["left_text"] and "<pad>" not in dropped["left_text"]
    assert np.asarray(dropped["attn"]).shape[2:] == (3, 3)  # "a", "b", <eos>
    assert bertviz_html.view_height("model", [dropped]) > 0


def test_vendored_files_match_their_readme():
    readme = (bertviz_html.VENDOR / "README.md").read_text()
    for name in bertviz_html.VENDOR_FILES:
        digest = hashlib.sha256((bertviz_html.VENDOR / name).read_bytes()).hexdigest()
        assert f"`{name}`" in readme and digest in readme, name
    for lic in ("LICENSE-d3.txt", "LICENSE-jquery.txt", "LICENSE-requirejs.txt"):
        assert (bertviz_html.VENDOR / lic).stat().st_size > 500


def test_grid_hover_names_nan_only_when_there_is_one():
    """A NaN weight is drawn white as level GRID_NAN; the hover explains that value only when the grid
    holds one (every other cell's hover is a real weight: there are no gap cells)."""
    probs = np.full((1, 2, 3, 3), 1 / 3, dtype=np.float32)
    toks = ["a", "b", "c"]
    clean = PA.grid_figure(probs, toks, toks, title="t")
    assert "NaN" not in clean.data[0].hovertemplate and z_of(clean.data[0]).max() == 33
    probs[0, 1, 2] = np.nan
    broken = PA.grid_figure(probs, toks, toks, title="t")
    z = z_of(broken.data[0])
    assert f"{PA.GRID_NAN} means NaN" in broken.data[0].hovertemplate
    assert (z == PA.GRID_NAN).sum() == 3 and (z[2, 3:] == PA.GRID_NAN).all()


@pytest.mark.parametrize("n", [8, MAX_TICKS, MAX_TICKS + 1, 512])
def test_mask_heatmaps_drop_cell_gaps_once_cells_are_small(n):
    """Gaps between mask cells while every token has a tick; none beyond (a 1-pixel gap would hide
    1-pixel cells, and plotly draws gapped cells one by one: twice as slow at 512 tokens)."""
    from attnscope.dashboard.plots import audit as PU

    mask = np.tril(np.ones((n, n), dtype=bool))
    toks = [f"t{i}" for i in range(n)]
    figs = [
        PM.attention_mask_figure(mask, toks, toks, title="m", query_title="q", key_title="k"),
        PU.mask_compare_figure(mask, ~mask, toks, toks, title="c"),
    ]
    for fig in figs:
        heat = fig.data[0]
        assert (heat.xgap, heat.ygap) == ((1, 1) if n <= MAX_TICKS else (0, 0))


def _cells(rects, shape) -> np.ndarray:
    covered = np.zeros(shape, dtype=int)
    for q0, q1, k0, k1 in rects:
        covered[q0:q1, k0:k1] += 1
    return covered


@pytest.mark.parametrize("case", ["causal", "padding", "padded causal", "cross", "none", "all", "scattered"])
def test_mask_rects_cover_exactly_the_masked_cells_once(case):
    """Rectangles from mask_rects cover every masked cell exactly once and no allowed cell; rows with
    the same runs merge (PAD columns: one rectangle), and a scattered mask past MAX_MASK_RECTS gives None."""
    n, real = 300, 200
    allowed = {
        "causal": np.tril(np.ones((n, n), bool)),
        "padding": np.broadcast_to(np.arange(n) < real, (n, n)).copy(),
        "padded causal": np.tril(np.ones((n, n), bool)) & (np.arange(n) < real),
        "cross": np.broadcast_to(np.arange(n + 7) < real, (n - 5, n + 7)).copy(),
        "none": np.ones((n, n), bool),
        "all": np.zeros((n, n), bool),
        "scattered": np.random.default_rng(0).random((n, n)) < 0.5,
    }[case]
    rects = mask_rects(allowed)
    if case == "scattered":
        assert rects is None  # ~n * n / 4 runs: more than MAX_MASK_RECTS
        assert MAX_MASK_RECTS < n * n / 4
        return
    np.testing.assert_array_equal(_cells(rects, allowed.shape), (~allowed).astype(int))
    want = {"causal": n - 1, "padding": 1, "padded causal": real, "cross": 1, "none": 0, "all": 1}[case]
    assert len(rects) == want
    path = mask_path(rects)
    assert path.count("M") == len(rects) and path.count("Z") == len(rects)
    if rects:  # the first rectangle's corner, in cell coordinates
        q0, _, k0, _ = rects[0]
        assert path.startswith(f"M{k0 - 0.5:g},{q0 - 0.5:g}H")


def test_head_heatmap_greys_many_masked_cells_with_one_path():
    """Past MAX_MASK_MARKS masked cells: one path shape (in the legend) covers them, no overlay trace,
    and the hover still reads the weights; a scattered mask falls back to the uint8 overlay."""
    n = 256
    toks = [f"t{i}" for i in range(n)]
    allowed = np.tril(np.ones((n, n), bool))
    w = np.where(allowed, 1.0, 0.0).astype(np.float32) / allowed.sum(1, keepdims=True)
    fig = PA.head_heatmap(w, toks, toks, mask=allowed, title="causal")
    assert [d.type for d in fig.data] == ["heatmap"]
    (shape,) = [s for s in fig.layout.shapes if s.type == "path"]
    assert shape.showlegend and shape.name.startswith("masked") and shape.fillcolor
    assert shape.path == mask_path(mask_rects(allowed))
    assert "%{z:.7g}" in fig.data[0].hovertemplate
    scattered = np.random.default_rng(1).random((n, n)) < 0.5
    fig = PA.head_heatmap(np.where(scattered, w, 0), toks, toks, mask=scattered, title="scattered")
    overlay = [d for d in fig.data if d.name and d.name.startswith("masked")]
    assert len(overlay) == 1 and overlay[0].type == "heatmap"
    np.testing.assert_array_equal(z_of(overlay[0]) == 1, ~scattered)
    assert not [s for s in fig.layout.shapes if s.type == "path"]


def test_figure_cache_shares_a_figure_while_its_trace_lives():
    """FigureCache: the same figure for the same trace object and key (built once); another trace or
    key builds anew; it holds the trace weakly, so a dropped trace is not kept alive by its figure."""
    import gc
    import weakref

    from attnscope.dashboard.trace_cache import FigureCache

    class Owner:  # stands in for an AttentionTrace
        pass

    cache, built = FigureCache(max_entries=2), []

    def build(tag):
        built.append(tag)
        return {"fig": tag}

    a, b = Owner(), Owner()
    f1 = cache.get(a, ("grid", 1), lambda: build("a1"))
    assert cache.get(a, ("grid", 1), lambda: build("again")) is f1 and built == ["a1"]
    assert cache.get(a, ("grid", 2), lambda: build("a2")) == {"fig": "a2"}
    assert cache.get(b, ("grid", 1), lambda: build("b1")) == {"fig": "b1"}
    assert cache.get(a, ("grid", 1), lambda: build("a1 evicted")) == {"fig": "a1 evicted"}  # 2 entries kept
    ref = weakref.ref(b)
    del b
    gc.collect()
    assert ref() is None
    roomy, c = FigureCache(max_entries=8), Owner()
    roomy.get(c, ("grid",), lambda: build("c"))
    del c
    gc.collect()
    roomy.get(a, ("grid",), lambda: build("a"))  # a new entry drops the figures of traces that are gone
    assert len(roomy._items) == 1


def test_finish_puts_the_template_in_the_layout_and_a_digest_of_the_data_as_revision():
    import plotly.graph_objects as go

    from attnscope.dashboard.plots import common

    def build(z, title="t", labels=("a",)):
        heat = go.Heatmap(z=np.asarray(z, dtype=np.float32), x=list(labels))
        return common.finish(go.Figure(heat, layout=dict(margin=dict(l=5))), title, 300)

    fig = build([[0.5]])
    spec = json.loads(fig.to_json())["layout"]
    assert "template" not in spec  # a template object makes Plotly.react redraw an equal copy in full
    tpl = common.TEMPLATE.layout
    margin = {"l": 5, "r": tpl.margin.r, "t": tpl.margin.t, "b": tpl.margin.b}  # l: the figure's own
    assert spec["margin"] == margin
    assert spec["font"] == {"family": tpl.font.family, "size": tpl.font.size}
    assert spec["title"]["text"] == "t" and spec["title"]["x"] == 0.0 and spec["height"] == 300
    # The same content built again: the same revision (a rerun sends an unchanged element); another
    # number, label or title: another revision (the browser draws it).
    rev = fig.layout.datarevision
    assert rev and build([[0.5]]).layout.datarevision == rev
    others = [build([[0.25]]), build([[0.5]], labels=("b",)), build([[0.5]], title="u"), build([[0.5, 0.5]])]
    assert len({rev, *(f.layout.datarevision for f in others)}) == 5
    # Object arrays (strings, mixed) count by content, not by the addresses their bytes would be.
    texts = [
        np.array([["a"], [1]], dtype=object),
        np.array([["a"], [1]], dtype=object),
        np.array([["b"], [1]], dtype=object),
    ]
    revs = [common.data_revision(go.Figure(go.Heatmap(z=[[1], [2]], text=t))) for t in texts]
    assert revs[0] == revs[1] != revs[2]


def test_rotated_key_labels_push_the_axis_title_below_them():
    """Labels turned upright (long ones: learned keys such as ``<pooled 0>``) take room the fixed margin does not
    have: the axis asks plotly for margin enough to set its title below them (it was drawn over them)."""
    from attnscope.dashboard.plots.common import token_axis

    axis = token_axis(["target", "<pooled 0>", "<pooled 1>"], "key: source tokens", rotate=True)
    assert axis["tickangle"] == -90 and axis["automargin"] is True
    assert axis["title"] == {"text": "key: source tokens", "standoff": 8}
    flat = token_axis(["a", "b"], "key", rotate=True)
    assert flat["tickangle"] == 0 and "standoff" in flat["title"]
    assert "automargin" not in token_axis(["a", "b"], "query")


def test_masked_mass_table_counts_nan_rows_apart_from_leaks(batch_traces):
    """NaN maps (a sequence with NaN in its data) were every head's "attention on masked keys": the rows are
    counted as NaN rows, left out of the mass, and a real leak beside them is still caught."""
    cross = batch_traces[1].cross.copy()
    cross[0, 1, 2, :] = np.nan  # a NaN row in layer 0 head 1
    cross[1, 3, 0, -1] = 0.25  # and a leak onto a PAD key in layer 1 head 3
    table = analysis.masked_mass_table([batch_traces[0], batch_traces[1].replace(cross=cross)])
    from attnscope.core.traces.trace import KIND_LABELS

    rows = table[table["attention"] == KIND_LABELS["cross"]]
    assert int(rows["NaN rows"].sum()) == 1
    nan_head = rows[(rows["layer"] == 0) & (rows["head"] == 1)].iloc[0]
    assert (
        nan_head["NaN rows"] == 1 and nan_head["ok"] and nan_head["max mass on masked keys (one query)"] == 0
    )
    flagged = table[~table["ok"]]
    assert list(zip(flagged["layer"], flagged["head"], strict=True)) == [(1, 3)]
