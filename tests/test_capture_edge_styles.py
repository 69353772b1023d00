"""attnscope.core.families.capture on attention styles at the edges of what lineage decides: an attention
pool whose query is a mean token among its keys, weight rows zeroed after the softmax then multiplied in
an einsum with an ellipsis, heads mixed by an nn.Linear over them (CaiT), linear attention's softmax over
positions per key feature, and a pointer distribution. Each model keeps what it computed, so every
record is checked against the model itself."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

VOCAB = 20


def _captured(model, *inputs):
    with torch.no_grad(), capture_attention(model) as cap:
        model(*inputs)
    return cap


class AttentionPool(nn.Module):
    """CLIP's AttentionPool2d: the mean of the patch features prepended as a token, position embeddings
    added, then ``F.multi_head_attention_forward`` with the mean token as the only query."""

    def __init__(self, dim: int = 8, heads: int = 2, patches: int = 4):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(patches + 1, dim) / dim)
        self.q, self.k, self.v, self.c = (nn.Linear(dim, dim) for _ in range(4))
        self.heads = heads

    def forward(self, feats):  # (B, C, H, W)
        x = feats.flatten(2).permute(2, 0, 1)  # (HW, B, C)
        x = torch.cat([x.mean(dim=0, keepdim=True), x], dim=0) + self.pos[:, None, :]
        out, self.weights = F.multi_head_attention_forward(
            query=x[:1], key=x, value=x, embed_dim_to_check=x.shape[-1], num_heads=self.heads,
            q_proj_weight=self.q.weight, k_proj_weight=self.k.weight, v_proj_weight=self.v.weight,
            in_proj_weight=None, in_proj_bias=torch.cat([self.q.bias, self.k.bias, self.v.bias]),
            bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0, out_proj_weight=self.c.weight,
            out_proj_bias=self.c.bias, use_separate_proj_weight=True, training=False,
            need_weights=True, average_attn_weights=False,
        )  # fmt: skip
        return out.squeeze(0)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_an_attention_pool_over_its_own_mean_token_is_self_attention(batch):
    torch.manual_seed(batch)
    model = AttentionPool()
    feats = torch.randn(batch, 8, 2, 2)
    cap = _captured(model, feats)
    (rec,) = cap.records
    assert rec.kind == "enc_self" and rec.exact and rec.probs.shape == (batch, 2, 1, 5)
    torch.testing.assert_close(rec.probs, model.weights, atol=1e-6, rtol=0)


class MediaGated(nn.Module):
    """Flamingo's masked cross-attention: text rows that precede every image get all-zero weights after
    the softmax (``attn.masked_fill(mask, 0.)``), multiplied with an ellipsis einsum."""

    def __init__(self):
        super().__init__()
        self.emb, self.q, self.kv = nn.Embedding(9, 8), nn.Linear(8, 8), nn.Linear(8, 16)

    def forward(self, ids, media, before_media):
        b, n = ids.shape
        q = self.q(self.emb(ids)).view(b, n, 2, 4).transpose(1, 2)
        k, v = self.kv(media).view(b, -1, 2, 2, 4).permute(2, 0, 3, 1, 4)
        attn = torch.einsum("... i d, ... j d -> ... i j", q, k).softmax(dim=-1)
        self.used = attn.masked_fill(before_media[:, None, :, None], 0.0)
        return torch.einsum("... i j, ... j d -> ... i d", self.used, v)


def test_weight_rows_zeroed_after_the_softmax_are_recorded_as_multiplied():
    torch.manual_seed(0)
    model = MediaGated()
    before = torch.tensor([[False] * 5, [True, True, False, False, False]])
    cap = _captured(model, torch.randint(1, 9, (2, 5)), torch.randn(2, 3, 8), before)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "cross" and cap.notes == []
    torch.testing.assert_close(rec.probs, model.used, atol=0, rtol=0)
    assert bool((rec.probs[1, :, :2] == 0).all())


def test_changed_weights_in_a_product_capture_cannot_follow_are_flagged():
    """The same zeroed weights in a three-operand einsum (a per-head gate): capture cannot take the
    weights at the product, so the record, which holds the softmax's output, says so."""

    class ThreeWay(MediaGated):
        def forward(self, ids, media, before_media):
            b, n = ids.shape
            q = self.q(self.emb(ids)).view(b, n, 2, 4).transpose(1, 2)
            k, v = self.kv(media).view(b, -1, 2, 2, 4).permute(2, 0, 3, 1, 4)
            attn = torch.einsum("bhid,bhjd->bhij", q, k).softmax(dim=-1)
            used = attn.masked_fill(before_media[:, None, :, None], 0.0)
            return torch.einsum("bhij,bhjd,h->bhid", used, v, torch.ones(2))

    torch.manual_seed(0)
    before = torch.tensor([[False] * 5, [True, True, False, False, False]])
    cap = _captured(ThreeWay(), torch.randint(1, 9, (2, 5)), torch.randn(2, 3, 8), before)
    (rec,) = cap.records
    assert not rec.exact and "changed after the softmax" in rec.flag
    assert any("changed after the softmax" in n for n in cap.notes)


