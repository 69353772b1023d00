"""Cases found by probing capture with ordinary models at the edges of shape: the kind of an encoder over a
one-token source whose attention runs under one module path with the decoder's, and a batch put in another
order by the caller's own code between two calls of the model in one block."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

V = 23


def _heads(x: torch.Tensor, h: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.view(b, t, h, d // h).transpose(1, 2)


class _TokenHeads(nn.Module):
    """Token embeddings and one packed q/k/v projection split into ``h`` heads: the start most small models of
    this file share (each writes its own attention after it)."""

    def __init__(self, d: int = 8, h: int = 2):
        super().__init__()
        self.h = h
        self.emb = nn.Embedding(V, d)
        self.qkv = nn.Linear(d, 3 * d)

    def qkv_heads(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(_heads(z, self.h) for z in self.qkv(self.emb(ids)).chunk(3, -1))


class OneForwardEncDec(nn.Module):
    """An encoder-decoder whose layers all run from the model's own forward (held in ModuleDicts), so every
    attention call has the model's path: the encoder's self-attention, the decoder's causal one and its
    cross-attention over the encoder's output. ``kinds`` keeps what each call was."""

    def __init__(self, d: int = 16, h: int = 4, layers: int = 2):
        super().__init__()
        self.h = h
        self.semb, self.temb = nn.Embedding(V, d), nn.Embedding(V, d)

        def block() -> nn.ModuleDict:
            return nn.ModuleDict({"q": nn.Linear(d, d), "kv": nn.Linear(d, 2 * d), "o": nn.Linear(d, d)})

        self.enc = nn.ModuleList(nn.ModuleDict({"sa": block()}) for _ in range(layers))
        self.dec = nn.ModuleList(nn.ModuleDict({"sa": block(), "ca": block()}) for _ in range(layers))
        self.kinds: list[str] = []
        self.maps: list[torch.Tensor] = []

    def _att(self, m, kind: str, x, y, keep):
        q = _heads(m["q"](x), self.h)
        k, v = (_heads(t, self.h) for t in m["kv"](y).chunk(2, -1))
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if keep is not None:
            s = s.masked_fill(~keep[:, None], float("-inf"))
        p = s.softmax(-1)
        self.kinds.append(kind)
        self.maps.append(p.detach())
        return x + m["o"]((p @ v).transpose(1, 2).reshape(x.shape))

    def forward(self, src, tgt):
        x = self.semb(src)
        for layer in self.enc:
            x = self._att(layer["sa"], "enc_self", x, x, None)
        y = self.temb(tgt)
        b, t = tgt.shape
        causal = torch.ones(t, t, dtype=torch.bool).tril().expand(b, t, t)
        for layer in self.dec:
            y = self._att(layer["sa"], "dec_self", y, y, causal)
            y = self._att(layer["ca"], "cross", y, x, None)
        return y


@pytest.mark.parametrize("batch", [1, 2, 4])
@pytest.mark.parametrize("heads", [1, 2, 4])
def test_one_token_source_stays_the_encoders(batch, heads):
    """A one-token source's self-attention reads alike in an encoder and in a decoder's first step; here a
    cross-attention reads its positions as keys, so it is no decoder step taking the kind of the decoder's
    calls under the same path: enc_self (with the undecided warning), never dec_self silently."""
    torch.manual_seed(batch * 10 + heads)
    model = OneForwardEncDec(h=heads).eval()
    src, tgt = torch.randint(0, V, (batch, 1)), torch.randint(0, V, (batch, 3))
    with torch.no_grad(), capture_attention(model) as cap:
        model(src, tgt)
    assert [r.kind for r in cap.records] == model.kinds
    for r, want in zip(cap.records, model.maps, strict=True):
        assert r.exact
        torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)
    assert any("one token" in n for n in cap.notes)


def test_longer_source_is_decided_without_a_warning():
    torch.manual_seed(0)
    model = OneForwardEncDec().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 4)), torch.randint(0, V, (2, 3)))
    assert [r.kind for r in cap.records] == model.kinds
    assert not cap.notes


class TinyGPT(nn.Module):
    def __init__(self, d: int = 16, h: int = 4, layers: int = 2):
        super().__init__()
        self.h = h
        self.emb, self.pos = nn.Embedding(V, d), nn.Embedding(64, d)
        self.attn = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.maps: list[torch.Tensor] = []

    def forward(self, ids):
        b, t = ids.shape
        x = self.emb(ids) + self.pos(torch.arange(t))
        for attn, proj in zip(self.attn, self.proj, strict=True):
            q, k, v = (_heads(z, self.h) for z in attn(x).chunk(3, -1))
            s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
                ~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")
            )
            self.maps.append(s.softmax(-1).detach())
            x = x + proj(
                F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
            )
        return x


@pytest.mark.parametrize("pick", ["flip", "index", "roll"])
def test_batch_reordered_by_the_caller_between_calls_is_not_flagged(pick):
    """``model(ids); model(ids.flip(0))`` in one block: the second call's rows are the batch it was given, in
    its order. The reorder is the caller's code, not the model's: its records are exact, row b sequence b."""
    torch.manual_seed(3)
    model = TinyGPT().eval()
    ids = torch.randint(0, V, (3, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
        model.maps.clear()
        other = {"flip": lambda: ids.flip(0), "index": lambda: ids[torch.tensor([2, 0, 1])],
                 "roll": lambda: torch.roll(ids, 1, 0)}[pick]()  # fmt: skip
        model(other)
    second = [r for r in cap.records if cap.call_of(r) == 1]
    assert len(second) == 2
    for r, want in zip(second, model.maps, strict=True):
        assert r.exact, r.flag
        torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)


def test_batch_reordered_inside_the_model_is_still_said():
    """The same reorder inside the model's forward is the model's: the record's row b holds the caller's
    sequence perm[b], which a trace by the caller's tokens must not draw as sequence b."""

    class Sorted(TinyGPT):
        def forward(self, ids):
            return super().forward(ids.flip(0))

    torch.manual_seed(3)
    model = Sorted().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (3, 5)))
    assert cap.records and all(not r.exact and "another order" in (r.flag or "") for r in cap.records)


