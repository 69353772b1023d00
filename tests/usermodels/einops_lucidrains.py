"""lucidrains-style encoder (x-transformers, vit-pytorch, ...): one fused ``to_qkv`` projection split
with ``.chunk(3, dim=-1)``, heads split by ``map(lambda t: rearrange(t, 'b n (h d) -> b h n d', h=h), ...)``
with einops, scores with ``torch.einsum('b h i d, b h j d -> b h i j', q, k) * self.scale``, a boolean key
padding mask (True = keep) ``rearrange(mask, 'b j -> b 1 1 j')`` applied with
``sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)`` (a finite fill, not ``-inf``), the softmax spelled
``sim.softmax(dim=-1)``, values mixed with a second einsum and the heads merged with
``rearrange(out, 'b h n d -> b n (h d)')``. ``PreNorm`` / ``Residual`` wrapper modules. Encoder-only
classifier: forward(x) -> class logits ``(B, N_CLASSES)`` (mean over the real positions).
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import einsum, nn

PAD = 0
VOCAB_SIZE = 20
N_CLASSES = 3


def exists(val) -> bool:
    return val is not None


class Residual(nn.Module):
    def __init__(self, fn: nn.Module):
        super().__init__()
        self.fn = fn

    def forward(self, x, **kwargs):
        return self.fn(x, **kwargs) + x


class PreNorm(nn.Module):
    def __init__(self, dim: int, fn: nn.Module):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x, **kwargs):
        return self.fn(self.norm(x), **kwargs)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 2, dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, dim * mult), nn.GELU(), nn.Dropout(dropout), nn.Linear(dim * mult, dim)
        )

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim: int, sink: list, heads: int = 4, dim_head: int = 8, dropout: float = 0.0):
        super().__init__()
        inner_dim = dim_head * heads
        self.heads = heads
        self.scale = dim_head**-0.5
        self.sink = sink
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.to_out = nn.Linear(inner_dim, dim)

    def forward(self, x, mask=None):
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.heads), (q, k, v))

        sim = einsum("b h i d, b h j d -> b h i j", q, k) * self.scale

        if exists(mask):
            mask = rearrange(mask, "b j -> b 1 1 j")
            sim = sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)

        attn = sim.softmax(dim=-1)
        self.sink.append(("enc_self", attn.detach().clone()))  # (b, h, i, j)
        attn = self.dropout(attn)

        out = einsum("b h i j, b h j d -> b h i d", attn, v)
        out = rearrange(out, "b h n d -> b n (h d)")
        return self.to_out(out)


class Transformer(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, dim_head: int, sink: list):
        super().__init__()
        self.layers = nn.ModuleList([])
        for _ in range(depth):
            self.layers.append(
                nn.ModuleList(
                    [
                        Residual(PreNorm(dim, Attention(dim, sink, heads=heads, dim_head=dim_head))),
                        Residual(PreNorm(dim, FeedForward(dim))),
                    ]
                )
            )

    def forward(self, x, mask=None):
        for attn, ff in self.layers:
            x = attn(x, mask=mask)
            x = ff(x)
        return x


class TransformerClassifier(nn.Module):
    def __init__(self, num_tokens=VOCAB_SIZE, dim=32, depth=2, heads=4, dim_head=8, max_seq_len=64):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.token_emb = nn.Embedding(num_tokens, dim)
        self.pos_emb = nn.Embedding(max_seq_len, dim)
        self.transformer = Transformer(dim, depth, heads, dim_head, self.computed)
        self.norm = nn.LayerNorm(dim)
        self.to_logits = nn.Linear(dim, N_CLASSES)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x != PAD  # (b, n) True = real token
        n = x.shape[1]
        x = self.token_emb(x) + self.pos_emb(torch.arange(n, device=x.device))
        x = self.transformer(x, mask=mask)
        x = self.norm(x)
        m = rearrange(mask.float(), "b n -> b n 1")
        pooled = (x * m).sum(dim=1) / m.sum(dim=1)  # masked mean
        return self.to_logits(pooled)


def build(seed: int = 0) -> TransformerClassifier:
    torch.manual_seed(seed)
    return TransformerClassifier().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """x (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
