"""Capture and traces of styles found by this stop's probes, each test naming its own. Every test here failed on
the code before its fix, but the bounds that keep the behaviour before it where the tokens given are the
columns themselves."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

VOCAB = 40


class ShiftedRight(nn.Module):
    """A decoder whose input is shifted right by a vector, not a token: ``cat([start, emb(ids)[:, :-1]], 1)``,
    the start a vector of zeros (``start="zeros"``) or a learned one (``start="param"``), then causal
    self-attention. Its maps' columns are the start and the first L - 1 of the L ids."""

    def __init__(self, heads: int, start: str, hd: int = 4):
        super().__init__()
        self.h, self.start = heads, start
        d = heads * hd
        self.emb = nn.Embedding(VOCAB, d)
        self.bos = nn.Parameter(torch.randn(1, 1, d))
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.truths: list[torch.Tensor] = []

    def forward(self, ids):
        b, n = ids.shape
        x = self.emb(ids)[:, :-1]
        first = torch.zeros(b, 1, x.shape[-1]) if self.start == "zeros" else self.bos.expand(b, 1, -1)
        x = torch.cat([first, x], 1)
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        w = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~causal, float("-inf")).softmax(-1)
        self.truths.append(w.detach().clone())
        return self.o((w @ v).transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize("start", ["zeros", "param"])
@pytest.mark.parametrize("heads", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 3])
def test_decoder_shifted_right_by_a_vector_draws_each_token_at_its_column(start, heads, batch):
    """The whole sequence's tokens given: the start is drawn at column 0 under its label and token i at column
    i + 1, the last token at none (said). Before, the L tokens were drawn at the L columns, the first token over
    the start vector and each token over the one before it."""
    torch.manual_seed(heads)
    m = ShiftedRight(heads, start).eval()
    ids = torch.randint(1, VOCAB, (batch, 5))
    with torch.no_grad(), capture_attention(m) as cap:
        m(ids)
    (rec,) = cap.records
    assert rec.kind == "dec_self" and rec.exact
    torch.testing.assert_close(rec.probs, m.truths[0])
    label = rec.key_labels[0]
    assert label is not None and rec.key_labels[1:] == (None,) * 4
    for b in range(batch):
        tokens = [f"s{b}t{i}" for i in range(5)]
        tr = cap.trace(b, tgt_tokens=tokens)
        assert tr.tgt_tokens == (label, *tokens[:4])
        np.testing.assert_allclose(tr.dec_self[0], m.truths[0][b].numpy(), rtol=1e-6, atol=1e-7)
        said = " ".join(tr.meta.get("capture_notes", []))
        assert "shifted right" in said and repr(tokens[4]) in said


def test_shifted_right_with_the_columns_own_tokens_given_is_drawn_as_given():
    """Bound: the four tokens the columns hold given (not the whole sequence): drawn as before, the start
    under its label, and nothing said about a shift."""
    torch.manual_seed(0)
    m = ShiftedRight(2, "zeros").eval()
    ids = torch.randint(1, VOCAB, (2, 5))
    with torch.no_grad(), capture_attention(m) as cap:
        m(ids)
    tr = cap.trace(1, tgt_tokens=["a", "b", "c", "d"])
    assert tr.tgt_tokens == (cap.records[0].key_labels[0], "a", "b", "c", "d")
    assert "shifted right" not in " ".join(tr.meta.get("capture_notes", []))


