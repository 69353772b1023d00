"""Capture on attention as research reimplementations write it (lucidrains-style and paper code).

- Positions put in another order before the product (sorted into buckets, routed, gathered by a
  permutation, flipped): a map whose rows and keys are a whole sequence out of order cannot be labelled
  by its tokens, so it is flagged, never shown as exact in the wrong order. Windows that each hold part
  of a sequence stay sequences of their own.
- Learned vectors scaled by a number before use (``self.latents * 0.5``, fairseq's
  ``projected_embeddings * sqrt(d)``) keep their rows' lineage: a Perceiver's latents and Luna's packed
  context stay exact.
- Multi-query attention written as one einsum with one key head (PaLM's
  ``einsum('b h i d, b j d -> b h i j', q, k)``) is exact.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

VOCAB = 30


def _ids(batch: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(batch)
    return torch.randint(1, VOCAB, (batch, n), generator=g)


class Reordered(nn.Module):
    """Single-head attention over the sequence gathered by a permutation (or flipped), in ``windows``
    windows folded into the batch, scattered back afterwards."""

    def __init__(self, how: str, windows: int = 1, d: int = 8):
        super().__init__()
        self.how, self.windows = how, windows
        self.emb = nn.Embedding(VOCAB, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        h = self.emb(ids)
        b, n, d = h.shape
        if self.how == "flip":
            hs = torch.flip(h, dims=[1])
        else:
            if self.how == "sorted":  # buckets: positions sorted by a hash of their features
                perm = torch.argsort(h[..., 0], dim=-1)
            elif self.how == "identity":
                perm = torch.arange(n).expand(b, n)
            else:
                perm = torch.stack(
                    [torch.randperm(n, generator=torch.Generator().manual_seed(i)) for i in range(b)]
                )
            hs = h.gather(1, perm[..., None].expand(-1, -1, d))
        w = n // self.windows
        q, k, v = (t.reshape(b * self.windows, w, d) for t in (self.q(hs), self.k(hs), self.v(hs)))
        a = F.softmax(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d), dim=-1)
        self.used.append(a[:, None])
        return torch.bmm(a, v).reshape(b, n, d)


@pytest.mark.parametrize("how", ["random", "sorted", "flip"])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_whole_sequence_in_another_order_is_flagged_not_shown_in_order(how, batch):
    torch.manual_seed(0)
    model = Reordered(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 8))
    (rec,) = cap.records
    torch.testing.assert_close(rec.probs, model.used[0], atol=1e-6, rtol=0)  # the weights as computed
    assert not rec.exact
    assert "another order" in rec.flag
    assert any("another order" in note for note in cap.notes)


@pytest.mark.parametrize(("how", "windows"), [("identity", 1), ("identity", 2)])
def test_positions_in_order_and_windows_of_part_of_a_sequence_stay_exact(how, windows):
    torch.manual_seed(0)
    model = Reordered(how, windows).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 8))
    (rec,) = cap.records
    assert rec.exact, rec.flag
    assert not cap.notes
    torch.testing.assert_close(rec.probs, model.used[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("how", ["random", "sorted"])
def test_windows_of_a_sequence_put_in_an_order_drawn_from_the_data_are_flagged(how):
    """Windows cut from a sequence gathered by a random permutation or a sort of its features hold tokens the
    data picked (as LSH's chunks of bucket-sorted tokens do), not a region of the sequence: their map names no
    tokens a trace could label, so the record is flagged (it was exact, each window drawn as a sequence)."""
    torch.manual_seed(0)
    model = Reordered(how, 2).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 8))
    (rec,) = cap.records
    torch.testing.assert_close(rec.probs, model.used[0], atol=1e-6, rtol=0)
    assert not rec.exact and "picked by indices the model computed from its data" in rec.flag


class ScaledLatents(nn.Module):
    """A Perceiver block: learned latents, scaled by a number, cross-attend to the tokens, then attend
    to themselves (einsum, einops-free)."""

    def __init__(self, heads: int, latents: int = 3):
        super().__init__()
        d, self.h = 4 * heads, heads
        self.emb = nn.Embedding(VOCAB, d)
        self.latents = nn.Parameter(torch.randn(latents, d))
        self.to_q, self.to_kv = nn.Linear(d, d, bias=False), nn.Linear(d, 2 * d, bias=False)
        self.self_qkv = nn.Linear(d, 3 * d, bias=False)
        self.used: list[tuple[str, torch.Tensor]] = []

    def _attend(self, q, k, v, kind):
        b, n, d = q.shape
        q, k, v = (t.reshape(b, t.shape[1], self.h, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        w = torch.einsum("bhid,bhjd->bhij", q, k).mul(q.shape[-1] ** -0.5).softmax(dim=-1)
        self.used.append((kind, w))
        return torch.einsum("bhij,bhjd->bhid", w, v).permute(0, 2, 1, 3).reshape(b, n, d)

    def forward(self, ids):
        x = self.emb(ids)
        lat = (self.latents * 0.5).unsqueeze(0).expand(x.shape[0], -1, -1)
        lat = lat + self._attend(self.to_q(lat), *self.to_kv(x).chunk(2, dim=-1), "cross")
        return lat + self._attend(*self.self_qkv(lat).chunk(3, dim=-1), "enc_self")


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 3), (4, 2)])
def test_learned_latents_scaled_by_a_number_keep_their_lineage(batch, heads):
    torch.manual_seed(4)
    model = ScaledLatents(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 6))
    assert not cap.notes, cap.notes
    assert [r.kind for r in cap.records] == [k for k, _ in model.used]
    for rec, (_, want) in zip(cap.records, model.used, strict=True):
        assert rec.exact, rec.flag
        torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)
    assert cap.records[0].query_labels == ("<latents 0>", "<latents 1>", "<latents 2>")


class MultiQuery(nn.Module):
    """PaLM's multi-query attention: one key and value head for every query head, in one einsum."""

    def __init__(self, heads: int):
        super().__init__()
        d, self.h = 4 * heads, heads
        self.emb = nn.Embedding(VOCAB, d)
        self.q, self.kv = nn.Linear(d, d, bias=False), nn.Linear(d, 8, bias=False)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q = self.q(x).view(b, n, self.h, 4).transpose(1, 2) * 4**-0.5
        k, v = self.kv(x).split(4, dim=-1)
        sim = torch.einsum("b h i d, b j d -> b h i j", q, k)
        sim = sim.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        w = sim.softmax(dim=-1)
        self.used.append(w)
        return torch.einsum("b h i j, b j d -> b h i d", w, v)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_multi_query_attention_in_one_einsum_is_exact(batch, heads):
    torch.manual_seed(5)
    model = MultiQuery(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 6))
    (rec,) = cap.records
    assert rec.exact, rec.flag
    assert rec.kind == "dec_self"
    torch.testing.assert_close(rec.probs, model.used[0], atol=1e-6, rtol=0)


