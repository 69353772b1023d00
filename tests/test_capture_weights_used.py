"""attnscope.core.families.capture records the weights the model multiplies its values with.

- Weights changed after the softmax (a Hugging Face ``head_mask`` that switches heads off, attention
  dropout while training, NaN rows of fully masked queries set to 0 with ``nan_to_num`` or
  ``masked_fill(isnan, 0)``): the record holds them as they went into the product, not the softmax's
  output; dropout in eval mode changes nothing.
- A softmax written by hand (``e = exp(s - s.amax(-1, keepdim=True)); e / e.sum(-1, keepdim=True)``, the
  sum unsqueezed back, ``exp_`` in place), ``log_softmax(s, -1).exp()`` and ``exp(s - logsumexp(s))``
  are recorded like
  ``torch.softmax``, in call order, with the mask the model applied before them and as scores the
  logits the model exponentiated (shifted by each row's max where it subtracts it). They are
  recorded where their weights multiply something (dropout in between included): weights by hand
  that go nowhere (a reference computed beside SDPA, tests/usermodels/sdpa_masked.py) and a softmax
  by hand over a vocabulary projection are not attention.

Every model keeps the weights it used (``used``), so the records are checked against the model itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

D_HEAD, VOCAB = 4, 11


def _softmax_by_hand(s: torch.Tensor, how: str) -> torch.Tensor:
    if how == "torch":
        return torch.softmax(s, -1)
    if how == "exp_sum":
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)
    if how == "exp_unsqueeze":
        e = (s - s.max(dim=-1, keepdim=True).values).exp()
        return e / e.sum(dim=-1).unsqueeze(-1)
    if how == "exp_inplace":
        e = s - s.amax(-1, keepdim=True)
        e.exp_()
        return e.div(e.sum(-1, keepdim=True))
    if how == "exp_eps":  # a guard against a zero sum (wuch15's NRMS): the weights are e / (sum + eps)
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return e / (e.sum(-1, keepdim=True) + 1e-8)
    if how == "log_softmax":
        return F.log_softmax(s, dim=-1).exp()
    if how == "logsumexp":  # jax.nn.softmax's definition, as ports from JAX write it
        return torch.exp(s - torch.logsumexp(s, -1, keepdim=True))
    if how == "logsumexp_unsqueeze":
        return (s - s.logsumexp(dim=(-1,)).unsqueeze(-1)).exp()
    raise ValueError(how)


class Encoder(nn.Module):
    """BERT-style self-attention, heads split by view; ``after`` is applied to the weights before the
    product, ``how`` is how the softmax is written; the last layer always uses torch.softmax."""

    def __init__(self, heads: int, after=None, how: str = "torch", layers: int = 2, causal: bool = False):
        super().__init__()
        d = heads * D_HEAD
        self.h, self.after, self.how, self.causal = heads, after, how, causal
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.o = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.lm = nn.Linear(d, VOCAB)
        self.used: list[torch.Tensor] = []

    def forward(self, ids: torch.Tensor, head_mask: torch.Tensor | None = None):
        b, n = ids.shape
        x = self.emb(ids)
        keep = (ids != 0)[:, None, None, :]
        if self.causal:
            keep = keep & torch.ones(n, n, dtype=torch.bool).tril()
        for i, (qkv, o) in enumerate(zip(self.qkv, self.o, strict=True)):
            q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
            s = (q @ k.transpose(-1, -2)) / D_HEAD**0.5
            s = s.masked_fill(~keep, float("-inf"))
            last = i == len(self.qkv) - 1
            a = _softmax_by_hand(s, "torch" if last else self.how)
            if self.after is not None:
                a = self.after(a, head_mask)
            self.used.append(a.detach().clone())
            x = x + o((a @ v).transpose(1, 2).reshape(b, n, -1))
        return x, self.lm(x).softmax(-1)


def _captured(model: Encoder, ids: torch.Tensor, *rest, grad: bool = False):
    model.used.clear()
    with torch.set_grad_enabled(grad), capture_attention(model) as cap:
        out = model(ids, *rest)
    return out, cap


def _ids(batch: int, n: int = 6, left: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(1, VOCAB, (batch, n), generator=g)
    for i in range(1, batch):  # sequence i has i pad positions (at most n - 1)
        pad = min(i, n - 1)
        if left:
            ids[i, :pad] = 0
        else:
            ids[i, n - pad :] = 0
    return ids


def _assert_used(cap, model: Encoder) -> None:
    assert len(cap.records) == len(model.used)
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact and rec.flag is None
        torch.testing.assert_close(rec.probs, used, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4), (6, 3)])
def test_a_head_mask_that_switches_heads_off_is_in_the_record(batch, heads):
    def head_mask(a, m):  # Hugging Face BERT: attention_probs * head_mask, (H,) broadcast
        return a * m[None, :, None, None]

    torch.manual_seed(0)
    model = Encoder(heads, head_mask).eval()
    mask = torch.ones(heads)
    mask[0] = 0.0
    ids = _ids(batch)
    _, cap = _captured(model, ids, mask)
    _assert_used(cap, model)
    for rec in cap.records:
        assert torch.equal(rec.probs[:, 0], torch.zeros_like(rec.probs[:, 0]))  # head 0 moved nothing
        if heads > 1:
            assert torch.allclose(rec.probs[:, 1:].sum(-1), torch.ones(batch, heads - 1, ids.shape[1]))


def _clone_then_zero(a, m):  # an ablation written on a copy: the softmax's output stays as it was
    a = a.clone()
    a[:, 0] = 0
    return a


def _clone_then_scale(a, m):  # ``a[:, -1] *= 0.5``: Python writes the scaled head back with __setitem__
    a = a.clone()
    a[:, -1] *= 0.5
    return a


def _clone_then_zero_view(a, m):  # a head's view zeroed in place
    a = a.clone()
    a[:, 0].zero_()
    return a


def _contiguous_then_fill_rows(a, m):  # every query's weight on key 0 taken away, on a transposed copy
    a = a.transpose(-1, -2).contiguous()
    a[..., 0, :] = 0
    return a.transpose(-1, -2)


@pytest.mark.parametrize("ablate", [_clone_then_zero, _clone_then_scale, _clone_then_zero_view,
                                    _contiguous_then_fill_rows])  # fmt: skip
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_weights_written_on_a_copy_are_in_the_record(ablate, batch, heads):
    """A head ablation that copies the weights and writes into the copy (in a forward hook on nn.Softmax,
    or inline): the record held the softmax's output, exact, though the values were multiplied by the
    ablated copy."""
    torch.manual_seed(0)
    model = Encoder(heads, ablate).eval()
    _, cap = _captured(model, _ids(batch))
    _assert_used(cap, model)
    for rec, used in zip(cap.records, model.used, strict=True):
        assert not torch.equal(used, torch.softmax(rec.scores, -1).nan_to_num(0.0))


def test_a_forward_hook_on_nn_softmax_that_ablates_a_copy_is_in_the_record():
    class Hooked(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv, self.softmax = nn.Embedding(VOCAB, 8), nn.Linear(8, 24), nn.Softmax(-1)

        def forward(self, ids):
            b, n = ids.shape
            q, k, v = (t.view(b, n, 2, 4).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
            self.used = self.softmax(q @ k.transpose(-1, -2) / 2.0)
            return self.used @ v

    def ablate(module, inputs, out):
        out = out.clone()
        out[:, 1] = 0
        return out

    torch.manual_seed(0)
    model = Hooked().eval()
    model.softmax.register_forward_hook(ablate)
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(3))
    (rec,) = cap.records
    assert rec.exact and torch.equal(rec.probs, model.used) and not bool(rec.probs[:, 1].any())


def test_a_scaled_head_mask_and_its_values_agree():
    """A head mask that is not 0/1 (0.5) is what the weights are; the values kept on the record are
    those weights multiply (their decomposition gives the attention's output)."""
    torch.manual_seed(1)
    model = Encoder(2, lambda a, m: a * m[None, :, None, None]).eval()
    ids = _ids(3)
    _, cap = _captured(model, ids, torch.tensor([0.5, 1.0]))
    _assert_used(cap, model)
    assert torch.allclose(cap.records[0].probs[:, 0].sum(-1), torch.full((3, 6), 0.5))


def test_attention_dropout_while_training_is_in_the_record_and_eval_changes_nothing():
    def dropout(a, _):
        return F.dropout(a, 0.3, training=model.training)

    torch.manual_seed(2)
    model = Encoder(4, dropout).train()
    ids = _ids(3)
    torch.manual_seed(5)
    plain, _ = model(ids)
    torch.manual_seed(5)
    (out, _), cap = _captured(model, ids, grad=True)
    assert torch.equal(out, plain)  # the same random numbers: capture draws none
    _assert_used(cap, model)
    assert any(bool(((r.probs == 0) & r.mask[:, None]).any()) for r in cap.records)  # dropped, not masked
    model.eval()
    _, cap = _captured(model, ids)
    _assert_used(cap, model)
    for rec in cap.records:
        assert torch.allclose(rec.probs.sum(-1), torch.ones(rec.probs.shape[:-1]))


@pytest.mark.parametrize("clean", ["nan_to_num", "masked_fill_isnan"])
def test_nan_rows_of_fully_masked_queries_set_to_zero_are_in_the_record(clean):
    def zeroed(a, _):
        return torch.nan_to_num(a, nan=0.0) if clean == "nan_to_num" else a.masked_fill(torch.isnan(a), 0.0)

    torch.manual_seed(3)
    model = Encoder(2, zeroed, causal=True).eval()
    ids = _ids(4, left=True)  # left padding: the first queries of padded sequences see no key
    _, cap = _captured(model, ids)
    _assert_used(cap, model)
    for rec in cap.records:
        assert not torch.isnan(rec.probs).any()
        assert torch.equal(rec.probs[3, :, 0], torch.zeros_like(rec.probs[3, :, 0]))
        assert rec.kind == "dec_self"


@pytest.mark.parametrize(
    "how",
    ["exp_sum", "exp_unsqueeze", "exp_inplace", "exp_eps", "log_softmax", "logsumexp", "logsumexp_unsqueeze"],
)
@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 1), (4, 8)])
def test_a_softmax_written_by_hand_is_recorded_like_torch_softmax(how, batch, heads):
    torch.manual_seed(4)
    model = Encoder(heads, how=how, layers=3).eval()
    reference = Encoder(heads, how="torch", layers=3).eval()
    reference.load_state_dict(model.state_dict())
    ids = _ids(batch)
    (out, _), cap = _captured(model, ids)
    _assert_used(cap, model)  # three records, the first two by hand
    (want, _), ref = _captured(reference, ids)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)
    for rec, other in zip(cap.records, ref.records, strict=True):
        assert rec.kind == other.kind == "enc_self"
        assert torch.equal(rec.mask, other.mask)  # the padding the model masked before its exp
        assert rec.mask_source == "masked_fill"
        torch.testing.assert_close(rec.probs, other.probs, atol=1e-6, rtol=0)
        # the logits the model exponentiated: shifted by each row's max, if at all
        seen = rec.mask[:, None].expand_as(rec.scores)
        shift = (rec.scores - other.scores).masked_fill(~seen, 0.0)
        row = shift.gather(-1, seen.int().argmax(-1, keepdim=True)).masked_fill(~seen, 0.0)
        torch.testing.assert_close(shift, row, atol=1e-5, rtol=0)
    assert [str(n) for n in cap.skipped] == [str(n) for n in ref.skipped]  # the vocabulary softmax


