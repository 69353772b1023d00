"""Decoder-only model with hand-written attention (matmul, masked_fill, torch.softmax) that masks the
padding but FORGETS the causal mask: every real position sees the future. Random seeded weights,
character vocabulary.

Token convention for ARCH "decoder": ``encode(text)`` is the prompt the model reads, BOS first and no
EOS; ``encode_target(text)`` is a continuation, characters then EOS. forward(model, None, tgt) ->
logits (B, T, V). The model's own maps are in ``model.computed`` as ("dec_self", probs (B, H, T, T)).
"""

from __future__ import annotations

import math

import torch
from torch import nn

ARCH = "decoder"
VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz ")
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 64
EXAMPLES = ["hello world", "attention"]
_STOI = {c: i for i, c in enumerate(VOCAB) if len(c) == 1}


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, sink: list):
        super().__init__()
        self.h, self.d = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.sink = sink

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """pad: (B, T) bool, True = PAD."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.d).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, d)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d)  # (B, H, T, T)
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))  # padding only: no causal mask
        probs = torch.softmax(scores, dim=-1)
        self.sink.append(("dec_self", probs.detach().clone()))  # (B, H, T, T)
        return self.out((probs @ v).transpose(1, 2).reshape(B, T, D))  # (B, T, D)


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, sink: list):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, sink)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, pad):
        x = x + self.attn(self.ln1(x), pad)
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, vocab=len(VOCAB), d_model=32, n_heads=4, n_layers=2, max_len=MAX_LEN):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_heads, self.computed) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pad = idx == PAD  # (B, T)
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x, pad)
        return self.head(self.ln_f(x))  # (B, T, V)


def load() -> nn.Module:
    torch.manual_seed(0)
    return Decoder()


def _chars(text: str) -> list[int]:
    bad = sorted({c for c in text.lower() if c not in _STOI})
    if bad:
        raise ValueError(f"characters {''.join(bad)!r} are not in the vocabulary (a-z and space)")
    return [_STOI[c] for c in text.lower()]


def encode(text: str) -> list[int]:
    """The prompt the model reads: BOS, then the characters (a-z and space, lower-cased)."""
    return [BOS] + _chars(text)


def encode_target(text: str) -> list[int]:
    """A continuation: the characters, then EOS."""
    return _chars(text) + [EOS]


def forward(model: nn.Module, src: None, tgt: torch.Tensor) -> torch.Tensor:
    return model(tgt)
