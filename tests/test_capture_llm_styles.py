"""attnscope.core.families.capture on language-model code as its authors write it: a causal mask made
with ``.type_as(scores)`` or ``.to(scores)`` (fairseq's future mask, Diff-Transformer), differential
attention (two softmax maps per head, subtracted before the values), and Informer's ProbSparse
attention (top-u queries gathered per sequence). Each model keeps what it computed, so every record
is checked against the model itself, for several batch sizes and head counts (batch = heads too)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

D_HEAD, VOCAB = 4, 20


def _ids(batch: int, n: int = 6) -> torch.Tensor:
    ids = torch.randint(1, VOCAB, (batch, n), generator=torch.Generator().manual_seed(batch))
    ids[-1, n - 2 :] = 0  # the last sequence padded
    return ids


def _captured(model, ids):
    model.seen = []
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    return cap


class FutureMask(nn.Module):
    """fairseq: ``triu(fill_with_neg_inf(zeros(T, T)), 1).to(scores)`` (or ``.type_as(scores)``) added to
    the scores, then the key padding filled with -inf."""

    def __init__(self, heads: int, cast: str):
        super().__init__()
        self.h, self.cast = heads, cast
        self.emb, self.qkv = (
            nn.Embedding(VOCAB, heads * D_HEAD),
            nn.Linear(heads * D_HEAD, 3 * heads * D_HEAD),
        )
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        s = q @ k.transpose(-1, -2) * D_HEAD**-0.5
        future = torch.zeros(t, t).fill_(float("-inf"))
        future = future.type_as(s) if self.cast == "type_as" else future.to(s)
        s = s + torch.triu(future, 1)
        s = s.masked_fill((ids == 0)[:, None, None, :], float("-inf"))
        p = F.softmax(s, dim=-1)
        self.seen.append(p)
        return p @ v


@pytest.mark.parametrize("cast", ["type_as", "to"])
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 1)])
def test_a_causal_mask_cast_like_the_scores_is_a_mask(cast, batch, heads):
    """The scores only lend the mask their dtype: the mask is the future and the padding, the kind
    dec_self (before, the cast made the mask look like scores, and only the padding was kept)."""
    torch.manual_seed(0)
    model = FutureMask(heads, cast).eval()
    ids = _ids(batch)
    cap = _captured(model, ids)
    assert not cap.notes, cap.notes
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(rec.mask, causal & (ids != 0)[:, None, :])


class DiffAttention(nn.Module):
    """Differential attention (Ye et al. 2024): a softmax over 2H maps, viewed (B, H, 2, T, S), and
    ``w[:, :, 0] - lam * w[:, :, 1]`` multiplied with the values."""

    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(VOCAB, 2 * heads * D_HEAD)
        self.q, self.k = (nn.Linear(2 * heads * D_HEAD, 2 * heads * D_HEAD) for _ in range(2))
        self.v = nn.Linear(2 * heads * D_HEAD, heads * 2 * D_HEAD)
        self.lam = nn.Parameter(torch.tensor(0.4))
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        x = self.emb(ids)
        q = self.q(x).view(b, t, 2 * self.h, D_HEAD).transpose(1, 2)
        k = self.k(x).view(b, t, 2 * self.h, D_HEAD).transpose(1, 2)
        v = self.v(x).view(b, t, self.h, 2 * D_HEAD).transpose(1, 2)
        w = F.softmax((q @ k.transpose(-1, -2)).masked_fill((ids == 0)[:, None, None, :], -1e9), dim=-1)
        w = w.view(b, self.h, 2, t, t)
        attn = w[:, :, 0] - self.lam * w[:, :, 1]
        self.seen.append(attn)
        return attn @ v


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_differential_attention_is_flagged_not_shown_as_exact(batch, heads):
    """The values are multiplied by a difference of two heads' maps, which no softmax output is."""
    torch.manual_seed(1)
    model = DiffAttention(heads).eval()
    cap = _captured(model, _ids(batch))
    (rec,) = cap.records
    assert rec.probs.shape == (batch, 2 * heads, 6, 6)
    assert not rec.exact and "changed after the softmax" in rec.flag
    assert len(cap.notes) == 1 and "could not verify" in cap.notes[0]


def test_weights_viewed_then_only_moved_stay_exact():
    """A view of the weights that only moves them (folded to (B*H, T, T) for bmm) is no change."""

    class Folded(DiffAttention):
        def forward(self, ids):
            b, t = ids.shape
            x = self.emb(ids)
            q = self.q(x).view(b, t, 2 * self.h, D_HEAD).transpose(1, 2)
            k = self.k(x).view(b, t, 2 * self.h, D_HEAD).transpose(1, 2)
            v = self.v(x).view(b, t, 2 * self.h, D_HEAD).transpose(1, 2)
            w = F.softmax(q @ k.transpose(-1, -2), dim=-1)
            self.seen.append(w)
            return torch.bmm(w.reshape(b * 2 * self.h, t, t).float(), v.reshape(b * 2 * self.h, t, D_HEAD))

    torch.manual_seed(2)
    model = Folded(2).eval()
    cap = _captured(model, _ids(2))
    (rec,) = cap.records
    assert rec.exact and not cap.notes and torch.equal(rec.probs, model.seen[0])


class ProbSparse(nn.Module):
    """Informer's ProbSparse self-attention: the u queries with the largest sparsity measure, picked
    per sequence and head with ``Q[arange(B)[:, None, None], arange(H)[None, :, None], top]``."""

    def __init__(self, heads: int, u: int = 3):
        super().__init__()
        self.h, self.u = heads, u
        self.emb, self.qkv = (
            nn.Embedding(VOCAB, heads * D_HEAD),
            nn.Linear(heads * D_HEAD, 3 * heads * D_HEAD),
        )
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        full = q @ k.transpose(-1, -2)
        measure = full.max(-1)[0] - full.sum(-1) / t
        top = measure.topk(self.u, sorted=False)[1]  # (B, H, u)
        q_reduce = q[torch.arange(b)[:, None, None], torch.arange(self.h)[None, :, None], top, :]
        attn = torch.softmax(q_reduce @ k.transpose(-1, -2) / D_HEAD**0.5, dim=-1)
        self.seen.append(attn)
        context = v.mean(-2, keepdim=True).expand(b, self.h, t, D_HEAD).clone()
        context[torch.arange(b)[:, None, None], torch.arange(self.h)[None, :, None], top, :] = attn @ v
        return context