class ClsFirst(nn.Module):
    """Bound: a learned [CLS] prepended to all L tokens (no shift): L + 1 columns, L of them the tokens."""

    def __init__(self, heads: int = 2, hd: int = 4):
        super().__init__()
        d = heads * hd
        self.h = heads
        self.emb = nn.Embedding(VOCAB, d)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        x = torch.cat([self.cls.expand(b, 1, -1), self.emb(ids)], 1)
        q, k, v = (t.view(b, n + 1, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return ((q @ k.transpose(-1, -2)).softmax(-1) @ v).sum()


def test_cls_prepended_to_every_token_keeps_its_tokens_in_order():
    torch.manual_seed(0)
    m = ClsFirst().eval()
    ids = torch.randint(1, VOCAB, (2, 4))
    with torch.no_grad(), capture_attention(m) as cap:
        m(ids)
    tr = cap.trace(0, src_tokens=["a", "b", "c", "d"])
    assert tr.src_tokens[1:] == ("a", "b", "c", "d") and tr.src_tokens[0] == cap.records[0].key_labels[0]
    assert "shifted right" not in " ".join(tr.meta.get("capture_notes", []))


class GraphAttentionLayer(nn.Module):
    """pyGAT's layer as its repository writes it: ``e_ij = LeakyReLU(a^T [W h_i || W h_j])`` over every pair,
    made by tiling (``repeat_interleave`` and ``repeat``, concatenated, viewed (N, N, 2F)), masked by the
    adjacency with ``torch.where``, softmax over dim 1. ``truths``: its weights (N, N)."""

    def __init__(self, fin: int, fout: int, concat: bool = True):
        super().__init__()
        self.fout, self.concat = fout, concat
        self.W = nn.Parameter(torch.randn(fin, fout) * 0.5)
        self.a = nn.Parameter(torch.randn(2 * fout, 1) * 0.5)
        self.leakyrelu = nn.LeakyReLU(0.2)
        self.truths: list[torch.Tensor] = []

    def forward(self, h, adj):
        Wh = torch.mm(h, self.W)
        n = Wh.size()[0]
        pairs = torch.cat([Wh.repeat_interleave(n, dim=0), Wh.repeat(n, 1)], dim=1).view(n, n, 2 * self.fout)
        e = self.leakyrelu(torch.matmul(pairs, self.a).squeeze(2))
        attention = torch.softmax(torch.where(adj > 0, e, -9e15 * torch.ones_like(e)), dim=1)
        self.truths.append(attention.detach().clone())
        h_prime = torch.matmul(attention, Wh)
        return torch.nn.functional.elu(h_prime) if self.concat else h_prime


class GAT(nn.Module):
    def __init__(self, heads: int, fin: int = 5, hid: int = 4, classes: int = 3):
        super().__init__()
        self.attentions = nn.ModuleList(GraphAttentionLayer(fin, hid) for _ in range(heads))
        self.out_att = GraphAttentionLayer(hid * heads, classes, concat=False)

    def forward(self, x, adj):
        x = torch.cat([att(x, adj) for att in self.attentions], dim=1)
        return torch.log_softmax(torch.nn.functional.elu(self.out_att(x, adj)), dim=1)


@pytest.mark.parametrize("heads", [1, 2, 3])
@pytest.mark.parametrize("nodes", [4, 7])
def test_gat_over_concatenated_pairs_is_recorded_exactly(heads, nodes):
    """pyGAT: each layer's weights recorded exactly, node i's row over its neighbours j, the adjacency its
    mask, self-attention over the graph's nodes; its head modules joined as the heads of one record. Before,
    the scores of paired features were not traced to queries and keys: the head layers were warnings ("could
    not lay them out") and the output layer an information note that called its weights no attention."""
    torch.manual_seed(nodes * 10 + heads)
    m = GAT(heads).eval()
    x = torch.randn(nodes, 5)
    adj = ((torch.rand(nodes, nodes) > 0.5).float() + torch.eye(nodes)).clamp(max=1)
    with torch.no_grad(), capture_attention(m) as cap:
        m(x, adj)
    assert cap.notes == [] and not [n for n in cap.skipped if n.module != ""]
    first = [r for r in cap.records if r.name.startswith("attentions")]
    (last,) = [r for r in cap.records if r.name == "out_att"]
    assert sum(int(r.probs.shape[1]) for r in first) == heads
    got = torch.cat([r.probs[0] for r in first])  # (heads, N, N)
    torch.testing.assert_close(got, torch.stack([a.truths[0] for a in m.attentions]))
    torch.testing.assert_close(last.probs[0, 0], m.out_att.truths[0])
    for r in [*first, last]:
        assert r.exact and r.kind == "enc_self"
        assert r.mask is not None and torch.equal(r.mask[0], adj > 0)


class ConcatNonLocal(nn.Module):
    """The concatenation non-local block (Wang et al. 2018, AlexHwu/Non-local_pytorch): ``f = ReLU(W_f [theta_i;
    phi_j])`` over the tiled pairs, by a 1x1 conv over the channels, divided by N (``softmax=False``, as the
    paper) or softmaxed over j, then ``f @ g``; a classifier's softmax after it."""

    def __init__(self, softmax: bool, c: int = 8, ci: int = 4):
        super().__init__()
        self.softmax, self.ci = softmax, ci
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.g, self.theta, self.phi = (nn.Conv2d(c, ci, 1) for _ in range(3))
        self.W_f = nn.Sequential(nn.Conv2d(2 * ci, 1, 1), nn.ReLU())
        self.W_z, self.fc = nn.Conv2d(ci, c, 1), nn.Linear(c, 4)
        self.truths: list[torch.Tensor] = []

    def forward(self, img):
        x = self.stem(img)
        b = x.size(0)
        g_x = self.g(x).view(b, self.ci, -1).permute(0, 2, 1)
        th = self.theta(x).view(b, self.ci, -1, 1)
        ph = self.phi(x).view(b, self.ci, 1, -1)
        h, w = th.size(2), ph.size(3)
        f = self.W_f(torch.cat([th.repeat(1, 1, 1, w), ph.repeat(1, 1, h, 1)], dim=1))
        f = f.view(b, h, w)
        f = f.softmax(-1) if self.softmax else f / w
        self.truths.append(f.detach().clone())
        y = torch.matmul(f, g_x).permute(0, 2, 1).contiguous().view(b, self.ci, *x.size()[2:])
        return torch.softmax(self.fc((self.W_z(y) + x).mean((2, 3))), -1)


@pytest.mark.parametrize("batch", [1, 3])
def test_concatenation_non_local_block_is_recorded_or_said(batch):
    """With a softmax over its pairs' scores: an exact record (B, 1, N, N) over the image's positions. Without
    one (the paper's f / N): the warning scores that multiply values without a softmax get, naming the block,
    where before a model with another softmax (its classifier's) said nothing of it."""
    torch.manual_seed(batch)
    img = torch.randn(batch, 3, 3, 4)
    m = ConcatNonLocal(True).eval()
    with torch.no_grad(), capture_attention(m) as cap:
        m(img)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and tuple(rec.probs.shape) == (batch, 1, 12, 12)
    torch.testing.assert_close(rec.probs[:, 0], m.truths[0])
    m = ConcatNonLocal(False).eval()
    with torch.no_grad(), capture_attention(m) as cap:
        m(img)
    assert cap.records == [] and len(cap.notes) == 1
    assert cap.notes[0].startswith("(model) (") and "multiply values without a softmax" in cap.notes[0]


class CachedCrossStep(nn.Module):
    """An encoder-decoder's later decoding step, written as users write it around their own model: the
    cross-attention's keys and values projected once from the encoder's output before decoding (HF's legacy
    ``past_key_value[2:]``, Whisper's ``kv_cache``) and handed to every step, ``(B, H, S, d)`` as a view of the
    projection (``layout="view"``), made contiguous (``"contiguous"``), or folded ``(B * H, S, d)`` for ``bmm``
    (``"bmm"``, BART's). ``truths``: the step's weights (B, H, 1, S)."""

    def __init__(self, heads: int, layout: str, hd: int = 4):
        super().__init__()
        self.h, self.hd, self.layout = heads, hd, layout
        d = heads * hd
        self.src_emb, self.tgt_emb = nn.Embedding(VOCAB, d), nn.Embedding(VOCAB, d)
        self.q_proj, self.k_proj, self.v_proj, self.out = (nn.Linear(d, d) for _ in range(4))
        self.truths: list[torch.Tensor] = []

    def cross_kv(self, src):
        b, s = src.shape
        enc = self.src_emb(src)
        k, v = (p(enc).view(b, s, self.h, self.hd).transpose(1, 2) for p in (self.k_proj, self.v_proj))
        return (k.contiguous(), v.contiguous()) if self.layout != "view" else (k, v)

    def forward(self, tok, k, v):
        b, h, s, hd = k.shape
        q = self.q_proj(self.tgt_emb(tok)).view(b, 1, h, hd).transpose(1, 2)
        if self.layout == "bmm":
            scores = torch.bmm(q.reshape(b * h, 1, hd), k.reshape(b * h, s, hd).transpose(1, 2)) * hd**-0.5
            w = scores.softmax(-1)
            self.truths.append(w.view(b, h, 1, s).detach().clone())
            y = torch.bmm(w, v.reshape(b * h, s, hd)).view(b, h, 1, hd)
        else:
            w = (q @ k.transpose(-1, -2) * hd**-0.5).softmax(-1)
            self.truths.append(w.detach().clone())
            y = w @ v
        return self.out(y.transpose(1, 2).reshape(b, 1, h * hd))


@pytest.mark.parametrize("layout", ["view", "contiguous", "bmm"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 2), (4, 4), (2, 3)])
def test_cross_attention_over_keys_projected_before_the_step_is_exact(layout, batch, heads):
    """A step whose cross-attention reads keys projected before the capture: an exact cross record, each
    sequence's row its own, every head over the same source positions. Before, a view of the keys was read
    with its head features as positions ("the product multiplies features of different positions", not
    recorded), and a contiguous cache gave each head keys of its own ("the heads of one sequence see
    different keys"); where the source length equalled the batch, the layout was read from the shape."""
    torch.manual_seed(batch * 10 + heads)
    m = CachedCrossStep(heads, layout).eval()
    src = torch.randint(1, VOCAB, (batch, 5))
    with torch.no_grad():
        k, v = m.cross_kv(src)
        with capture_attention(m) as cap:
            m(torch.randint(1, VOCAB, (batch, 1)), k, v)
    assert cap.notes == []
    (rec,) = cap.records
    assert rec.exact and rec.kind == "cross" and tuple(rec.probs.shape) == (batch, heads, 1, 5)
    torch.testing.assert_close(rec.probs, m.truths[0])
    for b in range(batch):
        np.testing.assert_allclose(cap.trace(b).cross[0], m.truths[0][b].numpy(), rtol=1e-6, atol=1e-7)


def _subsequent_chunk_mask(size: int, chunk: int, left_chunks: int = -1) -> torch.Tensor:
    """WeNet's ``subsequent_chunk_mask``: each frame sees its whole chunk and the chunks before it (``left_chunks``
    of them, all where -1)."""
    pos = torch.arange(size)
    block_end = (torch.div(pos, chunk, rounding_mode="trunc") + 1) * chunk
    ret = pos[None, :] < block_end[:, None]
    if left_chunks >= 0:
        start = ((torch.div(pos, chunk, rounding_mode="trunc") - left_chunks) * chunk).clamp(min=0)
        ret = ret & (pos[None, :] >= start[:, None])
    return ret


class ChunkedEncoder(nn.Module):
    """ESPnet's and WeNet's MultiHeadedAttention in a streaming Conformer's encoder, trained with a chunk mask
    (padding and ``subsequent_chunk_mask``): ``scores.masked_fill(mask.eq(0), -inf)``, a softmax, then the
    weights masked to 0 again."""

    def __init__(self, heads: int, hd: int = 4):
        super().__init__()
        d = heads * hd
        self.h, self.hd = heads, hd
        self.inp = nn.Linear(10, d)
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))

    def forward(self, feats, lens, left_chunks):
        b, t, _ = feats.shape
        x = self.inp(feats)
        mask = (torch.arange(t)[None] < lens[:, None]).unsqueeze(1) & _subsequent_chunk_mask(
            t, 4, left_chunks
        )
        q, k, v = (f(x).view(b, -1, self.h, self.hd).transpose(1, 2) for f in (self.q, self.k, self.v))
        hide = mask.unsqueeze(1).eq(0)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(self.hd)).masked_fill(hide, -float("inf"))
        return torch.softmax(scores, dim=-1).masked_fill(hide, 0.0) @ v


