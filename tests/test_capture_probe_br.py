"""Cases found by probing capture with attention written the way efficient-attention code, pooling heads and
everyday user code write it: a mean token made from features handed in by a masked mean, a mean over a slice
of them, or a sum divided and unsqueezed on the way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnscope.core.families.capture import capture_attention


class PooledToken(nn.Module):
    """An attention pool over features handed in (B, N, d): a mean token joined before them asks the only
    query. ``how`` is the way the mean is written; ``maps`` keeps the weights (B, H, 1, 1 + N)."""

    def __init__(self, how: str, d: int = 8, h: int = 2):
        super().__init__()
        self.how, self.h = how, h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.maps: list[torch.Tensor] = []

    def forward(self, x, m):  # m: (B, N) 1 at a real position, 0 at padding
        b, n, d = x.shape
        if self.how == "masked mean":
            mean = (x * m[..., None]).sum(1, keepdim=True) / m.sum(1, keepdim=True)[..., None]
        elif self.how == "slice mean":  # the features after a first (class) position
            mean = x[:, 1:].mean(1, keepdim=True)
        elif self.how == "sum over count":
            mean = x.sum(dim=1, keepdim=True) / n
        else:  # "mean unsqueezed"
            mean = x.mean(1).unsqueeze(1)
        x = torch.cat([mean, x], dim=1)
        q = self.q(x[:, :1]).view(b, 1, self.h, d // self.h).transpose(1, 2)
        k, v = (f(x).view(b, n + 1, self.h, d // self.h).transpose(1, 2) for f in (self.k, self.v))
        w = ((q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5).softmax(-1)
        self.maps.append(w.detach().clone())
        return self.o((w @ v).transpose(1, 2).reshape(b, d))


@pytest.mark.parametrize("how", ["masked mean", "slice mean", "sum over count", "mean unsqueezed"])
@pytest.mark.parametrize("batch,heads", [(2, 2), (1, 1), (3, 4)])
def test_a_mean_token_written_any_common_way_is_a_pooled_position(how, batch, heads):
    """Each of these was ``dec_self`` with the features labelled ``<ctx i>`` and the mean token a query of its
    own, silently: a decoder reading a memory. The mean is a position pooled from the features it is joined
    to, as ``x.mean(1, keepdim=True)`` written directly is: enc_self, its query and first key ``<pooled 0>``."""
    torch.manual_seed(batch * 10 + heads)
    model = PooledToken(how, h=heads).eval()
    x = torch.randn(batch, 4, 8)
    m = torch.ones(batch, 4)
    m[-1, 3:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, m)
    (r,) = cap.records
    want = model.maps[0]
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)
    assert r.kind == "enc_self" and r.exact and not cap.notes, (r.kind, cap.notes)
    assert r.query_labels == ("<pooled 0>",)
    assert r.key_labels == ("<pooled 0>", None, None, None, None)
    for i in range(batch):
        tr = cap.trace(i)
        assert tr.meta["query_rows"] == {"enc_self": [0]}
        np.testing.assert_allclose(tr.enc_self[0, :, 0], want[i, :, 0].numpy(), atol=1e-6)


class TwoInputs(nn.Module):
    """Cross-attention from a text's tokens to image features handed in, the features first weighted by a
    broadcast mask (``x * m[..., None]``, no mean): the product is not a pooled token, and the call stays cross."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(20, d)
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, ids, feats, m):
        feats = feats * m[..., None]
        w = (self.q(self.emb(ids)) @ self.k(feats).transpose(1, 2)).softmax(-1)
        return w @ feats


def test_features_weighted_by_a_mask_and_not_pooled_stay_the_keys_of_a_cross_attention():
    model = TwoInputs().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (2, 3)), torch.randn(2, 5, 8), torch.ones(2, 5))
    (r,) = cap.records
    assert r.kind == "cross" and r.key_labels is None and r.query_labels is None