@pytest.mark.parametrize("batch,heads", list(itertools.product([1, 2, 3], [1, 2])))
def test_queries_picked_per_sequence_are_flagged(batch, heads):
    """The record's rows are other positions in every sequence (and in no order): no row can be
    labelled with a position, so the record is flagged, never shown as exact."""
    torch.manual_seed(3)
    model = ProbSparse(heads).eval()
    cap = _captured(model, _ids(batch, 8))
    (rec,) = cap.records
    assert rec.probs.shape == (batch, heads, 3, 8)
    assert not rec.exact and rec.flag and cap.notes


def test_a_chunk_of_queries_in_order_is_not_a_selection():
    """The last queries of a sequence over all its keys (a KV cache's step of several tokens) are a
    run of its positions in order: exact."""

    class LastQueries(ProbSparse):
        def forward(self, ids):
            b, t = ids.shape
            q, k, _ = (
                x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1)
            )
            attn = torch.softmax(q[:, :, -3:] @ k.transpose(-1, -2), dim=-1)
            self.seen.append(attn)
            return attn

    torch.manual_seed(4)
    model = LastQueries(2).eval()
    cap = _captured(model, _ids(2, 8))
    (rec,) = cap.records
    assert rec.exact and not cap.notes and torch.equal(rec.probs, model.seen[0])


def test_two_maps_added_before_the_values_are_both_flagged():
    """Two softmax maps of the same shape averaged, then multiplied with the values: neither record
    holds the weights used."""

    class Averaged(FutureMask):
        def forward(self, ids):
            b, t = ids.shape
            q, k, v = (
                x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1)
            )
            first = F.softmax(q @ k.transpose(-1, -2), dim=-1)
            second = F.softmax(k @ q.transpose(-1, -2), dim=-1)
            return ((first + second) / 2) @ v

    torch.manual_seed(5)
    cap = _captured(Averaged(2, "to").eval(), _ids(2))
    assert len(cap.records) == 2 and not any(r.exact for r in cap.records)
    assert all("combined with other weights" in r.flag for r in cap.records)


class Sinks(nn.Module):
    """GPT-OSS's attention sinks: a learned logit per head joined to the scores as one more key
    (``torch.cat([scores, sinks.reshape(1, H, 1, 1).expand(b, -1, t, -1)], dim=-1)``), the softmax, and
    the sink's column dropped before the values; ``null`` joins a constant 0 logit instead (a null
    key, "softmax plus one"). Scores from an einsum laid out (b, h, q, k) or by ``q @ k.T``."""

    def __init__(self, heads: int, how: str, first: bool = False):
        super().__init__()
        self.h, self.how, self.first = heads, how, first
        self.emb, self.qkv = (
            nn.Embedding(VOCAB, heads * D_HEAD),
            nn.Linear(heads * D_HEAD, 3 * heads * D_HEAD),
        )
        self.sinks = nn.Parameter(torch.randn(heads))
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, t, 3, self.h, D_HEAD).unbind(2)  # (b, t, h, d)
        if self.how == "einsum":
            s = torch.einsum("bqhd,bkhd->bhqk", q, k)
        else:
            s = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)
        s = s + torch.full((t, t), float("-inf")).triu(1)
        s = s.masked_fill((ids == 0)[:, None, None, :], float("-inf"))
        if self.how == "null":
            column = torch.zeros(b, self.h, t, 1)
        else:
            column = self.sinks.reshape(1, self.h, 1, 1).expand(b, -1, t, -1)
        if self.first:  # the sink's column first, dropped by ``[..., 1:]``
            w = torch.softmax(torch.cat([column, s], dim=-1), dim=-1)
            self.seen.append(w)
            return w[..., 1:] @ v.transpose(1, 2)
        w = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)
        self.seen.append(w)
        return w[..., :-1] @ v.transpose(1, 2)


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("how", ["einsum", "matmul", "null"])
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_attention_sinks_are_learned_keys_of_an_exact_map(how, batch, heads, first):
    """The map holds the sequence's keys and the sink, labelled as a learned key; the causal mask
    over the sequence's own keys makes it dec_self (the sink is seen by every query). A sink joined
    before the scores is the map's first key (it was not followed: not recorded)."""
    torch.manual_seed(6)
    model = Sinks(heads, how, first).eval()
    ids = _ids(batch)
    cap = _captured(model, ids)
    assert not cap.notes, cap.notes
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])
    label = "<null 0>" if how == "null" else "<sinks 0>"
    assert rec.key_labels == ((label, *[None] * 6) if first else (*[None] * 6, label))
    causal = torch.ones(6, 6, dtype=torch.bool).tril() & (ids != 0)[:, None, :]
    sink = torch.ones(batch, 6, 1, dtype=torch.bool)
    assert torch.equal(rec.mask, torch.cat([sink, causal] if first else [causal, sink], -1))


class HeadsThird(nn.Module):
    """DeepSeek's reference code: scores ``einsum("bshd,bthd->bsht")`` (heads at dim 2), the softmax in
    float32 cast back with ``.type_as(x)`` (a no-op in a float32 model), ``einsum("bsht,bthd->bshd")``."""

    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        self.emb, self.qkv = (
            nn.Embedding(VOCAB, heads * D_HEAD),
            nn.Linear(heads * D_HEAD, 3 * heads * D_HEAD),
        )
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        x = self.emb(ids)
        q, k, v = self.qkv(x).view(b, t, 3, self.h, D_HEAD).unbind(2)
        scores = torch.einsum("bshd,bthd->bsht", q, k) + torch.full((t, t), float("-inf")).triu(1)[:, None]
        scores = scores.softmax(dim=-1, dtype=torch.float32).type_as(x)
        self.seen.append(scores.permute(0, 2, 1, 3))
        return torch.einsum("bsht,bthd->bshd", scores, v)


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_weights_cast_to_their_own_dtype_stay_exact(batch, heads):
    torch.manual_seed(7)
    model = HeadsThird(heads).eval()
    cap = _captured(model, _ids(batch))
    assert not cap.notes, cap.notes
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])