class BiasedAttention(_TokenHeads):
    """Softmax attention with a float tensor added to its scores (B, H, L, L) before the softmax, given per
    call: a mask of 0s and -100 (Swin's), that plus -inf, or a bias of many values (ALiBi's)."""

    def __init__(self, d: int = 16, h: int = 4):
        super().__init__(d, h)
        self.maps: list[torch.Tensor] = []

    def forward(self, ids, added):
        q, k, v = self.qkv_heads(ids)
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + added
        p = s.softmax(-1)
        self.maps.append(p.detach())
        return p @ v


def _padding(batch: int, length: int, pad: int) -> torch.Tensor:
    """(B, 1, 1, L) True at the last ``pad`` keys of every sequence but the first."""
    hidden = torch.zeros(batch, 1, 1, length, dtype=torch.bool)
    hidden[1:, ..., length - pad :] = True
    return hidden


@pytest.mark.parametrize("batch,heads", [(2, 2), (3, 4), (4, 4), (2, 1)])
def test_a_zero_minus_100_mask_is_read_as_a_mask(batch, heads):
    """Swin adds 0 / -100 (a weight of e^-100, never used): the keys it hides are masked in the record, not
    drawn as attended (mask None) or read from whichever weights underflowed to 0."""
    torch.manual_seed(batch + heads)
    model = BiasedAttention(h=heads).eval()
    hidden = _padding(batch, 6, 2)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (batch, 6)), torch.zeros(hidden.shape).masked_fill(hidden, -100.0))
    (r,) = cap.records
    torch.testing.assert_close(r.probs, model.maps[0], rtol=0, atol=1e-6)
    assert r.mask is not None and r.mask_source == "additive"
    assert torch.equal(r.mask, ~hidden[:, 0].expand(batch, 6, 6))
    assert r.kind == "enc_self"


def test_minus_100_beside_minus_inf_are_both_masks():
    torch.manual_seed(1)
    model = BiasedAttention().eval()
    hidden = _padding(2, 6, 2)
    window = torch.zeros(6, 6, dtype=torch.bool)
    window[:3, 3:] = window[3:, :3] = True  # two windows of three that see each other alone
    added = torch.zeros(2, 1, 6, 6).masked_fill(window, -100.0).masked_fill(hidden, float("-inf"))
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 6)), added)
    (r,) = cap.records
    assert torch.equal(r.mask, ~(window | hidden[:, 0]))


def test_a_bias_of_many_values_is_no_mask():
    """ALiBi's bias reaches -100 at far keys of a long sequence, but it is a bias (many values), not 0s and one
    negative value: no key is masked."""
    torch.manual_seed(2)
    model = BiasedAttention().eval()
    n = 64
    pos = torch.arange(n)
    slopes = torch.tensor([4.0, 2.0, 1.0, 0.5])[:, None, None]
    alibi = -slopes * (pos[None, :] - pos[:, None]).abs()  # (H, L, L), down to -252
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, n)), alibi[None])
    (r,) = cap.records
    torch.testing.assert_close(r.probs, model.maps[0], rtol=0, atol=1e-6)
    assert r.mask is None or bool(r.mask.all())


def test_masked_fill_with_minus_100_is_a_mask():
    class Filled(BiasedAttention):
        def forward(self, ids, hidden):
            q, k, v = (_heads(z, self.h) for z in self.qkv(self.emb(ids)).chunk(3, -1))
            s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(hidden, -100.0)
            p = s.softmax(-1)
            self.maps.append(p.detach())
            return p @ v

    torch.manual_seed(3)
    model = Filled().eval()
    hidden = _padding(3, 5, 2)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (3, 5)), hidden)
    (r,) = cap.records
    assert r.mask_source == "masked_fill"
    assert torch.equal(r.mask, ~hidden[:, 0].expand(3, 5, 5))


@pytest.mark.parametrize("value", [-100.0, float("-inf")])
def test_sdpa_float_mask_of_minus_100(value):
    class Sdpa(BiasedAttention):
        def forward(self, ids, added):
            q, k, v = (_heads(z, self.h) for z in self.qkv(self.emb(ids)).chunk(3, -1))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=added)

    torch.manual_seed(4)
    model = Sdpa().eval()
    hidden = _padding(2, 5, 2)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 5)), torch.zeros(hidden.shape).masked_fill(hidden, value))
    (r,) = cap.records
    assert r.exact
    assert torch.equal(r.mask, ~hidden[:, 0].expand(2, 5, 5))


def test_swin_shifted_windows_keep_their_mask():
    """The Swin style in tests/usermodels: its shifted layer's windows that wrap the grid's edge hide each
    other's regions by -100; the record holds that mask (the unshifted layer has none), and no window is
    taken for sequences packed into one row."""
    from tests.usermodels import swin_windows as S

    model = S.build()
    with torch.no_grad(), capture_attention(model) as cap:
        model(*S.sample_batch())
    assert not cap.notes
    plain, shifted = cap.records
    assert plain.mask is None
    mask = shifted.mask_source, shifted.mask
    assert mask[0] == "additive" and mask[1] is not None
    block = model.blocks[1]
    n_windows = block.attn_mask.shape[0]
    want = (block.attn_mask == 0).repeat(shifted.probs.shape[0] // n_windows, 1, 1)  # window b is b % nW's
    assert torch.equal(shifted.mask, want) and not bool(want.all())


class MaskedThen(nn.Module):
    """Scores masked with ``fill``, then changed by ``then`` before the softmax."""

    def __init__(self, fill: float, then, d: int = 8, h: int = 2):
        super().__init__()
        self.fill, self.then, self.h = fill, then, h
        self.qk = nn.Linear(d, 2 * d)

    def forward(self, x, keep):  # keep (B, q, k) True = may attend
        q, k = (_heads(z, self.h) for z in self.qk(x).chunk(2, -1))
        s = (q @ k.transpose(-1, -2)).masked_fill(~keep[:, None], self.fill)
        return self.then(s, keep).softmax(-1)


def _causal_left_padded(lengths: list[int], n: int) -> torch.Tensor:
    real = torch.arange(n)[None] >= (n - torch.tensor(lengths))[:, None]
    return real[:, None, :] & torch.ones(n, n, dtype=torch.bool).tril()


@pytest.mark.parametrize(
    "fill,then,some_hidden",
    [
        (-100.0, lambda s, keep: s * 0.01, False),  # a fill, then scaled down: the keys get weight again
        (-1e4, lambda s, keep: s * 1e-3, False),
        (float("-inf"), lambda s, keep: torch.where(torch.eye(s.shape[-1], dtype=torch.bool), 0.0, s), True),
        (
            -1e9,
            lambda s, keep: s.masked_fill(~keep.any(-1)[:, None, :, None], 0.0),
            True,
        ),  # keyless rows: uniform
    ],
)
def test_keys_given_a_score_again_after_the_mask_are_not_drawn_hidden(fill, then, some_hidden):
    """The record's mask is what the softmax saw: a key masked and then given a real score again by a later op
    is one the query attends (weight up to 1), never drawn hidden."""
    torch.manual_seed(0)
    model = MaskedThen(fill, then).eval()
    x, keep = torch.randn(2, 6, 8), _causal_left_padded([4, 6], 6)
    with torch.no_grad():
        want = model(x, keep)
        with capture_attention(model) as cap:
            model(x, keep)
    (r,) = cap.records
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)
    hidden_with_weight = ~r.mask[:, None] & (want > 1e-6)
    assert not bool(hidden_with_weight.any())
    # (the keys still -inf or far below stay hidden)
    assert (r.mask is not None and not bool(r.mask.all())) == some_hidden
    assert r.mask is None or torch.equal(r.mask, keep | (want > 1e-6).any(1))


