"""Megatron-LM style GPT: hidden states SEQUENCE-first ``[s, b, h]``, a fused ``query_key_value``
projection, heads folded into 3-D ``(b * np, s, hn)`` by ``view`` + ``transpose(0, 1)``, scores
written by ``torch.baddbmm`` into a preallocated ``torch.empty`` buffer with ``beta=0.0,
alpha=1 / sqrt(hn)``, the mask (True = masked: causal and key padding) applied in place with
``masked_fill_(mask, -10000.0)``, ``torch.nn.Softmax(dim=-1)`` on the 3-D scores and ``torch.bmm``
for the context. forward(input_ids) -> logits (b, s, vocab).
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0
VOCAB_SIZE, HIDDEN, N_HEADS, N_LAYERS = 20, 32, 4, 2


class CoreAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.hidden_size_per_attention_head = HIDDEN // N_HEADS
        self.norm_factor = math.sqrt(self.hidden_size_per_attention_head)
        self.scale_mask_softmax = nn.Softmax(dim=-1)
        self.attention_dropout = nn.Dropout(0.0)
        self.sink = sink

    def forward(self, query_layer, key_layer, value_layer, attention_mask):
        """query/key/value [s, b, np, hn]; attention_mask (b, 1, s, s) True = masked."""
        sq, b, np_, hn = query_layer.shape
        sk = key_layer.size(0)
        query_layer = query_layer.view(sq, b * np_, -1)  # [sq, b * np, hn]
        key_layer = key_layer.view(sk, b * np_, -1)
        matmul_input_buffer = torch.empty(b * np_, sq, sk, dtype=query_layer.dtype)
        matmul_result = torch.baddbmm(
            matmul_input_buffer,
            query_layer.transpose(0, 1),  # [b * np, sq, hn]
            key_layer.transpose(0, 1).transpose(1, 2),  # [b * np, hn, sk]
            beta=0.0,
            alpha=(1.0 / self.norm_factor),
        )  # [b * np, sq, sk]
        mask = attention_mask.expand(b, np_, sq, sk).reshape(b * np_, sq, sk)
        matmul_result.masked_fill_(mask, -10000.0)
        attention_probs = self.attention_dropout(self.scale_mask_softmax(matmul_result))
        self.sink.append(("dec_self", attention_probs.detach().view(b, np_, sq, sk).clone()))
        value_layer = value_layer.view(value_layer.size(0), b * np_, -1)  # [sk, b * np, hn]
        context_layer = torch.bmm(attention_probs, value_layer.transpose(0, 1))  # [b * np, sq, hn]
        context_layer = context_layer.view(b, np_, sq, hn).permute(2, 0, 1, 3).contiguous()
        return context_layer.view(sq, b, np_ * hn)  # [sq, b, h]


class ParallelAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.query_key_value = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.core_attention = CoreAttention(sink)
        self.dense = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, hidden_states, attention_mask):
        mixed_x_layer = self.query_key_value(hidden_states)  # [sq, b, 3h]
        new_shape = mixed_x_layer.size()[:-1] + (N_HEADS, 3 * (HIDDEN // N_HEADS))
        mixed_x_layer = mixed_x_layer.view(*new_shape)  # [sq, b, np, 3hn]
        query_layer, key_layer, value_layer = torch.split(mixed_x_layer, HIDDEN // N_HEADS, dim=3)
        return self.dense(self.core_attention(query_layer, key_layer, value_layer, attention_mask))


class ParallelTransformerLayer(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.input_layernorm, self.self_attention = nn.LayerNorm(HIDDEN), ParallelAttention(sink)
        self.post_attention_layernorm = nn.LayerNorm(HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))

    def forward(self, hidden_states, attention_mask):
        x = hidden_states + self.self_attention(self.input_layernorm(hidden_states), attention_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class GPTModel(nn.Module):
    def __init__(self, max_seq: int = 32):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.word_embeddings = nn.Embedding(VOCAB_SIZE, HIDDEN)
        self.position_embeddings = nn.Embedding(max_seq, HIDDEN)
        self.layers = nn.ModuleList(ParallelTransformerLayer(self.computed) for _ in range(N_LAYERS))
        self.final_layernorm = nn.LayerNorm(HIDDEN)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, input_ids):
        b, s = input_ids.shape
        position_ids = torch.arange(s, dtype=torch.long).unsqueeze(0).expand_as(input_ids)
        causal = torch.tril(torch.ones(1, s, s)).view(1, 1, s, s) < 0.5  # True = masked
        attention_mask = causal | (input_ids == PAD)[:, None, None, :]  # (b, 1, s, s)
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        hidden = hidden.transpose(0, 1).contiguous()  # [s, b, h]
        for layer in self.layers:
            hidden = layer(hidden, attention_mask)
        hidden = self.final_layernorm(hidden)
        return (hidden @ self.word_embeddings.weight.t()).transpose(0, 1)  # (b, s, vocab), tied


def build(seed: int = 0) -> GPTModel:
    torch.manual_seed(seed)
    return GPTModel().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """input_ids (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
