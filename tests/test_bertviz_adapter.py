"""attnscope.core.traces.bertviz_adapter: AttentionTrace -> bertviz head_view / model_view arguments, for every model type."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.core.traces.bertviz_adapter import BertvizArgs, bertviz_args
from attnscope.core.traces.trace import AttentionTrace
from attnscope.dashboard import bertviz_html

L, H = 3, 4


def render_html(args: BertvizArgs) -> str:
    """The page the dashboard serves for these arguments (vendored bertviz, no CDN)."""
    return bertviz_html.render(args.view, bertviz_html.data_from_args(args), args.layers, args.heads)


def _probs(rng, q, k, mask):
    x = rng.random((L, H, q, k)).astype(np.float32) * mask
    return x / x.sum(-1, keepdims=True).clip(min=1e-9)


def _key_mask(n_q, n_real, n):
    m = np.zeros((n_q, n), bool)
    m[:, :n_real] = True
    return m


def _encoder_trace(n_real=5, n_pad=2, seed=0):
    rng = np.random.default_rng(seed)
    n = n_real + n_pad
    mask = _key_mask(n, n_real, n)
    toks = [f"w{i}" for i in range(n_real)] + ["[PAD]"] * n_pad
    return AttentionTrace("m", "c", "cpu", tuple(toks), enc_self=_probs(rng, n, n, mask), enc_self_mask=mask)


def _decoder_only_trace(n_real=4, n_pad=1):
    rng = np.random.default_rng(1)
    n = n_real + n_pad
    mask = np.tril(np.ones((n, n), bool)) & _key_mask(n, n_real, n)
    toks = [f"t{i}" for i in range(n_real)] + ["<pad>"] * n_pad
    return AttentionTrace(
        "m", "c", "cpu", (), tgt_tokens=tuple(toks), dec_self=_probs(rng, n, n, mask), dec_self_mask=mask
    )


def _seq2seq_trace():
    rng = np.random.default_rng(2)
    s, t = 6, 4  # 5 real source tokens + PAD, 3 real target tokens + PAD
    enc_mask, cross_mask = _key_mask(s, 5, s), _key_mask(t, 5, s)
    dec_mask = np.tril(np.ones((t, t), bool)) & _key_mask(t, 3, t)
    return AttentionTrace(
        "m", "c", "cpu",
        tuple(f"s{i}" for i in range(5)) + ("<pad>",),
        tgt_tokens=("<bos>", "a", "b", "<pad>"),
        enc_self=_probs(rng, s, s, enc_mask), enc_self_mask=enc_mask,
        dec_self=_probs(rng, t, t, dec_mask), dec_self_mask=dec_mask,
        cross=_probs(rng, t, s, cross_mask), cross_mask=cross_mask,
    )  # fmt: skip


@pytest.mark.parametrize("view", ["head", "model"])
def test_encoder_only(view):
    trace = _encoder_trace()
    args = bertviz_args(trace, view=view)
    att = args.kwargs["attention"]
    assert len(att) == L and all(tuple(a.shape) == (1, H, 5, 5) for a in att)
    assert args.kwargs["tokens"] == [f"w{i}" for i in range(5)]  # trailing PAD dropped
    for i, a in enumerate(att):
        np.testing.assert_array_equal(a[0].numpy(), trace.enc_self[i, :, :5, :5])
    assert args.layers == [0, 1, 2] and args.heads == [0, 1, 2, 3] and not args.warnings
    html = render_html(args)
    assert "w4" in html and "[PAD]" not in html
    kept = bertviz_args(trace, view=view, drop_padding=False)
    assert kept.kwargs["tokens"][-1] == "[PAD]" and tuple(kept.kwargs["attention"][0].shape) == (1, H, 7, 7)


@pytest.mark.parametrize("view", ["head", "model"])
def test_decoder_only(view):
    trace = _decoder_only_trace()
    args = bertviz_args(trace, view=view)
    assert args.kwargs["tokens"] == ["t0", "t1", "t2", "t3"]
    assert tuple(args.kwargs["attention"][0].shape) == (1, H, 4, 4)
    assert "encoder_attention" not in args.kwargs
    assert "t3" in render_html(args)


@pytest.mark.parametrize("view", ["head", "model"])
def test_seq2seq(view):
    trace = _seq2seq_trace()
    args = bertviz_args(trace, view=view)
    kw = args.kwargs
    assert kw["encoder_tokens"] == [f"s{i}" for i in range(5)] and kw["decoder_tokens"] == ["<bos>", "a", "b"]
    assert tuple(kw["encoder_attention"][0].shape) == (1, H, 5, 5)
    assert tuple(kw["decoder_attention"][0].shape) == (1, H, 3, 3)
    assert tuple(kw["cross_attention"][0].shape) == (1, H, 3, 5)
    np.testing.assert_array_equal(kw["cross_attention"][2][0].numpy(), trace.cross[2, :, :3, :5])
    assert "attention" not in kw
    html = render_html(args)
    assert "s4" in html and "Cross" in html


def test_layer_and_head_limits():
    trace = _encoder_trace()
    model = bertviz_args(trace, view="model", include_layers=[2], include_heads=[1, 3])
    assert model.kwargs["include_layers"] == [2] and model.kwargs["include_heads"] == [1, 3]
    assert len(model.kwargs["attention"]) == L  # bertviz slices by include_layers itself
    render_html(model)
    head = bertviz_args(trace, view="head", include_heads=[1, 3])
    assert tuple(head.kwargs["attention"][0].shape) == (1, 2, 5, 5)  # head_view has no include_heads
    np.testing.assert_array_equal(head.kwargs["attention"][0][0, 1].numpy(), trace.enc_self[0, 3, :5, :5])
    assert head.heads == [1, 3]
    render_html(head)
    with pytest.raises(ValueError, match="include_layers"):
        bertviz_args(trace, include_layers=[3])


def _cells(args):
    kw = args.kwargs
    tensors = [
        kw[k] for k in ("attention", "encoder_attention", "decoder_attention", "cross_attention") if k in kw
    ]
    heads = len(args.heads)
    return sum(len(args.layers) * heads * t[0].shape[-2] * t[0].shape[-1] for t in tensors)


@pytest.mark.parametrize("view", ["head", "model"])
def test_long_input_warns_and_shows_a_subset(view):
    trace = _encoder_trace(n_real=150, n_pad=0)
    args = bertviz_args(trace, view=view, max_cells=50_000)
    assert args.warnings and "150 tokens" in args.warnings[0]
    assert args.layers == [0] and len(args.heads) == 2  # 2 heads x 150 x 150 = 45,000 cells
    assert _cells(args) <= 50_000
    assert len(args.kwargs["tokens"]) == 150
    render_html(args)


def test_very_long_input_is_cropped():
    trace = _encoder_trace(n_real=400, n_pad=0)
    args = bertviz_args(trace, view="head", max_cells=10_000)
    assert len(args.heads) == 1 and len(args.warnings) == 2 and "first" in args.warnings[1]
    n = args.n_tokens["tokens"]
    assert n == 100 and tuple(args.kwargs["attention"][0].shape) == (1, 1, n, n)
    assert _cells(args) <= 10_000
    short = bertviz_args(_encoder_trace(n_real=90, n_pad=0))
    assert not short.warnings and short.layers == [0, 1, 2]


@pytest.mark.parametrize("view", ["head", "model"])
def test_a_trace_with_nan_maps_is_drawn_with_a_warning_not_an_exception(view):
    """A sequence with NaN in its data has NaN maps: the bertviz page raised (JSON has no NaN). It draws those
    cells as 0 and says so."""
    import torch
    from torch import nn

    from attnscope.core.families.capture import capture_attention

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):
            q, k, v = self.qkv(x).view(*x.shape[:2], 3, 2, 4).permute(2, 0, 3, 1, 4)
            return (q @ k.transpose(-1, -2)).softmax(-1) @ v

    x = torch.randn(1, 4, 8)
    x[0, 1, 2] = float("nan")
    model = Attn().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    trace = cap.trace(0, src_tokens=list("abcd"))
    assert np.isnan(trace.probs("enc_self")).any()
    args = bertviz_args(trace, view=view)
    assert any("hold NaN" in n and "as 0" in n for n in args.warnings)
    data = bertviz_html.data_from_args(args)
    html = bertviz_html.render(view, data, layers=args.layers, heads=args.heads)
    assert not np.isnan(np.asarray(data[0]["attn"], dtype=np.float64)).any() and "<html>" in html
