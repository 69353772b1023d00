"""Faithfulness: core's attention and layers against PyTorch's own modules, weights copied."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.attention import MultiHeadAttention
from core.config import tiny
from core.layers import DecoderLayer, EncoderLayer
from core.masks import causal_mask, to_torch_nn

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
D, H = 16, 4


def copy_mha(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        ref.out_proj.weight.copy_(ours.w_o.weight)
        ref.out_proj.bias.copy_(ours.w_o.bias)


def randomise(module: nn.Module, seed: int) -> None:
    """Non-trivial values everywhere, LayerNorm weights included."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


MHA_CASES = [
    (lq, lk, case)
    for lq, lk in [(5, 5), (3, 7), (8, 2)]
    for case in ["none", "key_padding", "causal", "random"]
    if case != "causal" or lq == lk  # a causal mask needs a square map
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lq,lk,mask_case", MHA_CASES)
def test_mha_matches_torch_multihead_attention(device, lq, lk, mask_case):
    torch.manual_seed(lq * 100 + lk)
    ours = MultiHeadAttention(D, H).to(device).eval()
    randomise(ours, 1)
    ref = nn.MultiheadAttention(D, H, batch_first=True).to(device).eval()
    copy_mha(ours, ref)
    b = 3
    q = torch.randn(b, lq, D, device=device)
    kv = torch.randn(b, lk, D, device=device)
    mask = None
    ref_kwargs = {}
    if mask_case == "key_padding":
        real = torch.ones(b, lk, dtype=torch.bool, device=device)
        real[1, lk - 1 :] = False
        real[2, max(1, lk - 2) :] = False
        mask = real[:, None, :].expand(b, lq, lk)
        ref_kwargs["key_padding_mask"] = to_torch_nn(real)
    elif mask_case == "causal":
        cm = causal_mask(lq, device)
        mask = cm[None].expand(b, lq, lk)
        ref_kwargs["attn_mask"] = to_torch_nn(cm)
    elif mask_case == "random":
        g = torch.Generator().manual_seed(7)
        m = torch.rand(b, lq, lk, generator=g) > 0.4
        m[..., 0] = True  # no fully masked rows: torch's module turns those into NaN
        mask = m.to(device)
        ref_kwargs["attn_mask"] = to_torch_nn(mask).repeat_interleave(H, dim=0)  # (B*H, Lq, Lk)
    out, maps = ours(q, kv, kv, mask, return_attn=True)
    ref_out, ref_w = ref(q, kv, kv, need_weights=True, average_attn_weights=False, **ref_kwargs)
    assert maps.probs.shape == (b, H, lq, lk)
    torch.testing.assert_close(maps.probs, ref_w, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=0)
    # and the fast path (SDPA, no capture) gives the same output
    fast, none = ours(q, kv, kv, mask, return_attn=False)
    assert none is None
    torch.testing.assert_close(fast, ref_out, atol=1e-6, rtol=0)


def _copy_encoder_layer(ours: EncoderLayer, ref: nn.TransformerEncoderLayer) -> None:
    copy_mha(ours.self_attn, ref.self_attn)
    with torch.no_grad():
        ref.linear1.weight.copy_(ours.ff.w_1.weight)
        ref.linear1.bias.copy_(ours.ff.w_1.bias)
        ref.linear2.weight.copy_(ours.ff.w_2.weight)
        ref.linear2.bias.copy_(ours.ff.w_2.bias)
        for mine, theirs in ((ours.sub_attn.norm, ref.norm1), (ours.sub_ff.norm, ref.norm2)):
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(device, norm, activation):
    torch.manual_seed(0)
    cfg = tiny(norm=norm, activation=activation)
    ours = EncoderLayer(cfg).to(device).eval()
    randomise(ours, 2)
    ref = nn.TransformerEncoderLayer(
        cfg.d_model,
        cfg.n_heads,
        cfg.d_ff,
        dropout=0.0,
        activation=activation,
        batch_first=True,
        norm_first=(norm == "pre"),
    ).to(device)
    _copy_encoder_layer(ours, ref)
    ref.train()  # dropout is 0; train mode keeps torch off its fused inference fast path
    x = torch.randn(2, 6, cfg.d_model, device=device)
    real = torch.ones(2, 6, dtype=torch.bool, device=device)
    real[1, 4:] = False
    ours_out, _ = ours(x, real[:, None, :].expand(2, 6, 6), return_attn=True)
    ref_out = ref(x, src_key_padding_mask=to_torch_nn(real))
    torch.testing.assert_close(ours_out, ref_out, atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_layer_matches_torch(device, norm):
    torch.manual_seed(1)
    cfg = tiny(norm=norm)
    ours = DecoderLayer(cfg).to(device).eval()
    randomise(ours, 3)
    ref = nn.TransformerDecoderLayer(
        cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, batch_first=True, norm_first=(norm == "pre")
    ).to(device)
    copy_mha(ours.self_attn, ref.self_attn)
    copy_mha(ours.cross_attn, ref.multihead_attn)
    with torch.no_grad():
        ref.linear1.weight.copy_(ours.ff.w_1.weight)
        ref.linear1.bias.copy_(ours.ff.w_1.bias)
        ref.linear2.weight.copy_(ours.ff.w_2.weight)
        ref.linear2.bias.copy_(ours.ff.w_2.bias)
        pairs = (
            (ours.sub_self.norm, ref.norm1),
            (ours.sub_cross.norm, ref.norm2),
            (ours.sub_ff.norm, ref.norm3),
        )
        for mine, theirs in pairs:
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
    ref.train()
    b, t, s = 2, 5, 7
    y = torch.randn(b, t, cfg.d_model, device=device)
    mem = torch.randn(b, s, cfg.d_model, device=device)
    tgt_real = torch.ones(b, t, dtype=torch.bool, device=device)
    tgt_real[1, 3:] = False
    src_real = torch.ones(b, s, dtype=torch.bool, device=device)
    src_real[0, 5:] = False
    self_mask = tgt_real[:, None, :] & causal_mask(t, device)[None]
    cross_mask = src_real[:, None, :].expand(b, t, s)
    ours_out, _, _ = ours(y, mem, self_mask, cross_mask, return_attn=True)
    ref_out = ref(
        y,
        mem,
        tgt_mask=to_torch_nn(causal_mask(t, device)),
        tgt_key_padding_mask=to_torch_nn(tgt_real),
        memory_key_padding_mask=to_torch_nn(src_real),
    )
    torch.testing.assert_close(ours_out, ref_out, atol=1e-5, rtol=0)