def test_a_softmax_by_hand_over_a_vocabulary_is_not_attention():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB)

        def forward(self, ids):
            logits = self.out(self.emb(ids))
            e = torch.exp(logits - logits.amax(-1, keepdim=True))
            return e / e.sum(-1, keepdim=True)

    net = LM()

    with torch.no_grad(), capture_attention(net) as cap:
        net(_ids(2))
    assert cap.records == []


def test_a_softmax_by_hand_then_dropout_is_recorded_as_multiplied():
    torch.manual_seed(6)
    model = Encoder(2, lambda a, _: F.dropout(a, 0.25, training=True), how="exp_sum").train()
    _, cap = _captured(model, _ids(3), grad=True)
    _assert_used(cap, model)
    assert any(bool(((r.probs == 0) & r.mask[:, None]).any()) for r in cap.records)  # dropped, not masked


@pytest.mark.parametrize("how", ["logsumexp_other", "eps", "online"])
def test_a_softmax_capture_cannot_follow_is_a_warning_not_a_silence(how):
    """``exp(s - logsumexp)`` of other scores than its own, a sum plus more than an epsilon, and an online softmax
    over key blocks (flash attention written in PyTorch) are not recorded, and ``cap.notes`` says so (once per module), even
    beside a layer that is recorded and a vocabulary softmax."""

    class Odd(Encoder):
        def forward(self, ids, head_mask=None):
            b, n = ids.shape
            x = self.emb(ids)
            for i, (qkv, o) in enumerate(zip(self.qkv, self.o, strict=True)):
                q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
                s = (q @ k.transpose(-1, -2)) / D_HEAD**0.5
                if i == len(self.qkv) - 1:
                    y = torch.softmax(s, -1) @ v
                elif how == "logsumexp_other":  # normalized by other scores: not a softmax of s
                    y = torch.exp(s - torch.logsumexp(s.detach() * 2, -1, keepdim=True)) @ v
                elif how == "eps":
                    e = torch.exp(s - s.amax(-1, keepdim=True))
                    y = (e / (e.sum(-1, keepdim=True) + 0.5)) @ v  # not a guard: other weights
                else:  # running max and sum over blocks of 3 keys
                    m = torch.full(s.shape[:-1] + (1,), -torch.inf)
                    total, acc = torch.zeros_like(m), torch.zeros_like(q)
                    for j in range(0, n, 3):
                        blk = s[..., j : j + 3]
                        new = torch.maximum(m, blk.amax(-1, keepdim=True))
                        p = torch.exp(blk - new)
                        scale = torch.exp(m - new)
                        total = total * scale + p.sum(-1, keepdim=True)
                        acc = acc * scale + p @ v[:, :, j : j + 3]
                        m = new
                    y = acc / total
                x = x + o(y.transpose(1, 2).reshape(b, n, -1))
            return x, self.lm(x).softmax(-1)

    torch.manual_seed(7)
    model = Odd(2, layers=3).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2))
    assert len(cap.records) == 1  # the torch.softmax layer
    warned = [n for n in cap.notes if "could not follow into a softmax" in n]
    assert len(warned) == 1 and warned[0].startswith("(model)")  # once per module: the model runs both layers
    assert len(cap.skipped) == 1  # the vocabulary softmax, not attention


