"""Broken adapter: forward returns one vector per sequence (B, V) instead of one per position (B, S, V)."""

from __future__ import annotations

import torch
from torch import nn

ARCH = "encoder"
VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz ")
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 64
EXAMPLES = ["hello world", "attention"]


class Encoder(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(len(VOCAB), d, padding_idx=PAD)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.out = nn.Linear(d, len(VOCAB))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        h, _ = self.attn(x, x, x, key_padding_mask=ids == PAD)
        return self.out(h)  # (B, S, V)


def load() -> nn.Module:
    torch.manual_seed(0)
    return Encoder()


def encode(text: str) -> list[int]:
    return [VOCAB.index(c) for c in text.lower()] + [EOS]


def forward(model: nn.Module, src: torch.Tensor, tgt: None) -> torch.Tensor:
    return model(src)[:, 0]  # the bug: (B, V), the first position only