class LSHChunks(nn.Module):
    """Reformer-style LSH attention, one head: tokens sorted by their bucket (computed from the activations),
    cut into chunks of ``c`` and attended within each chunk, unsorted with a gather. ``full`` keeps the true
    (B, 1, n, n) map: each chunk's weights at its tokens' places."""

    def __init__(self, d: int = 16, c: int = 4):
        super().__init__()
        self.c = c
        self.qk, self.v = nn.Linear(d, d), nn.Linear(d, d)
        self.register_buffer("rot", torch.randn(d, 2))

    def forward(self, x):
        b, n, d = x.shape
        qk, v = self.qk(x), self.v(x)
        r = qk @ self.rot
        buckets = torch.cat([r, -r], -1).argmax(-1)
        _, order = (buckets * n + torch.arange(n)).sort(-1)
        _, undo = order.sort(-1)
        sqk = qk.gather(1, order[..., None].expand_as(qk))
        sv = v.gather(1, order[..., None].expand_as(v))
        bq = sqk.reshape(b, n // self.c, self.c, d)
        bk = nn.functional.normalize(bq, dim=-1)
        w = torch.einsum("bcie,bcje->bcij", bq, bk).mul(d**-0.5).softmax(-1)
        full = torch.zeros(b, 1, n, n)
        chunks = order.view(b, n // self.c, self.c)
        for z in range(b):
            for j in range(n // self.c):
                full[z, 0, chunks[z, j][:, None], chunks[z, j][None, :]] = w[z, j]
        self.full = full
        out = torch.einsum("bcij,bcje->bcie", w, sv.reshape(b, n // self.c, self.c, d)).reshape(b, n, d)
        return out.gather(1, undo[..., None].expand_as(out))


class RoutedClusters(nn.Module):
    """Routing attention, one head: each of two k-means clusters takes its top-``w`` tokens by their
    similarity to the cluster's mean (``topk`` then ``gather``) and attends within them. Together the
    clusters may hold every token of the sequence."""

    def __init__(self, d: int = 16, w: int = 6):
        super().__init__()
        self.w = w
        self.qkv = nn.Linear(d, 3 * d)
        self.register_buffer("means", nn.functional.normalize(torch.randn(1, 2, d), dim=-1))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, 1, d).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        sim = torch.einsum("bhnd,hcd->bhcn", nn.functional.normalize(q, dim=-1), self.means)
        _, idx = sim.topk(self.w, -1)
        gi = idx[..., None].expand(-1, -1, -1, -1, d)

        def picked(t):
            return t[:, :, None].expand(-1, -1, 2, -1, -1).gather(3, gi)

        w = torch.einsum("bhcid,bhcjd->bhcij", picked(q), picked(k)).mul(d**-0.5).softmax(-1)
        out = torch.einsum("bhcij,bhcjd->bhcid", w, picked(v))
        return torch.zeros_like(q).scatter_add(2, gi.reshape(b, 1, -1, d), out.reshape(b, 1, -1, d))


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_chunks_of_tokens_sorted_into_buckets_are_flagged_not_drawn_as_sequences(batch):
    """With one head the chunks were taken for sequences: a (B * chunks, 1, 4, 4) record marked exact, whose
    row 1 held sequence 0's second chunk, and ``trace(1)`` drew it as sequence 1. The sort comes from the
    activations, so the chunks' tokens are picked by the data: flagged, with the reason."""
    torch.manual_seed(batch)
    model = LSHChunks().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 8, 16))
    (r,) = cap.records
    assert not r.exact and r.flag is not None and "a sort into buckets" in r.flag


@pytest.mark.parametrize("seed", range(6))
def test_clusters_of_routed_tokens_are_flagged_even_where_together_they_hold_every_token(seed):
    """Some seeds' clusters together held all 8 tokens: the pick looked like the whole sequence, and the
    (2, 1, 6, 6) record of two clusters was exact, its clusters drawn as sequences 0 and 1."""
    torch.manual_seed(seed)
    model = RoutedClusters().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(1, 8, 16))
    (r,) = cap.records
    assert (
        not r.exact and r.flag is not None and "picked by indices the model computed from its data" in r.flag
    )


class BeamReorder(nn.Module):
    """Self-attention over a batch whose rows a score reorders first (a beam search's ``index_select(0, ...)``
    by the best beams): whole rows in order, no positions picked. ``maps`` keeps the weights."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(20, d)
        self.q, self.k, self.score = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 1)

    def forward(self, ids):
        x = self.emb(ids)
        best = self.score(x).sum((1, 2)).argsort(descending=True)
        x = x.index_select(0, best)
        self.maps = (self.q(x) @ self.k(x).transpose(1, 2)).softmax(-1)
        return self.maps @ x


def test_whole_rows_reordered_by_a_score_pick_no_positions():
    """The rows are flagged for the batch's order (row b holds another sequence), never for positions
    picked by the data: each row's positions are whole and in order."""
    torch.manual_seed(0)
    model = BeamReorder().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 20, (3, 5)))
    (r,) = cap.records
    torch.testing.assert_close(r.probs[:, 0], model.maps, rtol=0, atol=1e-6)
    assert r.flag is not None and "the batch was put in another order" in r.flag
    assert "picked by indices" not in r.flag


class DeepInfGraphAttention(nn.Module):
    """DeepInf's BatchMultiHeadGraphAttention: per-head weights (H, f_in, f_out) applied by broadcasting the
    nodes over the heads (``h.unsqueeze(1) @ w``), additive scores from two attention vectors per head, the
    adjacency masked through ``.data``. ``truth`` keeps the weights (B, H, n, n)."""

    def __init__(self, heads: int, f_in: int = 5, f_out: int = 4):
        super().__init__()
        self.w = nn.Parameter(torch.randn(heads, f_in, f_out) * 0.3)
        self.a_src = nn.Parameter(torch.randn(heads, f_out, 1) * 0.3)
        self.a_dst = nn.Parameter(torch.randn(heads, f_out, 1) * 0.3)
        self.leaky_relu = nn.LeakyReLU(0.2)

    def forward(self, h, adj):
        n = h.size(1)
        h_prime = torch.matmul(h.unsqueeze(1), self.w)  # (B, H, n, f_out)
        attn_src = torch.matmul(h_prime, self.a_src)
        attn_dst = torch.matmul(h_prime, self.a_dst)
        attn = attn_src.expand(-1, -1, -1, n) + attn_dst.expand(-1, -1, -1, n).permute(0, 1, 3, 2)
        attn = self.leaky_relu(attn)
        attn.data.masked_fill_(~adj.bool().unsqueeze(1), float("-inf"))
        attn = nn.functional.softmax(attn, dim=-1)
        self.truth = attn.detach().clone()
        return torch.matmul(attn, h_prime)


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 2), (4, 4), (3, 3), (2, 8)])
def test_graph_attention_with_nodes_broadcast_over_per_head_weights_is_recorded(batch, heads):
    """With two heads or more, the projection ``(B, 1, n, f) @ (H, f, o)`` lost the nodes' positions: the
    softmax was skipped as "a softmax over a projection's output" (an info note), the attention never shown."""
    torch.manual_seed(batch * 10 + heads)
    model = DeepInfGraphAttention(heads).eval()
    adj = ((torch.rand(batch, 6, 6) > 0.5).float() + torch.eye(6)).clamp(max=1)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 6, 5), adj)
    (r,) = cap.records
    torch.testing.assert_close(r.probs, model.truth, rtol=0, atol=1e-6)
    assert r.kind == "enc_self" and r.exact and not cap.notes and not cap.skipped
    assert r.mask is not None and torch.equal(r.mask.expand(batch, 6, 6), adj.bool())


