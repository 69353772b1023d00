"""Layers of one kind masked differently (sliding-window layers between global ones, as Gemma 2, Mistral's
and ModernBERT's; a layer that forgot the padding mask): the trace held one mask per kind, the first
layer's, so later layers were drawn, checked and audited under a mask they did not use, with nothing
said. Each layer's mask now travels in the trace (format 4, ``{kind}_layer_masks``) and every reader of a
mask reads the layer it draws or checks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from apptest_helpers import _array, assert_no_exception, figure, run_app
from torch import nn

from attnscope.core.analysis import tables
from attnscope.core.analysis.audit import static
from attnscope.core.errors import TraceFormatError
from attnscope.core.families.capture import capture_attention
from attnscope.core.traces import trace_io
from attnscope.core.traces.trace import AttentionTrace
from attnscope.dashboard import keys as K
from attnscope.dashboard import model_facts, opened
from attnscope.dashboard.plots import attention as PA

T = 7


class Layer(nn.Module):
    """Causal self-attention over 2 heads, within a window of ``window`` keys where it is set, PAD keys hidden
    from the other positions; the mask it applied is kept for the test (``keep``, (B, T, T))."""

    def __init__(self, d: int, window: int, padding: bool = True, causal: bool = True, own: bool = True):
        super().__init__()
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.window, self.padding, self.causal, self.own = window, padding, causal, own

    def forward(self, x, pad):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        i = torch.arange(t)
        keep = (i[:, None] >= i[None]) if self.causal else torch.ones(t, t, dtype=torch.bool)
        if self.window:
            keep = keep & (i[:, None] - i[None] < self.window)
        keep = keep[None].expand(b, t, t)
        if self.padding:  # (``own``: a PAD query sees itself, no NaN row)
            keep = keep & (~pad[:, None, :] | (torch.eye(t, dtype=torch.bool) & self.own))
        s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~keep[:, None], float("-inf"))
        self.keep = keep
        return x + self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


class Stack(nn.Module):
    def __init__(self, layers: list[Layer]):
        super().__init__()
        self.emb = nn.Embedding(30, 32)
        self.layers = nn.ModuleList(layers)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x, ids == 0)
        return x


IDS = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [3, 4, 5, 6, 0, 0, 0]])


def _traced(model: Stack, kind_tokens: str = "tgt") -> tuple[list[AttentionTrace], Stack]:
    torch.manual_seed(0)
    model.eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(IDS)
    tokens = [list("abcdefg"), list("abcd") + ["<pad>"] * 3]
    return [cap.trace(b, **{f"{kind_tokens}_tokens": tokens[b]}) for b in range(2)], model


@pytest.fixture
def local_global():
    """A sliding window of 2 in layer 0, then a global causal layer: a decoder."""
    torch.manual_seed(0)
    return _traced(Stack([Layer(32, 2), Layer(32, 0)]))


def test_each_layer_keeps_the_mask_it_applied(local_global, tmp_path):
    traces, model = local_global
    for b, tr in enumerate(traces):
        assert tr.masks_differ("dec_self")
        for n, layer in enumerate(model.layers):
            assert np.array_equal(tr.mask("dec_self", n), layer.keep[b].numpy()), (b, n)
        assert np.array_equal(tr.mask("dec_self"), model.layers[0].keep[b].numpy())  # the kind's: layer 0's
        assert tr.layer_masks("dec_self").shape == (2, T, T)
        assert tr.problems() == []  # layer 1's weight beyond layer 0's window is within its own mask
        for ext in ("npz", "json"):
            back = AttentionTrace.load(tr.save(tmp_path / f"t{b}.{ext}"))
            assert np.array_equal(back.dec_self_layer_masks, tr.dec_self_layer_masks)
            assert trace_io._file_header(tr)["format"] == 4


def test_one_mask_for_every_layer_stays_one_mask_and_an_older_format():
    torch.manual_seed(0)
    traces, model = _traced(Stack([Layer(32, 0), Layer(32, 0)]))
    for b, tr in enumerate(traces):
        assert not tr.masks_differ("dec_self") and tr.dec_self_layer_masks is None
        assert np.array_equal(tr.mask("dec_self", 1), model.layers[1].keep[b].numpy())
        assert trace_io._file_header(tr)["format"] < 4


def test_a_layer_that_forgot_the_padding_mask_fails_the_declared_mask_check():
    """Layer 1 of an encoder forgets the padding mask: the declared-mask check read only layer 0's and
    passed ("mask matches the tokens"); it now reads every layer's and names the layer."""
    torch.manual_seed(0)
    traces, _ = _traced(
        Stack([Layer(32, 0, causal=False, own=False), Layer(32, 0, padding=False, causal=False)]), "src"
    )
    assert traces[1].masks_differ("enc_self")
    verdict = static.check_declared_mask(traces, "enc_self", pad_id=None)
    assert not verdict.passed and verdict.layer == 1 and "layer 1" in verdict.detail, verdict.line()
    # which tokens are real is read from every layer's mask: the forgetful layer does not make PAD real
    assert model_facts.real_source(traces[1]).tolist() == [True] * 4 + [False] * 3