class Linformer(nn.Module):
    """Linformer: keys and values projected along the sequence to ``k`` learned mixtures of positions,
    with lucidrains' ``einsum("bnd,nk->bkd", keys, E)`` or with an ``nn.Linear`` over the positions of
    the keys transposed (``E(K.transpose(1, 2)).transpose(1, 2)``)."""

    def __init__(self, heads: int, how: str, n: int = 6, k: int = 3):
        super().__init__()
        self.h, self.how = heads, how
        self.emb, self.qkv = (
            nn.Embedding(VOCAB, heads * D_HEAD),
            nn.Linear(heads * D_HEAD, 3 * heads * D_HEAD),
        )
        self.proj_k, self.proj_v = nn.Parameter(torch.randn(n, k)), nn.Parameter(torch.randn(n, k))
        self.lin_k, self.lin_v = nn.Linear(n, k), nn.Linear(n, k)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).chunk(3, dim=-1)
        if self.how == "einsum":
            k, v = torch.einsum("bnd,nk->bkd", k, self.proj_k), torch.einsum("bnd,nk->bkd", v, self.proj_v)
        else:
            k, v = (
                self.lin_k(k.transpose(1, 2)).transpose(1, 2),
                self.lin_v(v.transpose(1, 2)).transpose(1, 2),
            )
        q, k, v = (t.reshape(b, -1, self.h, D_HEAD).transpose(1, 2) for t in (q, k, v))
        attn = (q @ k.transpose(-1, -2) * D_HEAD**-0.5).softmax(dim=-1)
        self.seen.append(attn)
        return (attn @ v).transpose(1, 2).reshape(b, n, -1)


@pytest.mark.parametrize("how", ["einsum", "linear"])
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_keys_projected_along_the_sequence_are_pooled_positions(how, batch, heads):
    """Each key is a learned mixture of the sequence's positions: the map (B, H, n, k) is exact and
    self-attention over fewer keys, as the paper names it."""
    torch.manual_seed(8)
    model = Linformer(heads, how).eval()
    cap = _captured(model, torch.randint(1, VOCAB, (batch, 6)))
    assert not cap.notes, cap.notes
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and rec.probs.shape == (batch, heads, 6, 3)
    assert torch.equal(rec.probs, model.seen[0])
    assert rec.key_labels == ("<pooled 0>", "<pooled 1>", "<pooled 2>") and rec.query_labels is None