class VectorAttention(nn.Module):
    """Point Transformer's vector attention: every channel its own softmax over the neighbours j of point i,
    the weights multiplied element by element with values of their own shape, one per pair of points
    (``v[:, None] + delta``), summed over the neighbours."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.phi, self.psi, self.alpha = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.pos = nn.Sequential(nn.Linear(3, d), nn.ReLU(), nn.Linear(d, d))
        self.gamma = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))

    def forward(self, x, p):
        q, k, v = self.phi(x), self.psi(x), self.alpha(x)
        delta = self.pos(p[:, :, None, :] - p[:, None, :, :])
        w = nn.functional.softmax(self.gamma(q[:, :, None, :] - k[:, None, :, :] + delta), dim=-2)
        return (w * (v[:, None, :, :] + delta)).sum(2)


def test_vector_attention_weighing_values_of_its_own_shape_is_a_warning():
    """It was an information note alone ("not a map of queries over keys"): weights times a tensor of their
    own shape were taken for a loss (an entropy, a one-hot target). Values of other positions than the
    weights' own make it a read: a warning that the attention is not recorded, as the docs promise."""
    torch.manual_seed(0)
    with torch.no_grad(), capture_attention(model := VectorAttention().eval()) as cap:
        model(torch.randn(2, 5, 8), torch.randn(2, 5, 3))
    assert not cap.records
    (note,) = cap.notes
    assert "multiply values over positions" in note and "vector attention" in note


class Saturated(nn.Module):
    """Self-attention with no mask whose scores a large scale saturates (a scale multiplied where it should
    divide), or whose padding keys get +1e9 (a mask with the wrong sign): many weights underflow to exactly 0."""

    def __init__(self, how: str, heads: int, d: int = 16):
        super().__init__()
        self.how, self.h = how, heads
        self.emb = nn.Embedding(20, d)
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
        s = q @ k.transpose(-1, -2)
        if self.how == "scaled up":
            s = s * (q.shape[-1] ** 0.5) * 100
        else:  # "+1e9 on padding"
            s = s + (ids == 0)[:, None, None, :] * 1e9
        self.truth = s.softmax(-1)
        return self.truth @ v


@pytest.mark.parametrize("how", ["scaled up", "+1e9 on padding"])
@pytest.mark.parametrize("batch,heads", [(2, 2), (1, 1), (3, 4)])
def test_weights_that_underflow_to_zero_make_up_no_mask(how, batch, heads):
    """Keys that got exactly 0 in every head were recorded as masked (mask_source "zeros"), exact, with no
    word: a mask the model never had, drawn on the Masks page (47 of 72 cells hidden at batch 2). Their scores
    are of many values, no fill: the weights are recorded, and no mask."""
    torch.manual_seed(batch * 10 + heads)
    model = Saturated(how, heads).eval()
    ids = torch.randint(1, 20, (batch, 6))
    ids[:, 4:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (r,) = cap.records
    assert bool((model.truth == 0).any())  # (the weights did underflow)
    torch.testing.assert_close(r.probs, model.truth, rtol=0, atol=1e-6)
    assert r.mask is None and r.mask_source is None and r.exact
    assert bool(cap.trace(0).mask("enc_self", 0).all())  # drawn with nothing hidden


class SortedTimeFirst(nn.Module):
    """An old seq2seq encoder-decoder, time-first ids (S, B), the batch sorted by length inside the model
    before the embedding (``src[:, idx]``, or ``src.t()[idx].t()``), one Bahdanau step over the source. ``how``
    is how it sorts (or "none"); ``truth`` keeps the weights (B, S) in the caller's order."""

    def __init__(self, how: str, d: int = 8):
        super().__init__()
        self.how = how
        self.emb, self.enc = nn.Embedding(20, d), nn.GRU(d, d)
        self.w, self.v = nn.Linear(2 * d, d), nn.Parameter(torch.rand(d))

    def forward(self, src, lens):
        idx = lens.sort(descending=True).indices if self.how != "none" else torch.arange(len(lens))
        if self.how == "columns":
            src = src[:, idx]
        elif self.how == "transposed":
            src = src.t()[idx].t()
        enc, h = self.enc(self.emb(src))
        s, mask = h[0], src == 0
        e = torch.tanh(self.w(torch.cat([s.expand(src.size(0), -1, -1), enc], 2))) @ self.v
        a = e.masked_fill(mask, -1e10).softmax(0)  # (S, B) over the source positions
        self.truth = a.t()[idx.argsort()]
        return (a.unsqueeze(2) * enc).sum(0)[idx.argsort()]


def _time_first(how: str, lengths: list[int]):
    """(the model, its padded time-first ids (S, B), the capture's one record) of ``SortedTimeFirst(how)``."""
    torch.manual_seed(0)
    model = SortedTimeFirst(how).eval()
    lens = torch.tensor(lengths)
    src = torch.randint(1, 20, (max(lengths), len(lengths)))
    for b, n in enumerate(lengths):
        src[n:, b] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(src, lens)
    (r,) = cap.records
    return model, src, r


@pytest.mark.parametrize("how", ["columns", "transposed"])
def test_time_first_ids_sorted_by_length_inside_the_model_are_flagged(how):
    """The record's rows are the sorted batch: row 0 held sequence 2, exact, with no word, and ``trace(0)``
    drew sequence 2's weights and mask as sequence 0's. Sorting the encoder's output (``enc[:, idx]``) was
    flagged; sorting the ids before the embedding now is too."""
    _, _, r = _time_first(how, [2, 4, 6])
    assert not r.exact and "put in another order" in r.flag and "[2, 1, 0]" in r.flag


def test_time_first_ids_in_the_callers_order_stay_exact():
    model, src, r = _time_first("none", [6, 4, 2])
    assert r.exact and r.kind == "cross", r.flag
    torch.testing.assert_close(r.probs[:, 0, 0], model.truth, rtol=0, atol=1e-6)
    assert torch.equal(r.mask[:, 0], (src != 0).t())


class ForwardAttention(nn.Module):
    """Tacotron-style additive attention over a text, three decoder steps, with forward attention's transition
    prior: the softmax times ``(1 - u) * alpha + u * shift(alpha)``, renormalized, is what weighs the memory
    (``how == "prior"``). ``how == "read"``: the softmax times one number a position, summed keeping its axis
    (a read of scalar values). ``truth`` keeps the weights the values were multiplied with, step by step."""

    def __init__(self, how: str, d: int = 8):
        super().__init__()
        self.how = how
        self.emb, self.q, self.k, self.v = (
            nn.Embedding(20, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
            nn.Linear(d, 1),
        )
        self.score = nn.Linear(d, 1)
        self.cell = nn.GRUCell(d, d)

    def forward(self, text):
        mem = self.emb(text)
        keys = self.k(mem)
        b, s = text.shape
        h = torch.zeros(b, 8)
        alpha = torch.zeros(b, s)
        alpha[:, 0] = 1
        self.truth = []
        for _ in range(3):
            align = nn.functional.softmax(
                self.v(torch.tanh(self.q(h).unsqueeze(1) + keys)).squeeze(-1), dim=1
            )
            if self.how == "prior":
                shifted = nn.functional.pad(alpha[:, :-1].clone(), (1, 0, 0, 0))
                alpha = ((1 - 0.3) * alpha + 0.3 * shifted + 1e-8) * align
                alpha = alpha / alpha.sum(dim=1, keepdim=True)
                self.truth.append(alpha)
                h = self.cell(torch.bmm(alpha.unsqueeze(1), mem).squeeze(1), h)
            else:
                self.truth.append(align)
                read = (align * self.score(mem).squeeze(-1)).sum(1, keepdim=True)
                h = self.cell(mem.mean(1) * read, h)
        return h


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_forward_attentions_renormalized_prior_is_what_the_record_holds(batch):
    """The product with the prior, summed keeping its axis, was taken for a read of one value a position:
    the raw softmax was recorded, exact, near uniform, where the model attends to the first tokens."""
    torch.manual_seed(batch)
    model = ForwardAttention("prior").eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 20, (batch, 6)))
    assert len(cap.records) == 3 and not cap.notes
    for r, want in zip(cap.records, model.truth, strict=True):
        torch.testing.assert_close(r.probs[:, 0, 0], want, rtol=0, atol=1e-6)
        assert r.exact and r.kind == "cross"