def test_scores_scaled_after_a_minus_inf_mask_keep_it():
    torch.manual_seed(0)
    model = MaskedThen(float("-inf"), lambda s, keep: s / 8.0).eval()
    x, keep = torch.randn(2, 6, 8), _causal_left_padded([4, 6], 6)
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, keep)
    (r,) = cap.records
    assert torch.equal(r.mask, keep)
    assert r.kind == "dec_self"


@pytest.mark.parametrize("batch,heads", [(2, 2), (4, 4), (3, 1)])
def test_random_synthesizer_weights_expanded_over_the_batch_are_said(batch, heads):
    """The Synthesizer's random attention: softmax of a learned (H, L, L) table, expanded over the batch, times
    the values. No query-key scores, so not recorded, but a warning says why (it was information calling it a
    vocabulary or router distribution: the expanded view hid that it multiplied values)."""

    class RandomSynthesizer(nn.Module):
        def __init__(self, d: int = 16, h: int = heads, n: int = 8):
            super().__init__()
            self.h = h
            self.emb = nn.Embedding(V, d)
            self.table = nn.Parameter(torch.randn(h, n, n))
            self.v = nn.Linear(d, d)

        def forward(self, ids):
            b, n = ids.shape
            a = F.softmax(self.table[:, :n, :n], dim=-1).unsqueeze(0).expand(b, -1, -1, -1)
            v = _heads(self.v(self.emb(ids)), self.h)
            return (a @ v).transpose(1, 2).reshape(b, n, -1)

    torch.manual_seed(5)
    model = RandomSynthesizer().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (batch, 8)))
    assert not cap.records
    assert any("learned table" in n for n in cap.notes)
    assert not [n for n in cap.skipped if n.level == "info" and "vocabulary" in n.reason]


@pytest.mark.parametrize("extra", [{"add_bias_kv": True}, {"add_zero_attn": True},
                                   {"add_bias_kv": True, "add_zero_attn": True}, {}])  # fmt: skip
