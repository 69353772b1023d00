"""Attention inside a custom ``torch.autograd.Function`` (a hand-written fused attention with its own
``backward``, as people write before reaching for a kernel) and every block run through
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` in training mode with dropout: the
forward is recomputed during ``backward()``. Encoder; forward(tokens) -> hidden states (B, T, D).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

PAD = 0
VOCAB_SIZE, D_MODEL, N_HEADS, N_LAYERS = 20, 32, 4, 2


class FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, keep):
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return torch.matmul(probs, v), probs

    @staticmethod
    def backward(ctx, grad_out, grad_probs):
        q, k, v, probs = ctx.saved_tensors
        grad_v = probs.transpose(-2, -1) @ grad_out
        grad_p = grad_out @ v.transpose(-2, -1) + grad_probs
        grad_s = probs * (grad_p - (grad_p * probs).sum(-1, keepdim=True)) * ctx.scale
        return grad_s @ k, grad_s.transpose(-2, -1) @ q, grad_v, None


class Block(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.h, self.d = N_HEADS, D_MODEL // N_HEADS
        self.ln1, self.qkv, self.proj = (
            nn.LayerNorm(D_MODEL),
            nn.Linear(D_MODEL, 3 * D_MODEL),
            nn.Linear(D_MODEL, D_MODEL),
        )
        self.ln2, self.mlp = (
            nn.LayerNorm(D_MODEL),
            nn.Sequential(nn.Linear(D_MODEL, 64), nn.GELU(), nn.Linear(64, D_MODEL)),
        )
        self.dropout = nn.Dropout(0.1)
        self.sink = sink

    def forward(self, x, keep):
        B, T, _ = x.shape
        q, k, v = (
            t.view(B, T, self.h, self.d).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, dim=-1)
        )
        out, probs = FusedAttention.apply(q, k, v, keep)
        self.sink.append(("enc_self", probs.detach().clone()))  # and again when checkpoint recomputes
        x = x + self.dropout(self.proj(out.transpose(1, 2).reshape(B, T, D_MODEL)))
        return x + self.dropout(self.mlp(self.ln2(x)))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.tok = nn.Embedding(VOCAB_SIZE, D_MODEL, padding_idx=PAD)
        self.pos = nn.Embedding(32, D_MODEL)
        self.blocks = nn.ModuleList(Block(self.computed) for _ in range(N_LAYERS))

    def reset(self) -> None:
        self.computed.clear()  # in place: the blocks hold this same list

    def forward(self, tokens):
        keep = tokens != PAD
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = checkpoint(block, x, keep, use_reentrant=False) if self.training else block(x, keep)
        return F.layer_norm(x, (D_MODEL,))


def build(seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    return Encoder().train()


def sample_batch() -> tuple[torch.Tensor]:
    """tokens (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