class Synthesizer(nn.Module):
    """Tay et al.'s Synthesizer: weights not from queries and keys but a projection of each position
    (dense) or a learned table (random), softmaxed and multiplied with the values; a vocabulary softmax
    at the end."""

    def __init__(self, how: str, heads: int = 2, d: int = 8, max_len: int = 16):
        super().__init__()
        self.how, self.h = how, heads
        self.emb = nn.Embedding(VOCAB, d)
        self.w1, self.w2 = nn.Linear(d, d), nn.Linear(d // heads, max_len)
        self.table = nn.Parameter(torch.randn(heads, max_len, max_len))
        self.value, self.out = nn.Linear(d, d), nn.Linear(d, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        v = self.value(x).view(b, n, self.h, -1).transpose(1, 2)
        if self.how == "dense":
            energy = self.w2(F.relu(self.w1(x)).view(b, n, self.h, -1).transpose(1, 2))[..., :n]
        else:
            energy = self.table[:, :n, :n].unsqueeze(0).expand(b, -1, -1, -1)
        y = torch.matmul(torch.softmax(energy, dim=-1), v).transpose(1, 2).reshape(b, n, d)
        return self.out(y).softmax(-1)


@pytest.mark.parametrize("how", ["dense", "random"])
def test_synthesizer_weights_multiplying_values_are_a_warning_not_a_vocabulary(how):
    torch.manual_seed(6)
    model = Synthesizer(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 6))
    assert not cap.records
    (note,) = cap.notes
    assert "synthesizer" in note and "multiply values" in note
    skipped = [(n.module, n.reason) for n in cap.skipped]
    assert (
        len(skipped) == 1 and "vocabulary" in skipped[0][1]
    )  # the model's last softmax, over its vocabulary


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.qkv = heads, nn.Linear(d, 3 * d)
        self.used: list[torch.Tensor] = []

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        w = (q @ k.transpose(-2, -1) / math.sqrt(d // self.h)).softmax(-1)
        self.used.append(w)
        return (w @ v).transpose(1, 2).reshape(b, n, d)


class Blocks(nn.Module):
    """One attention module called once per block of positions (CANINE's local attention: the
    sequence cut in blocks, each block's queries over its own keys), once per sequence of the batch
    (a loop over the batch), or on two inputs (a siamese encoder: maps of their own)."""

    def __init__(self, how: str, heads: int):
        super().__init__()
        self.how, d = how, 4 * heads
        self.emb = nn.Embedding(VOCAB, d)
        self.attn = SelfAttention(d, heads)

    def forward(self, ids, other=None):
        x = self.emb(ids)
        if self.how == "blocks":
            return torch.cat([self.attn(x[:, i : i + 4]) for i in range(0, x.shape[1], 4)], dim=1)
        if self.how == "sequences":
            return torch.cat([self.attn(x[b : b + 1]) for b in range(x.shape[0])], dim=0)
        return self.attn(x), self.attn(self.emb(other))


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 1)])
def test_an_attention_module_called_once_per_block_is_one_record_of_the_sequences(batch, heads):
    torch.manual_seed(7)
    model = Blocks("blocks", heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 12))
    (rec,) = cap.records  # not three "layers" over the first four positions, nor blocks drawn as sequences
    assert rec.exact, rec.flag
    assert not cap.notes
    assert rec.kind == "enc_self"
    # (batch, H, 12, 12): each sequence's map, every block's weights over its own keys, 0 and hidden elsewhere
    want = torch.zeros(batch, heads, 12, 12)
    allowed = torch.zeros(batch, 12, 12, dtype=torch.bool)
    for i, w in enumerate(model.attn.used):
        want[:, :, 4 * i : 4 * i + 4, 4 * i : 4 * i + 4] = w
        allowed[:, 4 * i : 4 * i + 4, 4 * i : 4 * i + 4] = True
    torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)
    assert rec.mask is not None and torch.equal(rec.mask, allowed)
    trace = cap.trace(batch - 1)
    assert trace.enc_self.shape == (1, heads, 12, 12)
    np.testing.assert_allclose(trace.enc_self[0], want[batch - 1].numpy(), atol=1e-6)


@pytest.mark.parametrize(("batch", "heads"), [(2, 2), (3, 3), (4, 1)])
def test_an_attention_module_called_once_per_sequence_is_one_record_of_the_batch(batch, heads):
    torch.manual_seed(8)
    model = Blocks("sequences", heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 6))
    (rec,) = cap.records
    assert rec.exact, rec.flag
    torch.testing.assert_close(rec.probs, torch.cat(model.attn.used), atol=1e-6, rtol=0)


def test_one_module_on_two_inputs_keeps_a_map_for_each():
    torch.manual_seed(9)
    model = Blocks("siamese", 2).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 6), _ids(3, 5)[:2])
    assert [tuple(r.probs.shape) for r in cap.records] == [(2, 2, 6, 6), (2, 2, 5, 5)]
    assert all(r.exact for r in cap.records) and not cap.notes
    for rec, want in zip(cap.records, model.attn.used, strict=True):
        torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)


class KeysTwice(nn.Module):
    """Keys that hold a sequence's positions twice, each run in order: the tokens and a later state
    at the same positions (``cat([x, h])``), or learned memory rows picked by an index made inside the
    forward (``self.mem[torch.arange(M)]``) before the tokens."""

    def __init__(self, how: str, heads: int = 2):
        super().__init__()
        d, self.how = 4 * heads, how
        self.emb, self.ff = nn.Embedding(VOCAB, d), nn.Linear(d, d)
        self.mem = nn.Parameter(torch.randn(3, d))
        self.q, self.kv = nn.Linear(d, d), nn.Linear(d, 2 * d)
        self.h = heads
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        if self.how == "twice":
            keys = torch.cat([x, torch.relu(self.ff(x))], dim=1)
        else:
            keys = torch.cat([self.mem[torch.arange(3)].expand(b, -1, -1), x], dim=1)
        q = self.q(x).view(b, n, self.h, -1).transpose(1, 2)
        k, v = (t.view(b, keys.shape[1], self.h, -1).transpose(1, 2) for t in self.kv(keys).chunk(2, dim=-1))
        w = (q @ k.transpose(-2, -1)).softmax(-1)
        self.used.append(w)
        return (w @ v).transpose(1, 2).reshape(b, n, d)


@pytest.mark.parametrize("how", ["twice", "memory"])
def test_keys_with_a_sequence_twice_or_learned_rows_picked_by_position_stay_exact(how):
    torch.manual_seed(10)
    model = KeysTwice(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 5))
    (rec,) = cap.records
    assert rec.exact, rec.flag
    assert rec.kind == "enc_self" and not cap.notes
    torch.testing.assert_close(rec.probs, model.used[0], atol=1e-6, rtol=0)
    if how == "memory":
        assert rec.key_labels == ("<mem 0>", "<mem 1>", "<mem 2>", None, None, None, None, None)


def test_blocks_of_other_lengths_are_one_map_of_each_sequence_without_a_warning():
    torch.manual_seed(7)
    model = Blocks("blocks", 2).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 10))  # blocks of 4, 4 and 2 positions
    (rec,) = cap.records
    assert rec.exact and not cap.notes
    want = torch.zeros(2, 2, 10, 10)
    for start, w in zip((0, 4, 8), model.attn.used, strict=True):
        n = w.shape[-1]
        want[:, :, start : start + n, start : start + n] = w
    torch.testing.assert_close(rec.probs, want, atol=1e-6, rtol=0)
    assert rec.mask is not None and torch.equal(rec.mask, want[:, 0] > 0)


