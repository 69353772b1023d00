"""Capture of attention styles found by this stop's probes: documents packed into the rows of a batch and attended
one call each (a loop over ``cu_seqlens``), Medusa's and EAGLE's one buffer for every layer's keys and values, and
a second decoding step over a cache filled before the capture, queries shared by the heads, and talking heads
mixed before the softmax, and the others each test names. Every test here failed on the code before its fix, but
two bounds: a head axis truly out of place stays flagged (the rule for shared queries), and sequences packed into a
stream of one dim are not joined as one row (which this stop's join of documents first did)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_capture_probe_cm import _captured  # (the capture of a call, and what it returned)
from torch import nn

from attnscope.core.families.capture import capture_attention

VOCAB = 30


class PackedDocuments(nn.Module):
    """Documents packed into each row of the batch, flattened to (B * L, D) and attended one document at a time
    over ``cu_seqlens`` (flash-attn's varlen interface written as a loop), each within itself (causal or not),
    then joined back; ``layers`` layers written inline in this one forward. ``truths``: each layer's map of every
    row (B, H, L, L), every document's weights over its own tokens."""

    def __init__(self, heads: int, causal: bool = False, hd: int = 4, layers: int = 1):
        super().__init__()
        self.h, self.hd, self.causal = heads, hd, causal
        d = heads * hd
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.o = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))

    def forward(self, ids, pos):  # pos (B, L): each token's position in its document (0 starts one)
        b, n = ids.shape
        x = self.emb(ids).reshape(b * n, -1)
        cu = torch.cat([torch.nonzero(pos.flatten() == 0).flatten(), torch.tensor([b * n])])
        self.truths = []
        for qkv, o in zip(self.qkv, self.o, strict=True):
            q, k, v = qkv(x).view(b * n, 3, self.h, self.hd).unbind(1)
            truth = torch.zeros(b, self.h, n, n)
            outs = []
            for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
                qi, ki, vi = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (H, len, hd)
                s = qi @ ki.transpose(-1, -2) / math.sqrt(self.hd)
                if self.causal:
                    hidden = torch.ones(end - start, end - start, dtype=torch.bool).triu(1)
                    s = s.masked_fill(hidden, float("-inf"))
                p = s.softmax(-1)
                row, at = divmod(start, n)
                truth[row, :, at : at + end - start, at : at + end - start] = p
                outs.append((p @ vi).transpose(0, 1))
            self.truths.append(truth)
            x = x + o(torch.cat(outs).reshape(b * n, -1))
        return x.reshape(b, n, -1)


def _positions(lengths: list[list[int]]) -> torch.Tensor:
    return torch.tensor([[i for n in row for i in range(n)] for row in lengths])


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("heads", "lengths"),
    [
        (1, [[4, 4]]),
        (2, [[4, 4], [4, 4]]),  # every document of one length: they were joined as rows of the batch
        (3, [[4, 4], [4, 4], [4, 4]]),
        (2, [[3, 5], [5, 3]]),  # documents of other lengths: the second row's were flagged as picked rows
        (4, [[2, 3, 3], [8], [6, 2], [1, 7]]),
    ],
)
def test_documents_packed_into_rows_and_attended_one_at_a_time_are_each_rows_map(
    heads, lengths, causal, layers
):
    torch.manual_seed(0)
    model = PackedDocuments(heads, causal, layers=layers).eval()
    pos = _positions(lengths)
    cap, _ = _captured(model, torch.randint(0, VOCAB, pos.shape), pos)
    assert len(cap.records) == layers  # one record a layer (two layers inline: two runs of pieces, not one)
    assert not cap.notes
    for rec, truth in zip(cap.records, model.truths, strict=True):
        assert rec.exact, rec.flag
        assert rec.kind == ("dec_self" if causal else "enc_self")
        torch.testing.assert_close(rec.probs, truth, atol=1e-6, rtol=0)
        # the mask allows each document's own keys (its earlier ones, causal), and no other document's
        assert rec.mask is not None and torch.equal(rec.mask, truth[:, 0] > 0)
    for b in range(len(lengths)):  # what the dashboard draws for row b is row b's map, layer by layer
        trace = cap.trace(b)
        drawn = trace.dec_self if causal else trace.enc_self
        np.testing.assert_allclose(drawn, torch.stack([t[b] for t in model.truths]).numpy(), atol=1e-6)


