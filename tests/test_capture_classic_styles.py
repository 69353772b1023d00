"""Capture on classic NLP and recommender attention, written the way their repositories write it.

Each model keeps the weights it multiplied its values with (``used``, laid out (batch, head, query, key)),
so every record is checked against the model itself, at several batch sizes:

- BiDAF's trilinear similarity with its per-position terms ``expand``-ed and written first
  (``w_c(c).expand(-1, -1, Lq) + w_q(q).permute(0, 2, 1).expand(-1, Lc, -1) + (c * w) @ q.T``) and its
  query-to-context attention ``softmax(S.max(dim=-1)[0])`` (one score per context word);
- a relative position bias added first (``bias + q @ k.T``), as an ``expand``-ed or broadcast tensor;
- OpenNMT's ``mlp`` (Bahdanau) scores over ``expand``-ed queries and keys;
- a learned context vector expanded over the batch (``bmm(tanh(h), w.expand(B, -1, -1))``, Att-BLSTM);
- DeepCTR's attention pooling with ``torch.tensordot`` projections;
- NRMS's softmax by hand with an epsilon in its sum (``exp(e) * mask / (sum + 1e-8)``), pooled by
  ``bmm(x.permute(0, 2, 1), alpha)``, and attention over the pooled news vectors (hierarchical models);
- a -10000 penalty added to the pad positions of a softmax over positions: the record's mask has the
  pads whatever their raw score;
- ``torch.cat(tensors=[...])`` and ``torch.stack(tensors=...)`` by keyword;
- module paths that begin with "dec" without naming a decoder (``decomposable``, ``deconv_head``);
- picoGPT ported to torch (every head of every layer made by plain functions in the model's one
  forward, joined by ``torch.hstack``) and token embeddings picked from a table by indexing it
  (``wte[idx]``, ``index_select``, ``emb.weight[idx]``) with repeated tokens.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

VOCAB = 40


def _ids(batch: int, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 10 * batch)
    ids = torch.randint(1, VOCAB, (batch, n), generator=g)
    for b in range(1, batch):
        ids[b, n - b % 3 - 1 :] = 0  # some padding, different per sequence
    return ids


def _check(cap, used: list[tuple[str, torch.Tensor]]) -> None:
    assert not cap.notes, cap.notes
    assert len(cap.records) == len(used), [(r.name, r.kind, tuple(r.probs.shape)) for r in cap.records]
    for rec, (kind, want) in zip(cap.records, used, strict=True):
        assert rec.exact, rec.flag
        assert rec.kind == kind, (rec.name, rec.kind, kind)
        assert tuple(rec.probs.shape) == tuple(want.shape), (
            rec.name,
            tuple(rec.probs.shape),
            tuple(want.shape),
        )
        torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)


class BiDAF(nn.Module):
    """Context-to-query and query-to-context attention over one trilinear similarity (galsang/BiDAF)."""

    def __init__(self, expand: bool):
        super().__init__()
        self.expand = expand
        self.emb = nn.Embedding(VOCAB, 8)
        self.rnn = nn.GRU(8, 8, batch_first=True)
        self.att_weight_c, self.att_weight_q = nn.Linear(8, 1), nn.Linear(8, 1)
        self.att_weight_cq = nn.Linear(8, 1)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, c_ids, q_ids):
        c, _ = self.rnn(self.emb(c_ids))
        q, _ = self.rnn(self.emb(q_ids))
        c_len, q_len = c.size(1), q.size(1)
        cq = torch.stack([self.att_weight_cq(c * q.select(1, i).unsqueeze(1)).squeeze(-1) for i in range(q_len)],
                         dim=-1)  # fmt: skip
        if self.expand:
            s = (
                self.att_weight_c(c).expand(-1, -1, q_len)
                + self.att_weight_q(q).permute(0, 2, 1).expand(-1, c_len, -1)
                + cq
            )
        else:
            s = self.att_weight_c(c) + self.att_weight_q(q).permute(0, 2, 1) + cq
        a = F.softmax(s, dim=2)  # (B, Lc, Lq): each context word over the question
        c2q = torch.bmm(a, q)
        b = F.softmax(torch.max(s, dim=2)[0], dim=1)  # (B, Lc): one score per context word
        q2c = torch.bmm(b.unsqueeze(1), c).squeeze(1)
        self.used += [("cross", a[:, None]), ("cross", b[:, None, None])]
        return c2q, q2c


@pytest.mark.parametrize("expand", [True, False])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_bidaf_both_directions_are_recorded_exactly(expand, batch):
    torch.manual_seed(0)
    model = BiDAF(expand).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 8), _ids(batch, 5, seed=1))
    _check(cap, model.used)


class RelBias(nn.Module):
    """Multi-head self-attention with a learned relative position bias written before the scores."""

    def __init__(self, heads: int, how: str):
        super().__init__()
        self.h, self.how = heads, how
        self.emb = nn.Embedding(VOCAB, 4 * heads)
        self.qkv = nn.Linear(4 * heads, 12 * heads)
        self.rel = nn.Embedding(15, heads)
        self.gate = nn.Linear(4 * heads, 1)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids):
        b, n = ids.shape
        x = self.emb(ids)
        q, k, v = self.qkv(x).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        rel = (torch.arange(n)[None] - torch.arange(n)[:, None]).clamp(-7, 7) + 7
        bias = self.rel(rel).permute(2, 0, 1).unsqueeze(0)  # (1, H, n, n)
        if self.how == "expanded":
            s = bias.expand(b, -1, -1, -1) + q @ k.transpose(-1, -2)
        elif self.how == "broadcast":
            s = bias + q @ k.transpose(-1, -2)
        else:  # a per-query term expanded over the keys, written first
            s = self.gate(x).unsqueeze(1).expand(b, self.h, n, n) + q @ k.transpose(-1, -2)
        s = s.masked_fill((ids == 0)[:, None, None, :], float("-inf"))
        a = s.softmax(-1)
        self.used.append(("enc_self", a))
        return (a @ v).transpose(1, 2).reshape(b, n, -1)


@pytest.mark.parametrize("how", ["expanded", "broadcast", "query_term"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 3), (4, 2)])
def test_a_bias_written_before_the_scores_keeps_them_scores(how, batch, heads):
    torch.manual_seed(1)
    model = RelBias(heads, how).eval()
    ids = _ids(batch, 7)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    _check(cap, model.used)
    rec = cap.records[0]
    assert rec.mask is not None and torch.equal(rec.mask, (ids != 0)[:, None, :].expand(-1, 7, -1))


class MLPAttention(nn.Module):
    """OpenNMT-py's GlobalAttention(attn_type="mlp"): v(tanh(W q + U h)) over expanded queries and keys."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.linear_context = nn.Linear(8, 8, bias=False)
        self.linear_query = nn.Linear(8, 8)
        self.v = nn.Linear(8, 1, bias=False)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, src, tgt):
        h_s, h_t = self.emb(src), self.emb(tgt)
        b, s_len, dim = h_s.size()
        t_len = h_t.size(1)
        wq = self.linear_query(h_t.view(-1, dim)).view(b, t_len, 1, dim).expand(b, t_len, s_len, dim)
        uh = (
            self.linear_context(h_s.contiguous().view(-1, dim))
            .view(b, 1, s_len, dim)
            .expand(b, t_len, s_len, dim)
        )
        align = self.v(torch.tanh(wq + uh).view(-1, dim)).view(b, t_len, s_len)
        align = align.masked_fill((src == 0)[:, None, :], -float("inf"))
        a = F.softmax(align.view(b * t_len, s_len), -1).view(b, t_len, s_len)
        self.used.append(("cross", a[:, None]))
        return torch.bmm(a, h_s)


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_opennmt_mlp_attention_over_expanded_queries_and_keys(batch):
    torch.manual_seed(2)
    model = MLPAttention().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 7), _ids(batch, 3, seed=5))
    _check(cap, model.used)