class Pruned(nn.Module):
    """Self-attention over some of a sequence's tokens: kept by a score (DynamicViT, mixture of depths),
    in their order or in the score's; MAE's random visible subset; the CLS token dropped; or the last
    token left out (``x[:, :-1]``, which keeps the first positions in order)."""

    def __init__(self, how: str, d: int = 8):
        super().__init__()
        self.how = how
        self.emb, self.score, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 1), nn.Linear(d, 3 * d)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        if self.how in ("topk_sorted", "topk"):
            keep = self.score(x).squeeze(-1).topk(n // 2, dim=1).indices
            keep = keep.sort(dim=1).values if self.how == "topk_sorted" else keep
        elif self.how == "mae":
            keep = torch.rand(b, n).argsort(dim=1)[:, : n // 2]
        elif self.how == "no_cls":
            keep = torch.arange(1, n).expand(b, -1)
        else:  # "no_last"
            keep = torch.arange(n - 1).expand(b, -1)
        x = torch.gather(x, 1, keep[..., None].expand(-1, -1, d))
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        w = (q @ k.transpose(-2, -1) / math.sqrt(d)).softmax(-1)
        self.used.append(w[:, None])
        return w @ v


@pytest.mark.parametrize("how", ["topk_sorted", "topk", "mae", "no_cls", "no_last"])
@pytest.mark.parametrize("batch", [1, 3])
def test_attention_over_some_of_a_sequences_tokens_is_flagged(how, batch):
    """Tokens pruned or sampled differently in each sequence would show as the sequence's first ones: the
    record keeps the weights, flagged with its reason. The same places left out of every sequence (the
    last token, the CLS token) are the model's structure, like windows: exact. One sequence alone shows
    it by where its indices came from: a top-k of scores or a sort of random numbers, not ``arange``."""
    torch.manual_seed(batch)
    model = Pruned(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 8)))
    (rec,) = cap.records
    assert torch.equal(rec.probs, model.used[0])
    if how in ("no_last", "no_cls"):  # the same places in every sequence (the model's structure): exact
        assert rec.exact and not cap.notes
    else:
        assert not rec.exact and "some of a sequence's positions" in rec.flag
        assert any("some of a sequence's positions" in n for n in cap.notes)
        if batch == 1:
            assert "picked by indices the model computed from its data" in rec.flag


class Routed(nn.Module):
    """A mixture of attention experts: a router's argmax sends each token of a sequence to one expert, which
    attends over the tokens it was sent (``x[b, sel]``, one sequence at a time)."""

    def __init__(self, d: int = 8, experts: int = 2):
        super().__init__()
        self.emb, self.router = nn.Embedding(VOCAB, d), nn.Linear(d, experts)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(experts))

    def forward(self, ids):
        x = self.emb(ids)
        route = self.router(x).softmax(-1).argmax(-1)  # (B, L)
        out = torch.zeros_like(x)
        for b in range(x.shape[0]):
            for e, qkv in enumerate(self.qkv):
                sel = (route[b] == e).nonzero().squeeze(-1)
                if sel.numel() < 2 or sel.numel() == x.shape[1]:
                    continue
                q, k, v = qkv(x[b, sel]).chunk(3, dim=-1)
                out[b, sel] = (q @ k.T).softmax(-1) @ v
        return x + out


@pytest.mark.parametrize("batch", [1, 2])
def test_attention_over_tokens_a_router_sent_is_flagged_even_for_one_sequence(batch):
    torch.manual_seed(7)
    model = Routed().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 10)))
    assert cap.records and not any(r.exact for r in cap.records)
    assert all("picked by indices the model computed from its data" in r.flag for r in cap.records)


def test_indices_from_the_inputs_or_arange_and_a_whole_row_reordered_by_a_score_stay_exact():
    """Padding cut by the inputs' mask (token ids are no activation) and a beam search's reorder of whole
    rows by a top-k (every position of each row kept) pick no keys by the data. (Places picked by
    ``arange``, the model's structure, are ``no_cls`` and ``no_last`` above.)"""

    class Cut(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

        def forward(self, ids):
            x = self.emb(ids)
            keep = (ids[0] != 0).nonzero().squeeze(-1)  # one sequence, its padding cut by its ids
            x = x[:, keep]
            order = x.sum(-1).topk(x.shape[0], dim=0).indices[:, 0]  # rows reordered by a score (beams)
            x = x.index_select(0, order)
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            return (q @ k.transpose(-2, -1)).softmax(-1) @ v

    ids = torch.randint(1, VOCAB, (1, 8))
    ids[0, 5:] = 0
    model = Cut().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids.expand(3, -1))
    (rec,) = cap.records
    assert rec.exact and not cap.notes and rec.probs.shape == (3, 1, 5, 5)


@pytest.mark.parametrize("how", ["topk", "mae", "no_cls"])
def test_sdpa_over_some_of_a_sequences_tokens_is_flagged_as_the_softmax_is(how):
    torch.manual_seed(3)

    class PrunedSDPA(Pruned):
        def forward(self, ids):
            x = self.emb(ids)
            b, n, d = x.shape
            if how == "topk":
                keep = self.score(x).squeeze(-1).topk(n // 2, dim=1).indices
            elif how == "mae":
                keep = torch.rand(b, n).argsort(dim=1)[:, : n // 2]
            else:
                keep = torch.arange(1, n).expand(b, -1)
            x = torch.gather(x, 1, keep[..., None].expand(-1, -1, d))
            q, k, v = (t[:, None] for t in self.qkv(x).chunk(3, dim=-1))
            self.used.append((q, k))
            return F.scaled_dot_product_attention(q, k, v)

    model = PrunedSDPA(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (3, 8)))
    (rec,) = cap.records
    q, k = model.used[0]
    torch.testing.assert_close(
        rec.probs, (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(-1), atol=1e-6, rtol=0
    )
    assert rec.exact == (how == "no_cls")
    if how != "no_cls":
        assert "picked differently in each sequence" in rec.flag


class LookAround(nn.Module):
    """lucidrains' local-attention: heads folded into the batch, the sequence padded to whole windows
    (``F.pad(..., value=0)``), each window's keys its own and its neighbours' (``look_around``: the
    windows padded with -1 and shifted copies joined), padding masked, ``einsum("b h i e, b h j e -> b h i
    j")`` with the windows as its ``h``."""

    def __init__(self, d: int = 8, heads: int = 2, window: int = 3):
        super().__init__()
        self.heads, self.window = heads, window
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d, bias=False)

    @staticmethod
    def look_around(x, pad_value=-1):
        t = x.shape[1]
        padded = F.pad(x, (*(len(x.shape) - 2) * (0, 0), 1, 1), value=pad_value)
        return torch.cat([padded[:, i : i + t, ...] for i in range(3)], dim=2)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q, k, v = (t.reshape(b, n, self.heads, -1).permute(0, 2, 1, 3).reshape(b * self.heads, n, -1)
                   for t in self.qkv(x).chunk(3, dim=-1))  # fmt: skip
        pad = -n % self.window
        q, k, v = (F.pad(t, (0, 0, 0, pad), value=0) for t in (q, k, v))
        windows = (n + pad) // self.window
        bq, bk, bv = (t.reshape(b * self.heads, windows, self.window, -1) for t in (q, k, v))
        pos = torch.arange(n + pad).reshape(1, windows, self.window)
        bk, bv, kpos = self.look_around(bk), self.look_around(bv), self.look_around(pos)[..., None, :]
        sim = torch.einsum("b h i e, b h j e -> b h i j", bq, bk)
        sim = sim.masked_fill((kpos == -1) | (kpos >= n), -torch.finfo(sim.dtype).max)
        return torch.einsum("b h i j, b h j e -> b h i e", sim.softmax(dim=-1), bv)


@pytest.mark.parametrize("heads", [2, 3])
def test_local_windows_that_look_around_are_flagged_for_what_they_are(heads):
    """Each window's queries see their neighbours' keys too, and padded windows' cells are no head's: the
    flag says the rows of a sequence see different keys, never that the heads were split wrong (a padded
    query cell's features were read as another head's)."""
    torch.manual_seed(heads)
    model = LookAround(d=4 * heads, heads=heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 10))
    assert not any(r.exact for r in cap.records) and cap.notes
    said = " ".join(r.flag or "" for r in cap.records) + " ".join(cap.notes)
    assert "see different keys" in said and "head axis" not in said and "different heads" not in said


