"""A PyTorch port of tensor2tensor's Transformer (``common_attention.py`` / ``transformer.py``), written
as its readers port it: free functions instead of modules for the attention itself --
``split_heads(x, n)`` (reshape + transpose), ``combine_heads(x)``, ``attention_bias_ignore_padding``
(``memory_padding * -1e9`` shaped (B, 1, 1, L)), ``attention_bias_lower_triangle`` (``-1e9 * (1 - band)``,
(1, 1, L, L)), ``dot_product_attention(q, k, v, bias)`` with ``logits = torch.matmul(q, k.transpose(-1,
-2)); logits += bias`` (in place) and ``torch.softmax``, the queries scaled in place beforehand
(``q *= depth ** -0.5``); t2t's ``save_weights_to`` argument is where the weights are kept. The padding
comes from the embeddings as in t2t (the symbol modality zeroes PAD rows, ``embedding_to_padding``
looks for all-zero vectors), the timing signal is ``add_timing_signal_1d``, the decoder input is
``shift_right_3d`` (``F.pad(x, (0, 0, 1, 0))[:, :-1, :]``), layers are pre-norm. Encoder-decoder:
forward(inputs, targets) -> logits (B, Lt, VOCAB_SIZE).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
VOCAB_SIZE, HIDDEN, NUM_HEADS, NUM_LAYERS, FILTER = 24, 32, 4, 2, 64


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, D / H)."""
    b, length, d = x.shape
    return x.reshape(b, length, num_heads, d // num_heads).transpose(1, 2)


def combine_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, d) -> (B, L, H * d)."""
    b, h, length, d = x.shape
    return x.transpose(1, 2).reshape(b, length, h * d)


def embedding_to_padding(emb: torch.Tensor) -> torch.Tensor:
    """1.0 at positions whose embedding is all zeros (PAD), (B, L)."""
    return torch.eq(emb.abs().sum(-1), 0.0).float()


def attention_bias_ignore_padding(memory_padding: torch.Tensor) -> torch.Tensor:
    ret = memory_padding * -1e9
    return ret.unsqueeze(1).unsqueeze(1)  # (B, 1, 1, L)


def attention_bias_lower_triangle(length: int) -> torch.Tensor:
    band = torch.tril(torch.ones(length, length))  # ones_matrix_band_part(length, length, -1, 0)
    ret = -1e9 * (1.0 - band)
    return ret.view(1, 1, length, length)


def add_timing_signal_1d(
    x: torch.Tensor, min_timescale: float = 1.0, max_timescale: float = 1.0e4
) -> torch.Tensor:
    length, channels = x.shape[1], x.shape[2]
    position = torch.arange(length, dtype=torch.float32)
    num_timescales = channels // 2
    log_timescale_increment = math.log(float(max_timescale) / float(min_timescale)) / max(
        num_timescales - 1, 1
    )
    inv_timescales = min_timescale * torch.exp(
        torch.arange(num_timescales, dtype=torch.float32) * -log_timescale_increment
    )
    scaled_time = position.unsqueeze(1) * inv_timescales.unsqueeze(0)
    signal = torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)
    return x + signal.view(1, length, channels)


def shift_right_3d(x: torch.Tensor) -> torch.Tensor:
    return F.pad(x, (0, 0, 1, 0))[:, :-1, :]


def dot_product_attention(q, k, v, bias, save_weights_to=None, name="dot_product_attention"):
    logits = torch.matmul(q, k.transpose(-1, -2))  # (B, H, Lq, Lk)
    if bias is not None:
        logits += bias
    weights = torch.softmax(logits, dim=-1)
    if save_weights_to is not None:
        save_weights_to.append((name, weights.detach().clone()))
    return torch.matmul(weights, v)


class MultiheadAttention(nn.Module):
    """t2t's ``multihead_attention``: the dense layers are the only state."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.k = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.v = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.output_transform = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, query_antecedent, memory_antecedent, bias, save_weights_to=None):
        if memory_antecedent is None:
            memory_antecedent = query_antecedent
        q, k, v = self.q(query_antecedent), self.k(memory_antecedent), self.v(memory_antecedent)
        q, k, v = split_heads(q, NUM_HEADS), split_heads(k, NUM_HEADS), split_heads(v, NUM_HEADS)
        key_depth_per_head = HIDDEN // NUM_HEADS
        q *= key_depth_per_head**-0.5
        x = dot_product_attention(q, k, v, bias, save_weights_to=save_weights_to, name=self.name)
        return self.output_transform(combine_heads(x))