class Pooling(nn.Module):
    """Attention pooling over an RNN's states, scored four ways real code writes it."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.emb = nn.Embedding(VOCAB, 8)
        self.rnn = nn.GRU(8, 8, batch_first=True)
        self.w = nn.Parameter(torch.randn(1, 8, 1))
        self.W, self.h = nn.Parameter(torch.randn(8, 4) * 0.3), nn.Parameter(torch.randn(4, 1) * 0.3)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        b = h.size(0)
        if self.how == "expand":  # Att-BLSTM: a context vector per batch row
            a = F.softmax(torch.bmm(torch.tanh(h), self.w.expand(b, -1, -1)), dim=1)
        elif self.how == "repeat":
            a = F.softmax(torch.bmm(torch.tanh(h), self.w.repeat(b, 1, 1)), dim=1)
        else:  # DeepCTR: tensordot projections
            t = F.relu(torch.tensordot(h, self.W, dims=([-1], [0])))
            a = F.softmax(torch.tensordot(t, self.h, dims=([-1], [0])), dim=1)
        self.used.append(("cross", a.transpose(1, 2)[:, None]))
        return torch.sum(a * h, dim=1)


@pytest.mark.parametrize("how", ["expand", "repeat", "tensordot"])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_context_vector_over_the_batch_or_by_tensordot_is_one_head(how, batch):
    torch.manual_seed(3)
    model = Pooling(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 7))
    _check(cap, model.used)


class NRMS(nn.Module):
    """wuch15's NRMS: words pooled into news vectors by a softmax by hand with an epsilon, then
    self-attention over a user's news vectors (exp / (sum + eps) there too) and a pooling over them."""

    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        d = 4 * heads
        self.emb = nn.Embedding(VOCAB, d, padding_idx=0)
        self.att_fc1, self.att_fc2 = nn.Linear(d, 8), nn.Linear(8, 1)
        self.W_Q, self.W_K, self.W_V = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.used: list[tuple[str, torch.Tensor]] = []

    def pool(self, x, mask=None):
        alpha = torch.exp(self.att_fc2(torch.tanh(self.att_fc1(x))))
        if mask is not None:
            alpha = alpha * mask.unsqueeze(2)
        alpha = alpha / (torch.sum(alpha, dim=1, keepdim=True) + 1e-8)
        self.used.append(("cross", alpha.transpose(1, 2).unsqueeze(1)))
        return torch.bmm(x.permute(0, 2, 1), alpha).reshape(x.shape[0], -1)

    def forward(self, history):
        b, n_news, n_words = history.shape
        words = history.view(-1, n_words)
        news = self.pool(self.emb(words), words.ne(0).float()).view(b, n_news, -1)  # (B, N, d)
        q = self.W_Q(news).view(b, -1, self.h, 4).transpose(1, 2)
        k = self.W_K(news).view(b, -1, self.h, 4).transpose(1, 2)
        v = self.W_V(news).view(b, -1, self.h, 4).transpose(1, 2)
        scores = torch.exp(torch.matmul(q, k.transpose(-1, -2)) / 2.0)
        attn = scores / (torch.sum(scores, dim=-1, keepdim=True) + 1e-8)
        self.used.append(("enc_self", attn))
        user = torch.matmul(attn, v).transpose(1, 2).reshape(b, n_news, -1)
        return self.pool(user)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 1), (2, 4)])
def test_nrms_softmax_by_hand_with_an_epsilon_and_attention_over_pooled_vectors(batch, heads):
    torch.manual_seed(4)
    model = NRMS(heads).eval()
    g = torch.Generator().manual_seed(batch)
    history = torch.randint(1, VOCAB, (batch, 3, 6), generator=g)
    history[:, :, 4:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(history)
    _check(cap, model.used)
    assert cap.records[0].key_labels is None  # the words are tokens
    assert cap.records[1].key_labels == ("<pooled 0>", "<pooled 1>", "<pooled 2>")  # news vectors


class Penalty(nn.Module):
    """Lin et al.'s self-attentive pooling with a -10000 penalty on the pads, added to the scores."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.ws1, self.ws2 = nn.Linear(8, 6, bias=False), nn.Linear(6, 1, bias=False)
        self.used: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def forward(self, ids):
        h = self.emb(ids)
        alphas = self.ws2(torch.tanh(self.ws1(h))).squeeze(-1) + 3.0  # raw scores above 0
        alphas = alphas + (-10000 * (ids == 0).float())
        a = F.softmax(alphas, dim=1)
        self.used.append(("cross", a[:, None, None]))
        return torch.bmm(a.unsqueeze(1), h).squeeze(1)


@pytest.mark.parametrize("batch", [2, 3, 5])
def test_a_minus_10000_penalty_on_positive_scores_is_the_mask(batch):
    torch.manual_seed(5)
    model = Penalty().eval()
    ids = _ids(batch, 7)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    _check(cap, model.used)
    rec = cap.records[0]
    assert rec.mask is not None and torch.equal(rec.mask, (ids != 0)[:, None, :])


class Keyword(nn.Module):
    def __init__(self, stack: bool):
        super().__init__()
        self.stack = stack
        self.emb = nn.Embedding(VOCAB, 8)
        self.q, self.k = nn.Linear(8, 4), nn.Linear(8, 4)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids):
        x = self.emb(ids)
        if self.stack:
            x = torch.stack(tensors=[x, x], dim=0).sum(dim=0)
        else:
            x = torch.cat(tensors=[x[..., :4], x[..., 4:]], dim=-1)
        a = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2), -1)
        self.used.append(("enc_self", a[:, None]))
        return a @ x


@pytest.mark.parametrize("stack", [False, True])
def test_cat_and_stack_given_their_tensors_by_keyword(stack):
    model = Keyword(stack).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 6))
    _check(cap, model.used)


class Named(nn.Module):
    def __init__(self, name: str):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.add_module(name, nn.MultiheadAttention(8, 2, batch_first=True))
        self.name = name

    def forward(self, ids):
        x = self.emb(ids)
        return getattr(self, self.name)(x, x, x, key_padding_mask=ids == 0)[0]


@pytest.mark.parametrize(
    ("name", "kind"),
    [("decomposable", "enc_self"), ("deconv_head", "enc_self"), ("decision", "enc_self"),
     ("dec", "dec_self"), ("dec1", "dec_self"), ("text_decoder", "dec_self"), ("dec_layers", "dec_self")],
)  # fmt: skip
def test_a_decoder_is_named_by_a_whole_word_not_a_prefix(name, kind):
    """A padded self-attention with no causal mask: only its module path can call it a decoder's."""
    model = Named(name).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(3, 6))
    assert [r.kind for r in cap.records] == [kind]