def test_fully_masked_rows_and_the_masked_mass_table_read_each_layers_mask(local_global):
    traces, _ = local_global
    table = tables.masked_mass_table(traces)
    assert table["ok"].all(), table
    # every layer's own mask: layer 1's weights on keys beyond layer 0's window are not mass on masked keys
    probs = traces[0].probs("dec_self")
    assert (probs[1][:, ~traces[0].mask("dec_self", 0)] > 0).any()
    assert static.check_fully_masked(traces, "dec_self").passed
    # a row fully masked in layer 1 only is found (layer 0's mask alone did not show it)
    lm = traces[0].dec_self_layer_masks.copy()
    lm[1, 3] = False
    probs = probs.copy()
    probs[1, :, 3] = 0.0
    odd = traces[0].replace(dec_self=probs, dec_self_layer_masks=lm)
    verdict = static.check_fully_masked([odd], "dec_self")
    assert not verdict.passed and "1 real query rows" in verdict.detail, verdict.line()
    assert tables.masked_mass_table([odd])["fully masked rows"].tolist() == [0, 0, 1, 1]


def test_the_grid_greys_each_layers_own_masked_cells(local_global):
    traces, _ = local_global
    tr = traces[0]
    fig = PA.grid_figure(
        tr.probs("dec_self"), *tr.axes("dec_self"), title="t", mask=tr.layer_masks("dec_self")
    )
    masked = next(t for t in fig.data if t.name == "masked")
    z = np.asarray(masked.z)  # rows: layer 0's queries, then layer 1's; columns: head 0's keys, then head 1's
    for layer in range(2):
        tile = z[layer * T : (layer + 1) * T, :T]
        assert np.array_equal(tile == 1, ~tr.mask("dec_self", layer)), layer


def test_the_reader_checks_each_layers_masks():
    """A file's layer masks must be [layer, query, key] booleans whose first layer is the kind's mask."""
    torch.manual_seed(0)
    (tr, _), _ = _traced(Stack([Layer(32, 2), Layer(32, 0)]))
    good = trace_io.to_npz_bytes(tr)
    assert AttentionTrace.from_bytes(good, "t.npz").masks_differ("dec_self")
    bad = {
        "shape": tr.replace(dec_self_layer_masks=tr.dec_self_layer_masks[:1]),
        "first layer": tr.replace(dec_self_layer_masks=tr.dec_self_layer_masks[::-1].copy()),
        "no mask": tr.replace(dec_self_mask=None),
    }
    for what, odd in bad.items():
        with pytest.raises(TraceFormatError, match="dec_self_layer_masks") as err:
            AttentionTrace.from_bytes(trace_io.to_npz_bytes(odd), "odd.npz")
        assert "\n" not in str(err.value), what
    # a file that declares format 3 may not hold them (format 4 added them)
    text = trace_io.to_json(tr).replace('"format": 4', '"format": 3')
    with pytest.raises(TraceFormatError, match="format 3"):
        AttentionTrace.from_bytes(text.encode(), "t.json")


def test_the_pages_draw_and_check_each_layers_mask(local_global, tmp_path, monkeypatch):
    traces, _ = local_global
    path = traces[0].save(tmp_path / "local_global.npz")
    monkeypatch.setenv(opened.VIEW_ENV, str(path))
    at = run_app(page="masks", **{K.MASK_LAYER: 1})
    assert_no_exception(at)
    assert any("masked differently" in i.value and "layer 1's" in i.value for i in at.info), [
        i.value for i in at.info
    ]
    panel = figure(at, "decoder self-attention mask of layer 1")  # (not "= causal AND real key": a window's)
    shown = _array(panel["data"][0]["z"])
    assert np.array_equal(shown.astype(bool), traces[0].mask("dec_self", 1)) or np.array_equal(
        shown[::-1].astype(bool), traces[0].mask("dec_self", 1)
    )
    assert not at.error, [e.value for e in at.error]  # every layer within its own mask: no leak reported
    at = run_app(page="audit", **{K.AUD_LAYER: 1})
    assert_no_exception(at)
    title = figure(at, "mask the model used")["layout"]["title"]["text"]
    assert "layer 1" in title, title
    # the audit reads every layer's mask: layer 0's sliding window hides keys the tokens call for, by design
    verdict = static.check_declared_mask(traces, "dec_self")
    assert verdict.passed and "layer 0 attends within a sliding window of 2 keys" in verdict.detail, (
        verdict.line()
    )
    for page in ("attention", "heads", "model", "bertviz"):
        assert_no_exception(run_app(page=page))