def test_weights_times_one_value_a_position_summed_keeping_the_axis_are_a_read():
    torch.manual_seed(0)
    model = ForwardAttention("read").eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 20, (2, 6)))
    assert len(cap.records) == 3
    for r, want in zip(cap.records, model.truth, strict=True):
        torch.testing.assert_close(r.probs[:, 0, 0], want, rtol=0, atol=1e-6)


class Pointer(nn.Module):
    """A pointer network's decoder: additive scores over the input points, masked where already picked, and
    ``log_softmax`` as the output distribution (nothing weighted by it)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb, self.enc, self.dec = nn.Linear(2, d), nn.LSTM(d, d, batch_first=True), nn.LSTMCell(d, d)
        self.w1, self.w2, self.v = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False), nn.Linear(d, 1)

    def forward(self, pts):
        e = self.emb(pts)
        enc, (h, c) = self.enc(e)
        h, c = h[0], c[0]
        b, n, _ = enc.shape
        inp, picked, outs = e.mean(1), torch.zeros(b, n, dtype=torch.bool), []
        for _ in range(n):
            h, c = self.dec(inp, (h, c))
            u = self.v(torch.tanh(self.w1(enc) + self.w2(h).unsqueeze(1))).squeeze(-1)
            p = nn.functional.log_softmax(u.masked_fill(picked, float("-inf")), -1)
            outs.append(p)
            idx = p.argmax(-1)
            picked = picked.clone()
            picked[torch.arange(b), idx] = True
            inp = e[torch.arange(b), idx]
        return torch.stack(outs, 1)


def test_a_forward_of_log_softmaxes_alone_says_it_saw_them():
    """The note said no softmax was seen, nothing more, where the pointer's five log_softmax calls ran: it
    now counts them, and says what they are."""
    torch.manual_seed(0)
    model = Pointer().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.rand(2, 5, 2))
    assert not cap.records
    (note,) = cap.notes
    assert "5 log_softmax calls" in note and "pointer network" in note


class PaddedSlots(nn.Module):
    """Slot attention with heads over padded inputs: a softmax over the slots, an epsilon, the padded inputs
    zeroed by a 0/1 mask, then a weighted mean over the inputs, three iterations. ``truths`` keeps the weights
    the values are multiplied with (B, H, slots, inputs)."""

    def __init__(self, heads: int, d: int = 8, slots: int = 3):
        super().__init__()
        self.h = heads
        self.slots = nn.Parameter(torch.randn(1, slots, d))
        self.to_q, self.to_k, self.to_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.gru = nn.GRUCell(d, d)

    def forward(self, x, mask):
        b, n, d = x.shape

        def split(t):
            return t.view(b, -1, self.h, d // self.h).permute(0, 2, 1, 3)

        slots = self.slots.expand(b, -1, -1)
        k, v = split(self.to_k(x)), split(self.to_v(x))
        self.truths = []
        for _ in range(3):
            dots = torch.matmul(split(self.to_q(slots)), k.transpose(-1, -2)) * (d // self.h) ** -0.5
            attn = dots.softmax(dim=-2) + 1e-8
            attn = attn * mask[:, None, None, :]
            attn = attn / attn.sum(dim=-1, keepdim=True)
            self.truths.append(attn)
            updates = torch.matmul(attn, v).permute(0, 2, 1, 3).reshape(b, -1, d)
            slots = self.gru(updates.reshape(-1, d), slots.reshape(-1, d)).reshape(b, -1, d)
        return slots


@pytest.mark.parametrize("batch,heads", [(2, 2), (2, 1), (3, 4)])
def test_slot_attention_masked_between_its_epsilon_and_its_renormalization_is_each_iteration(batch, heads):
    """The 0/1 mask between the softmax over the slots and the mean over the inputs hid the renormalization:
    one record of three, transposed (keys = slots), flagged with a false reason (multiplied along another axis
    than the last normalization), the other iterations left out."""
    torch.manual_seed(batch * 10 + heads)
    model = PaddedSlots(heads).eval()
    mask = torch.ones(batch, 5)
    mask[-1, 3:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 5, 8), mask)
    assert len(cap.records) == 3 and not cap.notes, cap.notes
    for r, want in zip(cap.records, model.truths, strict=True):
        torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)
        assert r.exact and r.kind == "cross" and r.query_labels == ("<slots 0>", "<slots 1>", "<slots 2>")
        assert r.mask is not None and torch.equal(r.mask, mask.bool()[:, None, :].expand(batch, 3, 5))


class AxialAttend(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.qkv = heads, nn.Linear(d, 3 * d)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4).unbind(0)
        a = (q @ k.transpose(-2, -1) * (c // self.h) ** -0.5).softmax(-1)
        return (a @ v).transpose(1, 2).reshape(b, n, c)


class AxialBlock(nn.Module):
    """Axial attention over a (B, C, H, W) map written with permute + reshape: each image row attends over its
    pixels (B * H sequences of W), then each column (B * W sequences of H). On a square map both records have
    the same shape, though row i of one is an image row and row i of the other an image column."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.stem = nn.Conv2d(3, d, 3, padding=1)
        self.row, self.col = AxialAttend(d, heads), AxialAttend(d, heads)

    def forward(self, img):
        x = self.stem(img)
        b, c, h, w = x.shape
        x = x + self.row(x.permute(0, 2, 3, 1).reshape(b * h, w, c)).reshape(b, h, w, c).permute(0, 3, 1, 2)
        return x + self.col(x.permute(0, 3, 2, 1).reshape(b * w, h, c)).reshape(b, w, h, c).permute(
            0, 3, 2, 1
        )


