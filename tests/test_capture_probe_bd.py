"""Cases found by probing capture with attention written as LLM-era, vision and decoding code writes it: a
soft-cap applied after the mask (Gemma 2's ``tanh(s / c) * c`` in the wrong order), which squashes the mask
until it hides nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention
from attnscope.core.traces.trace import AttentionTrace


class SoftCapped(nn.Module):
    """Causal self-attention with a soft-cap of the scores, before or after the causal mask is added. ``maps``
    keeps the weights the model computed."""

    def __init__(self, cap: float, mask_first: bool, d: int = 16, h: int = 2):
        super().__init__()
        self.cap, self.mask_first, self.h = cap, mask_first, h
        self.emb = nn.Embedding(50, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.maps: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in self.qkv(x).split(d, -1))
        s = q @ k.transpose(2, 3) * (d // self.h) ** -0.5
        causal = torch.full((t, t), torch.finfo(s.dtype).min).triu(1)
        if self.mask_first:
            s = s + causal
            s = torch.tanh(s / self.cap) * self.cap
        else:
            s = torch.tanh(s / self.cap) * self.cap
            s = s + causal
        w = F.softmax(s, dim=-1, dtype=torch.float32)
        self.maps.append(w.detach().clone())
        return w @ v


@pytest.mark.parametrize("batch,heads", [(2, 2), (1, 1), (4, 4)])
def test_a_soft_cap_after_the_causal_mask_is_said(batch, heads):
    """The cap of 5 squashes the mask's finfo.min to -5: later keys get weight. The map shows them attended
    (what the softmax saw), the call stays a decoder's, and a warning says the mask stopped hiding them."""
    torch.manual_seed(0)
    model = SoftCapped(5.0, mask_first=True, h=heads).eval()
    ids = torch.randint(0, 50, (batch, 6))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (r,) = cap.records
    torch.testing.assert_close(r.probs, model.maps[0], rtol=0, atol=1e-6)
    future = ~torch.ones(6, 6, dtype=torch.bool).tril()
    assert float(model.maps[0][..., future].max()) > 1e-3  # the model's own bug: later keys get weight
    assert r.mask is None or bool(r.mask[:, future].all())  # drawn attended, as they are
    assert r.kind == "dec_self"
    (note,) = [n for n in cap.notes if "soft-cap" in n]
    assert "later keys" in note and "Apply the mask after" in note


@pytest.mark.parametrize("cap_value", [5.0, 50.0])
def test_a_soft_cap_before_the_mask_is_a_plain_causal_mask(cap_value):
    """The right order (and a cap of 50 after it, which squashes finfo.min to -50 only): keys stay hidden,
    no warning."""
    torch.manual_seed(0)
    for mask_first in (False, True) if cap_value == 50.0 else (False,):
        model = SoftCapped(cap_value, mask_first=mask_first).eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randint(0, 50, (2, 6)))
        (r,) = cap.records
        torch.testing.assert_close(r.probs, model.maps[0], rtol=0, atol=1e-6)
        assert r.kind == "dec_self" and r.mask is not None
        assert torch.equal(r.mask, torch.ones(2, 6, 6, dtype=torch.bool).tril().expand_as(r.mask))
        assert not cap.notes, cap.notes


