"""Meta's reference LLaMA code (llama/model.py): RMSNorm, rotary embeddings applied to q and k
through complex numbers (``torch.view_as_complex`` / ``view_as_real`` with precomputed
``freqs_cis``), a KV cache written in place (``self.cache_k[:bsz, start_pos:...] = xk``),
grouped-query heads via ``repeat_kv`` (``expand`` + ``reshape``), scores
``torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(head_dim)``, the causal mask an additive float
tensor ``torch.full((T, T), float("-inf")).triu(1)`` (with ``hstack`` of the cached positions), and
``F.softmax(scores.float(), dim=-1).type_as(xq)``. forward(tokens, start_pos) -> logits.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB_SIZE, DIM, N_HEADS, N_KV_HEADS, N_LAYERS, MAX_SEQ, MAX_BATCH = 20, 32, 4, 2, 2, 16, 4


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    freqs = torch.outer(torch.arange(end, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64 (end, dim / 2)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.n_kv_heads, self.n_local_heads, self.head_dim = N_KV_HEADS, N_HEADS, DIM // N_HEADS
        self.n_rep = N_HEADS // N_KV_HEADS
        self.wq = nn.Linear(DIM, N_HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, N_KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, N_KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(N_HEADS * self.head_dim, DIM, bias=False)
        self.register_buffer(
            "cache_k", torch.zeros(MAX_BATCH, MAX_SEQ, N_KV_HEADS, self.head_dim), persistent=False
        )
        self.register_buffer(
            "cache_v", torch.zeros(MAX_BATCH, MAX_SEQ, N_KV_HEADS, self.head_dim), persistent=False
        )
        self.sink = sink

    def forward(self, x, start_pos, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
        self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
        keys = self.cache_k[:bsz, : start_pos + seqlen]
        values = self.cache_v[:bsz, : start_pos + seqlen]
        keys = repeat_kv(keys, self.n_rep)  # (bs, cache_len + seqlen, n_local_heads, head_dim)
        values = repeat_kv(values, self.n_rep)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask  # (bs, n_local_heads, seqlen, cache_len + seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        self.sink.append(("dec_self", scores.detach().clone()))
        output = torch.matmul(scores, values)  # (bs, n_local_heads, seqlen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.w1, self.w2 = nn.Linear(DIM, hidden, bias=False), nn.Linear(hidden, DIM, bias=False)
        self.w3 = nn.Linear(DIM, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.attention, self.feed_forward = Attention(sink), FeedForward()
        self.attention_norm, self.ffn_norm = RMSNorm(DIM), RMSNorm(DIM)

    def forward(self, x, start_pos, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.tok_embeddings = nn.Embedding(VOCAB_SIZE, DIM)
        self.layers = nn.ModuleList(TransformerBlock(self.computed) for _ in range(N_LAYERS))
        self.norm, self.output = RMSNorm(DIM), nn.Linear(DIM, VOCAB_SIZE, bias=False)
        self.freqs_cis = precompute_freqs_cis(DIM // N_HEADS, MAX_SEQ * 2)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, tokens: torch.Tensor, start_pos: int = 0):
        _bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]
        mask = None
        if seqlen > 1:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
            mask = torch.triu(mask, diagonal=1)
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device), mask]).type_as(h)
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cis, mask)
        return self.output(self.norm(h)).float()


def build(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """tokens (3, 7): prompts of 7, 5 and 3 tokens right-padded with 0 (the causal mask hides it)."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