def test_under_cpu_autocast_the_record_holds_the_weights_as_the_product_casts_them():
    """``softmax(scores.float())`` then ``w @ v`` under ``torch.autocast("cpu", torch.bfloat16)``: the
    product multiplies the weights rounded to bfloat16, and so does the record."""

    class Mixed(Encoder):
        def forward(self, ids, head_mask=None):
            b, n = ids.shape
            x = self.emb(ids)
            keep = (ids != 0)[:, None, None, :]
            for qkv, o in zip(self.qkv, self.o, strict=True):
                q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
                s = (q @ k.transpose(-1, -2) / D_HEAD**0.5).masked_fill(~keep, -1e4)
                w = torch.softmax(s.float(), -1)
                self.used.append(w.detach().to(v.dtype).float())  # what matmul takes under autocast
                x = x + o((w @ v).transpose(1, 2).reshape(b, n, -1))
            return x, None

    torch.manual_seed(8)
    model = Mixed(2).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), capture_attention(model) as cap:
        model(_ids(2))
    assert len(cap.records) == 2
    for rec, used in zip(cap.records, model.used, strict=True):
        torch.testing.assert_close(rec.probs.float(), used, atol=0, rtol=0)


@pytest.mark.parametrize("mix_eq", ["bhij,hk->bkij", "...hij,hk->...kij"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_heads_mixed_by_a_learned_matrix_are_flagged_after_the_softmax_and_exact_before(where, mix_eq):
    """Talking-heads attention mixes the heads with a learned (H, H) matrix, before the softmax (the
    scores) or after it (the weights, which then multiply the values). After: the softmax's output
    is not what the values are multiplied with, so the record is flagged; before: every score still
    holds its query and key, each mixed head at its head's place (as a 1x1 convolution over the heads
    leaves them), so the softmax's record is exact. Weights multiplied by learned values (the keys
    contracted) are not a mix and stay exact. The mix may be written with an ellipsis for the batch."""

    class TalkingHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(VOCAB, 8), nn.Linear(8, 24)
            self.mix = nn.Parameter(torch.randn(2, 2))
            self.memory = nn.Parameter(torch.randn(5, 4))  # learned values for 5 keys

        def forward(self, ids):
            b, n = ids.shape
            q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-1, -2)
            s = torch.einsum(mix_eq, scores, self.mix) if where == "before" else scores
            w = self.softmaxed = s.softmax(-1)
            if where == "after":
                w = torch.einsum(mix_eq, w, self.mix)
            learned = torch.einsum("...ij,jd->...id", scores.softmax(-1), self.memory)
            return w @ v + learned

    torch.manual_seed(0)
    model = TalkingHeads()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (2, 5)))
    mixed, plain = cap.records
    assert plain.exact and plain.flag is None
    if where == "after":
        assert not mixed.exact and "talking-heads" in mixed.flag and where in mixed.flag
        assert [n for n in cap.notes if "talking-heads" in n] and len(cap.notes) == 1
    else:
        assert mixed.exact and not cap.notes, mixed.flag
        torch.testing.assert_close(mixed.probs, model.softmaxed, atol=0, rtol=0)


@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 4), (4, 4)])
def test_heads_mixed_after_the_softmax_by_a_linear_layer_over_them_are_flagged(batch, heads):
    """CaiT's ``proj_w`` without its ``proj_l``: the weights permuted heads last, an nn.Linear(H, H), and
    back. The values are multiplied by the mixed weights; the record (the softmax's output) was exact."""

    class ProjW(nn.Module):
        def __init__(self):
            super().__init__()
            self.h = heads
            self.qkv, self.proj_w = nn.Linear(4 * heads, 12 * heads), nn.Linear(heads, heads)

        def forward(self, x):
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
            attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
            attn = self.proj_w(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            return (attn @ v).transpose(1, 2).reshape(b, n, c)

    torch.manual_seed(0)
    model = ProjW().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(batch, 5, 4 * heads))
    (rec,) = cap.records
    assert not rec.exact and "talking-heads" in rec.flag and "after the softmax" in rec.flag
    assert len(cap.notes) == 1 and "could not verify" in cap.notes[0]


class _RingAttention(nn.Module):
    """Ring (context-parallel) attention written out on one device: each block of queries meets the key
    blocks one by one, ``softmax`` per block, then the blocks' outputs combined with their logsumexps
    (``o * exp(lse_block - lse)``). One head, queries and keys in blocks of 4."""

    def __init__(self, d: int = 8, block: int = 4):
        super().__init__()
        self.qkv, self.block = nn.Linear(d, 3 * d), block

    def forward(self, x):
        q, k, v = self.qkv(x).split(x.shape[-1], -1)
        outs = []
        for qc in q.split(self.block, 1):
            parts = []
            for kc, vc in zip(k.split(self.block, 1), v.split(self.block, 1), strict=True):
                s = qc @ kc.transpose(-1, -2) / x.shape[-1] ** 0.5
                parts.append((torch.softmax(s, -1) @ vc, torch.logsumexp(s, -1)))
            lse = torch.logsumexp(torch.stack([p[1] for p in parts]), 0)
            out = 0
            for o, lse_block in parts:
                out = out + o * torch.exp(lse_block - lse).unsqueeze(-1)
            outs.append(out)
        return torch.cat(outs, 1)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_block_softmaxes_combined_online_are_flagged(batch):
    """Every block's softmax is what the model computed, but not what the values end up multiplied by
    (the output is the full softmax's): each record says so, none is exact (they were, with no flag)."""
    torch.manual_seed(batch)
    model, x = _RingAttention().eval(), torch.randn(batch, 8, 8)
    with torch.no_grad(), capture_attention(model) as cap:
        y = model(x)
    with torch.no_grad():
        q, k, v = model.qkv(x).split(8, -1)
        torch.testing.assert_close(y, torch.softmax(q @ k.mT / 8**0.5, -1) @ v, atol=1e-5, rtol=0)
    assert len(cap.records) == 4 and not any(r.exact for r in cap.records)
    assert all("scaled by a factor made from the scores" in r.flag for r in cap.records)
    assert any("could not verify: the product of these weights" in n for n in cap.notes)