class SharedKVBuffer(nn.Module):
    """Medusa's and EAGLE's KV cache: one tensor ``(layers * 2, B, H, max_len, hd)`` holds every layer's keys
    (``data[2 * i]``) and values (``data[2 * i + 1]``), written by ``narrow(2, cur, n).copy_(k)`` and read back
    as ``narrow(2, 0, cur + n)``."""

    def __init__(self, heads: int, layers: int = 2, hd: int = 4, max_len: int = 32):
        super().__init__()
        self.h, self.hd, self.max_len = heads, hd, max_len
        d = heads * hd
        self.emb = nn.Embedding(VOCAB, d)
        self.q = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.k = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.v = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.data: torch.Tensor | None = None
        self.cur = 0
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        x = self.emb(ids)
        if self.data is None:
            self.data = torch.zeros(2 * len(self.q), b, self.h, self.max_len, self.hd)
        end = self.cur + t
        hidden = torch.arange(end)[None, :] > torch.arange(t)[:, None] + self.cur
        for i, (fq, fk, fv) in enumerate(zip(self.q, self.k, self.v, strict=True)):
            q, k, v = (f(x).view(b, t, self.h, self.hd).transpose(1, 2) for f in (fq, fk, fv))
            self.data[2 * i].narrow(2, self.cur, t).copy_(k)
            self.data[2 * i + 1].narrow(2, self.cur, t).copy_(v)
            keys, values = self.data[2 * i].narrow(2, 0, end), self.data[2 * i + 1].narrow(2, 0, end)
            p = (
                (q @ keys.transpose(-1, -2) / math.sqrt(self.hd))
                .masked_fill(hidden, float("-inf"))
                .softmax(-1)
            )
            self.used.append(p)
            x = x + (p @ values).transpose(1, 2).reshape(b, t, -1)
        self.cur = end
        return x


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 1), (4, 4), (2, 8)])
def test_keys_and_values_kept_in_one_buffer_of_every_layer_are_recorded(batch, heads):
    torch.manual_seed(1)
    model = SharedKVBuffer(heads).eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (batch, 5)))  # the prompt, written inside the block
    assert [r.exact for r in cap.records] == [True, True], [r.flag for r in cap.records]
    assert not cap.notes
    for rec, p in zip(cap.records, model.used, strict=True):
        assert rec.kind == "dec_self"
        torch.testing.assert_close(rec.probs, p, atol=1e-6, rtol=0)
    model.used.clear()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (batch, 3)))  # drafts over the prompt written before
    assert len(cap.records) == 2 and all(r.exact for r in cap.records), cap.notes
    for rec, p in zip(cap.records, model.used, strict=True):
        torch.testing.assert_close(rec.probs, p, atol=1e-6, rtol=0)
        assert rec.key_labels == (*(f"<cache {i}>" for i in range(5)), None, None, None)


