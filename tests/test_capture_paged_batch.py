"""A padded batch of requests over a paged KV cache, read back by block table and attended with SDPA (chunked
prefill: each request's new chunk written into its blocks, then every block of the request read as its keys).
Each row's keys hold its cached positions and its new ones at columns of its own, and the record's key labels were
row 0's for every row: another request's cached keys drawn as this one's tokens. Such a record is now flagged, its
weights exact, each row's keys in ``record.key_positions``; requests whose new keys sit at the same columns (one
length each) keep their labels, unflagged.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

D, BLOCK, BLOCKS = 16, 4, 16


class PagedAttention(nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        self.h = heads
        self.emb, self.qkv, self.o = nn.Embedding(50, D), nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.register_buffer("k_cache", torch.zeros(BLOCKS, BLOCK, heads, D // heads))
        self.register_buffer("v_cache", torch.zeros(BLOCKS, BLOCK, heads, D // heads))
        self.keep = False  # the weights written down, in a run of its own (not captured)
        self.kept: torch.Tensor | None = None

    def forward(self, ids, pos, block_table, lens, valid):
        b, n = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, n, 3, self.h, D // self.h).unbind(2)
        slot = block_table.gather(1, pos // BLOCK) * BLOCK + pos % BLOCK
        self.k_cache.view(-1, self.h, D // self.h)[slot[valid]] = k[valid]
        self.v_cache.view(-1, self.h, D // self.h)[slot[valid]] = v[valid]
        keys = self.k_cache[block_table].view(b, -1, self.h, D // self.h).transpose(1, 2)
        values = self.v_cache[block_table].view(b, -1, self.h, D // self.h).transpose(1, 2)
        at = torch.arange(keys.shape[2])[None, None, :]
        keep = ((at <= pos[:, :, None]) & (at < lens[:, None, None])) | ~valid[:, :, None]
        q = q.transpose(1, 2)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=keep[:, None])
        if self.keep:
            scores = q @ keys.transpose(-1, -2) / math.sqrt(D // self.h)
            self.kept = scores.masked_fill(~keep[:, None], float("-inf")).softmax(-1)
        return self.o(y.transpose(1, 2).reshape(b, n, D))


def _two_chunks(heads: int, first: list[int], second: list[int]):
    torch.manual_seed(heads)
    model = PagedAttention(heads).eval()
    b = len(first)
    table = torch.arange(b * 4).view(b, 4)
    for lens, start in ((first, [0] * b), (second, first)):
        n = max(lens)
        valid = torch.arange(n)[None] < torch.tensor(lens)[:, None]
        pos = torch.tensor(start)[:, None] + torch.arange(n)[None]
        total = torch.tensor(start) + torch.tensor(lens)
        args = (torch.randint(1, 50, (b, n)), pos, table, total, valid)
        if lens is first:
            with torch.no_grad():
                model(*args)
    cache = (model.k_cache.clone(), model.v_cache.clone())
    with torch.no_grad(), capture_attention(model) as cap:
        model(*args)
    model.k_cache.copy_(cache[0])
    model.v_cache.copy_(cache[1])
    model.keep = True
    with torch.no_grad():
        model(*args)
    return model, cap


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_requests_of_different_lengths_over_a_paged_cache_are_flagged(heads):
    model, cap = _two_chunks(heads, [5, 2], [3, 1])
    (rec,) = cap.records
    assert not rec.exact and "paged cache read back by block table" in rec.flag
    torch.testing.assert_close(rec.probs, model.kept.nan_to_num(0.0), atol=1e-6, rtol=1e-5)
    assert rec.key_positions is not None and rec.key_positions.shape == (2, 16)


def test_requests_of_one_length_keep_their_labels():
    model, cap = _two_chunks(2, [5, 5], [2, 2])
    (rec,) = cap.records
    assert rec.exact and rec.flag is None
    assert rec.key_labels[:5] == tuple(f"<cache {i}>" for i in range(5)) and rec.key_labels[5:7] == (
        None,
        None,
    )
    torch.testing.assert_close(rec.probs, model.kept, atol=1e-6, rtol=1e-5)
