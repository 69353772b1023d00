"""Hugging Face (BERT-like) style encoder: an ``attention_mask`` of 1/0 turned into an ADDITIVE
extended mask ``(1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min`` that is added to
the scores, ``nn.functional.softmax(scores, dim=-1)``, post-norm ``SelfOutput`` blocks, and grouped-
query attention done by hand: 4 query heads share 2 key/value heads via
``k.repeat_interleave(2, dim=1)``. Encoder-only: forward(input_ids) -> last hidden state (B, L, D).
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0
VOCAB_SIZE = 20


class Config:
    vocab_size = VOCAB_SIZE
    hidden_size = 32
    num_attention_heads = 4
    num_key_value_heads = 2
    intermediate_size = 64
    num_hidden_layers = 2
    max_position_embeddings = 64
    layer_norm_eps = 1e-12


class Embeddings(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=PAD)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).expand((1, -1)))

    def forward(self, input_ids):
        positions = self.position_ids[:, : input_ids.shape[1]]
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(positions))


class SelfAttention(nn.Module):
    def __init__(self, config: Config, sink: list):
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.query = nn.Linear(config.hidden_size, self.num_heads * self.head_dim)
        self.key = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim)
        self.value = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim)
        self.sink = sink

    def transpose_for_scores(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        new_shape = x.size()[:-1] + (n_heads, self.head_dim)
        return x.view(new_shape).permute(0, 2, 1, 3)  # (B, heads, L, hd)

    def forward(self, hidden_states, attention_mask=None):
        q = self.transpose_for_scores(self.query(hidden_states), self.num_heads)  # (B, 4, L, hd)
        k = self.transpose_for_scores(self.key(hidden_states), self.num_kv_heads)  # (B, 2, L, hd)
        v = self.transpose_for_scores(self.value(hidden_states), self.num_kv_heads)  # (B, 2, L, hd)
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)  # (B, 4, L, hd): query head h uses kv head h // 2
        v = v.repeat_interleave(groups, dim=1)  # (B, 4, L, hd)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # (B, 4, L, L)
        if attention_mask is not None:
            scores = scores + attention_mask  # (B, 1, 1, L) additive: 0 or finfo.min
        probs = nn.functional.softmax(scores, dim=-1)
        self.sink.append(("enc_self", probs.detach().clone()))  # (B, 4, L, L)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()  # (B, L, 4, hd)
        return context.view(context.size()[:-2] + (self.num_heads * self.head_dim,))  # (B, L, D)


class SelfOutput(nn.Module):
    def __init__(self, d_in: int, d_out: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)
        self.LayerNorm = nn.LayerNorm(d_out, eps=eps)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dense(hidden_states) + input_tensor)


class Layer(nn.Module):
    def __init__(self, config: Config, sink: list):
        super().__init__()
        h, i, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps
        self.attention = SelfAttention(config, sink)
        self.attention_output = SelfOutput(h, h, eps)
        self.intermediate = nn.Sequential(nn.Linear(h, i), nn.GELU())
        self.output_dense = nn.Linear(i, h)
        self.output_norm = nn.LayerNorm(h, eps=eps)

    def forward(self, hidden_states, attention_mask):
        attn = self.attention_output(self.attention(hidden_states, attention_mask), hidden_states)
        return self.output_norm(self.output_dense(self.intermediate(attn)) + attn)


class Encoder(nn.Module):
    def __init__(self, config: Config | None = None):
        super().__init__()
        self.config = config = config or Config()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.embeddings = Embeddings(config)
        self.layer = nn.ModuleList([Layer(config, self.computed) for _ in range(config.num_hidden_layers)])

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def get_extended_attention_mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        extended = attention_mask[:, None, None, :].float()  # (B, 1, 1, L)
        return (1.0 - extended) * torch.finfo(torch.float32).min

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = (input_ids != PAD).long()  # 1 = real token, 0 = padding
        ext = self.get_extended_attention_mask(attention_mask)
        hidden = self.embeddings(input_ids)
        for layer in self.layer:
            hidden = layer(hidden, ext)
        return hidden  # (B, L, D)


def build(seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    return Encoder().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """input_ids (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
