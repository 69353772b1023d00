"""A line-by-line PyTorch port of Keras' ``MultiHeadAttention`` (keras/src/layers/attention/
multi_head_attention.py) inside a keras-nlp style ``TransformerEncoder``: every projection is an
``EinsumDense`` written as ``torch.einsum('abc,cde->abde', x, self.query_kernel)`` with an
``nn.Parameter`` kernel (d_model, heads, key_dim) and a (heads, key_dim) bias; the query is scaled by
``1 / math.sqrt(key_dim)`` first; the scores are Keras' ``_dot_product_equation`` with the keys first,
``torch.einsum('aecd,abcd->acbe', key, query)`` -> (B, heads, Tq, Tk); the boolean ``attention_mask``
(B, Tq, Tk) is built from the embedding's ``mask_zero`` mask of queries and keys (``q_mask[:, :, None] &
v_mask[:, None, :]``) and applied by Keras' masked ``Softmax`` as ``scores + (1.0 - mask[:, None].float())
* -1e9``; softmax over the last axis; ``torch.einsum('acbe,aecd->abcd', attention_scores, value)``; output
``torch.einsum('abcd,cde->abe', out, self.output_kernel)``. Post-norm encoder blocks.
forward(ids) -> (B, L, d_model).
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0
VOCAB_SIZE, D_MODEL, NUM_HEADS, KEY_DIM, N_LAYERS, MAX_LEN, INTERMEDIATE = 20, 32, 4, 8, 2, 16, 64


def glorot_uniform(shape: tuple[int, ...], fan_in: int, fan_out: int) -> nn.Parameter:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return nn.Parameter(torch.empty(shape).uniform_(-limit, limit))


class MultiHeadAttention(nn.Module):
    def __init__(self, num_heads: int, key_dim: int, sink: list):
        super().__init__()
        self._num_heads, self._key_dim, self.sink = num_heads, key_dim, sink
        self._dot_product_equation = "aecd,abcd->acbe"
        self._combine_equation = "acbe,aecd->abcd"
        self.query_kernel = glorot_uniform((D_MODEL, num_heads, key_dim), D_MODEL, num_heads * key_dim)
        self.key_kernel = glorot_uniform((D_MODEL, num_heads, key_dim), D_MODEL, num_heads * key_dim)
        self.value_kernel = glorot_uniform((D_MODEL, num_heads, key_dim), D_MODEL, num_heads * key_dim)
        self.query_bias = nn.Parameter(torch.zeros(num_heads, key_dim))
        self.key_bias = nn.Parameter(torch.zeros(num_heads, key_dim))
        self.value_bias = nn.Parameter(torch.zeros(num_heads, key_dim))
        self.output_kernel = glorot_uniform((num_heads, key_dim, D_MODEL), num_heads * key_dim, D_MODEL)
        self.output_bias = nn.Parameter(torch.zeros(D_MODEL))

    def _masked_softmax(self, attention_scores, attention_mask=None):
        if attention_mask is not None:
            mask = attention_mask[:, None]  # (B, 1, Tq, Tk): expand over the heads axis
            adder = (1.0 - mask.float()) * -1e9  # _large_negative_number(float32)
            attention_scores = attention_scores + adder
        return torch.softmax(attention_scores, dim=-1)

    def _compute_attention(self, query, key, value, attention_mask=None):
        query = query * (1.0 / math.sqrt(float(self._key_dim)))
        attention_scores = torch.einsum(self._dot_product_equation, key, query)  # (B, N, T, S)
        attention_scores = self._masked_softmax(attention_scores, attention_mask)
        self.sink.append(("enc_self", attention_scores.detach().clone()))
        attention_output = torch.einsum(self._combine_equation, attention_scores, value)  # (B, T, N, H)
        return attention_output, attention_scores

    def forward(self, query, value, key=None, attention_mask=None):
        if key is None:
            key = value
        query = torch.einsum("abc,cde->abde", query, self.query_kernel) + self.query_bias  # (B, T, N, H)
        key = torch.einsum("abc,cde->abde", key, self.key_kernel) + self.key_bias  # (B, S, N, H)
        value = torch.einsum("abc,cde->abde", value, self.value_kernel) + self.value_bias
        attention_output, _ = self._compute_attention(query, key, value, attention_mask)
        return torch.einsum("abcd,cde->abe", attention_output, self.output_kernel) + self.output_bias


class TransformerEncoder(nn.Module):
    """keras_nlp.layers.TransformerEncoder (normalize_first=False)."""

    def __init__(self, sink: list):
        super().__init__()
        self._self_attention_layer = MultiHeadAttention(NUM_HEADS, KEY_DIM, sink)
        self._self_attention_layer_norm = nn.LayerNorm(D_MODEL, eps=1e-5)
        self._feedforward_intermediate_dense = nn.Linear(D_MODEL, INTERMEDIATE)
        self._feedforward_output_dense = nn.Linear(INTERMEDIATE, D_MODEL)
        self._feedforward_layer_norm = nn.LayerNorm(D_MODEL, eps=1e-5)

    def forward(self, inputs, padding_mask):
        attention_mask = padding_mask[:, :, None] & padding_mask[:, None, :]  # (B, T, S) bool
        residual = inputs
        x = self._self_attention_layer(query=inputs, value=inputs, attention_mask=attention_mask)
        x = self._self_attention_layer_norm(x + residual)
        residual = x
        x = self._feedforward_output_dense(torch.relu(self._feedforward_intermediate_dense(x)))
        return self._feedforward_layer_norm(x + residual)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.token_embedding = nn.Embedding(VOCAB_SIZE, D_MODEL)  # mask_zero=True
        self.position_embedding = nn.Parameter(torch.randn(MAX_LEN, D_MODEL) * 0.02)
        self.blocks = nn.ModuleList([TransformerEncoder(self.computed) for _ in range(N_LAYERS)])

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        padding_mask = ids != PAD  # Embedding(mask_zero=True).compute_mask
        x = self.token_embedding(ids) + self.position_embedding[: ids.shape[1]]
        for block in self.blocks:
            x = block(x, padding_mask)
        return x  # (B, L, D_MODEL)


def build(seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    return Encoder().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """ids (3, 7) with 7, 4, 2 real tokens, right-padded with 0."""
    return (torch.tensor([[2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 0, 0, 0], [13, 14, 0, 0, 0, 0, 0]]),)