@pytest.mark.parametrize("batch_first", [True, False])
def test_what_multihead_attention_with_learned_keys_moves(extra, batch_first):
    """nn.MultiheadAttention with ``add_bias_kv`` / ``add_zero_attn`` appends a learned key and value (and a
    zero one) after the tokens: what each key moves is still ||v_h W_O,h|| (the learned value's, 0 for the
    zero one), not left out with no reason."""
    torch.manual_seed(6)
    e, h, b, n = 8, 2, 3, 5
    mha = nn.MultiheadAttention(e, h, batch_first=batch_first, **extra).eval()
    x = torch.randn(b, n, e) if batch_first else torch.randn(n, b, e)
    with torch.no_grad(), capture_attention(mha) as cap:
        mha(x, x, x)
    (r,) = cap.records
    got = r.values.norms()
    xb = x if batch_first else x.transpose(0, 1)
    w_v, b_v = mha.in_proj_weight[2 * e :], mha.in_proj_bias[2 * e :]
    with torch.no_grad():
        v = F.linear(xb, w_v, b_v).view(b, n, h, e // h).transpose(1, 2)  # (B, H, n, d)
        if extra.get("add_bias_kv"):
            v = torch.cat([v, mha.bias_v.view(1, h, 1, e // h).expand(b, h, 1, e // h)], 2)
        if extra.get("add_zero_attn"):
            v = torch.cat([v, torch.zeros(b, h, 1, e // h)], 2)
        w_o = mha.out_proj.weight.view(e, h, e // h)  # (D, H, d)
        want = torch.einsum("bhkd,ehd->bhke", v, w_o).norm(dim=-1)
    assert got is not None and got.shape == r.probs.shape[:2] + r.probs.shape[-1:]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_gated_heads_output_says_why_what_moves_is_left_out():
    """Heads' output gated before the output projection: no value norms (what moves from a key is not its
    value vector alone), and the trace says so in its notes, not only the page's general sentence."""

    class Gated(nn.Module):
        def __init__(self, d: int = 8, h: int = 2):
            super().__init__()
            self.h = h
            self.qkv, self.o, self.g = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (_heads(z, self.h) for z in self.qkv(x).split(d, -1))
            y = (q @ k.transpose(-1, -2) / math.sqrt(d // self.h)).softmax(-1) @ v
            return self.o(y.transpose(1, 2).reshape(b, t, d) * torch.sigmoid(self.g(x)))

    model = Gated().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 5, 8))
    (r,) = cap.records
    assert r.values is None
    tr = cap.trace(0)
    assert tr.value_norms("enc_self") is None
    assert any("what attention moves" in n and "a gate" in n for n in tr.meta.get("capture_skipped", []))


class ReEmbedded(nn.Module):
    """Self-attention written as attention between two embedding calls of the same ids in one table
    (``attn(emb(ids), emb(ids))``), through SDPA or nn.MultiheadAttention: capture records cross (two inputs by
    lineage) and says the tokens are the same, as it does for a softmax written by hand."""

    def __init__(self, how: str, d: int = 8, h: int = 2):
        super().__init__()
        self.how, self.h = how, h
        self.emb = nn.Embedding(V, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.mha = nn.MultiheadAttention(d, h, batch_first=True)

    def forward(self, ids):
        a, b = self.emb(ids), self.emb(ids)
        if self.how == "mha":
            return self.mha(a, b, b)[0]
        q, k, v = _heads(self.q(a), self.h), _heads(self.k(b), self.h), _heads(self.v(b), self.h)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("how", ["sdpa", "mha"])
def test_two_embedding_calls_of_the_same_ids_are_said_for_sdpa_and_mha(how):
    torch.manual_seed(0)
    model = ReEmbedded(how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 5)))
    (r,) = cap.records
    assert r.kind == "cross"
    assert any("two embedding calls of the same token ids" in n for n in cap.notes)


class Packed(nn.Module):
    """A causal LM over packed documents: the block-diagonal causal mask of ``docs`` (a document id per
    position); documents of one token make every query see itself alone."""

    def __init__(self, d: int = 8, h: int = 2, name: str = "attn"):
        super().__init__()
        self.h = h
        self.emb = nn.Embedding(V, d)
        self.add_module(name, nn.Linear(d, 3 * d))
        self.name = name

    def forward(self, ids, docs):
        n = ids.shape[1]
        q, k, v = (_heads(z, self.h) for z in getattr(self, self.name)(self.emb(ids)).chunk(3, -1))
        keep = (docs[:, None, :] == docs[:, :, None]) & torch.ones(n, n, dtype=torch.bool).tril()
        s = (q @ k.transpose(-1, -2)).masked_fill(~keep[:, None], float("-inf"))
        return s.softmax(-1) @ v


def test_each_query_seeing_itself_alone_is_said_undecided():
    torch.manual_seed(0)
    model = Packed().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 4)), torch.arange(4).expand(2, 4))  # four one-token documents
    (r,) = cap.records
    assert r.kind == "enc_self"
    assert any("each query may see only its own key" in n and n.startswith("(model)") for n in cap.notes)
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 4)), torch.tensor([[0, 0, 1, 1]] * 2))  # two of two tokens: causal
    assert cap.records[0].kind == "dec_self" and not cap.notes


class _SelfAttention(nn.Module):
    def __init__(self, d: int = 8, h: int = 2, causal: bool = False):
        super().__init__()
        self.h, self.causal = h, causal
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        n = x.shape[1]
        q, k, v = (_heads(z, self.h) for z in self.qkv(x).chunk(3, -1))
        s = q @ k.transpose(-1, -2)
        if self.causal:
            s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        return x + (s.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)


class _NamedDecoder(nn.Module):
    """Token embeddings, then one self-attention module named ``decoder`` (causal or not)."""

    def __init__(self, d: int = 8, causal: bool = False):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.decoder = _SelfAttention(d, causal=causal)

    def forward(self, ids):
        return self.decoder(self.emb(ids))


@pytest.mark.parametrize("length", [1, 2])
def test_a_decoder_named_module_over_one_token_says_the_name_decided(length):
    """An attention named a decoder with no causal mask: dec_self by its name, said whether the input has one
    token (where no mask could show it either way) or more."""
    torch.manual_seed(0)
    model = _NamedDecoder().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, length)))
    (r,) = cap.records
    assert r.kind == "dec_self"
    assert any(n.startswith("decoder ") and "enc_self" in n for n in cap.notes)


def test_a_decoding_loop_named_decoder_is_not_said_undecided_at_its_first_step():
    """A decoder run without a cache, one more token each call (the first call one token): its later calls
    show the causal mask, so the first step's one token is no question."""
    torch.manual_seed(0)
    model = _NamedDecoder(causal=True).eval()
    ids = torch.randint(0, V, (2, 4))
    with torch.no_grad(), capture_attention(model) as cap:
        for t in range(1, 4):
            model(ids[:, :t])
    assert [(r.name, r.kind) for r in cap.records] == [("decoder", "dec_self")] * 3
    assert not cap.notes


def test_a_note_names_every_module_it_is_about():
    """Two modules undecided by a one-token input: the note names both (a user writes kinds= for each)."""

    class Model(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.emb = nn.Embedding(V, d)
            self.first, self.second = _SelfAttention(d), _SelfAttention(d)

        def forward(self, ids):
            return self.second(self.first(self.emb(ids)))

    torch.manual_seed(0)
    model = Model().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 1)))
    assert [r.name for r in cap.records] == ["first", "second"]
    (note,) = [n for n in cap.notes if "one token" in n]
    assert note.startswith("first, second (1, 1)")


def test_heads_masked_differently_on_purpose_are_no_problem():
    """Head 0 sees every key, head 1 a window of one key either side: each head's weights stay within its own
    mask. The record's mask is what every head may see (the window), so the trace's problems() must not call
    head 0's weights outside it a disagreement."""

    class PerHead(_TokenHeads):
        def forward(self, ids):
            n = ids.shape[1]
            q, k, v = self.qkv_heads(ids)
            i = torch.arange(n)
            window = (i[:, None] - i[None, :]).abs() <= 1
            keep = torch.stack([torch.ones(n, n, dtype=torch.bool), window])  # (H, q, k)
            s = (q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf"))
            return s.softmax(-1) @ v

    torch.manual_seed(0)
    model = PerHead().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 6)))
    (r,) = cap.records
    assert r.head_masks_differ
    tr = cap.trace(0)
    assert not [p for p in tr.problems() if "disagrees" in p]


