"""Shaw, Uszkoreit & Vaswani (2018), "Self-Attention with Relative Position Representations", the way
its PyTorch re-implementations write it: no absolute positions; a learned table
``rel_k_table`` (2 * max_rel + 1, d_head) gathered by plain indexing with a clipped (L, L)
relative-distance LongTensor (no ``nn.Embedding``), the scores ``torch.matmul(q, k.transpose(-1, -2))``
plus the relative term ``torch.einsum('bhqd,qkd->bhqk', q, rel_k)`` (a product of the queries with a
*parameter* gathered per (query, key) pair), scaled, key padding ``masked_fill(mask == 0, -1e9)``,
softmax; the values get the same relative term on the value side
(``torch.einsum('bhqk,qkd->bhqd', attn, rel_v)``). Encoder-only: forward(src) -> (B, L, d_model).
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0
VOCAB_SIZE, D_MODEL, N_HEADS, N_LAYERS, MAX_REL = 20, 32, 4, 2, 3


def relative_index(length: int, max_rel: int, device=None) -> torch.Tensor:
    r = torch.arange(length, device=device)
    distance = r[None, :] - r[:, None]  # (L, L): key - query
    return torch.clamp(distance, -max_rel, max_rel) + max_rel  # 0 .. 2 * max_rel


class RelativeMultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, max_rel: int, sink: list):
        super().__init__()
        self.n_heads, self.d_head, self.max_rel, self.sink = n_heads, d_model // n_heads, max_rel, sink
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.rel_k_table = nn.Parameter(torch.randn(2 * max_rel + 1, self.d_head) * 0.5)
        self.rel_v_table = nn.Parameter(torch.randn(2 * max_rel + 1, self.d_head) * 0.5)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q = self.w_q(x).view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, d)
        k = self.w_k(x).view(B, L, self.n_heads, self.d_head).transpose(1, 2)
        v = self.w_v(x).view(B, L, self.n_heads, self.d_head).transpose(1, 2)
        rel_index = relative_index(L, self.max_rel, x.device)  # (L, L)
        rel_k = self.rel_k_table[rel_index]  # (L, L, d)
        rel_v = self.rel_v_table[rel_index]
        scores = torch.matmul(q, k.transpose(-1, -2))  # (B, H, L, L)
        scores = scores + torch.einsum("bhqd,qkd->bhqk", q, rel_k)
        scores = scores / math.sqrt(self.d_head)
        scores = scores.masked_fill(mask[:, None, None, :] == 0, -1e9)
        attn = torch.softmax(scores, dim=-1)
        self.sink.append(("enc_self", attn.detach().clone()))
        out = torch.matmul(attn, v) + torch.einsum("bhqk,qkd->bhqd", attn, rel_v)
        out = out.transpose(1, 2).contiguous().view(B, L, -1)
        return self.w_o(out)


class EncoderLayer(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.self_attn = RelativeMultiHeadAttention(D_MODEL, N_HEADS, MAX_REL, sink)
        self.norm1, self.norm2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.ff = nn.Sequential(nn.Linear(D_MODEL, 64), nn.ReLU(), nn.Linear(64, D_MODEL))

    def forward(self, x, mask):
        x = self.norm1(x + self.self_attn(x, mask))
        return self.norm2(x + self.ff(x))


class RelativeEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embed = nn.Embedding(VOCAB_SIZE, D_MODEL, padding_idx=PAD)
        self.layers = nn.ModuleList([EncoderLayer(self.computed) for _ in range(N_LAYERS)])

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        mask = (src != PAD).long()  # (B, L): 1 at real tokens
        x = self.embed(src) * math.sqrt(D_MODEL)
        for layer in self.layers:
            x = layer(x, mask)
        return x


def build(seed: int = 0) -> RelativeEncoder:
    torch.manual_seed(seed)
    return RelativeEncoder().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """src (3, 6) with 6, 4, 2 real tokens, right-padded with 0."""
    return (torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 0, 0], [13, 14, 0, 0, 0, 0]]),)
