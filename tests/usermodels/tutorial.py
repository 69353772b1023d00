"""Classic tutorial style encoder-decoder (the many "Transformer from scratch" blog posts and the
PyTorch seq2seq tutorials): one ``MultiHeadAttention`` class with separate q/k/v/o ``nn.Linear``,
heads folded into the batch as 3-D ``(B*H, L, d)`` tensors, ``torch.bmm`` scores, a bool mask
(True = masked) expanded per head, an ``nn.Softmax(dim=2)`` module, and ONE attention module per
decoder layer called twice (masked self-attention, then context attention on the memory).
The ``Generator`` ends in ``nn.Softmax(dim=2)``: the model returns probabilities ``(B, T, V)``.

``bug="headsplit"`` reproduces the classic head-split bug: ``x.view(B * H, -1, d)`` without the
transpose (each "head" gets a mix of positions and features) and the mask expanded head-major
with ``mask.repeat(H, 1, 1)`` while the scores are batch-major, so sequences get other rows' masks.
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD, BOS = 0, 1
VOCAB_SIZE = 20


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, sink: list, self_label: str, bug: str | None = None):
        super().__init__()
        self.h, self.d_k, self.bug = n_heads, d_model // n_heads, bug
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.softmax = nn.Softmax(dim=2)
        self.sink, self.self_label = sink, self_label

    def split(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        if self.bug == "headsplit":
            return x.view(B * self.h, -1, self.d_k)  # (B*H, L, d) WRONG: rows mix positions and heads
        return x.view(B, L, self.h, self.d_k).transpose(1, 2).contiguous().view(B * self.h, L, self.d_k)

    def merge(self, x: torch.Tensor, B: int) -> torch.Tensor:
        L = x.shape[1]
        if self.bug == "headsplit":
            return x.contiguous().view(B, L, self.h * self.d_k)  # (B, L, D) the inverse of the wrong split
        return x.view(B, self.h, L, self.d_k).transpose(1, 2).contiguous().view(B, L, self.h * self.d_k)

    def forward(self, query, key, value, mask: torch.Tensor) -> torch.Tensor:
        """mask: (B, q, k) bool, True = masked."""
        label = self.self_label if query is key else "cross"
        B, Lq, Lk, H = query.shape[0], query.shape[1], key.shape[1], self.h
        q = self.split(self.w_q(query))  # (B*H, Lq, d)
        k = self.split(self.w_k(key))  # (B*H, Lk, d)
        v = self.split(self.w_v(value))  # (B*H, Lk, d)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.d_k)  # (B*H, Lq, Lk)
        if self.bug == "headsplit":
            mask = mask.repeat(H, 1, 1)  # (H*B, Lq, Lk) head-major: WRONG order for batch-major scores
        else:
            mask = mask.unsqueeze(1).repeat(1, H, 1, 1).view(B * H, Lq, Lk)  # (B*H, Lq, Lk)
        scores = scores.masked_fill(mask, float("-inf"))
        attn = self.softmax(scores)  # (B*H, Lq, Lk)
        self.sink.append((label, attn.detach().view(B, H, Lq, Lk).clone()))  # (B, H, Lq, Lk)
        return self.w_o(self.merge(torch.bmm(attn, v), B))  # (B, Lq, D)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x):
        return self.net(x)


class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, sink, bug):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads, sink, "enc_self", bug)
        self.ff = FeedForward(d_model, d_ff)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x, src_mask):
        x = self.norm1(x + self.attn(x, x, x, src_mask))
        return self.norm2(x + self.ff(x))


class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, sink, bug):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads, sink, "dec_self", bug)  # used twice
        self.ff = FeedForward(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.norm1(x + self.attn(x, x, x, tgt_mask))  # masked self-attention
        x = self.norm2(x + self.attn(x, memory, memory, src_mask))  # context attention, same module
        return self.norm3(x + self.ff(x))


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 128):
        super().__init__()
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[: x.shape[1]]


class Generator(nn.Module):
    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)
        self.softmax = nn.Softmax(dim=2)

    def forward(self, x):
        return self.softmax(self.proj(x))  # (B, T, V) probabilities


class Transformer(nn.Module):
    def __init__(self, vocab=VOCAB_SIZE, d_model=32, n_heads=4, d_ff=64, n_layers=2, bug=None):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.d_model = d_model
        self.src_emb, self.tgt_emb = nn.Embedding(vocab, d_model), nn.Embedding(vocab, d_model)
        self.pos = PositionalEncoding(d_model)
        args = (d_model, n_heads, d_ff, self.computed, bug)
        self.encoder = nn.ModuleList(EncoderLayer(*args) for _ in range(n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*args) for _ in range(n_layers))
        self.generator = Generator(d_model, vocab)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        B, S, T = src.shape[0], src.shape[1], tgt.shape[1]
        src_pad = (src == PAD).unsqueeze(1)  # (B, 1, S)
        src_mask = src_pad.expand(B, S, S)  # (B, S, S) True = masked
        ctx_mask = src_pad.expand(B, T, S)  # (B, T, S)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)
        tgt_mask = (tgt == PAD).unsqueeze(1) | causal  # (B, T, T)
        x = self.pos(self.src_emb(src) * math.sqrt(self.d_model))
        for layer in self.encoder:
            x = layer(x, src_mask)
        memory = x
        y = self.pos(self.tgt_emb(tgt) * math.sqrt(self.d_model))
        for layer in self.decoder:
            y = layer(y, memory, ctx_mask, tgt_mask)
        return self.generator(y)


def build(seed: int = 0, bug: str | None = None) -> Transformer:
    if bug not in (None, "headsplit"):
        raise ValueError(f"unknown bug {bug!r}; known: 'headsplit'")
    torch.manual_seed(seed)
    return Transformer(bug=bug).eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """src (3, 7) with 7, 5, 3 real tokens; tgt (3, 6) with BOS first and 6, 4, 2 real tokens."""
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 3, 4, 5, 6, 7], [1, 8, 9, 10, 0, 0], [1, 11, 0, 0, 0, 0]])
    return src, tgt