class MeanTokenPool(nn.Module):
    """CLIP's AttentionPool2d as a pooling head captured alone, over features handed in: the mean of the
    tokens joined before them is the only query (by hand, with SDPA, or with F.multi_head_attention_forward).
    ``maps`` keeps the weights (B, H, 1, 1 + N)."""

    def __init__(self, how: str, d: int = 8, h: int = 2):
        super().__init__()
        self.how, self.h = how, h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.maps: list[torch.Tensor] = []

    def forward(self, x):  # (B, N, d)
        x = torch.cat([x.mean(dim=1, keepdim=True), x], dim=1)
        b, n, d = x.shape
        if self.how == "mha":
            xs = x.transpose(0, 1)  # sequence-first, as CLIP's
            out, w = F.multi_head_attention_forward(
                query=xs[:1], key=xs, value=xs, embed_dim_to_check=d, num_heads=self.h,
                q_proj_weight=self.q.weight, k_proj_weight=self.k.weight, v_proj_weight=self.v.weight,
                in_proj_weight=None, in_proj_bias=torch.cat([self.q.bias, self.k.bias, self.v.bias]),
                bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0, out_proj_weight=self.o.weight,
                out_proj_bias=self.o.bias, use_separate_proj_weight=True, training=False, need_weights=True,
                average_attn_weights=False,
            )  # fmt: skip
            self.maps.append(w.detach().clone())
            return out[0]
        q = self.q(x[:, :1]).view(b, 1, self.h, d // self.h).transpose(1, 2)
        k, v = (f(x).view(b, n, self.h, d // self.h).transpose(1, 2) for f in (self.k, self.v))
        if self.how == "sdpa":
            self.maps.append(((q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5).softmax(-1))
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            w = ((q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5).softmax(-1)
            self.maps.append(w.detach().clone())
            y = w @ v
        return self.o(y.transpose(1, 2).reshape(b, d))


@pytest.mark.parametrize("how", ["hand", "sdpa", "mha"])
@pytest.mark.parametrize("batch,heads", [(2, 2), (1, 1), (3, 4)])
def test_a_mean_token_pool_over_features_handed_in_is_self_attention_drawn_at_its_row(how, batch, heads):
    """The mean token is a position pooled from the features it is joined to: the call is the features' own
    self-attention (enc_self, its query and first key labelled ``<pooled 0>``), never a decoder reading a
    memory (the hand-written pool was dec_self, its keys ``<ctx i>``), and the trace draws it at row 0 (the
    F.multi_head_attention_forward pool raised: its record had no key positions)."""
    torch.manual_seed(batch * 10 + heads)
    model = MeanTokenPool(how, h=heads).eval()
    x = torch.randn(batch, 4, 8)
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    (r,) = cap.records
    want = model.maps[0].detach()
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-5)
    assert r.kind == "enc_self" and r.exact and not cap.notes, (r.kind, cap.notes)
    assert r.query_labels == ("<pooled 0>",) and r.key_labels is not None and r.key_labels[0] == "<pooled 0>"
    assert all(lab is None for lab in r.key_labels[1:])
    for i in range(batch):
        tr = cap.trace(i)
        assert tr.meta["query_rows"] == {"enc_self": [0]}
        assert tr.enc_self.shape == (1, heads, 5, 5)
        np.testing.assert_allclose(tr.enc_self[0, :, 0], want[i, :, 0].numpy(), atol=1e-5)
        assert not tr.enc_self[0, :, 1:].any()  # the tokens ask nothing


class _CachedAttn(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.h = h
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, mem, past=None):
        b, d = x.size(0), x.size(-1)

        def split(t):
            return t.view(b, -1, self.h, d // self.h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(mem)), split(self.v(mem))
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        w = (q @ k.transpose(-1, -2) / (d // self.h) ** 0.5).softmax(-1)
        return (w @ v).transpose(1, 2).reshape(b, -1, d), (k, v), w.detach().clone()


class CachedSeq2Seq(nn.Module):
    """An encoder run once, then a decoder a token at a time with a KV cache of ``torch.cat``: each step's
    self-attention has one more key (a group of its own), while every step's cross-attention stacks."""

    def __init__(self, d: int = 16, h: int = 2, vocab: int = 30):
        super().__init__()
        self.semb, self.temb, self.pos = nn.Embedding(vocab, d), nn.Embedding(vocab, d), nn.Embedding(16, d)
        self.enc, self.sa, self.ca = _CachedAttn(d, h), _CachedAttn(d, h), _CachedAttn(d, h)
        self.head = nn.Linear(d, vocab)

    def encode(self, src):
        x = self.semb(src) + self.pos(torch.arange(src.size(1)))
        return x + self.enc(x, x)[0]

    def decode(self, tok, mem, at, past):
        y = self.temb(tok) + self.pos(torch.tensor([at]))
        a, past, w_self = self.sa(y, y, past)
        y = y + a
        c, _, w_cross = self.ca(y, mem)
        return self.head(y + c), past, w_self, w_cross


@pytest.mark.parametrize("batch,heads", [(2, 2), (1, 4)])
def test_a_cached_decoder_traced_in_one_block_draws_one_step(batch, heads, tmp_path):
    """A greedy loop with a KV cache in one capture block: the trace draws the decoder's self-attention of the
    step whose cross-attention it draws (the last), or leaves it out and says so. It drew the first step's
    (BOS over BOS, weight 1) beside the last step's cross-attention over the one target token given."""
    torch.manual_seed(batch + heads)
    model = CachedSeq2Seq(h=heads).eval()
    src = torch.randint(3, 30, (batch, 5))
    seen, toks = [], []
    with torch.no_grad(), capture_attention(model) as cap:
        mem = model.encode(src)
        tok, past = torch.ones(batch, 1, dtype=torch.long), None
        for t in range(3):
            toks.append(tok)
            out, past, w_self, w_cross = model.decode(tok, mem, t, past)
            seen.append((w_self, w_cross))
            tok = out[:, -1:].argmax(-1)
    names = [f"s{int(x)}" for x in src[0]]
    last = cap.trace(0, src_tokens=names, tgt_tokens=[f"t{int(toks[2][0, 0])}"])
    np.testing.assert_allclose(last.cross[0], seen[2][1][0].numpy(), atol=1e-6)  # the last step's
    assert last.dec_self is None  # (the last step's is 1 x 3: not over the one token given)
    notes = last.meta["capture_notes"]
    assert any(n.startswith("dec_self (sa) left out of the trace") for n in notes), notes
    whole = cap.trace(0, src_tokens=names, tgt_tokens=[f"t{int(t[0, 0])}" for t in toks])
    np.testing.assert_allclose(whole.dec_self[0, :, 2], seen[2][0][0, :, 0].numpy(), atol=1e-6)
    # its cross-attention at the same row of the target (it was left out: 1 x 5 beside the 3 tokens)
    np.testing.assert_allclose(whole.cross[0, :, 2], seen[2][1][0, :, 0].numpy(), atol=1e-6)
    assert not whole.cross[0, :, :2].any()
    assert whole.meta["query_rows"] == {"dec_self": [2], "cross": [2]}
    for t in (whole, cap.trace(0, src_tokens=names)):  # (no target tokens given: numbered, the same rows)
        assert t.meta["query_rows"] == {"dec_self": [2], "cross": [2]}
        path = tmp_path / "t.npz"
        t.save(path)
        back = AttentionTrace.load(path)
        np.testing.assert_array_equal(back.cross, t.cross)
        assert back.asks("cross").tolist() == [False, False, True]


class FoldedCacheStep(nn.Module):
    """fairseq's incremental step captured alone: the cache comes in as (B, H, T, d), is folded into the batch
    (``prev_key.view(bsz * heads, -1, head_dim)``, or heads first) and joined to the step's own key with
    ``torch.cat(dim=1)`` before ``bmm``. ``maps`` keeps the weights (B, H, 1, T + 1)."""

    def __init__(self, b: int, h: int, head_major: bool, dh: int = 4):
        super().__init__()
        self.b, self.h, self.dh, self.hm = b, h, dh, head_major
        d = h * dh
        self.emb, self.q, self.k, self.v = (
            nn.Embedding(20, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
        )
        self.maps: list[torch.Tensor] = []

    def fold(self, t):  # (B, 1, D) -> (B*H, 1, dh), batch-major or head-major
        t = t.view(self.b, -1, self.h, self.dh)
        return (t.permute(2, 0, 1, 3) if self.hm else t.transpose(1, 2)).reshape(self.b * self.h, -1, self.dh)

    def fold4(self, t):  # (B, H, T, dh) -> folded the same way
        return (t.transpose(0, 1) if self.hm else t).reshape(self.b * self.h, -1, self.dh)

    def forward(self, tok, prev_k, prev_v):
        x = self.emb(tok)
        q, k, v = self.fold(self.q(x)), self.fold(self.k(x)), self.fold(self.v(x))
        k = torch.cat([self.fold4(prev_k), k], 1)
        v = torch.cat([self.fold4(prev_v), v], 1)
        w = F.softmax(torch.bmm(q, k.transpose(1, 2)) / self.dh**0.5, dim=-1)
        lay = w.view(self.h, self.b, 1, -1).transpose(0, 1) if self.hm else w.view(self.b, self.h, 1, -1)
        self.maps.append(lay.detach().clone())
        return torch.bmm(w, v)


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("batch,heads", [(2, 2), (3, 1), (1, 4), (4, 4), (2, 3)])
def test_a_cache_handed_in_and_folded_into_the_batch_is_exact(head_major, batch, heads):
    """The folded cache's slots are one position per sequence, shared by the heads: the record is exact, its
    cached keys labelled. Batch-major it was flagged with a false reason ("the heads of one sequence see
    different keys"); head-major the flagged guess held other sequences' weights (off by up to 0.4)."""
    torch.manual_seed(batch * 7 + heads)
    model = FoldedCacheStep(batch, heads, head_major).eval()
    prev_k, prev_v = torch.randn(batch, heads, 3, 4), torch.randn(batch, heads, 3, 4)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (batch, 1)), prev_k, prev_v)
    (r,) = cap.records
    assert r.exact and r.flag is None, r.flag
    torch.testing.assert_close(r.probs, model.maps[0], rtol=0, atol=1e-6)
    assert r.kind == "dec_self"
    assert r.key_labels == ("<cache 0>", "<cache 1>", "<cache 2>", None)


def test_a_folded_cache_handed_in_already_folded_is_not_taken_as_exact():
    """A (B*H, T, d) cache handed in as it is: nothing says which rows are which sequence's, so the record is
    never exact silently (flagged, as before)."""
    torch.manual_seed(0)
    model = FoldedCacheStep(2, 2, head_major=True).eval()
    model.fold4 = lambda t: t  # the cache comes in folded
    prev_k, prev_v = torch.randn(4, 3, 4), torch.randn(4, 3, 4)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (2, 1)), prev_k, prev_v)
    (r,) = cap.records
    assert not r.exact and r.flag


class MaskedThenShifted(nn.Module):
    """A correct model whose scores go through arithmetic after the mask that changes no weight: a softmax by
    hand shifted by its row's logsumexp (left padding leaves rows with no allowed key), or Swin's 0 / -100
    mask then a temperature (the hidden keys stay 50 below the row's top)."""

    def __init__(self, how: str, d: int = 8, h: int = 2):
        super().__init__()
        self.how, self.h = how, h
        self.emb, self.qkv = nn.Embedding(30, d), nn.Linear(d, 3 * d)

    def forward(self, ids, am):
        x = self.emb(ids)
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.h, -1).transpose(1, 2) for z in self.qkv(x).split(d, -1))
        s = q @ k.transpose(-1, -2) / (d // self.h) ** 0.5
        if self.how == "logsumexp":
            allowed = am[:, None, None, :].bool() & torch.ones(t, t, dtype=torch.bool).tril()
            w = (
                s.masked_fill(~allowed, -1e4) - s.masked_fill(~allowed, -1e4).logsumexp(-1, keepdim=True)
            ).exp()
        else:
            w = ((s + (1 - am[:, None, None, :].float()) * -100.0) / 2.0).softmax(-1)
        return w @ v


@pytest.mark.parametrize("how", ["logsumexp", "temperature"])
@pytest.mark.parametrize("batch,heads", [(2, 2), (3, 1), (2, 4)])
def test_arithmetic_after_the_mask_that_changes_no_weight_is_not_warned_about(how, batch, heads):
    torch.manual_seed(batch + heads)
    model = MaskedThenShifted(how, h=heads).eval()
    ids = torch.randint(3, 30, (batch, 5))
    am = torch.ones(batch, 5, dtype=torch.long)
    am[1, :2] = 0 if how == "logsumexp" else 1  # left padding: rows with no allowed key
    am[1, 3:] = 1 if how == "logsumexp" else 0  # right padding
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, am)
    assert not [n for n in cap.notes if "soft-cap" in n], cap.notes


@pytest.mark.parametrize("pool", ["max", "amax"])
def test_a_max_token_over_features_handed_in_is_a_pooled_position(pool):
    torch.manual_seed(0)

    class MaxPool(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)

        def forward(self, x):
            top = x.max(dim=1, keepdim=True).values if pool == "max" else x.amax(dim=1, keepdim=True)
            x = torch.cat([top, x], dim=1)
            return (self.q(x[:, :1]) @ self.k(x).transpose(1, 2)).softmax(-1) @ x

    model = MaxPool().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 4, 8))
    (r,) = cap.records
    assert r.kind == "enc_self" and r.key_labels == ("<pooled 0>", None, None, None, None)