@pytest.mark.parametrize("heads", [1, 2])
def test_a_chunk_mask_causal_by_blocks_is_said_to_read_as_an_encoders_too(heads):
    """A streaming encoder's chunk mask with every earlier chunk seen is causal by blocks, as a decoder's over
    frames is: recorded dec_self, and a warning says a streaming encoder's reads alike (and how to name it).
    Before, dec_self with no word. With one chunk of left context, the same; the kind given by kinds=, no
    word."""
    torch.manual_seed(heads)
    m = ChunkedEncoder(heads).eval()
    feats, lens = torch.randn(2, 12, 10), torch.tensor([12, 9])
    with torch.no_grad(), capture_attention(m) as cap:
        m(feats, lens, -1)
    (rec,) = cap.records
    assert rec.kind == "dec_self" and rec.exact and len(cap.notes) == 1
    assert "causal by blocks" in cap.notes[0] and "'enc_self'" in cap.notes[0]
    with torch.no_grad(), capture_attention(m, kinds={"": "enc_self"}) as cap:
        m(feats, lens, -1)
    assert cap.records[0].kind == "enc_self" and cap.notes == []
    with torch.no_grad(), capture_attention(m) as cap:  # (one chunk of left context: causal by blocks too)
        m(feats, lens, 1)
    assert cap.records[0].kind == "dec_self" and len(cap.notes) == 1 and "causal by blocks" in cap.notes[0]


class AutoCorrelation(nn.Module):
    """Autoformer's Auto-Correlation (thuml/Autoformer): period-based dependencies by FFT, a softmax over the top-k
    delays' mean correlations, then the values shifted by each delay weighed and summed: by ``gather`` (its
    inference path) or by ``torch.roll`` with the weight repeated to the values' shape (its training path)."""

    def __init__(self, heads: int, roll: bool, hd: int = 4):
        super().__init__()
        self.h, self.roll = heads, roll
        d = heads * hd
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (f(x).view(b, n, self.h, -1) for f in (self.q, self.k, self.v))
        q_fft = torch.fft.rfft(q.permute(0, 2, 3, 1).contiguous(), dim=-1)
        k_fft = torch.fft.rfft(k.permute(0, 2, 3, 1).contiguous(), dim=-1)
        corr = torch.fft.irfft(q_fft * torch.conj(k_fft), n=n, dim=-1)
        values = v.permute(0, 2, 3, 1).contiguous()  # (B, H, E, L)
        top_k = int(math.log(n))
        weights, delay = torch.topk(corr.mean(1).mean(1), top_k, dim=-1)  # (B, k)
        tmp_corr = torch.softmax(weights, dim=-1)
        agg = torch.zeros_like(values)
        if self.roll:
            for i in range(top_k):
                pattern = torch.roll(values, -int(delay[0, i]), -1)
                w = (
                    tmp_corr[:, i]
                    .unsqueeze(1)
                    .unsqueeze(1)
                    .unsqueeze(1)
                    .repeat(1, self.h, values.shape[2], n)
                )
                agg = agg + pattern * w
        else:
            index = torch.arange(n)[None, None, None].repeat(b, self.h, values.shape[2], 1)
            doubled = values.repeat(1, 1, 1, 2)
            for i in range(top_k):
                at = index + delay[:, i][:, None, None, None].repeat(1, self.h, values.shape[2], n)
                agg = agg + torch.gather(doubled, -1, at) * tmp_corr[:, i][:, None, None, None]
        y = agg.permute(0, 3, 1, 2).reshape(b, n, -1)
        return torch.softmax(self.head(y.mean(1)), -1)  # (a classifier's softmax besides)


@pytest.mark.parametrize("roll", [False, True])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 2)])
def test_autoformer_weights_over_time_delays_are_a_warning(roll, batch, heads):
    """The softmax over the top-k delays weighs copies of the values shifted by each delay: attention over
    shifts, which has no query-key map to record. A warning says so, where before an information note called
    it no attention (a 2-D softmax) and the model seemed to have none."""
    torch.manual_seed(batch)
    m = AutoCorrelation(heads, roll).eval()
    with torch.no_grad(), capture_attention(m) as cap:
        m(torch.randn(batch, 16, heads * 4))
    assert cap.records == [] and len(cap.notes) == 1, cap.notes
    assert f"({batch}, 2): not recorded" in cap.notes[0] and "time delays" in cap.notes[0]
    assert [n.shape for n in cap.skipped] == [(batch, 3)]  # (the classifier's: information)