class StaticCache(nn.Module):
    """A static KV cache (Hugging Face's StaticCache, gpt-fast): buffers ``torch.zeros(b, H, MAX, d)``
    made in the forward, this step's keys written with ``index_copy_(2, positions, k)`` or by slice
    assignment, the whole buffer read, unfilled slots and the future masked by ``finfo.min``. A prefill,
    then single-token steps."""

    def __init__(self, heads: int, write: str, slots: int = 9):
        super().__init__()
        self.h, self.write, self.slots = heads, write, slots
        self.emb, self.qkv = (
            nn.Embedding(VOCAB, heads * D_HEAD),
            nn.Linear(heads * D_HEAD, 3 * heads * D_HEAD),
        )
        self.seen: list[torch.Tensor] = []

    def step(self, ids, positions, kc, vc):
        b, s = ids.shape
        q, k, v = (x.view(b, s, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        if self.write == "index_copy":
            kc.index_copy_(2, positions, k)
            vc.index_copy_(2, positions, v)
        else:
            kc[:, :, positions] = k
            vc[:, :, positions] = v
        allowed = torch.arange(self.slots)[None, :] <= positions[:, None]
        mask = torch.zeros(s, self.slots).masked_fill(~allowed, torch.finfo(torch.float32).min)
        w = F.softmax(q @ kc.transpose(-1, -2) * D_HEAD**-0.5 + mask, dim=-1)
        self.seen.append(w)
        return w @ vc

    def forward(self, ids):
        b, s = ids.shape
        kc, vc = torch.zeros(b, self.h, self.slots, D_HEAD), torch.zeros(b, self.h, self.slots, D_HEAD)
        self.step(ids, torch.arange(s), kc, vc)
        for t in range(2):
            self.step(ids[:, -1:], torch.tensor([s + t]), kc, vc)


@pytest.mark.parametrize("write", ["index_copy", "slice"])
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_a_static_cache_is_decoder_self_attention_over_its_slots(write, batch, heads):
    """Every step is exact dec_self over the buffer's slots; the slots not written yet are no token's
    (labelled as empty). Before, index_copy_ steps were exact but enc_self or cross, and the prefill
    was not recorded."""
    torch.manual_seed(9)
    model = StaticCache(heads, write).eval()
    cap = _captured(model, torch.randint(1, VOCAB, (batch, 5)))
    assert not cap.notes, cap.notes
    assert len(cap.records) == 3 and all(r.exact and r.kind == "dec_self" for r in cap.records)
    for rec, seen in zip(cap.records, model.seen, strict=True):
        assert torch.equal(rec.probs, seen)
    written = [5, 6, 7]
    for rec, n in zip(cap.records, written, strict=True):
        assert rec.key_labels[:n] == (None,) * n and all(
            lab.startswith("<empty") for lab in rec.key_labels[n:]
        )


class CacheBeforeTheCall(nn.Module):
    """gpt-fast's ``setup_caches`` (Hugging Face's StaticCache made by ``generate``): zeroed buffers
    ``(B, H_kv, MAX, d)`` registered before the forward, ``k_out[:, :, input_pos] = k``, grouped heads
    by ``repeat_interleave``, the whole buffer read under a causal mask by a softmax."""

    def __init__(self, heads: int, slots: int = 8, sdpa: bool = False):
        super().__init__()
        self.h, self.kv, self.slots, self.sdpa = heads, max(heads // 2, 1), slots, sdpa
        d = heads * D_HEAD
        self.emb, self.q, self.kvp = (
            nn.Embedding(VOCAB, d),
            nn.Linear(d, d),
            nn.Linear(d, 2 * self.kv * D_HEAD),
        )
        self.seen: list[torch.Tensor] = []

    def setup_caches(self, batch: int) -> None:
        self.register_buffer("k_cache", torch.zeros(batch, self.kv, self.slots, D_HEAD))
        self.register_buffer("v_cache", torch.zeros(batch, self.kv, self.slots, D_HEAD))

    def forward(self, ids, input_pos):
        b, s = ids.shape
        x = self.emb(ids)
        q = self.q(x).view(b, s, self.h, D_HEAD).transpose(1, 2)
        k, v = (t.view(b, s, self.kv, D_HEAD).transpose(1, 2) for t in self.kvp(x).chunk(2, -1))
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        keys = self.k_cache.repeat_interleave(self.h // self.kv, dim=1)
        values = self.v_cache.repeat_interleave(self.h // self.kv, dim=1)
        mask = torch.ones(self.slots, self.slots, dtype=torch.bool).tril()[input_pos]
        if self.sdpa:
            with torch._C.DisableTorchFunction():  # (the weights SDPA uses, hidden from capture)
                w = (q @ keys.transpose(-1, -2) * D_HEAD**-0.5).masked_fill(~mask, float("-inf")).softmax(-1)
            self.seen.append(w)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        w = (q @ keys.transpose(-1, -2) * D_HEAD**-0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        self.seen.append(w)
        return w @ values


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4), (2, 8)])
def test_a_cache_set_up_before_the_call_has_padding_in_its_empty_slots(batch, heads):
    """Buffers zeroed before the block held every slot as a position of an input: the prefill's map was
    over 5 tokens and 3 input rows (no trace could draw it), and with grouped heads each head read its own
    slots, flagged "heads see different keys". The slots still empty are padding, as for a buffer made in
    the forward, and the trace draws the prefill over its tokens."""
    torch.manual_seed(13)
    model = CacheBeforeTheCall(heads).eval()
    model.setup_caches(batch)
    ids = torch.randint(1, VOCAB, (batch, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, torch.arange(5))
        model(torch.randint(1, VOCAB, (batch, 1)), torch.tensor([5]))
    assert not cap.notes, cap.notes
    assert len(cap.records) == 2 and all(r.exact and r.kind == "dec_self" for r in cap.records)
    for rec, seen, n in zip(cap.records, model.seen, (5, 6), strict=True):
        assert torch.equal(rec.probs, seen)
        assert rec.key_labels[:n] == (None,) * n
        assert all(lab.startswith("<padding") for lab in rec.key_labels[n:])
    trace = cap.trace(batch - 1)
    assert trace.dec_self.shape == (1, heads, 5, 5)
    np.testing.assert_array_equal(trace.dec_self[0], model.seen[0][batch - 1, :, :, :5].numpy())


@pytest.mark.parametrize("sdpa", [False, True])
def test_a_cache_filled_before_the_call_is_labelled_and_drawn(sdpa):
    """The prompt run before the block (its keys in the buffer), one step inside: the filled slots are
    keys from outside the call (``<cache i>``), the empty ones padding. They were unlabelled, as if they
    were the step's own tokens, and no trace could draw the step; it now draws the step's token over
    itself, the cache's slots among the learned keys."""
    torch.manual_seed(14)
    model = CacheBeforeTheCall(4, sdpa=sdpa).eval()
    model.setup_caches(2)
    with torch.no_grad():
        model(torch.randint(1, VOCAB, (2, 5)), torch.arange(5))
        with capture_attention(model) as cap:
            model(torch.randint(1, VOCAB, (2, 1)), torch.tensor([5]))
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and not cap.notes
    torch.testing.assert_close(rec.probs, model.seen[-1], rtol=0, atol=1e-6)
    assert rec.key_labels == (*(f"<cache {i}>" for i in range(5)), None, "<padding 0>", "<padding 1>")
    trace = cap.trace(1)
    assert trace.dec_self.shape == (1, 4, 1, 1)
    assert trace.meta["learned_keys"]["dec_self"][:5] == [f"<cache {i}>" for i in range(5)]
    np.testing.assert_allclose(
        trace.dec_self_learned[0, :, 0, :5], model.seen[-1][1, :, 0, :5].numpy(), atol=1e-6
    )


class MemoryFromOutside(nn.Module):
    """Transformer-XL's segment recurrence: the previous segment's hidden states handed in as ``mems``,
    keys and values over ``cat([mems, x])``, queries over ``x`` alone, a causal mask past the memory."""

    def __init__(self, heads: int):
        super().__init__()
        self.h, d = heads, heads * D_HEAD
        self.emb, self.q, self.kv = nn.Embedding(VOCAB, d), nn.Linear(d, d), nn.Linear(d, 2 * d)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids, mems):
        b, s = ids.shape
        x = self.emb(ids)
        m = mems.shape[1]
        q = self.q(x).view(b, s, self.h, D_HEAD).transpose(1, 2)
        k, v = (
            t.view(b, m + s, self.h, D_HEAD).transpose(1, 2)
            for t in self.kv(torch.cat([mems, x], 1)).chunk(2, -1)
        )
        keep = torch.ones(s, m + s, dtype=torch.bool).tril(m)
        w = (q @ k.transpose(-1, -2) * D_HEAD**-0.5).masked_fill(~keep, float("-inf")).softmax(-1)
        self.seen.append(w)
        return w @ v


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_a_memory_handed_in_is_labelled_and_the_segment_drawn(batch, heads):
    """Keys past the tokens from a tensor handed in (Transformer-XL's memory) were unlabelled: a map of 5
    queries over 8 keys that no trace could draw over the 5 tokens. They are ``<ctx i>``, and the trace
    draws the segment over its tokens, the memory among the learned keys."""
    torch.manual_seed(15)
    model = MemoryFromOutside(heads).eval()
    ids, mems = torch.randint(1, VOCAB, (batch, 5)), torch.randn(batch, 3, heads * D_HEAD)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, mems)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])
    assert rec.key_labels == ("<ctx 0>", "<ctx 1>", "<ctx 2>", None, None, None, None, None)
    trace = cap.trace(batch - 1)
    assert trace.dec_self.shape == (1, heads, 5, 5)
    np.testing.assert_array_equal(trace.dec_self[0], model.seen[0][batch - 1, :, :, 3:].numpy())
    np.testing.assert_array_equal(trace.dec_self_learned[0], model.seen[0][batch - 1, :, :, :3].numpy())


