"""Capture on attention with the bugs people write into their own masks: the record shows what the model
really computed, with the mask it really applied, and the kind that mask says.

- A padding mask broadcast over the queries instead of the keys (``am[:, None, :, None]``, a (B, L, 1)
  mask on single-head scores): whole rows masked, no triangle. It is an encoder's self-attention, not
  a causal one.
- Additive float masks handed to ``nn.MultiheadAttention`` with a finite very negative value
  (``(1 - mask) * -1e9``, ``triu(ones, 1) * -1e4``): the keys they hide are masked in the record, and a
  causal one makes the layer a decoder's self-attention whatever its module is called.
- A (B·H, L, L) ``attn_mask`` built with ``repeat`` where ``repeat_interleave`` was meant: each head
  masked with another sequence's keys. The record says its heads' masks differ and keeps what every
  head may see.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

VOCAB = 30


def _batch(batch: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(1, VOCAB, (batch, n), generator=g)
    keep = torch.ones(batch, n, dtype=torch.long)
    for b in range(batch):
        keep[b, n - 2 * (b % 3) :] = 0
    return ids.masked_fill(keep == 0, 0), keep


class QueryPadded(nn.Module):
    """A hand-written encoder layer whose padding mask hides query rows, not keys (a common bug)."""

    def __init__(self, heads: int, single: bool):
        super().__init__()
        d, self.h, self.single = 4 * heads, heads, single
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.used: list[torch.Tensor] = []

    def forward(self, ids, keep):
        x = self.emb(ids)
        b, n, d = x.shape
        if self.single:  # one head: bmm, a (B, L, 1) mask
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            s = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
            w = F.softmax(s.masked_fill(keep.unsqueeze(-1) == 0, -1e9), dim=-1)
            self.used.append(w[:, None])
            return torch.bmm(w, v)
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        s = q @ k.transpose(-2, -1) / math.sqrt(d // self.h)
        w = s.masked_fill(keep[:, None, :, None] == 0, -1e9).softmax(-1)  # meant: keep[:, None, None, :]
        self.used.append(w)
        return (w @ v).transpose(1, 2).reshape(b, n, d)


@pytest.mark.parametrize(
    ("batch", "heads", "single"), [(2, 2, False), (3, 1, False), (4, 4, False), (3, 1, True)]
)
def test_a_padding_mask_over_the_queries_is_no_causal_mask(batch, heads, single):
    torch.manual_seed(0)
    model = QueryPadded(heads, single).eval()
    ids, keep = _batch(batch, 7)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, keep)
    (rec,) = cap.records
    assert rec.exact, rec.flag
    assert rec.kind == "enc_self"
    torch.testing.assert_close(rec.probs, model.used[0], atol=1e-6, rtol=0)
    want = (keep[:, :, None] == 1).expand(batch, 7, 7)  # the rows kept see every key; the others none
    assert torch.equal(rec.mask, want)


class FloatMasked(nn.Module):
    """``nn.MultiheadAttention`` given additive float masks of a finite very negative value."""

    def __init__(self, heads: int, how: str):
        super().__init__()
        d, self.how = 4 * heads, how
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(nn.MultiheadAttention(d, heads, batch_first=True) for _ in range(2))

    def forward(self, ids, keep):
        x = self.emb(ids)
        n = ids.shape[1]
        kpm = attn_mask = None
        if self.how == "padding":
            kpm = (1.0 - keep.float()) * -1e9
        else:
            attn_mask = torch.triu(torch.ones(n, n), 1) * (-1e4 if self.how == "causal_1e4" else -1e9)
        for block in self.blocks:
            x = x + block(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=False)[0]
        return x


@pytest.mark.parametrize("how", ["padding", "causal", "causal_1e4"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_finite_float_masks_of_multihead_attention_are_masks(how, batch, heads):
    torch.manual_seed(1)
    model = FloatMasked(heads, how).eval()
    ids, keep = _batch(batch, 6)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, keep)
    assert len(cap.records) == 2
    for rec in cap.records:
        assert rec.exact, rec.flag
        if how == "padding":
            want = (keep[:, None, :] == 1).expand(batch, 6, 6)
            assert rec.kind == "enc_self"
        else:
            want = torch.ones(6, 6, dtype=torch.bool).tril().expand(batch, 6, 6)
            assert rec.kind == "dec_self"  # the mask says so; "blocks" names no decoder
        assert torch.equal(rec.mask, want)
        assert bool((rec.probs.masked_fill(want[:, None], 0) == 0).all())  # no weight where it says masked


class RepeatedMask(nn.Module):
    """A (B·H, L, L) attn_mask made with ``repeat(H, 1, 1)`` (meant: ``repeat_interleave(H, 0)``)."""

    def __init__(self, heads: int, interleave: bool):
        super().__init__()
        d, self.h, self.interleave = 4 * heads, heads, interleave
        self.emb = nn.Embedding(VOCAB, d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.used: list[torch.Tensor] = []

    def forward(self, ids, keep):
        x = self.emb(ids)
        hide = (keep == 0)[:, None, :].expand(-1, ids.shape[1], -1)  # (B, L, L), True = hidden
        m = hide.repeat_interleave(self.h, 0) if self.interleave else hide.repeat(self.h, 1, 1)
        out, w = self.attn(x, x, x, attn_mask=m, average_attn_weights=False)
        self.used.append(w)
        return out


@pytest.mark.parametrize("interleave", [True, False])
def test_a_mask_repeated_over_the_heads_in_the_wrong_order_shows_its_heads_differ(interleave):
    torch.manual_seed(2)
    batch = heads = 2
    model = RepeatedMask(heads, interleave).eval()
    ids, keep = _batch(batch, 7)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, keep)
    (rec,) = cap.records
    assert rec.exact, rec.flag
    torch.testing.assert_close(rec.probs, model.used[0], atol=1e-6, rtol=0)
    per_head = (keep == 1)[:, None, None, :].expand(batch, heads, 7, 7)
    if not interleave:  # head h of every sequence used sequence h's keys
        per_head = per_head.permute(1, 0, 2, 3)
    assert rec.head_masks_differ == (not interleave)
    assert torch.equal(rec.mask, per_head.all(dim=1))
    assert bool((rec.probs.masked_fill(per_head, 0) == 0).all())


def test_heads_masked_differently_travel_in_the_trace_and_are_told_in_one_sentence():
    from attnscope.dashboard import model_facts

    torch.manual_seed(2)
    ids, keep = _batch(2, 7)
    for interleave in (True, False):
        model = RepeatedMask(2, interleave).eval()
        with torch.no_grad(), capture_attention(model) as cap:
            model(ids, keep)
        trace = cap.trace(0, src_tokens=[str(i) for i in ids[0].tolist()])
        if interleave:
            assert cap.head_masks_differ() == {} and "head_masks_differ" not in trace.meta
            assert model_facts.head_masks_note(trace) is None
        else:
            assert cap.head_masks_differ() == {"enc_self": ["attn"]}
            assert trace.meta["head_masks_differ"] == {"enc_self": ["attn"]}
            note = model_facts.head_masks_note(trace)
            assert "encoder self-attention: attn" in note.lower() and "repeat_interleave" in note
    for bad in ("attn", ["attn"], {"enc_self": "attn"}, {"nonsense": ["attn"]}, {"enc_self": []}, None, 3):
        trace.meta["head_masks_differ"] = bad  # what a file from outside may say
        assert model_facts.head_masks_note(trace) is None


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize(("bias_kv", "padding"), [(False, False), (False, True), (True, True)])
def test_multihead_attention_on_one_unbatched_sequence(batch_first, bias_kv, padding):
    """``nn.MultiheadAttention`` called on one (L, E) sequence, no batch axis: one record of one sequence
    (it used to leave an internal error among the notes and no record)."""
    torch.manual_seed(3)
    m = nn.MultiheadAttention(8, 2, batch_first=batch_first, add_bias_kv=bias_kv).eval()
    x = torch.randn(5, 8)
    kpm = torch.tensor([False, False, False, True, True]) if padding else None
    with torch.no_grad(), capture_attention(m) as cap:
        _, w = m(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
    (rec,) = cap.records
    assert not cap.notes and rec.exact
    torch.testing.assert_close(rec.probs, w[None], atol=1e-6, rtol=0)
    if padding:
        assert torch.equal(rec.mask[0, 0, :5], ~kpm)


class PerQueryPadded(nn.Module):
    """Self-attention with a padding mask given per query, ``(B, 1, L, L)`` (as SDPA's bool ``attn_mask`` is
    often built), optionally with a causal triangle or a bidirectional prefix (a prefix LM)."""

    def __init__(self, heads: int, sdpa: bool, mask: str):
        super().__init__()
        d, self.h, self.sdpa, self.mask = 4 * heads, heads, sdpa, mask
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.used: list[torch.Tensor] = []

    def forward(self, ids, keep):
        b, n = ids.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, dim=-1))
        allowed = keep[:, None, None, :].expand(b, 1, n, n)
        if self.mask != "padding":
            tri = torch.ones(n, n, dtype=torch.bool).tril()
            if self.mask == "prefix":  # the first two positions see each other
                tri[:2, :2] = True
            allowed = allowed & tri
        allowed = allowed.contiguous()
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
        w = s.softmax(-1)
        self.used.append(w)
        return w @ v


@pytest.mark.parametrize("sdpa", [False, True])
@pytest.mark.parametrize("lengths", [(7, 1), (5, 3, 1), (1, 6, 4)])
@pytest.mark.parametrize("mask", ["padding", "causal", "prefix"])
def test_a_sequence_of_one_token_in_a_padded_batch_leaves_the_kind_to_the_others(sdpa, lengths, mask):
    # A one-token sequence's padded rows each see key 0 and not themselves. That is no triangle: a padded
    # encoder batch holding one stays enc_self; a causal or prefix mask over the same batch is dec_self.
    torch.manual_seed(0)
    n = max(lengths)
    keep = torch.arange(n)[None] < torch.tensor(lengths)[:, None]
    ids = torch.randint(1, VOCAB, (len(lengths), n)).masked_fill(~keep, 0)
    model = PerQueryPadded(2, False, mask).eval()
    with torch.no_grad():
        model(ids, keep)  # the weights, as a softmax the model writes (SDPA's are the same)
    model.sdpa = sdpa
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, keep)
    (rec,) = cap.records
    assert rec.exact and not cap.notes
    assert rec.kind == ("enc_self" if mask == "padding" else "dec_self")
    real = keep[:, :, None] & keep[:, None, :]  # rows of real tokens: the model's weights there
    assert torch.allclose(rec.probs.masked_fill(~real[:, None], 0), model.used[0].masked_fill(~real[:, None], 0),
                          atol=1e-6)  # fmt: skip


class SASRec(nn.Module):
    """SASRec's attention as its TensorFlow code is ported: a causal mask by ``where`` with a large finite
    value over a ``tril`` built from ``ones_like(scores[0])``, a softmax, then the weights multiplied by a
    0/1 mask of the real query rows (left-padded item histories), not renormalized."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d, padding_idx=0)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.used: list[torch.Tensor] = []

    def forward(self, items):
        x = self.emb(items)
        s = self.q(x) @ self.k(x).transpose(1, 2) / math.sqrt(x.shape[-1])
        tril = torch.tril(torch.ones_like(s[0])).unsqueeze(0).repeat(s.shape[0], 1, 1)
        s = torch.where(tril == 0, torch.ones_like(s) * (-(2**32) + 1), s)
        w = torch.softmax(s, dim=-1)
        w = w * (items != 0).float().unsqueeze(-1).repeat(1, 1, s.shape[-1])  # padded query rows: 0
        self.used.append(w[:, None])
        return w @ self.v(x)