class AddedKV(nn.Module):
    """diffusers' AttnAddedKVProcessor (UnCLIP, DeepFloyd IF, Kandinsky UNets): the keys are a text's
    projected tokens then the image's own (``cat([add_k_proj(text), to_k(hidden)], dim=1)``), heads folded
    by ``head_to_batch_dim``, scores by ``baddbmm`` with ``beta=0``; ``causal`` masks the image's own part
    as a decoder would (fairseq's cross-self-attention)."""

    def __init__(self, causal: bool, d: int = 8, heads: int = 2):
        super().__init__()
        self.causal, self.h = causal, heads
        self.to_q, self.to_k, self.add_k_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(5, d)

    def fold(self, t):
        b, s, d = t.shape
        return t.reshape(b, s, self.h, d // self.h).permute(0, 2, 1, 3).reshape(b * self.h, s, d // self.h)

    def forward(self, hidden, text):
        q = self.fold(self.to_q(hidden))
        k = torch.cat([self.fold(self.add_k_proj(text)), self.fold(self.to_k(hidden))], dim=1)
        n, t = hidden.shape[1], text.shape[1]
        s = torch.baddbmm(torch.empty(q.shape[0], n, t + n), q, k.transpose(-1, -2), beta=0, alpha=0.5)
        if self.causal:
            future = torch.cat(
                [torch.zeros(n, t, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).triu(1)], 1
            )
            s = s.masked_fill(future, float("-inf"))
        return s.softmax(-1)


@pytest.mark.parametrize("causal", [False, True])
def test_an_images_keys_after_a_texts_are_self_attention_of_the_kind_its_mask_says(causal):
    """Several queries that see all their own keys, a text's before them: the image's self-attention,
    ``enc_self`` (it was taken for a decoder's keys after its KV cache, ``dec_self``); with a causal mask on
    its own part, ``dec_self``. The text's keys are labelled ``<ctx i>`` either way."""
    torch.manual_seed(0)
    model = AddedKV(causal).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        want = model(torch.randn(2, 6, 8), torch.randn(2, 3, 5))
    (rec,) = cap.records
    assert rec.exact and rec.kind == ("dec_self" if causal else "enc_self")
    assert rec.key_labels == ("<ctx 0>", "<ctx 1>", "<ctx 2>", *[None] * 6)
    torch.testing.assert_close(rec.probs, want.view(2, 2, 6, 9), rtol=0, atol=0)


class ContactHead(nn.Module):
    """ESM-2's contact prediction: the maps, after they weighed the values, read by a linear layer over
    the heads (``attentions.permute(0, 2, 3, 1)`` into ``nn.Linear(heads, 1)``); ``mix_first`` mixes the
    heads before the values instead (talking-heads attention after the softmax)."""

    def __init__(self, mix_first: bool, d: int = 8, heads: int = 2):
        super().__init__()
        self.mix_first, self.h = mix_first, heads
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
        self.readout = nn.Linear(heads, heads if mix_first else 1)
        self.used: torch.Tensor | None = None

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        p = (q @ k.transpose(-1, -2)).softmax(-1)
        if self.mix_first:
            p = self.readout(p.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            return p @ v
        self.used = p
        out = p @ v
        return out, self.readout(p.permute(0, 2, 3, 1)).squeeze(-1)


@pytest.mark.parametrize("mix_first", [False, True])
def test_a_readout_over_the_heads_after_the_values_leaves_the_record_exact(mix_first):
    """Read by a linear layer over the heads once they weighed the values, the maps are what the values
    were multiplied with: exact, no note (they were flagged as talking-heads attention); mixed before the
    values, flagged."""
    torch.manual_seed(0)
    model = ContactHead(mix_first).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2, 5))
    (rec,) = cap.records
    if mix_first:
        assert not rec.exact and "mixed across heads" in rec.flag and cap.notes
    else:
        assert rec.exact and not cap.notes
        torch.testing.assert_close(rec.probs, model.used, rtol=0, atol=0)