def test_the_trace_of_a_sequence_is_not_drawn_from_records_holding_another():
    """Early exit per sample (``x[b:b+1]`` run until confident): the first layer's calls join into one record
    over the batch, and one sample's later layers are records of one row, flagged as holding that sample. The
    trace of sequence 0 draws sequence 0's layer, not the other sample's layers in its place."""

    class EarlyExit(nn.Module):
        def __init__(self, d: int = 8, h: int = 2, layers: int = 4):
            super().__init__()
            self.emb = nn.Embedding(V, d)
            self.layers = nn.ModuleList(_SelfAttention(d, h) for _ in range(layers))
            self.maps: list[tuple[int, int, torch.Tensor]] = []  # (sample, layer, weights)

        def forward(self, ids):
            outs, emb = [], self.emb(ids)
            for b in range(ids.shape[0]):
                x = emb[b : b + 1]
                for i, layer in enumerate(self.layers):
                    x = layer(x)
                    if b != 2 or i == len(self.layers) - 1:  # sample 2 alone runs every layer
                        break
                outs.append(x)
            return torch.cat(outs)

    torch.manual_seed(0)
    model = EarlyExit().eval()
    ids = torch.randint(0, V, (4, 6))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    first = [r for r in cap.records if r.name == "layers.0"]
    assert len(first) == 1 and first[0].exact and first[0].probs.shape[0] == 4
    assert any(not r.exact for r in cap.records if r.name != "layers.0")
    tr = cap.trace(0, src_tokens=[f"t{i}" for i in range(6)])
    drawn = torch.as_tensor(tr.probs("enc_self").copy())
    assert drawn.shape[0] == 1
    torch.testing.assert_close(drawn[0], first[0].probs[0], rtol=0, atol=1e-6)


def _fold(t: torch.Tensor, b: int, h: int, how: str) -> torch.Tensor:
    """(B, L, H*d) -> the layout SDPA is called on."""
    n, d = t.shape[1], t.shape[2] // h
    heads = t.view(b, n, h, d)
    if how == "batch-major 3-D":
        return heads.transpose(1, 2).reshape(b * h, n, d)
    if how == "head-major 3-D":
        return heads.permute(2, 0, 1, 3).reshape(h * b, n, d)
    return heads.permute(2, 0, 1, 3)  # head-major 4-D: (H, B, L, d)


class FoldedSdpa(nn.Module):
    def __init__(self, how: str, h: int):
        super().__init__()
        self.how, self.h = how, h
        d = 4 * h
        self.emb = nn.Embedding(V, d)
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, ids):
        b = ids.shape[0]
        q, k, v = (_fold(z, b, self.h, self.how) for z in self.qkv(self.emb(ids)).chunk(3, -1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("how", ["batch-major 3-D", "head-major 3-D", "head-major 4-D"])
@pytest.mark.parametrize("batch,heads", [(1, 4), (2, 2), (3, 3), (2, 4), (4, 2)])
def test_sdpa_over_heads_folded_into_its_batch_is_laid_out_by_lineage(how, batch, heads):
    """SDPA called on heads folded into what it reads as the batch, ``(B*H, L, d)`` or ``(H, B, L, d)``: the
    record is (B, H, q, k) as lineage places the heads, never the folded axis taken for sequences."""
    torch.manual_seed(batch * 7 + heads)
    model = FoldedSdpa(how, heads).eval()
    ids = torch.randint(0, V, (batch, 5))
    with torch.no_grad():
        x = model.emb(ids)
        q, k, _ = (z.view(batch, 5, heads, -1).transpose(1, 2) for z in model.qkv(x).chunk(3, -1))
        s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
            ~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf")
        )
        want = s.softmax(-1)  # (B, H, q, k)
        with capture_attention(model) as cap:
            model(ids)
    (r,) = cap.records
    assert r.exact, r.flag
    assert tuple(r.probs.shape) == (batch, heads, 5, 5)
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)
    assert r.kind == "dec_self"


def test_learned_queries_expanded_over_the_batch_are_no_heads_on_it():
    """Perceiver-style latents, one parameter expanded over the batch, through SDPA in its own (B, H, n, d)
    layout: every sequence holds the parameter's rows, but on SDPA's head axis each head its own features, so
    nothing is read as heads folded into the batch."""

    class Latents(nn.Module):
        def __init__(self, d: int = 8, h: int = 2, n: int = 3):
            super().__init__()
            self.h = h
            self.latents = nn.Parameter(torch.randn(n, d))
            self.emb = nn.Embedding(V, d)
            self.kv = nn.Linear(d, 2 * d)

        def forward(self, ids):
            b = ids.shape[0]
            q = _heads(self.latents.expand(b, -1, -1), self.h)
            k, v = (_heads(z, self.h) for z in self.kv(self.emb(ids)).chunk(2, -1))
            return F.scaled_dot_product_attention(q, k, v)

    torch.manual_seed(0)
    model = Latents().eval()
    ids = torch.randint(0, V, (2, 5))
    with torch.no_grad():
        q = _heads(model.latents.expand(2, -1, -1), 2)
        k = _heads(model.kv(model.emb(ids)).chunk(2, -1)[0], 2)
        want = (q @ k.transpose(-1, -2) / math.sqrt(4)).softmax(-1)
        with capture_attention(model) as cap:
            model(ids)
    (r,) = cap.records
    assert r.exact and r.kind == "cross"
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("heads", [2, 4])
def test_a_head_mask_after_the_softmax_prunes_heads_not_keys(heads):
    """BERT's ``head_mask`` multiplies the weights by one number per head (head 0 pruned): the record takes the
    weights as multiplied (head 0 all 0), and its mask stays the padding mask; it was every key hidden for every
    head (the AND over heads of a per-head 0)."""

    class Bert(_TokenHeads):
        def forward(self, ids, attention_mask, head_mask):
            q, k, v = self.qkv_heads(ids)
            s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            s = s + (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
            p = s.softmax(-1) * head_mask
            return p @ v

    torch.manual_seed(heads)
    model = Bert(d=4 * heads, h=heads).eval()
    ids = torch.randint(0, V, (2, 7))
    am = torch.ones(2, 7, dtype=torch.long)
    am[1, 5:] = 0
    head_mask = torch.ones(1, heads, 1, 1)
    head_mask[0, 0] = 0.0
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, am, head_mask)
    (r,) = cap.records
    assert r.exact
    assert torch.equal(r.mask, am.bool()[:, None, :].expand(2, 7, 7))
    assert bool((r.probs[:, 0] == 0).all()) and bool((r.probs[:, 1:].sum(-1) > 0.99).all())


