"""BERT (original Hugging Face / Google port) style encoder fed ``inputs_embeds``: the word vectors
come in as floats (looked up outside, e.g. from another model or perturbed embeddings), only
position and token-type ids go through embeddings. The 1/0 ``attention_mask`` becomes an extended
additive mask ``(1.0 - mask[:, None, None, :].float()) * -10000.0``, scores are
``q @ k.transpose(-1, -2) / math.sqrt(d)`` then ``scores = scores + ext``, and
``nn.functional.softmax(scores, dim=-1)``. forward(inputs_embeds, attention_mask, token_type_ids).
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN, HEADS, LAYERS, MAX_POS = 32, 4, 2, 64


class BertSelfAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = HEADS, HIDDEN // HEADS
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.dropout = nn.Dropout(0.1)
        self.sink = sink

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(*new_x_shape).permute(0, 2, 1, 3)  # (B, H, L, d)

    def forward(self, hidden_states, attention_mask):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        attention_scores = query_layer @ key_layer.transpose(-1, -2) / math.sqrt(self.attention_head_size)
        attention_scores = attention_scores + attention_mask  # (B, 1, 1, L): 0 or -10000
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        self.sink.append(("enc_self", attention_probs.detach().clone()))
        context = self.dropout(attention_probs) @ value_layer  # (B, H, L, d)
        context = context.permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (HIDDEN,))


class BertLayer(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.attention = BertSelfAttention(sink)
        self.attention_output = nn.Linear(HIDDEN, HIDDEN)
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN, eps=1e-12), nn.LayerNorm(HIDDEN, eps=1e-12)
        self.intermediate, self.output = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, hidden_states, attention_mask):
        attn = self.norm1(
            self.attention_output(self.attention(hidden_states, attention_mask)) + hidden_states
        )
        return self.norm2(self.output(nn.functional.gelu(self.intermediate(attn))) + attn)


class BertModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.position_embeddings = nn.Embedding(MAX_POS, HIDDEN)
        self.token_type_embeddings = nn.Embedding(2, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.layer = nn.ModuleList(BertLayer(self.computed) for _ in range(LAYERS))
        self.pooler = nn.Linear(HIDDEN, HIDDEN)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, inputs_embeds, attention_mask, token_type_ids):
        seq_length = inputs_embeds.size(1)
        position_ids = torch.arange(seq_length, dtype=torch.long).unsqueeze(0)  # (1, L)
        embeddings = inputs_embeds + self.position_embeddings(position_ids)
        embeddings = self.LayerNorm(embeddings + self.token_type_embeddings(token_type_ids))
        extended_attention_mask = attention_mask[:, None, None, :].float()  # (B, 1, 1, L)
        extended_attention_mask = (1.0 - extended_attention_mask) * -10000.0
        hidden = embeddings
        for layer in self.layer:
            hidden = layer(hidden, extended_attention_mask)
        return torch.cat([hidden, torch.tanh(self.pooler(hidden[:, :1]))], dim=1)  # (B, L + 1, D)


def build(seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    return BertModel().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """inputs_embeds (3, 7, 32); attention_mask with 7, 5, 3 real tokens; two segments per row."""
    g = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    token_type_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0, 0]])
    return torch.randn(3, 7, HIDDEN, generator=g), mask, token_type_ids