class RtdlAttention(nn.Module):
    """rtdl's MultiheadAttention: heads folded ``(B * H, n, d)`` for the product; ``truths`` its weights."""

    def __init__(self, d: int, heads: int, truths: list):
        super().__init__()
        self.h, self.truths = heads, truths
        self.W_q, self.W_k, self.W_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def _reshape(self, x):
        b, n, d = x.shape
        return x.reshape(b, n, self.h, d // self.h).transpose(1, 2).reshape(b * self.h, n, d // self.h)

    def forward(self, x_q, x_kv):
        b, n = x_kv.shape[:2]
        q, k, v = self._reshape(self.W_q(x_q)), self._reshape(self.W_k(x_kv)), self._reshape(self.W_v(x_kv))
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(k.shape[-1]), dim=-1)
        self.truths.append(a.view(b, self.h, -1, n).detach().clone())
        y = (a @ v).view(b, self.h, -1, v.shape[-1]).transpose(1, 2)
        return y.reshape(b, -1, self.h * v.shape[-1])


class RtdlFTTransformer(nn.Module):
    """rtdl's FT-Transformer (Yandex, ``bin/ft_transformer.py``) as its repository writes it: a ones column joined
    before the numerical features, ``x = weight[None] * x_num[:, :, None]`` (the ones column's row of the weight
    is the [CLS]), categorical embeddings after, a bias per token (none on the [CLS]); the last layer asks with
    the [CLS] alone (``x[:, :1]``). ``truths``: each layer's weights (B, H, q, n)."""

    def __init__(self, heads: int, cats: bool, n_num: int = 4, hd: int = 4, layers: int = 2):
        super().__init__()
        d = heads * hd
        self.cats = (3, 5, 4) if cats else ()
        self.register_buffer(
            "category_offsets", torch.tensor([0, *self.cats[:-1]]).cumsum(0) if cats else None
        )
        self.category_embeddings = nn.Embedding(sum(self.cats), d) if cats else None
        self.weight = nn.Parameter(torch.randn(n_num + 1, d))
        self.bias = nn.Parameter(torch.randn(n_num + len(self.cats), d))
        self.truths: list[torch.Tensor] = []
        self.layers = nn.ModuleList(RtdlAttention(d, heads, self.truths) for _ in range(layers))

    def forward(self, x_num, x_cat):
        x_num = torch.cat([torch.ones(len(x_num), 1), x_num], dim=1)
        x = self.weight[None] * x_num[:, :, None]
        if self.category_embeddings is not None:
            x = torch.cat([x, self.category_embeddings(x_cat + self.category_offsets[None])], dim=1)
        x = x + torch.cat([torch.zeros(1, self.bias.shape[1]), self.bias])[None]
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            y = layer(x[:, :1] if last else x, x)
            x = y if last else x + y
        return x[:, 0]


@pytest.mark.parametrize("cats", [True, False])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (4, 4), (3, 2)])
def test_rtdl_feature_tokens_are_positions_and_its_cls_is_learned(cats, batch, heads):
    """Each numerical feature scales a learned vector of its own: a token. The first layer is exact
    self-attention over [CLS], the feature tokens and the categorical ones, its [CLS] labelled as the
    weight's row; the last layer's [CLS] query over them, one of that sequence's positions, is enc_self and
    labelled too. Before, every feature token of a row
    was one position (the first layer not recorded: "one position is several queries"), and the last layer
    drew the [CLS] as a token (with categories: dec_self, as a decoding step over its cache)."""
    torch.manual_seed(batch * 10 + heads)
    m = RtdlFTTransformer(heads, cats).eval()
    x_num = torch.randn(batch, 4)
    x_cat = torch.stack([torch.randint(0, c, (batch,)) for c in (3, 5, 4)], 1)
    with torch.no_grad(), capture_attention(m) as cap:
        m(x_num, x_cat)
    assert cap.notes == []
    first, last = cap.records
    n = 8 if cats else 5
    assert first.exact and first.kind == "enc_self" and tuple(first.probs.shape) == (batch, heads, n, n)
    torch.testing.assert_close(first.probs, m.truths[0])
    assert first.key_labels == ("<weight 0>", *(None,) * (n - 1)) and first.query_labels == first.key_labels
    assert last.exact and tuple(last.probs.shape) == (batch, heads, 1, n)
    torch.testing.assert_close(last.probs, m.truths[1])
    assert last.kind == "enc_self"  # (the [CLS] is a position of the sequence the first layer attended over)
    assert last.query_labels == ("<weight 0>",) and last.key_labels == first.key_labels
    names = [f"f{i}" for i in range(n - 1)]
    tr = cap.trace(batch - 1, src_tokens=names)
    assert tr.src_tokens == ("<weight 0>", *names)
    np.testing.assert_allclose(tr.enc_self[0], m.truths[0][batch - 1].numpy(), rtol=1e-6, atol=1e-7)


class GraphormerNodes(nn.Module):
    """Graphormer's node features (microsoft/Graphormer): each node's F atom features looked up in one table and
    summed (``atom_encoder(x).sum(dim=-2)`` of ids (B, N, F)), a learned graph token before them; padded nodes
    (id 0, ``padding_idx``) hidden from the keys. ``truths``: the weights (B, H, N + 1, N + 1)."""

    def __init__(self, heads: int, hd: int = 4):
        super().__init__()
        d = heads * hd
        self.h = heads
        self.atom_encoder = nn.Embedding(21, d, padding_idx=0)
        self.graph_token = nn.Embedding(1, d)
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
        self.truths: list[torch.Tensor] = []

    def forward(self, x):
        b, n = x.shape[:2]
        h = torch.cat(
            [self.graph_token.weight.unsqueeze(0).repeat(b, 1, 1), self.atom_encoder(x).sum(dim=-2)], 1
        )
        q, k, v = (f(h).view(b, n + 1, self.h, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        pad = torch.cat([torch.zeros(b, 1, dtype=torch.bool), x[:, :, 0].eq(0)], 1)
        s = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(pad[:, None, None, :], float("-inf"))
        a = s.softmax(-1)
        self.truths.append(a.detach().clone())
        return (a @ v).transpose(1, 2).reshape(b, n + 1, -1)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 2), (4, 4)])
def test_graphormer_nodes_summed_from_their_atom_features_are_tokens(batch, heads):
    """Each node (its atom features' embeddings summed) is a token of its graph, the graph token a learned
    position: a trace given the nodes' names draws them. Before, every node was labelled a position the model
    made (``<pooled i>``), and a trace given the N node names refused ("over other positions")."""
    torch.manual_seed(batch * 10 + heads)
    m = GraphormerNodes(heads).eval()
    x = torch.randint(1, 21, (batch, 5, 3))
    x[-1, 3:] = 0  # (the last graph has 3 nodes)
    with torch.no_grad(), capture_attention(m) as cap:
        m(x)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and cap.notes == []
    assert rec.key_labels == ("<graph_token 0>", *(None,) * 5)
    torch.testing.assert_close(rec.probs, m.truths[0])
    names = [f"n{i}" for i in range(5)]
    for b in range(batch):
        tr = cap.trace(b, src_tokens=names)
        assert tr.src_tokens == ("<graph_token 0>", *names)
        np.testing.assert_allclose(tr.enc_self[0], m.truths[0][b].numpy(), rtol=1e-6, atol=1e-7)