def test_an_output_past_its_projection_scaled_by_scores_is_no_block_softmax():
    """QANet's and BiDAF's shape: a self-attention's output goes on into the residual stream, then a
    later layer multiplies it by something made from other scores (context-query similarity). That is
    no block of an online softmax: the self-attention stays exact (it was flagged for a moment)."""

    class CoAttention(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

        def forward(self, context, question):
            c, q = self.emb(context), self.emb(question)
            a, k, v = self.qkv(c).chunk(3, -1)
            x = torch.softmax(a @ k.mT / 8**0.5, -1) @ v + c  # the self-attention, added to its input
            s = x @ q.mT  # similarity of the context to the question (unnormalized here)
            return torch.mul(x, s @ q)  # BiDAF's and QANet's C * A

    torch.manual_seed(0)
    model = CoAttention().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(1, VOCAB, (2, 6)), torch.randint(1, VOCAB, (2, 4)))
    (own,) = cap.records
    assert own.kind == "enc_self" and own.exact and own.flag is None
    assert not any("scaled by a factor made from the scores" in n for n in cap.notes)


class _FoldedProduct(nn.Module):
    """Megatron's CoreAttention and BLOOM: scores by ``baddbmm`` (or ``@``) on (B·H, q, d), the weights
    changed after the softmax (attention dropout while training, a head mask), then folded with
    ``probs.view(b * np, sq, sk)`` and multiplied by ``bmm``; or changed after the fold, or folded with a
    transpose first (which no reshape undoes)."""

    def __init__(self, heads: int, change: str, fold: str):
        super().__init__()
        self.h, self.change, self.fold = heads, change, fold
        d = D_HEAD * heads
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.used: list[torch.Tensor] = []

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        s = torch.baddbmm(torch.empty(b * self.h, n, n), q.reshape(b * self.h, n, D_HEAD),
                          k.reshape(b * self.h, n, D_HEAD).transpose(1, 2), beta=0.0, alpha=0.5)  # fmt: skip
        p = s.view(b, self.h, n, n).softmax(-1)
        keep = torch.arange(self.h) % 2 == 1  # a head mask: heads 0, 2, ... off
        if self.change == "dropout":
            p = F.dropout(p, 0.3, training=True)
        elif self.change == "head_mask":
            p = p * keep[None, :, None, None]
        if self.fold == "view":
            folded = p.view(b * self.h, n, n)
        elif self.fold == "unsqueeze":  # (B, H, 1, q, k), then the fold
            folded = p.unsqueeze(2).flatten(0, 2)
        else:
            folded = p.transpose(-1, -2).reshape(b * self.h, n, n)
        if self.change == "after_fold":  # dropout on the (B·H, q, k) weights
            folded = F.dropout(folded, 0.3, training=True)
        if self.fold == "transposed":
            folded = folded.transpose(-1, -2)
        self.used.append(folded.reshape(b, self.h, n, n).detach().clone())
        return torch.bmm(folded, v.reshape(b * self.h, n, D_HEAD))


@pytest.mark.parametrize("fold", ["view", "unsqueeze"])
@pytest.mark.parametrize("change", ["dropout", "head_mask", "after_fold"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_weights_changed_then_folded_for_bmm_are_in_the_record(change, fold, batch, heads):
    torch.manual_seed(batch * 10 + heads)
    model = _FoldedProduct(heads, change, fold)
    ids = torch.randint(0, VOCAB, (batch, 5))
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    (rec,) = cap.records
    assert rec.exact, rec.flag
    torch.testing.assert_close(rec.probs, model.used[0], atol=1e-6, rtol=0)


def test_weights_changed_then_folded_through_a_transpose_are_flagged():
    """A transpose moves the weights where a reshape back no longer finds them: flagged, never the softmax's."""
    torch.manual_seed(0)
    model = _FoldedProduct(2, "dropout", "transposed")
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (2, 5)))
    (rec,) = cap.records
    assert not rec.exact and "changed after the softmax" in rec.flag


class _PerHeadAfterChange(nn.Module):
    """Weights changed after the softmax (dropout while training), then multiplied a head at a time
    (``unbind(1)`` and ``bmm`` per head, stacked), or folded heads first (``p.transpose(0, 1).reshape(h * b,
    q, k)``), which with as many sequences as heads keeps the shape through the transpose."""

    def __init__(self, heads: int, how: str):
        super().__init__()
        self.h, self.how = heads, how
        d = D_HEAD * heads
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        p = F.dropout((q @ k.transpose(-1, -2) / 2.0).softmax(-1), 0.3, training=True)
        self.used = p.detach().clone()
        if self.how == "per_head":
            return torch.stack(
                [torch.bmm(ph, vh) for ph, vh in zip(p.unbind(1), v.unbind(1), strict=True)], 1
            )
        folded = p.transpose(0, 1).reshape(self.h * b, n, n)
        return torch.bmm(folded, v.transpose(0, 1).reshape(self.h * b, n, D_HEAD))


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_changed_weights_multiplied_a_head_at_a_time_are_in_the_record(batch, heads):
    torch.manual_seed(batch + heads)
    model = _PerHeadAfterChange(heads, "per_head")
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert rec.exact and torch.equal(rec.probs, model.used)


@pytest.mark.parametrize(("batch", "heads"), [(2, 2), (4, 4), (2, 3)])
def test_changed_weights_folded_heads_first_are_flagged_even_with_as_many_sequences_as_heads(batch, heads):
    """The transpose moves the weights where a reshape back does not find them: flagged, never exact (with
    batch = heads the record held the multiplied weights with batch and heads swapped)."""
    torch.manual_seed(batch + heads)
    model = _PerHeadAfterChange(heads, "heads_first")
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randint(0, VOCAB, (batch, 5)))
    (rec,) = cap.records
    assert not rec.exact and "changed after the softmax" in rec.flag


def _shift_keys_by_cat(a, m):  # an NTM's circular shift: the last key's weight first
    return torch.cat([a[..., -1:], a[..., :-1]], -1)


def _shift_queries_by_cat(a, m):
    return torch.cat([a[..., -1:, :], a[..., :-1, :]], -2)


def _shift_by_slices_into_zeros(a, m):  # the same, written by slices into a new tensor
    r = torch.zeros_like(a)
    r[..., 1:] = a[..., :-1]
    r[..., 0] = a[..., -1]
    return r


def _shift_by_stack(a, m):  # the keys' pieces stacked back in another order
    return torch.stack(a.unbind(-1)[1:] + a.unbind(-1)[:1], -1)


def _put_by_index(a, m):  # written at places an index picks
    buf = torch.zeros_like(a)
    buf[..., torch.tensor([5, 0, 1, 2, 3, 4])] = a
    return buf


@pytest.mark.parametrize(
    "move",
    [_shift_keys_by_cat, _shift_queries_by_cat, _shift_by_slices_into_zeros, _shift_by_stack, _put_by_index],
)
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_weights_moved_after_the_softmax_are_flagged(move, batch, heads):
    """Weights whose slices are joined or written back in another order before the product (a circular
    shift): the values were multiplied by other weights at each place than the softmax gave, so the record
    is flagged, never the softmax's output marked exact (it was, with no note)."""
    torch.manual_seed(0)
    model = Encoder(heads, move, layers=1).eval()
    _, cap = _captured(model, _ids(batch))
    (rec,) = cap.records
    assert not rec.exact and "after the softmax" in rec.flag
    assert any(how in rec.flag for how in ("joined back in another order", "written into another tensor"))
    assert any("could not verify" in n for n in cap.notes)