class ImageTokens(nn.Module):
    """IP-Adapter's ImageProjModel: one image embedding projected and reshaped into 4 tokens
    (``proj(image_embeds).reshape(-1, 4, d)``, then LayerNorm), the keys of the text's cross-attention."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.h = heads
        self.to_q, self.to_k = nn.Linear(d, d), nn.Linear(6, d)
        self.proj, self.norm = nn.Linear(10, 4 * 6), nn.LayerNorm(6)

    def forward(self, x, image_embeds):
        b, n, d = x.shape
        ip = self.norm(self.proj(image_embeds).reshape(-1, 4, 6))
        q = self.to_q(x).view(b, n, self.h, -1).transpose(1, 2)
        k = self.to_k(ip).view(b, 4, self.h, -1).transpose(1, 2)
        return (q @ k.transpose(-1, -2)).softmax(-1)


def test_tokens_made_from_one_vector_are_flagged_with_both_readings():
    """Rows cut from one vector's features may be heads or tokens, which lineage cannot tell apart: the
    flag says both (it named only heads split across positions, a bug the model does not have)."""
    torch.manual_seed(0)
    model = ImageTokens().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 9, 8), torch.randn(2, 10))
    assert cap.records and not cap.records[0].exact
    assert "tokens made from one vector's features" in cap.records[0].flag


class TiedRow(nn.Module):
    """The MSA Transformer's tied row attention (ESM): scores summed over the alignment's rows by one
    einsum, ``'rinhd,rjnhd->hnij'``, so the weights come out (heads, batch, i, j)."""

    def __init__(self, heads: int, d: int = 8):
        super().__init__()
        self.h, self.hd = heads, d // heads
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):  # (rows, columns, batch, d)
        r, c, b, d = x.shape
        q = self.q_proj(x).view(r, c, b, self.h, self.hd) * (self.hd**-0.5 / math.sqrt(r))
        k = self.k_proj(x).view(r, c, b, self.h, self.hd)
        v = self.v_proj(x).view(r, c, b, self.h, self.hd)
        p = torch.einsum("rinhd,rjnhd->hnij", q, k).softmax(-1)
        return torch.einsum("hnij,rjnhd->rinhd", p, v).reshape(r, c, b, d)


@pytest.mark.parametrize(("batch", "heads"), [(3, 2), (2, 2)])
def test_scores_summed_over_rows_are_flagged_and_the_flag_says_the_layout_is_a_guess(batch, heads):
    """Lineage cannot place rows whose product sums over several positions: the record is flagged, and the
    flag says the batch and head axes were read from the shape (here they are the wrong way round)."""
    torch.manual_seed(batch)
    model = TiedRow(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(4, 5, batch, 8))
    (rec,) = cap.records
    assert not rec.exact
    assert "different positions" in rec.flag and "read from the shape (a guess)" in rec.flag
    assert any("a guess" in n for n in cap.notes)


class LearnedTokens(nn.Module):
    """SAM's two-way transformer: an IoU token and mask tokens kept as ``nn.Embedding`` tables read whole
    (``torch.cat([iou_token.weight, mask_tokens.weight])``), and a class token kept in a ParameterList
    (CrossViT's one per branch), joined before the prompt tokens."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.iou_token, self.mask_tokens = nn.Embedding(1, d), nn.Embedding(2, d)
        self.cls_token = nn.ParameterList([nn.Parameter(torch.randn(1, d)), nn.Parameter(torch.randn(1, d))])
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        b = ids.shape[0]
        learned = torch.cat([self.iou_token.weight, self.mask_tokens.weight, self.cls_token[1]], dim=0)
        x = torch.cat([learned[None].expand(b, -1, -1), self.emb(ids)], dim=1)
        q, k, v = self.qkv(x).chunk(3, -1)
        return (q @ k.transpose(-1, -2) / 8**0.5).softmax(-1) @ v


def test_learned_tokens_read_from_a_modules_weight_are_labelled_by_the_module():
    """Rows of ``nn.Embedding(...).weight`` are labelled by the module that holds them, rows of a
    ParameterList by the list and the index: no two different tokens share a label."""
    torch.manual_seed(0)
    model = LearnedTokens().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (2, 3)))
    (rec,) = cap.records
    assert rec.exact
    assert rec.key_labels == (
        "<iou_token 0>",
        "<mask_tokens 0>",
        "<mask_tokens 1>",
        "<cls_token[1] 0>",
        None,
        None,
        None,
    )


class MaeDecoder(nn.Module):
    """MAE's decoder run on the encoder's latent: one learned mask token repeated into every masked patch,
    the patches put back in order by ``gather`` with ``ids_restore`` from outside, the class token joined."""

    def __init__(self, heads: int, d: int = 8, patches: int = 6):
        super().__init__()
        self.h = heads
        self.decoder_embed = nn.Linear(12, d)
        self.mask_token = nn.Parameter(torch.randn(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, patches + 1, d))
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, latent, ids_restore):
        x = self.decoder_embed(latent)
        b, _, d = x.shape
        masks = self.mask_token.repeat(b, ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], masks], dim=1)
        x_ = torch.gather(x_, dim=1, index=ids_restore.unsqueeze(-1).repeat(1, 1, d))
        x = torch.cat([x[:, :1, :], x_], dim=1) + self.pos
        q, k, v = self.qkv(x).reshape(b, -1, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4).unbind(0)
        return ((q @ k.transpose(-2, -1)) * (d // self.h) ** -0.5).softmax(-1) @ v


def test_a_learned_token_repeated_among_the_queries_is_flagged_for_that_reason():
    """Every masked patch is the same learned position, so rows cannot be placed by position: flagged, and
    the flag says why (it said the rows of a sequence saw different keys, which they do not)."""
    torch.manual_seed(0)
    model = MaeDecoder(2).eval()
    ids_restore = torch.stack([torch.randperm(6) for _ in range(2)])
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 4, 12), ids_restore)  # the class token and 3 visible patches of 6
    (rec,) = cap.records
    assert not rec.exact
    assert "repeated among the tokens" in rec.flag and "see different keys" not in rec.flag


def test_two_learned_tables_of_one_name_among_the_keys_are_labelled_by_their_paths():
    """``cat([self.enc.tok.weight, self.dec.tok.weight])``: two different tables both named ``tok`` among one
    map's keys are labelled by their paths; one table alone keeps its short label."""

    class Two(nn.Module):
        def __init__(self, both: bool):
            super().__init__()
            self.both = both
            self.enc, self.dec = (
                nn.ModuleDict({"tok": nn.Embedding(2, 8)}),
                nn.ModuleDict({"tok": nn.Embedding(2, 8)}),
            )
            self.emb, self.qkv = nn.Embedding(VOCAB, 8), nn.Linear(8, 24)

        def forward(self, ids):
            learned = [self.enc.tok.weight, self.dec.tok.weight] if self.both else [self.enc.tok.weight]
            x = torch.cat([torch.cat(learned)[None].expand(ids.shape[0], -1, -1), self.emb(ids)], dim=1)
            q, k, v = self.qkv(x).chunk(3, -1)
            return (q @ k.transpose(-1, -2)).softmax(-1) @ v

    torch.manual_seed(0)
    for both, want in (
        (True, ("<enc.tok 0>", "<enc.tok 1>", "<dec.tok 0>", "<dec.tok 1>")),
        (False, ("<tok 0>", "<tok 1>")),
    ):
        model = Two(both).eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(torch.randint(1, VOCAB, (2, 3)))
        (rec,) = cap.records
        assert rec.exact and rec.key_labels == (*want, None, None, None)


