"""attnscope.core.families.capture on three more ways people write attention, each model keeping the
weights it multiplied its values with (``computed``):

- the Set Transformer (juho-lee/set_transformer ``modules.py``): heads folded head-major with
  ``torch.cat(Q.split(dim_split, 2), 0)``; an ISAB's inducing points (a parameter repeated over the
  batch) attend over the set, then the set attends over that induced summary, whose keys are all
  learned positions: every sequence stays its own (batch, head) slice, never one long sequence;
- top-k sparse attention (Explicit Sparse Transformer): each head keeps its own k best keys, so the
  heads' masks differ; an encoder stays ``enc_self`` although what *every* head may see is nearly
  empty (an empty mask looks causal);
- ``F.linear(input=x, weight=w, bias=b)`` by keyword (Swin-v2 ports): followed like a positional call,
  so the layout is exact rather than flagged.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention


class MAB(nn.Module):
    def __init__(self, dq: int, dk: int, dv: int, heads: int, sink: list):
        super().__init__()
        self.dim_V, self.num_heads, self.sink = dv, heads, sink
        self.fc_q, self.fc_k, self.fc_v, self.fc_o = (nn.Linear(dq, dv), nn.Linear(dk, dv), nn.Linear(dk, dv),
                                                      nn.Linear(dv, dv))  # fmt: skip

    def forward(self, Q, K):
        Q = self.fc_q(Q)
        K, V = self.fc_k(K), self.fc_v(K)
        dim_split = self.dim_V // self.num_heads
        Q_, K_, V_ = (torch.cat(t.split(dim_split, 2), 0) for t in (Q, K, V))
        A = torch.softmax(Q_.bmm(K_.transpose(1, 2)) / math.sqrt(self.dim_V), 2)
        b = Q.size(0)
        self.sink.append(A.detach().clone().view(self.num_heads, b, *A.shape[1:]).transpose(0, 1))
        out = torch.cat((Q_ + A.bmm(V_)).split(b, 0), 2)
        return out + F.relu(self.fc_o(out))


class SetTransformer(nn.Module):
    def __init__(self, heads: int, inducing: int = 4):
        super().__init__()
        d = 4 * heads
        self.computed: list[torch.Tensor] = []
        self.I = nn.Parameter(torch.randn(1, inducing, d))
        self.mab0 = MAB(d, 3, d, heads, self.computed)  # inducing points over the set
        self.mab1 = MAB(3, d, d, heads, self.computed)  # the set over the induced summary
        self.S = nn.Parameter(torch.randn(1, 2, d))
        self.pma = MAB(d, d, d, heads, self.computed)  # seeds over the set
        self.out = nn.Linear(d, 4)

    def forward(self, X):
        H = self.mab0(self.I.repeat(X.size(0), 1, 1), X)
        X = self.mab1(X, H)
        return self.out(self.pma(self.S.repeat(X.size(0), 1, 1), X))


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 2), (4, 4), (6, 1), (2, 4)])
def test_set_transformer_sequences_over_an_induced_summary_stay_apart(batch, heads):
    torch.manual_seed(batch * 10 + heads)
    model = SetTransformer(heads).eval()
    X = torch.randn(batch, 6, 3)
    with torch.no_grad():
        plain = model(X)
        model.computed.clear()
        with capture_attention(model) as cap:
            out = model(X)
    assert torch.equal(out, plain)
    assert [r.name for r in cap.records] == ["mab0", "mab1", "pma"]
    for rec, used in zip(cap.records, model.computed, strict=True):
        assert rec.exact, rec.flag
        assert rec.probs.shape == used.shape  # (B, H, q, k): the batch is not folded into the queries
        torch.testing.assert_close(rec.probs, used, atol=1e-6, rtol=0)
    assert cap.records[0].query_labels == ("<I 0>", "<I 1>", "<I 2>", "<I 3>")
    assert [r.kind for r in cap.records] == ["cross"] * 3  # the set over its summary too: other keys


class TopK(nn.Module):
    """Each head keeps its own TOPK best keys among the unpadded ones (Explicit Sparse Transformer)."""

    def __init__(self, heads: int, layers: int = 2, topk: int = 3):
        super().__init__()
        d = 4 * heads
        self.h, self.topk, self.computed = heads, topk, []
        self.inp = nn.Linear(5, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))

    def forward(self, x, lengths):
        b, t, _ = x.shape
        keep = torch.arange(t)[None] < lengths[:, None]
        h = self.inp(x)
        for qkv in self.qkv:
            q, k, v = qkv(h).view(b, t, 3, self.h, -1).permute(2, 0, 3, 1, 4)
            s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
                ~keep[:, None, None, :], -math.inf
            )
            thresh = s.topk(min(self.topk, t), dim=-1).values[..., -1:]
            w = torch.softmax(s.masked_fill(s < thresh, -math.inf), dim=-1)
            self.computed.append(w.detach().clone())
            h = h + (w @ v).transpose(1, 2).reshape(b, t, -1)
        return h


@pytest.mark.parametrize(("batch", "heads"), [(1, 4), (2, 4), (3, 8), (4, 4)])
def test_heads_with_their_own_top_k_keys_are_an_encoder(batch, heads):
    torch.manual_seed(batch + heads)
    model = TopK(heads).eval()
    x, lengths = torch.randn(batch, 7, 5), torch.tensor([7, 5, 6, 4, 7, 3][:batch])
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, lengths)
    assert len(cap.records) == 2
    for rec, used in zip(cap.records, model.computed, strict=True):
        torch.testing.assert_close(rec.probs, used, atol=1e-6, rtol=0)
        assert rec.head_masks_differ
        assert rec.kind == "enc_self"


def test_a_linear_given_by_keywords_is_followed_like_one_given_by_position():
    class KeywordLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(9, 8), nn.Linear(8, 24)

        def forward(self, ids):
            b, n = ids.shape
            x = self.emb(ids)
            qkv = F.linear(input=x, weight=self.qkv.weight, bias=self.qkv.bias)
            q, k, v = qkv.view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
            self.w = torch.softmax(q @ k.transpose(-1, -2), -1)
            return self.w @ v

    model = KeywordLinear()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 9, (3, 5)))
    (rec,) = cap.records
    assert cap.notes == []
    assert rec.exact and rec.flag is None
    torch.testing.assert_close(rec.probs, model.w, atol=0, rtol=0)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_queries_computed_a_chunk_at_a_time_are_one_layer_of_an_encoder_not_a_cache(batch):
    """Memory-efficient attention over chunks of queries (every chunk sees all keys of its own input):
    the chunks are joined into one exact map of the layer, and the keys beyond a chunk's queries are
    its own sequence's, not a KV cache, so the kind stays enc_self; a causal chunked decoder stays
    dec_self by its mask."""

    class Chunked(nn.Module):
        def __init__(self, causal: bool):
            super().__init__()
            self.emb, self.qkv, self.causal, self.used = nn.Embedding(9, 8), nn.Linear(8, 24), causal, []

        def forward(self, ids):
            b, n = ids.shape
            q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
            out = torch.empty_like(q)
            for s in range(0, n, 3):
                scores = q[:, :, s : s + 3] @ k.transpose(-1, -2)
                if self.causal:
                    rows = torch.arange(s, min(s + 3, n))[:, None]
                    scores = scores.masked_fill(torch.arange(n)[None] > rows, -math.inf)
                p = scores.softmax(-1)
                self.used.append(p)
                out[:, :, s : s + 3] = p @ v
            return out

    for causal, kind in ((False, "enc_self"), (True, "dec_self")):
        torch.manual_seed(batch)
        model = Chunked(causal)
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randint(1, 9, (batch, 6)))
        (rec,) = cap.records
        assert rec.kind == kind and rec.exact and rec.probs.shape == (batch, 2, 6, 6)
        torch.testing.assert_close(rec.probs, torch.cat(model.used, dim=2), atol=0, rtol=0)
        if causal:
            assert torch.equal(rec.mask, torch.ones(6, 6, dtype=torch.bool).tril().expand(batch, 6, 6))
        assert cap.notes == []


class _Sliced(nn.Module):
    """diffusers' attention slicing: ``get_attention_scores`` on ``slice_size`` rows of the (batch x
    heads) fold at a time, written into a preallocated output; ``shared`` keys: one memory (1, m, 4)
    for the whole batch."""

    def __init__(self, heads: int = 2, slice_size: int = 1, shared: bool = False):
        super().__init__()
        self.h, self.slice_size, self.scale, self.shared = heads, slice_size, 0.5, shared
        self.to_q, self.to_k, self.to_v = (nn.Linear(4, 4 * heads) for _ in range(3))
        self.memory = torch.randn(1, 3, 4)

    def fold(self, t):
        b, n, _ = t.shape
        return t.view(b, n, self.h, 4).permute(0, 2, 1, 3).reshape(b * self.h, n, 4)

    def get_attention_scores(self, q, k):
        empty = torch.empty(q.shape[0], q.shape[1], k.shape[1])
        return torch.baddbmm(empty, q, k.transpose(-1, -2), beta=0, alpha=self.scale).softmax(dim=-1)

    def keys(self, x, f):  # shared: one memory projected once, then broadcast over the batch
        return self.fold(f(self.memory).expand(x.shape[0], -1, -1) if self.shared else f(x))

    def reference(self, x):  # every (sequence, head) at once, outside the capture: (B, H, q, k)
        q, k = self.fold(self.to_q(x)), self.keys(x, self.to_k)
        return torch.softmax(q @ k.transpose(-1, -2) * self.scale, -1).view(
            x.shape[0], self.h, x.shape[1], -1
        )

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.fold(self.to_q(x)), self.keys(x, self.to_k), self.keys(x, self.to_v)
        out = torch.zeros(b * self.h, n, 4)
        for i in range(0, b * self.h, self.slice_size):
            p = self.get_attention_scores(q[i : i + self.slice_size], k[i : i + self.slice_size])
            out[i : i + self.slice_size] = torch.bmm(p, v[i : i + self.slice_size])
        return out


@pytest.mark.parametrize("slice_size", [1, 2])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 2), (2, 4), (4, 4), (3, 6)])
def test_attention_sliced_over_batch_and_heads_is_joined_into_one_exact_layer(batch, heads, slice_size):
    """Every slice is placed by its lineage (which sequence, which head): one head or several per
    slice, batch size equal to the head count or not."""
    torch.manual_seed(batch * 10 + heads)
    sliced = _Sliced(heads, slice_size)
    x = torch.randn(batch, 5, 4)
    with torch.no_grad(), capture_attention(sliced) as cap:
        sliced(x)
    (rec,) = cap.records
    assert rec.exact and rec.flag is None and cap.notes == []
    with torch.no_grad():
        torch.testing.assert_close(rec.probs, sliced.reference(x), atol=1e-6, rtol=0)


@pytest.mark.parametrize(("heads", "slice_size"), [(2, 3), (3, 2)])
def test_slices_across_sequences_are_flagged_not_guessed(heads, slice_size):
    """A slice size that does not divide the heads puts the end of one sequence's heads and the start
    of the next's in one slice: that slice is not a grid of sequences and heads, so it is flagged with
    its reason, and nothing is joined into a layer that looks exact. The other slices of the call are
    flagged too: alone, each claimed to be sequence 0 (SD 2.x's slicing with 3 heads by 2 left the last
    slice, sequence 1's heads 1 and 2, exact as sequence 0's heads 0 and 1)."""
    torch.manual_seed(0)
    sliced = _Sliced(heads, slice_size)
    with torch.no_grad(), capture_attention(sliced) as cap:
        sliced(torch.randn(2, 5, 4))
    assert any("could not verify" in n and "hold different" in n for n in cap.notes), cap.notes
    assert cap.records and not any(r.exact for r in cap.records)
    assert [n for n in cap.notes if "several attention maps" in n] == []  # a flagged slice is no piece


def test_slices_over_keys_the_batch_shares_are_not_joined_and_say_so():
    """Keys one memory gives every sequence do not tell the slices' sequences apart: the slices stay
    maps of their own, exact each, and a warning says they could not be joined."""
    torch.manual_seed(0)
    sliced = _Sliced(2, 1, shared=True)
    with torch.no_grad(), capture_attention(sliced) as cap:
        sliced(torch.randn(2, 5, 4))
    assert len(cap.records) == 4 and all(r.exact and r.probs.shape == (1, 1, 5, 3) for r in cap.records)
    (note,) = [n for n in cap.notes if "several attention maps" in n]
    assert "could not be joined into one layer" in note and "keys the batch shares" in note


def test_layers_inline_and_axial_attention_are_not_taken_for_pieces():
    """Layers written inline in one forward (the same queries each time) and an axial block (rows,
    then columns, over the same positions) are maps of their own, not pieces of one."""

    class Inline(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.q, self.k = nn.Embedding(9, 8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, ids):
            x = self.emb(ids)
            b, n, _ = x.shape
            for _ in range(2):  # two layers (shared weights) inline
                q, k = (f(x).view(b, n, 2, 4).transpose(1, 2) for f in (self.q, self.k))
                x = x + (torch.softmax(q @ k.transpose(-1, -2), -1) @ q).transpose(1, 2).reshape(b, n, 8)
            grid = x.view(b, 2, n // 2, 8)  # axial: along rows, then along columns
            rows = torch.softmax(grid @ grid.transpose(-1, -2), -1) @ grid
            cols = grid.transpose(1, 2)
            return rows.sum() + (torch.softmax(cols @ cols.transpose(-1, -2), -1) @ cols).sum()

    torch.manual_seed(0)
    with torch.no_grad():
        inline = Inline()
        with capture_attention(inline) as cap:
            inline(torch.randint(1, 9, (2, 6)))
        assert len(cap.records) == 4 and not [n for n in cap.notes if "several attention maps" in n]


@pytest.mark.parametrize("pixels", [5, 7])
@pytest.mark.parametrize("batch", [1, 2])
def test_two_attentions_inline_in_one_call_are_not_joined_as_pieces(batch, pixels):
    """Segment Anything's two-way block written inline: tokens read the image, then the image reads the
    tokens, in one call of one module, with the same heads, as many image positions as tokens or not.
    Each map is its own (cross-attention both), exact, and neither is taken for a piece of the other."""

    class TwoWay(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.img = nn.Embedding(9, 8), nn.Linear(3, 8)
            self.q1, self.k1, self.q2, self.k2 = (nn.Linear(8, 8) for _ in range(4))
            self.used = []

        def attend(self, q, k):
            b, n, _ = q.shape
            q, k = (t.view(b, -1, 2, 4).transpose(1, 2) for t in (q, k))
            w = torch.softmax(q @ k.transpose(-1, -2), -1)
            self.used.append(w)
            return (w @ k).transpose(1, 2).reshape(b, n, 8)

        def forward(self, ids, image):
            tokens, pixels = self.emb(ids), self.img(image)
            tokens = tokens + self.attend(self.q1(tokens), self.k1(pixels))
            return pixels + self.attend(self.q2(pixels), self.k2(tokens))

    torch.manual_seed(batch)
    model = TwoWay()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 9, (batch, 5)), torch.randn(batch, pixels, 3))
    assert [r.kind for r in cap.records] == ["cross", "cross"] and cap.notes == []
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact
        torch.testing.assert_close(rec.probs, used, atol=0, rtol=0)


class _CoreAttention(nn.Module):
    """The attention of a share of the heads, ``(b, h_local, s, d)`` in and out."""

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v


class _HeadGroups(nn.Module):
    """Ulysses' sequence parallelism run on one device: each rank's share of one layer's heads through
    the same attention module, one call per share; ``layers`` such layers share that module."""

    def __init__(self, heads: int, groups: int, layers: int = 1, d: int = 4):
        super().__init__()
        self.h, self.groups, self.d = heads, groups, d
        self.qkv = nn.ModuleList([nn.Linear(heads * d, 3 * heads * d) for _ in range(layers)])
        self.core = _CoreAttention()

    def split(self, qkv, x):
        b, s, _ = x.shape
        return [t.view(b, s, self.h, self.d).transpose(1, 2) for t in qkv(x).chunk(3, -1)]

    def layer(self, qkv, x):
        q, k, v = self.split(qkv, x)
        outs = [self.core(*share) for share in zip(q.chunk(self.groups, 1), k.chunk(self.groups, 1),
                                                   v.chunk(self.groups, 1), strict=True)]  # fmt: skip
        return x + torch.cat(outs, 1).transpose(1, 2).reshape(*x.shape[:2], self.h * self.d)

    def reference(self, x):  # every layer's (B, H, q, k), outside the capture
        maps = []
        for qkv in self.qkv:
            q, k, _ = self.split(qkv, x)
            maps.append(torch.softmax(q @ k.transpose(-1, -2) / self.d**0.5, -1))
            x = self.layer(qkv, x)
        return maps

    def forward(self, x):
        for qkv in self.qkv:
            x = self.layer(qkv, x)
        return x


@pytest.mark.parametrize(
    ("batch", "heads", "groups"), [(1, 2, 2), (2, 2, 2), (4, 4, 2), (3, 6, 3), (2, 8, 4)]
)
def test_heads_a_group_per_call_of_one_module_are_one_layer(batch, heads, groups):
    """One layer's heads in groups, a call of the same module per group: one exact layer of every head
    (it was a layer per group: a 1-layer model of 4 heads drawn as 2 layers of 2)."""
    torch.manual_seed(batch * 10 + heads)
    model, x = _HeadGroups(heads, groups).eval(), torch.randn(batch, 5, heads * 4)
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    (rec,) = cap.records
    assert rec.exact and cap.notes == []
    with torch.no_grad():
        torch.testing.assert_close(rec.probs, model.reference(x)[0], atol=1e-6, rtol=0)


def test_layers_sharing_one_attention_module_stay_layers():
    """Two layers, each with its own projections, calling one shared attention module with all their
    heads: the same heads read again, so two layers, not one of twice the heads."""
    torch.manual_seed(0)
    model, x = _HeadGroups(2, 1, layers=2).eval(), torch.randn(2, 5, 8)
    with torch.no_grad(), capture_attention(model) as cap:
        model(x)
    assert [tuple(r.probs.shape) for r in cap.records] == [(2, 2, 5, 5), (2, 2, 5, 5)]
    with torch.no_grad():
        for rec, want in zip(cap.records, model.reference(x), strict=True):
            torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)


class _EntityAttention(nn.Module):
    """REFIL's entity attention (pymarl): the agents are the first entities and ask, every entity answers,
    an observability mask (1 = cannot see) hides entities from agents."""

    def __init__(self, agents: int = 3, d: int = 8):
        super().__init__()
        self.agents = agents
        self.in_trans = nn.Linear(7, 3 * d, bias=False)
        self.used: torch.Tensor | None = None

    def forward(self, entities, obs_mask):
        q, k, v = self.in_trans(entities).chunk(3, dim=2)
        q = q[:, : self.agents]
        logits = torch.bmm(q, k.transpose(1, 2)).masked_fill(obs_mask[:, : self.agents].bool(), float("-inf"))
        self.used = torch.softmax(logits, dim=2)
        return torch.bmm(self.used, v)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_agents_seeing_prefixes_of_the_entities_are_no_causal_decoder(batch):
    """A dead last entity hidden from all and one more hidden from agent 0: the agents see 4, 5 and 5 of 6
    entities, which a causal mask with the queries last would give. Lineage places the agents at the first
    positions, and agent 0 sees entity 3, after its own: self-attention of an encoder, not ``dec_self``."""
    torch.manual_seed(batch)
    model = _EntityAttention().eval()
    hidden = torch.zeros(batch, 6, 6)
    hidden[:, :, 5] = 1
    hidden[:, 0, 4] = 1
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 6, 7), hidden)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and not cap.notes
    assert rec.query_positions is not None and rec.query_positions[0].tolist() == [0, 1, 2]
    torch.testing.assert_close(rec.probs[:, 0], model.used, atol=0, rtol=0)
    assert rec.mask is not None and rec.mask.sum(-1)[0].tolist() == [4, 5, 5]


class _StarRelay(nn.Module):
    """Star-Transformer's relay update (fastNLP): the relay, a mean of the token states, reads itself and the
    nodes, each mixed with its neighbours by ``F.unfold`` over a window of 3 and a weighted sum over it."""

    def __init__(self, heads: int, dh: int = 4):
        super().__init__()
        d = heads * dh
        self.h, self.dh = heads, dh
        self.emb = nn.Embedding(30, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.win = nn.Parameter(torch.randn(3))
        self.used: torch.Tensor | None = None

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        relay = x.mean(1, keepdim=True)
        u = F.unfold(x.transpose(1, 2)[:, :, :, None], (3, 1), padding=(1, 0)).view(b, d, 3, n)
        nodes = (u * self.win.softmax(0)[None, None, :, None]).sum(2).transpose(1, 2)
        kv = torch.cat([relay, nodes], 1)
        q = self.q(relay).view(b, 1, self.h, self.dh).transpose(1, 2)
        k, v = (t(kv).view(b, n + 1, self.h, self.dh).transpose(1, 2) for t in (self.k, self.v))
        self.used = (q @ k.transpose(-1, -2) / math.sqrt(self.dh)).softmax(-1)
        return self.used @ v


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (1, 2), (2, 1), (2, 2), (3, 4)])
def test_a_pooled_relay_over_itself_and_the_nodes_is_no_decoding_step(batch, heads):
    """One query, a pooled vector, over its own key and more: a decoding step's shape (a new query over a
    cache), but a pooled or learned query is no decoder's new position: an encoder's self-attention. The
    window's softmax over a Parameter alone is a note (no attention: it depends on no input). The nodes' windows
    pooled by ``F.unfold`` are numbered in the order they come (with one sequence they read as reordered, and
    the map was said instead of recorded)."""
    torch.manual_seed(batch + heads)
    model = _StarRelay(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 30, (batch, 5)))
    assert [n.shape for n in cap.skipped if "learned weights alone" in n.reason] == [(3,)]
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and tuple(rec.probs.shape) == (batch, heads, 1, 6)
    torch.testing.assert_close(rec.probs, model.used, atol=0, rtol=0)
    assert not cap.notes
