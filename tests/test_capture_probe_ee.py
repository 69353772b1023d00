"""Styles the probes of this round found, each with its ground truth kept inside the model.

- d2l's ``masked_softmax`` with 2-D ``valid_lens`` (one length per query) used as self-attention: rows that each see
  a prefix of the keys, some past their own position, are no decoder's mask, yet a mask whose rows reach a little
  further each was read as causal and recorded ``dec_self``, with no word. A decoder's rows that see later keys see
  them as a block of their own (an image block, a prefix): the block's last row sees no further.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnscope.core.families.capture import capture_attention


def masked_softmax(x: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """d2l's: keys past each row's valid length set to -1e6 (lengths per sequence, or per query)."""
    if valid_lens is None:
        return nn.functional.softmax(x, dim=-1)
    shape = x.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    x = x.reshape(-1, shape[-1])
    mask = torch.arange(x.size(1), dtype=torch.float32)[None, :] < valid_lens[:, None]
    x[~mask] = -1e6
    return nn.functional.softmax(x.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    def forward(self, queries, keys, values, valid_lens=None):
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(queries.shape[-1])
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.attention_weights, values)


def transpose_qkv(x: torch.Tensor, h: int) -> torch.Tensor:
    x = x.reshape(x.shape[0], x.shape[1], h, -1).permute(0, 2, 1, 3)
    return x.reshape(-1, x.shape[2], x.shape[3])


class D2lMultiHead(nn.Module):
    """d2l.ai's MultiHeadAttention: heads folded into the batch head-major, ``valid_lens`` repeated per head."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.num_heads, self.attention = h, DotProductAttention()
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x, valid_lens):
        q, k, v = (transpose_qkv(f(x), self.num_heads) for f in (self.W_q, self.W_k, self.W_v))
        valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        out = self.attention(q, k, v, valid_lens)
        w = self.attention.attention_weights
        self.truth = w.reshape(-1, self.num_heads, *w.shape[1:]).detach().clone()  # (B, H, q, k)
        out = out.reshape(-1, self.num_heads, out.shape[1], out.shape[2]).permute(0, 2, 1, 3)
        return self.W_o(out.reshape(out.shape[0], out.shape[1], -1))


LENGTHS = {
    # each row a prefix of the keys, some rows past their own position, each reaching a little further
    "per query": [[2, 3, 6, 6, 5, 5], [3, 4, 3, 2, 6, 3], [2, 3, 4, 5, 6, 6]],
    # a decoder's: each row its own position and those before (padding after the third token in one)
    "causal": [[1, 2, 3, 4, 5, 6], [1, 2, 3, 3, 3, 3], [1, 2, 3, 4, 5, 6]],
}


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("lengths", ["per query", "causal"])
def test_d2l_lengths_per_query_are_an_encoders_mask_unless_causal(lengths, batch, heads):
    torch.manual_seed(batch * 10 + heads)
    model = D2lMultiHead(8 * heads, heads).eval()
    x = torch.randn(batch, 6, 8 * heads)
    valid = torch.tensor(LENGTHS[lengths][:batch])
    with torch.no_grad(), capture_attention(model) as cap:
        model(x, valid)
    assert len(cap.records) == 1
    rec = cap.records[0]
    assert rec.exact and rec.flag is None
    torch.testing.assert_close(rec.probs, model.truth, rtol=0, atol=0)
    keep = torch.arange(6)[None, None, :] < valid[:, :, None]
    assert rec.mask is not None and torch.equal(rec.mask, keep)
    assert rec.kind == ("dec_self" if lengths == "causal" else "enc_self"), (rec.kind, cap.notes)