class ImageDecoder(nn.Module):
    """A latent-diffusion VAE's (taming-transformers') non-local block inside its ``decoder``: 1x1 conv q, k, v
    over a feature map, ``bmm(q.permute(0, 2, 1), k)`` over its pixels, no mask (bidirectional by design)."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.decoder = nn.ModuleDict(
            {"q": nn.Conv2d(c, c, 1), "k": nn.Conv2d(c, c, 1), "v": nn.Conv2d(c, c, 1)}
        )
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, x):
        d = self.decoder
        b, c, h, w = x.shape
        q = d["q"](x).reshape(b, c, h * w).permute(0, 2, 1)
        k = d["k"](x).reshape(b, c, h * w)
        w_ = torch.softmax(torch.bmm(q, k) * c**-0.5, dim=2)
        self.used.append(("enc_self", w_[:, None]))
        return torch.bmm(d["v"](x).reshape(b, c, h * w), w_.permute(0, 2, 1)).reshape(b, c, h, w)


class QueryDecoder(nn.Module):
    """DETR's decoder self-attention over its learned object queries (``query_embed.weight`` repeated over the
    batch), no mask: every query sees every other."""

    def __init__(self, n: int = 5):
        super().__init__()
        self.query_embed = nn.Embedding(n, 8)
        self.decoder = nn.ModuleList([nn.MultiheadAttention(8, 2)])

    def forward(self, memory):
        qe = self.query_embed.weight.unsqueeze(1).repeat(1, memory.shape[1], 1)  # (n, B, d)
        tgt = torch.zeros_like(qe)
        return self.decoder[0](tgt + qe, tgt + qe, tgt)[0]


class FloatDecoder(nn.Module):
    """A decoder block run alone on floats handed in (a user's unit test of their decoder), no mask."""

    def __init__(self):
        super().__init__()
        self.decoder = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.decoder(x, x, x)[0]


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_decoder_over_an_images_pixels_is_an_images_self_attention(batch):
    """Named a decoder with nothing hiding the future: over a feature map's pixels (a latent-diffusion VAE's
    decoder) it is an image's self-attention (enc_self, bidirectional by design, as the map shows); over
    learned queries it is the decoder side's (DETR's, documented), over token ids a text decoder that forgot its
    mask (dec_self, for the audit), and over floats handed in, which lineage cannot tell from a text's, too."""
    torch.manual_seed(0)
    image = ImageDecoder().eval()
    with torch.no_grad(), capture_attention(image) as cap:
        image(torch.randn(batch, 8, 3, 4))
    _check(cap, image.used)
    assert not [n for n in cap.notes if "by its name alone" in n]
    queries = QueryDecoder().eval()
    with torch.no_grad(), capture_attention(queries) as cap:
        queries(torch.randn(7, batch, 8))
    assert [(r.kind, r.exact) for r in cap.records] == [("dec_self", True)]
    by_name = [n for n in cap.notes if "by its name alone" in n]  # the name decided: a note says so
    assert len(by_name) == 1 and by_name[0].startswith("decoder.0 ")
    text = Named("decoder").eval()
    with torch.no_grad(), capture_attention(text) as cap:
        text(_ids(batch, 6))
    assert [r.kind for r in cap.records] == ["dec_self"]
    assert [n for n in cap.notes if "by its name alone" in n]
    floats = FloatDecoder().eval()
    with torch.no_grad(), capture_attention(floats) as cap:
        floats(torch.randn(batch, 6, 8))
    assert [r.kind for r in cap.records] == ["dec_self"]
    assert [n for n in cap.notes if "by its name alone" in n]
    with torch.no_grad(), capture_attention(floats, kinds={"decoder": "enc_self"}) as cap:  # as the note says
        floats(torch.randn(batch, 6, 8))
    assert [r.kind for r in cap.records] == ["enc_self"] and not cap.notes


class Persson2020(nn.Module):
    """Aladdin Persson's transformer as first published: the embedding split into heads first, then one
    ``Linear(head_dim, head_dim)`` shared by the heads, einsum "nqhd,nkhd->nhqk"."""

    def __init__(self, heads: int):
        super().__init__()
        self.h, self.hd = heads, 4
        self.emb = nn.Embedding(VOCAB, 4 * heads)
        self.values, self.keys, self.queries = (nn.Linear(4, 4, bias=False) for _ in range(3))
        self.fc_out = nn.Linear(4 * heads, 4 * heads)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids):
        x = self.emb(ids)
        n, length, _ = x.shape
        values = self.values(x.reshape(n, length, self.h, self.hd))
        keys = self.keys(x.reshape(n, length, self.h, self.hd))
        queries = self.queries(x.reshape(n, length, self.h, self.hd))
        energy = torch.einsum("nqhd,nkhd->nhqk", [queries, keys])
        energy = energy.masked_fill((ids != 0)[:, None, None, :] == 0, float("-1e20"))
        attention = torch.softmax(energy / (4 * self.h) ** 0.5, dim=3)
        self.used.append(("enc_self", attention))
        out = torch.einsum("nhql,nlhd->nqhd", [attention, values]).reshape(n, length, -1)
        return self.fc_out(out)


class HeadLoop(nn.Module):
    """Per-head projections of the input's slices in a loop inside one module call (Pulfer's ViT
    without its class token): the heads are one layer, not H layers."""

    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(VOCAB, 4 * heads)
        self.q_mappings = nn.ModuleList(nn.Linear(4, 4) for _ in range(heads))
        self.k_mappings = nn.ModuleList(nn.Linear(4, 4) for _ in range(heads))
        self.v_mappings = nn.ModuleList(nn.Linear(4, 4) for _ in range(heads))
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids):
        x = self.emb(ids)
        outs, maps = [], []
        for h in range(self.h):
            seq = x[..., 4 * h : 4 * h + 4]
            q, k, v = self.q_mappings[h](seq), self.k_mappings[h](seq), self.v_mappings[h](seq)
            attention = torch.softmax(q @ k.transpose(1, 2) / 2.0, dim=-1)
            maps.append(attention)
            outs.append(attention @ v)
        self.used.append(("enc_self", torch.stack(maps, dim=1)))
        return torch.cat(outs, dim=-1)


@pytest.mark.parametrize("style", [Persson2020, HeadLoop])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (1, 3), (2, 2), (3, 3), (4, 2), (2, 4)])
def test_heads_projected_after_the_split_stay_heads(style, batch, heads):
    """A projection applied to each head's slice numbers its outputs after the slice's features, so
    heads stay apart (before, Persson's maps came out as (B * H, 1, q, k) and a head loop as H layers)."""
    torch.manual_seed(6)
    model = style(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 6))
    _check(cap, model.used)


class NoWeights(nn.Module):
    """Raschka's "Build a LLM from scratch", 3.3: self-attention without trainable weights over the
    embeddings handed in, ``inputs @ inputs.T``; with ``causal``, 3.5.1's simple mask (the weights times
    ``tril(ones)``, renormalized by their row sums)."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, inputs):
        attn_weights = torch.softmax(inputs @ inputs.T / inputs.shape[-1] ** 0.5, dim=-1)
        if self.causal:
            masked = attn_weights * torch.tril(torch.ones(inputs.shape[0], inputs.shape[0]))
            attn_weights = masked / masked.sum(dim=-1, keepdim=True)
        self.used.append(("dec_self" if self.causal else "enc_self", attn_weights[None, None]))
        return attn_weights @ inputs


@pytest.mark.parametrize("causal", [False, True])
def test_attention_without_weights_over_one_sequence_from_outside(causal):
    """One 2-D product is one sequence and one head, whatever the features: exact, with no projection."""
    inputs = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                           [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])  # fmt: skip
    model = NoWeights(causal)
    with torch.no_grad(), capture_attention(model) as cap:
        model(inputs)
    _check(cap, model.used)
    if causal:
        assert torch.equal(cap.records[0].mask, torch.ones(6, 6, dtype=torch.bool).tril()[None])


def test_a_batch_of_sequences_from_outside_without_projection_is_still_flagged():
    """(B, L, d) from outside: it may hold heads folded into its batch, so the split is flagged."""

    class Batched(nn.Module):
        def forward(self, x):
            return torch.softmax(x @ x.transpose(1, 2), dim=-1) @ x

    net = Batched()

    with torch.no_grad(), capture_attention(net) as cap:
        net(torch.randn(3, 5, 4))
    assert len(cap.records) == 1 and not cap.records[0].exact and cap.records[0].flag


class RenamedHeads(nn.Module):
    """ "Let's build GPT"'s Head modules in a list not named like heads, joined by ``torch.cat``."""

    def __init__(self, heads: int):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 4 * heads)
        self.att_list = nn.ModuleList(nn.ModuleDict({"q": nn.Linear(4 * heads, 4), "k": nn.Linear(4 * heads, 4),
                                                     "v": nn.Linear(4 * heads, 4)}) for _ in range(heads))  # fmt: skip
        self.used: list[tuple[str, torch.Tensor]] = []

    def head(self, m, x):
        wei = (m["q"](x) @ m["k"](x).transpose(-2, -1)) * 0.5
        n = x.shape[1]
        wei = F.softmax(wei.masked_fill(torch.tril(torch.ones(n, n)) == 0, float("-inf")), dim=-1)
        return wei, wei @ m["v"](x)

    def forward(self, ids):
        x = self.tok(ids)
        outs, maps = [], []
        for m in self.att_list:
            w, o = self.head(m, x)
            maps.append(w)
            outs.append(o)
        self.used.append(("dec_self", torch.stack(maps, dim=1)))
        return torch.cat(outs, dim=-1)


class Interpretable(nn.Module):
    """pytorch-forecasting's InterpretableMultiHeadAttention: per-head query and key layers, one value
    layer and one attention module shared by the heads, ``torch.stack(heads, dim=2)`` then a mean."""

    class Attention(nn.Module):
        def forward(self, q, k, v, mask):
            attn = torch.bmm(q, k.permute(0, 2, 1)) / 2.0
            attn = F.softmax(attn.masked_fill(mask, -1e9), dim=2)
            return torch.bmm(attn, v), attn

    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(VOCAB, 8)
        self.v_layer = nn.Linear(8, 4)
        self.q_layers = nn.ModuleList(nn.Linear(8, 4) for _ in range(heads))
        self.k_layers = nn.ModuleList(nn.Linear(8, 4) for _ in range(heads))
        self.attention = self.Attention()
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids):
        x = self.emb(ids)
        n = ids.shape[1]
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)[None]
        vs = self.v_layer(x)
        heads, attns = [], []
        for i in range(self.h):
            head, attn = self.attention(self.q_layers[i](x), self.k_layers[i](x), vs, mask)
            heads.append(head)
            attns.append(attn)
        self.used.append(("dec_self", torch.stack(attns, dim=1)))
        return torch.mean(torch.stack(heads, dim=2), dim=2)