class CatCache(nn.Module):
    """Hugging Face's dynamic cache as speculative decoding uses it: keys and values joined step by step, cropped
    back to the tokens accepted."""

    def __init__(self, heads: int = 2, hd: int = 4):
        super().__init__()
        self.h, self.hd = heads, hd
        d = heads * hd
        self.emb = nn.Embedding(VOCAB, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def forward(self, ids):
        b, t = ids.shape
        x = self.emb(ids)
        q, k, v = (f(x).view(b, t, self.h, self.hd).transpose(1, 2) for f in (self.q, self.k, self.v))
        self.keys = k if self.keys is None else torch.cat([self.keys, k], 2)
        self.values = v if self.values is None else torch.cat([self.values, v], 2)
        n = self.keys.shape[2]
        s = q @ self.keys.transpose(-1, -2) / math.sqrt(self.hd)
        s = s.masked_fill(torch.arange(n)[None, :] > torch.arange(t)[:, None] + n - t, float("-inf"))
        return s.softmax(-1) @ self.values

    def crop(self, n: int) -> None:
        assert self.keys is not None and self.values is not None
        self.keys, self.values = self.keys[..., :n, :], self.values[..., :n, :]


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_cache_filled_before_the_block_keeps_its_labels_at_a_second_step(batch, heads):
    torch.manual_seed(2)
    model = CatCache(heads).eval()
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (batch, 6)))  # the prompt, outside the capture
        with capture_attention(model) as cap:
            model(torch.randint(0, VOCAB, (batch, 4)))  # the last token and three drafts
            model.crop(8)  # one draft accepted
            model(torch.randint(0, VOCAB, (batch, 4)))
    cache = tuple(f"<cache {i}>" for i in range(6))
    first, second = cap.records
    assert first.key_labels == (*cache, None, None, None, None)
    # the prompt's rows are still the cache's; the step before's accepted tokens are tokens of the sequence
    assert second.key_labels == (*cache, None, None, None, None, None, None)


class QueriesSharedByTheHeads(nn.Module):
    """Queries of one projection broadcast over the heads, each head over its own keys and values from a context
    the batch shares: ``(B, 1, L, d) @ (1, H, d, Lc)``."""

    def __init__(self, heads: int, d: int = 16):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.emb = nn.Embedding(VOCAB, d)
        self.q, self.kv, self.o = nn.Linear(d, self.hd), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def forward(self, ids, ctx):
        b, n = ids.shape
        x, c = self.emb(ids), self.emb(ctx)
        q = self.q(x).unsqueeze(1)  # (B, 1, L, hd)
        k, v = self.kv(c).view(1, ctx.shape[1], 2, self.h, self.hd).permute(2, 0, 3, 1, 4)  # (1, H, Lc, hd)
        self.used = (q @ k.transpose(-1, -2) * self.hd**-0.5).softmax(-1)  # (B, H, L, Lc)
        return self.o((self.used @ v).transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 4), (4, 4), (2, 8)])
def test_queries_shared_by_the_heads_over_each_heads_keys_are_exact(batch, heads):
    torch.manual_seed(3)
    model = QueriesSharedByTheHeads(heads).eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (batch, 5)), torch.randint(0, VOCAB, (1, 3)))
    (rec,) = cap.records
    assert rec.exact, rec.flag  # was "the queries of one head meet the keys of different heads": untrue
    assert rec.kind == "cross" and not cap.notes
    torch.testing.assert_close(rec.probs, model.used, atol=1e-6, rtol=0)