class ReshapedCacheStep(FoldedCacheStep):
    """The cache handed in sliced to its last W slots inside the fold, or laid out (B, T, H, d)."""

    def __init__(self, b: int, h: int, how: str):
        super().__init__(b, h, head_major=False)
        self.how = how

    def fold4(self, t):
        if self.how == "window":
            return t[:, :, -2:].reshape(self.b * self.h, -1, self.dh)
        return t.transpose(1, 2).reshape(self.b * self.h, -1, self.dh)  # (B, T, H, d)


@pytest.mark.parametrize("how", ["window", "time_second"])
@pytest.mark.parametrize("batch,heads", [(2, 2), (1, 3), (3, 1)])
def test_a_cache_handed_in_sliced_or_time_second_then_folded_is_exact(how, batch, heads):
    torch.manual_seed(batch * 3 + heads)
    model = ReshapedCacheStep(batch, heads, how).eval()
    shape = (batch, 3, heads, 4) if how == "time_second" else (batch, heads, 3, 4)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (batch, 1)), torch.randn(shape), torch.randn(shape))
    (r,) = cap.records
    assert r.exact and r.flag is None, r.flag
    torch.testing.assert_close(r.probs, model.maps[0], rtol=0, atol=1e-6)
    n = 2 if how == "window" else 3
    assert r.key_labels == (*(f"<cache {i}>" for i in range(n)), None)


