"""Modern decoder-only style (Llama-like code without the rotary details): separate q/k/v projections,
grouped-query attention left to ``F.scaled_dot_product_attention(..., enable_gqa=True)`` (4 query heads,
2 key/value heads), an explicit ``scale=0.3``, and a bool ``attn_mask`` (B, 1, T, T) built from the ids:
causal AND key-not-padding, True = takes part. Pre-norm blocks; forward(idx) -> logits (B, T, V).

SDPA returns no weights, so each attention also computes its probabilities for ``computed`` with
``exp`` and a sum (no grad, no softmax call, not used by the output): a capture tool intercepting
softmax must not see this reference computation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, BOS = 0, 1
VOCAB_SIZE = 20
SCALE = 0.3


def reference_probs(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) with the bool mask, by exp + sum; k repeated for GQA like SDPA does."""
    with torch.no_grad():
        k = k.detach().repeat_interleave(q.size(1) // k.size(1), dim=1)  # (B, Hq, T, hd)
        scores = (q.detach() @ k.transpose(-2, -1)) * scale  # (B, Hq, T, T)
        scores = scores.masked_fill(~allowed, float("-inf"))
        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        return e / e.sum(dim=-1, keepdim=True)


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, sink: list):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        self.sink = sink

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, Hq, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=SCALE, enable_gqa=True)
        self.sink.append(("dec_self", reference_probs(q, k, allowed, SCALE)))  # (B, Hq, T, T)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, D)


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, sink: list):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d_model)
        self.self_attn = Attention(d_model, n_heads, n_kv_heads, sink)
        self.post_attention_layernorm = nn.RMSNorm(d_model)
        self.mlp = MLP(d_model, d_ff)

    def forward(self, x, allowed):
        x = x + self.self_attn(self.input_layernorm(x), allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(
        self, vocab=VOCAB_SIZE, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, max_len=64
    ):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embed_tokens = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.embed_positions = nn.Embedding(max_len, d_model)
        self.layers = nn.ModuleList(
            [DecoderLayer(d_model, n_heads, n_kv_heads, d_ff, self.computed) for _ in range(n_layers)]
        )
        self.norm = nn.RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()  # (T, T) True = may attend
        allowed = causal[None, None] & (idx != PAD)[:, None, None, :]  # (B, 1, T, T)
        x = self.embed_tokens(idx) + self.embed_positions(torch.arange(T, device=idx.device))
        for layer in self.layers:
            x = layer(x, allowed)
        return self.lm_head(self.norm(x))  # (B, T, V)


def build(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """idx (3, 7): BOS first, 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[1, 4, 5, 6, 7, 8, 9], [1, 10, 11, 12, 13, 0, 0], [1, 14, 15, 0, 0, 0, 0]]),)