class ClassTalkingHeads(nn.Module):
    """CaiT's talking heads: ``proj_l`` (an nn.Linear over the heads, permuted last) before the softmax
    and ``proj_w`` after it; ``learned`` instead multiplies the weights by learned values through an
    nn.Linear over the keys."""

    def __init__(self, heads: int = 2, n: int = 5):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(9, 8), nn.Linear(8, 24)
        self.proj_l, self.proj_w = nn.Linear(heads, heads), nn.Linear(heads, heads)
        self.values = nn.Linear(n, 4, bias=False)
        self.h = heads

    def forward(self, ids, mixed: bool):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, self.h, 4).permute(2, 0, 3, 1, 4)
        attn = q @ k.transpose(-2, -1)
        if mixed:
            attn = self.proj_l(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        attn = attn.softmax(dim=-1)
        self.used = attn
        if mixed:
            attn = self.proj_w(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            return attn @ v
        return self.values(attn)  # (B, H, n, 4): the weights times learned values, keys contracted


@pytest.mark.parametrize("mixed", [True, False])
def test_heads_mixed_by_a_linear_layer_are_flagged_and_learned_values_are_not(mixed):
    torch.manual_seed(0)
    model = ClassTalkingHeads()
    cap = _captured(model, torch.randint(1, 9, (2, 5)), mixed)
    (rec,) = cap.records
    if mixed:
        assert not rec.exact and "talking-heads" in rec.flag and "linear layer" in rec.flag
    else:
        assert rec.exact and cap.notes == []
        torch.testing.assert_close(rec.probs, model.used, atol=0, rtol=0)


def test_linear_attention_keys_softmaxed_over_positions_are_not_maps():
    """Efficient attention (Shen et al.): the keys softmaxed over positions, one distribution per key
    feature, then ``keys.T @ values``: not a map of queries over keys, so not recorded; its weights do
    multiply values over positions (as label attention's, LAAT's, do: the same product), so a warning
    says so, never only a note; the queries' softmax over features is a projection's."""

    class Efficient(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.q, self.k, self.v = (
                nn.Embedding(9, 8),
                nn.Linear(8, 4),
                nn.Linear(8, 4),
                nn.Linear(8, 4),
            )

        def forward(self, ids):
            x = self.emb(ids)
            keys = F.softmax(self.k(x), dim=1)  # (B, n, 4) over positions
            query = F.softmax(self.q(x), dim=2)  # over features
            context = keys.transpose(1, 2) @ self.v(x)  # (B, 4, 4)
            return query @ context

    cap = _captured(Efficient(), torch.randint(1, 9, (2, 6)))
    assert cap.records == []
    (note,) = cap.notes
    assert "not recorded: its weights multiply values over positions" in note
    assert "for every feature of a projection" in note and "(2, 6, 4)" in note
    assert not any("for every feature of a projection" in str(n) for n in cap.skipped)


class LabelAttention(nn.Module):
    """LAAT (Vu et al.): each label's query over the token positions, ``softmax(U tanh(W H^T))`` per label,
    then the weights times the hidden states; ``memory``: the hidden states handed in from outside."""

    def __init__(self, d: int = 8, labels: int = 5):
        super().__init__()
        self.emb = nn.Embedding(9, d)
        self.w, self.u = nn.Linear(d, 6, bias=False), nn.Linear(6, labels, bias=False)

    def forward(self, ids, memory=None):
        h = self.emb(ids) if memory is None else memory
        att = torch.softmax(self.u(torch.tanh(self.w(h))), dim=1).transpose(1, 2)  # (B, labels, n)
        return att @ h


@pytest.mark.parametrize("handed_in", [False, True])
def test_weights_over_positions_that_capture_cannot_lay_out_are_a_warning_where_they_weigh_values(handed_in):
    """Label attention (per-label distributions over the tokens), and a read of a memory handed in from
    outside the call: the weights multiply values, so they are attention capture could not lay out, a
    warning (before: only a note in cap.skipped, no banner)."""
    torch.manual_seed(0)
    ids = torch.randint(1, 9, (2, 6))
    model = LabelAttention()
    cap = _captured(model, ids, torch.randn(2, 6, 8) if handed_in else None)
    assert cap.records == []
    assert len(cap.notes) == 1 and "not recorded: its weights multiply" in cap.notes[0], cap.notes
    assert not [n for n in cap.skipped if "product" not in str(n) and "for every feature" in str(n)]


def test_vector_attention_with_weights_per_channel_is_no_map_of_heads():
    """Point Transformer's vector attention over every point: ``attn_mlp(q[:, :, None] - k[:, None])`` softmaxed
    over the keys for each channel, ``(B, N, N, d)``. Every channel has weights of its own, over the keys,
    for every query: rows as many as the keys per channel, as a multi-head GATv2's per head, but each one
    feature of a projection, not a head's scores summed over its features. Not recorded, and said why: a
    warning, as its weights multiply the values (``(attn * v[:, None]).sum(2)``)."""

    class Vector(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv, self.mlp = nn.Embedding(9, 8), nn.Linear(8, 24), nn.Linear(8, 8)

        def forward(self, ids):
            q, k, v = self.qkv(self.emb(ids)).chunk(3, dim=-1)
            attn = self.mlp(q[:, :, None] - k[:, None]).softmax(dim=-2)  # (B, N, N, d): over the keys
            return (attn * v[:, None]).sum(2)

    for batch in (1, 2, 3):
        cap = _captured(Vector(), torch.randint(1, 9, (batch, 6)))
        assert cap.records == [] and len(cap.notes) == 1
        assert "not recorded: its weights multiply values" in cap.notes[0]
        assert "for every feature of a projection" in cap.notes[0]


def test_a_pointer_distribution_nothing_is_weighted_by_is_not_attention():
    """An additive pointer over the input positions (Vinyals et al.) that the model returns: a
    distribution over positions, but nothing is weighted by it, so it is noted as not attention; the
    same scores whose weights multiply the encoder states (Bahdanau) are recorded."""

    class Pointer(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.w1, self.w2 = nn.Embedding(9, 8), nn.Linear(8, 8), nn.Linear(8, 8)
            self.v = nn.Linear(8, 1, bias=False)

        def forward(self, ids, weigh: bool):
            e = self.emb(ids)
            d = e.mean(dim=1, keepdim=True)  # one decoder state per sequence
            u = self.v(torch.tanh(self.w1(e) + self.w2(d))).squeeze(-1)  # (B, n)
            self.used = F.softmax(u, dim=-1)
            return torch.bmm(self.used.unsqueeze(1), e) if weigh else self.used

    torch.manual_seed(0)
    model = Pointer()
    ids = torch.randint(1, 9, (3, 6))
    pointed = _captured(model, ids, False)
    assert pointed.records == [] and any("nothing is weighted by" in str(n) for n in pointed.skipped)
    weighed = _captured(model, ids, True)
    (rec,) = weighed.records
    assert rec.exact and rec.kind == "cross" and rec.probs.shape == (3, 1, 1, 6)
    torch.testing.assert_close(rec.probs, model.used[:, None, None, :], atol=0, rtol=0)


@pytest.mark.parametrize("how", ["sigmoid", "relu"])
def test_scores_that_multiply_values_without_a_softmax_are_a_warning(how):
    """Sigmoid attention (``sigmoid(q @ k.T) @ v``) and unnormalized ReLU attention make weights no
    softmax made: capture records softmax weights only, and says so instead of staying silent."""

    class NoSoftmax(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(9, 8), nn.Linear(8, 24)

        def forward(self, ids):
            b, n = ids.shape
            q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
            s = q @ k.transpose(-1, -2)
            w = torch.sigmoid(s) if how == "sigmoid" else torch.relu(s) / n
            return w @ v

    cap = _captured(NoSoftmax(), torch.randint(1, 9, (2, 5)))
    assert cap.records == []
    (note,) = cap.notes
    assert "without a softmax" in note and "not recorded" in note


@pytest.mark.parametrize("how", ["two axes", "unnormalized"])
def test_the_exp_of_scores_that_multiplies_values_is_said_once_as_a_softmax_not_followed(how):
    """Keras' softmax over a tuple of axes, ported as ``exp(s - logsumexp(s, (4, 5)))`` over keys laid out on
    two axes (``attention_axes=(1, 2)``), and an exp of the scores with no normalization: one warning, that
    an exp of scores could not be followed into a softmax; not that the scores weigh the values without one
    (that reading, sigmoid attention's, named the wrong cause)."""

    class Exp(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):  # (B, X, Y, C): attention over the X * Y grid, 2 heads of 4
            b, gx, gy, _ = x.shape
            q, k, v = self.qkv(x).view(b, gx, gy, 3, 2, 4).unbind(3)
            s = torch.einsum("bcdnh,bfgnh->bncdfg", q, k)
            if how == "two axes":
                w = torch.exp(s - torch.logsumexp(s, dim=(4, 5), keepdim=True))
            else:
                w = torch.exp(s)
            return torch.einsum("bncdfg,bfgnh->bcdnh", w, v)

    cap = _captured(Exp(), torch.randn(2, 3, 4, 8))
    assert cap.records == []
    (note,) = cap.notes
    assert "could not follow into a softmax" in note and "without a softmax" not in note


def test_a_softmax_over_keys_on_two_axes_is_flagged_with_that_reading():
    """A Keras ``attention_axes=(1, 2)`` port that softmaxes the (B, N, X, Y, X, Y) scores as
    ``flatten(-2).softmax(-1).view_as(scores)``: the keys of one query span slices of the product, which
    capture cannot lay out; the flag names a grid on two axes among its readings."""

    class Grid(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):
            b, gx, gy, _ = x.shape
            q, k, v = self.qkv(x).view(b, gx, gy, 3, 2, 4).unbind(3)
            s = torch.einsum("bfgnh,bcdnh->bncdfg", k, q)  # keys first, as Keras' dot equation
            w = s.flatten(-2).softmax(-1).view_as(s)
            return torch.einsum("bncdfg,bfgnh->bcdnh", w, v)

    cap = _captured(Grid(), torch.randn(2, 3, 4, 8))
    assert [r.exact for r in cap.records] == [False]
    assert "a second axis of queries or keys" in cap.records[0].flag
    assert len(cap.notes) == 1 and "a second axis of queries or keys" in cap.notes[0]


def test_the_exp_of_a_projection_that_is_no_softmax_is_not_a_warning():
    """A VAE's ``exp(0.5 * logvar)`` and an exp of a projection summed over its features: no softmax over
    positions is written by hand there, so nothing is recorded and nothing is warned of."""

    class Vae(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.mu, self.logvar = nn.Embedding(9, 8), nn.Linear(8, 4), nn.Linear(8, 4)

        def forward(self, ids):
            x = self.emb(ids)
            std = torch.exp(0.5 * self.logvar(x))
            e = torch.exp(self.mu(x))
            return self.mu(x) + std * (e / e.sum(-1, keepdim=True))

    cap = _captured(Vae(), torch.randint(1, 9, (2, 5)))
    assert cap.records == [] and cap.notes == []


class EdgeSoftmax(nn.Module):
    """A GraphGPS layer: attention over each node's edges as PyG computes it (scores per edge, the max
    per destination by ``scatter_reduce``, ``exp``, the sums by ``index_add_``), beside a global
    ``nn.MultiheadAttention`` over all nodes."""

    def __init__(self, dim: int = 8, in_place: bool = False):
        super().__init__()
        self.in_place = in_place  # torch_scatter's scatter_softmax: ``(src - max).exp_()``
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.glob = nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, x, src, dst):
        q, k, v = self.q(x), self.k(x), self.v(x)
        alpha = (q[dst] * k[src]).sum(-1)
        top = torch.full((x.shape[0],), float("-inf")).scatter_reduce(0, dst, alpha, "amax")
        e = (alpha - top[dst]).exp_() if self.in_place else torch.exp(alpha - top[dst])
        denom = torch.zeros(x.shape[0]).index_add_(0, dst, e)
        w = e / (denom[dst] + 1e-16)
        local = torch.zeros_like(v).index_add_(0, dst, v[src] * w[:, None])
        glob, _ = self.glob(x[None], x[None], x[None])
        return local + glob[0]


@pytest.mark.parametrize("in_place", [False, True])
def test_attention_over_edges_summed_by_a_scatter_is_a_warning(in_place):
    """(With torch_scatter's in-place ``exp_`` the per-edge map was missing without a word.)"""
    torch.manual_seed(0)
    src, dst = torch.tensor([0, 1, 2, 3, 0, 2]), torch.tensor([1, 0, 1, 2, 3, 3])
    cap = _captured(EdgeSoftmax(in_place=in_place).eval(), torch.randn(4, 8), src, dst)
    assert [r.name for r in cap.records] == ["glob"] and cap.records[0].exact
    assert len(cap.notes) == 1 and "scatter" in cap.notes[0] and "not recorded" in cap.notes[0]


class SlotAttention(nn.Module):
    """Slot attention (Locatello et al. 2020), one iteration: learned slots as queries, a softmax over
    the slots (dim=1), ``+ eps`` and renormalized over the tokens, then ``einsum("bjd,bij->bid", v, w)``
    with the weights as the second operand."""

    def __init__(self, dim: int = 8, slots: int = 3):
        super().__init__()
        self.emb, self.slots = nn.Embedding(VOCAB, dim), nn.Parameter(torch.randn(slots, dim))
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, ids):
        x = self.emb(ids)
        q = self.q(self.slots).expand(ids.shape[0], -1, -1)
        attn = torch.einsum("bid,bjd->bij", q, self.k(x)).softmax(dim=1) + 1e-8
        attn = attn / attn.sum(dim=-1, keepdim=True)
        return torch.einsum("bjd,bij->bid", self.v(x), attn)


class MultiHeadSlotAttention(nn.Module):
    """Slot attention with heads as lucidrains writes it: ``dots.flatten(1, 2).softmax(dim=1)`` (over the
    heads' slots together) viewed back to (b, h, slots, n), ``+ eps``, renormalized over the tokens, and
    ``einsum("... j d, ... i j -> ... i d", v, attn)`` with the weights second."""

    def __init__(self, dim: int = 8, slots: int = 3, heads: int = 1):
        super().__init__()
        self.heads = heads
        self.emb, self.slots = nn.Embedding(VOCAB, dim), nn.Parameter(torch.randn(slots, dim))
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        split = lambda t: t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2)  # noqa: E731
        q = split(self.q(self.slots).expand(b, -1, -1))
        k, v = split(self.k(x)), split(self.v(x))
        dots = torch.einsum("... i d, ... j d -> ... i j", q, k)
        attn = dots.flatten(1, 2).softmax(dim=1).view(b, self.heads, -1, n) + 1e-8
        attn = attn / attn.sum(dim=-1, keepdim=True)
        return torch.einsum("... j d, ... i j -> ... i d", v, attn)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_weights_renormalized_over_the_other_axis_are_recorded_as_multiplied(batch):
    """Slot attention: the values are multiplied by the softmax over the slots renormalized over the
    tokens. The record is those weights, (batch, 1, slots, tokens), exact, the tokens its keys (it held
    the softmax over the slots, transposed, flagged as changed after the softmax)."""
    torch.manual_seed(batch)
    model = SlotAttention().eval()
    ids = torch.randint(1, VOCAB, (batch, 5))
    cap = _captured(model, ids)
    (rec,) = cap.records
    with torch.no_grad():
        x = model.emb(ids)
        q = model.q(model.slots).expand(batch, -1, -1)
        attn = torch.einsum("bid,bjd->bij", q, model.k(x)).softmax(dim=1) + 1e-8
        want = (attn / attn.sum(dim=-1, keepdim=True))[:, None]
    assert rec.exact and rec.flag is None and not cap.notes
    assert rec.kind == "cross" and tuple(rec.probs.shape) == (batch, 1, 3, 5)
    torch.testing.assert_close(rec.probs, want, rtol=0, atol=0)


class IteratedSlotAttention(nn.Module):
    """Slot attention as google-research/slot_attention writes it (ported line by line): logits keys first
    (``einsum("bid,bjd->bij", k, q)``, (b, inputs, slots)), the softmax over the slots (last axis),
    ``+ eps``, renormalized over the inputs (dim=-2), ``einsum("bij,bid->bjd", attn, v)``, the slots
    updated by a GRUCell and an MLP, three iterations; ``used`` keeps what the values were multiplied
    with, (b, 1, slots, inputs)."""

    def __init__(self, dim: int = 8, slots: int = 3, iters: int = 3):
        super().__init__()
        self.iters = iters
        self.emb, self.mu = nn.Embedding(VOCAB, dim), nn.Parameter(torch.randn(1, slots, dim))
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.gru = nn.GRUCell(dim, dim)
        self.norm_slots = nn.LayerNorm(dim)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, _, d = x.shape
        k, v = self.k(x), self.v(x)
        slots = self.mu.expand(b, -1, -1)
        for _ in range(self.iters):
            q = self.q(self.norm_slots(slots)) * d**-0.5
            attn = torch.einsum("bid,bjd->bij", k, q).softmax(dim=-1) + 1e-8
            attn = attn / attn.sum(dim=-2, keepdim=True)
            self.used.append(attn.transpose(1, 2)[:, None].detach().clone())
            updates = torch.einsum("bij,bid->bjd", attn, v)
            slots = self.gru(updates.reshape(-1, d), slots.reshape(-1, d)).reshape(b, -1, d)
        return slots


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_iterated_slot_attention_keys_first_is_recorded_at_every_iteration(batch):
    """Each iteration's weights, renormalized over the inputs, are recorded exactly as (b, 1, slots,
    inputs), the slots' positions followed through the GRU into the next iteration's queries."""
    torch.manual_seed(batch)
    model = IteratedSlotAttention().eval()
    cap = _captured(model, torch.randint(1, VOCAB, (batch, 6)))
    assert len(cap.records) == len(model.used) == 3 and not cap.notes
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact and rec.kind == "cross"
        torch.testing.assert_close(rec.probs, used, rtol=0, atol=0)


def test_weights_renormalized_after_a_softmax_across_the_heads_are_flagged():
    """The softmax runs over the heads' slots together (``flatten(1, 2)``): whatever capture records of it is
    flagged, never exact."""
    torch.manual_seed(0)
    cap = _captured(MultiHeadSlotAttention().eval(), torch.randint(1, VOCAB, (2, 5)))
    assert cap.records and not any(r.exact for r in cap.records)
    assert all("changed after the softmax" in r.flag for r in cap.records) and cap.notes


class InterestPooling(nn.Module):
    """DIN (Deep Interest Network) as DeepCTR writes it: each behaviour is an item's and its category's
    embeddings joined (two fields of one position), the candidate the query; an MLP over
    ``cat([q, k, q - k, q * k])`` scores every behaviour, padding by ``torch.where``, the softmax over
    the behaviours, ``matmul`` with the keys."""

    def __init__(self, dim: int = 4):
        super().__init__()
        self.item, self.cate = nn.Embedding(VOCAB, dim), nn.Embedding(5, dim)
        self.mlp = nn.Sequential(nn.Linear(8 * dim, 8), nn.ReLU(), nn.Linear(8, 1))
        self.seen: list[torch.Tensor] = []

    def forward(self, target, target_cate, hist, hist_cate, lengths):
        q = torch.cat([self.item(target), self.cate(target_cate)], -1).unsqueeze(1)  # (B, 1, 2d)
        k = torch.cat([self.item(hist), self.cate(hist_cate)], -1)  # (B, T, 2d)
        qs = q.expand(-1, k.shape[1], -1)
        score = self.mlp(torch.cat([qs, k, qs - k, qs * k], dim=-1)).transpose(1, 2)  # (B, 1, T)
        keep = (torch.arange(k.shape[1])[None, :] < lengths[:, None]).unsqueeze(1)
        w = F.softmax(torch.where(keep, score, torch.ones_like(score) * (-(2**32) + 1)), dim=-1)
        self.seen.append(w)
        return torch.matmul(w, k)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_behaviours_of_two_fields_are_one_sequence_of_positions(batch):
    """Keys that join two embeddings of the same positions are those positions: the pooling is
    recorded, (sequences, 1, 1, behaviours), not taken for a class distribution."""
    torch.manual_seed(batch)
    model = InterestPooling().eval()
    hist, hist_cate = torch.randint(1, VOCAB, (batch, 5)), torch.randint(1, 5, (batch, 5))
    lengths = torch.tensor([5, 3, 2][:batch])
    cap = _captured(
        model, torch.randint(1, VOCAB, (batch,)), torch.randint(1, 5, (batch,)), hist, hist_cate, lengths
    )
    (rec,) = cap.records
    assert rec.exact and rec.kind == "cross" and rec.probs.shape == (batch, 1, 1, 5)
    assert torch.equal(rec.probs, model.seen[0][:, None])


class ObjectQueries(nn.Module):
    """DETR's decoder self-attention: learned object queries (``query_embed.weight``) attend to each
    other (``q = k = tgt + query_pos``, tgt the queries' content, zeros at the first layer), then
    over the image features."""

    def __init__(self, n: int = 5, dim: int = 8):
        super().__init__()
        self.query_embed = nn.Embedding(n, dim)
        self.self_attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, memory):
        b = memory.shape[0]
        query_pos = self.query_embed.weight.unsqueeze(0).expand(b, -1, -1)
        tgt = torch.zeros_like(query_pos)
        q = k = tgt + query_pos
        tgt = tgt + self.self_attn(q, k, tgt)[0]
        return self.cross_attn(tgt + query_pos, memory, memory)[0]


def test_learned_queries_among_themselves_are_self_attention():
    """The same learned positions as queries and keys attend to each other (self); over the image
    features they read another input (cross)."""
    torch.manual_seed(0)
    cap = _captured(ObjectQueries().eval(), torch.randn(2, 6, 8))
    first, second = cap.records
    assert first.exact and first.kind == "enc_self" and second.kind == "cross"


class EmptyMemory(nn.Module):
    """A streaming layer's first segment (torchaudio's Emformer): its memory is still empty, and joined
    to the keys all the same (``torch.cat([mems, utterance])``, sequence-first), heads
    folded batch-major by ``view(-1, B * H, d).transpose(0, 1)``."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.h = heads
        self.emb, self.q, self.kv = nn.Embedding(VOCAB, d), nn.Linear(d, d), nn.Linear(d, 2 * d)
        self.used: torch.Tensor | None = None

    def forward(self, ids):
        x = self.emb(ids).transpose(0, 1)  # (T, B, D)
        t, b, d = x.shape
        mems = x.new_zeros(0, b, d)
        key, value = self.kv(torch.cat([mems, x])).chunk(2, dim=2)
        q, k, v = (z.contiguous().view(-1, b * self.h, d // self.h).transpose(0, 1)
                   for z in (self.q(x), key, value))  # fmt: skip
        w = torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        self.used = w.view(b, self.h, t, -1)
        return torch.bmm(w, v)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_an_empty_memory_joined_to_the_keys_keeps_their_lineage(batch):
    """The empty part adds no key: the keys keep their positions and the record is exact, each key
    labelled by the token it is (the lineage was lost at the join, and the record was a guess from the
    shape, flagged)."""
    torch.manual_seed(batch)
    model = EmptyMemory().eval()
    cap = _captured(model, torch.randint(1, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert rec.exact and rec.flag is None and not cap.notes
    torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=0)


class TopKScattered(nn.Module):
    """The sinkhorn transformer's ``differentiable_topk`` after a softmax: ``values, idx = w.topk(k)``, put
    back into ``zeros_like(w).scatter_(-1, idx, values)``, whose sparse copy multiplies the values; or the
    same pruning kept as the weights masked (``w.masked_fill(w < kth, 0)``), which capture follows."""

    def __init__(self, scatter: bool, d: int = 8, heads: int = 2):
        super().__init__()
        self.scatter, self.h = scatter, heads
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
        self.used: torch.Tensor | None = None

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        w = (q @ k.transpose(-1, -2)).softmax(-1)
        if self.scatter:
            values, idx = w.topk(2, dim=-1)
            w = torch.zeros_like(w).scatter_(-1, idx, values)
        else:
            w = w.masked_fill(w < w.topk(2, dim=-1).values[..., -1:], 0.0)
        self.used = w
        return w @ v


@pytest.mark.parametrize("scatter", [True, False])
def test_weights_pruned_to_their_top_k_are_flagged_or_followed(scatter):
    """Put back by a scatter, the sparse copy the values are multiplied with is no record's: the record of
    the softmax is flagged and the notes say why (it was exact, holding the dense weights); masked in
    place of the weights, the record is the pruned weights, exact."""
    torch.manual_seed(1)
    model = TopKScattered(scatter).eval()
    cap = _captured(model, torch.randint(1, VOCAB, (2, 6)))
    (rec,) = cap.records
    if scatter:
        assert not rec.exact and "picked after the softmax (top-k" in rec.flag and cap.notes
    else:
        assert rec.exact and not cap.notes
        torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=0)


class MaskEmbeddings(nn.Module):
    """SAINT's ``embed_data_mask``: the cells whose value is missing take a learned mask embedding of the
    same cell, written in place (``x[mask == 0] = mask_emb[mask == 0]``, or by integer indices)."""

    def __init__(self, integer: bool, d: int = 8, n: int = 4):
        super().__init__()
        self.integer = integer
        self.embeds, self.mask_embeds = nn.Embedding(VOCAB, d), nn.Embedding(2 * n, d)
        self.register_buffer("offset", torch.arange(n) * 2)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.used: torch.Tensor | None = None

    def forward(self, ids, mask):
        x = self.embeds(ids)
        m = self.mask_embeds(mask + self.offset)
        if self.integer:
            b, t = (mask == 0).nonzero(as_tuple=True)
            x[b, t] = m[b, t]
        else:
            x[mask == 0] = m[mask == 0]
        bsz, n, d = x.shape
        q, k, v = self.qkv(x).view(bsz, n, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        self.used = (q @ k.transpose(-1, -2)).softmax(-1)
        return self.used @ v


@pytest.mark.parametrize("integer", [False, True])
def test_cells_given_another_embedding_of_themselves_keep_their_positions(integer):
    """The cell written in place is still the same cell: exact, no note (flagged as a rotating cache read in
    its slots' order, the keys taken for tokens of two calls)."""
    torch.manual_seed(0)
    model = MaskEmbeddings(integer).eval()
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[1, 1] = 0
    cap = _captured(model, torch.randint(1, VOCAB, (2, 4)), mask)
    (rec,) = cap.records
    assert rec.exact and not cap.notes
    torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=0)
    assert rec.key_positions.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


class ScaledEdgeSoftmax(EdgeSoftmax):
    """SAN's full-graph layer as DGL's send_and_recv writes it: the exps of real and fake edges scaled by
    constants (``/ (L + 1)``, ``L * ... / (L + 1)``) and joined by ``torch.cat`` before ``index_add_`` sums them
    per destination."""

    def forward(self, x, src, dst):
        q, k, v = self.q(x), self.k(x), self.v(x)
        s = torch.exp((q[dst] * k[src]).sum(-1, keepdim=True).clamp(-5, 5))
        half = src.numel() // 2
        s = torch.cat([s[:half] / 1.5, 0.5 * s[half:] / 1.5], 0)
        z = torch.zeros(x.shape[0], 1).index_add_(0, dst, s)
        local = torch.zeros_like(v).index_add_(0, dst, v[src] * s) / (z + 1e-6)
        glob, _ = self.glob(x[None], x[None], x[None])
        return local + glob[0]


def test_exps_scaled_and_joined_before_a_scatter_sums_them_are_a_warning():
    """Scaled by constants and joined, the exps are still a softmax over groups a scatter sums: warned (they
    went unrecorded and unsaid, the other attention's record silencing the note that none was seen)."""
    torch.manual_seed(0)
    src, dst = torch.tensor([0, 1, 2, 3, 0, 2]), torch.tensor([1, 0, 1, 2, 3, 3])
    cap = _captured(ScaledEdgeSoftmax().eval(), torch.randn(4, 8), src, dst)
    assert [r.name for r in cap.records] == ["glob"] and cap.records[0].exact
    assert len(cap.notes) == 1 and "scatter" in cap.notes[0] and "not recorded" in cap.notes[0]


@pytest.mark.parametrize("make", ["new_zeros", "torch.zeros"])
def test_scores_written_by_slices_into_a_tensor_of_their_own_are_a_warning(make):
    """Longformer's diagonals: the scores copied by slice assignment into ``scores.new_zeros(...)`` (or
    ``torch.zeros``), then softmaxed. Capture does not follow the copy: the map is not recorded, and a warning
    says why (it was skipped as no attention, or not seen at all)."""

    class Diagonals(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qk = nn.Embedding(9, 8), nn.Linear(8, 16)

        def forward(self, ids):
            b, n = ids.shape
            q, k = self.qk(self.emb(ids)).view(b, n, 2, 2, 4).permute(2, 0, 3, 1, 4)
            s = q @ k.transpose(-1, -2)
            band = s.new_zeros(b, 2, n, 3) if make == "new_zeros" else torch.zeros(b, 2, n, 3)
            band[:, :, :, 1] = s.diagonal(dim1=-2, dim2=-1)
            band[:, :, 1:, 0] = s.diagonal(offset=-1, dim1=-2, dim2=-1)
            band[:, :, :-1, 2] = s.diagonal(offset=1, dim1=-2, dim2=-1)
            return band.softmax(-1)

    cap = _captured(Diagonals(), torch.randint(1, 9, (2, 5)))
    assert cap.records == []
    (note,) = cap.notes
    assert "not recorded" in note and "scores written by slices" in note


def test_context_pooling_after_an_interpolation_is_a_warning():
    """GCNet's context block over a feature map resized by F.interpolate (lineage does not follow it): one
    softmax over the pixels that weighs the features, so a warning, not a note only (it went missing)."""

    class ContextBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.reduce, self.conv_mask = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 1, 1)

        def forward(self, x):
            x = F.interpolate(self.reduce(x), size=(4, 4), mode="bilinear")
            b, c, h, w = x.shape
            mask = F.softmax(self.conv_mask(x).view(b, 1, h * w), dim=2)
            return torch.matmul(x.view(b, 1, c, h * w), mask.unsqueeze(-1))

    torch.manual_seed(0)
    cap = _captured(ContextBlock().eval(), torch.randn(2, 3, 7, 7))
    assert cap.records == [] and len(cap.notes) == 1 and "F.interpolate" in cap.notes[0], cap.notes


class SwitchLayer(nn.Module):
    """GShard / Switch routing written by hand, beside a self-attention: the expert one-hot and the capacity
    slots' one-hot of a router's argmax, joined by ``einsum('gse,gsc->gsec')`` into a 0/1 dispatch tensor
    that gathers the tokens into expert slots (``einsum('gsec,gsm->egcm', dispatch, x)``)."""

    def __init__(self, d: int = 8, experts: int = 4, capacity: int = 3):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(30, d), nn.Linear(d, 3 * d)
        self.wg = nn.Parameter(torch.randn(d, experts) * 0.1)
        self.w_expert = nn.Parameter(torch.randn(experts, d, d) * 0.1)
        self.E, self.C = experts, capacity

    def forward(self, ids):
        x = self.emb(ids)
        q, k, v = self.qkv(x).chunk(3, -1)
        self.used = (q @ k.transpose(-1, -2)).softmax(-1)
        x = x + self.used @ v
        router_probs = torch.softmax(torch.einsum("gsm,me->gse", x, self.wg), dim=-1)
        expert_mask = F.one_hot(router_probs.argmax(-1), self.E).to(x.dtype)
        pos = torch.cumsum(expert_mask, dim=1) * expert_mask - 1.0
        expert_mask = expert_mask * torch.lt(pos, self.C).to(x.dtype)
        pos_onehot = F.one_hot((pos * expert_mask).sum(-1).long(), self.C).to(x.dtype)
        dispatch = torch.einsum("gse,gsc->gsec", expert_mask, pos_onehot)
        combine = (router_probs * expert_mask).sum(-1)[..., None, None] * dispatch
        expert_in = torch.einsum("gsec,gsm->egcm", dispatch, x)
        expert_out = torch.einsum("egcm,emn->egcn", expert_in, self.w_expert)
        return torch.einsum("gsec,egcm->gsm", combine, expert_out)


def test_a_routers_dispatch_made_from_its_argmax_is_no_query_key_product():
    """The one-hots of a router's argmax are made by the model from integers, not activations from outside:
    their product is no query-key map, so nothing warns of scores multiplying values without a softmax (every
    Switch layer was told so); the self-attention beside it stays exact, and an image handed in as integers
    (``images.float()``) is still data from outside."""
    torch.manual_seed(0)
    model = SwitchLayer().eval()
    cap = _captured(model, torch.randint(0, 30, (2, 6)))
    assert cap.notes == [], cap.notes
    (rec,) = cap.records
    assert rec.exact and torch.equal(rec.probs[:, 0], model.used)

    class PixelsAsInts(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch, self.qk = nn.Conv2d(3, 8, 2, stride=2), nn.Linear(8, 16)

        def forward(self, images):
            x = self.patch(images.float() / 255).flatten(2).transpose(1, 2)
            q, k = self.qk(x).chunk(2, -1)
            return (q @ k.transpose(-1, -2)).softmax(-1) @ x

    cap = _captured(PixelsAsInts().eval(), torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8))
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and cap.notes == []


def test_a_memory_read_by_a_product_and_a_sum_is_a_warning_and_a_class_table_is_not():
    """An NTM read of a memory handed in, written ``(w[..., None] * memory).sum(1)``: its weights multiply
    values, a warning as the bmm form gets; a classifier's softmax over classes times a table of class
    embeddings handed in (no batch axis) weighs no positions: a note only."""

    class Read(nn.Module):
        def __init__(self):
            super().__init__()
            self.key = nn.Linear(8, 8)

        def forward(self, h, memory, table):
            w = F.softmax(F.cosine_similarity(self.key(h)[:, None], memory, dim=-1), dim=1)  # (B, N)
            read = (w.unsqueeze(-1) * memory).sum(1)
            classes = F.softmax(self.key(h) @ table.T, dim=-1) @ table  # (B, C) @ (C, 8)
            return read + classes

    torch.manual_seed(0)
    cap = _captured(Read(), torch.randn(2, 8), torch.randn(2, 5, 8), torch.randn(3, 8))
    assert cap.records == [] and len(cap.notes) == 1, cap.notes
    assert "(2, 5)" in cap.notes[0] and "not recorded: its weights multiply a tensor" in cap.notes[0]
    assert [n.shape for n in cap.skipped] == [(2, 3)]


class NTMReadHead(nn.Module):
    """pytorch-ntm's read head: content weights ``softmax(beta * cosine)`` over the memory rows, interpolated
    with the last step's weights, shifted by a circular convolution a sequence at a time (``cat`` +
    ``conv1d``, written into a new tensor by rows), sharpened (``w ** gamma / sum``), then the memory read
    by ``matmul``. The weights the rows are multiplied with are the sharpened ones (kept in ``used``)."""

    def __init__(self, n: int = 7, m: int = 8, c: int = 16):
        super().__init__()
        self.fc_read = nn.Linear(c, m + 1 + 1 + 3 + 1)
        self.m, self.used = m, []

    def forward(self, h, w_prev, memory):
        o = self.fc_read(h)
        k, beta, g, s, gamma = torch.split(o, [self.m, 1, 1, 3, 1], dim=1)
        beta, g, s, gamma = F.softplus(beta), torch.sigmoid(g), F.softmax(s, dim=1), 1 + F.softplus(gamma)
        wc = F.softmax(beta * F.cosine_similarity(memory + 1e-16, k.unsqueeze(1) + 1e-16, dim=-1), dim=1)
        wg = g * wc + (1 - g) * w_prev
        result = torch.zeros(wg.size())
        for b in range(wg.shape[0]):
            t = torch.cat([wg[b][-1:], wg[b], wg[b][:1]])
            result[b] = F.conv1d(t.view(1, 1, -1), s[b].view(1, 1, -1)).view(-1)
        w = result**gamma
        w = torch.div(w, torch.sum(w, dim=1).view(-1, 1) + 1e-16)
        self.used.append(w)
        return torch.matmul(w.unsqueeze(1), memory).squeeze(1), w


def test_weights_changed_after_a_left_out_softmax_before_a_read_are_a_warning():
    """An NTM's read weights are its content softmax interpolated, shifted by a convolution written row by
    row into a new tensor, and sharpened: none of them is a softmax's output, and the 2-D softmax was noted
    as no attention. The read with them is a warning that says the weights changed after the softmax (it
    was information only, with no word of the read), over two steps; a class softmax mixed with a prior
    and read against a class table (no batch axis) stays a note."""
    torch.manual_seed(0)
    head = NTMReadHead().eval()
    h, memory = torch.randn(2, 16), torch.randn(2, 7, 8)
    with torch.no_grad(), capture_attention(head) as cap:
        _, w = head(h, torch.zeros(2, 7), memory)
        head(h, w, memory)
    assert cap.records == [], cap.records
    assert (
        len(cap.notes) == 1 and "(2, 7): not recorded: its weights, changed after the softmax" in cap.notes[0]
    )
    assert all("(2, 7)" not in str(n) for n in cap.skipped), cap.skipped

    class PriorMixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.key = nn.Linear(8, 8)

        def forward(self, h, table, prior):
            p = 0.5 * F.softmax(self.key(h) @ table.T, dim=-1) + 0.5 * prior  # (B, C)
            return torch.cat([p, p], 0)[: len(h)] @ table

    cap = _captured(PriorMixed(), torch.randn(2, 8), torch.randn(3, 8), torch.full((3,), 1 / 3))
    assert cap.records == [] and cap.notes == [], cap.notes
    assert [n.shape for n in cap.skipped] == [(2, 3)]


class TiledPairs(nn.Module):
    """AllenNLP's BiDAF similarity (``LegacyMatrixAttention(LinearSimilarity("x,y,x*y"))``): both texts tiled
    pairwise, ``w . [x; y; x * y]``, then ``masked_softmax`` (weights times the mask, renormalized) and a
    weighted sum by ``bmm``; or DIIN's self-attention, weighing the values by a product and a sum."""

    def __init__(self, diin: bool, d: int = 8):
        super().__init__()
        self.diin = diin
        self.emb, self.w = nn.Embedding(20, d), nn.Linear(3 * d, 1)

    def forward(self, p_ids, q_ids):
        p, q = self.emb(p_ids), self.emb(p_ids if self.diin else q_ids)
        lp, lq = p.shape[1], q.shape[1]
        x, y = p.unsqueeze(2).expand(-1, -1, lq, -1), q.unsqueeze(1).expand(-1, lp, -1, -1)
        sim = self.w(torch.cat([x, y, x * y], -1)).squeeze(-1)  # (B, lp, lq)
        if self.diin:
            a = sim.softmax(-1)
            return (a.unsqueeze(3) * q.unsqueeze(1)).sum(2)
        mask = (q_ids != 0).float()[:, None, :]
        a = sim.softmax(-1) * mask
        a = a / (a.sum(-1, keepdim=True) + 1e-13)
        return torch.bmm(a, q)


@pytest.mark.parametrize("diin", [False, True])
def test_a_similarity_scored_over_tiled_pairs_is_recorded_exactly(diin):
    """Scores from a projection of paired features (``w . [x_i; y_j; x_i * y_j]`` over the tiled pairs) are a
    function of each (query, key) pair, laid out by the pairs' rows and columns: recorded exactly, the
    passage's queries over the question's keys (cross) with the padding the renormalization hides, or DIIN's
    self-attention. (They were a warning, "scores capture could not trace to queries times keys", and the
    map went missing.)"""
    torch.manual_seed(0)
    ids = torch.randint(1, 20, (2, 5))
    ids[1, 3:] = 0
    q_ids = torch.randint(1, 20, (2, 4))
    q_ids[0, 2:] = 0
    m = TiledPairs(diin).eval()
    cap = _captured(m, ids, q_ids)
    (rec,) = cap.records
    with torch.no_grad():
        p, q = m.emb(ids), m.emb(ids if diin else q_ids)
        x, y = p.unsqueeze(2).expand(-1, -1, q.shape[1], -1), q.unsqueeze(1).expand(-1, p.shape[1], -1, -1)
        want = m.w(torch.cat([x, y, x * y], -1)).squeeze(-1).softmax(-1)
        if not diin:
            want = want * (q_ids != 0).float()[:, None, :]
            want = want / (want.sum(-1, keepdim=True) + 1e-13)
    assert rec.exact and rec.kind == "cross" and tuple(rec.probs.shape) == (2, 1, 5, 5 if diin else 4)
    torch.testing.assert_close(rec.probs[:, 0], want)
    if not diin:  # (the renormalization's mask: the question's padding hidden from every passage position)
        assert rec.mask is not None and torch.equal(rec.mask[0, 0], q_ids[0] != 0)
    else:  # (two embedding calls of the same ids: cross, and said, as for any model written so)
        assert len(cap.notes) == 1 and "two embedding calls of the same token ids" in cap.notes[0]


def test_a_one_vector_softmax_that_weighs_values_is_a_warning():
    """A decoder step of a batch of one written without a batch axis (graykode's nlp-tutorial): scores
    ``(n,)``, a 1-D softmax, ``weights @ enc_outputs``. Its weights multiply values over positions: a warning
    (it was information only, with no word of the read); a 1-D softmax that weighs nothing stays a note."""

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.attn = nn.Embedding(VOCAB, 8), nn.Linear(8, 8)

        def forward(self, src, q_id, read: bool = True):
            enc = self.emb(src)  # (n, 8)
            w = F.softmax(self.attn(enc) @ self.emb(q_id)[0], dim=0)  # (n,)
            return w @ enc if read else w.argmax()

    torch.manual_seed(0)
    src = torch.randint(0, VOCAB, (5,))
    cap = _captured(Step().eval(), src, torch.tensor([3]))
    assert cap.records == [] and len(cap.notes) == 1, cap.notes
    assert "(5,): not recorded: its weights multiply values over positions" in cap.notes[0]
    cap = _captured(Step().eval(), src, torch.tensor([3]), False)
    assert cap.notes == [] and [n.shape for n in cap.skipped] == [(5,)]


@pytest.mark.parametrize("how", ["softmax", "by-hand"])
def test_numpy_keyword_names_are_read_as_torch_names(how):
    """Code ported from numpy passes ``axis=`` and ``keepdims=`` (torch takes them for ``dim=`` and
    ``keepdim=``): the softmax over the keys is recorded exactly, as with ``dim=`` (it was read over torch's
    implicit dim and flagged as a softmax across heads, or the sum missed and the weights called no softmax)."""

    class Ported(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(VOCAB, 8), nn.Linear(8, 24)

        def forward(self, ids):
            b, n = ids.shape
            q, k, v = (t.view(b, n, 2, 4).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
            s = q @ k.transpose(-1, -2)
            if how == "softmax":
                self.w = torch.softmax(s, axis=-1)
            else:
                e = torch.exp(s - s.amax(axis=-1, keepdims=True))
                self.w = e / e.sum(axis=-1, keepdims=True)
            return self.w @ v

    torch.manual_seed(0)
    model = Ported().eval()
    cap = _captured(model, torch.randint(0, VOCAB, (2, 5)))
    (rec,) = cap.records
    assert rec.exact and cap.notes == [] and torch.allclose(rec.probs, model.w)


def test_a_learned_query_picked_by_a_zero_dim_index_is_recorded():
    """``self.query_emb(torch.tensor(0))`` (one vector fetched by a 0-d index) as the query of a pooling
    attention: recorded exactly, as with ``torch.tensor([0])`` (bookkeeping raised IndexError on the 0-d
    index, and the record was flagged as a guess)."""

    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.query_emb, self.k = nn.Embedding(VOCAB, 8), nn.Embedding(1, 8), nn.Linear(8, 8)

        def forward(self, ids):
            x = self.emb(ids)
            q = self.query_emb(torch.tensor(0)).reshape(1, 1, 8).expand(x.shape[0], 1, 8)
            self.w = torch.softmax(q @ self.k(x).transpose(1, 2), dim=-1)
            return self.w @ x

    torch.manual_seed(0)
    model = Pool().eval()
    cap = _captured(model, torch.randint(0, VOCAB, (3, 5)))
    (rec,) = cap.records
    assert cap.notes == [] and rec.exact and torch.allclose(rec.probs[:, 0], model.w)


class AdditiveReads(nn.Module):
    """A decoder state reading encoder outputs by additive energies ``v(tanh(W h + U s))`` made into weights:
    a softmax (Bahdanau), one written by hand, Raffel's monotonic expected alignment (``p * cumprod(1 - p)``
    of a sigmoid), MoChA's ``exp(u) / moving_sum``; or the energies as a gate on the features (no read)."""

    def __init__(self, how: str, d: int = 8):
        super().__init__()
        self.how = how
        self.emb, self.w, self.u, self.v = (
            nn.Embedding(VOCAB, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
            nn.Linear(d, 1),
        )

    def forward(self, ids):
        h = self.emb(ids)
        s = h.mean(1)  # a decoder state
        e = self.v(torch.tanh(self.w(h) + self.u(s)[:, None])).squeeze(-1)  # (B, T)
        if self.how == "gate":
            return h * torch.sigmoid(e)[..., None]
        if self.how == "softmax":
            a = F.softmax(e, dim=1)
        elif self.how == "by hand":
            x = torch.exp(e - e.amax(1, keepdim=True))
            a = x / x.sum(1, keepdim=True)
        elif self.how == "monotonic":
            p = torch.sigmoid(e)
            a = p * torch.cumprod(torch.cat([torch.ones_like(p[:, :1]), 1 - p[:, :-1]], 1), 1)
        else:
            x = torch.exp(e - e.max(1, keepdim=True)[0])
            a = x / F.conv1d(F.pad(x, (2, 0)).unsqueeze(1), torch.ones(1, 1, 3)).squeeze(1)
        self.a = a
        return torch.bmm(a.unsqueeze(1), h).squeeze(1)


@pytest.mark.parametrize("how", ["softmax", "by hand", "monotonic", "mocha", "gate"])
@pytest.mark.parametrize("batch", [1, 3])
def test_weights_made_from_additive_energies_without_a_softmax_are_a_warning(how, batch):
    """Monotonic and chunkwise attention's weights are no softmax: where they multiply values, a warning (there
    was no word, unlike the same weights from dot-product scores); a softmax of the energies, by torch or by
    hand, is recorded exactly with no warning, and the energies as a gate on the features warn of nothing."""
    torch.manual_seed(batch)
    model = AdditiveReads(how).eval()
    cap = _captured(model, torch.randint(0, VOCAB, (batch, 6)))
    if how in ("softmax", "by hand"):
        (rec,) = cap.records
        assert rec.exact and cap.notes == [] and torch.allclose(rec.probs[:, 0, 0], model.a)
    elif how == "gate":  # (no attention at all: said once, as for any model without it)
        assert cap.records == [] and not [n for n in cap.notes if "energies" in n], cap.notes
    else:
        assert cap.records == [] and len(cap.notes) == 1, cap.notes
        assert f"({batch}, 1, 6): weights over positions made from energies without a softmax" in cap.notes[0]


class GroupedVector(nn.Module):
    """Point Transformer V2's grouped vector attention: weights ``(n, nsample, groups)`` from an MLP of the
    gathered ``k - q``, a softmax over the neighbours (``dim=1``), the neighbour mask applied by ``einsum("n s
    g, n s -> n s g", w, sign(idx + 1))``, and the gathered values read by ``einsum("n s g i, n s g -> n g
    i")``; or the same weights read by a broadcast product and a sum."""

    def __init__(self, how: str, c: int = 8, g: int = 2, ns: int = 3):
        super().__init__()
        self.how, self.g, self.ns = how, g, ns
        self.q, self.k, self.v, self.we = nn.Linear(3, c), nn.Linear(3, c), nn.Linear(3, c), nn.Linear(c, g)

    def forward(self, coord):
        idx = torch.cdist(coord, coord).topk(self.ns, largest=False).indices
        q, k, v = self.q(coord), self.k(coord)[idx], self.v(coord)[idx]
        w = torch.softmax(self.we(k - q[:, None]), dim=1)
        v = v.view(*v.shape[:2], self.g, -1)
        if self.how == "einsum":
            w = torch.einsum("n s g, n s -> n s g", w, torch.sign(idx + 1))
            return torch.einsum("n s g i, n s g -> n g i", v, w)
        return (v * w[..., None]).sum(1)


@pytest.mark.parametrize("how", ["einsum", "broadcast"])
def test_grouped_vector_weights_masked_by_an_einsum_still_warn_where_they_read_values(how):
    """The softmax (not over the last axis) is left out; its weights, masked by an einsum, read values over
    the neighbours: a warning (it was information only); a view for the broadcast is not a change."""
    torch.manual_seed(0)
    cap = _captured(GroupedVector(how).eval(), torch.randn(6, 3))
    assert cap.records == [] and len(cap.notes) == 1, cap.notes
    assert (
        "(6, 3, 2): not recorded: its weights" in cap.notes[0]
        and "multiply values over positions" in cap.notes[0]
    )
    assert ("changed after the softmax" in cap.notes[0]) == (how == "einsum")


def test_a_sparse_softmax_over_a_graphs_edges_is_a_warning():
    """``torch.sparse.softmax`` of per-edge scores then ``torch.sparse.mm`` with the values: attention over a
    graph's edges, which capture does not record; it says so (it said nothing beside a dense attention, and
    alone that no softmax was seen)."""

    class EdgeAttention(nn.Module):
        def __init__(self, dense: bool, d: int = 8):
            super().__init__()
            self.dense, self.emb = dense, nn.Embedding(VOCAB, d)
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

        def forward(self, z, edges):
            x = self.emb(z)
            if self.dense:
                x = x + torch.softmax(self.q(x) @ self.k(x).t(), -1) @ x
            src, dst = edges
            s = (self.q(x)[dst] * self.k(x)[src]).sum(-1)
            a = torch.sparse.softmax(
                torch.sparse_coo_tensor(torch.stack([dst, src]), s, (len(z), len(z)), check_invariants=True),
                dim=1,
            )
            return torch.sparse.mm(a, self.v(x))

    z = torch.randint(0, VOCAB, (6,))
    edges = torch.stack([torch.tensor([0, 1, 2, 3, 4, 5, 1, 2]), torch.tensor([0, 1, 2, 3, 4, 5, 0, 1])])
    for dense in (False, True):
        torch.manual_seed(0)
        cap = _captured(EdgeAttention(dense).eval(), z, edges)
        assert len(cap.records) == int(dense) and len(cap.notes) == 1, cap.notes
        assert "(6, 6): a sparse softmax (torch.sparse.softmax" in cap.notes[0]


class _Spmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indices, values, shape, b):
        return torch.matmul(torch.sparse_coo_tensor(indices, values, shape, check_invariants=True), b)


class SparseGraphLayer(nn.Module):
    """pyGAT's ``SpGraphAttentionLayer``: per-edge ``exp(-leakyrelu(a . [h_i; h_j]))`` put into a sparse matrix
    by a custom autograd Function, the neighbours' features summed by it and divided by the row sums; or
    (``gcn``) a normalized adjacency handed in, multiplied the same way (no weights of the model's)."""

    def __init__(self, gcn: bool, fin: int = 5, fout: int = 4):
        super().__init__()
        self.gcn = gcn
        self.w, self.a = nn.Parameter(torch.randn(fin, fout)), nn.Parameter(torch.randn(1, 2 * fout))

    def forward(self, x, adj):
        n, edge, h = x.shape[0], adj.nonzero().t(), torch.mm(x, self.w)
        if self.gcn:
            return _Spmm.apply(edge, adj[edge[0], edge[1]] / adj.sum(1)[edge[0]], torch.Size([n, n]), h)
        edge_h = torch.cat((h[edge[0], :], h[edge[1], :]), dim=1).t()
        edge_e = torch.exp(-F.leaky_relu(self.a.mm(edge_h).squeeze(), 0.2))
        rowsum = _Spmm.apply(edge, edge_e, torch.Size([n, n]), torch.ones(n, 1))
        return F.elu(_Spmm.apply(edge, edge_e, torch.Size([n, n]), h).div(rowsum))


def test_weights_over_a_graphs_edges_in_a_sparse_matrix_are_a_warning():
    """The per-edge weights multiply the neighbours' features through a sparse product: a warning (there was
    no word); a normalized adjacency handed in and multiplied the same way is no attention and warns nothing."""
    torch.manual_seed(0)
    adj = (torch.rand(7, 7) < 0.4).float()
    adj = ((adj + adj.t() + torch.eye(7)) > 0).float()
    cap = _captured(SparseGraphLayer(False).eval(), torch.randn(7, 5), adj)
    assert len(cap.notes) == 1 and "(7, 7): weights over a graph's edges" in cap.notes[0], cap.notes
    cap = _captured(SparseGraphLayer(True).eval(), torch.randn(7, 5), adj)
    assert not [n for n in cap.notes if "graph's edges" in n], cap.notes


class GatesAndLosses(nn.Module):
    """Softmaxes that weigh no positions beside one self-attention: SKNet's branch weights ``(B, M, C, 1, 1)``
    over every pixel, an MDN's mixture ``pi.unsqueeze(-1) * mu``, a segmentation head's class softmax times a
    one-hot target or its own log (a Dice loss, an entropy), and an InfoNCE loss's ``log_softmax`` of
    similarities that is never exponentiated."""

    def __init__(self, how: str, d: int = 8):
        super().__init__()
        self.how = how
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
        self.conv, self.fc, self.pi, self.mu = (
            nn.Conv2d(3, 2 * 4, 3, padding=1),
            nn.Linear(4, 2 * 4),
            nn.Linear(d, 3),
            nn.Linear(d, 3 * 2),
        )

    def forward(self, ids, img, target):
        x = self.emb(ids)
        q, k, v = self.qkv(x).chunk(3, -1)
        x = x + (q @ k.transpose(1, 2)).softmax(-1) @ v
        if self.how == "sknet":
            feats = self.conv(img).view(img.shape[0], 2, 4, *img.shape[2:])  # (B, M, C, H, W)
            a = self.fc(feats.sum(1).mean((2, 3))).view(-1, 2, 4, 1, 1).softmax(dim=1)
            return x, (feats * a).sum(1)
        if self.how == "mdn":
            h = x.mean(1)
            pi = F.softmax(self.pi(h), -1)
            return x, (pi.unsqueeze(-1) * self.mu(h).view(-1, 3, 2)).sum(1)
        if self.how in ("dice", "entropy"):
            probs = F.softmax(self.conv(img)[:, :4], dim=1)  # (B, C, H, W)
            other = F.one_hot(target, 4).permute(0, 3, 1, 2).float() if self.how == "dice" else probs.log()
            return x, (probs * other).sum((0, 2, 3))
        z = F.normalize(x.mean(1), dim=-1)
        return x, -F.log_softmax(z @ z.t() / 0.07, dim=-1).diagonal().mean()


@pytest.mark.parametrize("how", ["sknet", "mdn", "dice", "entropy", "infonce"])
def test_softmaxes_that_weigh_no_positions_warn_of_nothing(how):
    """Each of these weighs no values over positions: information at most (each was a warning that its weights
    multiply values over positions, or that an exp of query-key scores was not followed); the self-attention
    beside them stays exact."""
    torch.manual_seed(0)
    cap = _captured(
        GatesAndLosses(how).eval(),
        torch.randint(0, VOCAB, (3, 5)),
        torch.randn(3, 3, 4, 5),
        torch.randint(0, 4, (3, 4, 5)),
    )
    assert cap.notes == [], cap.notes
    assert len(cap.records) >= 1 and cap.records[0].exact and cap.records[0].kind == "enc_self"


class FieldGate(nn.Module):
    """FiBiNET's SENET with a softmax excitation: each field squeezed to a number, a Linear over the fields, a
    softmax over them; the fields scaled by it (a gate: no sum over them), or pooled by it (``bmm``)."""

    def __init__(self, pool: bool, fields: int = 4, d: int = 8):
        super().__init__()
        self.pool, self.emb, self.excitation = (
            pool,
            nn.Embedding(VOCAB, d),
            nn.Linear(fields, fields, bias=False),
        )

    def forward(self, ids):
        x = self.emb(ids)  # (B, F, d): one id a field
        a = torch.softmax(self.excitation(x.mean(-1)), dim=-1)
        return torch.bmm(a.unsqueeze(1), x) if self.pool else (x * a.unsqueeze(-1)).flatten(1)


@pytest.mark.parametrize("pool", [False, True])
def test_weights_a_projection_made_over_the_fields_are_no_map(pool):
    """Weights made by a projection over the positions are a synthesizer's, no map of queries over keys: a gate
    is a note, a read with them a warning (each was an exact cross map over ``<pooled i>`` keys)."""
    torch.manual_seed(0)
    cap = _captured(FieldGate(pool).eval(), torch.randint(0, VOCAB, (2, 4)))
    assert cap.records == []
    assert len(cap.notes) == int(pool) and len(cap.skipped) == int(not pool), (cap.notes, cap.skipped)


class WhisperAttention(nn.Module):
    """Whisper's MultiHeadAttention: returns its output and its scores (``qk.detach()``), for hooks to keep."""

    def __init__(self, d: int = 8, h: int = 2):
        super().__init__()
        self.h, self.query, self.key, self.value = h, nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, xa=None):
        src = x if xa is None else xa
        q, k, v = self.query(x), self.key(src), self.value(src)
        scale = (q.shape[-1] // self.h) ** -0.25
        q = q.view(*q.shape[:2], self.h, -1).permute(0, 2, 1, 3) * scale
        k = k.view(*k.shape[:2], self.h, -1).permute(0, 2, 3, 1) * scale
        v = v.view(*v.shape[:2], self.h, -1).permute(0, 2, 1, 3)
        qk = (q @ k).float()
        w = F.softmax(qk, dim=-1)
        return (w @ v).permute(0, 2, 1, 3).flatten(start_dim=2), qk.detach()


class WhisperLike(nn.Module):
    """An audio encoder (frames from a conv) and a text decoder of two blocks, each self- then cross-attention;
    run through its parts (``embed_audio``, ``logits``) as Whisper's decoding runs it."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.conv, self.enc = nn.Conv1d(4, d, 3, padding=1), WhisperAttention(d)
        self.emb = nn.Embedding(VOCAB, d)
        self.attn = nn.ModuleList(WhisperAttention(d) for _ in range(2))
        self.cross_attn = nn.ModuleList(WhisperAttention(d) for _ in range(2))

    def embed_audio(self, mel):
        xa = F.gelu(self.conv(mel)).permute(0, 2, 1)
        return xa + self.enc(xa)[0]

    def logits(self, tokens, xa):
        x = self.emb(tokens)
        for attn, cross in zip(self.attn, self.cross_attn, strict=True):
            x = x + attn(x)[0]
            x = x + cross(x, xa)[0]
        return x @ self.emb.weight.T

    def forward(self, mel, tokens):
        return self.logits(tokens, self.embed_audio(mel))


def _alignment(model: WhisperLike, mel, tokens, frames: int, scale: float = 1.0):
    """whisper/timing.py's find_alignment: the last cross-attention's scores kept by a hook, softmaxed again over
    the frames the audio has."""
    kept = []
    hook = model.cross_attn[-1].register_forward_hook(lambda _m, _i, out: kept.append(out[-1]))
    model.logits(tokens, model.embed_audio(mel))
    hook.remove()
    return (kept[-1][..., :frames] * scale).softmax(dim=-1)


class Aligner(nn.Module):
    """The alignment step inside a module's forward (the model captured holds the Whisper model)."""

    def __init__(self, frames: int):
        super().__init__()
        self.frames, self.model = frames, WhisperLike()

    def forward(self, mel, tokens):
        return _alignment(self.model, mel, tokens, self.frames)


@pytest.mark.parametrize("frames", [3, 6])
@pytest.mark.parametrize("inside", [False, True])
def test_scores_kept_by_a_hook_and_softmaxed_again_are_no_other_map(frames, inside):
    """Whisper's word timestamps softmax the kept scores of the last cross-attention again, cut to the frames: that
    was a record of its own, exact, over 3 frames, or (over all 6) a third cross layer of a two-block decoder.
    Run through the model's parts (its call never runs) or inside a module's forward, it is now a note."""
    torch.manual_seed(0)
    model = Aligner(frames).eval() if inside else WhisperLike().eval()
    mel, tokens = torch.randn(1, 4, 6), torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(mel, tokens) if inside else _alignment(model, mel, tokens, frames)
    prefix = "model." if inside else ""
    assert [(r.name, r.kind) for r in cap.records] == [
        (f"{prefix}enc", "enc_self"),
        (f"{prefix}attn.0", "enc_self"),
        (f"{prefix}cross_attn.0", "cross"),
        (f"{prefix}attn.1", "enc_self"),
        (f"{prefix}cross_attn.1", "cross"),
    ]
    assert all(r.exact for r in cap.records) and cap.notes == []
    assert [tuple(r.probs.shape) for r in cap.of("cross")] == [(1, 2, 5, 6)] * 2
    assert any(str(n.reason).startswith("a softmax again over the scores") or "outside the model" in str(n)
               for n in cap.skipped), cap.skipped  # fmt: skip


class ScoresTwice(nn.Module):
    """Scores made once, softmaxed in the module that made them and again (cut) by its parent, whose weights do
    multiply values there: attention of its own, kept."""

    def __init__(self):
        super().__init__()
        self.inner = WhisperAttention()
        self.emb = nn.Embedding(VOCAB, 8)

    def forward(self, ids):
        x = self.emb(ids)
        y, qk = self.inner(x)
        w = qk[..., :3].softmax(-1)
        return y, w @ x[:, None, :3]


def test_scores_softmaxed_again_whose_weights_multiply_values_stay_a_record():
    torch.manual_seed(0)
    model = ScoresTwice().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (2, 5)))
    assert [r.name for r in cap.records] == ["inner", ""]
    assert tuple(cap.records[1].probs.shape) == (2, 2, 5, 3)


class DistanceAttention(nn.Module):
    """Weights over distances of queries to keys: ``F.softmin(cdist(q, k) ** 2)``, ``softmax(-cdist(q, k) ** 2)``
    on heads folded into the batch, a sparsemax over them, or ``F.gumbel_softmax(q @ k.T, hard=True)``; each
    layer keeps the weights it multiplies its values with."""

    def __init__(self, how: str, heads: int, d: int = 8):
        super().__init__()
        self.how, self.h = how, heads
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(2))
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)
        for i, qkv in enumerate(self.qkv):
            q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in qkv(x).chunk(3, -1))
            if i == 0:  # an ordinary layer first
                w = (q @ k.transpose(-2, -1)).masked_fill(causal, float("-inf")).softmax(-1)
            elif self.how == "softmin":
                w = F.softmin((torch.cdist(q, k) ** 2).masked_fill(causal, float("inf")), dim=-1)
            elif self.how == "folded":
                fold = (b * self.h, n, -1)
                w = (-(torch.cdist(q.reshape(fold), k.reshape(fold)) ** 2)).softmax(-1).view(b, self.h, n, n)
            elif self.how == "gumbel":
                w = F.gumbel_softmax(q @ k.transpose(-2, -1), tau=0.5, hard=True, dim=-1)
            else:  # sparsemax by hand: no softmax at all
                z = -(torch.cdist(q, k) ** 2)
                zs = z.sort(-1, descending=True).values
                r = torch.arange(1, n + 1, dtype=z.dtype)
                kz = ((1 + r * zs) > zs.cumsum(-1)).sum(-1, keepdim=True)
                tau = (zs.cumsum(-1).gather(-1, kz - 1) - 1) / kz
                w = (z - tau).clamp_min(0)
            self.used.append(w.detach().clone())
            x = x + (w @ v).transpose(1, 2).reshape(b, n, d)
        return x


