"""nanoGPT (karpathy) style decoder-only model: ``CausalSelfAttention`` with one fused ``c_attn``
projection split into q, k, v, heads ``(B, nh, T, hs)`` and ``F.scaled_dot_product_attention`` with
``is_causal=True``; pre-norm blocks, learned positions, a tied ``lm_head``; forward(idx) -> logits.

SDPA returns no weights, so each attention also computes its probabilities a second time for
``computed`` (no grad, not used by the output) with ``exp`` and a sum, never a softmax call: a
capture tool that intercepts softmax must not see this reference computation.

``bug="not_causal"`` calls SDPA with ``is_causal=False`` and no mask: a decoder whose positions see
the future (and, in padded batches, the padding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

PAD, BOS = 0, 1


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 20
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    bias: bool = True


def reference_probs(
    q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float | None = None
) -> torch.Tensor:
    """softmax(q k^T * scale) per head, computed with exp + sum (no softmax call, see the docstring)."""
    with torch.no_grad():
        q, k = q.detach(), k.detach()
        scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, T)
        if causal:
            T = q.size(-2)
            future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        return e / e.sum(dim=-1, keepdim=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, sink: list, is_causal: bool = True):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.is_causal, self.sink = is_causal, sink

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0, is_causal=self.is_causal)
        self.sink.append(("dec_self", reference_probs(q, k, self.is_causal)))  # (B, nh, T, T)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, sink: list, is_causal: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, sink, is_causal)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, is_causal: bool = True):
        super().__init__()
        self.config = config
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([Block(config, self.computed, is_causal) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):  # std 0.2, not nanoGPT's 0.02: maps far from uniform
            nn.init.normal_(module.weight, mean=0.0, std=0.2)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.2)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.size()
        assert t <= self.config.block_size, f"sequence of length {t} > block size {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))  # (B, T, V)


def build(seed: int = 0, bug: str | None = None) -> GPT:
    if bug not in (None, "not_causal"):
        raise ValueError(f"unknown bug {bug!r}; known: 'not_causal'")
    torch.manual_seed(seed)
    return GPT(GPTConfig(), is_causal=bug is None).eval()


def sample_batch() -> tuple[torch.Tensor]:
    """idx (3, 7): BOS first, 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[1, 4, 5, 6, 7, 8, 9], [1, 10, 11, 12, 13, 0, 0], [1, 14, 15, 0, 0, 0, 0]]),)