class HeadLoop(nn.Module):
    """Each head softmaxed alone in a loop over the features' slices, the heads' weights joined (``how``) and
    multiplied by their values in one product."""

    def __init__(self, how: str, h: int):
        super().__init__()
        self.how, self.h, self.dh = how, h, 4
        self.emb = nn.Embedding(V, 4 * h)
        self.qkv = nn.Linear(4 * h, 12 * h)

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
        sl = [slice(i * self.dh, (i + 1) * self.dh) for i in range(self.h)]
        ws = [torch.softmax(q[..., s] @ k[..., s].transpose(1, 2) / 2.0, -1) for s in sl]
        vs = [v[..., s] for s in sl]
        if self.how == "stack dim 1":
            o = torch.stack(ws, dim=1) @ torch.stack(vs, dim=1)  # (B, H, L, d)
            return o.transpose(1, 2).reshape(b, n, -1)
        if self.how == "stack dim 0":
            o = torch.stack(ws, dim=0) @ torch.stack(vs, dim=0)  # (H, B, L, d)
            return o.permute(1, 2, 0, 3).reshape(b, n, -1)
        o = torch.cat([w.unsqueeze(1) for w in ws], 1) @ torch.cat([x.unsqueeze(1) for x in vs], 1)
        return o.transpose(1, 2).reshape(b, n, -1)


@pytest.mark.parametrize("how", ["stack dim 1", "stack dim 0", "cat unsqueezed"])
@pytest.mark.parametrize("batch,heads", [(2, 2), (3, 4), (4, 4), (1, 3)])
def test_heads_softmaxed_in_a_loop_and_stacked_before_the_product_are_one_layer(how, batch, heads):
    """Only head 0 was recorded (its record's weights were what the product took first), the others dropped as
    weights that multiplied no values: one record (B, H, q, k) of every head, in the order joined."""
    torch.manual_seed(batch + 10 * heads)
    model = HeadLoop(how, heads).eval()
    ids = torch.randint(0, V, (batch, 5))
    with torch.no_grad():
        q, k, _ = model.qkv(model.emb(ids)).chunk(3, -1)
        q, k = q.view(batch, 5, heads, 4).transpose(1, 2), k.view(batch, 5, heads, 4).transpose(1, 2)
        want = (q @ k.transpose(-1, -2) / 2.0).softmax(-1)
        with capture_attention(model) as cap:
            model(ids)
    (r,) = cap.records
    assert r.exact, r.flag
    assert tuple(r.probs.shape) == (batch, heads, 5, 5)
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)
    assert not [n for n in cap.skipped if "multiplied no values" in n.reason]


def test_single_head_layers_stacked_for_display_stay_layers():
    """A one-head model returning every layer's map stacked (``torch.stack(maps, 1)``, for a plot): the stack
    multiplies nothing, so the layers are not joined as heads."""

    class Layers(nn.Module):
        def __init__(self, d: int = 8, n_layers: int = 3):
            super().__init__()
            self.emb = nn.Embedding(V, d)
            self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(n_layers))

        def forward(self, ids):
            x, maps = self.emb(ids), []
            for lin in self.qkv:
                q, k, v = lin(x).chunk(3, -1)
                w = torch.softmax(q @ k.transpose(1, 2), -1)
                maps.append(w)
                x = x + w @ v
            return x, torch.stack(maps, dim=1)

    torch.manual_seed(0)
    model = Layers().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        _, maps = model(torch.randint(0, V, (2, 5)))
    assert len(cap.records) == 3 and all(r.probs.shape == (2, 1, 5, 5) for r in cap.records)
    for i, r in enumerate(cap.records):
        torch.testing.assert_close(r.probs[:, 0], maps[:, i], rtol=0, atol=0)


@pytest.mark.parametrize("heads", [2, 3, 5])
def test_heads_summed_in_a_loop_flag_every_head(heads):
    """``acc = acc + softmax(head h)`` then the mean times the values: the values are multiplied by the heads'
    mean, which no record holds, so every head's record is flagged (with an odd head count the last one kept
    the mean, exact and silent)."""

    class Summed(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, 4 * heads)
            self.qk = nn.Linear(4 * heads, 8 * heads)
            self.v = nn.Linear(4 * heads, 4)

        def forward(self, ids):
            q, k = self.qk(self.emb(ids)).chunk(2, -1)
            acc = torch.zeros(ids.shape[0], ids.shape[1], ids.shape[1])
            for h in range(heads):
                s = slice(4 * h, 4 * h + 4)
                acc = acc + torch.softmax(q[..., s] @ k[..., s].transpose(1, 2), -1)
            return (acc / heads) @ self.v(self.emb(ids))

    torch.manual_seed(heads)
    model = Summed().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (3, 5)))
    assert cap.records and all(not r.exact and "combined" in (r.flag or "") for r in cap.records)


@pytest.mark.parametrize("how", ["batch-major 3-D", "head-major 3-D", "head-major 4-D"])
@pytest.mark.parametrize("batch,heads", [(2, 3), (2, 2), (1, 2)])
def test_a_decoding_step_over_folded_heads_is_laid_out_by_lineage(how, batch, heads):
    """One query row (the last position's, a decoding step) over heads folded into SDPA's batch: (B, H, 1, k)."""

    class Step(FoldedSdpa):
        def forward(self, ids):
            b = ids.shape[0]
            q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
            q, k, v = (
                _fold(q[:, -1:], b, self.h, self.how),
                _fold(k, b, self.h, self.how),
                _fold(v, b, self.h, self.how),
            )
            return F.scaled_dot_product_attention(q, k, v)

    torch.manual_seed(batch * 3 + heads)
    model = Step(how, heads).eval()
    ids = torch.randint(0, V, (batch, 5))
    with torch.no_grad():
        q, k, _ = (
            z.view(batch, 5, heads, -1).transpose(1, 2) for z in model.qkv(model.emb(ids)).chunk(3, -1)
        )
        want = (q[:, :, -1:] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)
        with capture_attention(model) as cap:
            model(ids)
    (r,) = cap.records
    assert r.exact, r.flag
    assert tuple(r.probs.shape) == (batch, heads, 1, 5)
    torch.testing.assert_close(r.probs, want, rtol=0, atol=1e-6)