class QueriesNotTransposed(nn.Module):
    """The queries split into heads without their transpose (``(B, L, H, d) @ (B, H, d, L)``, four positions and
    four heads): each row's queries are every head of one position, against one head's keys."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        q, k, _ = self.qkv(self.emb(ids)).chunk(3, -1)
        q, k = q.view(b, n, 4, -1), k.view(b, n, 4, -1).transpose(1, 2)
        return (q @ k.transpose(-1, -2)).softmax(-1)


def test_queries_of_several_heads_against_one_heads_keys_stay_flagged():
    torch.manual_seed(4)
    cap, _ = _captured(QueriesNotTransposed().eval(), torch.randint(0, VOCAB, (2, 4)))
    (rec,) = cap.records
    assert not rec.exact and "the queries of one head meet the keys of different heads" in rec.flag


class TalkingHeadsBefore(nn.Module):
    """Talking-heads attention's mix before the softmax: ``einsum("bhij,hg->bgij", dots, w)`` (lucidrains'), or
    CaiT's ``proj_l(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)`` (timm's ``TalkingHeadAttn``)."""

    def __init__(self, heads: int, how: str, hd: int = 4):
        super().__init__()
        self.h, self.how = heads, how
        d = heads * hd
        self.emb, self.qkv, self.o = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mix = nn.Parameter(torch.randn(heads, heads))
        self.proj_l = nn.Linear(heads, heads)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
        if self.how == "einsum":
            dots = torch.einsum("bhij,hg->bgij", dots, self.mix)
        else:
            dots = self.proj_l(dots.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        self.used = dots.softmax(-1)
        return self.o((self.used @ v).transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize("how", ["einsum", "cait"])
@pytest.mark.parametrize(
    ("batch", "heads", "length"), [(1, 1, 5), (2, 2, 5), (3, 4, 5), (4, 4, 4), (2, 8, 8)]
)
def test_heads_mixed_before_the_softmax_leave_an_exact_record(how, batch, heads, length):
    torch.manual_seed(5)
    model = TalkingHeadsBefore(heads, how).eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (batch, length)))  # (as many heads as keys, too)
    (rec,) = cap.records
    assert rec.exact and not cap.notes, rec.flag  # was "... read from the shape (a guess)", or not recorded
    assert rec.kind == "enc_self"
    torch.testing.assert_close(rec.probs, model.used, atol=1e-6, rtol=0)


class MixtureOfAttentionHeads(nn.Module):
    """MoA (Zhang et al.): a router picks k of E query experts per token; the tokens are sorted by expert, each
    expert projects its own (``c @ wq[e]``), and the queries are put back in the tokens' order by ``index_add``
    into zeros, ``(B, T, k, d)``: k query heads over keys and values the experts share, causal."""

    def __init__(self, k: int, experts: int, d: int = 24, hd: int = 8):
        super().__init__()
        self.k, self.e, self.hd = k, experts, hd
        self.emb, self.router = nn.Embedding(VOCAB, d), nn.Linear(d, experts, bias=False)
        self.wq = nn.Parameter(torch.randn(experts, d, hd) * 0.1)
        self.k_proj, self.v_proj = nn.Linear(d, hd, bias=False), nn.Linear(d, hd, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        b, t, d = x.shape
        _, top = self.router(x).softmax(-1).topk(self.k, -1)
        flat = top.reshape(-1)
        _, order = flat.sort(0)
        rows = x.reshape(-1, d)[order.div(self.k, rounding_mode="trunc")]
        per_expert = rows.split(torch.bincount(flat, minlength=self.e).tolist())
        outs = [c @ self.wq[e] for e, c in enumerate(per_expert)]
        q = (
            torch.zeros(b * t * self.k, self.hd)
            .index_add(0, order, torch.cat(outs))
            .view(b, t, self.k, self.hd)
        )
        s = torch.einsum("bihd,bjd->bhij", q * self.hd**-0.5, self.k_proj(x))
        self.used = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return torch.einsum("bhij,bjd->bihd", self.used, self.v_proj(x))


@pytest.mark.parametrize("batch", [1, 3, 4])
def test_queries_put_back_in_order_by_index_add_are_placed_by_that_index(batch):
    torch.manual_seed(11)  # (experts picked so that the order put back is not the order made)
    model = MixtureOfAttentionHeads(1, 3).eval()  # one head: its rows are the tokens, put back in order
    cap, _ = _captured(model, torch.randint(0, VOCAB, (batch, 6)))
    (rec,) = cap.records
    assert rec.exact and not cap.notes, rec.flag
    assert rec.kind == "dec_self"  # was "cross": the queries' lineage kept the experts' order
    torch.testing.assert_close(rec.probs, model.used, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("batch", "k"), [(1, 2), (2, 2), (4, 2), (3, 3)])
def test_heads_lineage_cannot_tell_apart_are_flagged_not_taken_for_sequences(batch, k):
    torch.manual_seed(6)
    model = MixtureOfAttentionHeads(k, k + 2).eval()  # every head's queries numbered alike by lineage
    cap, _ = _captured(model, torch.randint(0, VOCAB, (batch, 6)))
    (rec,) = cap.records  # was (batch * k, 1, 6, 6), exact: record row 1 was sequence 0's second head
    assert not rec.exact and "holds the same queries and keys at every index" in rec.flag
    assert tuple(rec.probs.shape) == (batch, k, 6, 6)


class RetroEncoder(nn.Module):
    """RETRO's neighbours: token ids (B, chunks, neighbours, n) embedded as they are and encoded folded into the
    batch, ``(B * chunks * neighbours, n)``, beside the sequence's own causal self-attention."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(VOCAB, d)
        self.dec, self.enc = nn.Linear(d, 2 * d), nn.Linear(d, 2 * d)

    def _attend(self, proj: nn.Linear, x: torch.Tensor, causal: bool) -> torch.Tensor:
        b, n, d = x.shape
        q, k = (t.view(b, n, self.h, -1).transpose(1, 2) for t in proj(x).chunk(2, -1))
        s = q @ k.transpose(-1, -2)
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(-1)

    def forward(self, seq, neighbours):
        x = self.emb(seq)
        self._attend(self.dec, x, causal=True)
        b, k, r, n = neighbours.shape
        e = self.emb(neighbours).reshape(b * k * r, n, -1)
        self.neighbour_maps = self._attend(self.enc, e, causal=False)
        return x


