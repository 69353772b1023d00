"""A decoder-only language model ported line by line from a JAX/Flax codebase: parameters laid out
as Flax's ``DenseGeneral`` keeps them (``(d_model, heads, head_dim)`` kernels applied with
``einsum('btd,dhk->bthk')``), the causal mask built as ``nn.make_causal_mask`` does
(``(B, 1, T, T)`` from a comparison of position ids) combined with the padding mask, scores
masked with ``torch.where(mask, s, finfo.min)``, and ``jax.nn.softmax`` written out as its
definition: ``exp(s - logsumexp(s, axis=-1, keepdims=True))``. forward(ids) -> logits (B, T, V).
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0
VOCAB_SIZE = 50


def softmax(x, axis=-1):  # jax.nn.softmax, as the port writes it
    return torch.exp(x - torch.logsumexp(x, dim=axis, keepdim=True))


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, sink: list):
        super().__init__()
        self.heads, self.head_dim, self.sink = heads, d_model // heads, sink
        shape = (d_model, heads, self.head_dim)
        self.query_kernel = nn.Parameter(torch.randn(shape) / math.sqrt(d_model))
        self.key_kernel = nn.Parameter(torch.randn(shape) / math.sqrt(d_model))
        self.value_kernel = nn.Parameter(torch.randn(shape) / math.sqrt(d_model))
        self.out_kernel = nn.Parameter(torch.randn(heads, self.head_dim, d_model) / math.sqrt(d_model))

    def forward(self, x, mask):
        query = torch.einsum("btd,dhk->bthk", x, self.query_kernel) / math.sqrt(self.head_dim)
        key = torch.einsum("btd,dhk->bthk", x, self.key_kernel)
        value = torch.einsum("btd,dhk->bthk", x, self.value_kernel)
        logits = torch.einsum("bqhk,bthk->bhqt", query, key)
        logits = torch.where(mask, logits, torch.finfo(logits.dtype).min)
        weights = softmax(logits, axis=-1)
        self.sink.append(("dec_self", weights.detach().clone()))
        attended = torch.einsum("bhqt,bthk->bqhk", weights, value)
        return torch.einsum("bqhk,hkd->bqd", attended, self.out_kernel)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, sink: list):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads, sink)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class FlaxPortLM(nn.Module):
    def __init__(self, d_model: int = 32, heads: int = 4, layers: int = 2, max_len: int = 16):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.wte, self.wpe = nn.Embedding(VOCAB_SIZE, d_model), nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads, self.computed) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, ids):
        b, t = ids.shape
        positions = torch.arange(t)[None, :].expand(b, t)
        causal = positions[:, None, :, None] >= positions[:, None, None, :]  # make_causal_mask
        mask = causal & (ids != PAD)[:, None, None, :]
        x = self.wte(ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_f(x) @ self.wte.weight.T


def build(seed: int = 0) -> FlaxPortLM:
    torch.manual_seed(seed)
    return FlaxPortLM().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """ids (3, 7), right-padded after 7, 5 and 4 tokens."""
    ids = torch.randint(1, VOCAB_SIZE, (3, 7), generator=torch.Generator().manual_seed(0))
    ids[1, 5:] = PAD
    ids[2, 4:] = PAD
    return (ids,)