@pytest.mark.parametrize("style", [RenamedHeads, Interpretable])
@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 3), (2, 4)])
def test_single_head_maps_whose_outputs_are_joined_are_one_layer(style, batch, heads):
    """Outputs of single-head maps joined along their features (or stacked just before them) are the
    heads of one layer, whatever the modules are named and even from one module called per head."""
    torch.manual_seed(7)
    model = style(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 6))
    _check(cap, model.used)


class SharedLayer(nn.Module):
    """ALBERT-like: one single-head layer called three times (layers, not heads), and a query chunk loop
    whose outputs are joined along the sequence (pieces of one map, not heads)."""

    def __init__(self, chunks: bool):
        super().__init__()
        self.chunks = chunks
        self.emb = nn.Embedding(VOCAB, 8)
        self.layer = nn.ModuleDict({"q": nn.Linear(8, 8), "k": nn.Linear(8, 8)})

    def attend(self, q_in, x):
        w = torch.softmax(self.layer["q"](q_in) @ self.layer["k"](x).transpose(1, 2), -1)
        return w @ x

    def forward(self, ids):
        x = self.emb(ids)
        if self.chunks:
            return torch.cat([self.attend(x[:, i : i + 3], x) for i in range(0, x.shape[1], 3)], dim=1)
        for _ in range(3):
            x = x + self.attend(x, x)
        return x


def test_layers_called_in_a_loop_and_chunks_of_queries_are_not_taken_for_heads():
    net = SharedLayer(False).eval()
    with torch.no_grad(), capture_attention(net) as cap:
        net(_ids(2, 6))
    assert [tuple(r.probs.shape) for r in cap.records] == [(2, 1, 6, 6)] * 3
    model = SharedLayer(True).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 6))
    assert [tuple(r.probs.shape) for r in cap.records] == [(2, 1, 6, 6)]  # two pieces of one map, not heads


class D2LAdditive(nn.Module):
    """d2l.ai 11.3's additive attention on its toy data: queries and keys handed in, values
    ``arange(40).reshape(1, 10, 4).repeat(2, 1, 1)`` (not made from the keys), masked by valid lengths."""

    def __init__(self):
        super().__init__()
        self.W_k, self.W_q = nn.Linear(2, 8, bias=False), nn.Linear(20, 8, bias=False)
        self.w_v = nn.Linear(8, 1, bias=False)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, queries, keys, values, valid_lens):
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        keep = torch.arange(scores.shape[-1])[None, None, :] < valid_lens[:, None, None]
        weights = F.softmax(scores.masked_fill(~keep, -1e6), dim=-1)
        self.used.append(("cross", weights[:, None]))
        return torch.bmm(weights, values)


def test_additive_attention_over_values_handed_in():
    torch.manual_seed(8)
    model = D2LAdditive().eval()
    values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.normal(0, 1, (2, 1, 20)), torch.normal(0, 1, (2, 10, 2)), values, torch.tensor([2, 6]))
    _check(cap, model.used)
    assert cap.records[0].mask[1, 0].tolist() == [True] * 6 + [False] * 4


class FillThousand(nn.Module):
    """Zipformer's ``masked_fill(key_padding_mask.unsqueeze(1), -1000)``: a weight of exactly 0."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.qkv = nn.Linear(8, 24)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (t.view(b, n, 2, 4).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
        s = (q @ k.transpose(-1, -2)).masked_fill((ids == 0)[:, None, None, :], -1000)
        a = s.softmax(-1)
        self.used.append(("enc_self", a))
        return a @ v


def test_a_fill_of_minus_1000_is_the_mask():
    torch.manual_seed(9)
    model = FillThousand().eval()
    ids = _ids(3, 7)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    _check(cap, model.used)
    rec = cap.records[0]
    assert rec.mask_source == "masked_fill" and torch.equal(
        rec.mask, (ids != 0)[:, None, :].expand(-1, 7, -1)
    )


class PulferMSA(nn.Module):
    """Pulfer's "ViT from scratch": a class token prepended, then a loop over the sequences and one over
    the heads inside one call, each head's map from an ``nn.Softmax`` module, the heads joined by
    ``torch.hstack`` and the sequences by ``torch.cat`` of ``unsqueeze(r, dim=0)``."""

    def __init__(self, heads: int, join: str = "cat", heads_outer: bool = False):
        super().__init__()
        self.h, self.d_head, self.join, self.heads_outer = heads, 4, join, heads_outer
        self.emb = nn.Embedding(VOCAB, 4 * heads)
        self.class_token = nn.Parameter(torch.rand(1, 4 * heads))
        self.q_mappings = nn.ModuleList(nn.Linear(4, 4) for _ in range(heads))
        self.k_mappings = nn.ModuleList(nn.Linear(4, 4) for _ in range(heads))
        self.v_mappings = nn.ModuleList(nn.Linear(4, 4) for _ in range(heads))
        self.softmax = nn.Softmax(dim=-1)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids):
        x = self.emb(ids)
        sequences = torch.cat([self.class_token.expand(x.shape[0], 1, -1), x], dim=1)
        if self.heads_outer:
            return self._heads_outer(sequences)
        result, maps = [], []
        for sequence in sequences:
            seq_result, seq_maps = [], []
            for head in range(self.h):
                seq = sequence[:, head * self.d_head : (head + 1) * self.d_head]
                q, k, v = self.q_mappings[head](seq), self.k_mappings[head](seq), self.v_mappings[head](seq)
                attention = self.softmax(q @ k.T / (self.d_head**0.5))
                seq_maps.append(attention)
                seq_result.append(attention @ v)
            result.append(torch.hstack(seq_result))
            maps.append(torch.stack(seq_maps))
        self.used.append(("enc_self", torch.stack(maps)))
        if self.join == "stack":  # the same batch, as many rewrites of the tutorial write it
            return torch.stack(result)
        return torch.cat([torch.unsqueeze(r, dim=0) for r in result])

    def _heads_outer(self, sequences):
        """The loops the other way round: one sequence's heads are every other map made."""
        n = sequences.shape[0]
        per = [[torch.empty(0)] * self.h for _ in range(n)]
        maps = [[torch.empty(0)] * self.h for _ in range(n)]
        for head in range(self.h):
            for i in range(n):
                seq = sequences[i][:, head * self.d_head : (head + 1) * self.d_head]
                q, k, v = self.q_mappings[head](seq), self.k_mappings[head](seq), self.v_mappings[head](seq)
                maps[i][head] = attention = self.softmax(q @ k.T / (self.d_head**0.5))
                per[i][head] = attention @ v
        self.used.append(("enc_self", torch.stack([torch.stack(m) for m in maps])))
        return torch.cat([torch.unsqueeze(torch.hstack(per[i]), dim=0) for i in range(n)])


@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 1), (2, 2), (3, 4), (4, 4), (2, 3)])
def test_a_loop_over_heads_outside_a_loop_over_sequences_is_one_layer(batch, heads):
    """Heads outer, sequences inner: the heads joined by ``torch.hstack`` per sequence are not the last
    maps made. They were taken to be, so one record held two sequences' same head as one sequence's
    heads, exact, and the others claimed to be sequence 0."""
    torch.manual_seed(11)
    model = PulferMSA(heads, heads_outer=True).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 5))
    _check(cap, model.used)


@pytest.mark.parametrize("join", ["cat", "stack"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 1), (2, 2), (3, 3), (4, 2)])
def test_a_loop_over_sequences_and_heads_is_one_layer_of_a_batch(batch, heads, join):
    """The sequences joined by ``torch.stack(result)`` were left one record each, every one exact and
    claiming to be sequence 0 (a trace drew them as layers)."""
    torch.manual_seed(10)
    model = PulferMSA(heads, join).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 5))
    _check(cap, model.used)
    assert cap.records[0].query_labels[0] == "<class_token 0>" == cap.records[0].key_labels[0]


def _pico_softmax(x):
    e = torch.exp(x - torch.amax(x, dim=-1, keepdim=True))
    return e / torch.sum(e, dim=-1, keepdim=True)


