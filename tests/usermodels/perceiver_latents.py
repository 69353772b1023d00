"""A Perceiver-style encoder (lucidrains/perceiver-pytorch): a LEARNED latent array
``nn.Parameter(torch.randn(num_latents, dim))`` (6 latents) repeated over the batch with einops
``repeat(self.latents, 'n d -> b n d', b=b)``; cross-attention from the latents (queries, 6 of them) to the
token embeddings (keys and values, 7 of them, with a key padding mask), so the attention map is
``(B, H, 6, L)`` and its queries are no input positions at all; then two latent self-attention layers
``(B, H, 6, 6)`` (no mask). Heads folded BATCH-major as perceiver-pytorch does: ``rearrange(t,
'b n (h d) -> (b h) n d', h=h)``, ``einsum('b i d, b j d -> b i j', q, k) * self.scale``, the mask
``repeat(mask, 'b j -> (b h) () j', h=h)`` applied IN PLACE with ``sim.masked_fill_(~mask, -finfo.max)``,
``sim.softmax(dim=-1)``, ``einsum('b i j, b j d -> b i d', attn, v)``, ``rearrange(out, '(b h) n d -> b n
(h d)', h=h)``. Kinds: the latent-to-token attention is ``cross``, the latent self-attention ``enc_self``.
Classifier: forward(x) -> class logits ``(B, N_CLASSES)`` (mean over the latents).
"""

from __future__ import annotations

import torch
from einops import rearrange, repeat
from torch import einsum, nn

PAD = 0
VOCAB_SIZE = 20
N_CLASSES = 3


def exists(val) -> bool:
    return val is not None


def default(val, d):
    return val if exists(val) else d


class PreNorm(nn.Module):
    def __init__(self, dim: int, fn: nn.Module, context_dim: int | None = None):
        super().__init__()
        self.fn = fn
        self.norm = nn.LayerNorm(dim)
        self.norm_context = nn.LayerNorm(context_dim) if exists(context_dim) else None

    def forward(self, x, **kwargs):
        x = self.norm(x)
        if exists(self.norm_context):
            context = kwargs["context"]
            kwargs.update(context=self.norm_context(context))
        return self.fn(x, **kwargs)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim * mult), nn.GELU(), nn.Linear(dim * mult, dim))

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, query_dim, sink, kind, context_dim=None, heads=4, dim_head=8):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = default(context_dim, query_dim)
        self.scale = dim_head**-0.5
        self.heads = heads
        self.sink, self.kind = sink, kind
        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_kv = nn.Linear(context_dim, inner_dim * 2, bias=False)
        self.to_out = nn.Linear(inner_dim, query_dim)

    def forward(self, x, context=None, mask=None):
        h = self.heads
        q = self.to_q(x)
        context = default(context, x)
        k, v = self.to_kv(context).chunk(2, dim=-1)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> (b h) n d", h=h), (q, k, v))

        sim = einsum("b i d, b j d -> b i j", q, k) * self.scale

        if exists(mask):
            mask = rearrange(mask, "b ... -> b (...)")
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = repeat(mask, "b j -> (b h) () j", h=h)
            sim.masked_fill_(~mask, max_neg_value)

        # attention, what we cannot get enough of
        attn = sim.softmax(dim=-1)
        self.sink.append((self.kind, rearrange(attn.detach(), "(b h) i j -> b h i j", h=h).clone()))

        out = einsum("b i j, b j d -> b i d", attn, v)
        out = rearrange(out, "(b h) n d -> b n (h d)", h=h)
        return self.to_out(out)


class Perceiver(nn.Module):
    def __init__(
        self,
        num_tokens=VOCAB_SIZE,
        input_dim=24,
        num_latents=6,
        latent_dim=32,
        cross_heads=2,
        latent_heads=4,
        cross_dim_head=8,
        latent_dim_head=8,
        depth=2,
        max_len=64,
    ):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.token_emb = nn.Embedding(num_tokens, input_dim)
        self.pos_emb = nn.Embedding(max_len, input_dim)
        self.latents = nn.Parameter(torch.randn(num_latents, latent_dim))

        self.cross_attend_block = nn.ModuleList(
            [
                PreNorm(
                    latent_dim,
                    Attention(
                        latent_dim,
                        self.computed,
                        "cross",
                        context_dim=input_dim,
                        heads=cross_heads,
                        dim_head=cross_dim_head,
                    ),
                    context_dim=input_dim,
                ),
                PreNorm(latent_dim, FeedForward(latent_dim)),
            ]
        )
        self.layers = nn.ModuleList([])
        for _ in range(depth):
            self.layers.append(
                nn.ModuleList(
                    [
                        PreNorm(
                            latent_dim,
                            Attention(
                                latent_dim,
                                self.computed,
                                "enc_self",
                                heads=latent_heads,
                                dim_head=latent_dim_head,
                            ),
                        ),
                        PreNorm(latent_dim, FeedForward(latent_dim)),
                    ]
                )
            )
        self.to_logits = nn.Sequential(nn.LayerNorm(latent_dim), nn.Linear(latent_dim, N_CLASSES))

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        b, n = data.shape
        mask = data != PAD  # (b, n) True = real token
        data = self.token_emb(data) + self.pos_emb(torch.arange(n, device=data.device))

        x = repeat(self.latents, "n d -> b n d", b=b)

        cross_attn, cross_ff = self.cross_attend_block
        x = cross_attn(x, context=data, mask=mask) + x
        x = cross_ff(x) + x

        for self_attn, self_ff in self.layers:
            x = self_attn(x) + x
            x = self_ff(x) + x

        x = x.mean(dim=-2)  # mean over the latents
        return self.to_logits(x)


def build(seed: int = 0) -> Perceiver:
    torch.manual_seed(seed)
    return Perceiver().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """x (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