class CoCaPooler(nn.Module):
    """CoCa (lucidrains' coca-pytorch): learned ``img_queries`` pool the image tokens; the first pooled row is
    the contrastive embedding and the others (``pooled[:, 1:]``) are the keys of the text's cross-attention."""

    def __init__(self, d: int = 16, n: int = 4):
        super().__init__()
        self.img_queries = nn.Parameter(torch.randn(n + 1, d))
        self.pq, self.pk, self.tq, self.tk = (nn.Linear(d, d) for _ in range(4))
        self.emb = nn.Embedding(10, d)

    def forward(self, img_tokens, text):
        q = self.img_queries[None].expand(img_tokens.shape[0], -1, -1)
        pooled = (self.pq(q) @ self.pk(img_tokens).transpose(1, 2)).softmax(-1) @ img_tokens
        image_embed, image_tokens = pooled[:, 0], pooled[:, 1:]
        w = (self.tq(self.emb(text)) @ self.tk(image_tokens).transpose(1, 2)).softmax(-1)
        return w @ image_tokens, image_embed


def test_learned_rows_are_named_by_their_row_in_every_record():
    """The keys ``pooled[:, 1:]`` are the pooler's queries 1 to 4: named ``<img_queries 1>`` to ``<img_queries
    4>``, as the pooler's record names its queries. They were numbered from 0 in the order they came, so one
    position had two names and ``<img_queries 0>`` of the cross-attention was a row it never read."""
    torch.manual_seed(0)
    m = CoCaPooler().eval()
    with torch.no_grad(), capture_attention(m) as cap:
        m(torch.randn(2, 6, 16), torch.randint(0, 10, (2, 3)))
    pool, cross = cap.records
    assert pool.query_labels == tuple(f"<img_queries {i}>" for i in range(5))
    assert cross.kind == "cross" and cross.key_labels == pool.query_labels[1:]


class TorchEncoderViT(nn.Module):
    """A ViT tutorial on torch's own encoder: Conv2d patches, a [CLS] parameter before them, learned positions,
    then ``nn.TransformerEncoder`` (``stack``) or one ``nn.TransformerEncoderLayer``."""

    def __init__(self, heads: int, norm_first: bool, stack: bool, d: int = 24):
        super().__init__()
        self.conv = nn.Conv2d(3, d, 4, 4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d))
        self.pos_embedding = nn.Parameter(torch.randn(1, 17, d))
        layer = nn.TransformerEncoderLayer(
            d, heads, 2 * d, dropout=0.0, batch_first=True, norm_first=norm_first
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False) if stack else layer

    def forward(self, img):
        x = self.conv(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embedding
        return self.encoder(x)[:, 0]


@pytest.mark.parametrize(("norm_first", "stack"), [(True, True), (False, True), (False, False)])
@pytest.mark.parametrize("heads", [2, 3])
def test_a_cls_before_torchs_own_encoder_is_labelled(norm_first, stack, heads):
    """torch's encoder layers run as torch runs them, recorded from their arguments: the [CLS] among their
    queries and keys is labelled, as it is where a model's own block calls MultiheadAttention. It was drawn as
    patch #0: the layer's norm and transpose, made by the record, had no positions."""
    torch.manual_seed(heads)
    m = TorchEncoderViT(heads, norm_first, stack).eval()
    with torch.no_grad(), capture_attention(m) as cap:
        m(torch.randn(2, 3, 16, 16))
    assert len(cap.records) == (2 if stack else 1) and cap.notes == []
    for r in cap.records:
        assert r.exact and r.kind == "enc_self"
        assert r.key_labels == ("<cls_token 0>", *(None,) * 16) and r.query_labels == r.key_labels
    assert cap.trace(1).src_tokens[:2] == ("<cls_token 0>", "#0")


class WindowAttention(nn.Module):
    """Swin's window attention: the patch grid cut into windows folded into the batch, ``(B * windows, ws *
    ws, C)``, qkv permuted ``(3, B_, H, N, d)``."""

    def __init__(self, heads: int, c: int = 16, ws: int = 4):
        super().__init__()
        self.h, self.ws = heads, ws
        self.embed = nn.Conv2d(3, c, 2, 2)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, img):
        x = self.embed(img).permute(0, 2, 3, 1)  # (B, 8, 8, C): 64 patches, 4 windows of 16
        b, hg, wg, c = x.shape
        ws = self.ws
        w = x.view(b, hg // ws, ws, wg // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        qkv = self.qkv(w).reshape(w.shape[0], ws * ws, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        a = ((qkv[0] * (c // self.h) ** -0.5) @ qkv[1].transpose(-2, -1)).softmax(-1)
        return self.proj((a @ qkv[2]).transpose(1, 2).reshape(-1, ws * ws, c)).mean()


@pytest.mark.parametrize("batch", [1, 2])
def test_windows_of_one_image_are_said_to_be_its_parts(batch):
    """With one image as with two, the records' rows are windows of the images (rows_of says which image), and
    a trace of an image, which draws one window's map, says the maps are over more rows than images. With one
    image, rows_of was None and the trace drew window 0 as the image, with no word."""
    torch.manual_seed(batch)
    m = WindowAttention(2).eval()
    with torch.no_grad(), capture_attention(m) as cap:
        m(torch.randn(batch, 3, 16, 16))
    (rec,) = cap.records
    rows, n = cap.rows_of(rec)
    assert n == batch and rows.tolist() == [b for b in range(batch) for _ in range(4)]
    said = cap.trace(0).meta.get("capture_notes", [])
    assert any(f"over {4 * batch} rows for the {batch} sequence" in s for s in said), said


class ShowAttendTell(nn.Module):
    """Show, Attend and Tell's decoder (sgrvinod's tutorial): the batch sorted by caption length, shrunk each step
    to the captions still running (``encoder_out[:batch_size_t]``), additive attention over the image's cells.
    Returns the weights of every step in the sorted order, and the order."""

    def __init__(self, e: int = 12, dd: int = 24, a: int = 20, vocab: int = 30):
        super().__init__()
        self.encoder_att, self.decoder_att, self.full_att = nn.Linear(e, a), nn.Linear(dd, a), nn.Linear(a, 1)
        self.embedding = nn.Embedding(vocab, 16)
        self.decode_step = nn.LSTMCell(16 + e, dd)
        self.init_h, self.init_c = nn.Linear(e, dd), nn.Linear(e, dd)

    def forward(self, encoder_out, caps, caplens):
        b = encoder_out.size(0)
        caplens, sort_ind = caplens.sort(dim=0, descending=True)
        encoder_out, caps = encoder_out[sort_ind], caps[sort_ind]
        emb = self.embedding(caps)
        h, c = self.init_h(encoder_out.mean(1)), self.init_c(encoder_out.mean(1))
        lengths = (caplens - 1).tolist()
        alphas = torch.zeros(b, max(lengths), encoder_out.size(1))
        for t in range(max(lengths)):
            bt = sum(n > t for n in lengths)
            enc = encoder_out[:bt]
            att = self.full_att(
                torch.relu(self.encoder_att(enc) + self.decoder_att(h[:bt]).unsqueeze(1))
            ).squeeze(2)
            alpha = torch.softmax(att, dim=1)
            awe = (enc * alpha.unsqueeze(2)).sum(dim=1)
            h, c = self.decode_step(torch.cat([emb[:bt, t], awe], 1), (h[:bt], c[:bt]))
            alphas[:bt, t] = alpha
        return alphas, sort_ind


def test_a_trace_of_a_sorted_shrinking_batch_draws_each_sequences_own_weights():
    """The records are flagged with the caller's sequence each row holds; a trace of sequence b draws b's own
    weights at the row that holds it (and says which row), from a step it reaches. It drew row b, another
    sequence's weights, with no word."""
    torch.manual_seed(0)
    m = ShowAttendTell().eval()
    enc, caps, caplens = torch.randn(3, 9, 12), torch.randint(1, 30, (3, 6)), torch.tensor([2, 5, 3])
    with torch.no_grad(), capture_attention(m) as cap:
        alphas, order = m(enc, caps, caplens)
    row = {int(s): i for i, s in enumerate(order)}
    assert all(not r.exact and r.batch_rows is not None for r in cap.records)
    assert cap.records[0].batch_rows == tuple(order.tolist())
    for b in range(3):
        tr = cap.trace(b)
        drawn = np.asarray(tr.learned("cross")[1] if tr.learned("cross") else tr.cross).reshape(-1)
        own = [t for t in range(alphas.shape[1]) if np.allclose(drawn, alphas[row[b], t].numpy(), atol=1e-6)]
        assert own, b
        assert any(f"sequence {b} is row " in n for n in tr.meta["capture_notes"])


class GatoEpisode(nn.Module):
    """Gato-style episode tokens: observation ids (B, T, n_obs) and action ids (B, T, n_act) each looked up in one
    table, joined per timestep (``cat(dim=2)``) and flattened to (B, T * (n_obs + n_act), d): o o a o o a ...;
    causal self-attention over them. ``truths``: its weights."""

    def __init__(self, heads: int, hd: int = 4):
        super().__init__()
        d = heads * hd
        self.h = heads
        self.embed, self.qkv = nn.Embedding(50, d), nn.Linear(d, 3 * d)
        self.truths: list[torch.Tensor] = []

    def forward(self, obs, act):
        b, t = obs.shape[:2]
        x = torch.cat([self.embed(obs), self.embed(act)], dim=2).reshape(b, -1, self.embed.embedding_dim)
        n = x.shape[1]
        q, k, v = self.qkv(x).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        w = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~causal, float("-inf")).softmax(-1)
        self.truths.append(w.detach().clone())
        return w @ v


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 2)])
def test_inputs_interleaved_per_timestep_are_no_rotating_cache(batch, heads):
    """Two embedding calls' tokens interleaved per timestep are the sequence in its order: exact, nothing said. It
    was flagged as a rotating cache read in its slots' order (tokens of several calls in another order)."""
    torch.manual_seed(batch * 10 + heads)
    m = GatoEpisode(heads).eval()
    obs, act = torch.randint(0, 50, (batch, 3, 2)), torch.randint(0, 50, (batch, 3, 1))
    with torch.no_grad(), capture_attention(m) as cap:
        m(obs, act)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and cap.notes == [], (rec.flag, cap.notes)
    torch.testing.assert_close(rec.probs, m.truths[0])
    np.testing.assert_allclose(
        cap.trace(batch - 1).dec_self[0], m.truths[0][batch - 1].numpy(), rtol=1e-6, atol=1e-7
    )


