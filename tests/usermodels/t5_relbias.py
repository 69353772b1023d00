"""T5-style encoder: a relative position bias from an ``nn.Embedding(num_buckets, n_heads)`` of
log-spaced relative-position buckets, computed once (before the tokens are embedded) and added
to every layer's unscaled scores ``torch.matmul(q, k.transpose(3, 2))``, a padding mask applied
with ``masked_fill(mask == 0, torch.finfo(scores.dtype).min)``, the softmax in float32
``F.softmax(scores.float(), dim=-1).type_as(scores)``, RMS layer norm, no biases.
forward(input_ids, attention_mask) -> hidden states (B, L, D).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
VOCAB_SIZE, D_MODEL, N_HEADS, N_LAYERS, NUM_BUCKETS, MAX_DISTANCE = 20, 32, 4, 2, 8, 16


def relative_position_bucket(relative_position, num_buckets=NUM_BUCKETS, max_distance=MAX_DISTANCE):
    num_buckets //= 2  # bidirectional: half the buckets for keys after the query
    buckets = (relative_position > 0).to(torch.long) * num_buckets
    n = torch.abs(relative_position)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, n, large)


class T5Attention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.n_heads, self.d_kv = N_HEADS, D_MODEL // N_HEADS
        self.q, self.k, self.v, self.o = (nn.Linear(D_MODEL, D_MODEL, bias=False) for _ in range(4))
        self.sink = sink

    def forward(self, hidden_states, mask, position_bias):
        B, L, _ = hidden_states.shape

        def shape(states):
            return states.view(B, -1, self.n_heads, self.d_kv).transpose(1, 2)

        q, k, v = shape(self.q(hidden_states)), shape(self.k(hidden_states)), shape(self.v(hidden_states))
        scores = torch.matmul(q, k.transpose(3, 2))  # (B, H, L, L): T5 does not scale
        scores = scores + position_bias  # (1, H, L, L)
        scores = scores.masked_fill(mask[:, None, None, :] == 0, torch.finfo(scores.dtype).min)
        attn_weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        self.sink.append(("enc_self", attn_weights.detach().clone()))
        out = torch.matmul(attn_weights, v).transpose(1, 2).contiguous().view(B, -1, D_MODEL)
        return self.o(out)


class T5LayerNorm(nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(D_MODEL)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class T5Block(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.ln1, self.SelfAttention, self.ln2 = T5LayerNorm(), T5Attention(sink), T5LayerNorm()
        self.wi, self.wo = nn.Linear(D_MODEL, 64, bias=False), nn.Linear(64, D_MODEL, bias=False)

    def forward(self, x, mask, position_bias):
        x = x + self.SelfAttention(self.ln1(x), mask, position_bias)
        return x + self.wo(F.relu(self.wi(self.ln2(x))))


class T5Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embed_tokens = nn.Embedding(VOCAB_SIZE, D_MODEL)
        self.relative_attention_bias = nn.Embedding(NUM_BUCKETS, N_HEADS)
        self.block = nn.ModuleList(T5Block(self.computed) for _ in range(N_LAYERS))
        self.final_layer_norm = T5LayerNorm()

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def compute_bias(self, query_length: int, key_length: int) -> torch.Tensor:
        context_position = torch.arange(query_length, dtype=torch.long)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long)[None, :]
        buckets = relative_position_bucket(memory_position - context_position)  # (q, k)
        values = self.relative_attention_bias(buckets)  # (q, k, H)
        return values.permute([2, 0, 1]).unsqueeze(0)  # (1, H, q, k)

    def forward(self, input_ids, attention_mask):
        L = input_ids.shape[1]
        position_bias = self.compute_bias(L, L)  # shared by every layer
        x = self.embed_tokens(input_ids)
        for layer in self.block:
            x = layer(x, attention_mask, position_bias)
        return self.final_layer_norm(x)


def build(seed: int = 0) -> T5Encoder:
    torch.manual_seed(seed)
    return T5Encoder().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (3, 7) with 7, 5, 3 real tokens; attention_mask 1 = real, 0 = padding."""
    ids = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]])
    return ids, (ids != PAD).long()