@pytest.mark.parametrize("how", ["softmin", "folded", "gumbel", "sparsemax"])
@pytest.mark.parametrize("batch, heads", [(1, 2), (2, 2), (3, 1)])
def test_weights_over_distances_softmin_and_gumbel_are_recorded(how, batch, heads):
    """``torch.cdist`` pairs queries with keys as ``q @ k.T`` does, ``F.softmin`` is the softmax of its negated
    input, and ``F.gumbel_softmax`` samples the weights the values are multiplied with: each was missing with no
    note where another layer had a softmax (or noted with a wrong reason). A sparsemax over distances, no softmax at
    all, is a warning naming its module."""
    torch.manual_seed(0)
    model = DistanceAttention(how, heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (batch, 5)))
    if how == "sparsemax":
        assert len(cap.records) == 1 and torch.equal(cap.records[0].probs, model.used[0])
        assert any("without a softmax" in n for n in cap.notes), cap.notes
        return
    assert len(cap.records) == 2 and all(r.exact for r in cap.records) and cap.notes == []
    for rec, used in zip(cap.records, model.used, strict=True):
        assert torch.allclose(rec.probs, used, atol=1e-6)
    assert cap.records[1].kind == (
        "dec_self" if how == "softmin" else "enc_self"
    )  # (softmin's keeps the mask)