def test_rows_and_columns_of_a_square_map_are_not_drawn_as_one_sequences_layers():
    """``trace(1)`` stacked image row 1's map and image column 1's as layers 0 and 1 of one sequence, over the
    same labels, with no note (on a map that is not square their shapes differ, and the columns were left out
    and said). The calls whose row holds other positions are left out now, and said."""
    torch.manual_seed(0)
    model = AxialBlock().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 3, 4, 4))
    rows, cols = cap.records
    assert rows.exact and cols.exact
    assert rows.query_positions[1].tolist() != cols.query_positions[1].tolist()
    tr = cap.trace(1)
    assert tr.enc_self.shape[0] == 1  # one layer: the rows
    np.testing.assert_allclose(tr.enc_self[0], rows.probs[1].numpy(), atol=1e-6)
    notes = tr.meta["capture_notes"]
    (note,) = [n for n in notes if "holds other positions" in n]
    assert note.startswith("enc_self (col)")
    # (and the rows drawn are image rows, parts of image 0: said too)
    assert any("over 8 rows for the 2 sequence(s) given" in n and "sequence 0" in n for n in notes), notes
    assert "holds other positions" in note and "not deeper layers" in note


class SplitPadSorted(nn.Module):
    """Sequences handed in as one flat tensor of ids and their lengths, split and padded inside the model
    (``pad_sequence(torch.split(emb(ids), lens))``), then sorted by length (``sort``: the caller's order, kept).
    ``truth`` keeps the weights in the caller's order of sequences."""

    def __init__(self, sort: bool, heads: int = 2, d: int = 8):
        super().__init__()
        self.sort, self.h, self.d = sort, heads, d
        self.emb, self.qkv = nn.Embedding(50, 16), nn.Linear(16, 3 * heads * d)

    def forward(self, ids, lens):
        x = nn.utils.rnn.pad_sequence(torch.split(self.emb(ids), lens.tolist()), batch_first=True)
        b, n, _ = x.shape
        perm = torch.argsort(lens, descending=True) if self.sort else torch.arange(b)
        x = x[perm]
        keep = torch.arange(n)[None] < lens[perm][:, None]
        q, k, v = self.qkv(x).view(b, n, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        w = (
            (q @ k.transpose(-1, -2) / self.d**0.5)
            .masked_fill(~keep[:, None, None], float("-inf"))
            .softmax(-1)
        )
        self.truth = w[torch.argsort(perm)]
        return (w @ v)[torch.argsort(perm)]


@pytest.mark.parametrize("lens", [[3, 6, 4], [2, 5, 3, 6], [4, 1, 3, 2, 5, 6]])
def test_sequences_split_from_flat_ids_and_sorted_by_length_are_flagged(lens):
    """The record's rows were the sorted order, exact, with no word: ``trace(0)`` drew the longest sequence's
    map for the first (off by up to 0.56). Record row b is the caller's sequence order[b]: flagged, with the
    order; in the caller's own order the record stays exact."""
    torch.manual_seed(len(lens))
    lens_t = torch.tensor(lens)
    ids = torch.randint(1, 50, (sum(lens),))
    for sort in (True, False):
        model = SplitPadSorted(sort).eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(ids, lens_t)
        (r,) = cap.records
        if sort:
            order = torch.argsort(lens_t, descending=True).tolist()
            assert not r.exact and f"the caller's sequence {order}[b]" in r.flag
        else:
            assert r.exact and r.flag is None
            torch.testing.assert_close(r.probs.nan_to_num(), model.truth.nan_to_num(), rtol=0, atol=1e-6)


class Windows(nn.Module):
    """Self-attention within windows of ``w`` tokens folded into the batch (``x.view(B * L // w, w, d)``)."""

    def __init__(self, d: int = 8, w: int = 4):
        super().__init__()
        self.w, self.emb, self.qkv = w, nn.Embedding(50, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = self.qkv(x.view(b * n // self.w, self.w, d)).chunk(3, -1)
        return ((q @ k.transpose(1, 2)).softmax(-1) @ v).view(b, n, d)


def test_a_trace_of_windows_says_which_sequence_its_row_is_part_of():
    """``trace(1)`` of windows folded into the batch drew window 1, part of sequence 0, as "sequence 1", with
    no word: the record's rows are windows, exact, in the model's order, and the trace now says which
    sequence the row drawn reads. Windows of one sequence each, in order, say nothing."""
    model = Windows().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 50, (2, 8)))
    (r,) = cap.records
    rows = cap.rows_of(r)
    assert r.exact and rows is not None and rows[0].tolist() == [0, 0, 1, 1] and rows[1] == 2
    (note,) = cap.trace(1).meta["capture_notes"]
    assert (
        "over 4 rows for the 2 sequence(s) given" in note
        and "row 1, drawn here, reads positions of sequence 0" in note
    )
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 50, (2, 4)))
    assert "capture_notes" not in cap.trace(1).meta