def test_a_layer_picked_for_another_trace_falls_back_to_the_first(local_global, tmp_path, monkeypatch):
    traces, _ = local_global
    monkeypatch.setenv(opened.VIEW_ENV, str(traces[0].save(tmp_path / "t.npz")))
    at = run_app(page="masks", **{K.MASK_LAYER: 7})  # (a deeper model's layer, kept in the session)
    assert_no_exception(at)
    assert any("layer 0's" in i.value for i in at.info), [i.value for i in at.info]


@pytest.mark.parametrize("kind", ["dec_self", "enc_self"])
def test_the_declared_mask_check_reads_a_sliding_window_as_one_and_anything_else_as_a_mismatch(kind):
    """A correct sliding-window model (Mistral's and Gemma 2's decoder layers, ModernBERT's local encoder
    layers) hides keys the tokens call for, by design: the declared-mask check failed it ("masked but must be
    visible"), so a correct windowed model could never pass the audit. A layer whose mask is exactly the
    tokens' within a window passes, and the verdict names the window; a layer that hides other keys fails."""
    n = 8
    real = np.ones(n, bool)
    real[6:] = False  # two PAD at the end
    d = np.arange(n)[:, None] - np.arange(n)[None, :]
    tokens_mask = real[None, :] & ((d >= 0) if kind == "dec_self" else np.ones((n, n), bool))
    window = tokens_mask & ((d < 3) if kind == "dec_self" else (np.abs(d) <= 2))
    probs = np.where(window, 1.0, 0.0)[None, None].repeat(2, 0)  # (layer, head, q, k): rows of each layer's
    probs = probs / np.maximum(probs.sum(-1, keepdims=True), 1)
    layer_masks = np.stack([window, tokens_mask])  # layer 0 windowed, layer 1 global
    tokens = tuple("abcdef") + ("<pad>", "<pad>")
    side = {"src_tokens": tokens} if kind == "enc_self" else {"src_tokens": (), "tgt_tokens": tokens}
    probs[1, 0] = np.where(tokens_mask, 1.0, 0.0) / np.maximum(tokens_mask.sum(-1, keepdims=True), 1)
    tr = AttentionTrace("t", "t", "cpu", **side, **{kind: probs, f"{kind}_mask": window,
                                                    f"{kind}_layer_masks": layer_masks})  # fmt: skip
    verdict = static.check_declared_mask([tr], kind)
    said = (
        "a sliding window of 3 keys (the query's own and the 2 before it)"
        if kind == "dec_self"
        else "a sliding window of the keys at most 2 positions away on either side"
    )
    assert verdict.passed and f"layer 0 attends within {said}" in verdict.detail, verdict.line()
    broken = layer_masks.copy()
    broken[0, 4, 1:3] = False  # hides two keys no window hides
    verdict = static.check_declared_mask([tr.replace(**{f"{kind}_layer_masks": broken})], kind)
    assert not verdict.passed and "in layer 0" in verdict.detail, verdict.line()


def test_asking_a_trace_for_a_kind_it_lacks_names_what_it_holds(local_global):
    traces, _ = local_global
    with pytest.raises(
        KeyError, match="no enc_self attention \\(the model has no encoder.*it holds dec_self"
    ):
        traces[0].probs("enc_self")


def test_the_declared_mask_check_reads_chunked_layers_as_chunks():
    """Llama 4's chunked attention: a query sees the keys of its own chunk, up to itself. A correct chunked
    layer passes, named with its chunks; a chunk boundary one off is a mismatch."""
    n, c = 9, 4
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    causal = j <= i
    chunked = causal & (i // c == j // c)
    probs = np.stack([np.where(m, 1.0, 0.0) / m.sum(-1, keepdims=True) for m in (chunked, causal)])[:, None]
    tr = AttentionTrace("t", "t", "cpu", src_tokens=(), tgt_tokens=tuple("abcdefghi"), dec_self=probs,
                        dec_self_mask=chunked, dec_self_layer_masks=np.stack([chunked, causal]))  # fmt: skip
    verdict = static.check_declared_mask([tr], "dec_self")
    assert verdict.passed and "layer 0 attends within chunks of 4 positions" in verdict.detail, verdict.line()
    off = causal & (i // c == j // c) & ~((i == 5) & (j == 4))  # row 5 misses key 4 of its own chunk
    verdict = static.check_declared_mask([tr.replace(dec_self_layer_masks=np.stack([off, causal]),
                                                     dec_self_mask=off)], "dec_self")  # fmt: skip
    assert not verdict.passed and "in layer 0" in verdict.detail, verdict.line()