class PaddedFeatureMap(nn.Module):
    """A feature map padded to whole groups before attention over its cells (mmseg's ISA head, HaloNet):
    channels first, ``F.pad(x, (0, 0, 0, 1))`` on (B, C, H, W), or channels last as Swin pads, then the
    cells flattened into a sequence."""

    def __init__(self, channels_last: bool, heads: int):
        super().__init__()
        self.channels_last, self.h = channels_last, heads
        self.stem = nn.Conv2d(3, 4 * heads, 1)
        self.qkv = nn.Linear(4 * heads, 12 * heads)

    def forward(self, img):
        x = self.stem(img)
        if self.channels_last:
            t = F.pad(x.permute(0, 2, 3, 1), (0, 0, 0, 0, 0, 1)).flatten(1, 2)
        else:
            t = F.pad(x, (0, 0, 0, 1)).flatten(2).transpose(1, 2)
        b, n, _ = t.shape
        q, k, v = (z.view(b, n, self.h, -1).transpose(1, 2) for z in self.qkv(t).chunk(3, -1))
        self.used = (q @ k.transpose(-1, -2)).softmax(-1)
        return self.used @ v


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_feature_map_padded_channels_first_labels_each_padded_cell(batch, heads):
    """Padding a (B, C, H, W) map around its cells makes a position of its own per padded cell, as padding
    it channels last does (it was one position repeated, and the map flagged "one position is several
    queries")."""
    torch.manual_seed(0)
    img = torch.randn(batch, 3, 3, 3)
    labels = []
    for channels_last in (False, True):
        model = PaddedFeatureMap(channels_last, heads).eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(img)
        (rec,) = cap.records
        assert rec.exact and torch.equal(rec.probs, model.used) and not cap.notes
        labels.append(rec.key_labels)
    assert labels[0] == labels[1] == (None,) * 9 + ("<padding 0>", "<padding 1>", "<padding 2>")


class PerSentencePerHead(nn.Module):
    """Attention ported from numpy (Jay Alammar's walk-through): a loop over the sentences, and in each a loop
    over the heads, each head's weights a matrix of a ParameterList, each call a 2-D ``(T, T)`` softmax."""

    def __init__(self, heads: int, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.w_q, self.w_k, self.w_v = (
            nn.ParameterList(nn.Parameter(torch.randn(d, 4)) for _ in range(heads)) for _ in range(3)
        )
        self.used: list[list[torch.Tensor]] = []

    def forward(self, ids):
        outs = []
        self.used = []
        for x in self.emb(ids):  # one sentence (T, d)
            z, used = [], []
            for w_q, w_k, w_v in zip(self.w_q, self.w_k, self.w_v, strict=True):
                q, k, v = x @ w_q, x @ w_k, x @ w_v
                w = torch.softmax(q @ k.T / 2.0, dim=-1)
                used.append(w)
                z.append(w @ v)
            self.used.append(used)
            outs.append(torch.cat(z, -1))
        return torch.stack(outs)


@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 2), (2, 3), (4, 4), (3, 1)])
def test_a_loop_over_sentences_of_a_loop_over_heads_is_one_layer_of_every_head(batch, heads):
    """Each call is joined with the call at the same place in the previous sentence's calls (the last head
    of one sentence was joined to the first of the next, an exact record whose rows were different heads),
    and the heads, joined along the features per sentence, are one layer: one record (batch, heads), not a
    layer per head."""
    torch.manual_seed(batch * 10 + heads)
    model = PerSentencePerHead(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 5))
    assert len(cap.records) == 1 and cap.notes == [], (cap.records, cap.notes)
    rec = cap.records[0]
    assert rec.exact and rec.kind == "enc_self" and tuple(rec.probs.shape) == (batch, heads, 5, 5)
    want = torch.stack([torch.stack(model.used[b]) for b in range(batch)])
    torch.testing.assert_close(rec.probs, want, atol=0, rtol=0)


class SentenceLoopHeads(nn.Module):
    """A port that keeps the numpy tutorial's shapes: each sentence ``(T, d)`` in a loop, each head's
    projections a matrix of a ``ParameterList`` in a loop inside it, heads joined along the features. ``style``:
    ``"rows"`` embeds the batch once and indexes a sentence (``x[i]``); ``"each"`` embeds each sentence
    (``for s in ids: self.emb(s)``); ``"layers"`` does that with two layers per sentence. Padding is masked."""

    def __init__(self, heads: int, style: str, d: int = 12):
        super().__init__()
        self.style, self.h = style, heads
        self.emb = nn.Embedding(VOCAB, d)
        self.wq, self.wk, self.wv = (
            nn.ParameterList(nn.Parameter(torch.randn(d, 4) / 3) for _ in range(heads)) for _ in range(3)
        )
        self.wo = nn.Parameter(torch.randn(4 * heads, d) / 3)
        self.used: list[list[torch.Tensor]] = []

    def attention(self, x, keep):
        heads = []
        for wq, wk, wv in zip(self.wq, self.wk, self.wv, strict=True):
            q, k, v = x @ wq, x @ wk, x @ wv
            scores = (q @ k.transpose(0, 1)) / math.sqrt(4)
            w = torch.softmax(scores.masked_fill(~keep, -1e9), dim=-1)
            self.used[-1].append(w)
            heads.append(w @ v)
        return torch.cat(heads, dim=-1) @ self.wo

    def forward(self, ids):
        self.used = []
        out = []
        if self.style == "rows":
            x = self.emb(ids)
            for i in range(ids.shape[0]):
                self.used.append([])
                out.append(x[i] + self.attention(x[i], ids[i] != 0))
            return torch.stack(out)
        for s in ids:
            x = self.emb(s)
            for _ in range(2 if self.style == "layers" else 1):
                self.used.append([])
                x = x + self.attention(x, s != 0)
            out.append(x)
        return torch.stack(out)


@pytest.mark.parametrize("style", ["rows", "each", "layers"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 3), (2, 2), (3, 3), (4, 2), (2, 4)])
def test_heads_in_a_loop_inside_a_loop_over_sentences_are_one_layer_of_the_batch(style, batch, heads):
    """Every sentence's heads are one layer's: one record per layer (batch, heads, T, T), each sentence in
    its row, each head's map in its place, each sentence's padding masked; not a layer per head or per
    sentence. A sentence embedded in a loop (``for s in ids``) is a row of one input, read row by row."""
    torch.manual_seed(batch * 7 + heads)
    ids = _ids(batch, 6)
    ids[-1, 4:] = 0  # the last sentence padded
    model = SentenceLoopHeads(heads, style).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    layers = 2 if style == "layers" else 1
    assert len(cap.records) == layers and cap.notes == [], (cap.records, cap.notes)
    for layer, rec in enumerate(cap.records):
        assert rec.exact and rec.kind == "enc_self" and rec.flag is None
        assert tuple(rec.probs.shape) == (batch, heads, 6, 6)
        want = torch.stack([torch.stack(model.used[b * layers + layer]) for b in range(batch)])
        torch.testing.assert_close(rec.probs, want, atol=0, rtol=0)
        assert rec.mask is not None and torch.equal(rec.mask, (ids != 0)[:, None, :].expand(batch, 6, 6))


class _FullWidthHead(nn.Module):
    """One head of a ``ModuleList``: each projects the whole hidden vector (``Linear(d, d_head)``), so every
    head's queries read the same features, and its softmax is an ``nn.Softmax`` module."""

    def __init__(self, d: int, dh: int):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d, dh) for _ in range(3))
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):  # (T, d): one sentence
        w = self.softmax(self.q(x) @ self.k(x).T / math.sqrt(self.q.out_features))
        return w @ self.v(x), w


