"""An image captioner's decoder: image patches cut by a strided ``nn.Conv2d`` (as a ViT stem),
text tokens embedded; each block runs causal self-attention over the text, then attention from
the text to the patches. One ``Mix`` module class for both, named ``mix1``/``mix2`` (nothing in the
path says "cross"), and as many patches (2 x 3 = 6) as text tokens: only where the queries and
keys come from tells the two apart. forward(image, ids) -> next-token logits (B, T, V).
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0
VOCAB_SIZE = 30


class Mix(nn.Module):
    def __init__(self, d: int, heads: int, kind: str, sink: list):
        super().__init__()
        self.h, self.kind, self.sink = heads, kind, sink
        self.q, self.kv, self.o = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def forward(self, x, ctx, causal: bool):
        b, t, d = x.shape
        s = ctx.shape[1]
        q = self.q(x).view(b, t, self.h, d // self.h).transpose(1, 2)
        k, v = self.kv(ctx).view(b, s, 2, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        w = q @ k.transpose(-2, -1) / math.sqrt(d // self.h)
        if causal:
            w = w.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(1), float("-inf"))
        w = torch.softmax(w, dim=-1)
        self.sink.append((self.kind, w.detach().clone()))
        return self.o((w @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, sink: list):
        super().__init__()
        self.mix1, self.mix2 = Mix(d, heads, "dec_self", sink), Mix(d, heads, "cross", sink)
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x, patches):
        h = self.n1(x)
        x = x + self.mix1(h, h, causal=True)
        return x + self.mix2(self.n2(x), patches, causal=False)


class Captioner(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4, depth: int = 2, patch: int = 4):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.stem = nn.Conv2d(3, d, kernel_size=patch, stride=patch)
        self.embed = nn.Embedding(VOCAB_SIZE, d)
        self.blocks = nn.ModuleList([Block(d, heads, self.computed) for _ in range(depth)])
        self.lm = nn.Linear(d, VOCAB_SIZE)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, image: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        patches = self.stem(image).flatten(2).transpose(1, 2)  # (B, 6, d)
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, patches)
        return self.lm(x)


def build(seed: int = 0) -> Captioner:
    torch.manual_seed(seed)
    return Captioner().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """images (2, 3, 8, 12) -> 2 x 3 patches; captions (2, 6)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, 8, 12, generator=g), torch.randint(1, VOCAB_SIZE, (2, 6), generator=g)
