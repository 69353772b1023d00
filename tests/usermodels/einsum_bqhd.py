"""einsum everywhere, heads kept in the last-but-one dim (no transposes; the Informer / JAX-port
style): ``q = self.to_q(x).view(B, L, H, d)``, scores ``torch.einsum("bqhd,bkhd->bhqk", q, k)``,
a key-padding mask ``masked_fill(~keep[:, None, None, :], float("-inf"))``, the softmax over
``dim=3`` (a positive index), output ``torch.einsum("bhqk,bkhd->bqhd", attn, v)``. Pre-norm
encoder with sinusoidal positions; forward(tokens) -> hidden states (B, L, D).
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0
VOCAB_SIZE, D_MODEL, N_HEADS, N_LAYERS = 20, 32, 4, 2


class EinsumAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.heads, self.dim_head = N_HEADS, D_MODEL // N_HEADS
        self.to_q, self.to_k, self.to_v = (nn.Linear(D_MODEL, D_MODEL, bias=False) for _ in range(3))
        self.to_out = nn.Linear(D_MODEL, D_MODEL)
        self.sink = sink

    def forward(self, x, keep):
        B, L, _ = x.shape
        q = self.to_q(x).view(B, L, self.heads, self.dim_head)
        k = self.to_k(x).view(B, L, self.heads, self.dim_head)
        v = self.to_v(x).view(B, L, self.heads, self.dim_head)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.dim_head)  # (B, H, L, L)
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        attn = torch.softmax(scores, dim=3)
        self.sink.append(("enc_self", attn.detach().clone()))
        out = torch.einsum("bhqk,bkhd->bqhd", attn, v)  # (B, L, H, d)
        return self.to_out(out.reshape(B, L, -1))


class Block(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(D_MODEL), EinsumAttention(sink)
        self.norm2 = nn.LayerNorm(D_MODEL)
        self.ff = nn.Sequential(nn.Linear(D_MODEL, 2 * D_MODEL), nn.ReLU(), nn.Linear(2 * D_MODEL, D_MODEL))

    def forward(self, x, keep):
        x = x + self.attn(self.norm1(x), keep)
        return x + self.ff(self.norm2(x))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embed = nn.Embedding(VOCAB_SIZE, D_MODEL, padding_idx=PAD)
        pos = torch.arange(64)[:, None] / torch.pow(10000.0, torch.arange(0, D_MODEL, 2) / D_MODEL)
        self.register_buffer("pe", torch.cat([pos.sin(), pos.cos()], dim=-1))  # (64, D)
        self.blocks = nn.ModuleList(Block(self.computed) for _ in range(N_LAYERS))
        self.norm = nn.LayerNorm(D_MODEL)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, tokens):
        keep = tokens != PAD  # (B, L) True = real token
        x = self.embed(tokens) * math.sqrt(D_MODEL) + self.pe[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, keep)
        return self.norm(x)


def build(seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    return Encoder().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """tokens (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