class PicoGPT(nn.Module):
    """picoGPT ("GPT in 60 lines of NumPy") ported to torch line by line: parameters in a dict, one
    unbatched sequence (T, d), token embeddings by indexing the table (``wte[inputs]``, the input with
    repeated tokens), ``x @ w + b``, the heads as a list from ``torch.split``, an additive causal mask,
    a softmax by hand, the heads joined by ``torch.hstack``. Every head of every layer is computed by
    plain functions inside the model's one forward call."""

    def __init__(self, heads: int, layers: int = 2):
        super().__init__()
        d, self.h = 4 * heads, heads
        self.p = nn.ParameterDict(
            {"wte": nn.Parameter(torch.randn(VOCAB, d)), "wpe": nn.Parameter(torch.randn(16, d))}
        )
        for i in range(layers):
            self.p[f"h{i}_attn_w"] = nn.Parameter(torch.randn(d, 3 * d) * 0.3)
            self.p[f"h{i}_attn_b"] = nn.Parameter(torch.randn(3 * d) * 0.1)
            self.p[f"h{i}_proj_w"] = nn.Parameter(torch.randn(d, d) * 0.3)
        self.layers = layers
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, inputs):
        p = self.p
        x = p["wte"][inputs] + p["wpe"][range(len(inputs))]
        for i in range(self.layers):
            qkv = x @ p[f"h{i}_attn_w"] + p[f"h{i}_attn_b"]
            q, k, v = (torch.split(t, t.shape[-1] // self.h, dim=-1)
                       for t in torch.split(qkv, qkv.shape[-1] // 3, dim=-1))  # fmt: skip
            mask = (1 - torch.tril(torch.ones(len(inputs), len(inputs)))) * -1e10
            heads, maps = [], []
            for qh, kh, vh in zip(q, k, v, strict=True):
                w = _pico_softmax(qh @ kh.T / qh.shape[-1] ** 0.5 + mask)
                maps.append(w)
                heads.append(w @ vh)
            self.used.append(("dec_self", torch.stack(maps)[None]))
            x = x + torch.hstack(heads) @ p[f"h{i}_proj_w"]
        return x @ p["wte"].T


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 8])
def test_picogpt_heads_of_plain_functions_and_an_indexed_embedding_table(heads):
    torch.manual_seed(heads)
    model = PicoGPT(heads).eval()
    inputs = torch.tensor([5, 9, 5, 31, 9, 9, 2])  # repeated tokens: the table's rows alone name them once
    with torch.no_grad(), capture_attention(model) as cap:
        model(inputs)
    _check(cap, model.used)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    assert all(torch.equal(r.mask, causal[None]) for r in cap.records)


class IndexedTable(nn.Module):
    """minGPT's batched attention over token embeddings picked from a learned table by indexing it
    (``wte[idx]``, ``torch.index_select(wte, 0, idx.view(-1))``, ``self.emb.weight[idx]``), learned
    positions added by a slice (``wpe[:T]``)."""

    def __init__(self, heads: int, how: str):
        super().__init__()
        d, self.h, self.how = 4 * heads, heads, how
        self.wte = nn.Parameter(torch.randn(VOCAB, d)) if how != "weight" else None
        self.emb = nn.Embedding(VOCAB, d) if how == "weight" else None
        self.wpe = nn.Parameter(torch.randn(16, d))
        self.qkv = nn.Linear(d, 3 * d)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, idx):
        b, t = idx.shape
        if self.how == "index":
            x = self.wte[idx]
        elif self.how == "index_select":
            x = torch.index_select(self.wte, 0, idx.view(-1)).view(b, t, -1)
        else:
            x = self.emb.weight[idx]
        x = x + self.wpe[:t]
        q, k, v = (z.view(b, t, self.h, -1).transpose(1, 2) for z in self.qkv(x).split(x.shape[-1], dim=2))
        w = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(
            (idx == 0)[:, None, None, :], float("-inf")
        )
        w = F.softmax(w, dim=-1)
        self.used.append(("enc_self", w))
        return (w @ v).transpose(1, 2).reshape(b, t, -1)


@pytest.mark.parametrize("how", ["index", "index_select", "weight"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 3), (4, 2)])
def test_token_embeddings_picked_from_a_table_by_indexing_it(how, batch, heads):
    torch.manual_seed(3)
    model = IndexedTable(heads, how).eval()
    ids = _ids(batch, 6)
    ids[:, 1] = ids[:, 0]  # a repeated token in every sequence, and the same tokens across sequences
    ids[-1, :2] = ids[0, :2]
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    _check(cap, model.used)
    assert torch.equal(cap.records[0].mask, (ids != 0)[:, None, :].expand(batch, 6, 6))


class BroadcastDot(nn.Module):
    """Dense graph-transformer ports: scores of every node against every node written as a broadcast
    product summed over the features (``(q[:, :, None] * k[:, None]).sum(-1)``), or GATv2's
    ``(a * leaky_relu(q[:, :, None] + k[:, None])).sum(-1)``, over one input's positions."""

    def __init__(self, gatv2: bool, d: int = 8):
        super().__init__()
        self.gatv2 = gatv2
        self.emb, self.q, self.k, self.v = (
            nn.Embedding(VOCAB, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
        )
        self.att = nn.Parameter(torch.randn(d))
        self.used: list[torch.Tensor] = []

    def forward(self, ids, adj=None):
        x = self.emb(ids)
        q, k = self.q(x), self.k(x)
        if self.gatv2:
            s = (self.att * F.leaky_relu(q.unsqueeze(2) + k.unsqueeze(1), 0.2)).sum(-1)
        else:
            s = (q.unsqueeze(2) * k.unsqueeze(1)).sum(-1)
        if adj is not None:
            s = s.masked_fill(~adj, float("-inf"))
        w = s.softmax(-1)
        self.used.append(w[:, None])
        return w @ self.v(x)


@pytest.mark.parametrize("gatv2", [False, True])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_scores_summed_from_a_broadcast_over_one_input_are_self_attention(gatv2, batch):
    torch.manual_seed(batch)
    ids = torch.randint(1, VOCAB, (batch, 6))
    model = BroadcastDot(gatv2).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and torch.equal(rec.probs, model.used[0]) and not cap.notes
    causal = torch.ones(6, 6, dtype=torch.bool).tril().expand(batch, 6, 6)  # a causal adjacency: a decoder
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, causal)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and torch.equal(rec.mask, causal)


class GATv2Heads(nn.Module):
    """Dense multi-head GATv2 layers, heads first as ports of PyG's GATv2Conv write them:
    ``(att * leaky_relu(g_r[:, :, :, None] + g_l[:, :, None])).sum(-1)`` per head (B, H, N, N), masked by the
    adjacency; the next layer reads ``a @ g_l`` with the heads merged back."""

    def __init__(self, heads: int, layers: int = 2, f: int = 4):
        super().__init__()
        d, self.h = heads * f, heads
        self.emb = nn.Embedding(VOCAB, d)
        self.w_l = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.w_r = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.att = nn.ParameterList(nn.Parameter(torch.randn(1, heads, 1, 1, f)) for _ in range(layers))
        self.used: list[torch.Tensor] = []

    def forward(self, ids, adj):
        x = self.emb(ids)
        b, n, d = x.shape
        for w_l, w_r, att in zip(self.w_l, self.w_r, self.att, strict=True):
            g_l = w_l(x).view(b, n, self.h, -1).transpose(1, 2)
            g_r = w_r(x).view(b, n, self.h, -1).transpose(1, 2)
            e = (att * F.leaky_relu(g_r.unsqueeze(3) + g_l.unsqueeze(2), 0.2)).sum(-1)
            a = e.masked_fill(~adj[:, None], -1e9).softmax(-1)
            self.used.append(a)
            x = F.elu((a @ g_l).transpose(1, 2).reshape(b, n, d)) + x
        return x


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 1), (1, 3), (2, 2), (3, 4), (4, 4)])
def test_multi_head_gatv2_layers_are_self_attention_maps_layer_after_layer(batch, heads):
    """Each head's rows are its graph's nodes over every node (not one distribution per feature, as linear
    attention's keys are), and a layer's output keeps its nodes' positions for the next layer."""
    torch.manual_seed(batch * 10 + heads)
    ids = torch.randint(1, VOCAB, (batch, 6))
    adj = (torch.rand(batch, 6, 6) < 0.5) | torch.eye(6, dtype=torch.bool)
    model = GATv2Heads(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, adj)
    assert len(cap.records) == 2 and not cap.notes and not cap.skipped
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact and rec.kind == "enc_self" and rec.flag is None
        assert rec.key_labels is None
        torch.testing.assert_close(rec.probs, used, atol=0, rtol=0)
        assert torch.equal(rec.mask, adj)