class FeatureTokens(nn.Module):
    """rtdl's FT-Transformer: one token per numeric feature, a learned [CLS] appended; the last layer computes
    only the [CLS] row (``query_idx=[-1]``), or (``class_attention``) CaiT's way, a class token that joins the
    tokens only in the last layer, as the one query over [tokens, CLS]."""

    def __init__(self, heads: int, class_attention: bool, n: int = 3, d: int = 8):
        super().__init__()
        self.h, self.class_attention = heads, class_attention
        self.weight, self.bias = nn.Parameter(torch.randn(n, d)), nn.Parameter(torch.randn(n, d))
        self.cls = nn.Parameter(torch.randn(d))
        self.q, self.k = (
            nn.ModuleList(nn.Linear(d, d) for _ in range(2)),
            nn.ModuleList(nn.Linear(d, d) for _ in range(2)),
        )
        self.used: list[torch.Tensor] = []

    def _attend(self, i, x_q, x_kv):
        b, nq, d = x_q.shape
        q = self.q[i](x_q).view(b, nq, self.h, -1).transpose(1, 2)
        k = self.k[i](x_kv).view(b, x_kv.shape[1], self.h, -1).transpose(1, 2)
        w = (q @ k.transpose(-2, -1)).softmax(-1)
        self.used.append(w)
        return (w @ x_kv[:, None]).mean(1)

    def forward(self, x_num):
        x = self.weight[None] * x_num[..., None] + self.bias[None]
        cls = self.cls.view(1, 1, -1).expand(len(x), 1, -1)
        if self.class_attention:
            x = x + self._attend(0, x, x)
            u = torch.cat([x, cls], dim=1)
            return self._attend(1, u[:, -1:], u)
        x = torch.cat([x, cls], dim=1)
        x = x + self._attend(0, x, x)
        return self._attend(1, x[:, -1:], x)


