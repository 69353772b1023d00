"""A language model fed SEQUENCE-first token ids ``(T, B)`` (PyTorch's word_language_model
``batchify``/``get_batch``, torchtext's default ``batch_first=False``) with its own fairseq-style
``MultiheadAttention``: ``T x B x C`` activations, ``q.contiguous().view(T, B * H, d).transpose(0, 1)``
(3-D heads, no 4-D view in between), ``torch.bmm``, the future mask added IN PLACE
(``attn_weights += attn_mask.unsqueeze(0)``, from ``fill_with_neg_inf(...).triu(1)``), the key-padding
mask applied on a ``(B, H, T, S)`` view with ``masked_fill(-inf)``, and
``F.softmax(attn_weights, dim=-1, dtype=torch.float32).type_as(attn_weights)``.
forward(source) -> logits (T, B, vocab).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
VOCAB_SIZE, EMBED_DIM, NUM_HEADS, N_LAYERS = 20, 32, 4, 2


def fill_with_neg_inf(t: torch.Tensor) -> torch.Tensor:
    return t.float().fill_(float("-inf")).type_as(t)


class MultiheadAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.num_heads, self.head_dim = NUM_HEADS, EMBED_DIM // NUM_HEADS
        self.scaling = self.head_dim**-0.5
        self.k_proj, self.v_proj, self.q_proj = (nn.Linear(EMBED_DIM, EMBED_DIM) for _ in range(3))
        self.out_proj = nn.Linear(EMBED_DIM, EMBED_DIM)
        self.sink = sink

    def forward(self, query, key_padding_mask=None, attn_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        q = self.q_proj(query) * self.scaling
        k, v = self.k_proj(query), self.v_proj(query)
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        src_len = k.size(1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))  # (B*H, T, S)
        if attn_mask is not None:
            attn_weights += attn_mask.unsqueeze(0)
        if key_padding_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights.masked_fill(key_padding_mask.unsqueeze(1).unsqueeze(2), float("-inf"))
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        attn_weights_float = F.softmax(attn_weights, dim=-1, dtype=torch.float32)
        attn_probs = attn_weights_float.type_as(attn_weights)
        self.sink.append(
            ("dec_self", attn_probs.detach().view(bsz, self.num_heads, tgt_len, src_len).clone())
        )
        attn = torch.bmm(attn_probs, v)  # (B*H, T, d)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn)


class DecoderLayer(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.self_attn, self.self_attn_layer_norm = MultiheadAttention(sink), nn.LayerNorm(EMBED_DIM)
        self.fc1, self.fc2 = nn.Linear(EMBED_DIM, 64), nn.Linear(64, EMBED_DIM)
        self.final_layer_norm = nn.LayerNorm(EMBED_DIM)

    def forward(self, x, self_attn_mask, self_attn_padding_mask):
        x = x + self.self_attn(self.self_attn_layer_norm(x), self_attn_padding_mask, self_attn_mask)
        return x + self.fc2(F.relu(self.fc1(self.final_layer_norm(x))))


class TransformerLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embed_tokens = nn.Embedding(VOCAB_SIZE, EMBED_DIM, padding_idx=PAD)
        self.layers = nn.ModuleList(DecoderLayer(self.computed) for _ in range(N_LAYERS))
        self.layer_norm = nn.LayerNorm(EMBED_DIM)
        pos = torch.arange(64)[:, None] / torch.pow(10000.0, torch.arange(0, EMBED_DIM, 2) / EMBED_DIM)
        self.register_buffer("pe", torch.cat([pos.sin(), pos.cos()], dim=-1)[:, None, :])  # (64, 1, C)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def buffered_future_mask(self, tensor):
        dim = tensor.size(0)
        return torch.triu(fill_with_neg_inf(torch.zeros([dim, dim])), 1)

    def forward(self, source):
        """source (T, B) token ids."""
        x = self.embed_tokens(source) * math.sqrt(EMBED_DIM) + self.pe[: source.size(0)]  # T x B x C
        padding_mask = source.eq(PAD).t()  # (B, T)
        future = self.buffered_future_mask(x)
        for layer in self.layers:
            x = layer(x, future, padding_mask)
        return F.linear(self.layer_norm(x), self.embed_tokens.weight)  # T x B x vocab (tied)


def build(seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """source (T 7, B 3): streams of 7, 5 and 3 tokens, padded with 0 at the end (sequence-first)."""
    rows = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]])
    return (rows.t().contiguous(),)
