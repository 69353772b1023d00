"""Capture of attention styles found by this stop's probes: paged KV caches read by a block table at decode
time, and the other cases each test names. Every test here failed on the code before its fix."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from attnscope.core.families.capture import Captured, capture_attention

VOCAB = 20


def _captured(model: nn.Module, *args, **kwargs) -> tuple[Captured, Any]:
    """The capture of ``model(*args, **kwargs)`` (no gradients), and what the call returned."""
    with torch.no_grad(), capture_attention(model) as cap:
        out = model(*args, **kwargs)
    return cap, out


def _moves_exactly(rec, v: torch.Tensor, w_o: torch.Tensor, out: torch.Tensor) -> None:
    """``rec``'s value norms are ||v_h,j W_O,h|| (``v`` (B, H, k, dv), ``w_o`` (H, D, dv)), and its weights times
    f_h(x_j), summed over heads and keys, plus b_O, rebuild the block's output ``out``."""
    hv = rec.values
    torch.testing.assert_close(hv.norms(), torch.einsum("bhke,hde->bhkd", v, w_o).norm(dim=-1))
    torch.testing.assert_close(torch.einsum("bhqk,bhkd->bqd", rec.probs, hv.vectors()) + hv.b_o, out)


class PagedDecode(nn.Module):
    """vLLM's decode step: this step's keys written into the pool by a flat slot mapping through a view of the
    cache (``(blocks, block_size, heads, d)`` viewed ``(-1, heads, d)``), or by block and offset into the pool
    itself, then every request's blocks gathered by its block table and masked past its context length."""

    def __init__(self, heads: int, by_block: bool = False, hd: int = 4, block: int = 4, blocks: int = 8):
        super().__init__()
        self.h, self.hd, self.block, self.by_block = heads, hd, block, by_block
        d = heads * hd
        self.emb = nn.Embedding(VOCAB, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.register_buffer("kc", torch.zeros(blocks, block, heads, hd))
        self.register_buffer("vc", torch.zeros(blocks, block, heads, hd))
        self.seen: list[torch.Tensor] = []

    def forward(self, ids, slots, table, lengths):  # ids (B, T); slots (B, T) flat slot of each token
        x = self.emb(ids)
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k, v = self.k(x).reshape(-1, self.h, self.hd), self.v(x).reshape(-1, self.h, self.hd)
        if self.by_block:
            flat = slots.flatten()
            self.kc[flat // self.block, flat % self.block] = k
            self.vc[flat // self.block, flat % self.block] = v
        else:
            self.kc.view(-1, self.h, self.hd)[slots.flatten()] = k
            self.vc.view(-1, self.h, self.hd)[slots.flatten()] = v
        n = table.shape[1] * self.block
        keys = self.kc[table].reshape(b, n, self.h, self.hd).transpose(1, 2)
        values = self.vc[table].reshape(b, n, self.h, self.hd).transpose(1, 2)
        allowed = torch.arange(n)[None] < lengths[:, None]
        w = ((q @ keys.transpose(-1, -2)) * self.hd**-0.5).masked_fill(~allowed[:, None, None], float("-inf"))
        w = w.softmax(-1)
        self.seen.append(w)
        return w @ values


def _paged(heads: int, batch: int, by_block: bool):
    torch.manual_seed(heads * 10 + batch)
    model = PagedDecode(heads, by_block).eval()
    table = torch.randperm(8)[: 2 * batch].view(batch, 2)  # two blocks of the pool per request
    pos = torch.arange(5)[None].expand(batch, 5)
    slots = table.gather(1, pos // 4) * 4 + pos % 4
    with torch.no_grad():  # the prompt's five tokens, written by an earlier call
        model(torch.randint(0, VOCAB, (batch, 5)), slots, table, torch.full((batch,), 5))
        model.seen.clear()
        with capture_attention(model) as cap:  # the decode step: one token per request, at slot 5
            model(torch.randint(0, VOCAB, (batch, 1)), table[:, 1:2] * 4 + 1, table, torch.full((batch,), 6))
    return model, cap


@pytest.mark.parametrize("by_block", [False, True])
@pytest.mark.parametrize(("heads", "batch"), [(1, 1), (1, 2), (2, 2), (2, 3), (3, 1), (4, 4)])
def test_a_paged_cache_decode_step_reads_the_earlier_slots_as_the_cache(heads, batch, by_block):
    """Each head's keys were the pool's cells one by one: with more than one head the record was flagged
    "the heads of one sequence see different keys"; with one, the slots an earlier call filled were labelled
    ``<ctx i>`` (another tensor handed in) rather than ``<cache i>``."""
    model, cap = _paged(heads, batch, by_block)
    (rec,) = cap.records
    assert rec.exact and not cap.notes, (rec.flag, cap.notes)
    assert torch.equal(rec.probs, model.seen[0]) and rec.kind == "dec_self"
    want = (*(f"<cache {i}>" for i in range(5)), None, "<padding 0>", "<padding 1>")
    assert rec.key_labels == want
    assert rec.mask is not None and rec.mask[..., 6:].logical_not().all() and rec.mask[..., :6].all()


class RowsWritten(nn.Module):
    """Whole sequences written into a buffer by an index of rows (``buf[order] = x``), then self-attention
    over the buffer: each row holds many positions, so the rows are sequences, not slots of a pool."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.register_buffer("buf", torch.zeros(3, 5, 8))
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        self.buf[torch.tensor([2, 0, 1])] = self.emb(ids)
        x = self.buf
        w = (x @ x.transpose(-1, -2)).softmax(-1)
        self.seen.append(w)
        return w @ x


def test_whole_sequences_written_by_a_row_index_keep_their_positions():
    torch.manual_seed(0)
    model = RowsWritten().eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (3, 5)))
    (rec,) = cap.records
    assert torch.equal(rec.probs[:, 0], model.seen[0]) and rec.kind == "enc_self"
    # (each record row the caller's sequence the index put there: said, and no slot of a cache)
    assert not rec.exact and "another order" in rec.flag and rec.key_labels is None, (
        rec.flag,
        rec.key_labels,
    )
    assert rec.key_positions.tolist() == [list(range(5 * s, 5 * s + 5)) for s in (1, 2, 0)]


class Neighbours(nn.Module):
    """Attention over each node's neighbours (a ring, i-1, i and i+1, as kNN graphs of point clouds and
    molecules gather them): keys gathered per query by ``gather``, ``index_select`` or a flat index."""

    def __init__(self, heads: int, how: str, d: int = 16):
        super().__init__()
        self.h, self.how = heads, how
        self.q, self.k = nn.Linear(d, heads * 4), nn.Linear(d, heads * 4)
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        b, n, _ = x.shape
        nbr = (torch.arange(n)[:, None] + torch.arange(-1, 2)[None]) % n  # (n, 3)
        q, k = self.q(x).view(b, n, self.h, 4), self.k(x).view(b, n, self.h, 4)
        if self.how == "gather":
            ix = nbr.reshape(1, n * 3, 1, 1).expand(b, n * 3, self.h, 4)
            kn = torch.gather(k, 1, ix).view(b, n, 3, self.h, 4)
        elif self.how == "index_select":
            kn = k.index_select(1, nbr.flatten()).view(b, n, 3, self.h, 4)
        else:  # a flat index over the batch's nodes
            flat = (nbr[None] + n * torch.arange(b)[:, None, None]).flatten()
            kn = k.reshape(b * n, self.h, 4)[flat].view(b, n, 3, self.h, 4)
        w = (q.permute(0, 2, 1, 3).unsqueeze(-2) @ kn.permute(0, 3, 1, 4, 2)).squeeze(-2).softmax(-1)
        self.seen.append(w)
        return w


@pytest.mark.parametrize("how", ["gather", "index_select", "flat"])
@pytest.mark.parametrize(("heads", "batch"), [(1, 1), (2, 2), (3, 2)])
def test_keys_gathered_per_query_are_not_drawn_as_the_sequence_tokens(heads, batch, how):
    """Each query's neighbours were drawn as the first tokens of its sequence: the trace of a ring over 6
    nodes showed 3 tokens, #0..#2, the weights on nodes 5, 0 and 1 under 0, 1 and 2. The records keep every
    key's position; the trace leaves them out and says why."""
    torch.manual_seed(heads + batch)
    model = Neighbours(heads, how).eval()
    cap, _ = _captured(model, torch.randn(batch, 6, 16))
    (rec,) = cap.records
    kp = rec.key_positions.view(batch, 6, 3) % 6  # (each record row: one node's neighbours)
    assert kp[0].tolist() == [[(i - 1) % 6, i, (i + 1) % 6] for i in range(6)]
    # (B, H, n, 3): each node's neighbours, a record row per node
    assert torch.equal(rec.probs.view(batch, 6, heads, 3).permute(0, 2, 1, 3), model.seen[0])
    with pytest.raises(ValueError, match="some of its sequence's positions, other than its queries"):
        cap.trace(0)


class Cutoff(nn.Module):
    """TorchMD-Net's equivariant transformer: scores summed by hand from a broadcast product, the softmax
    times a cosine cutoff of the atoms' distances (``(B, 1, N, N)``, over the heads), then the values."""

    def __init__(self, heads: int, d: int = 16):
        super().__init__()
        self.h = heads
        self.q, self.k, self.v = nn.Linear(d, heads * 4), nn.Linear(d, heads * 4), nn.Linear(d, heads * 4)
        self.seen: list[torch.Tensor] = []

    def forward(self, x, pos):
        b, n, _ = x.shape
        dist = torch.cdist(pos, pos)
        cut = 0.5 * (torch.cos(dist * torch.pi / 2.0) + 1.0) * (dist < 2.0).float()
        q, k, v = (lin(x).view(b, n, self.h, 4).transpose(1, 2) for lin in (self.q, self.k, self.v))
        w = (q[:, :, :, None] * k[:, :, None]).sum(-1).softmax(-1) * cut[:, None]
        self.seen.append(w)
        return (w @ v).transpose(1, 2).reshape(b, n, -1)


@pytest.mark.parametrize(("heads", "batch"), [(1, 1), (2, 1), (2, 2), (3, 3), (4, 2)])
def test_weights_times_a_cutoff_over_the_heads_are_recorded_as_multiplied(heads, batch):
    """With more than one head the cutoff broadcasts over them, and the product with the values was not
    followed: no record, and an info note said the weights weighted nothing."""
    torch.manual_seed(heads * batch)
    model = Cutoff(heads).eval()
    cap, _ = _captured(model, torch.randn(batch, 6, 16), torch.randn(batch, 6, 3))
    (rec,) = cap.records
    assert rec.exact and not cap.notes and not cap.skipped, (rec.flag, cap.notes, cap.skipped)
    assert rec.kind == "enc_self" and torch.equal(rec.probs, model.seen[0])


class SinkRescaled(nn.Module):
    """An attention sink written as a rescale: ``softmax(s) * sigmoid(logsumexp(s) - sink)`` per head, the
    weights the values are multiplied with (what the sink's logit joined to the scores gives)."""

    def __init__(self, heads: int, hd: int = 4):
        super().__init__()
        self.h, self.hd = heads, hd
        self.emb = nn.Embedding(VOCAB, heads * hd)
        self.qkv = nn.Linear(heads * hd, 3 * heads * hd)
        self.sink = nn.Parameter(torch.randn(heads))
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, t, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        s = (q @ k.transpose(-1, -2) * self.hd**-0.5).masked_fill(~causal, float("-inf"))
        lse = torch.logsumexp(s, -1, keepdim=True)
        w = s.softmax(-1) * torch.sigmoid(lse - self.sink.view(1, self.h, 1, 1))
        self.seen.append(w)
        return w @ v


@pytest.mark.parametrize(("heads", "batch"), [(1, 1), (2, 2), (3, 2), (2, 4)])
def test_a_sink_written_as_a_rescale_by_the_logsumexp_raises_no_note(heads, batch):
    """The logsumexp of the masked scores kept their (q, k) mask: subtracting the sink from it raised inside
    capture, and the notes said the attention was not recorded, while it was (and right)."""
    torch.manual_seed(heads + 2 * batch)
    model = SinkRescaled(heads).eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert rec.exact and not cap.notes, (rec.flag, cap.notes)
    assert rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])
    assert torch.equal(
        rec.mask.expand(batch, 5, 5), torch.ones(5, 5, dtype=torch.bool).tril().expand(batch, 5, 5)
    )


class EdgeScored(nn.Module):
    """EGNN's attention: an edge MLP over every pair ``[h_i, h_j, |x_i - x_j|^2]`` (node features handed in,
    tiled against each other), a projection of it to one score, softmax over the neighbours j."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.edge = nn.Sequential(nn.Linear(2 * d + 1, 16), nn.SiLU(), nn.Linear(16, 16), nn.SiLU())
        self.att, self.node = nn.Linear(16, 1), nn.Linear(32, d)

    def forward(self, h, pos):
        b, n, d = h.shape
        d2 = ((pos[:, :, None] - pos[:, None]) ** 2).sum(-1, keepdim=True)
        m = self.edge(torch.cat([h[:, :, None].expand(b, n, n, d), h[:, None].expand(b, n, n, d), d2], -1))
        a = self.att(m).squeeze(-1).softmax(-1)  # (B, N, N): node i over nodes j
        return self.node(torch.cat([h, (a[..., None] * m).sum(2)], -1))


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_weights_over_pairs_an_edge_mlp_scored_are_flagged(batch):
    """Each (graph, node) row was recorded exact, as cross-attention from an unknown query, so record row 1
    (node 1 of graph 0) was drawn as sequence 1 with no word said."""
    torch.manual_seed(batch)
    model = EdgeScored().eval()
    cap, _ = _captured(model, torch.randn(batch, 5, 16), torch.randn(batch, 5, 3))
    (rec,) = cap.records
    assert rec.probs.shape == (batch * 5, 1, 1, 5)
    assert not rec.exact and "lines of a tensor handed in" in rec.flag and cap.notes, (rec.flag, cap.notes)


class EspnetAttention(nn.Module):
    """ESPnet's MultiHeadedAttention: a bool mask (True = may attend) filled with finfo.min, and the weights
    zeroed there again after the softmax."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.seen: list[torch.Tensor] = []

    def forward(self, query, key, mask):
        n = query.size(0)
        q, k, v = (lin(x).view(n, -1, self.h, self.hd).transpose(1, 2)
                   for lin, x in ((self.q, query), (self.k, key), (self.v, key)))  # fmt: skip
        hidden = mask.unsqueeze(1).eq(0)
        s = (q @ k.transpose(-2, -1)) * self.hd**-0.5
        w = s.masked_fill(hidden, torch.finfo(s.dtype).min).softmax(-1).masked_fill(hidden, 0.0)
        self.seen.append(w)
        return self.o((w @ v).transpose(1, 2).reshape(n, -1, self.h * self.hd))


class BeamSearch(nn.Module):
    """ESPnet's batch beam search: every beam starts from one start token, the encoder's output repeated over
    the beams, and each step re-picks the beams (their tokens and the layer's cache) by ``index_select`` on
    the top-k of their scores."""

    def __init__(self, beams: int = 3, d: int = 16):
        super().__init__()
        self.k, self.d = beams, d
        self.emb, self.out = nn.Embedding(VOCAB, d), nn.Linear(d, VOCAB)
        self.self_attn, self.src_attn, self.top_attn = (
            EspnetAttention(d),
            EspnetAttention(d),
            EspnetAttention(d),
        )

    def forward(self, mem, mem_mask):  # (B, T, d), (B, 1, T)
        b, t, _ = mem.shape
        mem = mem.unsqueeze(1).repeat(1, self.k, 1, 1).view(b * self.k, t, self.d)
        mem_mask = mem_mask.unsqueeze(1).repeat(1, self.k, 1, 1).view(b * self.k, 1, t)
        ys = torch.full((b * self.k, 1), 1, dtype=torch.long)
        score = torch.zeros(b, self.k)
        score[:, 1:] = -1e9
        cache = None
        for _ in range(3):
            n = ys.size(1)
            h = self.emb(ys)
            x = h[:, -1:] + self.self_attn(h[:, -1:], h, torch.ones(b * self.k, 1, n, dtype=torch.bool))
            x = x + self.src_attn(x, mem, mem_mask)
            x = x if cache is None else torch.cat([cache, x], 1)  # the layer's cache: its earlier steps
            y = x[:, -1:] + self.top_attn(x[:, -1:], x, torch.ones(b * self.k, 1, n, dtype=torch.bool))
            top, idx = (score.view(-1, 1) + self.out(y[:, -1]).log_softmax(-1)).view(b, -1).topk(self.k, -1)
            prev = ((idx // VOCAB) + torch.arange(b)[:, None] * self.k).view(-1)
            ys = torch.cat([ys.index_select(0, prev), (idx % VOCAB).view(-1, 1)], 1)
            cache, score = x.index_select(0, prev), top
        return ys


@pytest.mark.parametrize("seed", [0, 3, 4])  # (top-k picks under which the flag showed)
@pytest.mark.parametrize("batch", [1, 2])
def test_beams_from_one_start_token_re_picked_by_a_top_k_are_whole_hypotheses(batch, seed):
    """With one sequence, the beams' cache rows were copies of one start token: re-picking them was read as
    picking some of a sequence's positions by the data, and the maps were flagged (not with two)."""
    torch.manual_seed(seed)
    model = BeamSearch().eval()
    mask = torch.ones(batch, 1, 7, dtype=torch.bool)
    mask[-1, :, 5:] = False
    cap, _ = _captured(model, torch.randn(batch, 7, 16), mask)
    seen = [w for step in zip(model.self_attn.seen, model.src_attn.seen, model.top_attn.seen, strict=True)
            for w in step]  # fmt: skip
    assert len(cap.records) == len(seen) == 9
    for rec, w in zip(cap.records, seen, strict=True):
        assert rec.exact, (rec.name, rec.flag)
        assert torch.equal(rec.probs, w)
    assert not any("picked by indices" in n for n in cap.notes), cap.notes


class CompressedBranch(nn.Module):
    """NSA's compressed branch in a causal decoder: the queries over the keys mean-pooled into blocks, a block
    hidden until all of it is in the past (the first always seen); beside it, the sliding-window branch."""

    def __init__(self, heads: int, hd: int = 4, block: int = 2):
        super().__init__()
        self.h, self.hd, self.block = heads, hd, block
        self.emb = nn.Embedding(VOCAB, heads * hd)
        self.qkv = nn.Linear(heads * hd, 3 * heads * hd)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, t, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        nb = t // self.block
        kc = k.reshape(b, self.h, nb, self.block, self.hd).mean(3)
        vc = v.reshape(b, self.h, nb, self.block, self.hd).mean(3)
        past = (torch.arange(nb) * self.block + self.block - 1)[None, :] <= torch.arange(t)[:, None]
        past[:, 0] = True
        pc = (q @ kc.transpose(-1, -2) * self.hd**-0.5).masked_fill(~past, float("-inf")).softmax(-1)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        pw = (q @ k.transpose(-1, -2) * self.hd**-0.5).masked_fill(~causal, float("-inf")).softmax(-1)
        self.seen += [pc, pw]
        return pc @ vc + pw @ v


@pytest.mark.parametrize(("heads", "batch"), [(1, 1), (2, 2), (3, 2)])
def test_a_causal_mask_over_pooled_key_blocks_is_a_decoder(heads, batch):
    """Keys pooled from the queries' own sequence were self-attention of an encoder whatever the mask (as
    PVT's are): the compressed branch of a causal decoder was enc_self beside its window branch's dec_self."""
    torch.manual_seed(heads + batch)
    model = CompressedBranch(heads).eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (batch, 6)))
    pooled, window = cap.records
    assert pooled.exact and window.exact and not cap.notes, cap.notes
    assert pooled.key_labels == ("<pooled 0>", "<pooled 1>", "<pooled 2>")
    assert (pooled.kind, window.kind) == ("dec_self", "dec_self")
    assert torch.equal(pooled.probs, model.seen[0]) and torch.equal(window.probs, model.seen[1])


class ParamProjection(nn.Module):
    """An output projection written by hand over a learned matrix: ``heads @ W_o + b_o`` (``"matmul"``), or an
    einsum kernel over the unmerged heads and its bias added after (``"einsum"``)."""

    def __init__(self, how: str, heads: int, d: int = 16):
        super().__init__()
        self.how, self.h = how, heads
        self.qkv = nn.Linear(d, 3 * d)
        self.w_o = nn.Parameter(
            torch.randn(d, d) / 4 if how == "matmul" else torch.randn(heads, d // heads, d) / 4
        )
        self.b_o = nn.Parameter(torch.randn(d) / 4)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        y = (q @ k.transpose(-1, -2) / 2).softmax(-1) @ v  # (B, H, n, d / H)
        if self.how == "matmul":
            return y.transpose(1, 2).reshape(b, n, d) @ self.w_o + self.b_o
        return torch.einsum("bnhd,hdD->bnD", y.transpose(1, 2), self.w_o) + self.b_o


@pytest.mark.parametrize("how", ["matmul", "einsum"])
@pytest.mark.parametrize(("heads", "batch"), [(1, 1), (2, 2), (4, 3)])
def test_an_output_projection_over_a_learned_matrix_and_its_bias_are_found(how, heads, batch):
    """``heads @ W_o`` with W_o a Parameter was told "without the output projection" (the codes of the product,
    made as a linear's, dropped the pending values before the product named W_o); a bias added after the
    projection was not its b_O, so Σ_h Σ_j α_ij f_h(x_j) + b_O missed the block's output by the bias."""
    torch.manual_seed(heads + batch)
    model = ParamProjection(how, heads).eval()
    x = torch.randn(batch, 5, 16)
    cap, out = _captured(model, x)
    (rec,) = cap.records
    hv = rec.values
    assert hv.scope == "with the output projection" and hv.b_o is not None
    v = model.qkv(x).chunk(3, -1)[2].view(batch, 5, heads, -1).transpose(1, 2)
    _moves_exactly(rec, v, model.w_o.detach().view(heads, 16 // heads, 16).transpose(1, 2), out)


class HeadsClassified(nn.Module):
    """Attention with no output projection of its own, whose heads merged back a classifier reads (16 -> 3):
    in the attention's own module, or in the module around it inside a wrapper."""

    def __init__(self, d: int = 16, heads: int = 4):
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.fc = nn.Linear(d, 3)

    def attend(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return ((q @ k.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)

    def forward(self, x):
        return self.fc(self.attend(x)[:, 0])


class Attend(nn.Module):
    def __init__(self, d: int = 16, heads: int = 4):
        super().__init__()
        self.inner = HeadsClassified(d, heads)

    def forward(self, x):
        return self.inner.attend(x)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.fc = Attend(), nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.attn(x)[:, 0])


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Classifier()

    def forward(self, x):
        return self.model(x)


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_classifier_over_the_heads_is_no_output_projection(wrapped):
    """The classifier was taken for W_O: "with the output projection", and norms in the classes' space."""
    torch.manual_seed(0)
    model = (Wrapper() if wrapped else HeadsClassified()).eval()
    x = torch.randn(2, 5, 16)
    cap, _ = _captured(model, x)
    (rec,) = cap.records
    qkv = model.model.attn.inner.qkv if wrapped else model.qkv
    v = qkv(x).chunk(3, -1)[2].view(2, 5, 4, 4).transpose(1, 2)
    assert rec.values.scope == "without the output projection" and rec.values.w_o is None
    torch.testing.assert_close(rec.values.norms(), v.norm(dim=-1))


class Block(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        p = (q[:, None] @ k[:, None].transpose(-1, -2) / 4).softmax(-1)
        return x + (p @ v[:, None])[:, 0], p


class SomeRows(nn.Module):
    """Layers run on some of the batch's rows: picked per layer (layers skipped per sample, ``active[l]``), or
    the whole batch put in one other order first (sorted by length) and every layer run on it."""

    def __init__(self, layers: int = 3, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.seen: list[tuple[list[int], torch.Tensor]] = []

    def forward(self, ids, active=None, order=None):
        x = self.emb(ids)
        if order is not None:
            x = x[order]
        for layer, block in enumerate(self.blocks):
            rows = torch.arange(x.shape[0]) if active is None else active[layer].nonzero().squeeze(1)
            y, p = block(x[rows])
            self.seen.append((rows.tolist() if order is None else order.tolist(), p))
            x = x.index_copy(0, rows, y)
        return x


def test_a_trace_draws_the_row_that_holds_the_sequence_asked_for():
    """The batch put in another order before every layer: trace(b) drew record row b, another sequence's
    weights under sequence b's tokens."""
    torch.manual_seed(0)
    model = SomeRows().eval()
    order = torch.tensor([2, 0, 3, 1])
    cap, _ = _captured(model, torch.randint(0, VOCAB, (4, 6)), order=order)
    tokens = [f"t{j}" for j in range(6)]
    for b in range(4):
        tr = cap.trace(b, src_tokens=tokens)
        row = order.tolist().index(b)
        want = np.stack([p[row, 0].numpy() for _, p in model.seen])
        np.testing.assert_allclose(tr.probs("enc_self")[:, 0], want, atol=1e-6)
        if row != b:
            assert any(f"sequence {b} is row {row} of its maps" in n for n in tr.meta["capture_notes"])
            assert not any("windows, chunks, documents or beams" in n for n in tr.meta["capture_notes"])


def test_layers_run_on_other_rows_each_are_left_out_of_a_trace():
    """Each layer ran on the rows a per-sample skip picked: trace(3) drew record row 3 of each layer, another
    sequence's weights (or no layer held it), under sequence 3's tokens."""
    torch.manual_seed(0)
    model = SomeRows(layers=2).eval()
    active = torch.tensor([[1, 1, 1, 0, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    cap, _ = _captured(model, torch.randint(0, VOCAB, (5, 6)), active=active)
    for b in (0, 3, 4):  # (0 and 3: in one layer only; 4: rows 3 and 3, the same row of each, drawn)
        if b == 4:
            tr = cap.trace(b, src_tokens=[f"t{j}" for j in range(6)])
            want = np.stack([p[rows.index(4), 0].numpy() for rows, p in model.seen])
            np.testing.assert_allclose(tr.probs("enc_self")[:, 0], want, atol=1e-6)
            continue
        with pytest.raises(ValueError, match=f"sequence {b} is in no row of some of its maps"):
            cap.trace(b, src_tokens=[f"t{j}" for j in range(6)])


class InlineSkips(nn.Module):
    """Layers written inline in one forward, each run on the rows a per-sample skip picks."""

    def __init__(self, layers: int = 4, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.seen: list[torch.Tensor] = []

    def forward(self, ids, active):
        x = self.emb(ids)
        for layer, lin in enumerate(self.qkv):
            rows = active[layer].nonzero().squeeze(1)
            xs = x[rows]
            q, k, v = lin(xs).chunk(3, -1)
            p = (q[:, None] @ k[:, None].transpose(-1, -2) / 4).softmax(-1)
            self.seen.append(p)
            x = x.index_copy(0, rows, xs + (p @ v[:, None])[:, 0])
        return x


def test_layers_run_on_single_rows_going_back_are_not_joined_as_slices():
    """Layer 1 on row 1, then layer 2 on row 0, in one call: joined as two slices of one attention over the
    batch, an exact record that no call made (and one record fewer than calls, said nowhere)."""
    torch.manual_seed(0)
    model = InlineSkips().eval()
    active = torch.tensor([[1, 1], [0, 1], [1, 0], [1, 1]], dtype=torch.bool)
    cap, _ = _captured(model, torch.randint(0, VOCAB, (2, 6)), active)
    assert len(cap.records) == len(model.seen) == 4
    for rec, p in zip(cap.records, model.seen, strict=True):
        assert torch.equal(rec.probs, p)


class Joined(nn.Module):
    """A learned position joined before the tokens: a task token before a causal target (``causal``), or a
    [CLS] before an encoder's tokens that see each other."""

    def __init__(self, causal: bool, d: int = 16, heads: int = 2):
        super().__init__()
        self.causal, self.h = causal, heads
        self.emb = nn.Embedding(VOCAB, d)
        self.task = nn.Parameter(torch.randn(1, 1, d))
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        y = torch.cat([self.task.expand(b, 1, -1), self.emb(ids)], 1)
        q, k = (lin(y).view(b, t + 1, self.h, -1).transpose(1, 2) for lin in (self.q, self.k))
        keep = (torch.cat([torch.ones(b, 1, dtype=torch.bool), ids != 0], 1))[:, None, None, :]
        if self.causal:
            keep = keep & torch.ones(t + 1, t + 1, dtype=torch.bool).tril()
        w = (q @ k.transpose(-1, -2)).masked_fill(~keep, -1e9).softmax(-1)
        self.seen.append(w)
        return w


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_a_learned_position_before_one_token_leaves_the_whole_mask_to_decide(causal, tokens):
    """With one target token after a task token, the mask left once the learned position was set aside was
    1 x 1, which says nothing: the causal [[1, 0], [1, 1]] was recorded enc_self with no word said."""
    torch.manual_seed(tokens)
    model = Joined(causal).eval()
    cap, _ = _captured(model, torch.randint(1, VOCAB, (2, tokens)))
    (rec,) = cap.records
    assert rec.exact and torch.equal(rec.probs, model.seen[0])
    assert rec.kind == ("dec_self" if causal else "enc_self"), (rec.kind, cap.notes)
    assert not cap.notes, cap.notes


class Seq2SeqAttention(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.h = heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.seen: list[torch.Tensor] = []

    def forward(self, x, kv, allowed):
        b, lq, lk = x.shape[0], x.shape[1], kv.shape[1]
        q = self.q(x).view(b, lq, self.h, -1).transpose(1, 2)
        k, v = (lin(kv).view(b, lk, self.h, -1).transpose(1, 2) for lin in (self.k, self.v))
        p = (q @ k.transpose(-2, -1) / 8**0.5).masked_fill(allowed.unsqueeze(1) == 0, -1e9).softmax(-1)
        self.seen.append(p)
        return (p @ v).transpose(1, 2).reshape(b, lq, -1)


class GreedyPrefix(nn.Module):
    """A greedy loop that runs the decoder again over the whole prefix every step (no cache), a learned task
    token before the target (``task``), with an attention module of each kind or one shared by all three."""

    def __init__(self, task: bool, shared: bool, d: int = 16, steps: int = 3):
        super().__init__()
        self.steps, self.has_task = steps, task
        self.emb, self.out = nn.Embedding(VOCAB, d), nn.Linear(d, VOCAB)
        self.task = nn.Parameter(torch.randn(1, 1, d))
        self.enc = Seq2SeqAttention(d)
        self.dself = self.enc if shared else Seq2SeqAttention(d)
        self.dcross = self.enc if shared else Seq2SeqAttention(d)

    def forward(self, src):
        keep = (src != 0).unsqueeze(-2)
        mem = self.emb(src)
        mem = mem + self.enc(mem, mem, keep)
        b = src.shape[0]
        ys = torch.full((b, 1), 2, dtype=torch.long)
        for _ in range(self.steps):
            y = self.emb(ys)
            if self.has_task:
                y = torch.cat([self.task.expand(b, 1, -1), y], 1)
            n = y.shape[1]
            y = y + self.dself(y, y, torch.ones(1, n, n, dtype=torch.bool).tril())
            y = y + self.dcross(y, mem, keep)
            ys = torch.cat([ys, (self.out(y[:, -1]).argmax(-1) % (VOCAB - 3) + 3)[:, None]], 1)
        return ys


def test_a_trace_of_a_step_draws_the_step_whose_tokens_are_those_given():
    """The tokens given were the last step's three: the trace drew the step before (the task token and two
    tokens, three positions too), its task token's weight under the first token."""
    torch.manual_seed(0)
    model = GreedyPrefix(task=True, shared=False).eval()
    cap, _ = _captured(model, torch.tensor([[5, 6, 7, 8]]))
    tr = cap.trace(0, src_tokens=["a", "b", "c", "d"], tgt_tokens=["t0", "t1", "t2"])
    assert tr.tgt_tokens == ("<task 0>", "t0", "t1", "t2")
    np.testing.assert_allclose(tr.probs("dec_self")[-1], model.dself.seen[-1][0].numpy(), atol=1e-6)
    np.testing.assert_allclose(tr.probs("cross")[-1], model.dcross.seen[-1][0].numpy(), atol=1e-6)


def test_a_module_shared_by_encoder_and_decoder_steps_is_not_said_undecided():
    """The decoder's first step (one token) took the kind of its later ones, dec_self; the encoder's call of
    the same module, decided by its padding, was enc_self: a note said the one-token call was recorded enc_self."""
    torch.manual_seed(0)
    model = GreedyPrefix(task=False, shared=True).eval()
    cap, _ = _captured(model, torch.tensor([[5, 6, 7], [8, 9, 0]]))
    one = [r for r in cap.records if tuple(r.probs.shape[-2:]) == (1, 1)]
    assert one and all(r.kind == "dec_self" for r in one)
    assert not any("recorded encoder self-attention" in n for n in cap.notes), cap.notes


class FusedTokens(nn.Module):
    """EViT: after each layer the tokens [CLS] attends to least are fused into one, their sum weighted by that
    attention, joined after the ones kept."""

    def __init__(self, layers: int = 3, d: int = 16, heads: int = 2):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))

    def forward(self, ids):
        x = self.emb(ids)
        for lin in self.qkv:
            b, n, d = x.shape
            q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in lin(x).chunk(3, -1))
            attn = (q @ k.transpose(-1, -2) / 8**0.5).softmax(-1)
            x = x + (attn @ v).transpose(1, 2).reshape(b, n, d)
            left = math.ceil(0.6 * (n - 1))
            cls_attn = attn[:, :, 0, 1:].mean(dim=1)
            idx = cls_attn.topk(left, dim=1).indices
            rest = cls_attn.topk(n - 1 - left, dim=1, largest=False).indices
            others = x[:, 1:].gather(1, idx[..., None].expand(-1, -1, d))
            fused = (
                x[:, 1:].gather(1, rest[..., None].expand(-1, -1, d)) * cls_attn.gather(1, rest)[..., None]
            )
            x = torch.cat([x[:, :1], others, fused.sum(1, keepdim=True)], 1)
        return x


def test_a_layer_left_unrecorded_after_tokens_are_fused_says_why_truly():
    """The note said only that the layer's keys were no sequence length of the call, which its tokens were:
    the keys include a token made from others, which lineage does not place."""
    torch.manual_seed(0)
    model = FusedTokens().eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (2, 9)))
    said = [n for n in cap.notes if "is not a sequence length" in n]
    assert said and all("lineage does not place its keys" in n for n in said), cap.notes


class KarpathyHead(nn.Module):
    """One head of "Let's build GPT": its own key, query and value, a causal ``tril`` buffer."""

    def __init__(self, d: int, size: int):
        super().__init__()
        self.key, self.query, self.value = (nn.Linear(d, size, bias=False) for _ in range(3))
        self.register_buffer("tril", torch.tril(torch.ones(8, 8)))

    def forward(self, x):
        _, t, _ = x.shape
        k, q = self.key(x), self.query(x)
        wei = (q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5).masked_fill(
            self.tril[:t, :t] == 0, float("-inf")
        )
        return wei.softmax(-1) @ self.value(x)


class KarpathyHeads(nn.Module):
    """Its MultiHeadAttention: the heads' outputs joined along their features, then ``proj`` (or none)."""

    def __init__(self, heads: int, projected: bool, d: int = 16):
        super().__init__()
        self.heads = nn.ModuleList(KarpathyHead(d, d // heads) for _ in range(heads))
        self.proj = nn.Linear(d, d) if projected else nn.Identity()

    def forward(self, x):
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))


@pytest.mark.parametrize("projected", [True, False])
@pytest.mark.parametrize(("heads", "batch"), [(2, 1), (4, 2), (2, 2)])
def test_heads_of_a_list_joined_then_projected_keep_what_they_move(heads, batch, projected):
    """The heads' records are joined into the layer's as they are made, and their values were dropped on the
    way: the layer's record had none, so nothing showed what attention moves."""
    torch.manual_seed(heads + batch)
    model = KarpathyHeads(heads, projected).eval()
    x = torch.randn(batch, 6, 16)
    cap, out = _captured(model, x)
    (rec,) = cap.records
    assert rec.exact and rec.probs.shape == (batch, heads, 6, 6)
    hv = rec.values
    v = torch.stack([h.value(x) for h in model.heads], 1)  # (B, H, k, dv)
    if not projected:
        assert hv.scope == "without the output projection"
        torch.testing.assert_close(hv.norms(), v.norm(dim=-1))
        return
    assert hv.scope == "with the output projection"
    _moves_exactly(rec, v, model.proj.weight.detach().view(16, heads, 16 // heads).permute(1, 0, 2), out)


class TalkingHeads(nn.Module):
    """CaiT's talking heads written with einsum: the scores mixed across heads before the softmax, the weights
    mixed again after it (``before``/``after``)."""

    def __init__(self, heads: int, before: bool, after: bool, d: int = 16):
        super().__init__()
        self.h, self.before, self.after = heads, before, after
        self.qkv = nn.Linear(d, 3 * d)
        self.pre, self.post = nn.Parameter(torch.randn(heads, heads)), nn.Parameter(torch.randn(heads, heads))
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        dots = q @ k.transpose(-1, -2) / 2
        if self.before:
            dots = torch.einsum("b h i j, h g -> b g i j", dots, self.pre)
        attn = dots.softmax(-1)
        if self.after:
            attn = torch.einsum("b h i j, h g -> b g i j", attn, self.post)
        self.seen.append(attn)
        return attn @ v


@pytest.mark.parametrize(("before", "after"), [(False, True), (True, True)])
def test_weights_mixed_across_heads_after_the_softmax_are_said_whatever_came_before(before, after):
    """Mixed before the softmax as well, the flag named only that mix: the record, the softmax's output and not
    the weights the values are multiplied with, said nothing of the mix after it."""
    torch.manual_seed(0)
    model = TalkingHeads(2, before, after).eval()
    cap, _ = _captured(model, torch.randn(2, 5, 16))
    (rec,) = cap.records
    assert not torch.allclose(rec.probs, model.seen[0])  # (the softmax's output, as the flag says)
    assert not rec.exact and "after the softmax: the record holds the softmax's output" in rec.flag, rec.flag


class Tiny(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = (t.view(b, n, 2, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        w = (q @ k.transpose(-1, -2)).softmax(-1)
        return x + self.o((w @ v).transpose(1, 2).reshape(b, n, d))


@pytest.mark.parametrize(
    ("model", "kwargs", "said"),
    [
        (len, {}, "takes the model, a torch.nn.Module instance, not a builtin_function_or_method"),
        (nn.Linear, {}, "not the class Linear"),
        (None, {"kinds": {1: "enc_self"}}, "kinds= keys are module paths"),
        (None, {"lengths": "six"}, "lengths= is a list of sequence lengths"),
        (None, {"lengths": [4, -1]}, "lengths= is a list of sequence lengths"),
        (None, {"include": "decoder.*"}, "include= is a list of module paths"),
    ],
)
def test_arguments_capture_cannot_use_get_one_sentence(model, kwargs, said):
    """A function, a class, a kinds= key that is no string, a lengths= or include= of the wrong type: errors
    from deep inside (``'function' object has no attribute 'named_modules'``), or every record dropped."""
    with pytest.raises(TypeError, match=said):
        with capture_attention(Tiny() if model is None else model, **kwargs):
            pass


def test_one_length_given_for_lengths_is_taken_as_a_list():
    model = Tiny().eval()
    with torch.no_grad(), capture_attention(model, lengths=5) as cap:
        model(torch.randint(0, VOCAB, (2, 5)))
    assert len(cap.records) == 1 and cap.records[0].exact


def test_kinds_naming_no_module_of_the_model_is_said():
    """A typo in kinds= was ignored in silence, the records keeping the kind capture read."""
    model = Tiny().eval()
    with torch.no_grad(), capture_attention(model, kinds={"atn": "dec_self", "q*": "enc_self"}) as cap:
        model(torch.randint(0, VOCAB, (2, 5)))
    said = [n for n in cap.notes if "which is no module path of this model" in n]
    assert len(said) == 1 and "'atn'" in said[0] and cap.records[0].kind == "enc_self"


def test_a_model_on_the_meta_device_is_said_in_one_sentence():
    """nn.TransformerEncoder on 'meta' raised "Cannot copy out of meta tensor" from inside capture at the end of
    the block; a model of one's own got a note per op."""
    with torch.device("meta"):
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2).eval()
    cap, _ = _captured(enc, torch.randn(2, 5, 16, device="meta"))
    assert not cap.records and len(cap.notes) == 1 and "'meta' device" in cap.notes[0]


def test_value_norms_left_out_after_the_model_changed_are_said():
    """After an in-place change of the output projection (an optimizer step), a second trace dropped what
    attention moves with no word: the values it is read from are no longer what moved."""
    torch.manual_seed(0)
    model = Tiny().eval()
    cap, _ = _captured(model, torch.randint(0, VOCAB, (1, 6)))
    assert cap.trace(0).meta["value_norms"] == {"enc_self": "with the output projection"}
    with torch.no_grad():
        model.o.bias.add_(0.5)
    after = cap.trace(0)
    assert "value_norms" not in after.meta
    assert any("what attention moves (its value norms) is left out" in n for n in after.meta["capture_notes"])


class Frames(nn.Module):
    """A world model over frames of tokens: each token sees its own frame and the frames before (block-causal,
    IRIS's and TWM's), or its own frame only (``causal`` False: frames packed apart), padding frames masked."""

    def __init__(self, causal: bool, heads: int = 2, d: int = 16, per: int = 3):
        super().__init__()
        self.causal, self.h, self.per = causal, heads, per
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids, frames):  # frames (B,): how many frames each sequence has
        b, n = ids.shape
        frame = torch.arange(n) // self.per
        keep = frame[None, :] <= frame[:, None] if self.causal else frame[None, :] == frame[:, None]
        keep = keep[None] & (frame[None, :] < frames[:, None])[:, None, :]
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
        w = (q @ k.transpose(-1, -2)).masked_fill(~keep[:, None], float("-inf")).softmax(-1).nan_to_num()
        self.seen.append(w)
        return w @ v


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_mask_causal_by_frames_is_a_decoders(causal, batch):
    """Each frame's tokens seeing their own frame and the ones before was recorded enc_self, exact, with no
    word said: the tokens of a frame see a later one of the same frame, so no plain causal mask was found.
    Frames that see only themselves (packed apart) stay an encoder's."""
    torch.manual_seed(batch)
    model = Frames(causal).eval()
    frames = torch.tensor([4, 3, 2][:batch])
    cap, _ = _captured(model, torch.randint(1, VOCAB, (batch, 12)), frames)
    (rec,) = cap.records
    assert torch.equal(rec.probs, model.seen[0])
    assert rec.kind == ("dec_self" if causal else "enc_self"), (rec.kind, cap.notes)


class Fusion(nn.Module):
    """ALBEF's image-text fusion: an image encoder's self-attention over a class token and its patches, then a
    text encoder (an [ENC] token before the words) whose layers attend to themselves and then to the image."""

    def __init__(self, d: int = 16, layers: int = 2):
        super().__init__()
        self.emb, self.patch = nn.Embedding(VOCAB, d), nn.Conv2d(3, d, 4, 4)
        self.cls, self.enc = nn.Parameter(torch.randn(1, 1, d)), nn.Parameter(torch.randn(1, 1, d))
        self.img_self = Seq2SeqAttention(d)
        self.text_self = nn.ModuleList(Seq2SeqAttention(d) for _ in range(layers))
        self.text_cross = nn.ModuleList(Seq2SeqAttention(d) for _ in range(layers))

    def forward(self, ids, pixels):
        b = ids.shape[0]
        v = torch.cat([self.cls.expand(b, 1, -1), self.patch(pixels).flatten(2).transpose(1, 2)], 1)
        v = v + self.img_self(v, v, torch.ones(b, 1, v.shape[1], dtype=torch.bool))
        t = torch.cat(
            [self.enc.expand(b, 1, -1), self.emb(ids)[:, 1:]], 1
        )  # (BLIP's [ENC] in place of [CLS])
        keep = (ids != 0).unsqueeze(-2)
        for sa, ca in zip(self.text_self, self.text_cross, strict=True):
            t = t + sa(t, t, keep)
            t = t + ca(t, v, torch.ones(b, 1, v.shape[1], dtype=torch.bool))
        return t


def test_the_encoder_drawn_beside_a_cross_attention_is_the_one_it_reads():
    """The text's two self-attention layers, the cross-attention's queries' side, outnumbered the image's one
    and were drawn as the encoder under the image's tokens."""
    torch.manual_seed(0)
    model = Fusion().eval()
    cap, _ = _captured(model, torch.tensor([[1, 5, 6, 0, 0]]), torch.randn(1, 3, 8, 8))
    tr = cap.trace(0, src_tokens=["p0", "p1", "p2", "p3"], tgt_tokens=["t1", "t2", "t3", "t4"])
    enc = tr.probs("enc_self")
    assert enc.shape[0] == 1 and tr.src_tokens == ("<cls 0>", "p0", "p1", "p2", "p3")
    np.testing.assert_allclose(enc[0], model.img_self.seen[0][0].numpy(), atol=1e-6)


class CoAttention(nn.Module):
    """ViLBERT's co-attention: the words over the regions and the regions over the words, in each block."""

    def __init__(self, d: int = 16, blocks: int = 2):
        super().__init__()
        self.emb, self.regions = nn.Embedding(VOCAB, d), nn.Linear(6, d)
        self.text_self = Seq2SeqAttention(d)
        self.t2v = nn.ModuleList(Seq2SeqAttention(d) for _ in range(blocks))
        self.v2t = nn.ModuleList(Seq2SeqAttention(d) for _ in range(blocks))

    def forward(self, ids, feats):
        t, v = self.emb(ids), self.regions(feats)
        b, lt, lv = t.shape[0], t.shape[1], v.shape[1]
        t = t + self.text_self(t, t, torch.ones(b, 1, lt, dtype=torch.bool))
        for t2v, v2t in zip(self.t2v, self.v2t, strict=True):
            t, v = (t + t2v(t, v, torch.ones(b, 1, lv, dtype=torch.bool)),
                    v + v2t(v, t, torch.ones(b, 1, lt, dtype=torch.bool)))  # fmt: skip
        return t, v


def test_cross_attention_both_ways_between_inputs_of_one_length_is_left_out():
    """With as many words as regions, the trace drew the last block's regions-over-words map as the cross-
    attention, the words' labels on its query rows and the regions' on its keys, and said nothing."""
    torch.manual_seed(0)
    model = CoAttention().eval()
    cap, _ = _captured(model, torch.randint(1, VOCAB, (1, 5)), torch.randn(1, 5, 6))
    assert sum(r.kind == "cross" for r in cap.records) == 4 and all(r.exact for r in cap.records)
    # (the words' self-attention too: which input the tokens given are, nothing tells)
    with pytest.raises(ValueError, match="run both ways between two inputs") as raised:
        cap.trace(0, src_tokens=[f"r{i}" for i in range(5)], tgt_tokens=[f"w{i}" for i in range(5)])
    assert "self-attention of one of two inputs" in str(raised.value)
    cap, _ = _captured(
        model, torch.randint(1, VOCAB, (1, 5)), torch.randn(1, 3, 6)
    )  # (other lengths: the tokens tell)
    tr = cap.trace(0, src_tokens=[f"r{i}" for i in range(3)], tgt_tokens=[f"w{i}" for i in range(5)])
    assert tr.probs("cross").shape[-2:] == (5, 3)


class HeadsLooped(nn.Module):
    """Heads as a loop inside one module: each its own q, k and v, the outputs joined, one projection."""

    def __init__(self, heads: int, d: int = 16):
        super().__init__()
        self.heads = nn.ModuleList(
            nn.ModuleDict(
                {"q": nn.Linear(d, d // heads), "k": nn.Linear(d, d // heads), "v": nn.Linear(d, d // heads)}
            )
            for _ in range(heads)
        )
        self.o = nn.Linear(d, d)

    def forward(self, x):
        outs = []
        for h in self.heads:
            q, k, v = h["q"](x), h["k"](x), h["v"](x)
            outs.append((q @ k.transpose(-1, -2) / 2).softmax(-1) @ v)
        return self.o(torch.cat(outs, -1))


@pytest.mark.parametrize(("heads", "batch"), [(2, 1), (4, 2), (2, 2)])
def test_heads_of_a_loop_in_one_module_keep_their_projection(heads, batch):
    """Each head's values waited under the module's one path, the next head's replacing them: the layer's
    values were told "without the output projection"."""
    torch.manual_seed(heads + batch)
    model = HeadsLooped(heads).eval()
    x = torch.randn(batch, 5, 16)
    cap, out = _captured(model, x)
    (rec,) = cap.records
    hv = rec.values
    assert rec.exact and rec.probs.shape == (batch, heads, 5, 5) and hv.scope == "with the output projection"
    v = torch.stack([h["v"](x) for h in model.heads], 1)
    _moves_exactly(rec, v, model.o.weight.detach().view(16, heads, 16 // heads).permute(1, 0, 2), out)