@pytest.mark.parametrize("batch, heads", [(1, 1), (2, 2), (3, 2)])
@pytest.mark.parametrize("class_attention", [False, True])
def test_a_cls_row_alone_of_self_attention_stays_self_attention(batch, heads, class_attention):
    """A learned [CLS] that asked among the tokens in an earlier layer, alone asking over the same keys in the last
    layer, is that self-attention's row: it was an exact cross map. A class token that never asked among them (CaiT's
    class attention) stays cross-attention, as the papers name it."""
    torch.manual_seed(0)
    model = FeatureTokens(heads, class_attention).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 3))
    assert [r.kind for r in cap.records] == ["enc_self", "cross" if class_attention else "enc_self"]
    assert all(r.exact for r in cap.records) and cap.notes == []
    for rec, used in zip(cap.records, model.used, strict=True):
        assert torch.equal(rec.probs, used)


class PackedCrossAttention(nn.Module):
    """PixArt's cross-attention packs the batch: every image's patches as one row of queries, the captions' real
    tokens picked by their mask into one row of keys, each image kept to its caption by a block-diagonal mask
    (``xformers``' BlockDiagonalMask; here SDPA with the same bool mask). ``packed`` False: a batch as usual."""

    def __init__(self, packed: bool, heads: int = 2, c: int = 8):
        super().__init__()
        self.packed, self.h = packed, heads
        self.patches, self.captions = nn.Conv2d(3, c, 2, 2), nn.Embedding(VOCAB, c)
        self.q, self.kv = nn.Linear(c, c), nn.Linear(c, 2 * c)

    def forward(self, img, ids, mask):
        x = self.patches(img).flatten(2).transpose(1, 2)  # (B, N, C)
        y = self.captions(ids)
        b, n, c = x.shape
        if not self.packed:
            q = self.q(x).view(b, n, self.h, -1).transpose(1, 2)
            k, v = self.kv(y).view(b, -1, 2, self.h, c // self.h).unbind(2)
            keep = mask[:, None, None, :].bool()
            return F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=keep)
        lens = mask.sum(1).tolist()
        y = y.masked_select(mask.unsqueeze(-1) != 0).view(1, -1, c)
        q = self.q(x).view(1, -1, self.h, c // self.h).transpose(1, 2)
        k, v = (t.transpose(1, 2) for t in self.kv(y).view(1, -1, 2, self.h, c // self.h).unbind(2))
        keep = torch.zeros(b * n, k.shape[2], dtype=torch.bool)
        at = 0
        for i, m in enumerate(lens):
            keep[i * n : (i + 1) * n, at : at + m] = True
            at += m
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


@pytest.mark.parametrize("packed", [True, False])
def test_a_batch_packed_into_one_row_by_a_block_diagonal_mask_is_flagged(packed):
    """The packed call was one exact map (1, H, B*N, sum of the lengths): the batch drawn as one sequence. Its row
    holds several sequences, each seeing keys of its own: flagged. The same batch unpacked stays exact."""
    torch.manual_seed(0)
    model = PackedCrossAttention(packed).eval()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 3, 4, 4), torch.randint(1, VOCAB, (2, 5)), mask)
    (rec,) = cap.records
    assert rec.kind == "cross"
    if packed:
        assert tuple(rec.probs.shape) == (1, 2, 8, 8) and not rec.exact
        assert "holds queries from 2 sequences of the batch" in rec.flag and len(cap.notes) == 1
    else:
        assert tuple(rec.probs.shape) == (2, 2, 4, 5) and rec.exact and cap.notes == []


class PerSampleMHA(nn.Module):
    """``nn.MultiheadAttention`` called unbatched, a sample at a time: ``attn(h[b], h[b], h[b])`` (three views of
    one row), or one view passed three times."""

    def __init__(self, heads: int, one_object: bool, d: int = 8):
        super().__init__()
        self.one_object = one_object
        self.emb, self.attn = nn.Embedding(VOCAB, d), nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, ids):
        h, outs = self.emb(ids), []
        for b in range(h.shape[0]):
            x = h[b]
            q, k, v = (x, x, x) if self.one_object else (h[b], h[b], h[b])
            outs.append(self.attn(q, k, v, need_weights=False)[0])
        return torch.stack(outs)


