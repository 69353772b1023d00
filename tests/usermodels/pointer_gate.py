"""Softmaxes over SQUARE tensors that are not attention, next to one that is: a sorting/pointer
network (Vinyals et al.) whose additive pointer scores ``v^T tanh(W1 e_j + W2 d_i)`` come out of an
``nn.Linear`` as ``(B, T, T)`` and are softmaxed over the input positions, and a mixture-of-experts
token router ``F.softmax(self.router(x), dim=-1)`` with as many experts as the batch has tokens
(``(B, T, T)`` too). Only the encoder's self-attention is attention.
forward(tokens) -> pointer distribution (B, T, T).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
VOCAB_SIZE, D_MODEL, N_HEADS, N_EXPERTS = 20, 32, 4, 7


class SelfAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.h, self.d = N_HEADS, D_MODEL // N_HEADS
        self.qkv, self.proj = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
        self.sink = sink

    def forward(self, x, keep):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, self.h, self.d).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
        attn = scores.masked_fill(~keep[:, None, None, :], float("-inf")).softmax(dim=-1)
        self.sink.append(("enc_self", attn.detach().clone()))
        return self.proj((attn @ v).transpose(1, 2).reshape(B, T, D_MODEL))


class MoE(nn.Module):
    """Soft mixture of experts: every token mixes all experts by its router probabilities."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D_MODEL, N_EXPERTS)
        self.experts = nn.ModuleList(nn.Linear(D_MODEL, D_MODEL) for _ in range(N_EXPERTS))

    def forward(self, x):
        gates = F.softmax(self.router(x), dim=-1)  # (B, T, E) with E == T here: not attention
        outs = torch.stack([e(x) for e in self.experts], dim=-2)  # (B, T, E, D)
        return (gates.unsqueeze(-1) * outs).sum(dim=-2)


class PointerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embedding = nn.Embedding(VOCAB_SIZE, D_MODEL, padding_idx=PAD)
        self.encoder = SelfAttention(self.computed)
        self.moe = MoE()
        self.decoder_rnn = nn.GRU(D_MODEL, D_MODEL, batch_first=True)
        self.W1, self.W2 = nn.Linear(D_MODEL, D_MODEL, bias=False), nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.v = nn.Linear(D_MODEL, 1, bias=False)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention module holds this same list

    def forward(self, tokens):
        keep = tokens != PAD
        e = self.embedding(tokens)
        e = e + self.encoder(e, keep)
        e = e + self.moe(e)
        d, _ = self.decoder_rnn(e)  # teacher-forced decoder states (B, T, D)
        u = self.v(torch.tanh(self.W1(e)[:, None, :, :] + self.W2(d)[:, :, None, :])).squeeze(-1)  # (B, T, T)
        return F.softmax(u.masked_fill(~keep[:, None, :], float("-inf")), dim=-1)  # points at inputs


def build(seed: int = 0) -> PointerNet:
    torch.manual_seed(seed)
    return PointerNet().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """tokens (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