@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_a_query_mask_multiplied_after_a_causal_softmax_keeps_the_causal_mask(batch):
    torch.manual_seed(batch)
    items = torch.randint(1, VOCAB, (batch, 6))
    for b in range(batch):
        items[b, : b % 3] = 0  # left padding
    model = SASRec().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(items)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self" and not cap.notes
    assert torch.equal(rec.probs, model.used[0])
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(rec.mask, causal & (items != 0)[:, :, None])


class QueryAxisBug(nn.Module):
    """The weights summed over the queries instead of the keys: ``einsum("bhqk,bhqd->bhkd", w, v)`` or
    ``(v.mT @ w).mT``. Output row k is the sum over q of ``w[q, k] v[q]``: the map used is ``w``'s transpose,
    so a record of ``w``'s rows (each summing to 1) would be a plausible, wrong picture."""

    def __init__(self, how: str, heads: int = 2, d: int = 8):
        super().__init__()
        self.how, self.h = how, heads
        self.emb, self.q, self.k, self.v = (
            nn.Embedding(VOCAB, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
        )

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = (f(x).view(b, n, self.h, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        w = torch.einsum("bhqd,bhkd->bhqk", q, k).softmax(-1)
        y = torch.einsum("bhqk,bhqd->bhkd", w, v) if self.how == "einsum" else (v.mT @ w).mT
        return y.transpose(1, 2).reshape(b, n, d)


@pytest.mark.parametrize("how", ["einsum", "matmul"])
@pytest.mark.parametrize("batch", [1, 2])
def test_weights_summed_over_the_queries_are_flagged(how, batch):
    torch.manual_seed(batch)
    model = QueryAxisBug(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert not rec.exact and "another axis than the one they were last normalized over" in rec.flag
    assert any("another axis than the one they were last normalized over" in n for n in cap.notes)


def test_a_softmax_without_a_dim_takes_torchs_implicit_one():
    """``F.softmax(q @ k.T)`` on one unbatched sequence: torch's implicit dim for 2-D input is 1, the keys;
    a correct attention, recorded exactly (it is no softmax over the whole tensor)."""

    class NoDim(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
            self.used: list[torch.Tensor] = []

        def forward(self, ids):
            q, k, v = self.qkv(self.emb(ids)).chunk(3, dim=-1)
            w = F.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=None)
            self.used.append(w)
            return w @ v

    model = NoDim().eval()
    with torch.no_grad(), pytest.warns(UserWarning), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (6,)))
    (rec,) = cap.records
    assert rec.exact and not cap.notes and not cap.skipped
    torch.testing.assert_close(rec.probs[0, 0], model.used[0], atol=0, rtol=0)


def test_a_full_row_before_a_restricted_one_is_no_causal_mask():
    """A (B, L) additive padding mask added to (B, H, L, L) scores without its unsqueeze broadcasts by
    accident when L == B: query i gets sequence i's padding. Row 0 sees every key, row 1 only key 0:
    row 0 sees a later key, so no causal mask, whatever row 1 does (a causal mask's full row is its last,
    or a padding position's, as ChatGLM leaves a left-padded query row unmasked)."""

    class Broadcast(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

        def forward(self, ids):
            x = self.emb(ids)
            q, k, v = (t[:, None] for t in self.qkv(x).chunk(3, dim=-1))
            add = (ids == 0).float() * -1e9  # (B, L): should be add[:, None, None, :]
            return ((q @ k.transpose(-2, -1)) + add).softmax(-1) @ v

    ids = torch.tensor([[5, 7], [9, 0]])
    model = Broadcast().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.kind == "enc_self" and torch.equal(
        rec.mask, torch.tensor([[1, 1], [1, 0]]).bool().expand(2, 2, 2)
    )


class DoubleSoftmax(nn.Module):
    """``F.softmax(F.softmax(s, -1), -1)``, or an ``nn.Softmax`` module followed by ``F.softmax``: the values are
    multiplied with the second softmax's weights, which give masked keys weight again."""

    def __init__(self, module: bool, heads: int = 2, d: int = 8):
        super().__init__()
        self.h, self.first = heads, nn.Softmax(dim=-1) if module else None
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        s = (q @ k.transpose(-2, -1)).masked_fill((ids == 0)[:, None, None, :], float("-inf"))
        w = self.first(s) if self.first is not None else F.softmax(s, -1)
        w = F.softmax(w, -1)
        self.used.append(w)
        return (w @ v).transpose(1, 2).reshape(b, n, d)


@pytest.mark.parametrize("module", [False, True])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_double_softmax_is_one_record_of_the_weights_the_values_are_multiplied_with(module, batch):
    torch.manual_seed(batch)
    ids = torch.randint(1, VOCAB, (batch, 6))
    ids[-1, 4:] = 0
    model = DoubleSoftmax(module).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.exact and not cap.notes
    torch.testing.assert_close(rec.probs, model.used[0], atol=0, rtol=0)
    assert bool((rec.probs[-1, :, :, 4:] > 0).all())  # the padding the first softmax hid has weight again


def test_queries_split_into_heads_without_their_transpose_are_flagged():
    """``q.view(B, L, H, d)`` left as it is, keys moved to (B, H, L, d): with L == H the product runs, and
    pairs token x's query heads with head x's keys. No (batch, head, query, key) reading is honest."""

    class NoTranspose(nn.Module):
        def __init__(self, h: int = 2, d: int = 4):
            super().__init__()
            self.h = h
            self.emb = nn.Embedding(VOCAB, h * d)
            self.q, self.k, self.v = (nn.Linear(h * d, h * d) for _ in range(3))

        def forward(self, ids):
            x = self.emb(ids)
            b, n, _ = x.shape
            q = self.q(x).view(b, n, self.h, -1)  # the transpose forgotten
            k, v = (f(x).view(b, n, self.h, -1).transpose(1, 2) for f in (self.k, self.v))
            return ((q @ k.transpose(-2, -1)).softmax(-1) @ v).transpose(1, 2).reshape(b, n, -1)

    for batch in (1, 2, 3):
        with torch.no_grad(), capture_attention(model := NoTranspose().eval()) as cap:
            model(torch.randint(1, VOCAB, (batch, 2)))
        (rec,) = cap.records
        assert not rec.exact and "keys of different heads" in rec.flag


class ZeroOneAdded(nn.Module):
    """A GPT block whose causal mask of 0s and 1s is added to the scores (meant: ``masked_fill(bias == 0,
    -inf)``; minGPT's buffer converted to float), by hand or handed to ``nn.MultiheadAttention`` as a float
    ``attn_mask``, which adds it. Nothing is hidden: every query attends to later keys."""

    def __init__(self, heads: int, how: str):
        super().__init__()
        d, self.h, self.how = 4 * heads, heads, how
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.register_buffer("bias", torch.ones(8, 8).tril().view(1, 1, 8, 8))
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        if self.how == "mha_future":  # True = hidden, turned into 1.0: the future gets +1
            m = torch.ones(n, n, dtype=torch.bool).triu(1).float()
            out, w = self.mha(x, x, x, attn_mask=m, average_attn_weights=False)
            self.used.append(w)
            return out
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        s = q @ k.transpose(-2, -1) / math.sqrt(d // self.h)
        s = s + self.bias[:, :, :n, :n] if self.how == "tril" else s + (1 - self.bias[:, :, :n, :n])
        w = F.softmax(s, dim=-1)
        self.used.append(w)
        return (w @ v).transpose(1, 2).reshape(b, n, d)


@pytest.mark.parametrize("how", ["tril", "future", "mha_future"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_causal_mask_of_zeros_and_ones_added_to_the_scores_is_said_to_hide_nothing(how, batch, heads):
    torch.manual_seed(2)
    model = ZeroOneAdded(heads, how).eval()
    ids, _ = _batch(batch, 6)
    with capture_attention(model) as cap:  # (gradients on: MultiheadAttention's Python path, which adds)
        model(ids)
    (rec,) = cap.records
    assert rec.exact, rec.flag
    assert torch.allclose(rec.probs, model.used[0].detach(), atol=1e-6)
    later = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert bool((rec.probs[..., later] > 0).all())  # the map as computed: every query sees later keys
    assert rec.kind == "dec_self"  # a decoder's self-attention whose mask is broken
    (note,) = [n for n in cap.notes if "0s and 1s" in n]
    assert "hides no key" in note
    assert ("passed to MultiheadAttention" in note) == (how == "mha_future")


@pytest.mark.parametrize("values", ["alibi", "zeros", "square_ones"])
def test_a_bias_of_other_values_added_to_the_scores_is_no_broken_mask(values):
    """Relative-position biases, all-zero masks and a block of ones are not a 0/1 triangle: no note."""
    torch.manual_seed(3)
    model = ZeroOneAdded(2, "tril").eval()
    n = 6
    if values == "alibi":
        model.bias.copy_(
            -(torch.arange(8)[None, :] - torch.arange(8)[:, None]).abs().float().view(1, 1, 8, 8)
        )
    elif values == "zeros":
        model.bias.zero_()
    else:
        model.bias.fill_(1.0)
    ids, _ = _batch(2, n)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "enc_self"
    assert not [n for n in cap.notes if "0s and 1s" in n]


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_causal_mask_of_zeros_and_ones_times_a_padding_mask_added_is_said_to_hide_nothing(side):
    """Hugging Face's combination ``tril(ones) * attention_mask`` kept as 0/1 floats and added: with a padded
    sequence in the batch every slice differs, and it still hides nothing (it was told only without padding)."""
    torch.manual_seed(3)
    model = ZeroOneAdded(2, "tril").eval()
    n = 6
    keep = torch.ones(2, n)
    if side == "right":
        keep[1, 4:] = 0
    else:
        keep[1, :2] = 0
    bias = torch.ones(n, n).tril()[None, None] * keep[:, None, None, :]
    model.bias = F.pad(bias, (0, 2, 0, 2))  # (the model adds bias[:, :, :n, :n])
    ids, _ = _batch(2, n)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.exact and rec.kind == "dec_self"
    assert [n for n in cap.notes if "0s and 1s" in n and "hides no key" in n]
