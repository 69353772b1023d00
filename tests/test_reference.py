"""Faithfulness: core's attention and layers against PyTorch's own modules, weights copied."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnscope.core.transformer.attention import MultiHeadAttention
from attnscope.core.transformer.config import tiny
from attnscope.core.transformer.layers import DecoderLayer, EncoderLayer
from attnscope.core.transformer.masks import causal_mask, to_torch_nn
from attnscope.core.transformer.model import Transformer

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


def _copy_decoder_layer(ours: DecoderLayer, ref: nn.TransformerDecoderLayer) -> None:
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


# return_attn=True: the explicit path that returns every map (capture on); False: the SDPA fast path.
PATHS = pytest.mark.parametrize("return_attn", [True, False], ids=["explicit", "sdpa"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@PATHS
def test_encoder_layer_matches_torch(device, norm, activation, return_attn):
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
    ours_out, maps = ours(x, real[:, None, :].expand(2, 6, 6), return_attn=return_attn)
    assert (maps is not None) == return_attn
    ref_out = ref(x, src_key_padding_mask=to_torch_nn(real))
    torch.testing.assert_close(ours_out, ref_out, atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@PATHS
def test_decoder_layer_matches_torch(device, norm, activation, return_attn):
    torch.manual_seed(1)
    cfg = tiny(norm=norm, activation=activation)
    ours = DecoderLayer(cfg).to(device).eval()
    randomise(ours, 3)
    ref = nn.TransformerDecoderLayer(
        cfg.d_model,
        cfg.n_heads,
        cfg.d_ff,
        dropout=0.0,
        activation=activation,
        batch_first=True,
        norm_first=(norm == "pre"),
    ).to(device)
    _copy_decoder_layer(ours, ref)
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
    ours_out, self_maps, cross_maps = ours(y, mem, self_mask, cross_mask, return_attn=return_attn)
    assert (self_maps is not None) == (cross_maps is not None) == return_attn
    ref_out = ref(
        y,
        mem,
        tgt_mask=to_torch_nn(causal_mask(t, device)),
        tgt_key_padding_mask=to_torch_nn(tgt_real),
        memory_key_padding_mask=to_torch_nn(src_real),
    )
    torch.testing.assert_close(ours_out, ref_out, atol=1e-5, rtol=0)


def paper_embedding(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Token embedding x sqrt(d_model) + the sinusoidal encoding of the paper (section 3.5), built
    here without attnscope.core.transformer.positional: the Annotated Transformer's float32 formula."""
    d_model = table.shape[1]
    pos = torch.arange(ids.shape[1], dtype=torch.float32, device=ids.device)[:, None]
    div = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=ids.device) * (-math.log(10000.0) / d_model)
    )
    pe = torch.zeros(ids.shape[1], d_model, device=ids.device)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return nn.functional.embedding(ids, table) * math.sqrt(d_model) + pe


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@PATHS
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True:UserWarning")  # pre-LN: unused
def test_whole_model_matches_nn_transformer(device, norm, activation, return_attn):
    """core's Transformer against torch.nn.Transformer with every weight copied: the paper's
    embeddings (token x sqrt(d_model) + sinusoids, rebuilt here from the copied table), encoder and
    decoder stacks, the final LayerNorms (pre-LN only; torch's are removed for post-LN, as in the
    paper) and the tied output projection; a padded batch with causal and padding masks. Encoder
    memory, decoder states and logits must agree at every position (PAD rows too); measured
    largest difference 3.6e-7 on CPU."""
    torch.manual_seed(2)
    cfg = tiny(norm=norm, activation=activation, n_enc_layers=2, n_dec_layers=3)
    ours = Transformer(cfg).to(device).eval()
    randomise(ours, 4)
    ref = nn.Transformer(
        cfg.d_model,
        cfg.n_heads,
        cfg.n_enc_layers,
        cfg.n_dec_layers,
        cfg.d_ff,
        dropout=0.0,
        activation=activation,
        batch_first=True,
        norm_first=(norm == "pre"),
    ).to(device)
    for mine, theirs in zip(ours.encoder, ref.encoder.layers, strict=True):
        _copy_encoder_layer(mine, theirs)
    for mine, theirs in zip(ours.decoder, ref.decoder.layers, strict=True):
        _copy_decoder_layer(mine, theirs)
    with torch.no_grad():
        if norm == "pre":
            for mine, theirs in ((ours.enc_norm, ref.encoder.norm), (ours.dec_norm, ref.decoder.norm)):
                theirs.weight.copy_(mine.weight)
                theirs.bias.copy_(mine.bias)
        else:
            assert ours.enc_norm is None and ours.dec_norm is None
            ref.encoder.norm = ref.decoder.norm = None
    ref.train()  # dropout 0; keeps torch off its fused (nested tensor) inference path
    # one shared table: source and target embeddings and the output projection (paper, 3.4)
    table = ours.src_embed.tok.weight
    assert ours.tgt_embed.tok.weight is table and ours.generator.weight is table
    ref_gen = nn.Linear(cfg.d_model, cfg.tgt_vocab_size).to(device)
    with torch.no_grad():
        ref_gen.weight.copy_(table)
        ref_gen.bias.copy_(ours.generator.bias)
    pad = cfg.pad_id
    src = torch.randint(3, cfg.src_vocab_size, (3, 7), device=device)
    tgt = torch.randint(3, cfg.tgt_vocab_size, (3, 6), device=device)
    src[1, 5:] = pad
    src[2, 2:] = pad
    tgt[0, 4:] = pad
    src_pad, tgt_pad = to_torch_nn(src != pad), to_torch_nn(tgt != pad)  # torch: True = ignore
    with torch.no_grad():
        out = ours(src, tgt, return_attn=return_attn)
        src_emb, tgt_emb = paper_embedding(table, src), paper_embedding(table, tgt)
        ref_memory = ref.encoder(src_emb, src_key_padding_mask=src_pad)
        ref_hidden = ref(
            src_emb,
            tgt_emb,
            tgt_mask=to_torch_nn(causal_mask(tgt.shape[1], device)),
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        ref_logits = ref_gen(ref_hidden)
        torch.testing.assert_close(ours.src_embed(src), src_emb, atol=1e-6, rtol=0)
    assert (len(out.attn) == 3) == return_attn
    torch.testing.assert_close(out.memory, ref_memory, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.hidden, ref_hidden, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logits, ref_logits, atol=1e-5, rtol=0)