class MatAttention(nn.Module):
    """MAT's (Multi-Agent Transformer's) SelfAttention(key, value, query), causal where ``masked``."""

    def __init__(self, masked: bool, heads: int, d: int = 16, n: int = 5):
        super().__init__()
        self.masked, self.h = masked, heads
        self.key, self.query, self.value, self.proj = (nn.Linear(d, d) for _ in range(4))
        self.register_buffer("mask", torch.tril(torch.ones(n + 1, n + 1)).view(1, 1, n + 1, n + 1))

    def forward(self, key, value, query):
        b, n, d = query.shape
        k, q, v = (f(t).view(b, n, self.h, -1).transpose(1, 2) for f, t in
                   ((self.key, key), (self.query, query), (self.value, value)))  # fmt: skip
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.masked:
            att = att.masked_fill(self.mask[:, :, :n, :n] == 0, float("-inf"))
        return self.proj((att.softmax(-1) @ v).transpose(1, 2).contiguous().view(b, n, d))


class MultiAgentTransformer(nn.Module):
    """MAT's encoder over the agents' observations and its decoder block, whose second attention asks with the
    encoder's representations over the decoder's action tokens (``attn2(key=x, value=x, query=rep_enc)``), or the
    usual way round (``swapped`` False: the actions asking the observations)."""

    def __init__(self, heads: int, swapped: bool, d: int = 16):
        super().__init__()
        self.swapped = swapped
        self.obs_encoder, self.action_encoder = nn.Linear(6, d), nn.Linear(5, d, bias=False)
        self.enc_attn = MatAttention(False, heads)
        self.attn1, self.attn2 = MatAttention(True, heads), MatAttention(not swapped, heads)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, obs, shifted_action):
        rep = self.obs_encoder(obs)
        rep = rep + self.enc_attn(rep, rep, rep)
        x = self.action_encoder(shifted_action)
        x = self.ln1(x + self.attn1(x, x, x))
        if self.swapped:
            return self.ln2(rep + self.attn2(key=x, value=x, query=rep))
        return self.ln2(x + self.attn2(key=rep, value=rep, query=x))


@pytest.mark.parametrize("swapped", [True, False])
def test_a_cross_attention_from_the_encoders_side_is_not_drawn_as_target_over_source(swapped):
    """MAT's agents' representations asking the action tokens: recorded as cross, and left out of a trace (its
    rows would carry the action tokens' names over the observations' queries), said. Before, drawn as target
    over source with no word. The usual way round is drawn."""
    torch.manual_seed(0)
    m = MultiAgentTransformer(2, swapped).eval()
    obs, actions = torch.randn(2, 5, 6), torch.randn(2, 5, 5)
    with torch.no_grad(), capture_attention(m) as cap:
        m(obs, actions)
    assert sorted(r.kind for r in cap.records) == ["cross", "dec_self", "enc_self"]
    tr = cap.trace(1, src_tokens=[f"obs{i}" for i in range(5)], tgt_tokens=[f"act{i}" for i in range(5)])
    said = any("reverse of a trace's cross" in n for n in tr.meta.get("capture_notes", []))
    assert (tr.cross is None and said) if swapped else (tr.cross is not None and not said)