def _permuted_keys(a, m):  # a permutation of the keys picked by index_select / gather
    return a.index_select(-1, torch.tensor([5, 0, 1, 2, 3, 4]))


def _gathered_keys(a, m):
    return a.gather(-1, torch.tensor([5, 0, 1, 2, 3, 4]).expand_as(a))


def _copied_scaled(a, m):  # written whole into a tensor of their own
    return torch.empty_like(a).copy_(a * 0.5 + 0.5 / a.shape[-1])


@pytest.mark.parametrize("move", [_permuted_keys, _gathered_keys])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_weights_moved_within_their_shape_are_flagged(move, batch, heads):
    """Weights moved within their shape by index_select or gather: other weights at each place than the
    softmax gave them, which a record placed as the softmax placed them cannot hold (the values may have moved
    alike, or not): flagged with how they moved (it was the softmax's output, exact, with no note)."""
    torch.manual_seed(0)
    model = Encoder(heads, move, layers=1).eval()
    _, cap = _captured(model, _ids(batch))
    (rec,) = cap.records
    assert not rec.exact and "moved within their shape" in rec.flag


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_weights_copied_whole_or_written_back_in_order_are_the_record(batch, heads):
    """Weights copied whole into a tensor of their own (a wider dtype too) are the record's, as the values
    were multiplied with them; weights written back a head at a time into a new tensor, in their order, are
    the softmax's own weights at every place: exact, with no note."""
    for after in (_copied_scaled, _copied_wider, _written_back_per_head):
        torch.manual_seed(0)
        model = Encoder(heads, after, layers=1).eval()
        _, cap = _captured(model, _ids(batch))
        assert not cap.notes, (after.__name__, cap.notes)
        (rec,) = cap.records
        assert rec.exact
        torch.testing.assert_close(
            rec.probs, model.used[0].to(rec.probs.dtype), atol=0, rtol=0, equal_nan=True
        )


def _copied_wider(a, m):
    return torch.empty(a.shape, dtype=torch.float64).copy_(a).float()


def _written_back_per_head(a, m):
    r = torch.zeros_like(a)
    for h in range(a.shape[1]):
        r[:, h] = a[:, h]
    return r


class _TwoMaps(nn.Module):
    """Two softmaxes of one layout (a differential attention's two maps, written as its re-implementations
    write Eq. 1), then the values multiplied by ``how(a1, a2)``, kept in ``used``."""

    def __init__(self, how, heads: int):
        super().__init__()
        self.how, self.h = how, heads
        d = heads * D_HEAD
        self.emb, self.qkv, self.qk2 = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d), nn.Linear(d, 2 * d)
        self.lam = nn.Parameter(torch.full((heads, 1, 1), 0.4))

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        q2, k2 = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in self.qk2(x).chunk(2, -1))
        a1 = torch.softmax(q @ k.transpose(-1, -2), -1)
        a2 = torch.softmax(q2 @ k2.transpose(-1, -2), -1)
        self.a1, self.a2 = a1, a2
        self.used = self.how(self, a1, a2)
        return self.used @ v


@pytest.mark.parametrize(
    "how",
    [
        lambda m, a1, a2: a1 - 0.5 * a2,
        lambda m, a1, a2: a1 - m.lam * a2,
        lambda m, a1, a2: 0.3 * a1 + 0.7 * a2,
        lambda m, a1, a2: torch.lerp(a1, a2, 0.3),
        lambda m, a1, a2: torch.maximum(a1, a2),
        lambda m, a1, a2: a1 * a2 / (a1 * a2).sum(-1, keepdim=True),
    ],
    ids=["minus-scaled", "minus-lambda", "weighted-sum", "lerp", "maximum", "product-renormalized"],
)
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4)])
def test_two_maps_combined_after_scaling_are_both_flagged(how, batch, heads):
    """A second map scaled before it is combined with the first (``a1 - lam * a2``), both scaled, or the two
    combined by ``lerp``, ``maximum`` or a product: the values are multiplied by the mix, which neither
    record holds, so both are flagged (the first was exact though it multiplied nothing, and the second
    held the mix as if it were its own map)."""
    torch.manual_seed(batch * 10 + heads)
    model = _TwoMaps(how, heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch))
    assert len(cap.records) == 2
    assert all(not r.exact and "combined with other weights" in r.flag for r in cap.records), cap.records


@pytest.mark.parametrize(
    "how",
    [
        lambda m, a1, a2: a1 * 0.5,
        lambda m, a1, a2: a1.clamp(min=0.01),
        lambda m, a1, a2: a1 / a1.sum(-1, keepdim=True),
    ],
    ids=["scaled", "clamped", "renormalized-by-itself"],
)
def test_changed_weights_go_to_their_own_record_when_another_softmax_shares_their_layout(how):
    """The first of two softmaxes of one layout changed and multiplied (the second computed and unused): its
    record takes the changed weights (it took the second's place). The second, made in the same call and
    multiplying nothing, is no attention the model computed with: a note, not a layer of its own."""
    torch.manual_seed(0)
    model = _TwoMaps(how, 2).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2))
    (first,) = cap.records
    assert first.exact and torch.equal(first.probs, model.used)
    assert [n.shape for n in cap.skipped if "multiplied no values" in n.reason] == [tuple(model.a2.shape)]
    assert not cap.notes


class _ReuseLayer(nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        self.h, d = heads, heads * D_HEAD
        self.qk, self.v, self.o = nn.Linear(d, 2 * d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, attn=None):
        b, n, d = x.shape
        v = self.v(x).view(b, n, self.h, D_HEAD).transpose(1, 2)
        if attn is None:
            q, k = self.qk(x).view(b, n, 2, self.h, D_HEAD).permute(2, 0, 3, 1, 4)
            attn = (q @ k.transpose(-1, -2) / D_HEAD**0.5).softmax(-1)
        return x + self.o((attn @ v).transpose(1, 2).reshape(b, n, d)), attn


class _Reuse(nn.Module):
    """The Reuse Transformer: layer 0 computes its map, layers 1 and 2 multiply their own values by it."""

    def __init__(self, heads: int):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, heads * D_HEAD)
        self.layers = nn.ModuleList(_ReuseLayer(heads) for _ in range(3))

    def forward(self, ids):
        x, attn = self.emb(ids), None
        for layer in self.layers:
            x, attn = layer(x, attn)
        self.used = attn
        return x


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 2), (3, 4), (4, 4)])
def test_a_map_reused_by_later_layers_is_an_attention_call_of_each(batch, heads):
    """Layers that multiply their own values by an earlier layer's map make an attention call each: one
    record per layer, under its name, with the map (the later layers' calls were missing, with no note, and
    the trace showed one layer)."""
    torch.manual_seed(batch * 10 + heads)
    model = _Reuse(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch))
    assert [r.name for r in cap.records] == ["layers.0", "layers.1", "layers.2"], cap.records
    assert cap.notes == [] and all(r.exact and torch.equal(r.probs, model.used) for r in cap.records)
    trace = cap.trace(0)
    assert trace.enc_self is not None and trace.enc_self.shape[0] == 3