@pytest.mark.parametrize("one_object", [True, False])
@pytest.mark.parametrize("batch, heads", [(1, 2), (2, 2), (3, 1)])
def test_multihead_attention_called_unbatched_per_sample_is_one_self_attention_record(
    one_object, batch, heads
):
    """Three views of one row were cross-attention (exact, no note: only one object passed three times was self),
    and unbatched calls were records of their own, drawn as the last call's map for sequence 0. Lineage places the
    unbatched query: one self-attention record of every sequence, equal to the module's own weights."""
    torch.manual_seed(0)
    model = PerSampleMHA(heads, one_object).eval()
    ids = torch.randint(0, VOCAB, (batch, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.kind == "enc_self" and rec.exact and cap.notes == []
    with torch.no_grad():
        h = model.emb(ids)
        want = torch.stack(
            [model.attn(h[b], h[b], h[b], average_attn_weights=False)[1] for b in range(batch)]
        )
    torch.testing.assert_close(rec.probs, want)


class PrunedThenMHA(nn.Module):
    """Tokens kept by a score (DynamicViT's top-k), then ``nn.MultiheadAttention`` over the kept ones; ``all`` keeps
    every token, in order."""

    def __init__(self, keep_all: bool, d: int = 8):
        super().__init__()
        self.keep_all = keep_all
        self.emb, self.score = nn.Embedding(VOCAB, d), nn.Linear(d, 1)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)

    def forward(self, ids):
        x = self.emb(ids)
        if self.keep_all:
            keep = torch.arange(x.shape[1]).expand(x.shape[0], -1)
        else:
            keep = self.score(x).squeeze(-1).topk(3, dim=-1).indices
        x = x[torch.arange(x.shape[0])[:, None], keep]
        return self.attn(x, x, x)[0]


@pytest.mark.parametrize("keep_all", [False, True])
def test_multihead_attention_over_tokens_kept_by_a_score_is_flagged(keep_all):
    """MultiheadAttention's keys are asked, as SDPA's and a softmax's are, whether they are some of a sequence's
    positions picked per sequence: over tokens kept by a top-k the record was exact with no note."""
    torch.manual_seed(0)
    model = PrunedThenMHA(keep_all).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (2, 6)))
    (rec,) = cap.records
    assert rec.kind == "enc_self"
    if keep_all:
        assert rec.exact and cap.notes == []
    else:
        assert not rec.exact and "the keys are some of a sequence's positions" in rec.flag


class PerssonSelfAttention(nn.Module):
    """Aladdin Persson's SelfAttention: a Linear per head's features (``Linear(head_dim, head_dim)``) on a view of each
    input reshaped into heads, einsum 'nqhd,nkhd->nhqk'; called alone on a tensor: ``attn(x, x, x, mask)``."""

    def __init__(self, embed_size: int, heads: int):
        super().__init__()
        self.embed_size, self.heads, self.head_dim = embed_size, heads, embed_size // heads
        self.values = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.keys = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.queries = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.fc_out = nn.Linear(embed_size, embed_size)
        self.used: list[torch.Tensor] = []

    def forward(self, values, keys, query, mask):
        n, lq = query.shape[:2]
        values = self.values(values.reshape(n, values.shape[1], self.heads, self.head_dim))
        keys = self.keys(keys.reshape(n, keys.shape[1], self.heads, self.head_dim))
        queries = self.queries(query.reshape(n, lq, self.heads, self.head_dim))
        energy = torch.einsum("nqhd,nkhd->nhqk", [queries, keys]).masked_fill(mask == 0, float("-1e20"))
        attention = torch.softmax(energy / (self.embed_size ** (1 / 2)), dim=3)
        self.used.append(attention)
        out = torch.einsum("nhql,nlhd->nqhd", [attention, values]).reshape(n, lq, self.embed_size)
        return self.fc_out(out)


@pytest.mark.parametrize("batch, heads", [(1, 1), (2, 1), (2, 2), (3, 4), (4, 4)])
def test_views_of_one_tensor_from_outside_are_one_input(batch, heads):
    """Each projection read its own view of the tensor handed in (``x.reshape(N, L, H, d)``), and each view was an
    input of its own: one head was cross-attention, several a wrong layout flagged with a wrong reason. A view of a
    tensor from outside has the tensor's positions."""
    torch.manual_seed(0)
    model = PerssonSelfAttention(16, heads).eval()
    x, mask = torch.randn(batch, 7, 16), torch.ones(batch, 1, 1, 7)
    mask[-1, ..., 5:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, x, x, mask)
    (rec,) = cap.records
    assert rec.kind == "enc_self" and rec.exact and cap.notes == []
    assert torch.equal(rec.probs, model.used[0])


class TutorialSeq2Seq(nn.Module):
    """The classic PyTorch seq2seq tutorial: the encoder's outputs written a step at a time into a ``torch.zeros``
    buffer of MAX_LENGTH rows (``encoder_outputs[ei] += encoder_output[0, 0]``), the decoder's weights made by a
    Linear over [embedded, hidden], ``bmm`` with the buffer."""

    def __init__(self, max_length: int = 10, d: int = 8):
        super().__init__()
        self.max_length = max_length
        self.src, self.tgt = nn.Embedding(VOCAB, d), nn.Embedding(VOCAB, d)
        self.enc, self.dec = nn.GRU(d, d), nn.GRU(d, d)
        self.attn = nn.Linear(2 * d, max_length)

    def forward(self, ids):
        d = self.src.embedding_dim
        h = torch.zeros(1, 1, d)
        encoder_outputs = torch.zeros(self.max_length, d)
        for ei in range(ids.size(0)):
            o, h = self.enc(self.src(ids[ei]).view(1, 1, -1), h)
            encoder_outputs[ei] += o[0, 0]
        embedded = self.tgt(torch.tensor([[0]])).view(1, 1, -1)
        w = F.softmax(self.attn(torch.cat((embedded[0], h[0]), 1)), dim=1)
        return torch.bmm(w.unsqueeze(0), encoder_outputs.unsqueeze(0))


def test_weights_over_a_zeros_buffer_written_a_step_at_a_time_are_a_warning():
    """The buffer, made by ``torch.zeros``, was taken for numbers the model made from no data even once the
    encoder's outputs were written into it, so weights over it were information only ("not attention"). Written
    with activations, it holds values over positions: the weights that multiply them are a warning."""
    torch.manual_seed(0)
    model = TutorialSeq2Seq().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[3], [5], [7], [1]]))
    assert cap.records == []
    assert any("not recorded: its weights multiply values over positions" in n for n in cap.notes), cap.notes


class SlicedGuidance(nn.Module):
    """diffusers' CrossAttention with attention slicing (``reshape_heads_to_batch_dim``, a loop over slices of the
    (batch x heads) fold writing into a ``torch.zeros`` buffer), in a classifier-free guidance step: the latents
    doubled, the context ``cat([uncond, cond])`` of two embedding calls. ``two_keys``: IP-Adapter's decoupled
    cross-attention, the same queries over text keys and over image keys, two maps."""

    def __init__(self, heads: int, slice_size: int, two_keys: bool = False, d: int = 8):
        super().__init__()
        self.h, self.slice_size, self.two_keys = heads, slice_size, two_keys
        self.emb, self.proj_in = nn.Embedding(VOCAB, d), nn.Conv2d(4, d, 1)
        self.to_q, self.to_k, self.to_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.used: list[torch.Tensor] = []

    def _heads_to_batch(self, t):
        b, n, d = t.shape
        return t.reshape(b, n, self.h, d // self.h).permute(0, 2, 1, 3).reshape(b * self.h, n, d // self.h)

    def _sliced(self, q, k, v):
        out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1])
        for i in range(q.shape[0] // self.slice_size):
            a, b = i * self.slice_size, (i + 1) * self.slice_size
            w = (q[a:b] @ k[a:b].transpose(1, 2)).softmax(dim=-1)
            self.used.append(w)
            out[a:b] = w @ v[a:b]
        return out

    def forward(self, latents, ids, uncond_ids):
        x = self.proj_in(torch.cat([latents] * 2)).flatten(2).transpose(1, 2)
        q = self._heads_to_batch(self.to_q(x))
        if self.two_keys:  # the same queries over two inputs' keys
            text, image = self.emb(ids).expand(2, -1, -1), self.emb(uncond_ids).expand(2, -1, -1)
            return self._sliced(
                q, *(self._heads_to_batch(f(text)) for f in (self.to_k, self.to_v))
            ) + self._sliced(q, *(self._heads_to_batch(f(image)) for f in (self.to_k, self.to_v)))
        ctx = torch.cat([self.emb(uncond_ids), self.emb(ids)])
        return self._sliced(q, self._heads_to_batch(self.to_k(ctx)), self._heads_to_batch(self.to_v(ctx)))


@pytest.mark.parametrize("heads, slice_size", [(2, 1), (2, 2), (1, 1), (4, 2)])
def test_slices_of_a_guidance_batch_over_their_own_contexts_join_into_one_map(heads, slice_size):
    """The two halves' keys come from two embedding calls, so the slices were taken for two attentions written
    inline and left apart: exact (1, 1, q, k) maps with no note, each claiming to be a layer. Keys from other inputs
    for other queries are other sequences': one record (2, H, q, k), each slice at its place."""
    torch.manual_seed(0)
    model = SlicedGuidance(heads, slice_size).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(1, 4, 2, 3), torch.randint(1, VOCAB, (1, 5)), torch.zeros(1, 5, dtype=torch.long))
    (rec,) = cap.records
    assert rec.kind == "cross" and rec.exact and cap.notes == []
    want = torch.cat(model.used).reshape(2, heads, 6, 5)
    assert torch.equal(rec.probs, want)