class ZerosPlusQueries(nn.Module):
    """DAB-DETR's first decoder layer: ``tgt = torch.zeros(nq, bs, d)`` projected and added to the projection of
    queries made from learned anchor boxes (sine embedding, MLP); each head's query is its content part joined
    to its positional part (``cat(dim=3)``, the head dim doubles), heads folded sequence-first into
    ``(nq, bs*h, 2d/h)`` for ``bmm`` over image features. ``maps`` keeps the weights (B, H, nq, hw)."""

    def __init__(self, h: int, d: int = 16, nq: int = 5):
        super().__init__()
        self.h, self.d, self.nq = h, d, nq
        self.anchors = nn.Embedding(nq, 4)
        self.mlp = nn.Sequential(nn.Linear(2 * d, d), nn.ReLU(), nn.Linear(d, d))
        self.backbone = nn.Conv2d(3, d, 4, stride=4)
        self.content, self.pos, self.sine, self.k, self.kpos, self.v = (nn.Linear(d, d) for _ in range(6))
        self.maps: list[torch.Tensor] = []

    def forward(self, img, pos):
        d, h, nq = self.d, self.h, self.nq
        memory = self.backbone(img).flatten(2).permute(2, 0, 1)  # (hw, bs, d)
        hw, bs, _ = memory.shape
        pos = pos.flatten(2).permute(2, 0, 1)
        boxes = self.anchors.weight.unsqueeze(1).repeat(1, bs, 1).sigmoid()  # (nq, bs, 4)
        freq = 10000 ** (torch.arange(d // 2, dtype=torch.float32) / (d // 2))
        sine = torch.cat([(boxes[:, :, i : i + 1] / freq).sin() for i in range(4)], dim=2)  # (nq, bs, 2d)
        tgt = torch.zeros(nq, bs, d)
        q = self.content(tgt) + self.pos(self.mlp(sine))
        qs = self.sine(sine[..., :d]).view(nq, bs, h, d // h)
        q = torch.cat([q.view(nq, bs, h, d // h), qs], dim=3).view(nq, bs, 2 * d)
        k_pos = self.kpos(pos)
        k = self.k(memory) + k_pos
        k = torch.cat([k.view(hw, bs, h, d // h), k_pos.view(hw, bs, h, d // h)], dim=3).view(hw, bs, 2 * d)
        hd = 2 * d // h
        q = (q * hd**-0.5).contiguous().view(nq, bs * h, hd).transpose(0, 1)
        k = k.contiguous().view(hw, bs * h, hd).transpose(0, 1)
        v = self.v(memory).contiguous().view(hw, bs * h, d // h).transpose(0, 1)
        w = F.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        self.maps.append(w.view(bs, h, nq, hw).detach().clone())
        return torch.bmm(w, v)


@pytest.mark.parametrize("batch,heads", [(2, 2), (1, 2), (3, 4), (4, 4), (2, 1)])
def test_learned_queries_added_to_a_projection_of_zeros_keep_their_layout(batch, heads):
    """The zeros have no positions: the queries are the learned ones. The record was (B*H, 1, nq, hw), each
    head drawn as a sequence of its own, exact and unflagged."""
    torch.manual_seed(batch * 5 + heads)
    model = ZerosPlusQueries(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 3, 16, 16), torch.randn(1, 16, 4, 4).expand(batch, -1, -1, -1))
    (r,) = cap.records
    assert r.exact, r.flag
    torch.testing.assert_close(r.probs, model.maps[0], rtol=0, atol=1e-6)
    assert r.kind == "cross"


class Deformable(nn.Module):
    """Deformable DETR's attention in PyTorch alone: a softmax over each query's sampling points, whose weights
    multiply values ``F.grid_sample`` takes at predicted offsets."""

    def __init__(self, d: int = 16, heads: int = 2, points: int = 4):
        super().__init__()
        self.h, self.p, self.d = heads, points, d
        self.backbone = nn.Conv2d(3, d, 4, stride=4)
        self.query = nn.Embedding(5, d)
        self.offsets = nn.Linear(d, heads * points * 2)
        self.weights = nn.Linear(d, heads * points)
        self.value = nn.Linear(d, d)

    def forward(self, img):
        f = self.backbone(img)
        n, _, hh, ww = f.shape
        q = self.query.weight[None].expand(n, -1, -1)
        lq = q.shape[1]
        value = self.value(f.flatten(2).transpose(1, 2)).view(n, hh * ww, self.h, self.d // self.h)
        loc = self.offsets(q).view(n, lq, self.h, self.p, 2).tanh()
        aw = F.softmax(self.weights(q).view(n, lq, self.h, self.p), -1)
        v = value.flatten(2).transpose(1, 2).reshape(n * self.h, self.d // self.h, hh, ww)
        grid = loc.transpose(1, 2).flatten(0, 1)  # (n*h, lq, p, 2)
        s = F.grid_sample(v, grid, align_corners=False)  # (n*h, dh, lq, p)
        aw = aw.transpose(1, 2).reshape(n * self.h, 1, lq, self.p)
        return (s * aw).sum(-1)


def test_deformable_attention_is_said_not_recorded():
    """No query-key scores, so no map; but the weights multiply values, so it is a warning naming the module
    (it was information calling it a vocabulary or router distribution, on no page)."""
    torch.manual_seed(0)
    model = Deformable().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 3, 16, 16))
    assert not cap.records
    (note,) = cap.notes
    assert "grid_sample" in note and "deformable" in note
    assert not [n for n in cap.skipped if "vocabulary" in n.reason]
