"""nanoGPT-style decoder-only model WITHOUT a causal mask: F.scaled_dot_product_attention is called
with is_causal=False and no attn_mask, so every position sees the future (and, in padded batches, the
padding). Otherwise the same as gpt_decoder.py: random seeded weights, character vocabulary.

Token convention for ARCH "decoder": ``encode(text)`` is the full token list the model reads for a
prompt, BOS first and no EOS (the model continues it); ``encode_target(text)`` is the continuation,
characters then EOS. forward(model, None, tgt) -> logits (B, T, V). The model's own maps are in
``model.computed`` as ("dec_self", probs (B, H, T, T)), computed by exp + sum, never a softmax call.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

ARCH = "decoder"
VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz ")
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 64
EXAMPLES = ["hello world", "attention"]
IS_CAUSAL = False  # the bug: a decoder that sees the future
_STOI = {c: i for i, c in enumerate(VOCAB) if len(c) == 1}


def reference_probs(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs)) by exp + sum: no softmax call for a capture tool to see."""
    with torch.no_grad():
        scores = (q.detach() @ k.detach().transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, T)
        if causal:
            T = q.size(-2)
            scores = scores.masked_fill(
                torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf")
            )
        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        return e / e.sum(dim=-1, keepdim=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, sink: list, is_causal: bool):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd, self.sink, self.is_causal = n_head, n_embd, sink, is_causal

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0, is_causal=self.is_causal)
        self.sink.append(("dec_self", reference_probs(q, k, self.is_causal)))  # (B, nh, T, T)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, sink: list, is_causal: bool):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, sink, is_causal)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=len(VOCAB), n_embd=32, n_head=4, n_layer=2, block_size=MAX_LEN, is_causal=True):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, self.computed, is_causal) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        for m in self.modules():  # std 0.2: attention far from uniform with random weights
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.2)

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


def load() -> nn.Module:
    torch.manual_seed(0)
    return GPT(is_causal=IS_CAUSAL)


def _chars(text: str) -> list[int]:
    bad = sorted({c for c in text.lower() if c not in _STOI})
    if bad:
        raise ValueError(f"characters {''.join(bad)!r} are not in the vocabulary (a-z and space)")
    return [_STOI[c] for c in text.lower()]


def encode(text: str) -> list[int]:
    """The prompt the model reads: BOS, then the characters (a-z and space, lower-cased)."""
    return [BOS] + _chars(text)


def encode_target(text: str) -> list[int]:
    """A continuation: the characters, then EOS."""
    return _chars(text) + [EOS]


def forward(model: nn.Module, src: None, tgt: torch.Tensor) -> torch.Tensor:
    return model(tgt)