def test_the_trace_of_neighbours_folded_into_the_batch_says_whose_row_it_draws():
    torch.manual_seed(7)
    model = RetroEncoder().eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (3, 8)), torch.randint(0, VOCAB, (3, 2, 2, 4)))
    assert [r.kind for r in cap.records] == ["dec_self", "enc_self"]
    for i in range(3):
        trace = cap.trace(i)
        drawn = trace.enc_self[-1]
        row = next(j for j in range(12) if np.allclose(drawn, model.neighbour_maps[j].numpy(), atol=1e-6))
        if row // 4 != i:  # a neighbour of another sequence (4 a sequence) drawn: the trace must say so
            notes = trace.meta.get("capture_notes") or []
            assert any(
                n.startswith("enc_self") and f"reads positions of sequence {row // 4}" in n for n in notes
            )


class BlockRecurrent(nn.Module):
    """The Block-Recurrent Transformer's layer over blocks of 4 tokens with 3 learned state vectors: the tokens'
    causal self-attention and their cross-attention to the states; the states' self-attention and their
    cross-attention to the tokens."""

    def __init__(self, d: int = 16, heads: int = 2, states: int = 3):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(VOCAB, d)
        self.init_state = nn.Parameter(torch.randn(states, d))
        self.x_qkv, self.s_qkv = nn.Linear(d, 3 * d), nn.Linear(d, 3 * d)
        self.x_q2, self.s_q2 = nn.Linear(d, d), nn.Linear(d, d)

    def _attend(self, q, k, v, causal=False):
        b, n, d = q.shape
        q, k, v = (t.reshape(b, t.shape[1], self.h, -1).transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-1, -2) * (d // self.h) ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -1e9)
        return (s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)

    def forward(self, ids):
        x = self.emb(ids)
        state = self.init_state.expand(ids.shape[0], -1, -1)
        outs = []
        for block in x.split(4, 1):
            xq, xk, xv = self.x_qkv(block).chunk(3, -1)
            sq, sk, sv = self.s_qkv(state).chunk(3, -1)
            block = block + self._attend(xq, xk, xv, True) + self._attend(self.x_q2(block), sk, sv)
            state = torch.tanh(self._attend(sq, sk, sv) + self._attend(self.s_q2(state), xk, xv))
            outs.append(block)
        return torch.cat(outs, 1)


def test_tokens_and_learned_states_attending_to_each_other_are_drawn():
    torch.manual_seed(8)
    model = BlockRecurrent().eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (2, 8)))
    assert all(r.exact for r in cap.records)
    trace = cap.trace(
        1
    )  # raised: "two inputs of as many positions that attend to each other" (3 states, 4 tokens)
    assert "cross" in trace.kinds and "dec_self" in trace.kinds