class PaddedQueryRows(FutureMask):
    """ChatGLM2's ``get_masks`` with left padding: a causal mask times the padding, then
    ``m -= padding.unsqueeze(-1) - 1`` makes a padded query's row see every key."""

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        pad = (ids != 0).float()
        m = torch.ones(b, t, t).tril_() * pad.unsqueeze(1)
        m -= pad.unsqueeze(-1) - 1
        s = (q @ k.transpose(-1, -2)).masked_fill((m < 0.5).unsqueeze(1), float("-inf"))
        p = F.softmax(s, dim=-1)
        self.seen.append(p)
        return p @ v


def test_padded_query_rows_that_see_every_key_leave_a_decoder_causal():
    torch.manual_seed(10)
    model = PaddedQueryRows(2, "to").eval()
    ids = torch.randint(1, VOCAB, (3, 6))
    ids[1, :2] = 0  # left padding
    ids[2, :4] = 0
    cap = _captured(model, ids)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])


class Landmarks(nn.Module):
    """Nystromformer without its pseudo-inverse: landmarks are segment means of the queries and keys
    per head (``q.reshape(b, h, m, n // m, d).mean(-2)``); the tokens over the key landmarks, and the
    query landmarks over the tokens."""

    def __init__(self, heads: int, m: int = 3):
        super().__init__()
        self.h, self.m = heads, m
        self.emb, self.qkv = (
            nn.Embedding(VOCAB, heads * D_HEAD),
            nn.Linear(heads * D_HEAD, 3 * heads * D_HEAD),
        )
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (x.view(b, n, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        q_l = q.reshape(b, self.h, self.m, n // self.m, D_HEAD).mean(-2)
        k_l = k.reshape(b, self.h, self.m, n // self.m, D_HEAD).mean(-2)
        k1 = F.softmax(q @ k_l.transpose(-1, -2), dim=-1)
        k3 = F.softmax(q_l @ k.transpose(-1, -2), dim=-1)
        self.seen += [k1, k3]
        return k1 @ (k3 @ v)


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_landmarks_pooled_per_head_are_one_sequence_s_positions(batch, heads):
    """Every head pools the same segments: the landmarks are positions pooled from the sequence,
    shared by the heads, so both maps are exact self-attention with the landmarks labelled."""
    torch.manual_seed(11)
    model = Landmarks(heads).eval()
    cap = _captured(model, torch.randint(1, VOCAB, (batch, 6)))
    assert not cap.notes, cap.notes
    first, second = cap.records
    assert first.exact and second.exact and first.kind == second.kind == "enc_self"
    assert torch.equal(first.probs, model.seen[0]) and torch.equal(second.probs, model.seen[1])
    pooled = tuple(f"<pooled {i}>" for i in range(3))
    assert first.key_labels == pooled and second.query_labels == pooled


class PrefixLM(FutureMask):
    """A prefix LM (GLM, MPT, T5's prefix LM): ``~(tril | prefix)`` masked, so the prompt sees itself
    both ways and the rest causally; ``encoder`` masks the padded keys only (BERT: a padded row still
    sees the real keys)."""

    def __init__(self, heads: int, prefix: list[int] | None):
        super().__init__(heads, "to")
        self.prefix = prefix

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        keys = (ids != 0)[:, None, :]
        if self.prefix is None:
            allowed = keys.expand(b, t, t)
        else:
            in_prefix = torch.arange(t)[None, :] < torch.tensor(self.prefix)[:, None]  # (b, t) keys
            allowed = (torch.ones(t, t, dtype=torch.bool).tril()[None] | in_prefix[:, None, :]) & keys
        s = (q @ k.transpose(-1, -2)).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
        p = F.softmax(s, dim=-1)
        self.seen.append(p)
        return p @ v


@pytest.mark.parametrize("prefix", [[3], [2, 6], [4, 5, 3]])
def test_a_prefix_lm_is_decoder_self_attention(prefix):
    """A decoder with a bidirectional prefix, whatever each sequence's prefix (one all prefix too)."""
    torch.manual_seed(12)
    model = PrefixLM(2, prefix).eval()
    ids = torch.randint(1, VOCAB, (len(prefix), 6))
    ids[-1, 5:] = 0
    cap = _captured(model, ids)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_an_encoder_whose_every_sequence_is_padded_stays_encoder(batch):
    """Padded keys masked for every row: the padded rows see the real keys but not themselves, which
    is no prefix LM's causal part."""
    torch.manual_seed(13)
    model = PrefixLM(2, None).eval()
    ids = torch.randint(1, VOCAB, (batch, 7))
    ids[:, 4:] = 0  # every sequence padded
    cap = _captured(model, ids)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self" and torch.equal(rec.probs, model.seen[0])


class PackedPrefixLM(FutureMask):
    """Examples packed into one row (MPT's ``_apply_prefix_mask`` with ``_apply_sequence_id``, UL2 packing):
    a block-diagonal mask by sequence id, each example with a bidirectional prefix of its own; ``causal``
    False: packed encoder examples, each seeing all of itself."""

    def __init__(self, heads: int, examples: list[tuple[int, int]], causal: bool = True):
        super().__init__(heads, "to")
        self.examples, self.causal = examples, causal

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        seq_id = torch.cat([torch.full((n,), i) for i, (n, _) in enumerate(self.examples)])
        prefix = torch.cat(
            [torch.arange(n) < p for n, p in self.examples]
        )  # (t,) keys in their example's prefix
        allowed = seq_id[:, None] == seq_id[None, :]
        if self.causal:
            allowed = allowed & (torch.ones(t, t, dtype=torch.bool).tril() | prefix[None, :])
        allowed = allowed & (ids != 0)[:, None, None, :]  # a row's padding at its end: no key
        s = (q @ k.transpose(-1, -2)).masked_fill(~allowed, torch.finfo(torch.float32).min)
        p = F.softmax(s, dim=-1)
        self.seen.append(p)
        return p @ v


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "examples", [[(4, 2), (4, 2)], [(4, 4), (4, 2)], [(3, 1), (2, 2), (3, 2)], [(4, 2), (4, 0)]]
)
def test_prefix_lm_examples_packed_into_one_row_are_decoder_self_attention(examples, causal):
    """The prefix-LM rule took one prefix from position 0 of each row: two packed examples, each with a
    prefix of 2 or more tokens, were called an encoder. Packed encoder examples stay one."""
    torch.manual_seed(14)
    model = PackedPrefixLM(2, examples, causal).eval()
    ids = torch.randint(1, VOCAB, (2, sum(n for n, _ in examples)))
    ids[1, -1] = 0  # the second row's last example one token shorter, padded
    cap = _captured(model, ids)
    (rec,) = cap.records
    assert rec.exact and torch.equal(rec.probs, model.seen[0])
    assert rec.kind == ("dec_self" if causal and any(p < n for n, p in examples) else "enc_self")


class MaskedAfter(FutureMask):
    """The mask applied after the softmax and not renormalized (``att = att * tril``: a bug some
    repositories carry, and the one the mask-bug lab teaches): the weights used do not sum to 1."""

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1) * torch.tril(torch.ones(t, t))
        self.seen.append(att)
        return att @ v


class MaskedAfterThenDropout(FutureMask):
    """ "Let's build GPT"'s Head with its mask moved after the softmax: ``wei * tril``, then
    ``self.dropout(wei)`` (eval: it hands its input back), then ``wei @ v``."""

    def __init__(self, *args):
        super().__init__(*args)
        self.dropout = nn.Dropout(0.2)

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1) * torch.tril(torch.ones(t, t))
        self.seen.append(att)
        return self.dropout(att) @ v


@pytest.mark.parametrize("dropout", [False, True])
def test_weights_masked_after_the_softmax_keep_that_mask(dropout):
    torch.manual_seed(14)
    model = (MaskedAfterThenDropout if dropout else MaskedAfter)(2, "to").eval()
    cap = _captured(model, torch.randint(1, VOCAB, (2, 5)))
    (rec,) = cap.records
    assert rec.exact and torch.equal(rec.probs, model.seen[0])  # the weights as used, rows not summing to 1
    assert rec.mask_source == "multiplied" and rec.kind == "dec_self"
    assert torch.equal(rec.mask, torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5))


