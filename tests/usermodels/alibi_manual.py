"""A GPT-style decoder with ALiBi (Press, Smith & Lewis, 2022, "Train Short, Test Long") written by hand,
the way blog posts and small repos add it to a nanoGPT-like model: no position embedding at all;
per-head slopes ``2 ** (-8 / n_heads * (i + 1))``, a bias
``slopes[:, None, None] * (torch.arange(L)[None, :] - torch.arange(L)[:, None])`` (H, L, L) added to
the scaled scores, the causal mask as an additive ``torch.triu(torch.full((L, L), float('-inf')),
diagonal=1)``, right padding masked as well with ``masked_fill(..., float('-inf'))``; fused ``c_attn``
projection split with ``.split(d_model, dim=2)``, pre-norm blocks, tied LM head.
forward(idx) -> logits (B, L, VOCAB_SIZE).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
VOCAB_SIZE, D_MODEL, N_HEADS, N_LAYERS = 24, 32, 4, 2


def get_alibi_slopes(n_heads: int) -> torch.Tensor:
    return torch.tensor([2 ** (-8 / n_heads * (i + 1)) for i in range(n_heads)])


class ALiBiSelfAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.n_head, self.n_embd, self.sink = N_HEADS, D_MODEL, sink
        self.c_attn = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.c_proj = nn.Linear(D_MODEL, D_MODEL)
        self.register_buffer("slopes", get_alibi_slopes(N_HEADS), persistent=False)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        distance = torch.arange(T, device=x.device)[None, :] - torch.arange(T, device=x.device)[:, None]
        alibi = self.slopes[:, None, None] * distance  # (nh, T, T): 0 on the diagonal, negative to the left
        att = att + alibi
        causal = torch.triu(torch.full((T, T), float("-inf"), device=x.device), diagonal=1)
        att = att + causal
        att = att.masked_fill(pad_mask[:, None, None, :], float("-inf"))  # right padding (keys)
        att = F.softmax(att, dim=-1)
        self.sink.append(("dec_self", att.detach().clone()))
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.attn = ALiBiSelfAttention(sink)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x, pad_mask):
        x = x + self.attn(self.ln_1(x), pad_mask)
        return x + self.mlp(self.ln_2(x))


class ALiBiGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.wte = nn.Embedding(VOCAB_SIZE, D_MODEL)
        self.h = nn.ModuleList([Block(self.computed) for _ in range(N_LAYERS)])
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.lm_head = nn.Linear(D_MODEL, VOCAB_SIZE, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pad_mask = idx == PAD  # (B, T): True at padding (right-padded)
        x = self.wte(idx)  # ALiBi: no position embedding
        for block in self.h:
            x = block(x, pad_mask)
        return self.lm_head(self.ln_f(x))


def build(seed: int = 0) -> ALiBiGPT:
    torch.manual_seed(seed)
    return ALiBiGPT().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """idx (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[1, 5, 6, 7, 8, 9, 10], [1, 11, 12, 13, 14, 0, 0], [1, 15, 16, 0, 0, 0, 0]]),)
