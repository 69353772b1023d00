""" "The Annotated Transformer" (harvardnlp) style encoder-decoder: a pure ``attention`` function,
``clones`` with ``copy.deepcopy`` into an ``nn.ModuleList``, 4-D ``(B, H, L, d)`` heads, masks with
True = ALLOWED filled with ``-1e9`` (``mask == 0``), pre-norm ``SublayerConnection``, decoder layers
with ``self_attn`` and ``src_attn``, and a ``log_softmax`` generator. The encoder spells the softmax
``scores.softmax(dim=-1)``, the decoder ``torch.softmax(scores, dim=-1)``.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

PAD, BOS = 0, 1
VOCAB_SIZE = 20


def clones(module: nn.Module, N: int) -> nn.ModuleList:
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


def subsequent_mask(size: int) -> torch.Tensor:
    attn_shape = (1, size, size)
    return torch.triu(torch.ones(attn_shape), diagonal=1).type(torch.uint8) == 0  # (1, T, T) True = allowed


def attention(query, key, value, mask=None, dropout=None, decoder: bool = False):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)  # (B, H, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = torch.softmax(scores, dim=-1) if decoder else scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h: int, d_model: int, dropout: float = 0.0):
        super().__init__()
        self.d_k, self.h = d_model // h, h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)
        self.label = "enc_self"  # set by the layer that owns it
        self.sink: list = []  # replaced by the root model's list in make_model

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)  # same mask for all heads: (B, 1, 1, S) or (B, 1, T, T)
        nbatches = query.size(0)
        query, key, value = [
            lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)  # (B, H, L, d)
            for lin, x in zip(self.linears, (query, key, value), strict=False)
        ]
        x, self.attn = attention(
            query, key, value, mask=mask, dropout=self.dropout, decoder=self.label != "enc_self"
        )
        self.sink.append((self.label, self.attn.detach().clone()))  # (B, H, Lq, Lk)
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)  # (B, L, D)
        return self.linears[-1](x)


class LayerNorm(nn.Module):
    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.a_2, self.b_2 = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    def __init__(self, size: int, dropout: float):
        super().__init__()
        self.norm, self.dropout = LayerNorm(size), nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class EncoderLayer(nn.Module):
    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.self_attn, self.feed_forward, self.size = self_attn, feed_forward, size
        self.self_attn.label = "enc_self"
        self.sublayer = clones(SublayerConnection(size, dropout), 2)

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    def __init__(self, size, self_attn, src_attn, feed_forward, dropout):
        super().__init__()
        self.size, self.self_attn, self.src_attn, self.feed_forward = size, self_attn, src_attn, feed_forward
        self.self_attn.label, self.src_attn.label = "dec_self", "cross"
        self.sublayer = clones(SublayerConnection(size, dropout), 3)

    def forward(self, x, memory, src_mask, tgt_mask):
        m = memory
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))
        x = self.sublayer[1](x, lambda x: self.src_attn(x, m, m, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class Encoder(nn.Module):
    """N layers then a final LayerNorm."""

    def __init__(self, layer, N):
        super().__init__()
        self.layers, self.norm = clones(layer, N), LayerNorm(layer.size)

    def forward(self, x, *masks_and_memory):
        for layer in self.layers:
            x = layer(x, *masks_and_memory)
        return self.norm(x)


class Decoder(Encoder):
    """The same stack of N DecoderLayers; forward(x, memory, src_mask, tgt_mask)."""


class Embeddings(nn.Module):
    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.lut, self.d_model = nn.Embedding(vocab, d_model), d_model

    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.0, max_len: int = 128):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div_term), torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))  # (1, max_len, D)

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)].requires_grad_(False))


class Generator(nn.Module):
    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x):
        return F.log_softmax(self.proj(x), dim=-1)


class EncoderDecoder(nn.Module):
    def __init__(self, encoder, decoder, src_embed, tgt_embed, generator):
        super().__init__()
        self.encoder, self.decoder, self.generator = encoder, decoder, generator
        self.src_embed, self.tgt_embed = src_embed, tgt_embed
        self.computed: list[tuple[str, torch.Tensor]] = []

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        src_mask = (src != PAD).unsqueeze(-2)  # (B, 1, S) True = allowed
        tgt_mask = (tgt != PAD).unsqueeze(-2) & subsequent_mask(tgt.size(-1)).type_as(src_mask)  # (B, T, T)
        memory = self.encode(src, src_mask)
        return self.generator(self.decode(memory, src_mask, tgt, tgt_mask))  # (B, T, V) log-probs


def make_model(src_vocab=VOCAB_SIZE, tgt_vocab=VOCAB_SIZE, N=2, d_model=32, d_ff=64, h=4, dropout=0.0):
    c = copy.deepcopy
    attn = MultiHeadedAttention(h, d_model)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = PositionalEncoding(d_model, dropout)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout), N),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout), N),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab),
    )
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    for m in model.modules():  # after the deep copies, so every attention shares the root's list
        if isinstance(m, MultiHeadedAttention):
            m.sink = model.computed
    return model


def build(seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    return make_model().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """src (3, 7) with 7, 5, 3 real tokens; tgt (3, 6) with BOS first and 6, 4, 2 real tokens."""
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 3, 4, 5, 6, 7], [1, 8, 9, 10, 0, 0], [1, 11, 0, 0, 0, 0]])
    return src, tgt