class SentenceLoopModuleHeads(nn.Module):
    """ "A transformer for one sentence" wrapped in ``for sent in ids``: a ``ModuleList`` of full-width heads,
    their outputs joined by ``torch.hstack`` (``stack_out``: the sentences' head outputs stacked right away, as
    Pulfer's ViT does) or projected first and stacked after the loop."""

    def __init__(self, heads: int, stack_out: bool, d: int = 8):
        super().__init__()
        self.stack_out = stack_out
        self.emb = nn.Embedding(VOCAB, d)
        self.heads = nn.ModuleList(_FullWidthHead(d, d // 2) for _ in range(heads))
        self.proj = nn.Linear(d // 2 * heads, d)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        outs, self.used = [], []
        for sent in ids:
            parts = [head(self.emb(sent)) for head in self.heads]
            self.used.append(torch.stack([w for _, w in parts]))
            joined = torch.hstack([o for o, _ in parts])
            outs.append(joined if self.stack_out else self.proj(joined))
        return torch.cat([o.unsqueeze(0) for o in outs])


@pytest.mark.parametrize("stack_out", [True, False])
@pytest.mark.parametrize(("batch", "heads"), [(2, 1), (2, 2), (3, 2), (4, 4), (3, 3)])
def test_full_width_heads_in_a_loop_over_sentences_are_one_layer(stack_out, batch, heads):
    """Heads that each project the whole hidden vector read the same query features, so one sentence's heads
    looked like one module called over its blocks: records straddled sentences and heads (sequence 0's
    head 1 with sequence 1's head 0, exact) and the trace drew the last map as sequence 0. Their outputs,
    joined along the features, say which maps are one sentence's heads; the sentences are rows of one input."""
    torch.manual_seed(batch * 5 + heads)
    model = SentenceLoopModuleHeads(heads, stack_out).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 5))
    assert len(cap.records) == 1 and cap.notes == [], (cap.records, cap.notes)
    rec = cap.records[0]
    assert rec.exact and rec.kind == "enc_self" and tuple(rec.probs.shape) == (batch, heads, 5, 5)
    torch.testing.assert_close(rec.probs, torch.stack(model.used), atol=0, rtol=0)
    torch.testing.assert_close(torch.as_tensor(cap.trace(0).enc_self[0].copy()), model.used[0])


class PeakyLoopHeads(nn.Module):
    """Heads as a loop over per-head matrices joined by ``torch.cat``; head 0 made so peaky that some of its
    weights are exactly 0 (as half precision gives them)."""

    def __init__(self, heads: int, sharp: float, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.wq, self.wk, self.wv = (
            nn.ParameterList(nn.Parameter(torch.randn(d, 4) * 0.3) for _ in range(heads)) for _ in range(3)
        )
        with torch.no_grad():
            self.wq[0].mul_(sharp)
        self.used: torch.Tensor | None = None

    def forward(self, ids):
        x = self.emb(ids)
        outs, maps = [], []
        for wq, wk, wv in zip(self.wq, self.wk, self.wv, strict=True):
            a = torch.softmax((x @ wq) @ (x @ wk).transpose(1, 2) / 2.0, dim=2)
            maps.append(a)
            outs.append(a @ (x @ wv))
        self.used = torch.stack(maps, 1)
        return torch.cat(outs, dim=-1)


@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 4), (4, 4)])
def test_a_saturated_head_is_still_a_head_of_its_layer(batch, heads):
    """A head whose weights are exactly 0 somewhere has a mask read from those zeros, which the other heads
    lack: the heads were left as layers of one head each. They are one layer, its mask the keys no head
    attended."""
    torch.manual_seed(batch + heads)
    model = PeakyLoopHeads(heads, sharp=300.0).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 6))
    assert model.used is not None and bool((model.used[:, 0] == 0).any())  # (head 0 saturated)
    assert len(cap.records) == 1 and cap.notes == [], (cap.records, cap.notes)
    rec = cap.records[0]
    assert rec.exact and tuple(rec.probs.shape) == (batch, heads, 6, 6)
    torch.testing.assert_close(rec.probs, model.used, atol=0, rtol=0)
    assert rec.mask_source == "zeros" and rec.mask is not None
    assert torch.equal(rec.mask, (model.used != 0).any(dim=1))


class _Stripes(nn.Module):
    """One head of attention within stripes of an R x R map: columns (``vertical``) or rows."""

    def __init__(self, vertical: bool, side: int):
        super().__init__()
        self.vertical, self.side = vertical, side
        self.used: torch.Tensor | None = None

    def forward(self, q, k, v):  # (B, N, d) each
        b, n, d = q.shape

        def stripes(t):
            t = t.view(b, self.side, self.side, d)
            return (t.transpose(1, 2) if self.vertical else t).reshape(b * self.side, self.side, d)

        q, k, v = stripes(q), stripes(k), stripes(v)
        attn = (q @ k.transpose(-2, -1) / math.sqrt(d)).softmax(-1)
        self.used = attn
        x = (attn @ v).view(b, self.side, self.side, d)
        return (x.transpose(1, 2) if self.vertical else x).reshape(b, n, d)


class CSWinBlock(nn.Module):
    """CSWin's cross-shaped windows: the channels (and heads) split into two branches, vertical and horizontal
    stripes, one head each (CSWin-T's first stage), joined by ``torch.cat`` along the features."""

    def __init__(self, side: int = 4, c: int = 8):
        super().__init__()
        self.side = side
        self.proj_in, self.qkv = nn.Linear(3, c), nn.Linear(c, 3 * c)
        self.attns = nn.ModuleList([_Stripes(True, side), _Stripes(False, side)])

    def forward(self, pixels):
        x = self.proj_in(pixels)
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, c).permute(2, 0, 1, 3)
        x1 = self.attns[0](*qkv[:, :, :, : c // 2])
        x2 = self.attns[1](*qkv[:, :, :, c // 2 :])
        return torch.cat([x1, x2], dim=2)


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_cswin_branches_of_one_head_each_are_not_heads_of_one_map(batch):
    """The two branches' outputs are joined along the features as heads' are, but their maps read other
    queries and keys (a column, a row): they were one record of two heads, window w holding column w under
    head 0 and row w under head 1, exact. Each branch is a record of its own, as with more heads a branch."""
    torch.manual_seed(batch)
    model = CSWinBlock().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 16, 3))
    assert [r.name for r in cap.records] == ["attns.0", "attns.1"], cap.records
    for rec, branch in zip(cap.records, model.attns, strict=True):
        assert rec.exact and tuple(rec.probs.shape) == (batch * 4, 1, 4, 4)
        torch.testing.assert_close(rec.probs[:, 0], branch.used, atol=0, rtol=0)
    assert not torch.equal(cap.records[0].query_positions, cap.records[1].query_positions)


class XLNetQueryStream(nn.Module):
    """XLNet's query stream, sequence-first: the queries one learned vector expanded over the positions
    (``mask_emb.expand(qlen, bsz, -1)``), projected by einsum with a ``(d, n, d_head)`` Parameter."""

    def __init__(self, heads: int, dh: int = 4):
        super().__init__()
        d = heads * dh
        self.emb = nn.Embedding(VOCAB, d)
        self.mask_emb = nn.Parameter(torch.randn(1, 1, d))
        self.q, self.k, self.v = (nn.Parameter(torch.randn(d, heads, dh) * 0.3) for _ in range(3))
        self.used: torch.Tensor | None = None

    def forward(self, ids, perm_mask):  # ids (L, B); perm_mask (L, L, B), 1 = may not see
        h = self.emb(ids)
        g = self.mask_emb.expand(ids.shape[0], ids.shape[1], -1)
        q = torch.einsum("ibh,hnd->ibnd", g, self.q)
        k = torch.einsum("ibh,hnd->ibnd", h, self.k)
        v = torch.einsum("ibh,hnd->ibnd", h, self.v)
        scores = torch.einsum("ibnd,jbnd->bnij", q, k) - 1e30 * torch.einsum("ijb->bij", perm_mask)[:, None]
        self.used = torch.softmax(scores, dim=3)
        return torch.einsum("bnij,jbnd->ibnd", self.used, v)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (1, 2), (1, 4), (2, 2), (3, 4)])