class TriangleOverOuterSum(nn.Module):
    """AlphaFold's triangle attention (around the starting node) over a pair representation made as an outer sum
    of residue embeddings, ``z[b, i, j] = left[b, i] + right[b, j]``: every row i of the pairs holds the same
    positions by lineage (right's j), so nothing says which row a slice is."""

    def __init__(self, heads: int = 2, c: int = 8):
        super().__init__()
        self.h = heads
        self.left, self.right = nn.Embedding(VOCAB, c), nn.Embedding(VOCAB, c)
        self.q, self.k = nn.Linear(c, c), nn.Linear(c, c)

    def forward(self, t):
        b, n = t.shape
        z = self.left(t)[:, :, None, :] + self.right(t)[:, None, :, :]  # (B, L, L, C)
        q = self.q(z).view(b, n, n, self.h, -1).transpose(-2, -3)  # (B, I, H, J, d)
        k = self.k(z).view(b, n, n, self.h, -1).transpose(-2, -3)
        return (q @ k.transpose(-1, -2)).softmax(-1)


def test_rows_of_a_pair_representation_lineage_cannot_tell_apart_are_flagged():
    torch.manual_seed(9)
    cap, _ = _captured(TriangleOverOuterSum().eval(), torch.randint(0, VOCAB, (2, 4)))
    (rec,) = cap.records  # was exact, every row i of a sequence over the same positions, none saying which
    assert not rec.exact and "outer sum" in rec.flag