class EdgeGraphTransformer(nn.Module):
    """Dwivedi & Bresson's graph transformer layer with edge features, dense: ``(Q[:, :, :, None] * K[:, :, None])``
    modulated by each pair's embedded edge type ``(B, N, N)``, summed per head, masked by the adjacency."""

    def __init__(self, heads: int, f: int = 4):
        super().__init__()
        d, self.h = heads * f, heads
        self.emb, self.edges = nn.Embedding(VOCAB, d), nn.Embedding(5, d)
        self.q, self.k, self.v, self.e = (nn.Linear(d, d) for _ in range(4))
        self.used: list[torch.Tensor] = []

    def forward(self, ids, edge_types, adj):
        x, e = self.emb(ids), self.edges(edge_types)
        b, n, d = x.shape
        q, k, v = (f(x).view(b, n, self.h, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        pair = self.e(e).view(b, n, n, self.h, -1).permute(0, 3, 1, 2, 4)  # (B, H, N, N, f)
        s = (q.unsqueeze(3) * k.unsqueeze(2) * pair).sum(-1).masked_fill(~adj[:, None], float("-inf"))
        a = s.softmax(-1)
        self.used.append(a)
        return (a @ v).transpose(1, 2).reshape(b, n, d)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 1), (2, 2), (3, 4)])
def test_scores_modulated_by_features_of_each_pair_stay_self_attention(batch, heads):
    """The edge types are a second embedding, one position per (query, key) pair: features of the pairs,
    not a sequence of queries from another input (which would make the map cross-attention)."""
    torch.manual_seed(batch + heads)
    ids = torch.randint(1, VOCAB, (batch, 6))
    adj = (torch.rand(batch, 6, 6) < 0.5) | torch.eye(6, dtype=torch.bool)
    model = EdgeGraphTransformer(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, torch.randint(0, 5, (batch, 6, 6)), adj)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and not cap.notes
    torch.testing.assert_close(rec.probs, model.used[0], atol=0, rtol=0)
    assert torch.equal(rec.mask, adj)


class Neighbours(nn.Module):
    """Point Transformer's vector attention over each point's k nearest neighbours, gathered by index
    (``k[idx] - q``), one group: a softmax over neighbour slots, each row over its own set of points."""

    def __init__(self, d: int = 8, k: int = 3):
        super().__init__()
        self.k = k
        self.emb, self.q, self.kp, self.w = (
            nn.Embedding(VOCAB, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
            nn.Linear(d, 1),
        )

    def forward(self, ids, xyz):
        x = self.emb(ids)
        idx = torch.cdist(xyz, xyz).topk(self.k, largest=False).indices  # (B, N, K)
        keys = torch.stack([self.kp(x)[b][idx[b]] for b in range(x.shape[0])])  # (B, N, K, d)
        w = self.w(keys - self.q(x)[:, :, None]).softmax(dim=2)  # (B, N, K, 1)
        return (w * keys).sum(2)


def test_weights_over_each_points_own_neighbours_are_never_taken_for_sequences():
    torch.manual_seed(0)
    model = Neighbours().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (1, 6)), torch.randn(1, 6, 3))
    assert not any(r.exact for r in cap.records)  # slots of overlapping neighbourhoods: not a map over keys
    assert cap.skipped or cap.notes


class LuongSteps(nn.Module):
    """A Luong decoder that attends once per target step ("general" scores ``bmm(W h_t, enc^T)``, the padded
    source filled with ``-inf``), keeps each step's ``[c_t; h_t]`` and stacks them along time before one
    projection (``torch.stack(outs, dim=1)``): the steps' maps are the decoder's queries, not heads."""

    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim
        self.emb, self.gru = nn.Embedding(VOCAB, 8), nn.GRU(8, 8, batch_first=True)
        self.temb, self.cell, self.w = nn.Embedding(VOCAB, 8), nn.GRUCell(8, 8), nn.Linear(8, 8)
        self.fc = nn.Linear(16, VOCAB)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, src, tgt):
        enc, h_n = self.gru(self.emb(src))
        h, outs = h_n[0], []
        for t in range(tgt.shape[1]):
            h = self.cell(self.temb(tgt[:, t]), h)
            s = torch.bmm(self.w(h).unsqueeze(1), enc.transpose(1, 2))  # (B, 1, S)
            a = F.softmax(s.masked_fill((src == 0)[:, None, :], float("-inf")), dim=-1)
            self.used.append(("cross", a[:, None]))
            outs.append(torch.cat([torch.bmm(a, enc).squeeze(1), h], -1))
        return self.fc(torch.stack(outs, dim=self.dim))


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("batch", [1, 3, 4])
def test_decoder_steps_stacked_along_time_stay_steps(batch, dim):
    """Stacked at dim 1 the steps were joined into one record as if they were heads, exact."""
    torch.manual_seed(3)
    model = LuongSteps(dim=dim).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 5), _ids(batch, 4).flip(1))
    _check(cap, model.used)


class VarlenLoop(nn.Module):
    """Sequences of a padded batch attended one at a time over their own lengths, no padding inside the
    attention (set and graph transformers, "no padding" tutorials): ``attn(x[i:i + 1, :n_i])`` per row,
    the outputs padded back and stacked. The truth is each row's map, zero where nothing was computed."""

    def __init__(self, heads: int):
        super().__init__()
        self.h, self.dk = heads, 4
        self.emb = nn.Embedding(VOCAB, 4 * heads)
        self.qkv, self.o = nn.Linear(4 * heads, 12 * heads), nn.Linear(4 * heads, 4 * heads)
        self.used: list[tuple[str, torch.Tensor]] = []

    def attn(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, self.dk).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        a = (q @ k.transpose(-1, -2) * self.dk**-0.5).softmax(-1)
        return self.o((a @ v).transpose(1, 2).reshape(b, n, d)), a

    def forward(self, ids):
        lengths = (ids != 0).sum(-1)
        x = self.emb(ids)
        b, n = ids.shape
        maps = torch.zeros(b, self.h, n, n)
        outs = []
        for i in range(b):
            m = int(lengths[i])
            o, a = self.attn(x[i : i + 1, :m])
            maps[i, :, :m, :m] = a[0]
            outs.append(F.pad(o[0], (0, 0, 0, n - m)))
        self.used.append(("enc_self", maps))
        return torch.stack(outs)


@pytest.mark.parametrize(("batch", "heads"), [(2, 1), (2, 2), (3, 4), (4, 4), (5, 8), (4, 2)])
def test_sequences_attended_one_call_each_over_their_own_lengths_are_one_record(batch, heads):
    """Each call's map was a record of its own, claiming to be sequence 0 (its batch row), and a trace
    of any other sequence raised. Now they are one (B, H, L, L) record, each map at its own row and
    positions, the rest weighed 0 and masked."""
    torch.manual_seed(12)
    model = VarlenLoop(heads).eval()
    ids = _ids(batch, 6)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    _check(cap, model.used)
    rec = cap.records[0]
    lengths = (ids != 0).sum(-1)
    pos = torch.arange(6)
    own = (pos[None, :, None] < lengths[:, None, None]) & (pos[None, None, :] < lengths[:, None, None])
    assert torch.equal(rec.mask, own)
    for b in range(batch):
        drawn = np.asarray(cap.trace(b).enc_self)
        np.testing.assert_allclose(drawn[0], model.used[0][1][b].numpy(), atol=1e-6)
    values = rec.values.values
    assert values is not None and tuple(values.shape) == (batch, heads, 6, 4)
    for b in range(batch):  # the values of keys no call read are 0; a sequence's own are the call's
        assert torch.all(values[b, :, int(lengths[b]) :] == 0)
        assert torch.all(values[b, :, : int(lengths[b])].abs().sum(-1) > 0)


class ZeroedAfterSoftmax(nn.Module):
    """ESPnet's and wenet's ``forward_attention``: ``masked_fill(mask, -inf)``, the softmax, then
    ``masked_fill(mask, 0.0)`` on the weights; the queries are the last positions of the keys' own
    sequence (a chunk of an utterance over the chunks before it and itself)."""

    def __init__(self, post_fill: bool):
        super().__init__()
        self.post_fill = post_fill
        self.emb, self.q, self.k, self.v = (nn.Embedding(VOCAB, 8), nn.Linear(8, 8), nn.Linear(8, 8),
                                            nn.Linear(8, 8))  # fmt: skip
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids):
        x = self.emb(ids)
        q, k, v = self.q(x[:, 4:]), self.k(x), self.v(x)
        mask = (ids == 0).unsqueeze(1)  # (B, 1, T): True = padding
        attn = torch.softmax((q @ k.transpose(-2, -1) / 8**0.5).masked_fill(mask, float("-inf")), dim=-1)
        if self.post_fill:
            attn = attn.masked_fill(mask, 0.0)
        self.used.append(("enc_self", attn[:, None]))
        return attn @ v


