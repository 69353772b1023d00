"""Heads folded HEAD-major with einops, as in lucidrains' older repos and many einops-based ports:
``rearrange(t, 'b n (h d) -> (h b) n d', h=h)`` (row ``h_i * B + b``), the key padding mask expanded to
the folded batch with ``repeat(mask, 'b j -> (h b) 1 j', h=h)`` (einops.repeat, same head-major order),
``torch.bmm`` scores times a scale, ``masked_fill(~mask, float('-inf'))``, ``softmax(dim=-1)`` over the
3-D ``(h*b, i, j)`` scores, ``torch.bmm`` with the values and the heads unfolded with
``rearrange(out, '(h b) n d -> b n (h d)', h=h)``. Post-norm residual blocks. Encoder-only classifier:
forward(x) -> class logits ``(B, N_CLASSES)`` (mean over the real positions).
"""

from __future__ import annotations

import torch
from einops import rearrange, repeat
from torch import nn

PAD = 0
VOCAB_SIZE = 20
N_CLASSES = 3


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, sink: list):
        super().__init__()
        self.heads = heads
        self.dim_head = dim // heads
        self.scale = self.dim_head**-0.5
        self.sink = sink
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_kv = nn.Linear(dim, dim * 2, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x, mask):
        h = self.heads
        q = self.to_q(x)
        k, v = self.to_kv(x).chunk(2, dim=-1)
        q, k, v = (rearrange(t, "b n (h d) -> (h b) n d", h=h) for t in (q, k, v))  # (h*b, n, d)

        dots = torch.bmm(q, k.transpose(1, 2)) * self.scale  # (h*b, i, j)
        mask = repeat(mask, "b j -> (h b) 1 j", h=h)  # (h*b, 1, j) True = keep
        dots = dots.masked_fill(~mask, float("-inf"))
        attn = dots.softmax(dim=-1)
        self.sink.append(("enc_self", rearrange(attn.detach(), "(h b) i j -> b h i j", h=h).clone()))

        out = torch.bmm(attn, v)  # (h*b, n, d)
        out = rearrange(out, "(h b) n d -> b n (h d)", h=h)
        return self.to_out(out)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, sink: list):
        super().__init__()
        self.attn = Attention(dim, heads, sink)
        self.norm1 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, dim * 2), nn.ReLU(), nn.Linear(dim * 2, dim))
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x, mask):
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.ff(x))


class Classifier(nn.Module):
    def __init__(self, dim: int = 24, heads: int = 3, depth: int = 2, max_len: int = 64):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.emb = nn.Embedding(VOCAB_SIZE, dim, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(1, max_len, dim) * 0.1)
        self.blocks = nn.ModuleList([Block(dim, heads, self.computed) for _ in range(depth)])
        self.head = nn.Linear(dim, N_CLASSES)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x != PAD  # (b, n)
        h = self.emb(x) + self.pos[:, : x.shape[1]]
        for block in self.blocks:
            h = block(h, mask)
        m = mask.unsqueeze(-1).float()
        return self.head((h * m).sum(1) / m.sum(1))


def build(seed: int = 0) -> Classifier:
    torch.manual_seed(seed)
    return Classifier().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """x (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