class _MixedAfter(nn.Module):
    """Heads mixed after the softmax by idioms beside a 4-D einsum or an nn.Linear: Multi-Token Attention's
    grouped mix (``einsum("bgcij,gce->bgeij", attn.view(b, H // 2, 2, n, n), kernel)``) and a matmul over the
    heads moved last (``attn.permute(0, 2, 3, 1) @ W``)."""

    def __init__(self, how: str, heads: int):
        super().__init__()
        self.how, self.h, d = how, heads, heads * D_HEAD
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
        self.w = nn.Parameter(torch.eye(heads) + 0.3 * torch.randn(heads, heads))
        self.g = nn.Parameter(torch.eye(2).repeat(heads // 2, 1, 1) + 0.3 * torch.randn(heads // 2, 2, 2))

    def forward(self, ids):
        b, n = ids.shape
        q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in self.qkv(self.emb(ids)).chunk(3, -1))
        a = torch.softmax(q @ k.transpose(-1, -2) / D_HEAD**0.5, -1)
        if self.how == "grouped":
            w = torch.einsum("bgcij,gce->bgeij", a.view(b, self.h // 2, 2, n, n), self.g).reshape(
                b, self.h, n, n
            )
        else:
            w = (a.permute(0, 2, 3, 1) @ self.w).permute(0, 3, 1, 2)
        return w @ v


@pytest.mark.parametrize("how", ["grouped", "permuted"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 4), (4, 4)])
def test_heads_mixed_after_the_softmax_on_a_grouped_view_or_heads_last_are_flagged(how, batch, heads):
    """The values are multiplied by the mixed weights: the record (the softmax's output) was exact."""
    torch.manual_seed(batch * 10 + heads)
    model = _MixedAfter(how, heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch))
    (rec,) = cap.records
    assert not rec.exact and "mixed across heads" in rec.flag, rec.flag


class _ForwardAttention(nn.Module):
    """ESPnet's forward attention (``AttForward``, Tacotron 2): ``w = softmax(e)``, then ``(prev + shift(prev))
    * w`` clamped and renormalized by ``F.normalize(p=1)``; the context is ``torch.sum(enc_h * w.unsqueeze(-1),
    1)`` (or a ``bmm``). Energies by a dot product or additive (``v . tanh(W h + U q)``); ``used``: the weights
    the values were multiplied with. ``scalar``: no prior, the weights times one number a position, summed."""

    def __init__(self, energies: str, product: str, d: int = 8):
        super().__init__()
        self.energies, self.product = energies, product
        self.emb, self.q, self.w, self.v = (
            nn.Embedding(VOCAB, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
            nn.Linear(d, 1),
        )

    def forward(self, ids, prev):
        h = self.emb(ids)
        if self.energies == "dot":
            e = (self.q(h[:, :1]) @ h.transpose(1, 2)).squeeze(1)
        else:
            e = self.v(torch.tanh(self.w(h) + self.q(h[:, :1]))).squeeze(-1)
        w = F.softmax(e, dim=1)
        if self.product == "scalar":
            self.used = w
            return torch.sum(w * h[..., 0], dim=1)
        w = F.normalize(torch.clamp((prev + F.pad(prev, (1, 0))[:, :-1]) * w, 1e-6), p=1, dim=1)
        self.used = w
        if self.product == "bmm":
            return torch.bmm(w.unsqueeze(1), h).squeeze(1)
        return torch.sum(h * w.unsqueeze(-1), dim=1)


@pytest.mark.parametrize("energies", ["dot", "additive"])
@pytest.mark.parametrize("product", ["sum", "bmm", "scalar"])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_forward_attentions_weights_changed_by_a_prior_are_the_record(energies, product, batch):
    """The record holds the weights the values were multiplied with (it held the bare softmax with the
    broadcast product and sum, or, with additive energies, no record was made); weights times one number a
    position and summed are recorded as the softmax gave them."""
    torch.manual_seed(batch)
    model = _ForwardAttention(energies, product).eval()
    prev = torch.softmax(torch.randn(batch, 6), -1)
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch), prev)
    (rec,) = cap.records
    assert rec.exact and cap.notes == [], (rec.flag, cap.notes)
    torch.testing.assert_close(rec.probs[:, 0, 0], model.used)


class _RepeatedWeightSum(nn.Module):
    """Deep Learning from Scratch 2's attention ported to torch, a step at a time: ``s = (hs * h.repeat).sum(2)``,
    a softmax by hand with numpy's names (``max(axis=1, keepdims=True)``, ``x /= x.sum(axis=1, keepdims=True)``),
    and the weights repeated over the features before the product: ``(hs * a.reshape(N, T, 1).repeat(1, 1,
    H)).sum(1)``; or (``scalar``) the weights times one number a position, summed."""

    def __init__(self, scalar: bool, d: int = 8):
        super().__init__()
        self.scalar, self.emb, self.used = scalar, nn.Embedding(VOCAB, d), []

    def forward(self, ids, steps):
        hs, dec = self.emb(ids), self.emb(steps)
        n, t, d = hs.shape
        self.used = []
        for i in range(dec.shape[1]):
            s = (hs * dec[:, i].reshape(n, 1, d).repeat(1, t, 1)).sum(2)
            x = torch.exp(s - s.max(axis=1, keepdims=True)[0])
            x /= x.sum(axis=1, keepdims=True)
            self.used.append(x.clone())
            if self.scalar:
                c = (x * hs[..., 0]).sum(1)
            else:
                c = (hs * x.reshape(n, t, 1).repeat(1, 1, d)).sum(1)
            dec = dec + c.reshape(n, 1, -1)[..., :1]
        return dec


@pytest.mark.parametrize("scalar", [False, True])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_weights_read_by_an_elementwise_product_of_their_shape_are_recorded_in_step_order(scalar, batch):
    """Each step's weights are recorded exactly and in the order the steps ran (where the product of their
    own shape is decided at the end of the forward, they were recorded last step first)."""
    torch.manual_seed(batch)
    model = _RepeatedWeightSum(scalar).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch), torch.randint(1, VOCAB, (batch, 3)))
    assert len(cap.records) == 3 and cap.notes == [], cap.notes
    for rec, used in zip(cap.records, model.used, strict=True):
        assert rec.exact
        torch.testing.assert_close(rec.probs[:, 0, 0], used)


