"""Multi-query attention (Shazeer 2019; PaLM) with the query heads FOLDED INTO THE QUERY AXIS, the trick
PaLM-style implementations use to run MQA as one batched matmul: ``q.view(b, n, h, d).transpose(1, 2)
.reshape(b, h * n, d)`` gives queries ``(B, H*L, d)`` (row ``h_i * L + i``), a single shared key/value head
``(B, L, d)``, scores ``q @ k.transpose(1, 2)`` of shape ``(B, H*L, L)``, a causal mask ``(L, L)`` tiled
over the heads with ``.repeat(h, 1)`` plus a key padding mask, ``masked_fill(-inf)``, ``softmax(dim=-1)``,
``attn @ v`` and the folded rows unfolded back to ``(B, L, H*d)``. PaLM's parallel block (attention and
feed-forward from one fused input projection, added to the same residual). Decoder-only LM:
forward(x) -> next-token logits ``(B, L, VOCAB_SIZE)``; kind ``dec_self``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
VOCAB_SIZE = 20


class ParallelMQABlock(nn.Module):
    def __init__(self, dim: int, heads: int, sink: list, ff_mult: int = 2):
        super().__init__()
        self.heads = heads
        self.dim_head = dim // heads
        self.scale = self.dim_head**-0.5
        self.sink = sink
        self.norm = nn.LayerNorm(dim)
        attn_inner = heads * self.dim_head
        ff_inner = dim * ff_mult
        # q (all heads), one shared k, one shared v, and the feed-forward's two halves (SwiGLU)
        self.fused_dims = (attn_inner, self.dim_head, self.dim_head, ff_inner * 2)
        self.fused_attn_ff_proj = nn.Linear(dim, sum(self.fused_dims), bias=False)
        self.attn_out = nn.Linear(attn_inner, dim, bias=False)
        self.ff_out = nn.Linear(ff_inner, dim, bias=False)

    def forward(self, x, key_padding_mask):
        b, n, _ = x.shape
        h, d = self.heads, self.dim_head
        y = self.norm(x)
        q, k, v, ff = self.fused_attn_ff_proj(y).split(self.fused_dims, dim=-1)

        # fold the heads into the query axis: (B, L, H*d) -> (B, H, L, d) -> (B, H*L, d)
        q = q.view(b, n, h, d).transpose(1, 2).reshape(b, h * n, d)
        q = q * self.scale

        sim = q @ k.transpose(1, 2)  # (B, H*L, L): one shared key head

        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)  # True = future
        causal = causal.repeat(h, 1)  # (H*L, L): row h_i * L + i is query i
        mask = causal.unsqueeze(0) | key_padding_mask[:, None, :]  # (B, H*L, L)
        sim = sim.masked_fill(mask, float("-inf"))

        attn = sim.softmax(dim=-1)
        self.sink.append(("dec_self", attn.detach().view(b, h, n, n).clone()))

        out = attn @ v  # (B, H*L, d)
        out = out.view(b, h, n, d).transpose(1, 2).reshape(b, n, h * d)  # (B, L, H*d)

        a, gate = ff.chunk(2, dim=-1)
        return x + self.attn_out(out) + self.ff_out(F.silu(gate) * a)


class PaLMLM(nn.Module):
    def __init__(self, num_tokens: int = VOCAB_SIZE, dim: int = 32, depth: int = 2, heads: int = 4):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.token_emb = nn.Embedding(num_tokens, dim)
        self.pos_emb = nn.Embedding(64, dim)
        self.layers = nn.ModuleList([ParallelMQABlock(dim, heads, self.computed) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.to_logits = nn.Linear(dim, num_tokens, bias=False)
        self.to_logits.weight = self.token_emb.weight  # tied embeddings

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention blocks hold this same list

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key_padding_mask = x == PAD  # (B, L) True = PAD
        pos = torch.arange(x.shape[1], device=x.device)
        h = self.token_emb(x) + self.pos_emb(pos)
        for layer in self.layers:
            h = layer(h, key_padding_mask)
        return self.to_logits(self.norm(h))  # (B, L, V)


def build(seed: int = 0) -> PaLMLM:
    torch.manual_seed(seed)
    return PaLMLM().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """x (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