def test_the_same_queries_over_two_inputs_keys_stay_two_maps():
    """IP-Adapter's decoupled cross-attention (the same queries over text keys, then image keys) is two attentions,
    not slices of one: never joined as two sequences."""
    torch.manual_seed(0)
    model = SlicedGuidance(2, 4, two_keys=True).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(1, 4, 2, 3), torch.randint(1, VOCAB, (1, 5)), torch.randint(1, VOCAB, (1, 5)))
    assert [tuple(r.probs.shape) for r in cap.records] == [(2, 2, 6, 5), (2, 2, 6, 5)]
    assert all(r.exact for r in cap.records) and cap.notes == []
    for rec, used in zip(cap.records, model.used, strict=True):
        assert torch.equal(rec.probs, used.view(2, 2, 6, 5))


class HalvesOverTwoInputs(nn.Module):
    """One call: the first half of the queries over a text's keys, the second half over an image's (two embedding
    calls of one length): two attentions written inline, never two sequences of one map."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb, self.q, self.k = nn.Embedding(VOCAB, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids, text, image):
        q = self.q(self.emb(ids))
        outs = []
        for part, memory in ((q[:, :4], self.emb(text)), (q[:, 4:], self.emb(image))):
            outs.append((part @ self.k(memory).transpose(-1, -2)).softmax(-1) @ memory)
        return torch.cat(outs, 1)


@pytest.mark.parametrize("batch", [1, 2])
def test_halves_of_the_queries_over_two_inputs_keys_stay_two_maps(batch):
    torch.manual_seed(0)
    model = HalvesOverTwoInputs().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*(torch.randint(0, VOCAB, (batch, n)) for n in (8, 5, 5)))
    assert [tuple(r.probs.shape) for r in cap.records] == [(batch, 1, 4, 5)] * 2
    assert all(r.exact and r.kind == "cross" for r in cap.records) and cap.notes == []


class FlatTokens(nn.Module):
    """Tokens handed in flat, ``(B, L * D)``, viewed as ``(B, L, D)`` (or a series cut into patches by ``unfold``)
    before self-attention: the view makes the positions, not the flat tensor's rows."""

    def __init__(self, unfold: bool, d: int = 4):
        super().__init__()
        self.unfold, self.d = unfold, d
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        t = x.unfold(-1, self.d, self.d) if self.unfold else x.view(x.shape[0], -1, self.d)
        return (self.q(t) @ self.k(t).transpose(-1, -2)).softmax(-1) @ t


@pytest.mark.parametrize("unfold", [False, True])
def test_a_flat_input_viewed_as_tokens_stays_self_attention(unfold):
    torch.manual_seed(0)
    model = FlatTokens(unfold).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(3, 24))
    (rec,) = cap.records
    assert rec.kind == "enc_self" and rec.exact and cap.notes == [] and tuple(rec.probs.shape) == (3, 1, 6, 6)


class TriangleOnWeights(nn.Module):
    """A causal mask put on the weights after the softmax with ``tril`` (or ``w - w.triu(1)``, in place, below the
    diagonal), renormalized or not: the weights kept on the module are those multiplied with the values."""

    def __init__(self, how: str, heads: int, d: int = 8):
        super().__init__()
        self.how, self.h = how, heads
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        w = (q @ k.transpose(-1, -2)).softmax(-1)
        if self.how == "tril":
            w = w.tril()
        elif self.how == "tril renormalized":
            w = w.tril()
            w = w / w.sum(-1, keepdim=True)
        elif self.how == "minus triu":
            w = w - w.triu(1)
            w = w / w.sum(-1, keepdim=True)
        elif self.how == "in place":
            w.tril_()
            w = w / w.sum(-1, keepdim=True)
        else:  # strictly below the diagonal: row 0 sees nothing
            w = torch.tril(w, diagonal=-1)
            w = w / w.sum(-1, keepdim=True).clamp_min(1e-9)
        self.w = w
        return (w @ v).transpose(1, 2).reshape(b, n, -1)


@pytest.mark.parametrize("how", ["tril", "tril renormalized", "minus triu", "in place", "below"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_causal_triangle_put_on_the_weights_is_their_mask(how, batch, heads):
    """``w.tril()`` after the softmax was recorded as encoder self-attention with no mask: the weights were
    right, the kind and mask not. The triangle is the mask the weights were multiplied by."""
    torch.manual_seed(0)
    model = TriangleOnWeights(how, heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 5)))
    (rec,) = cap.records
    want = torch.ones(5, 5, dtype=torch.bool).tril(-1 if how == "below" else 0)
    assert rec.kind == "dec_self" and rec.exact and rec.mask_source == "multiplied" and not cap.notes
    assert torch.equal(rec.probs, model.w) and torch.equal(rec.mask, want.expand(batch, 5, 5))


class PaddedEncoder(nn.Module):
    """Self-attention with a key padding mask (``name`` its module's, ``decoder`` adds a causal one)."""

    def __init__(self, decoder: bool = False, d: int = 8):
        super().__init__()
        self.decoder = decoder
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, 2, -1).permute(2, 0, 3, 1, 4)
        keep = (ids != 0)[:, None, None, :]
        if self.decoder:
            keep = keep & torch.ones(n, n, dtype=torch.bool).tril()
        w = (q @ k.transpose(-1, -2)).masked_fill(~keep, -1e9).softmax(-1)
        return (w @ v).transpose(1, 2).reshape(b, n, -1)


@pytest.mark.parametrize("decoder", [False, True])
@pytest.mark.parametrize("ids", [[[5, 0, 0, 0]], [[5, 0, 0, 0], [7, 0, 0, 0]], [[5]]])
def test_one_token_per_sequence_cannot_tell_an_encoder_from_a_decoder_and_says_so(decoder, ids):
    """Every sequence one token (and padding): every row sees key 0 alone, in an encoder's padding mask as in a
    decoder's causal one. It was called causal, silently (a decoder there, an encoder named so): now one
    warning says the kind could not be told, and ``kinds=`` decides it without one."""
    torch.manual_seed(0)
    model = PaddedEncoder(decoder).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor(ids))
    (rec,) = cap.records
    assert rec.kind == "enc_self" and rec.exact
    (note,) = cap.notes
    assert "cannot tell them apart" in note and "'dec_self'" in note
    with (
        torch.no_grad(),
        capture_attention(model, kinds={"": "dec_self" if decoder else "enc_self"}) as given,
    ):
        model(torch.tensor(ids))
    assert given.records[0].kind == ("dec_self" if decoder else "enc_self") and given.notes == []
    two = torch.tensor(ids)
    if two.shape[1] > 1:  # a second token shows the triangle, or every row seeing it
        two[:, 1] = 9
        with torch.no_grad(), capture_attention(model) as cap:
            model(two)
        assert cap.records[0].kind == ("dec_self" if decoder else "enc_self") and cap.notes == []


class PaddedRowsSeeThemselves(nn.Module):
    """XLNet's bidirectional mask: a padded query row sees the sequence and its own key (no other padded row)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, 2, -1).permute(2, 0, 3, 1, 4)
        keep = (ids != 0)[:, None, :] | torch.eye(n, dtype=torch.bool)  # (b, q, k)
        w = (q @ k.transpose(-1, -2)).masked_fill(~keep[:, None], -1e9).softmax(-1)
        return (w @ v).transpose(1, 2).reshape(b, n, -1)


def test_padded_rows_that_see_themselves_are_no_prefix_lm():
    """Right padding whose padded rows see the sequence and themselves passed for a prefix LM's mask (a
    prefix, then rows that see it and themselves): decoder self-attention, silently. Rows after a prefix LM's
    prefix see each other; these see no other padded row."""
    torch.manual_seed(0)
    model = PaddedRowsSeeThemselves().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 5, 0, 0, 0]]))
    (rec,) = cap.records
    assert rec.kind == "enc_self" and rec.exact and cap.notes == []


class UnfoldedWindows(nn.Module):
    """A local window per query: keys and values padded and cut into windows of 3 by ``Tensor.unfold``, the
    scores a broadcast product summed over the features."""

    def __init__(self, heads: int = 2, d: int = 8):
        super().__init__()
        self.h = heads
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        kw = F.pad(k, (0, 0, 1, 1)).unfold(2, 3, 1).transpose(-1, -2)  # (b, h, n, 3, d)
        vw = F.pad(v, (0, 0, 1, 1)).unfold(2, 3, 1).transpose(-1, -2)
        w = (q[:, :, :, None, :] * kw).sum(-1).softmax(-1)  # (b, h, n, 3): over each query's window
        return (w[..., None] * vw).sum(-2).transpose(1, 2).reshape(b, n, -1)


def test_weights_over_unfolded_key_windows_are_a_warning_that_names_the_windows():
    """Not recorded (the keys' windows are not followed), and the warning no longer says only that the weights
    were made by a projection: it names keys gathered in a way capture does not follow."""
    torch.manual_seed(0)
    model = UnfoldedWindows().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (2, 5)))
    assert cap.records == []
    (note,) = cap.notes
    assert "could not trace to queries times keys" in note and "unfold" in note


class LastRowsAsQueries(nn.Module):
    """One attention block tested alone on a float input: the last ``n`` rows of ``x`` ask over all of ``x``
    (``x[:, -n:]``, ``x.narrow``), the causal mask aligned bottom-right; the keys read before or after."""

    def __init__(self, how: str, keys_first: bool, heads: int, d: int = 8):
        super().__init__()
        self.how, self.keys_first, self.h = how, keys_first, heads
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, n: int = 2):
        b, length, d = x.shape
        rows = x[:, -n:] if self.how == "slice" else x.narrow(1, length - n, n)
        if self.keys_first:
            k = self.k(x).view(b, length, self.h, -1).transpose(1, 2)
            q = self.q(rows).view(b, n, self.h, -1).transpose(1, 2)
        else:
            q = self.q(rows).view(b, n, self.h, -1).transpose(1, 2)
            k = self.k(x).view(b, length, self.h, -1).transpose(1, 2)
        keep = torch.ones(n, length, dtype=torch.bool).tril(length - n)
        return F.scaled_dot_product_attention(q, k, k, attn_mask=keep)


@pytest.mark.parametrize("how", ["slice", "narrow"])
@pytest.mark.parametrize("keys_first", [False, True])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_rows_of_the_models_input_as_queries_are_self_attention(how, keys_first, batch, heads):
    """The queries' slice of the raw input was taken for an input of its own: cross-attention, exact, no note.
    The rows are the input's own positions: decoder self-attention over them."""
    torch.manual_seed(0)
    model = LastRowsAsQueries(how, keys_first, heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 5, 8))
    (rec,) = cap.records
    assert rec.kind == "dec_self" and rec.exact and cap.notes == []
    assert rec.query_positions.tolist() == [[5 * b + 3, 5 * b + 4] for b in range(batch)]


class OneHeadMasked(nn.Module):
    """A causal mask put on one head (or some rows) only, through a view of the scores: in place
    (``att[:, 0].masked_fill_``) or written back (``att[:, :1] = att[:, :1].masked_fill(...)``)."""

    def __init__(self, how: str, heads: int, d: int = 8):
        super().__init__()
        self.how, self.h = how, heads
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        att = q @ k.transpose(-1, -2)
        self.scores = att.detach().clone()
        hide = ~torch.ones(n, n, dtype=torch.bool).tril()
        if self.how == "in place":
            att[:, 0].masked_fill_(hide, float("-inf"))
        elif self.how == "rows":
            att[:, :, 2:].masked_fill_(hide[2:], float("-inf"))
        else:
            att[:, :1] = att[:, :1].masked_fill(hide, float("-inf"))
        self.w = att.softmax(-1)
        return self.w @ v


@pytest.mark.parametrize("how", ["in place", "rows", "written back"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 4)])
def test_a_mask_put_through_a_view_of_the_scores_is_the_records(how, batch, heads):
    """The fill through a view was not seen as a mask: the record had no mask (``zeros`` found none, other
    heads see every key) and said the heads were masked alike. The mask is there, per head, and the scores
    before it."""
    torch.manual_seed(0)
    model = OneHeadMasked(how, heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 5, 8))
    (rec,) = cap.records
    assert torch.equal(rec.probs, model.w) and torch.equal(rec.scores, model.scores) and rec.exact
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    want = causal.clone()
    if how == "rows":
        want[:2] = True
    assert rec.mask_source == "masked_fill" and torch.equal(rec.mask, want.expand(batch, 5, 5))
    assert rec.head_masks_differ == (how != "rows")