def dense_relu_dense(ffn: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    return ffn[1](torch.relu(ffn[0](x)))


class EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attention = MultiheadAttention("enc_self")
        self.ffn = nn.ModuleList([nn.Linear(HIDDEN, FILTER), nn.Linear(FILTER, HIDDEN)])
        self.norm_att, self.norm_ffn = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)

    def forward(self, x, self_attention_bias, save_weights_to):
        x = x + self.self_attention(self.norm_att(x), None, self_attention_bias, save_weights_to)
        return x + dense_relu_dense(self.ffn, self.norm_ffn(x))


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attention = MultiheadAttention("dec_self")
        self.encdec_attention = MultiheadAttention("cross")
        self.ffn = nn.ModuleList([nn.Linear(HIDDEN, FILTER), nn.Linear(FILTER, HIDDEN)])
        self.norm_self, self.norm_encdec, self.norm_ffn = (nn.LayerNorm(HIDDEN) for _ in range(3))

    def forward(
        self, x, encoder_output, decoder_self_attention_bias, encoder_decoder_attention_bias, weights
    ):
        x = x + self.self_attention(self.norm_self(x), None, decoder_self_attention_bias, weights)
        x = x + self.encdec_attention(
            self.norm_encdec(x), encoder_output, encoder_decoder_attention_bias, weights
        )
        return x + dense_relu_dense(self.ffn, self.norm_ffn(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []  # t2t's save_weights_to
        self.input_embedding = nn.Embedding(VOCAB_SIZE, HIDDEN)
        self.target_embedding = nn.Embedding(VOCAB_SIZE, HIDDEN)
        nn.init.normal_(self.input_embedding.weight, 0.0, HIDDEN**-0.5)
        nn.init.normal_(self.target_embedding.weight, 0.0, HIDDEN**-0.5)
        self.encoder_layers = nn.ModuleList([EncoderLayer() for _ in range(NUM_LAYERS)])
        self.decoder_layers = nn.ModuleList([DecoderLayer() for _ in range(NUM_LAYERS)])
        self.encoder_norm, self.decoder_norm = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.softmax_weights = nn.Linear(HIDDEN, VOCAB_SIZE, bias=False)

    def reset(self) -> None:
        self.computed.clear()

    def embed(self, embedding: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        """t2t's symbol modality bottom: scaled by sqrt(hidden), PAD rows zeroed."""
        ret = embedding(ids) * HIDDEN**0.5
        return ret * torch.ne(ids, PAD).float().unsqueeze(-1)

    def encode(self, inputs: torch.Tensor):
        encoder_input = self.embed(self.input_embedding, inputs)
        encoder_padding = embedding_to_padding(encoder_input)
        ignore_padding = attention_bias_ignore_padding(encoder_padding)
        encoder_self_attention_bias = ignore_padding
        encoder_decoder_attention_bias = ignore_padding
        x = add_timing_signal_1d(encoder_input)
        for layer in self.encoder_layers:
            x = layer(x, encoder_self_attention_bias, self.computed)
        return self.encoder_norm(x), encoder_decoder_attention_bias

    def decode(self, targets, encoder_output, encoder_decoder_attention_bias):
        decoder_input = shift_right_3d(self.embed(self.target_embedding, targets))
        decoder_self_attention_bias = attention_bias_lower_triangle(targets.shape[1])
        x = add_timing_signal_1d(decoder_input)
        for layer in self.decoder_layers:
            x = layer(
                x, encoder_output, decoder_self_attention_bias, encoder_decoder_attention_bias, self.computed
            )
        return self.decoder_norm(x)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        encoder_output, encoder_decoder_attention_bias = self.encode(inputs)
        decoder_output = self.decode(targets, encoder_output, encoder_decoder_attention_bias)
        return self.softmax_weights(decoder_output)  # (B, Lt, VOCAB_SIZE)


def build(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """inputs (3, 6) with 6, 4, 3 real tokens and targets (3, 5) with 5, 3, 4 real tokens (EOS = 1),
    right-padded with 0."""
    inputs = torch.tensor([[5, 6, 7, 8, 9, 1], [10, 11, 12, 1, 0, 0], [13, 14, 1, 0, 0, 0]])
    targets = torch.tensor([[15, 16, 17, 18, 1], [19, 20, 1, 0, 0], [21, 22, 23, 1, 0]])
    return inputs, targets
