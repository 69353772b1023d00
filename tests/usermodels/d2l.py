""" "Dive into Deep Learning" (d2l.ai) Transformer: ``MultiHeadAttention`` with ``transpose_qkv``
(3-D ``(B*H, L, d)`` heads), ``DotProductAttention`` with ``torch.bmm``, and ``masked_softmax`` by
VALID LENGTHS: ``valid_lens`` repeated per head with ``torch.repeat_interleave``, scores flattened to
2-D and masked by index assignment ``X[~mask] = -1e6`` (``sequence_mask``), then reshaped back and
``nn.functional.softmax(X, dim=-1)``. The decoder (training mode, as in d2l's ``train_seq2seq``)
gets causal valid lengths ``torch.arange(1, T + 1).repeat(B, 1)`` and concatenates its cached
keys ``torch.cat((state[2][i], X), dim=1)``. forward(src, src_valid_lens, tgt) -> logits.
"""

from __future__ import annotations

import math

import torch
from torch import nn

VOCAB_SIZE, NUM_HIDDENS, NUM_HEADS, NUM_LAYERS = 20, 32, 4, 2


def sequence_mask(X, valid_len, value=0):
    maxlen = X.size(1)
    mask = torch.arange(maxlen, dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def masked_softmax(X, valid_lens):
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


def transpose_qkv(X, num_heads):
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)
    X = X.permute(0, 2, 1, 3)
    return X.reshape(-1, X.shape[2], X.shape[3])


def transpose_output(X, num_heads):
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])
    X = X.permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


class MultiHeadAttention(nn.Module):
    def __init__(self, num_hiddens, num_heads, dropout, sink: list, label: str, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q, self.W_k = nn.LazyLinear(num_hiddens, bias=bias), nn.LazyLinear(num_hiddens, bias=bias)
        self.W_v, self.W_o = nn.LazyLinear(num_hiddens, bias=bias), nn.LazyLinear(num_hiddens, bias=bias)
        self.sink, self.label = sink, label

    def forward(self, queries, keys, values, valid_lens):
        queries = transpose_qkv(self.W_q(queries), self.num_heads)
        keys = transpose_qkv(self.W_k(keys), self.num_heads)
        values = transpose_qkv(self.W_v(values), self.num_heads)
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        output = self.attention(queries, keys, values, valid_lens)
        weights = self.attention.attention_weights
        self.sink.append(
            (self.label, weights.detach().reshape(-1, self.num_heads, *weights.shape[1:]).clone())
        )
        return self.W_o(transpose_output(output, self.num_heads))


class PositionalEncoding(nn.Module):
    def __init__(self, num_hiddens, dropout, max_len=1000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.P = torch.zeros((1, max_len, num_hiddens))
        X = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
            10000, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens
        )
        self.P[:, :, 0::2], self.P[:, :, 1::2] = torch.sin(X), torch.cos(X)

    def forward(self, X):
        return self.dropout(X + self.P[:, : X.shape[1], :].to(X.device))


class AddNorm(nn.Module):
    def __init__(self, norm_shape, dropout):
        super().__init__()
        self.dropout, self.ln = nn.Dropout(dropout), nn.LayerNorm(norm_shape)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


class PositionWiseFFN(nn.Module):
    def __init__(self, ffn_num_hiddens, ffn_num_outputs):
        super().__init__()
        self.dense1, self.relu, self.dense2 = (
            nn.LazyLinear(ffn_num_hiddens),
            nn.ReLU(),
            nn.LazyLinear(ffn_num_outputs),
        )

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class TransformerEncoderBlock(nn.Module):
    def __init__(self, sink):
        super().__init__()
        self.attention = MultiHeadAttention(NUM_HIDDENS, NUM_HEADS, 0.0, sink, "enc_self")
        self.addnorm1, self.ffn = AddNorm(NUM_HIDDENS, 0.0), PositionWiseFFN(64, NUM_HIDDENS)
        self.addnorm2 = AddNorm(NUM_HIDDENS, 0.0)

    def forward(self, X, valid_lens):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
        return self.addnorm2(Y, self.ffn(Y))


class TransformerDecoderBlock(nn.Module):
    def __init__(self, i, sink):
        super().__init__()
        self.i = i
        self.attention1 = MultiHeadAttention(NUM_HIDDENS, NUM_HEADS, 0.0, sink, "dec_self")
        self.addnorm1 = AddNorm(NUM_HIDDENS, 0.0)
        self.attention2 = MultiHeadAttention(NUM_HIDDENS, NUM_HEADS, 0.0, sink, "cross")
        self.addnorm2, self.ffn = AddNorm(NUM_HIDDENS, 0.0), PositionWiseFFN(64, NUM_HIDDENS)
        self.addnorm3 = AddNorm(NUM_HIDDENS, 0.0)

    def forward(self, X, state):
        enc_outputs, enc_valid_lens = state[0], state[1]
        key_values = X if state[2][self.i] is None else torch.cat((state[2][self.i], X), dim=1)
        state[2][self.i] = key_values
        if self.training:
            batch_size, num_steps, _ = X.shape
            dec_valid_lens = torch.arange(1, num_steps + 1, device=X.device).repeat(batch_size, 1)
        else:
            dec_valid_lens = None
        X2 = self.attention1(X, key_values, key_values, dec_valid_lens)
        Y = self.addnorm1(X, X2)
        Y2 = self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens)
        Z = self.addnorm2(Y, Y2)
        return self.addnorm3(Z, self.ffn(Z)), state


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.enc_embedding, self.dec_embedding = (
            nn.Embedding(VOCAB_SIZE, NUM_HIDDENS),
            nn.Embedding(VOCAB_SIZE, NUM_HIDDENS),
        )
        self.enc_pos, self.dec_pos = (
            PositionalEncoding(NUM_HIDDENS, 0.0),
            PositionalEncoding(NUM_HIDDENS, 0.0),
        )
        self.enc_blks = nn.Sequential()
        for i in range(NUM_LAYERS):
            self.enc_blks.add_module("block" + str(i), TransformerEncoderBlock(self.computed))
        self.dec_blks = nn.Sequential()
        for i in range(NUM_LAYERS):
            self.dec_blks.add_module("block" + str(i), TransformerDecoderBlock(i, self.computed))
        self.dense = nn.LazyLinear(VOCAB_SIZE)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, enc_X, enc_valid_lens, dec_X):
        X = self.enc_pos(self.enc_embedding(enc_X) * math.sqrt(NUM_HIDDENS))
        for blk in self.enc_blks:
            X = blk(X, enc_valid_lens)
        state = [X, enc_valid_lens, [None] * NUM_LAYERS]
        Y = self.dec_pos(self.dec_embedding(dec_X) * math.sqrt(NUM_HIDDENS))
        for blk in self.dec_blks:
            Y, state = blk(Y, state)
        return self.dense(Y)


def build(seed: int = 0) -> Transformer:
    """Training mode (dropout 0), as d2l trains it: the decoder masks by causal valid lengths."""
    torch.manual_seed(seed)
    model = Transformer()
    model(*sample_batch())  # materialise the LazyLinear layers
    return model.train()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (3, 7) with valid lengths 7, 5, 3 (padding 0 after); tgt (3, 6)."""
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 3, 4, 5, 6, 7], [1, 8, 9, 10, 0, 0], [1, 11, 0, 0, 0, 0]])
    return src, torch.tensor([7, 5, 3]), tgt
