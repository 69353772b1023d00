"""Tutorial-style encoder-decoder (3-D bmm heads, nn.Softmax, one attention module per decoder layer
called for self- and context attention), random seeded weights, character vocabulary.

forward returns the Generator's probabilities (B, T, V). The model's own maps are in
``model.computed`` as (label, probs (B, H, q, k)) in call order (``model.reset()`` clears them).
"""

from __future__ import annotations

import math

import torch
from torch import nn

ARCH = "encoder-decoder"
VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz ")
TGT_VOCAB = None
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 64
EXAMPLES = ["hello world", "attention"]
_STOI = {c: i for i, c in enumerate(VOCAB) if len(c) == 1}


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, sink: list, self_label: str):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.softmax = nn.Softmax(dim=2)
        self.sink, self.self_label = sink, self_label

    def split(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.h, self.d_k).transpose(1, 2).contiguous().view(B * self.h, L, self.d_k)

    def forward(self, query, key, value, mask):
        """mask: (B, q, k) bool, True = masked."""
        label = self.self_label if query is key else "cross"
        B, Lq, Lk, H = query.shape[0], query.shape[1], key.shape[1], self.h
        q, k, v = (
            self.split(self.w_q(query)),
            self.split(self.w_k(key)),
            self.split(self.w_v(value)),
        )  # (B*H, L, d)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.d_k)  # (B*H, Lq, Lk)
        mask = mask.unsqueeze(1).repeat(1, H, 1, 1).view(B * H, Lq, Lk)  # (B*H, Lq, Lk) batch-major
        attn = self.softmax(scores.masked_fill(mask, float("-inf")))
        self.sink.append((label, attn.detach().view(B, H, Lq, Lk).clone()))  # (B, H, Lq, Lk)
        out = torch.bmm(attn, v).view(B, H, Lq, self.d_k).transpose(1, 2).contiguous()  # (B, Lq, H, d)
        return self.w_o(out.view(B, Lq, H * self.d_k))


class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, sink):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads, sink, "enc_self")
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x, src_mask):
        x = self.norm1(x + self.attn(x, x, x, src_mask))
        return self.norm2(x + self.ff(x))


class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, sink):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads, sink, "dec_self")  # used twice
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.norm1(x + self.attn(x, x, x, tgt_mask))
        x = self.norm2(x + self.attn(x, memory, memory, src_mask))
        return self.norm3(x + self.ff(x))


class Transformer(nn.Module):
    def __init__(self, vocab=len(VOCAB), d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=128):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.d_model = d_model
        self.src_emb, self.tgt_emb = nn.Embedding(vocab, d_model), nn.Embedding(vocab, d_model)
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe)
        self.encoder = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, self.computed) for _ in range(n_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, self.computed) for _ in range(n_layers)
        )
        self.proj = nn.Linear(d_model, vocab)
        self.softmax = nn.Softmax(dim=2)  # the Generator

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        B, S, T = src.shape[0], src.shape[1], tgt.shape[1]
        src_pad = (src == PAD).unsqueeze(1)  # (B, 1, S)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)
        tgt_mask = (tgt == PAD).unsqueeze(1) | causal  # (B, T, T) True = masked
        x = self.src_emb(src) * math.sqrt(self.d_model) + self.pe[:S]
        for layer in self.encoder:
            x = layer(x, src_pad.expand(B, S, S))
        y = self.tgt_emb(tgt) * math.sqrt(self.d_model) + self.pe[:T]
        for layer in self.decoder:
            y = layer(y, x, src_pad.expand(B, T, S), tgt_mask)
        return self.softmax(self.proj(y))  # (B, T, V) probabilities


def load() -> nn.Module:
    torch.manual_seed(0)
    return Transformer()


def encode(text: str) -> list[int]:
    """Characters a-z and space (lower-cased), then EOS."""
    bad = sorted({c for c in text.lower() if c not in _STOI})
    if bad:
        raise ValueError(f"characters {''.join(bad)!r} are not in the vocabulary (a-z and space)")
    return [_STOI[c] for c in text.lower()] + [EOS]


def forward(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    return model(src, tgt)