def test_queries_of_one_learned_vector_expanded_are_flagged_not_laid_out_on_the_heads(batch, heads):
    """With one sequence, the Parameter the expanded vector is multiplied by was taken for the activation
    (its rows for positions): the query axis was read as the heads, an exact (1, L, H, L) record. The queries
    are one learned vector at every position, which lineage cannot tell apart: flagged, laid out right."""
    torch.manual_seed(batch + heads)
    model = XLNetQueryStream(heads).eval()
    ids = _ids(batch, 6).T.contiguous()
    perm = torch.triu(torch.ones(6, 6), 1)[:, :, None].expand(6, 6, batch).contiguous()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, perm)
    (rec,) = cap.records
    assert not rec.exact and "one position is several queries" in rec.flag
    assert tuple(rec.probs.shape) == (batch, heads, 6, 6)
    torch.testing.assert_close(rec.probs, model.used, atol=0, rtol=0)


class SentenceList(nn.Module):
    """A batch handed over as a list of 1-D id tensors (one per sentence, as a tokenizer gives them), each
    embedded and attended alone as ``(1, T, d)``, the outputs stacked after the loop."""

    def __init__(self, heads: int, d: int = 8):
        super().__init__()
        self.h = heads
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
        self.used: list[torch.Tensor] = []

    def forward(self, sentences):
        outs, self.used = [], []
        for s in sentences:
            x = self.emb(s).unsqueeze(0)
            b, t, d = x.shape
            q, k, v = (z.reshape(b, t, self.h, d // self.h).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
            a = (q @ k.transpose(-2, -1) / math.sqrt(d // self.h)).softmax(-1)
            self.used.append(a[0])
            outs.append((a @ v).transpose(1, 2).reshape(t, d))
        return torch.stack(outs)


@pytest.mark.parametrize(("batch", "heads"), [(2, 1), (2, 2), (3, 2), (4, 4)])
def test_sentences_handed_over_as_separate_tensors_are_rows_of_one_batch(batch, heads):
    """Each sentence its own input tensor: the records were one per sentence and the trace drew the last
    sentence's map for sequence 0 (as if they were a decoder's steps). Each call read all of an input of its
    own, a different tensor each: the sentences are the batch, in the order handed over."""
    torch.manual_seed(batch + heads)
    model = SentenceList(heads).eval()
    sentences = [torch.tensor(row.tolist()) for row in _ids(batch, 5)]
    with torch.no_grad(), capture_attention(model) as cap:
        model(sentences)
    assert len(cap.records) == 1 and cap.notes == [], (cap.records, cap.notes)
    rec = cap.records[0]
    assert rec.exact and rec.kind == "enc_self" and tuple(rec.probs.shape) == (batch, heads, 5, 5)
    torch.testing.assert_close(rec.probs, torch.stack(model.used), atol=0, rtol=0)
    for b in (0, batch - 1):
        trace = cap.trace(b)
        torch.testing.assert_close(torch.from_numpy(trace.enc_self[0].copy()), model.used[b], atol=0, rtol=0)


class _Sessions(nn.Module):
    """DSIN's session interest extractor: a user's sessions handed in as tensors of their own, ``(B, L)``
    each, one shared self-attention layer called per session."""

    def __init__(self, heads: int = 2, d: int = 8):
        super().__init__()
        self.h = heads
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, *sessions):
        outs = []
        for s in sessions:
            x = self.emb(s)
            b, t, d = x.shape
            q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
            a = (q @ k.transpose(-2, -1) / math.sqrt(d // self.h)).softmax(-1)
            outs.append((a @ v).transpose(1, 2).reshape(b, t, d).mean(1, keepdim=True))
        return torch.cat(outs, 1)


@pytest.mark.parametrize("batch", [1, 2])
def test_sessions_handed_in_as_tensors_of_their_own_stay_apart(batch):
    """A user's sessions (a batch of one each, with one user) are no sentences of a batch: each session's
    call is a record of its own, not rows of one map."""
    torch.manual_seed(batch)
    model = _Sessions().eval()
    sessions = [torch.randint(1, VOCAB, (batch, 4)) for _ in range(3)]
    with torch.no_grad(), capture_attention(model) as cap:
        model(*sessions)
    assert [tuple(r.probs.shape) for r in cap.records] == [(batch, 2, 4, 4)] * 3


class GlobalFirst(nn.Module):
    """ETC's global-local attention, sequence-first: the keys are the global tokens (their own embedding
    table, looked up after the long input's) joined before the long input's tokens."""

    def __init__(self, heads: int, dh: int = 4):
        super().__init__()
        d = heads * dh
        self.h, self.dh = heads, dh
        self.tok, self.glob = nn.Embedding(VOCAB, d), nn.Embedding(4, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.used: torch.Tensor | None = None

    def fold(self, t):  # (n, B, d) -> (B*H, n, dh)
        return t.contiguous().view(t.shape[0], -1, self.dh).transpose(0, 1)

    def forward(self, ids, glob_ids):
        x, g = self.tok(ids.t()), self.glob(glob_ids.t())
        n, b, d = x.shape
        kv = torch.cat([g, x], 0)
        k, v = self.fold(self.k(kv)), self.fold(self.v(kv))
        s = torch.bmm(self.fold(self.q(x)) / math.sqrt(self.dh), k.transpose(1, 2))
        self.used = torch.softmax(s.view(b, self.h, n, -1), dim=-1)
        o = torch.bmm(self.used.view(b * self.h, n, -1), v)
        return o.view(b, self.h, n, self.dh).permute(2, 0, 1, 3).reshape(n, b, d)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_global_tokens_joined_before_the_input_are_no_rotating_cache(batch, heads):
    """Keys of two lookups in the order opposite to the lookups' read as a cache's steps read out of order (a
    rotating cache), flagged. A cache's steps are looked up in one table; these are two inputs: exact."""
    torch.manual_seed(batch + heads)
    model = GlobalFirst(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch, 6), torch.randint(0, 4, (batch, 2)))
    (rec,) = cap.records
    assert rec.exact and rec.flag is None and not cap.notes, (rec.flag, cap.notes)
    assert tuple(rec.probs.shape) == (batch, heads, 6, 8)
    torch.testing.assert_close(rec.probs, model.used, atol=0, rtol=0)
