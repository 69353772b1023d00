"""Scores laid out keys first: ``k @ q.transpose(-1, -2)`` gives ``(B, H, key, query)`` and the
softmax runs over ``dim=2`` (the keys), as in code ported from frameworks that keep keys on the
rows (and in some linear-attention papers' reference code); the values are then combined with
``attn.transpose(-1, -2) @ v``. PAD keys are hidden with ``masked_fill(~mask[:, None, :, None],
float("-inf"))``. Encoder-only: forward(ids) -> hidden states ``(B, L, D)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0
VOCAB_SIZE = 20


class KeysFirstAttention(nn.Module):
    def __init__(self, d: int, heads: int, sink: list):
        super().__init__()
        self.h, self.dk, self.sink = heads, d // heads, sink
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x, keep):  # keep: (B, L) True at real tokens
        b, n, _ = x.shape
        q, k, v = self.qkv(x).split(self.h * self.dk, dim=-1)
        q, k, v = (t.reshape(b, n, self.h, self.dk).permute(0, 2, 1, 3) for t in (q, k, v))
        att = (k @ q.transpose(-1, -2)) / math.sqrt(self.dk)  # (B, H, key, query)
        att = att.masked_fill(~keep[:, None, :, None], float("-inf"))
        att = att.softmax(dim=2)  # over the keys
        self.sink.append(("enc_self", att.detach().transpose(-1, -2).clone()))  # (B, H, query, key)
        y = att.transpose(-1, -2) @ v  # (B, H, query, dk)
        return self.proj(y.permute(0, 2, 1, 3).reshape(b, n, -1))


class Encoder(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4, layers: int = 2):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.emb = nn.Embedding(VOCAB_SIZE, d)
        self.layers = nn.ModuleList([KeysFirstAttention(d, heads, self.computed) for _ in range(layers)])
        self.norms = nn.ModuleList([nn.LayerNorm(d) for _ in range(layers)])

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != PAD
        x = self.emb(ids)
        for attn, norm in zip(self.layers, self.norms, strict=True):
            x = x + attn(norm(x), keep)
        return x


def build(seed: int = 0, heads: int = 4) -> Encoder:
    torch.manual_seed(seed)
    return Encoder(d=8 * heads, heads=heads).eval()


def sample_batch(batch: int = 3) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(batch)
    x = torch.randint(1, VOCAB_SIZE, (batch, 6), generator=g)
    for i in range(batch):
        x[i, max(6 - i, 2) :] = PAD
    return (x,)