@pytest.mark.parametrize("n", [2, 3])
def test_a_causal_mask_over_two_tokens_is_causal(n):
    """A causal mask's last row sees every key; over two tokens it is the only row that sees an
    earlier key, and it still counts (rows that see every key do not decide whether a row sees
    ahead, but they show the earlier keys)."""
    torch.manual_seed(15)
    model = MaskedAfter(2, "to").eval()
    cap = _captured(model, torch.randint(1, VOCAB, (2, n)))
    (rec,) = cap.records
    assert rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])


class PrefixTuned(nn.Module):
    """P-tuning v2 / prefix tuning: learned per-layer key and value prefixes from an ``nn.Embedding`` over
    ``prefix_tokens = torch.arange(P)`` (a plain attribute, a buffer, or made in the forward; or through
    peft's prefix projection), viewed and permuted into ``past_key_values`` and joined before each layer's
    keys of a bidirectional encoder."""

    def __init__(self, heads: int, how: str, prefix: int = 3, layers: int = 2):
        super().__init__()
        self.h, self.how, self.p, self.n = heads, how, prefix, layers
        d = heads * D_HEAD
        self.emb = nn.Embedding(VOCAB, d)
        self.prefix_encoder: nn.Module = nn.Embedding(prefix, layers * 2 * d)
        if how == "projection":
            self.prefix_encoder = nn.Sequential(nn.Embedding(prefix, d), nn.Linear(d, d), nn.Tanh(),
                                                nn.Linear(d, layers * 2 * d))  # fmt: skip
        if how == "buffer":
            self.register_buffer("prefix_tokens", torch.arange(prefix))
        else:
            self.prefix_tokens = torch.arange(prefix)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        tokens = torch.arange(self.p) if self.how == "in_forward" else self.prefix_tokens
        pkv = self.prefix_encoder(tokens.unsqueeze(0).expand(b, -1))
        pkv = pkv.view(b, self.p, self.n * 2, self.h, D_HEAD).permute([2, 0, 3, 1, 4]).split(2)
        x = self.emb(ids)
        for i, qkv in enumerate(self.qkv):
            q, k, v = (y.view(b, t, self.h, D_HEAD).transpose(1, 2) for y in qkv(x).chunk(3, -1))
            k, v = torch.cat([pkv[i][0], k], dim=2), torch.cat([pkv[i][1], v], dim=2)
            w = (q @ k.transpose(-1, -2) * D_HEAD**-0.5).softmax(-1)
            self.seen.append(w)
            x = x + (w @ v).transpose(1, 2).reshape(b, t, -1)
        return x


@pytest.mark.parametrize("how", ["attribute", "buffer", "in_forward", "projection"])
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_a_prefix_from_an_embedding_over_arange_is_learned_keys(how, batch, heads):
    """An embedding over ``arange(P)`` was taken for tokens: the prefix keys were a cache of earlier
    positions (``dec_self``, unlabelled) and later layers were flagged with a false reason. They are the
    embedding's rows, learned keys as a parameter's prefix is, and the encoder stays ``enc_self``."""
    torch.manual_seed(20)
    model = PrefixTuned(heads, how).eval()
    cap = _captured(model, torch.randint(1, VOCAB, (batch, 5)))
    assert not cap.notes, cap.notes
    assert len(cap.records) == 2
    for rec, seen in zip(cap.records, model.seen, strict=True):
        assert rec.exact and rec.kind == "enc_self" and torch.equal(rec.probs, seen)
        assert rec.key_labels == (
            "<prefix_encoder 0>",
            "<prefix_encoder 1>",
            "<prefix_encoder 2>",
            *(None,) * 5,
        )
    assert cap.trace(batch - 1).enc_self.shape == (2, heads, 5, 5)