@pytest.mark.parametrize("post_fill", [False, True])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_weights_zeroed_after_the_softmax_keep_the_kind(post_fill, batch):
    """With the fill after the softmax, the record's kind was worked out again without lineage and, the
    queries fewer than the keys, came out ``cross``: queries and keys are one input's, as without it."""
    torch.manual_seed(16)
    model = ZeroedAfterSoftmax(post_fill).eval()
    ids = _ids(batch, 7)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    _check(cap, model.used)
    assert torch.equal(cap.records[0].mask, (ids != 0)[:, None, :].expand(-1, 3, -1))


class StraightThrough(nn.Module):
    """Hard attention by the straight-through estimator (GroupViT's ``hard_softmax``, Gumbel-style
    assignment): ``y_hard - y_soft.detach() + y_soft`` is the one-hot of the softmax's argmax, and the
    values are multiplied with it."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.groups = nn.Parameter(torch.randn(1, 3, 8))
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, x):
        g = self.groups.expand(x.shape[0], -1, -1)
        y_soft = ((self.q(g) @ self.k(x).transpose(-2, -1)) * 8**-0.5).softmax(self.dim)
        index = y_soft.max(self.dim, keepdim=True)[1]
        y_hard = torch.zeros_like(y_soft).scatter_(self.dim, index, 1.0)
        attn = y_hard - y_soft.detach() + y_soft
        if self.dim == -2:
            attn = attn / (attn.sum(dim=-1, keepdim=True) + 1.0)
        self.used.append(("cross", attn[:, None]))
        return attn @ self.v(x)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_straight_through_hard_attention_records_the_one_hot(batch):
    """The softmax's soft weights were recorded as exact, though the values were multiplied with the
    one-hot: the tensor written first (``y_hard``) hid that the weights changed."""
    torch.manual_seed(17)
    model = StraightThrough(-1).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 5, 8))
    _check(cap, model.used)
    assert set(cap.records[0].probs.unique().tolist()) == {0.0, 1.0}


def test_straight_through_over_the_queries_is_flagged():
    """GroupViT's assignment: the softmax over the groups (dim=-2), renormalized over the image tokens and
    multiplied along them: never an exact map of the softmax's keys."""
    torch.manual_seed(18)
    model = StraightThrough(-2).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 5, 8))
    assert cap.records and not any(r.exact for r in cap.records)
    assert any("another axis" in n for n in cap.notes), cap.notes


class SplitKV(nn.Module):
    """flash-decoding's split-KV (ring-flash-attention's ``_update_out_and_lse``) written in Python: each
    block of keys softmaxed on its own and multiplied with its values, the block outputs merged by their
    log-sum-exp, ``out - sigmoid(lse_b - lse) * (out - bo)``: the values end up weighted by a softmax over
    all the keys, which no block's map is."""

    def __init__(self, heads: int, blocks: int = 2):
        super().__init__()
        self.h, self.blocks = heads, blocks
        self.emb, self.qkv = nn.Embedding(VOCAB, 4 * heads), nn.Linear(4 * heads, 12 * heads)

    def forward(self, ids):
        b, s = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, s, 3, self.h, 4).unbind(2)
        out = lse = None
        for kc, vc in zip(k.chunk(self.blocks, 1), v.chunk(self.blocks, 1), strict=True):
            scores = torch.einsum("bqhd,bkhd->bhqk", q, kc) * 0.5
            bo = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), vc)
            bl = torch.logsumexp(scores, -1).transpose(-2, -1).unsqueeze(-1)
            if out is None:
                out, lse = bo, bl
            else:
                out = out - torch.sigmoid(bl - lse) * (out - bo)
                lse = lse - F.logsigmoid(lse - bl)
        return out


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_blocks_merged_by_their_log_sum_exp_are_flagged(batch, heads):
    """The second block's map stayed exact, with no note: rows summing to 1 over half the keys, where
    the values were weighted by the softmax over all of them."""
    torch.manual_seed(19)
    model = SplitKV(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 6)))
    assert len(cap.records) == 2 and not any(r.exact for r in cap.records)
    assert any("combined online" in n for n in cap.notes), cap.notes


class FourierPoints(nn.Module):
    """SAM's ``PositionEmbeddingRandom``: point coordinates times a Gaussian matrix the model keeps as a
    registered buffer, then sin and cos (random Fourier features), attended over by heads."""

    def __init__(self, heads: int):
        super().__init__()
        d = 4 * heads
        self.h = heads
        self.register_buffer("positional_encoding_gaussian_matrix", torch.randn(2, d // 2))
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.used: list[tuple[str, torch.Tensor]] = []

    def forward(self, coords):
        c = 2 * math.pi * ((2 * coords - 1) @ self.positional_encoding_gaussian_matrix)
        x = torch.cat([torch.sin(c), torch.cos(c)], dim=-1)
        b, n, _ = x.shape
        q, k, v = (lin(x).reshape(b, n, self.h, -1).transpose(1, 2) for lin in (self.q, self.k, self.v))
        w = torch.softmax(q @ k.permute(0, 1, 3, 2) / 2.0, dim=-1)
        self.used.append(("enc_self", w))
        return w @ v


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_positions_projected_by_a_buffer_matrix_are_followed(batch, heads):
    """A matrix kept as a buffer was no weight to lineage: every map over such features was flagged
    ("lineage was lost"), all of SAM's two-way transformer among them, though each was exact."""
    torch.manual_seed(21)
    model = FourierPoints(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.rand(batch, 5, 2))
    _check(cap, model.used)


class LocationSensitive(nn.Module):
    """Tacotron 2's decoder (NVIDIA/tacotron2): additive attention whose energies add a location term, a
    conv over the previous and cumulative weights (``cat((w.unsqueeze(1), w_cum.unsqueeze(1)), dim=1)``),
    the weights made again at every step of a decoding loop inside the forward, padded text masked."""

    def __init__(self, steps: int = 4, d: int = 8, att: int = 6):
        super().__init__()
        self.steps = steps
        self.emb = nn.Embedding(VOCAB, d)
        self.rnn = nn.LSTMCell(d, d)
        self.query_layer, self.memory_layer = nn.Linear(d, att, bias=False), nn.Linear(d, att, bias=False)
        self.location_conv = nn.Conv1d(2, 4, kernel_size=5, padding=2, bias=False)
        self.location_dense = nn.Linear(4, att, bias=False)
        self.v = nn.Linear(att, 1, bias=False)
        self.used: list[torch.Tensor] = []

    def forward(self, ids, lengths):
        memory = self.emb(ids)
        b, t, _ = memory.shape
        mask = torch.arange(t)[None, :] >= lengths[:, None]
        h, c = memory.new_zeros(b, memory.shape[-1]), memory.new_zeros(b, memory.shape[-1])
        weights, cum = memory.new_zeros(b, t), memory.new_zeros(b, t)
        context = memory.new_zeros(b, memory.shape[-1])
        processed_memory = self.memory_layer(memory)
        for _ in range(self.steps):
            h, c = self.rnn(context, (h, c))
            cat = torch.cat((weights.unsqueeze(1), cum.unsqueeze(1)), dim=1)
            location = self.location_dense(self.location_conv(cat).transpose(1, 2))
            energies = self.v(torch.tanh(self.query_layer(h.unsqueeze(1)) + location + processed_memory))
            energies = energies.squeeze(-1)
            energies.data.masked_fill_(mask, -float("inf"))
            weights = F.softmax(energies, dim=1)
            self.used.append(weights[:, None, None, :].detach().clone())
            context = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)
            cum += weights
        return context


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_location_sensitive_attention_is_recorded_at_every_decoding_step(batch):
    """The location term is the previous weights convolved over the keys: each weight stands for the key
    position it weighs, so every step's energies are over the text's positions and each step is recorded
    exactly (from the second step on, the energies' positions were lost and the steps not recorded)."""
    torch.manual_seed(batch)
    model = LocationSensitive().eval()
    lengths = torch.tensor([7] + [max(2, 7 - 2 * i) for i in range(1, batch)])
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 7), lengths)
    assert len(cap.records) == len(model.used) == 4 and not cap.notes
    assert not [n for n in cap.skipped if n.level == "warning"]
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact and rec.kind == "cross"
        torch.testing.assert_close(rec.probs, used, rtol=0, atol=0)
        keep = torch.arange(7)[None, :] < lengths[:, None]
        assert (rec.mask is None and bool(keep.all())) or torch.equal(rec.mask[:, 0], keep)  # (B, q, k)


