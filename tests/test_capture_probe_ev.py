"""Styles the probes of this round found (code ported from other frameworks), each with its ground truth kept inside
the model.

- soskek's Chainer Transformer, ported to torch: heads folded head-major into the batch by ``split`` + ``cat`` over
  channels-first (B, C, L) tensors, the NaN rows of fully masked queries set to 0 after the softmax
  (``where(isnan(a), 0, a)``), and the values weighted element by element and summed over the keys, either through
  ``F.broadcast`` (``torch.broadcast_tensors``) or by implicit broadcasting. The record held the softmax's NaN rows
  where the model multiplied zeros; and where the head size equals the key length, the weighted sum (the attention's
  output, of the weights' own shape) was taken for the weights changed again, and recorded as them, exact.
- stepik-dl-nlp's ``my_multihead_attention`` (weights laid out (B, q, k, H), softmax over dim 2, values weighted by a
  broadcast product summed over the keys), two layers in a row: the first was flagged as talking-heads attention
  (nothing mixes its heads) and the second as lineage lost. The product's sum over the keys is now followed as a
  product by ``bmm`` is: the query's position, the values' features.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

BATCHES = range(1, 7)
HEADS = (1, 2, 3, 4, 8)


class ChainerMHA(nn.Module):
    """soskek's ``MultiHeadAttention`` (Chainer) in torch: 1x1 conv projections over (B, C, L), heads folded
    head-major into the batch, NaN rows set to 0 after the softmax, values weighted by a broadcast product."""

    def __init__(self, n_units: int, h: int, explicit: bool):
        super().__init__()
        self.W_QKV = nn.Conv1d(n_units, 3 * n_units, 1, bias=False)
        self.h, self.explicit = h, explicit
        self.used: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.h
        Q, K, V = torch.split(self.W_QKV(x), x.shape[1], dim=1)
        batch, n_units, _ = Q.shape
        bQ = torch.cat(torch.split(Q, n_units // h, dim=1), dim=0)
        bK = torch.cat(torch.split(K, n_units // h, dim=1), dim=0)
        bV = torch.cat(torch.split(V, n_units // h, dim=1), dim=0)
        mask = torch.cat([mask] * h, dim=0)
        A = torch.bmm(bQ.transpose(1, 2), bK) * (n_units // h) ** -0.5
        A = torch.where(mask, A, torch.full(A.shape, -np.inf))
        A = F.softmax(A, dim=2)
        A = torch.where(torch.isnan(A.data), torch.zeros(A.shape), A)
        self.used = A.detach().clone()  # (h * B, q, k), head-major
        if self.explicit:  # F.broadcast(A[:, None], bV[:, :, None])
            bA, bV2 = torch.broadcast_tensors(A[:, None], bV[:, :, None])
            C = torch.sum(bA * bV2, dim=3)
        else:
            C = torch.sum(A[:, None] * bV[:, :, None], dim=3)  # (h * B, d, q)
        return torch.cat(torch.split(C, batch, dim=0), dim=1)


def _chainer_case(batch: int, heads: int, head_size: int, explicit: bool) -> None:
    torch.manual_seed(batch * 10 + heads)
    n = 6
    model = ChainerMHA(head_size * heads, heads, explicit).eval()
    x = torch.randn(batch, head_size * heads, n)
    valid = torch.ones(batch, n, dtype=torch.bool)
    if batch > 1:  # the last sequence padded (query and key padding: NaN rows)
        valid[-1, 4:] = False
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, valid[:, None, :] & valid[:, :, None])
    assert model.used is not None
    [rec] = cap.records
    want = model.used.view(heads, batch, n, n).transpose(0, 1)
    assert rec.exact and rec.flag is None and rec.kind == "enc_self", (batch, heads, rec.flag)
    assert not rec.probs.isnan().any(), (batch, heads)
    torch.testing.assert_close(rec.probs, want, rtol=0, atol=1e-6)


def test_nan_rows_set_to_zero_then_broadcast_against_the_values_are_recorded_as_zeros():
    for explicit in (True, False):
        for batch in BATCHES:
            for heads in HEADS:
                _chainer_case(batch, heads, 4, explicit)


def test_the_weighted_sum_of_the_weights_own_shape_is_never_recorded_as_the_weights():
    """A head size equal to the key length (6): the sum over the keys is (h * B, 6, 6), as the weights are."""
    for explicit in (True, False):
        for batch in BATCHES:
            for heads in HEADS:
                _chainer_case(batch, heads, 6, explicit)


class StepikAttention(nn.Module):
    """stepik-dl-nlp's self-attention layer around ``my_multihead_attention``."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.h = h
        self.queries_proj, self.keys_proj, self.values_proj = (
            nn.Linear(d, d),
            nn.Linear(d, d),
            nn.Linear(d, d),
        )
        self.used: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, pad: torch.Tensor, dep: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q = self.queries_proj(x).view(B, L, self.h, -1)
        k = self.keys_proj(x).view(B, L, self.h, -1)
        v = self.values_proj(x).view(B, L, self.h, -1)
        relevances = torch.einsum("bvhs,bkhs->bvkh", (q, k))
        relevances.masked_fill_(pad[:, None, :, None].expand_as(relevances), float("-inf"))
        relevances = relevances + dep[None, :, :, None].expand_as(relevances)
        normed_rels = F.softmax(relevances, dim=2)
        normed_rels = F.dropout(normed_rels, 0.0, self.training)
        self.used = normed_rels.detach().clone()  # (B, q, k, H)
        return (normed_rels.unsqueeze(-1) * v.unsqueeze(1)).sum(2).view(B, L, D)


class StepikTwo(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.emb = nn.Embedding(50, 8 * h)
        self.a1, self.a2 = StepikAttention(8 * h, h), StepikAttention(8 * h, h)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor, dep: torch.Tensor) -> torch.Tensor:
        return self.a2(self.a1(self.emb(ids), pad, dep), pad, dep)


def test_two_layers_that_sum_a_broadcast_product_over_the_keys_are_both_exact():
    n = 5
    dep = torch.triu(torch.full((n, n), float("-inf")), 1)
    for batch in BATCHES:
        for heads in HEADS:
            torch.manual_seed(batch * 10 + heads)
            model = StepikTwo(heads).eval()
            pad = torch.zeros(batch, n, dtype=torch.bool)
            pad[-1, 3:] = batch > 1
            with torch.no_grad(), capture_attention(model) as cap:
                model(torch.randint(1, 50, (batch, n)), pad, dep)
            assert [r.name for r in cap.records] == ["a1", "a2"], (batch, heads)
            for rec, layer in zip(cap.records, (model.a1, model.a2), strict=True):
                assert layer.used is not None
                assert rec.exact and rec.flag is None and rec.kind == "dec_self", (batch, heads, rec.flag)
                torch.testing.assert_close(rec.probs, layer.used.permute(0, 3, 1, 2), rtol=0, atol=1e-6)
            assert not cap.notes, (batch, heads, [str(x) for x in cap.notes])