class SdpaAttention(nn.Module):
    """nanoGPT's flash path, handed its q, k, v: SDPA, causal, with dropout while training."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=0.1 if self.training else 0.0, is_causal=True
        )


@pytest.mark.parametrize("train", [False, True])
def test_sdpa_under_bfloat16_autocast_records_the_weights_it_used(train):
    """bfloat16 q, k, v into SDPA with and without CPU autocast: the same call, the same output, the same weights
    recorded (the float32 softmax SDPA's kernel makes, with its dropout while training). Under autocast the
    recomputation ran in bfloat16: the record was off by up to 0.02, exact, or flagged as unrepeatable draws."""
    torch.manual_seed(0)
    q, k, v = ((3 * torch.randn(2, 4, 8, 12)).bfloat16() for _ in range(3))
    m = SdpaAttention().train(train)
    got = {}
    for autocast in (False, True):
        torch.manual_seed(1)
        with torch.no_grad(), capture_attention(m) as cap:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = m(q, k, v)
        (rec,) = cap.records  # (q, k, v handed in: the kind read from the mask, said, whatever the dtype)
        assert rec.exact and all("queries were never projected" in n for n in cap.notes)
        got[autocast] = (y, rec.probs)
    assert torch.equal(got[False][0], got[True][0])
    torch.testing.assert_close(got[True][1], got[False][1], atol=1e-6, rtol=0)


def test_multihead_attention_under_bfloat16_autocast_in_eval_records_its_weights():
    """nn.MultiheadAttention (need_weights=False: its SDPA) under CPU autocast projects in bfloat16, then SDPA
    weighs in float32: the record is that softmax (it was the bfloat16 product's, off by about 1e-3)."""
    torch.manual_seed(0)
    b, n, e, h = 2, 7, 48, 4
    m = nn.MultiheadAttention(e, h, batch_first=True).eval()
    x = torch.randn(b, n, e)
    pad = torch.zeros(b, n, dtype=torch.bool)
    pad[1, 5:] = True
    with torch.no_grad(), capture_attention(m) as cap, torch.autocast("cpu", dtype=torch.bfloat16):
        m(x, x, x, key_padding_mask=pad, need_weights=False)
        q, k, _ = F.linear(x, m.in_proj_weight, m.in_proj_bias).chunk(3, -1)  # (as autocast projected them)
    q, k = (t.reshape(b, n, h, e // h).transpose(1, 2).float() for t in (q, k))
    want = ((q @ k.transpose(-2, -1)) / math.sqrt(e // h)).masked_fill(pad[:, None, None, :], float("-inf"))
    (rec,) = cap.records
    assert rec.exact
    torch.testing.assert_close(rec.probs, want.softmax(-1), atol=1e-6, rtol=0)


class MaskedSelfAttention(nn.Module):
    """Self-attention over token ids with the (B, L, L) mask it is handed (True = may attend), by SDPA."""

    def __init__(self, heads: int = 2, hd: int = 4):
        super().__init__()
        d = heads * hd
        self.h, self.emb, self.qkv = heads, nn.Embedding(50, d), nn.Linear(d, 3 * d)

    def forward(self, ids, allowed):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])


def _multimodal_mask(kinds: str, pad: int, window: int = 0) -> torch.Tensor:
    """Gemma 3's and PaliGemma's mask over text (``t``) and image (``i``) tokens, then ``pad`` padding: text
    causal, image tokens all seeing each other, a sliding window over the causal part where ``window``."""
    n = len(kinds) + pad
    i = torch.arange(n)
    img = torch.tensor([c == "i" for c in kinds] + [False] * pad)
    causal = i[None, :] <= i[:, None]
    if window:
        causal &= i[:, None] - i[None, :] < window
    real = torch.arange(n) < len(kinds)
    return ((causal | (img[:, None] & img[None, :])) & real[None, :])[None]


@pytest.mark.parametrize(
    ("kinds", "pad", "window"),
    [("tii", 2, 0), ("tii", 0, 0), ("ttiiiiiit", 0, 8), ("ttiiiiiit", 3, 4), ("pppppppc", 2, 0)],
)
def test_a_decoders_mask_with_a_bidirectional_block_is_a_decoders(kinds, pad, window):
    """Text causal beside an image block its tokens all see (Gemma 3, PaliGemma), padded or cut by a sliding
    window, and a prefix LM's prefix before one causal token, padded (``p``: prefix, ``c``: causal): dec_self.
    They were enc_self, exact, with no word: a padded row reaching a block's end wrote over the count of blocks,
    and a window or a single token after the block left no triangle nor block to read."""
    if "p" in kinds:  # (a prefix LM: the prefix sees itself both ways)
        allowed = _multimodal_mask(kinds.replace("p", "i").replace("c", "t"), pad)
    else:
        allowed = _multimodal_mask(kinds, pad, window)
    torch.manual_seed(0)
    m = MaskedSelfAttention().eval()
    ids = torch.randint(1, 50, (1, allowed.shape[-1]))
    with torch.no_grad(), capture_attention(m) as cap:
        m(ids, allowed)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and cap.notes == []
    assert torch.equal(rec.mask[0], allowed[0])


def _online_softmax(q, k, v, mask, block: int = 4):
    """FlashAttention's online softmax as shreyansh26/FlashAttention-PyTorch writes it: key blocks, the running max
    and sum rescaled per block, the padding re-applied to the exp by ``torch.where(mask, exp(S - m), 0.)``."""
    q = q / math.sqrt(q.shape[-1])
    o = torch.zeros_like(q)
    total, top = torch.zeros(q.shape[:-1])[..., None], torch.full(q.shape[:-1], -1e10)[..., None]
    blocks = zip(torch.split(k, block, 2), torch.split(v, block, 2), torch.split(mask, block, 1), strict=True)
    for kj, vj, mj in blocks:
        keep = mj[:, None, None, :] > 0
        s = torch.where(keep, torch.einsum("... i d, ... j d -> ... i j", q, kj), -1e10)
        mb = torch.max(s, dim=-1, keepdim=True).values
        p = torch.where(keep, torch.exp(s - mb), 0.0)
        lb = p.sum(-1, keepdim=True) + 1e-10
        pv = torch.einsum("... i j, ... j d -> ... i d", p, vj)
        mn = torch.maximum(mb, top)
        ln = torch.exp(top - mn) * total + torch.exp(mb - mn) * lb
        o = (total / ln) * torch.exp(top - mn) * o + (torch.exp(mb - mn) / ln) * pv
        total, top = ln, mn
    return o


class OnlineSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Linear(8, 24)

    def forward(self, x, mask):
        return _online_softmax(*self.p(x).chunk(3, -1), mask)


def test_an_online_softmax_with_its_exp_masked_by_where_is_said_to_be_one():
    """The exp masked by ``torch.where(mask, exp(s - m), 0.)``, then summed and combined block by block: the
    warning says an exp of scores was not followed into a softmax (computed block by block). It said the scores
    multiplied values without a softmax (sigmoid attention, sparsemax), which they do not."""
    torch.manual_seed(0)
    m = OnlineSoftmax()
    x, mask = torch.randn(2, 2, 16, 8), torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    with torch.no_grad(), capture_attention(m) as cap:
        m(x, mask)
    assert cap.records == [] and len(cap.notes) == 1
    assert "computed block by block" in cap.notes[0] and "without a softmax" not in cap.notes[0]


class BigBirdBlocks(nn.Module):
    """BigBird's block-sparse attention as Hugging Face lays it out: the first and last query blocks over every
    key (recorded), the middle blocks over the first block, three sliding blocks joined by ``cat`` and the last
    block, in one softmax (not recorded, said)."""

    def __init__(self):
        super().__init__()
        self.emb, self.p = nn.Embedding(50, 16), nn.Linear(16, 48)

    def forward(self, ids):
        b, n = ids.shape
        bs, nb = 2, n // 2
        q, k, v = self.p(self.emb(ids)).chunk(3, -1)
        bq, bk, bv = (t.view(b, nb, bs, 16) for t in (q, k, v))
        p0 = (bq[:, 0] @ k.transpose(1, 2) / 4).softmax(-1)
        pl = (bq[:, -1] @ k.transpose(1, 2) / 4).softmax(-1)
        ek = torch.cat([bk[:, :-2], bk[:, 1:-1], bk[:, 2:]], 2)
        ev = torch.cat([bv[:, :-2], bv[:, 1:-1], bv[:, 2:]], 2)
        mq = bq[:, 1:-1]
        sc = torch.cat([torch.einsum("bnqd,bkd->bnqk", mq, bk[:, 0]), torch.einsum("bnqd,bnkd->bnqk", mq, ek),
                        torch.einsum("bnqd,bkd->bnqk", mq, bk[:, -1])], -1) / 4  # fmt: skip
        p = sc.softmax(-1)
        cm = (torch.einsum("bnqk,bkd->bnqd", p[..., :bs], bv[:, 0])
              + torch.einsum("bnqk,bnkd->bnqd", p[..., bs : 4 * bs], ev)
              + torch.einsum("bnqk,bkd->bnqd", p[..., -bs:], bv[:, -1]))  # fmt: skip
        return torch.cat([(p0 @ v)[:, None], cm, (pl @ v)[:, None]], 1).reshape(b, n, 16)


def test_rows_whose_softmax_was_not_recorded_are_not_said_to_have_none():
    """The middle blocks' softmax ran, and was not recorded (a warning says why): a trace drawing the global
    blocks' rows says the others' softmax was not recorded, where it said no softmax ran for them."""
    torch.manual_seed(0)
    m = BigBirdBlocks()
    with torch.no_grad(), capture_attention(m) as cap:
        m(torch.randint(1, 50, (2, 16)))
    assert len(cap.notes) == 1 and "not recorded" in cap.notes[0]
    said = " ".join(cap.trace(0, src_tokens=[f"w{i}" for i in range(16)]).meta["capture_notes"])
    assert "was not recorded (the capture's notes say why)" in said and "no softmax ran" not in said


def test_multihead_attention_under_bfloat16_autocast_while_training_records_its_dropped_weights():
    """While training with dropout, the module's own draws drop the float32 softmax SDPA weighs with: the record
    is those weights (which rebuild its output), where it was the bfloat16 bmm path's, about 2.5e-3 off."""
    torch.manual_seed(0)
    b, n, e, h = 2, 7, 48, 4
    m = nn.MultiheadAttention(e, h, dropout=0.1, batch_first=True).train()
    x = torch.randn(b, n, e)
    pad = torch.zeros(b, n, dtype=torch.bool)
    pad[1, 5:] = True
    state = torch.get_rng_state()
    with torch.no_grad(), capture_attention(m) as cap, torch.autocast("cpu", dtype=torch.bfloat16):
        m(x, x, x, key_padding_mask=pad, need_weights=False)
        q, k, _ = F.linear(x, m.in_proj_weight, m.in_proj_bias).chunk(3, -1)
    q, k = (t.reshape(b, n, h, e // h).transpose(1, 2).float() for t in (q, k))
    want = ((q @ k.transpose(-2, -1)) / math.sqrt(e // h)).masked_fill(pad[:, None, None, :], float("-inf"))
    after = torch.get_rng_state()
    torch.set_rng_state(state)  # (the draws the call made)
    want = torch.dropout(want.softmax(-1), 0.1, True)
    torch.set_rng_state(after)
    (rec,) = cap.records
    assert rec.exact
    torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)


def test_multihead_attention_asked_for_its_weights_under_autocast_records_those():
    """Bound: asked for its weights (need_weights=True), the call ran its bmm path in bfloat16 and returned them:
    the record is what it returned, dropout and all."""
    torch.manual_seed(0)
    m = nn.MultiheadAttention(48, 4, dropout=0.1, batch_first=True).train()
    x = torch.randn(2, 7, 48)
    with torch.no_grad(), capture_attention(m) as cap, torch.autocast("cpu", dtype=torch.bfloat16):
        _, returned = m(x, x, x, need_weights=True, average_attn_weights=False)
    (rec,) = cap.records
    torch.testing.assert_close(rec.probs.float(), returned.float(), atol=0, rtol=0)


class LabmlGraphAttention(nn.Module):
    """labml.ai's annotated GAT: pairs tiled over (i, j) with the heads among the cells' axes, ``(N, N, H, 2F)``,
    scored by one Linear, softmaxed over j (dim 1), the heads left last."""

    def __init__(self, heads: int, fin: int = 5, hid: int = 4):
        super().__init__()
        self.h, self.hid = heads, hid
        self.linear = nn.Linear(fin, hid * heads, bias=False)
        self.attn = nn.Linear(hid * 2, 1, bias=False)

    def forward(self, h, adj):
        n = h.shape[0]
        g = self.linear(h).view(n, self.h, self.hid)
        pairs = torch.cat([g.repeat_interleave(n, dim=0), g.repeat(n, 1, 1)], dim=-1).view(
            n, n, self.h, 2 * self.hid
        )
        e = F.leaky_relu(self.attn(pairs).squeeze(-1), 0.2).masked_fill(adj == 0, float("-inf"))
        return torch.einsum("ijh,jhf->ihf", e.softmax(dim=1), g).reshape(n, -1)


@pytest.mark.parametrize("heads", [2, 4])
def test_pairs_with_heads_among_their_axes_are_said_not_laid_out(heads):
    """Bound of the paired-feature scores: with the heads among the pairs' axes, the pairs are not read as query
    and key rows (they were, wrongly, and the record was refused with an untrue reason: one position several
    queries); the weights that multiply values get the warning that capture could not lay them out."""
    torch.manual_seed(heads)
    m = LabmlGraphAttention(heads).eval()
    adj = ((torch.rand(6, 6) > 0.5) | torch.eye(6, dtype=torch.bool)).unsqueeze(-1)
    with torch.no_grad(), capture_attention(m) as cap:
        m(torch.randn(6, 5), adj)
    assert cap.records == [] and len(cap.notes) == 1
    assert "could not lay them out" in cap.notes[0] and "several queries" not in cap.notes[0]