class TopLeftCausalStep(nn.Module):
    """A decoding step's 2 queries over the sequence's 5 keys with ``is_causal=True``: torch aligns its mask
    top-left (query 0 sees key 0 alone), the classic KV-cache bug."""

    def __init__(self, heads: int, d: int = 8):
        super().__init__()
        self.h = heads
        self.emb, self.q, self.k = nn.Embedding(VOCAB, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids):
        h = self.emb(ids)
        b, n, _ = h.shape
        q = self.q(h)[:, -2:].reshape(b, 2, self.h, -1).transpose(1, 2)
        k = self.k(h).view(b, n, self.h, -1).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, k, is_causal=True)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_top_left_causal_step_is_decoder_self_attention_with_its_mask(batch, heads):
    """``is_causal=True`` with fewer queries than keys was encoder self-attention: the mask hides later keys, so
    the kind is the decoder's, and the mask shows the top-left alignment torch used."""
    torch.manual_seed(0)
    model = TopLeftCausalStep(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert rec.kind == "dec_self" and rec.exact and cap.notes == []
    assert torch.equal(rec.mask, torch.ones(2, 5, dtype=torch.bool).tril().expand(batch, 2, 5))


class BiasedStep(nn.Module):
    """SDPA with a CausalBias mask (``torch.nn.attention.bias.causal_lower_right`` / ``causal_upper_left``): a
    tensor subclass whose memory holds no mask; ``n`` of the sequence's last positions ask."""

    def __init__(self, variant: str, heads: int, d: int = 8):
        super().__init__()
        self.variant, self.h = variant, heads
        self.emb, self.q, self.k = nn.Embedding(VOCAB, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids, n: int):
        from torch.nn.attention import bias

        h = self.emb(ids)
        b, length, _ = h.shape
        q = self.q(h)[:, -n:].reshape(b, n, self.h, -1).transpose(1, 2)
        k = self.k(h).view(b, length, self.h, -1).transpose(1, 2)
        mask = (bias.causal_lower_right if self.variant == "lower right" else bias.causal_upper_left)(
            n, length
        )
        self.keep = torch.ones(n, length, dtype=torch.bool).tril(
            length - n if self.variant == "lower right" else 0
        )
        self.want = (
            (q @ k.transpose(-1, -2) / (k.shape[-1] ** 0.5))
            .masked_fill(~self.keep, float("-inf"))
            .softmax(-1)
        )
        return F.scaled_dot_product_attention(q, k, k, attn_mask=mask)


@pytest.mark.parametrize("variant", ["lower right", "upper left"])
@pytest.mark.parametrize("n", [2, 5])
@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 4)])
def test_a_causal_bias_mask_is_the_mask_sdpa_applies(variant, n, batch, heads):
    """A CausalBias was read as a bool tensor of its own memory: weights without the causal mask, a mask of
    garbage, exact, with no note (or a note about a size mismatch). It is the (q, k) mask SDPA applies."""
    torch.manual_seed(0)
    model = BiasedStep(variant, heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 5)), n)
    (rec,) = cap.records
    assert rec.exact and cap.notes == [] and rec.kind == "dec_self"
    assert torch.allclose(rec.probs, model.want, atol=1e-6)
    assert torch.equal(rec.mask, model.keep.expand(batch, n, 5))


def test_sdpa_weights_that_do_not_give_its_output_are_flagged(monkeypatch):
    """The safety net: where the weights capture recomputes from SDPA's arguments do not rebuild its output (a
    mask read otherwise than SDPA applied it: here capture's causal mask made wrong), the record is flagged and
    a warning says so, never shown as exact."""
    from attnscope.core.families import capture as C

    monkeypatch.setattr(
        C, "_causal", lambda lq, lk, device: torch.ones(lq, lk, dtype=torch.bool, device=device)
    )
    # (and its additive form, kept per shape, which another test may have made already)
    monkeypatch.setattr(
        C,
        "_hiding",
        lambda keep, dtype, causal: torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, -math.inf),
    )
    torch.manual_seed(0)
    model = TopLeftCausalStep(2).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (2, 5)))
    (rec,) = cap.records
    assert not rec.exact and "do not give its output" in rec.flag
    assert any("do not give its output" in n for n in cap.notes)


class DroppedOut(nn.Module):
    """SDPA (or nn.MultiheadAttention) with dropout on the weights while training, no mask given."""

    def __init__(self, mha: bool, heads: int = 2, d: int = 8):
        super().__init__()
        self.h, self.mha = heads, mha
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.5, batch_first=True) if mha else None
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        if self.mha:
            return self.attn(x, x, x, need_weights=False)[0]
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)


@pytest.mark.parametrize("mha", [False, True])
def test_keys_dropped_out_in_every_head_are_no_mask(mha):
    """Keys whose weights dropout zeroed in every head were recorded as masked ("zeros"): the call's arguments
    say its mask, and there is none. The weights are the dropped ones the call used."""
    torch.manual_seed(0)
    model = DroppedOut(mha).train()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 5, 8))
    (rec,) = cap.records
    assert rec.exact and bool((rec.probs == 0).any())  # (dropout's zeros are in the weights)
    assert rec.mask is None and rec.mask_source is None


class EmbeddedTwice(nn.Module):
    """Attention whose queries and keys are two embedding calls (``twice``) of the same ids, or one."""

    def __init__(self, twice: bool, d: int = 8):
        super().__init__()
        self.twice = twice
        self.emb, self.q, self.k = nn.Embedding(VOCAB, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids, other=None):
        x = self.emb(ids)
        y = self.emb(other if other is not None else ids) if self.twice else x
        return (self.q(x) @ self.k(y).transpose(1, 2)).softmax(-1) @ y


def test_two_embedding_calls_of_the_same_ids_are_cross_and_said():
    """``attn(emb(ids), emb(ids))``: two calls are two inputs by lineage (cross), but the tokens are the same and
    self-attention written so looks the same: a warning says it cannot tell, and ``kinds=`` decides without one.
    Another ids tensor (a decoder's own input) is cross with nothing said, and one call is self-attention."""
    torch.manual_seed(0)
    ids = torch.randint(1, VOCAB, (2, 5))
    model = EmbeddedTwice(True).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    (note,) = cap.notes
    assert rec.kind == "cross" and rec.exact and "two embedding calls of the same token ids" in note
    with torch.no_grad(), capture_attention(model, kinds={"": "enc_self"}) as given:
        model(ids)
    assert given.records[0].kind == "enc_self" and given.notes == []
    with torch.no_grad(), capture_attention(model) as other:
        model(ids, ids.clone())
    assert other.records[0].kind == "cross" and other.notes == []
    once = EmbeddedTwice(False).eval()
    with torch.no_grad(), capture_attention(once) as cap:
        once(ids)
    assert cap.records[0].kind == "enc_self" and cap.notes == []


class WhereTensorFill(nn.Module):
    """Kyubyong's padding: ``torch.where(key_masks == 0, paddings, outputs)`` with ``paddings`` a tensor of
    -2**32 + 1 made by ``ones_like``."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb, self.q, self.k = nn.Embedding(VOCAB, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids):
        x = self.emb(ids)
        scores = self.q(x) @ self.k(x).transpose(1, 2)
        key_masks = (ids != 0)[:, None, :].expand_as(scores)
        paddings = torch.ones_like(scores) * (-(2**32) + 1)
        self.scores = scores.detach().clone()
        return torch.where(key_masks == 0, paddings, scores).softmax(-1) @ x


def test_a_where_against_a_tensor_of_very_negative_values_is_the_mask():
    """The fill was a tensor, not a number: the mask was taken from the weights' zeros, the scores recorded after
    it. It is a ``where`` mask, with the scores before it."""
    torch.manual_seed(0)
    model = WhereTensorFill().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[3, 4, 0], [5, 6, 7]]))
    (rec,) = cap.records
    assert rec.mask_source == "where" and torch.equal(rec.scores[:, 0], model.scores)
    assert rec.mask[0].tolist() == [[True, True, False]] * 3 and bool(rec.mask[1].all())


class CopyTask(nn.Module):
    """An encoder-decoder with one embedding table run on the same ids on both sides (``model(x, x)``)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.layers = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(3))

    def attend(self, i, x, memory):
        q = self.layers[i](x).chunk(3, -1)[0]
        _, k, v = self.layers[i](memory).chunk(3, -1)
        return (q @ k.transpose(1, 2)).softmax(-1) @ v

    def forward(self, src, tgt):
        x = self.emb(src)
        memory = self.attend(0, x, x)
        y = self.emb(tgt)
        return self.attend(2, self.attend(1, y, y), memory)


def test_a_decoder_over_an_encoders_memory_of_the_same_ids_is_cross_with_nothing_said():
    """The same ids on both sides: the cross-attention's keys are an encoder's memory, which a self-attention asked
    over before, so the queries are another stack's: cross, and no warning that it might be self-attention."""
    torch.manual_seed(0)
    model = CopyTask().eval()
    x = torch.randint(1, VOCAB, (2, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, x)
    assert [r.kind for r in cap.records] == ["enc_self", "enc_self", "cross"] and cap.notes == []


class GuardedEncoder(nn.Module):
    """An encoder whose padding rows see themselves besides the tokens (``keep | eye``, a guard against rows
    that see no key), two layers over SDPA."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.qkv = nn.ModuleList(nn.Linear(16, 48) for _ in range(2))

    def forward(self, ids):
        x, (b, n) = self.emb(ids), ids.shape
        keep = ((ids != 0)[:, None, :] | torch.eye(n, dtype=torch.bool))[:, None]
        for qkv in self.qkv:
            q, k, v = qkv(x).view(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).reshape(b, n, 16)
        return x


def test_an_encoders_guarded_padding_rows_beside_a_one_token_sequence_are_no_prefix_lm():
    """Beside a one-token sequence, the padding rows of an encoder that lets them see themselves see the token
    and themselves, as a prefix LM's rows past an empty prefix would: the layer was recorded as dec_self (the
    trace split the encoder's layers between two kinds), with nothing said. Where an encoder's mask explains
    the rows as well, the record is enc_self and a warning says the two read alike; a prefix LM's rows past
    its prefix, which no encoder's mask explains, stay dec_self."""
    torch.manual_seed(0)
    model = GuardedEncoder().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[3, 4, 5, 6], [7, 0, 0, 0]]))
    assert [r.kind for r in cap.records] == ["enc_self", "enc_self"]
    (said,) = [n for n in cap.notes if "reads alike" in n]
    assert "prefix LM" in said and "enc_self" in said
    assert cap.trace(0, src_tokens=list("abcd")).enc_self.shape[0] == 2
    # the same encoder over sequences of two tokens or more: nothing to say
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]]))
    assert [r.kind for r in cap.records] == ["enc_self", "enc_self"] and not cap.notes


class QueryChunks(nn.Module):
    """Memory-efficient attention written by hand: the queries a chunk at a time over every key, causal or
    not, padding hidden; the weights the model used kept whole (``truth``)."""

    def __init__(self, heads: int, causal: bool, chunk: int = 3):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(20, 16), nn.Linear(16, 48)
        self.h, self.causal, self.chunk = heads, causal, chunk

    def forward(self, ids):
        x, (b, t) = self.emb(ids), ids.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, 16 // self.h).permute(2, 0, 3, 1, 4)
        outs, weights = [], []
        for i0 in range(0, t, self.chunk):
            s = q[:, :, i0 : i0 + self.chunk] @ k.transpose(-2, -1) / math.sqrt(16 // self.h)
            keep = (ids != 0)[:, None, None, :]
            if self.causal:
                rows = torch.arange(i0, i0 + s.shape[2])
                keep = keep & (rows[:, None] >= torch.arange(t)[None, :])
            p = s.masked_fill(~keep, -1e9).softmax(-1)
            weights.append(p.detach())
            outs.append(p @ v)
        self.truth = torch.cat(weights, 2)
        return torch.cat(outs, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h", [(1, 1), (2, 2), (3, 1), (1, 2)])
def test_queries_a_chunk_at_a_time_join_into_one_map(causal, b, h):
    """A causal self-attention's queries a chunk at a time: the last chunk's rows see every key up to
    themselves, so alone its mask hid nothing and it read as an encoder's; the chunks were left as maps of
    their own (a trace drew one chunk's rows), flagged. Joined, the mask says decoder: one exact record."""
    torch.manual_seed(0)
    model = QueryChunks(h, causal).eval()
    ids = torch.randint(1, 20, (b, 7))
    ids[-1, 5:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.exact and rec.kind == ("dec_self" if causal else "enc_self") and not cap.notes, cap.notes
    assert torch.equal(rec.probs, model.truth)
    assert cap.trace(0, src_tokens=list("abcdefg")).kinds == (rec.kind,)


class SdpaHeadLoop(nn.Module):
    """SDPA a head at a time (a loop over the heads), in either order, the outputs joined in head order
    along the features (``cat``) or stacked into a heads axis (``stack(outs, 1)``); the model's own maps kept."""

    def __init__(self, heads: int, reverse: bool, join: str, sdpa: bool = True):
        super().__init__()
        self.emb, self.qkv, self.out = nn.Embedding(20, 16), nn.Linear(16, 48), nn.Linear(16, 16)
        self.h, self.reverse, self.join, self.sdpa = heads, reverse, join, sdpa

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, t, 3, self.h, 16 // self.h).permute(2, 0, 3, 1, 4)
        keep = (ids != 0)[:, None, :]
        outs = {}
        buffer = torch.empty(b, self.h, t, 16 // self.h)
        for h in reversed(range(self.h)) if self.reverse else range(self.h):
            if self.sdpa:
                outs[h] = F.scaled_dot_product_attention(q[:, h], k[:, h], v[:, h], attn_mask=keep)
            else:
                s = (q[:, h] @ k[:, h].transpose(-2, -1) / math.sqrt(16 // self.h)).masked_fill(~keep, -1e9)
                outs[h] = s.softmax(-1) @ v[:, h]
            if self.join == "prealloc":
                buffer[:, h] = outs[h]
        with torch._C.DisableTorchFunction():
            s = (q @ k.transpose(-2, -1) / math.sqrt(16 // self.h)).masked_fill(~keep[:, None], float("-inf"))
            self.truth = s.softmax(-1)
        if self.join == "cat":
            o = torch.cat([outs[h] for h in range(self.h)], -1)
        elif self.join == "stack":
            o = torch.stack([outs[h] for h in range(self.h)], 1).transpose(1, 2).reshape(b, t, 16)
        else:
            o = buffer.transpose(1, 2).reshape(b, t, 16)
        return self.out(o)


@pytest.mark.parametrize("sdpa", [True, False])
@pytest.mark.parametrize("join", ["cat", "stack", "prealloc"])
@pytest.mark.parametrize("reverse", [False, True])
def test_sdpa_a_head_at_a_time_is_one_record_with_its_heads_in_order(reverse, join, sdpa):
    """The calls a head each were joined in the order they ran, not in the heads' own order: a loop run in
    reverse gave one exact record with its heads swapped. Outputs stacked into a heads axis
    (``stack(outs, 1)``) or written into a buffer's (``out[:, h] = ...``) were not joined at all: the heads
    were drawn as layers. (A softmax a head at a time, the same.)"""
    torch.manual_seed(0)
    model = SdpaHeadLoop(2, reverse, join, sdpa).eval()
    ids = torch.randint(1, 20, (2, 6))
    ids[1, 4:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.exact and tuple(rec.probs.shape) == (2, 2, 6, 6) and not cap.notes
    assert torch.allclose(rec.probs, model.truth, atol=1e-6)