def test_a_slice_of_a_map_read_again_by_another_module_is_no_reuse():
    """A classifier head that pools the tokens by the last layer's class-token attention averaged over the heads
    (``attn[:, :, 0].mean(1)`` times the tokens) reads some of the map after it weighed its values: no record
    of its own, and the layer's record stays exact (it was flagged as weights changed after the softmax)."""

    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer, self.head = _ReuseLayer(2), nn.Linear(2 * D_HEAD, 3)

        def forward(self, ids, emb):
            x, attn = self.layer(emb(ids))
            return self.head(attn[:, :, 0].mean(1)[:, None] @ x)

    torch.manual_seed(0)
    model, emb = Pooled().eval(), nn.Embedding(VOCAB, 2 * D_HEAD)
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(2), emb)
    assert [r.name for r in cap.records] == ["layer"] and cap.records[0].exact, cap.records


class _Attn(nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        self.h, self.qkv = heads, nn.Linear(heads * D_HEAD, 3 * heads * D_HEAD)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        a = torch.softmax(q @ k.transpose(-1, -2) / D_HEAD**0.5, -1)
        return a, a @ v, v


class _Distilled(nn.Module):
    """MiniLM's distillation in one forward: the teacher's and the student's attention (each multiplies its
    values), and the teacher's value relation ``softmax(V V^T / sqrt(d))`` as the target of ``F.kl_div`` (it
    multiplies nothing); TinyBERT's ``F.mse_loss`` between the two attention maps too."""

    def __init__(self, heads: int):
        super().__init__()
        self.emb, self.teacher, self.student = nn.Embedding(VOCAB, heads * D_HEAD), _Attn(heads), _Attn(heads)

    def forward(self, ids):
        x = self.emb(ids)
        a_t, _, v_t = self.teacher(x)
        a_s, y, v_s = self.student(x)
        rel_t = torch.softmax(v_t @ v_t.transpose(-1, -2) / D_HEAD**0.5, -1)
        rel_s = torch.log_softmax(v_s @ v_s.transpose(-1, -2) / D_HEAD**0.5, -1)
        self.maps = (a_t, a_s)
        return y, F.kl_div(rel_s, rel_t, reduction="batchmean") + F.mse_loss(a_s, a_t)


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_softmax_whose_weights_only_feed_a_loss_is_not_recorded(batch, heads):
    """The value relation, a distillation target, multiplies no values: noted, not an attention layer (it was
    recorded as a third ``enc_self`` layer); the two attention maps fed to a loss as well stay, exact."""
    torch.manual_seed(batch * 10 + heads)
    model = _Distilled(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch))
    assert len(cap.records) == 2 and cap.notes == [], (cap.records, cap.notes)
    for rec, want in zip(cap.records, model.maps, strict=True):
        assert rec.exact and torch.equal(rec.probs, want)
    assert any("went into a loss" in n.reason for n in cap.skipped), cap.skipped


class _PolicySoftmax(nn.Module):
    """DynamicViT's ``softmax_with_policy``: the max-shifted scores' ``exp_``, times a 0/1 keep policy (with the
    eye), then ``(attn + eps / N) / (attn.sum(-1, keepdim=True) + eps)``."""

    def __init__(self, heads: int):
        super().__init__()
        self.h, self.emb, self.qkv = (
            heads,
            nn.Embedding(VOCAB, heads * D_HEAD),
            nn.Linear(heads * D_HEAD, 3 * heads * D_HEAD),
        )

    def forward(self, ids, policy, eps: float = 1e-6):
        x = self.emb(ids)
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        attn = q @ k.transpose(-2, -1) * D_HEAD**-0.5
        keep = policy.reshape(b, 1, 1, n)
        keep = keep + (1.0 - keep) * torch.eye(n).view(1, 1, n, n)
        attn = (attn - attn.max(dim=-1, keepdim=True)[0]).exp_() * keep
        self.w = (attn + eps / n) / (attn.sum(dim=-1, keepdim=True) + eps)
        return self.w @ v


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_softmax_by_hand_with_a_guard_on_both_sides_is_recorded(batch, heads):
    """The exp plus a guard over its own sum plus a guard is a softmax by hand: recorded exactly as the weights
    multiplied (it was a warning that scores multiply values without a softmax)."""
    torch.manual_seed(batch * 10 + heads)
    model = _PolicySoftmax(heads).eval()
    policy = (torch.rand(batch, 6, 1) > 0.4).float()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch), policy)
    (rec,) = cap.records
    assert rec.exact and cap.notes == [], cap.notes
    torch.testing.assert_close(rec.probs, model.w)


class _WithRelations(nn.Module):
    """A student layer for MiniLM-style distillation: its attention, and beside it, in the same forward, the
    self-attention relations the loss compares (``softmax(v v^T)``, and for MiniLMv2 ``q q^T`` and
    ``k k^T``), returned for a loss outside the model. ``style``: ``"fused"`` one qkv projection, ``"split"``
    three, ``"sdpa"`` the attention by ``F.scaled_dot_product_attention``; ``first`` makes the relations
    before the attention."""

    def __init__(self, heads: int, style: str, first: bool):
        super().__init__()
        self.h, self.style, self.first, d = heads, style, first, heads * D_HEAD
        self.emb = nn.Embedding(VOCAB, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.maps: list[torch.Tensor] = []
        self.relations: list[torch.Tensor] = []

    def layer(self, x, keep):
        b, n, d = x.shape
        parts = self.qkv(x).chunk(3, -1) if self.style == "fused" else (self.q(x), self.k(x), self.v(x))
        q, k, v = (t.view(b, n, self.h, D_HEAD).transpose(1, 2) for t in parts)

        def relations():
            for t in (v, q, k):
                self.relations.append(F.softmax(t @ t.transpose(-1, -2) / D_HEAD**0.5, dim=-1))

        if self.first:
            relations()
        if self.style == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            a = (q @ k.transpose(-1, -2) / D_HEAD**0.5).masked_fill(~keep, float("-inf")).softmax(-1)
            self.maps.append(a)
            y = a @ v
        if not self.first:
            relations()
        return x + y.transpose(1, 2).reshape(b, n, d)

    def forward(self, ids):
        self.maps, self.relations = [], []
        x, keep = self.emb(ids), (ids != 0)[:, None, None, :]
        for _ in range(2):
            x = self.layer(x, keep)
        return x, self.relations


@pytest.mark.parametrize("style", ["fused", "split", "sdpa"])
@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 1), (4, 4)])
def test_relations_made_beside_the_attention_for_a_loss_are_not_heads_or_layers(style, first, batch, heads):
    """Softmaxes over ``v v^T`` (``q q^T``, ``k k^T``) made in the same call as the attention and multiplying
    nothing were joined to it as more heads (one qkv projection: 2 heads drawn as 4) or recorded as layers
    of their own, exact. They are no attention the model computed with: each call's one record is its
    attention, and the relations are an information note."""
    torch.manual_seed(batch * 10 + heads)
    model = _WithRelations(heads, style, first).eval()
    ids = _ids(batch)
    with torch.no_grad(), capture_attention(model) as cap:
        model(ids)
    assert len(cap.records) == 2 and not cap.notes, (cap.records, cap.notes)
    for i, rec in enumerate(cap.records):
        assert rec.exact and rec.kind == "enc_self" and tuple(rec.probs.shape) == (batch, heads, 6, 6)
        if style != "sdpa":
            assert torch.equal(rec.probs, model.maps[i])
        assert not any(torch.equal(rec.probs, r) for r in model.relations)
    assert {n.module for n in cap.skipped if "multiplied no values" in n.reason} == {""}


