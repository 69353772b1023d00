"""Capture and traces of styles found by this stop's probes, each test naming its own. Every test here failed on
the code before its fix, but the bounds that keep the behaviour before it where the tokens given are the
columns themselves."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from attnscope.core.families.capture import capture_attention

VOCAB = 40


class ShiftedRight(nn.Module):
    """A decoder whose input is shifted right by a vector, not a token: ``cat([start, emb(ids)[:, :-1]], 1)``,
    the start a vector of zeros (``start="zeros"``) or a learned one (``start="param"``), then causal
    self-attention. Its maps' columns are the start and the first L - 1 of the L ids."""

    def __init__(self, heads: int, start: str, hd: int = 4):
        super().__init__()
        self.h, self.start = heads, start
        d = heads * hd
        self.emb = nn.Embedding(VOCAB, d)
        self.bos = nn.Parameter(torch.randn(1, 1, d))
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.truths: list[torch.Tensor] = []

    def forward(self, ids):
        b, n = ids.shape
        x = self.emb(ids)[:, :-1]
        first = torch.zeros(b, 1, x.shape[-1]) if self.start == "zeros" else self.bos.expand(b, 1, -1)
        x = torch.cat([first, x], 1)
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        w = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~causal, float("-inf")).softmax(-1)
        self.truths.append(w.detach().clone())
        return self.o((w @ v).transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize("start", ["zeros", "param"])
@pytest.mark.parametrize("heads", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 3])
def test_decoder_shifted_right_by_a_vector_draws_each_token_at_its_column(start, heads, batch):
    """The whole sequence's tokens given: the start is drawn at column 0 under its label and token i at column
    i + 1, the last token at none (said). Before, the L tokens were drawn at the L columns, the first token over
    the start vector and each token over the one before it."""
    torch.manual_seed(heads)
    m = ShiftedRight(heads, start).eval()
    ids = torch.randint(1, VOCAB, (batch, 5))
    with torch.no_grad(), capture_attention(m) as cap:
        m(ids)
    (rec,) = cap.records
    assert rec.kind == "dec_self" and rec.exact
    torch.testing.assert_close(rec.probs, m.truths[0])
    label = rec.key_labels[0]
    assert label is not None and rec.key_labels[1:] == (None,) * 4
    for b in range(batch):
        tokens = [f"s{b}t{i}" for i in range(5)]
        tr = cap.trace(b, tgt_tokens=tokens)
        assert tr.tgt_tokens == (label, *tokens[:4])
        np.testing.assert_allclose(tr.dec_self[0], m.truths[0][b].numpy(), rtol=1e-6, atol=1e-7)
        said = " ".join(tr.meta.get("capture_notes", []))
        assert "shifted right" in said and repr(tokens[4]) in said


def test_shifted_right_with_the_columns_own_tokens_given_is_drawn_as_given():
    """Bound: the four tokens the columns hold given (not the whole sequence): drawn as before, the start
    under its label, and nothing said about a shift."""
    torch.manual_seed(0)
    m = ShiftedRight(2, "zeros").eval()
    ids = torch.randint(1, VOCAB, (2, 5))
    with torch.no_grad(), capture_attention(m) as cap:
        m(ids)
    tr = cap.trace(1, tgt_tokens=["a", "b", "c", "d"])
    assert tr.tgt_tokens == (cap.records[0].key_labels[0], "a", "b", "c", "d")
    assert "shifted right" not in " ".join(tr.meta.get("capture_notes", []))


class ClsFirst(nn.Module):
    """Bound: a learned [CLS] prepended to all L tokens (no shift): L + 1 columns, L of them the tokens."""

    def __init__(self, heads: int = 2, hd: int = 4):
        super().__init__()
        d = heads * hd
        self.h = heads
        self.emb = nn.Embedding(VOCAB, d)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, ids):
        b, n = ids.shape
        x = torch.cat([self.cls.expand(b, 1, -1), self.emb(ids)], 1)
        q, k, v = (t.view(b, n + 1, self.h, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return ((q @ k.transpose(-1, -2)).softmax(-1) @ v).sum()


def test_cls_prepended_to_every_token_keeps_its_tokens_in_order():
    torch.manual_seed(0)
    m = ClsFirst().eval()
    ids = torch.randint(1, VOCAB, (2, 4))
    with torch.no_grad(), capture_attention(m) as cap:
        m(ids)
    tr = cap.trace(0, src_tokens=["a", "b", "c", "d"])
    assert tr.src_tokens[1:] == ("a", "b", "c", "d") and tr.src_tokens[0] == cap.records[0].key_labels[0]
    assert "shifted right" not in " ".join(tr.meta.get("capture_notes", []))