class NarrowCopyCache(nn.Module):
    """Medusa's and EAGLE's KV cache: a buffer made in the forward, this call's keys copied into a slice
    of it (``data.narrow(2, current_length, n).copy_(k)``), the filled part read back with
    ``torch.narrow``; a causal softmax over it."""

    def __init__(self, heads: int, slots: int = 12):
        super().__init__()
        self.h, self.slots = heads, slots
        d = heads * D_HEAD
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (x.view(b, t, self.h, D_HEAD).transpose(1, 2) for x in self.qkv(self.emb(ids)).chunk(3, -1))
        kd, vd = torch.zeros(b, self.h, self.slots, D_HEAD), torch.zeros(b, self.h, self.slots, D_HEAD)
        kd.narrow(2, 0, t).copy_(k)
        vd.narrow(2, 0, t).copy_(v)
        keys, values = torch.narrow(kd, 2, 0, t), torch.narrow(vd, 2, 0, t)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        w = (q @ keys.transpose(2, 3) * D_HEAD**-0.5).masked_fill(~causal, float("-inf")).softmax(-1)
        self.seen.append(w)
        return w @ values


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_keys_copied_into_a_slice_of_a_buffer_are_followed(batch, heads):
    """``copy_`` into a slice of the buffer was not followed as a write of the keys: the map was flagged
    "the product multiplies features of different positions", though exact. It is followed as
    ``buf[:, :, a:b] = k`` is."""
    torch.manual_seed(22)
    model = NarrowCopyCache(heads).eval()
    cap = _captured(model, torch.randint(1, VOCAB, (batch, 5)))
    assert not cap.notes, cap.notes
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])


class LearnedSos(nn.Module):
    """A causal language model over a learned start token joined before its inputs (AudioLDM2's projection
    model, soft prompts): ``cat([sos.expand(B, 1, d), x], 1)``, then GPT-2's ``torch.where(bias, w, min)``."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.h = heads
        self.sos = nn.Parameter(torch.randn(1, 1, d))
        self.emb, self.qkv = nn.Embedding(50, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        x = self.emb(ids)
        x = torch.cat([self.sos.expand(x.shape[0], -1, -1), x], dim=1)
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).split(d, dim=2))
        w = q @ k.transpose(-1, -2)
        bias = torch.ones(n, n, dtype=torch.bool).tril()
        w = torch.where(bias, w, torch.finfo(w.dtype).min).softmax(-1)
        return w @ v


def test_a_causal_model_over_a_learned_start_token_is_decoder_self_attention():
    """The learned token is a query and a key of the sequence: its own queries over its own keys are
    causal, so the kind is dec_self (it was enc_self: the learned key's column was left out, not its row)."""
    torch.manual_seed(0)
    model = LearnedSos().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, 50, (2, 5)))
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self"
    assert rec.key_labels == ("<sos 0>", *[None] * 5) and rec.query_labels == ("<sos 0>", *[None] * 5)