def test_decoding_steps_whose_queries_lineage_does_not_place_are_not_stacked_as_layers():
    """Four calls of one attention in one forward, each a decoder state's step of additive attention: lineage
    does not say which query each reads, so capture cannot tell steps from a layer whose weights are shared.
    The trace draws the last and says so, and stacks() refuses (the four were drawn as four layers)."""
    torch.manual_seed(0)
    model = LocationSensitive().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 7), torch.tensor([7, 5]))
    assert len(cap.records) == 4 and all(r.query_positions is None for r in cap.records)
    tr = cap.trace(1)
    assert tr.probs("cross").shape == (1, 1, 1, 7)
    np.testing.assert_array_equal(tr.probs("cross")[0], cap.records[-1].probs[1].numpy())
    assert any("3 call(s) of modules called again inside one forward" in n for n in tr.meta["capture_notes"])
    with pytest.raises(ValueError, match="cannot tell whether they are steps or layers"):
        cap.stacks()


class InterestEvolving(nn.Module):
    """DIEN's interest evolving layer (DeepCTR-Torch, ``gru_type="AUGRU"``): a target item's softmax over the
    behaviours, packed with ``pack_padded_sequence`` beside them, its slices gating a GRU cell's update."""

    def __init__(self, d: int = 4):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.mlp = nn.Sequential(nn.Linear(4 * d, 8), nn.ReLU(), nn.Linear(8, 1))
        self.cell = nn.Linear(2 * d, 2 * d)

    def forward(self, target, hist, lengths):
        q, keys = self.emb(target).unsqueeze(1), self.emb(hist)
        qs = q.expand(-1, keys.shape[1], -1)
        s = self.mlp(torch.cat([qs, keys, qs - keys, qs * keys], -1)).transpose(1, 2)
        a = F.softmax(s, dim=-1).squeeze(1)
        pk = torch.nn.utils.rnn.pack_padded_sequence(keys, lengths, batch_first=True, enforce_sorted=False)
        pa = torch.nn.utils.rnn.pack_padded_sequence(a, lengths, batch_first=True, enforce_sorted=False)
        h, begin = keys.new_zeros(keys.shape[0], keys.shape[-1]), 0
        for bs in pk.batch_sizes.tolist():
            x, at = pk.data[begin : begin + bs], pa.data[begin : begin + bs].view(-1, 1)
            u, n = torch.sigmoid(self.cell(torch.cat([x, h[:bs]], -1))).chunk(2, -1)
            h = (1.0 - at * u) * h[:bs] + at * u * torch.tanh(n)
            begin += bs
        return h


def test_weights_packed_to_gate_a_recurrence_are_a_warning():
    """The weights go into a packed sequence and gate a recurrent update: capture does not follow them
    there, and warns (it said, as information, that nothing was weighted by them)."""
    torch.manual_seed(0)
    model = InterestEvolving().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(3, 5)[:, 0], _ids(3, 5), torch.tensor([5, 5, 5]))
    assert not cap.records
    assert len(cap.notes) == 1 and "packed into a sequence" in cap.notes[0]
    assert not any("nothing is weighted by" in str(n) for n in cap.skipped)


def test_a_decoder_named_module_over_one_position_is_told_nothing():
    """One query over one key (a decoding loop's first step, recomputed each step): no later key to hide,
    so the name's kind comes without the warning a mask-free decoder over several positions gets."""
    torch.manual_seed(0)
    text = Named("decoder").eval()
    with torch.no_grad(), capture_attention(text) as cap:
        text(_ids(2, 1))
    assert [r.kind for r in cap.records] == ["dec_self"]
    assert not [n for n in cap.notes if "by its name alone" in n]


def test_a_decoder_named_module_masked_after_its_softmax_is_told_nothing():
    """AllenNLP's ``masked_softmax`` with a causal mask: the weights multiplied by ``tril`` and renormalized
    after the softmax. The mask is found then, so the name's warning (said at the end) is not given."""

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(VOCAB, 8), nn.Linear(8, 24)

        def forward(self, ids):
            q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
            w = (q @ k.transpose(-1, -2)).softmax(-1) * torch.ones(ids.shape[1], ids.shape[1]).tril()
            w = w / w.sum(-1, keepdim=True)
            return w @ v

    torch.manual_seed(0)
    model = nn.ModuleDict({"decoder": Decoder()})
    with torch.no_grad(), capture_attention(model) as cap:
        model["decoder"](_ids(2, 5))
    (rec,) = cap.records
    assert rec.kind == "dec_self" and rec.mask is not None
    assert not [n for n in cap.notes if "by its name alone" in n], cap.notes


class FinalStateQuery(nn.Module):
    """A GRU's final state as the query: Luong's dot attention of the wikidocs tutorial
    (``bmm(encoder_outputs, hidden.permute(1, 2, 0))``, softmax over dim 1) over the encoder's outputs, or
    GST's reference encoder state over learned style tokens (``tanh`` of a table)."""

    def __init__(self, gst: bool, d: int = 8):
        super().__init__()
        self.gst, self.emb, self.gru = gst, nn.Embedding(VOCAB, d), nn.GRU(d, d, batch_first=True)
        self.tokens = nn.Parameter(torch.randn(5, d))
        self.w_q, self.w_k, self.w_v = nn.Linear(d, d, bias=False), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids):
        out, hidden = self.gru(self.emb(ids))  # hidden (1, B, d)
        if self.gst:
            tokens = torch.tanh(self.tokens).unsqueeze(0).expand(ids.shape[0], -1, -1)
            q, k = self.w_q(hidden.transpose(0, 1)), self.w_k(tokens)
            w = F.softmax(q @ k.transpose(1, 2) / 8**0.5, dim=-1)  # (B, 1, 5)
            self.w = w
            return w @ self.w_v(tokens)
        w = F.softmax(torch.bmm(out, hidden.permute(1, 2, 0)).squeeze(2), dim=1)  # (B, T)
        self.w = w[:, None]
        return torch.bmm(w.unsqueeze(1), out)


@pytest.mark.parametrize("gst", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_recurrent_final_state_as_the_query_is_placed_in_its_sequence(gst, batch):
    """An RNN's final state is a vector of each sequence, a position of its own: the map is exact and
    cross-attention (its layout was read from the shape and flagged: the final state named no position)."""
    torch.manual_seed(batch)
    model = FinalStateQuery(gst).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 6)))
    (rec,) = cap.records
    assert rec.exact and rec.kind == "cross" and cap.notes == [], (rec.flag, cap.notes)
    torch.testing.assert_close(rec.probs[:, 0], model.w)


class SessionInterests(nn.Module):
    """DSIN's session interests: each session's mean pooled separately, joined, and a target's attention over
    them (``bmm(q.unsqueeze(1), interests.transpose(1, 2))``)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)

    def forward(self, target, *sessions):
        q = self.emb(target)
        interests = torch.cat([self.emb(s).mean(1, keepdim=True) for s in sessions], 1)  # (B, S, d)
        w = torch.softmax(torch.bmm(q.unsqueeze(1), interests.transpose(1, 2)), -1)
        self.w = w
        return torch.bmm(w, interests)


@pytest.mark.parametrize("batch", [1, 2])
def test_vectors_pooled_separately_are_keys_of_their_own_in_the_trace(batch):
    """Three session means are three keys, labelled apart (each was ``<pooled 0>``, so the trace drew one
    column holding one key's weight and the row summed to less than 1, with no note)."""
    torch.manual_seed(batch)
    model = SessionInterests().eval()
    sessions = [torch.randint(1, VOCAB, (batch, 4)) for _ in range(3)]
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch,)), *sessions)
    (rec,) = cap.records
    assert rec.exact and len(set(rec.key_labels)) == 3, rec.key_labels
    labels, learned = cap.trace(0).learned("cross")
    assert len(labels) == 3
    torch.testing.assert_close(torch.tensor(learned[-1, 0, 0]), model.w[0, 0])