class _MapOnly(nn.Module):
    """Attention supervised by a loss outside the model: the module returns its map and multiplies nothing."""

    def __init__(self):
        super().__init__()
        self.emb, self.qk = nn.Embedding(VOCAB, 8), nn.Linear(8, 16)

    def forward(self, ids):
        q, k = self.qk(self.emb(ids)).chunk(2, -1)
        return (q @ k.transpose(-1, -2) / 8**0.5).softmax(-1)


def test_a_map_alone_in_its_call_stays_though_it_multiplies_nothing():
    """Only maps beside the call's attention are left out: a call whose one map weighs nothing keeps it."""
    model = _MapOnly().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        out = model(_ids(2))
    assert len(cap.records) == 1 and torch.equal(cap.records[0].probs[:, 0], out)
    assert not any("multiplied no values" in n.reason for n in cap.skipped)


class _RelationLayer(nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        self.h, d = heads, heads * D_HEAD
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t(x).view(b, n, self.h, D_HEAD).transpose(1, 2) for t in (self.q, self.k, self.v))
        p = (q @ k.transpose(-1, -2) / D_HEAD**0.5).softmax(-1)
        rel = (v @ v.transpose(-1, -2) / D_HEAD**0.5).softmax(-1)
        return x + (p @ v).transpose(1, 2).reshape(b, n, d), p, rel


class _RelationStack(nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, heads * D_HEAD)
        self.layers = nn.ModuleList(_RelationLayer(heads) for _ in range(3))

    def forward(self, ids):
        x, maps, rels = self.emb(ids), [], []
        for layer in self.layers:
            x, p, rel = layer(x)
            maps.append(p)
            rels.append(rel)
        return x, maps, rels


@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_a_relation_beside_each_layers_attention_is_a_note_not_a_layer(batch, heads):
    """Each layer a module returning its attention and its value relation: three layers, not six."""
    torch.manual_seed(batch + heads)
    model = _RelationStack(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        _, maps, _ = model(_ids(batch))
    assert [r.name for r in cap.records] == ["layers.0", "layers.1", "layers.2"] and not cap.notes
    for rec, p in zip(cap.records, maps, strict=True):
        assert rec.exact and torch.equal(rec.probs, p)
    assert {n.module for n in cap.skipped if "multiplied no values" in n.reason} == {
        "layers.0",
        "layers.1",
        "layers.2",
    }


class _SideUseLayer(nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        self.h, d = heads, heads * D_HEAD
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x, rollout=None):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, D_HEAD).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-1, -2) / D_HEAD**0.5).softmax(-1)
        if rollout is not None:  # a rollout step inside the layer (ViT explainability forks)
            r = a.mean(1) + torch.eye(n)
            rollout = (r / r.sum(-1, keepdim=True)) @ rollout
        return x + (a @ v).transpose(1, 2).reshape(b, n, d), a, rollout


class _SideUses(nn.Module):
    """Maps that weigh their values unchanged and are also used for something else: an entropy regularizer
    or an attention-transfer loss summed over the layers, or an attention rollout inside each layer."""

    def __init__(self, heads: int, how: str):
        super().__init__()
        self.how = how
        self.emb = nn.Embedding(VOCAB, heads * D_HEAD)
        self.student = nn.ModuleList(_SideUseLayer(heads) for _ in range(2))
        self.teacher = nn.ModuleList(_SideUseLayer(heads) for _ in range(2))

    def forward(self, ids):
        x = y = self.emb(ids)
        n = ids.shape[1]
        rollout = torch.eye(n).expand(ids.shape[0], n, n) if self.how == "rollout" else None
        mine, theirs = [], []
        for layer in self.student:
            x, a, rollout = layer(x, rollout)
            mine.append(a)
        if self.how == "entropy":
            return x, sum(torch.special.entr(a).sum(-1).mean() for a in mine)
        if self.how == "rollout":
            return x, rollout
        for layer in self.teacher:
            y, a, _ = layer(y)
            theirs.append(a)
        if self.how == "kl":  # MobileBERT's transfer on the probabilities: KL of the clamped log, masked MSE
            keep = (ids != 0)[:, None, :, None].float()
            pairs = list(zip(mine, theirs, strict=True))
            kl = sum(F.kl_div(p.clamp_min(1e-12).log(), t, reduction="batchmean") for p, t in pairs)
            return x, kl + sum(F.mse_loss(p * keep, t * keep) for p, t in pairs)
        return x, sum(F.mse_loss(p, t) for p, t in zip(mine, theirs, strict=True))


@pytest.mark.parametrize("how", ["entropy", "distillation", "kl", "rollout"])
@pytest.mark.parametrize(("batch", "heads"), [(1, 1), (2, 2), (3, 4)])
def test_maps_used_beside_their_values_stay_exact(how, batch, heads):
    """Entropies or distillation losses of two layers' maps added together read as maps combined (differential
    attention), and a rollout of the head-averaged map as weights changed past a view: each record was
    flagged, though its values are multiplied with the softmax's output as it is. A change flags a record
    only where its own weights never weigh values."""
    torch.manual_seed(batch * 3 + heads)
    model = _SideUses(heads, how).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch))
    assert all(r.exact and r.flag is None for r in cap.records), [r.flag for r in cap.records]
    assert len(cap.records) == (2 if how in ("entropy", "rollout") else 4) and not cap.notes


class _ConvTalkingHeads(nn.Module):
    """EfficientFormerV2's Attention4D: the heads mixed after the softmax by ``nn.Conv2d(H, H, 1)``."""

    def __init__(self, heads: int):
        super().__init__()
        self.h, d = heads, heads * D_HEAD
        self.emb, self.qkv = nn.Embedding(VOCAB, d), nn.Linear(d, 3 * d)
        self.talking_head2 = nn.Conv2d(heads, heads, 1)
        self.used: torch.Tensor | None = None

    def forward(self, ids):
        x = self.emb(ids)
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, D_HEAD).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) / D_HEAD**0.5).softmax(-1)
        self.used = self.talking_head2(attn)
        return (self.used @ v).transpose(1, 2).reshape(b, n, d)


@pytest.mark.parametrize(("batch", "heads"), [(1, 2), (2, 2), (3, 4)])
def test_heads_mixed_by_a_conv2d_after_the_softmax_are_the_mixed_weights(batch, heads):
    """The record holds each head's mix, the weights its values are multiplied with (docs/capture.md)."""
    torch.manual_seed(batch + heads)
    model = _ConvTalkingHeads(heads).eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(_ids(batch))
    (rec,) = cap.records
    assert rec.exact and tuple(rec.probs.shape) == (batch, heads, 6, 6)
    torch.testing.assert_close(rec.probs, model.used, atol=0, rtol=0)