class ChannelAttention(nn.Module):
    """DANet's channel attention (``CAM_Module``) after a conv stem: a (B, C, C) softmax over the channels of a map,
    shifted as DANet shifts it (``max(energy) - energy``)."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)

    def forward(self, x):
        f = self.stem(x)
        b, c, h, w = f.shape
        query, key = f.view(b, c, -1), f.view(b, c, -1).permute(0, 2, 1)
        energy = torch.bmm(query, key)
        attention = (torch.max(energy, -1, keepdim=True)[0].expand_as(energy) - energy).softmax(-1)
        return torch.bmm(attention, f.view(b, c, -1)).view(b, c, h, w)


def test_a_map_over_channels_is_flagged_as_one():
    torch.manual_seed(10)
    cap, _ = _captured(ChannelAttention().eval(), torch.randn(2, 3, 4, 4))  # 16 channels, 16 positions
    (rec,) = cap.records  # was flagged "lineage was lost ...", and drawn over the positions without a word
    assert not rec.exact and "a map over channels" in rec.flag
    assert any("a map over channels" in n for n in cap.trace(0).meta["capture_notes"])


class FlaxPort(nn.Module):
    """Flax's ``DenseGeneral`` ported as ``einsum("...d,dhk->...hk", x, kernel)`` (an ellipsis for the batch and the
    positions), and its attention einsums with the heads kept last."""

    def __init__(self, heads: int, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.q, self.k = (nn.Parameter(torch.randn(d, heads, d // heads) * 0.1) for _ in range(2))

    def forward(self, ids):
        x = self.emb(ids)
        q, k = torch.einsum("...d,dhk->...hk", x, self.q), torch.einsum("...d,dhk->...hk", x, self.k)
        self.used = torch.einsum("...qhd,...khd->...hqk", q, k).softmax(-1)
        return self.used


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_a_projection_written_with_an_ellipsis_keeps_lineage(batch, heads):
    torch.manual_seed(11)
    model = FlaxPort(heads).eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert rec.exact and not cap.notes, rec.flag  # was "lineage was lost ... (a guess)" for every Flax port
    torch.testing.assert_close(rec.probs, model.used, atol=1e-6, rtol=0)


class CastAfterValues(nn.Module):
    """trax's ``DotProductAttention`` ported: the heads' output cast to the dtype it already has (``.to(float32)``)
    before the output projection."""

    def __init__(self, heads: int = 2, d: int = 16):
        super().__init__()
        self.h = heads
        self.emb, self.qkv, self.o = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
        out = ((q @ k.transpose(-1, -2)).softmax(-1) @ v).to(torch.float32)
        return self.o(out.transpose(1, 2).reshape(b, n, -1))


def test_a_cast_that_changes_nothing_keeps_what_attention_moves():
    torch.manual_seed(12)
    cap, _ = _captured(CastAfterValues().eval(), torch.randint(0, VOCAB, (2, 5)))
    (rec,) = cap.records
    assert (
        rec.values is not None and rec.values.w_o is not None
    )  # were dropped, with a note of an op "no move"
    assert not [n for n in cap.skipped if "no move" in n.reason]


class ZeroAttention(nn.Module):
    """fairseq's ``add_zero_attn``: a zero key and value joined to every (batch x head) row after the fold,
    ``torch.cat([k, k.new_zeros(bsz * heads, 1, d)], dim=1)``, in its (T, B, C) layout."""

    def __init__(self, heads: int, c: int = 16):
        super().__init__()
        self.h, self.hd = heads, c // heads
        self.q, self.k = nn.Linear(c, c), nn.Linear(c, c)

    def forward(self, query, key):
        t, b, c = query.shape
        q = (self.q(query) * self.hd**-0.5).view(t, b * self.h, self.hd).transpose(0, 1)
        k = self.k(key).view(-1, b * self.h, self.hd).transpose(0, 1)
        k = torch.cat([k, k.new_zeros((k.size(0), 1) + k.size()[2:])], dim=1)
        self.used = torch.bmm(q, k.transpose(1, 2)).softmax(-1).view(b, self.h, t, -1)
        return self.used


@pytest.mark.parametrize(("batch", "heads"), [(3, 1), (3, 2), (2, 4), (4, 4)])
def test_a_zero_key_joined_after_the_fold_is_labelled_not_a_token(batch, heads):
    torch.manual_seed(13)
    model = ZeroAttention(heads).eval()
    cap, _ = _captured(model, torch.randn(5, batch, 16), torch.randn(7, batch, 16))
    (rec,) = (
        cap.records
    )  # one head: exact with the zero key drawn as an eighth token; more: "heads see different keys"
    assert rec.exact and not cap.notes, rec.flag
    assert rec.key_labels == (None,) * 7 + ("<zeros 0>",)
    torch.testing.assert_close(rec.probs, model.used, atol=1e-6, rtol=0)


class OffByOne(nn.Module):
    """nanoGPT's causal buffer sliced a row too far (``bias[:, :, 1:T + 1, :T]``), or the same band handed to SDPA:
    every query sees the key after its own."""

    def __init__(self, heads: int, sdpa: bool, d: int = 16, block: int = 16):
        super().__init__()
        self.h, self.sdpa = heads, sdpa
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
        self.register_buffer("bias", torch.ones(block, block).tril().view(1, 1, block, block))

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (x.view(b, t, self.h, -1).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias[0, 0, 1 : t + 1, :t].bool())
        att = (q @ k.transpose(-1, -2)).masked_fill(self.bias[:, :, 1 : t + 1, :t] == 0, float("-inf"))
        return att.softmax(-1) @ v


@pytest.mark.parametrize("sdpa", [False, True])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_causal_mask_off_by_one_is_said_and_kept_as_it_ran(batch, heads, sdpa):
    torch.manual_seed(14)
    cap, _ = _captured(OffByOne(heads, sdpa).eval(), torch.randint(0, VOCAB, (batch, 6)))
    (rec,) = cap.records  # was enc_self with no word: a bidirectional map with an odd band
    assert rec.kind == "dec_self" and rec.exact
    assert [n for n in cap.notes if "a causal mask off by one" in n]
    assert rec.mask is not None and torch.equal(rec.mask[0], torch.ones(6, 6, dtype=torch.bool).tril(1))


class PackedStream(nn.Module):
    """MoBA's naive varlen reference: the batch packed into one stream by its padding mask (``emb(ids[valid])``),
    then one causal softmax per sequence between ``cu_seqlens``."""

    def __init__(self, heads: int = 2, d: int = 8):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, ids, lens):
        valid = torch.arange(ids.shape[1])[None] < lens[:, None]
        x = self.emb(ids[valid])
        cu = F.pad(torch.cumsum(lens, 0), (1, 0))
        q, k, _ = self.qkv(x).view(-1, 3, self.h, self.hd).unbind(1)
        self.used = []
        for a, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            s = torch.einsum("xhd,yhd->hxy", q[a:e], k[a:e])
            s = s.masked_fill(~torch.ones(e - a, e - a, dtype=torch.bool).tril(), float("-inf"))
            self.used.append(s.softmax(-1))
        return x


def test_sequences_packed_into_one_stream_are_not_drawn_as_one_sequence():
    torch.manual_seed(15)
    model = PackedStream().eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (2, 7)), torch.tensor([7, 7]))
    (rec,) = cap.records  # every sequence whole: each call one of the caller's sequences, in order
    assert rec.exact and tuple(rec.probs.shape) == (2, 2, 7, 7)
    torch.testing.assert_close(rec.probs, torch.stack(model.used), atol=1e-6, rtol=0)
    cap, _ = _captured(model, torch.randint(0, VOCAB, (2, 7)), torch.tensor([7, 5]))
    # ids of one dim say nothing of the caller's rows: the calls are not joined into one row of 12 positions
    assert all(tuple(r.probs.shape[-2:]) != (12, 12) for r in cap.records)


class BlockGate(nn.Module):
    """MoBA's gate: each query's top-2 key blocks picked by its scores over the blocks' mean keys (its own block
    always, no later one), ``gate[need] = 0; gate[~need] = -inf``, expanded to the keys and added to the scores:
    each head its own mask."""

    def __init__(self, heads: int = 2, d: int = 8, block: int = 2):
        super().__init__()
        self.h, self.hd, self.c = heads, d // heads, block
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        x = self.emb(ids[0])
        n, blocks = x.shape[0], x.shape[0] // self.c
        q, k, _ = self.qkv(x).view(n, 3, self.h, self.hd).unbind(1)
        gate = torch.einsum("shd,nhd->hsn", q, k.view(blocks, self.c, self.h, self.hd).mean(1))
        for i in range(blocks):
            gate[:, : (i + 1) * self.c, i] = float("-inf")
            gate[:, i * self.c : (i + 1) * self.c, i] = float("inf")
        need = torch.zeros_like(gate, dtype=torch.bool).scatter_(-1, gate.topk(2, -1).indices, True)
        gate[need] = 0
        gate[~need] = float("-inf")
        gate = gate.repeat_interleave(self.c, -1)
        gate.masked_fill_(~torch.ones_like(gate, dtype=torch.bool).tril(), float("-inf"))
        self.allowed = gate > float("-inf")  # (H, S, S)
        return (torch.einsum("xhd,yhd->hxy", q, k) + gate).softmax(-1)


def test_a_mask_made_from_scores_per_head_is_every_heads_own():
    torch.manual_seed(1)
    model = BlockGate().eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (1, 8)))
    (rec,) = cap.records
    assert not torch.equal(model.allowed[0], model.allowed[1])  # (the heads picked other blocks)
    # was the union of the heads' masks, said to be the same for every head
    assert rec.head_masks_differ and torch.equal(rec.mask[0], model.allowed.all(0))


class NodeUpdate(nn.Module):
    """A graph layer's node update, ``x.index_add(0, dst, W x[src])`` (each node its own state plus one neighbour's
    message on a ring), then attention over the nodes: a sum into rows with positions of their own keeps them."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb, self.w, self.qk = nn.Embedding(VOCAB, d), nn.Linear(d, d), nn.Linear(d, 2 * d)

    def forward(self, ids):
        x = self.emb(ids)[0]
        n = x.shape[0]
        src, dst = torch.arange(1, n + 1) % n, torch.arange(n)
        q, k = self.qk(x.index_add(0, dst, self.w(x[src]))).chunk(2, -1)
        self.used = (q @ k.T).softmax(-1)
        return self.used


def test_a_sum_by_index_into_rows_with_positions_keeps_them():
    torch.manual_seed(16)
    model = NodeUpdate().eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (1, 4)))
    (rec,) = cap.records  # (this stop's first index_add rule took the messages' positions: nothing recorded)
    assert rec.exact and rec.kind == "enc_self" and not cap.notes
    torch.testing.assert_close(rec.probs[0, 0], model.used, atol=1e-6, rtol=0)