class TokenShift(nn.Module):
    """Keys (or the whole input) mixed with the previous token's, the shifted operand first: FoX-Pro's KV-shift
    ``0.3 * F.pad(k, (0, 0, 1, -1)) + 0.7 * k``, ``torch.lerp(shifted, k, w)``, and x-transformers'
    ``shift_tokens`` (feature chunks shifted by -1, 0 and +1, joined)."""

    def __init__(self, style: str, d: int = 8):
        super().__init__()
        self.style = style
        self.emb = nn.Embedding(VOCAB, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        t = x.shape[1]
        if self.style == "chunks":
            segs = x.split(x.shape[-1] // 4, dim=-1)
            shifted = [F.pad(s, (0, 0, a, -a)) if a else s for s, a in zip(segs[:3], (-1, 0, 1), strict=True)]
            x = torch.cat((*shifted, *segs[3:]), dim=-1)
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.style == "add":
            k = 0.3 * F.pad(k, (0, 0, 1, -1)) + 0.7 * k
        elif self.style == "lerp":
            k = torch.lerp(F.pad(k, (0, 0, 1, -1)), k, 0.7)
        s = q @ k.transpose(-1, -2) / 8**0.5
        if self.style != "chunks":
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        w = s.softmax(-1)
        self.seen.append(w)
        return w @ v


@pytest.mark.parametrize("style", ["add", "lerp", "chunks"])
def test_a_token_shift_keeps_each_row_at_its_own_token(style):
    """Row j of a sum with the previous token's features is token j: the record's keys are the sequence's
    positions in order (not moved by one, the first a padding key), so the causal map stays dec_self and the
    trace draws it."""
    torch.manual_seed(3)
    model = TokenShift(style).eval()
    ids = torch.randint(1, VOCAB, (2, 5))
    cap = _captured(model, ids)
    (rec,) = cap.records
    assert rec.exact and not cap.notes, cap.notes
    assert torch.equal(rec.probs[:, 0], model.seen[0])
    assert rec.key_labels is None and torch.equal(rec.key_positions, rec.query_positions)
    assert rec.kind == ("enc_self" if style == "chunks" else "dec_self")
    assert rec.kind in cap.trace(0).kinds


class LatentKeys(nn.Module):
    """Hugging Face's DeepSeek-V2/V3 eager attention assembles its query and key states in a tensor made by
    ``k_pe.new_empty(...)``, the heads' own part and the one rotary key head shared by all written in by slice
    (broadcast over the heads)."""

    def __init__(self, heads: int, d: int = 8):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(VOCAB, d)
        self.q, self.k_nope, self.k_pe = nn.Linear(d, 6 * heads), nn.Linear(d, 4 * heads), nn.Linear(d, 2)
        self.v = nn.Linear(d, 4 * heads)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, 6).transpose(1, 2)
        k_nope = self.k_nope(x).view(b, n, self.h, 4).transpose(1, 2)
        k_pe = self.k_pe(x).view(b, n, 1, 2).transpose(1, 2)
        key_states = k_pe.new_empty(b, self.h, n, 6)
        key_states[:, :, :, :4] = k_nope
        key_states[:, :, :, 4:] = k_pe
        s = (q @ key_states.transpose(2, 3)).masked_fill(
            torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")
        )
        w = s.softmax(-1)
        self.seen.append(w)
        return w @ self.v(x).view(b, n, self.h, 4).transpose(1, 2)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_key_states_assembled_in_a_new_empty_tensor_are_followed(batch, heads):
    """``new_empty`` made a tensor tagged with ``k_pe``'s lineage and no codes: every layer was flagged "lineage
    lost". It is a new buffer, as ``torch.empty``: the slices written in carry their positions."""
    torch.manual_seed(heads)
    model = LatentKeys(heads).eval()
    cap = _captured(model, torch.randint(1, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert rec.exact and not cap.notes, cap.notes
    assert torch.equal(rec.probs, model.seen[0]) and rec.kind == "dec_self"


class PagedCache(nn.Module):
    """vLLM's and nano-vllm's paged KV cache: keys written through a view of the cache buffer
    (``key_cache.view(-1, heads, d)[slot_mapping] = k``), then read back by blocks (a block table)."""

    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(VOCAB, 8)
        self.q, self.k, self.v = nn.Linear(8, 4 * heads), nn.Linear(8, 4 * heads), nn.Linear(8, 4 * heads)
        self.register_buffer("k_cache", torch.zeros(6, 2, heads, 4))  # (blocks, block size, heads, d)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):  # one packed sequence of tokens
        x = self.emb(ids)
        n = x.shape[0]
        q, k, v = (lin(x).view(n, self.h, 4) for lin in (self.q, self.k, self.v))
        self.k_cache.view(-1, self.h, 4)[torch.arange(n) + 2] = k
        keys = self.k_cache[torch.tensor([1, 2, 3])].view(-1, self.h, 4)[:n]
        w = torch.einsum("qhd,khd->hqk", q, keys).masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        w = w.softmax(-1)
        self.seen.append(w)
        return torch.einsum("hqk,khd->qhd", w, v)


@pytest.mark.parametrize("heads", [1, 2])
def test_keys_written_through_a_view_of_the_cache_are_read_back_as_the_tokens(heads):
    """The write into the view left the buffer untagged: its blocks read back as positions of their own, the
    causal self-attention recorded as cross-attention (one head) or flagged with a wrong reason (two)."""
    torch.manual_seed(heads)
    model = PagedCache(heads).eval()
    cap = _captured(model, torch.randint(1, VOCAB, (5,)))
    (rec,) = cap.records
    assert rec.exact and not cap.notes, (rec.flag, cap.notes)
    assert rec.kind == "dec_self" and torch.equal(rec.probs[0], model.seen[0])
    assert torch.equal(rec.key_positions, rec.query_positions)


class PagedPrefill(PagedCache):
    """The same cache over a chunked prefill: the prompt's first chunk in one call, its rest in the next, whose
    keys are the first chunk's (read back from the cache) and its own."""

    def forward(self, ids):
        chunks, outs, done = (ids[:3], ids[3:]), [], 0
        for chunk in chunks:
            x = self.emb(chunk)
            n = x.shape[0]
            q, k, v = (lin(x).view(n, self.h, 4) for lin in (self.q, self.k, self.v))
            self.k_cache.view(-1, self.h, 4)[torch.arange(done, done + n) + 2] = k
            done += n
            keys = self.k_cache[torch.tensor([1, 2, 3])].view(-1, self.h, 4)[:done]
            w = torch.einsum("qhd,khd->hqk", q, keys)
            w = w.masked_fill(torch.ones(n, done).triu(done - n + 1).bool(), float("-inf")).softmax(-1)
            self.seen.append(w)
            outs.append(torch.einsum("hqk,khd->qhd", w, keys))
        return outs


@pytest.mark.parametrize("heads", [1, 2])
def test_a_chunked_prefill_through_a_paged_cache_reads_the_first_chunk_as_past_keys(heads):
    """The second chunk's keys: the first chunk's, which the previous call wrote through a view of the buffer,
    then its own. A fresh view of the buffer in the next call reads what the last one wrote."""
    torch.manual_seed(heads)
    model = PagedPrefill(heads).eval()
    cap = _captured(model, torch.randint(1, VOCAB, (5,)))
    first, second = cap.records
    assert first.exact and second.exact and not cap.notes, cap.notes
    assert (first.kind, second.kind) == ("dec_self", "dec_self")
    assert torch.equal(second.probs[0], model.seen[1])
    assert second.key_positions[0, :3].tolist() == first.query_positions[0].tolist()
    assert second.key_positions[0, 3:].tolist() == second.query_positions[0].tolist()


class ScatterCache(nn.Module):
    """mistral-src's reference: keys written into a preallocated cache with ``scatter_`` along the slot dim, the
    index ``pos[None, :, None, None].repeat(b, 1, heads, d)`` (one slot per position for all heads and features)."""

    def __init__(self, heads: int = 2):
        super().__init__()
        self.h = heads
        self.emb = nn.Embedding(VOCAB, 4 * heads)
        self.q, self.k = nn.Linear(4 * heads, 4 * heads), nn.Linear(4 * heads, 4 * heads)
        self.register_buffer("cache_k", torch.zeros(3, 8, heads, 4))
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        b, n = ids.shape
        x = self.emb(ids)
        q, k = self.q(x).view(b, n, self.h, 4), self.k(x).view(b, n, self.h, 4)
        pos = torch.arange(n)
        self.cache_k[:b].scatter_(dim=1, index=pos[None, :, None, None].repeat(b, 1, self.h, 4), src=k)
        keys = self.cache_k[:b, :n]
        s = q.transpose(1, 2) @ keys.permute(0, 2, 3, 1)
        w = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        self.seen.append(w)
        return w


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_keys_written_into_a_cache_by_scatter_are_the_tokens(batch):
    """``scatter_`` was not followed: the keys read back from the cache were the buffer's own positions and the
    map was flagged ("the product multiplies features of different positions")."""
    torch.manual_seed(batch)
    model = ScatterCache().eval()
    cap = _captured(model, torch.randint(1, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert rec.exact and not cap.notes, (rec.flag, cap.notes)
    assert rec.kind == "dec_self" and torch.equal(rec.probs, model.seen[0])
    assert torch.equal(rec.key_positions, rec.query_positions)