def test_an_encoders_query_chunks_with_a_band_mask_stay_enc_self():
    """SDPA over chunks of the queries (memory-efficient attention), each with its slice of a band mask that
    lets each query see one key either side: the first chunk's rows see a key ahead, which a causal chunk at
    the end of the keys would too; lineage places the chunk at the start, so it is no decoder's."""

    class Chunked(_TokenHeads):
        def forward(self, ids):
            n = ids.shape[1]
            q, k, v = self.qkv_heads(ids)
            i = torch.arange(n)
            band = (i[:, None] - i[None, :]).abs() <= 1
            return torch.cat(
                [F.scaled_dot_product_attention(q[:, :, s : s + 2], k, v, attn_mask=band[s : s + 2])
                 for s in range(0, n, 2)], dim=2)  # fmt: skip

    torch.manual_seed(0)
    model = Chunked().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 5)))
    assert cap.records and all(r.kind == "enc_self" for r in cap.records)


def test_sdpa_with_a_scale_of_0_is_read_as_given():
    """``scale=0.0`` is a scale (every key weighs alike), not the default 1/sqrt(d)."""

    class Flat(_TokenHeads):
        def forward(self, ids):
            q, k, v = self.qkv_heads(ids)
            return F.scaled_dot_product_attention(q, k, v, scale=0.0)

    torch.manual_seed(0)
    model = Flat().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 5)))
    (r,) = cap.records
    assert r.exact
    torch.testing.assert_close(r.probs, torch.full((2, 2, 5, 5), 0.2), rtol=0, atol=1e-6)


def test_a_decoder_decoding_with_a_cache_is_not_said_undecided_at_its_first_step():
    """Greedy decoding with a KV cache (T5's, BART's generate): the decoder-named module's first step is one
    token over one key, its later steps one query over the cache. The steps show a decoder: no note."""

    class Cached(nn.Module):
        def __init__(self, d: int = 8, h: int = 2):
            super().__init__()
            self.h = h
            self.qkv = nn.Linear(d, 3 * d)

        def forward(self, x, past):
            q, k, v = (_heads(z, self.h) for z in self.qkv(x).chunk(3, -1))
            if past is not None:
                k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
            return (q @ k.transpose(-1, -2)).softmax(-1) @ v, (k, v)

    class Model(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.emb = nn.Embedding(V, d)
            self.decoder = Cached(d)

        def forward(self, ids):
            past, outs = None, []
            for t in range(ids.shape[1]):
                y, past = self.decoder(self.emb(ids[:, t : t + 1]), past)
                outs.append(y)
            return torch.cat(outs, 2)

    torch.manual_seed(0)
    model = Model().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 4)))
    assert [r.kind for r in cap.records] == ["dec_self"] * 4
    assert not cap.notes


def test_rows_short_of_1_say_what_makes_them():
    """Attention dropout while training: the record holds the dropped, rescaled weights the values were
    multiplied with; the trace's problems() says rows do not sum to 1 and what makes that."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True).train()
    x = torch.randn(2, 6, 8)
    with torch.no_grad(), capture_attention(mha) as cap:
        mha(x, x, x)
    said = [p for p in cap.trace(0).problems() if "do not all sum to 1" in p]
    assert said and "dropout" in said[0]


def test_one_token_through_heads_joined_by_their_outputs_is_said_undecided():
    """nanoGPT's lecture MultiHeadAttention: a ModuleList of single heads, their outputs joined by torch.cat.
    Over one token the joined record (under the heads' parent path) is said undecided, as one head alone is."""

    class Head(nn.Module):
        def __init__(self, d: int, hs: int):
            super().__init__()
            self.key, self.query, self.value = (nn.Linear(d, hs, bias=False) for _ in range(3))
            self.register_buffer("tril", torch.tril(torch.ones(16, 16)))

        def forward(self, x):
            t = x.shape[1]
            wei = self.query(x) @ self.key(x).transpose(-2, -1) * 0.3
            return F.softmax(wei.masked_fill(self.tril[:t, :t] == 0, float("-inf")), -1) @ self.value(x)

    class Heads(nn.Module):
        def __init__(self, d: int = 16, h: int = 2):
            super().__init__()
            self.emb = nn.Embedding(V, d)
            self.heads = nn.ModuleList(Head(d, d // h) for _ in range(h))

        def forward(self, ids):
            x = self.emb(ids)
            return torch.cat([head(x) for head in self.heads], -1)

    torch.manual_seed(0)
    model = Heads().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (1, 1)))
    assert [r.name for r in cap.records] == ["heads"]
    assert any(n.startswith("heads ") and "one token" in n for n in cap.notes)


def test_a_causal_transformer_encoder_over_one_token_is_said_undecided():
    """Over one token a causal mask looks like an encoder's, but torch's encoder reads a mask equal to its causal
    one as causal (or is told so, is_causal=True) and runs its layers with is_causal=True: the call says it is
    causal, and that decides (dec_self, nothing said). Without a mask there is nothing to say it: undecided."""
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 16, dropout=0.0, batch_first=True, norm_first=True),
        2,
        enable_nested_tensor=False,
    ).eval()
    with torch.no_grad(), capture_attention(enc) as cap:
        enc(torch.randn(1, 1, 16), mask=nn.Transformer.generate_square_subsequent_mask(1))
    assert [r.kind for r in cap.records] == ["dec_self", "dec_self"] and not cap.notes
    with torch.no_grad(), capture_attention(enc) as cap:
        enc(torch.randn(1, 1, 16), mask=nn.Transformer.generate_square_subsequent_mask(1), is_causal=True)
    assert [r.kind for r in cap.records] == ["dec_self", "dec_self"] and not cap.notes
    with torch.no_grad(), capture_attention(enc, kinds={"layers.*": "enc_self"}) as cap:
        enc(torch.randn(1, 1, 16), mask=nn.Transformer.generate_square_subsequent_mask(1), is_causal=True)
    assert [r.kind for r in cap.records] == ["enc_self", "enc_self"]  # (kinds= from the caller decide)
    with torch.no_grad(), capture_attention(enc) as cap:
        enc(torch.randn(1, 1, 16))
    assert [r.kind for r in cap.records] == ["enc_self", "enc_self"]
    assert any("one token" in n and "layers.0.self_attn" in n for n in cap.notes)
    with torch.no_grad(), capture_attention(enc) as cap:  # two tokens: the causal mask decides
        enc(torch.randn(1, 2, 16), mask=nn.Transformer.generate_square_subsequent_mask(2), is_causal=True)
    assert [r.kind for r in cap.records] == ["dec_self", "dec_self"] and not cap.notes