class ScoresJoined(nn.Module):
    """Multi-head self-attention whose scores are made one head (or one sequence) at a time and joined:
    ``torch.stack([q[:, h] @ k[:, h].T for h in range(H)], 1)`` (masked after, or each head before), or
    ``torch.cat`` of each sequence's. ``truth`` keeps the weights (B, H, L, L)."""

    def __init__(self, heads: int, how: str, d: int = 24):
        super().__init__()
        self.h, self.how, self.d = heads, how, d
        self.emb, self.qkv = nn.Embedding(50, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, self.d // self.h).permute(2, 0, 3, 1, 4)
        keep = torch.ones(n, n, dtype=torch.bool).tril() & (ids != 0)[:, None, None, :]
        if self.how == "heads stacked":
            s = torch.stack([q[:, h] @ k[:, h].transpose(-1, -2) for h in range(self.h)], 1)
            s = s.masked_fill(~keep, float("-inf"))
        elif self.how == "heads masked, stacked":
            s = torch.stack([(q[:, h] @ k[:, h].transpose(-1, -2)).masked_fill(~keep[:, 0], float("-inf"))
                             for h in range(self.h)], 1)  # fmt: skip
        else:  # "sequences joined"
            s = torch.cat([q[i : i + 1] @ k[i : i + 1].transpose(-1, -2) for i in range(b)], 0)
            s = s.masked_fill(~keep, float("-inf"))
        self.truth = s.softmax(-1)
        return (self.truth @ v).transpose(1, 2).reshape(b, n, self.d)


@pytest.mark.parametrize("how", ["heads stacked", "heads masked, stacked", "sequences joined"])
@pytest.mark.parametrize("batch,heads", [(2, 2), (3, 3), (3, 1), (2, 4)])
def test_scores_made_a_head_or_a_sequence_at_a_time_and_joined_are_exact(how, batch, heads):
    """The join was read as the first part broadcast over the others: every head a copy of head 0's
    positions, so the record, whose numbers were right, was flagged with an untrue reason ("one position is
    several queries of one sequence and head ... a guess"); with one head, "stack changed the scores' shape"."""
    torch.manual_seed(batch * 7 + heads)
    model = ScoresJoined(heads, how).eval()
    ids = torch.randint(1, 50, (batch, 6))
    ids[-1, 4:] = 0
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (r,) = cap.records
    torch.testing.assert_close(r.probs, model.truth, rtol=0, atol=1e-6)
    assert r.exact and r.kind == "dec_self" and not cap.notes, (r.flag, cap.notes)
    assert torch.equal(r.mask, torch.ones(6, 6, dtype=torch.bool).tril()[None] & (ids != 0)[:, None, :])


class ExpTwice(nn.Module):
    """A softmax by hand, as tutorials write it, with the exp computed twice: ``torch.exp(s) / torch.exp(s).sum(
    -1, keepdim=True)``, or with the max subtracted in each (``how == "shifted"``). ``truth`` keeps it."""

    def __init__(self, how: str, heads: int = 2, d: int = 16):
        super().__init__()
        self.how, self.h, self.d = how, heads, d
        self.emb, self.qkv = nn.Embedding(50, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, self.h, self.d // self.h).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) * (self.d // self.h) ** -0.5
        if self.how == "shifted":
            w = torch.exp(s - s.amax(-1, keepdim=True)) / torch.exp(s - s.amax(-1, keepdim=True)).sum(
                -1, keepdim=True
            )
        else:
            w = torch.exp(s) / torch.exp(s).sum(dim=-1, keepdim=True)
        self.truth = w
        return w @ v


@pytest.mark.parametrize("how", ["plain", "shifted"])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_softmax_by_hand_with_its_exp_computed_twice_is_recorded(how, batch):
    """It was not recorded, and a warning said the scores multiply values without a softmax (sigmoid
    attention, sparsemax): untrue, the weights are softmax(s)."""
    torch.manual_seed(batch)
    model = ExpTwice(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 50, (batch, 5)))
    (r,) = cap.records
    torch.testing.assert_close(r.probs, model.truth, rtol=0, atol=1e-6)
    assert r.exact and r.kind == "enc_self" and not cap.notes, cap.notes


class SdpaFloatMask(nn.Module):
    """SDPA given a float mask of 0s and 1s (a bool mask turned into floats, not into 0 / -inf): causal
    (``tril(ones)``) or padding (1 = a real token), or a correct additive causal mask."""

    def __init__(self, how: str):
        super().__init__()
        self.how, self.emb, self.qkv = how, nn.Embedding(50, 16), nn.Linear(16, 48)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (t.view(b, n, 2, 8).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
        if self.how == "causal 0/1":
            m = torch.ones(n, n).tril()
        elif self.how == "padding 0/1":
            m = (ids != 0).float()[:, None, None, :]
        else:
            m = torch.zeros(n, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)


@pytest.mark.parametrize("how", ["causal 0/1", "padding 0/1", "additive"])
def test_a_float_mask_of_zeros_and_ones_handed_to_sdpa_is_said(how):
    """Added to the scores, 0 or 1 hides no key: by hand and through MultiheadAttention this was a warning,
    through SDPA nothing (the map right, its bug unsaid). A correct additive mask says nothing."""
    ids = torch.randint(1, 50, (2, 5))
    ids[1, 3:] = 0
    model = SdpaFloatMask(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (r,) = cap.records
    if how == "additive":
        assert not cap.notes and r.kind == "dec_self"
    else:
        (note,) = cap.notes
        assert "0s and 1s was passed to scaled_dot_product_attention as a float attn_mask" in note
        assert ("attends to later keys" in note) == (how == "causal 0/1")


def test_xlnets_target_mapping_is_a_selection_not_scores():
    """XLNet's query stream picks the targets' rows with a one-hot ``target_mapping`` handed in
    (``einsum("mbnd,mlb->lbnd", q, target_mapping)``): that product was taken for query-key scores, and the
    next product for scores weighing values without a softmax (a false warning on a Hugging Face model)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.XLNetConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, d_inner=64,
                                      attn_implementation="eager")  # fmt: skip
    model = transformers.XLNetLMHeadModel(config).eval()
    ids = torch.randint(3, 50, (2, 8))
    perm = torch.zeros(2, 8, 8)
    perm[:, :, -1] = 1.0
    target = torch.zeros(2, 1, 8)
    target[:, 0, -1] = 1.0
    with torch.no_grad(), capture_attention(model) as cap:
        out = model(input_ids=ids, perm_mask=perm, target_mapping=target, output_attentions=True)
    assert not [n for n in cap.notes if "without a softmax" in n], cap.notes
    content = [r for r in cap.records if r.exact]
    assert len(content) == 2  # the content stream's self-attention, a layer each, as the model returns it
    for r, (want, _) in zip(content, out.attentions, strict=True):
        torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)


class MaskedExp(nn.Module):
    """A softmax by hand whose exp is multiplied by a 0/1 padding mask, then divided by its sum: over a
    learned context vector's scores (``how == "pooling"``, attention pooling over a BiLSTM) or over q . k."""

    def __init__(self, how: str, d: int = 8):
        super().__init__()
        self.how = how
        self.emb = nn.Embedding(20, d, padding_idx=0)
        self.w, self.ctx, self.q, self.k = (
            nn.Linear(d, d),
            nn.Linear(d, 1, bias=False),
            nn.Linear(d, d),
            nn.Linear(d, d),
        )

    def forward(self, ids):
        h = self.emb(ids)
        mask = (ids != 0).float()
        if self.how == "pooling":
            e = self.ctx(torch.tanh(self.w(h))).squeeze(-1)
            ex = torch.exp(e - e.max(dim=1, keepdim=True)[0]) * mask
        else:
            e = self.q(h) @ self.k(h).transpose(1, 2)
            ex = torch.exp(e - e.amax(-1, keepdim=True)) * mask[:, None, :]
        self.truth = ex / ex.sum(dim=-1, keepdim=True)
        if self.how == "pooling":
            return (self.truth.unsqueeze(-1) * h).sum(1)
        return self.truth @ h


@pytest.mark.parametrize("how", ["pooling", "self"])
def test_a_padding_mask_multiplied_into_a_softmax_by_hand_is_the_records_mask(how):
    """The mask was read from the weights' zeros only; once zeros of scores of many values stopped making up a
    mask, it was lost. The 0/1 mask multiplied into the exp is the record's mask ("multiplied")."""
    model = MaskedExp(how).eval()
    ids = torch.tensor([[4, 5, 6, 7, 8], [9, 10, 11, 0, 0]])
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (r,) = cap.records
    want = model.truth[:, None, None] if how == "pooling" else model.truth[:, None]
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)
    assert r.exact and r.mask_source == "multiplied" and r.mask is not None
    assert torch.equal(r.mask, (ids != 0)[:, None, :].expand_as(r.mask))


class HandWeightedSum(nn.Module):
    """A softmax by hand (``exp(s - max)`` over its sum) whose weights weigh the values by a weighted sum written
    out, ``(w.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)`` (or ``w[..., None]``), not by a product."""

    def __init__(self, heads: int, how: str, d: int = 16):
        super().__init__()
        self.h, self.how, self.d = heads, how, d
        self.emb, self.qkv = nn.Embedding(50, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, self.h, self.d // self.h).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2)
        e = torch.exp(s - s.amax(-1, keepdim=True))
        w = e / e.sum(-1, keepdim=True)
        self.truth = w
        wv = w.unsqueeze(-1) if self.how == "unsqueeze" else w[..., None]
        return (wv * v.unsqueeze(-3)).sum(-2)


@pytest.mark.parametrize("how", ["unsqueeze", "index"])
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_a_softmax_by_hand_weighing_values_by_a_written_out_sum_is_recorded(how, batch, heads):
    """Its weights were recorded only where a product took them: here nothing was recorded, and the note said
    no softmax was seen."""
    torch.manual_seed(batch * 10 + heads)
    model = HandWeightedSum(heads, how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, 50, (batch, 5)))
    (r,) = cap.records
    torch.testing.assert_close(r.probs, model.truth, rtol=0, atol=1e-6)
    assert r.exact and r.kind == "enc_self" and not cap.notes, cap.notes


def test_a_trace_of_swin_windows_over_an_image_says_which_image_its_row_is_part_of():
    """An image handed in as (B, H, W, C): its sequences are the images, not the rows of pixels, so the
    windows' rows are parts of image 0 or 1, said; the shifted windows of the next block are left out."""
    import importlib

    swin = importlib.import_module("usermodels.swin_windows")
    model = swin.build()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*swin.sample_batch())
    assert all(
        (rows := cap.rows_of(r)) is not None and rows[0].tolist() == [0] * 4 + [1] * 4 for r in cap.records
    )
    notes = cap.trace(5).meta["capture_notes"]
    assert any("over 8 rows for the 2 sequence(s) given" in n and "row 5, drawn here, reads positions of sequence 1"
               in n for n in notes), notes  # fmt: skip
    assert any("shifted windows beside unshifted ones" in n for n in notes)


class Nystrom(nn.Module):
    """Nystromformer's attention by hand: landmarks as segment means of the queries and keys, three softmaxes
    (tokens over landmarks, landmarks over landmarks, landmarks over tokens) and a pseudo-inverse. ``k1``
    keeps the tokens' weights over the landmarks (B, H, n, m)."""

    def __init__(self, heads: int = 2, d: int = 16, landmarks: int = 4):
        super().__init__()
        self.h, self.m = heads, landmarks
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        q = q * q.shape[-1] ** -0.5
        q_l = q.reshape(b, self.h, self.m, n // self.m, -1).mean(-2)
        k_l = k.reshape(b, self.h, self.m, n // self.m, -1).mean(-2)
        self.k1 = torch.softmax(q @ k_l.transpose(-1, -2), -1)
        k2 = torch.softmax(q_l @ k_l.transpose(-1, -2), -1)
        k3 = torch.softmax(q_l @ k.transpose(-1, -2), -1)
        return ((self.k1 @ torch.linalg.pinv(k2)) @ (k3 @ v)).transpose(1, 2).reshape(b, n, -1)


def test_nystroms_tokens_over_landmarks_are_drawn_beside_the_tokens():
    """``trace(i)`` raised ("none of the attention captured can be drawn"): the landmarks asking each other and
    the tokens made their labels count as positions joined to the sequence, as a [CLS] is, and the tokens'
    map over them became self-attention with 8 queries and 4 keys. Landmarks asking are not joined; the map is
    drawn over the tokens with the landmarks as their own key columns, as Linformer's pooled keys are."""
    torch.manual_seed(0)
    model = Nystrom().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 8, 16))
    for i in range(2):
        tr = cap.trace(i)
        assert tr.kinds == ("enc_self",)
        np.testing.assert_allclose(tr.enc_self_learned[0], model.k1[i].numpy(), atol=1e-6)
        assert not tr.enc_self.any()  # (the tokens are no keys of it: weight 0 there)


class FilledExp(nn.Module):
    """A softmax by hand whose exp is zeroed at the padding by a fill (``exp(s - max).masked_fill(pad, 0)``), then
    divided by its sum: over q . k, or over a learned context vector's scores (``how == "pooling"``)."""

    def __init__(self, how: str, d: int = 8):
        super().__init__()
        self.how = how
        self.emb = nn.Embedding(20, d, padding_idx=0)
        self.q, self.k, self.ctx = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 1, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        if self.how == "pooling":
            e = self.ctx(torch.tanh(h)).squeeze(-1)
            ex = torch.exp(e - e.amax(-1, keepdim=True)).masked_fill(ids == 0, 0)
        else:
            e = self.q(h) @ self.k(h).transpose(1, 2)
            ex = torch.exp(e - e.amax(-1, keepdim=True)).masked_fill((ids == 0)[:, None, :], 0)
        self.truth = ex / ex.sum(-1, keepdim=True)
        return (self.truth.unsqueeze(-1) * h).sum(1) if self.how == "pooling" else self.truth @ h


@pytest.mark.parametrize("how", ["pooling", "self"])
def test_a_softmax_by_hand_filled_with_zeros_after_its_exp_is_recorded_with_its_mask(how):
    """It was not recorded: a warning said an exp of scores could not be followed into a softmax."""
    model = FilledExp(how).eval()
    ids = torch.tensor([[4, 5, 6, 7, 8], [9, 10, 11, 0, 0]])
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (r,) = cap.records
    want = model.truth[:, None, None] if how == "pooling" else model.truth[:, None]
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)
    assert r.exact and not cap.notes and r.mask is not None
    assert torch.equal(r.mask, (ids != 0)[:, None, :].expand_as(r.mask))