def test_a_head_switched_off_passes_the_row_sums_check_and_is_named():
    """The mask audit's row_sums check: a head a head mask switched off (every weight 0 in every sequence,
    beside heads that attend) is no failure, and the verdict names it; a head zero in one sequence only is."""
    from attnscope.core.analysis.audit.static import check_row_sums

    class Pruned(_TokenHeads):
        def forward(self, ids, head_mask):
            q, k, v = self.qkv_heads(ids)
            return ((q @ k.transpose(-1, -2)).softmax(-1) * head_mask) @ v

    torch.manual_seed(0)
    model = Pruned().eval()
    ids = torch.randint(0, V, (2, 4))
    off = torch.tensor([1.0, 0.0])[None, :, None, None]  # head 1 switched off
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, off)
    verdict = check_row_sums([cap.trace(0), cap.trace(1)], "enc_self")
    assert verdict.passed and "layer 0 head 1" in verdict.detail
    one = torch.ones(2, 2, 1, 1)
    one[1, 1] = 0.0  # head 1 of sequence 1 alone
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids, one)
    assert not check_row_sums([cap.trace(0), cap.trace(1)], "enc_self").passed


def test_heads_stacked_then_averaged_before_the_values_flag_every_head():
    """Each head softmaxed alone, stacked, then averaged over the heads before the values: every head's record
    is kept and flagged (head 0 alone was kept, the others dropped as weights that multiplied no values)."""

    class Averaged(HeadLoop):
        def forward(self, ids):
            b, n = ids.shape
            q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
            sl = [slice(i * self.dh, (i + 1) * self.dh) for i in range(self.h)]
            w = torch.stack([torch.softmax(q[..., s] @ k[..., s].transpose(1, 2) / 2.0, -1) for s in sl], 1)
            w = w.mean(1, keepdim=True).expand(b, self.h, n, n)
            return (w @ torch.stack([v[..., s] for s in sl], 1)).transpose(1, 2).reshape(b, n, -1)

    torch.manual_seed(0)
    model = Averaged("", 4).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 5)))
    assert sum(r.probs.shape[1] for r in cap.records) == 4
    assert all(not r.exact for r in cap.records)


def _decoder_fwd(mix_rows: float, own_future: float):
    """A decoder as the leak tests call it: output t of a row sums its tokens up to t; ``mix_rows`` adds every
    other row's tokens (rows of the batch mixing), ``own_future`` its own later tokens (a causal leak)."""
    table = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))

    def fwd(src, tgt, src_real, tgt_real):
        e = table[tgt]  # (N, T, d)
        out = e.cumsum(1)
        others = e.sum((0, 1), keepdim=True) - e.sum(1, keepdim=True)
        future = e.flip(1).cumsum(1).flip(1) - e
        return {"dec": out + mix_rows * others + own_future * future}

    return fwd


@pytest.mark.parametrize(
    "mix_rows,own_future,leaks", [(0.1, 0.0, False), (0.1, 0.05, True), (0.0, 0.05, True)]
)
def test_the_causal_leak_check_blames_a_sequence_only_for_its_own_future(mix_rows, own_future, leaks):
    """The check runs each change beside the others' in one batch: a model that mixes its batch's rows moved a
    row by another row's change, and the check called it a causal leak. A move confirmed with the change alone
    is one; a leak of a row's own future is still caught beside the mixing."""
    from attnscope.core.analysis.audit.leaks import ProbeBatch, check_causal_leak

    tgt = torch.randint(1, 50, (3, 6), generator=torch.Generator().manual_seed(1))
    batch = ProbeBatch(None, None, tgt, torch.ones(3, 6, dtype=torch.bool))
    verdict = check_causal_leak(_decoder_fwd(mix_rows, own_future), batch, 0)
    assert verdict.passed is not leaks, verdict.detail
    if mix_rows and not leaks:
        assert "batch_invariance" in verdict.detail


class StackedThen(HeadLoop):
    """Each head softmaxed alone and stacked; ``then`` on the stack before (or instead of) the values."""

    def __init__(self, then, h: int = 3):
        super().__init__("", h)
        self.then = then

    def forward(self, ids):
        q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
        sl = [slice(i * self.dh, (i + 1) * self.dh) for i in range(self.h)]
        w = torch.stack([torch.softmax(q[..., s] @ k[..., s].transpose(1, 2) / 2.0, -1) for s in sl], 1)
        return self.then(w, torch.stack([v[..., s] for s in sl], 1))


def test_heads_stacked_and_reduced_for_a_loss_alone_are_not_flagged():
    """A mix of the heads kept for a loss (``stack(ws, 1).sum(1)``) multiplies no values: the heads' weights are
    not said to be the values' mix (the records stay as they were)."""
    torch.manual_seed(0)
    model = StackedThen(lambda w, v: w.sum(1).pow(2).mean()).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 5)))
    assert cap.records and all(r.exact for r in cap.records)


def test_heads_stacked_then_scaled_before_the_values_are_one_layer_flagged():
    """``(torch.stack(ws, 1) * 1.7) @ v``: every head is kept (head 0 alone was, the others dropped as weights that
    multiplied no values), one layer, flagged as changed after the softmax."""
    torch.manual_seed(0)
    model = StackedThen(lambda w, v: (w * 1.7) @ v).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, V, (2, 5)))
    (r,) = cap.records
    assert r.probs.shape == (2, 3, 5, 5) and not r.exact
    assert not [n for n in cap.skipped if "multiplied no values" in n.reason]


def test_a_number_reshaped_says_nothing():
    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).sum().reshape(1)

    model = Loss()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(2, 4))
    assert not [n for n in cap.notes if "could not follow" in n]
