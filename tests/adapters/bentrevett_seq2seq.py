"""Encoder-decoder written like bentrevett/pytorch-seq2seq "6 - Attention is All You Need": the model
takes a ``device`` argument (the attention scale is a tensor made on it), torchtext's special ids
(``<unk>`` 0, ``<pad>`` 1, ``<sos>`` 2, ``<eos>`` 3: PAD is not 0), masks ``mask == 0`` filled with
-1e10, a word vocabulary where unknown words read as ``<unk>``, and ``forward`` returning the TUPLE
``(logits, attention)`` (attention: the last decoder layer's cross-attention, (B, H, T, S)).
``load(device)`` builds the model on the device attnscope runs it on.
Random seeded weights. The model's own maps are in ``model.computed`` as (label, probs (B, H, q, k)).
"""

from __future__ import annotations

import torch
from torch import nn

ARCH = "encoder-decoder"
VOCAB = ["<unk>", "<pad>", "<sos>", "<eos>"] + (
    "a the man woman dog cat sees likes eats runs to park house ball big small red blue and"
).split()
UNK, PAD, BOS, EOS = 0, 1, 2, 3
MAX_LEN = 32
EXAMPLES = ["the man sees a dog", "a cat eats"]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
_STOI = {t: i for i, t in enumerate(VOCAB)}


class MultiHeadAttentionLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, dropout, device, sink, label):
        super().__init__()
        self.hid_dim, self.n_heads, self.head_dim = hid_dim, n_heads, hid_dim // n_heads
        self.fc_q, self.fc_k = nn.Linear(hid_dim, hid_dim), nn.Linear(hid_dim, hid_dim)
        self.fc_v, self.fc_o = nn.Linear(hid_dim, hid_dim), nn.Linear(hid_dim, hid_dim)
        self.dropout = nn.Dropout(dropout)
        self.scale = torch.sqrt(torch.FloatTensor([self.head_dim])).to(device)
        self.sink, self.label = sink, label

    def forward(self, query, key, value, mask=None):
        batch_size = query.shape[0]
        Q, K, V = self.fc_q(query), self.fc_k(key), self.fc_v(value)
        Q = Q.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        K = K.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        V = V.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        energy = torch.matmul(Q, K.permute(0, 1, 3, 2)) / self.scale
        if mask is not None:
            energy = energy.masked_fill(mask == 0, -1e10)
        attention = torch.softmax(energy, dim=-1)
        self.sink.append((self.label, attention.detach().clone()))
        x = torch.matmul(self.dropout(attention), V).permute(0, 2, 1, 3).contiguous()
        return self.fc_o(x.view(batch_size, -1, self.hid_dim)), attention


class FeedForward(nn.Module):
    def __init__(self, hid_dim, pf_dim, dropout):
        super().__init__()
        self.fc_1, self.fc_2, self.dropout = (
            nn.Linear(hid_dim, pf_dim),
            nn.Linear(pf_dim, hid_dim),
            nn.Dropout(dropout),
        )

    def forward(self, x):
        return self.fc_2(self.dropout(torch.relu(self.fc_1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, dropout, device, sink):
        super().__init__()
        self.self_attn_layer_norm, self.ff_layer_norm = nn.LayerNorm(hid_dim), nn.LayerNorm(hid_dim)
        self.self_attention = MultiHeadAttentionLayer(hid_dim, n_heads, dropout, device, sink, "enc_self")
        self.positionwise_feedforward = FeedForward(hid_dim, pf_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src, src_mask):
        _src, _ = self.self_attention(src, src, src, src_mask)
        src = self.self_attn_layer_norm(src + self.dropout(_src))
        return self.ff_layer_norm(src + self.dropout(self.positionwise_feedforward(src)))


class DecoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, dropout, device, sink):
        super().__init__()
        self.self_attn_layer_norm, self.enc_attn_layer_norm = nn.LayerNorm(hid_dim), nn.LayerNorm(hid_dim)
        self.ff_layer_norm = nn.LayerNorm(hid_dim)
        self.self_attention = MultiHeadAttentionLayer(hid_dim, n_heads, dropout, device, sink, "dec_self")
        self.encoder_attention = MultiHeadAttentionLayer(hid_dim, n_heads, dropout, device, sink, "cross")
        self.positionwise_feedforward = FeedForward(hid_dim, pf_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, trg, enc_src, trg_mask, src_mask):
        _trg, _ = self.self_attention(trg, trg, trg, trg_mask)
        trg = self.self_attn_layer_norm(trg + self.dropout(_trg))
        _trg, attention = self.encoder_attention(trg, enc_src, enc_src, src_mask)
        trg = self.enc_attn_layer_norm(trg + self.dropout(_trg))
        trg = self.ff_layer_norm(trg + self.dropout(self.positionwise_feedforward(trg)))
        return trg, attention


class Encoder(nn.Module):
    def __init__(self, input_dim, hid_dim, n_layers, n_heads, pf_dim, dropout, device, sink, max_length=100):
        super().__init__()
        self.device = device
        self.tok_embedding, self.pos_embedding = (
            nn.Embedding(input_dim, hid_dim),
            nn.Embedding(max_length, hid_dim),
        )
        self.layers = nn.ModuleList(
            [EncoderLayer(hid_dim, n_heads, pf_dim, dropout, device, sink) for _ in range(n_layers)]
        )
        self.dropout = nn.Dropout(dropout)
        self.scale = torch.sqrt(torch.FloatTensor([hid_dim])).to(device)

    def forward(self, src, src_mask):
        batch_size, src_len = src.shape
        pos = torch.arange(0, src_len).unsqueeze(0).repeat(batch_size, 1).to(self.device)
        src = self.dropout((self.tok_embedding(src) * self.scale) + self.pos_embedding(pos))
        for layer in self.layers:
            src = layer(src, src_mask)
        return src


class Decoder(nn.Module):
    def __init__(self, output_dim, hid_dim, n_layers, n_heads, pf_dim, dropout, device, sink, max_length=100):
        super().__init__()
        self.device = device
        self.tok_embedding, self.pos_embedding = (
            nn.Embedding(output_dim, hid_dim),
            nn.Embedding(max_length, hid_dim),
        )
        self.layers = nn.ModuleList(
            [DecoderLayer(hid_dim, n_heads, pf_dim, dropout, device, sink) for _ in range(n_layers)]
        )
        self.fc_out = nn.Linear(hid_dim, output_dim)
        self.dropout = nn.Dropout(dropout)
        self.scale = torch.sqrt(torch.FloatTensor([hid_dim])).to(device)

    def forward(self, trg, enc_src, trg_mask, src_mask):
        batch_size, trg_len = trg.shape
        pos = torch.arange(0, trg_len).unsqueeze(0).repeat(batch_size, 1).to(self.device)
        trg = self.dropout((self.tok_embedding(trg) * self.scale) + self.pos_embedding(pos))
        attention = None
        for layer in self.layers:
            trg, attention = layer(trg, enc_src, trg_mask, src_mask)
        return self.fc_out(trg), attention


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder, src_pad_idx, trg_pad_idx, device):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.src_pad_idx, self.trg_pad_idx, self.device = src_pad_idx, trg_pad_idx, device
        self.computed: list[tuple[str, torch.Tensor]] = []

    def reset(self) -> None:
        self.computed.clear()

    def make_src_mask(self, src):
        return (src != self.src_pad_idx).unsqueeze(1).unsqueeze(2)  # (B, 1, 1, S)

    def make_trg_mask(self, trg):
        trg_pad_mask = (trg != self.trg_pad_idx).unsqueeze(1).unsqueeze(2)
        trg_len = trg.shape[1]
        trg_sub_mask = torch.tril(torch.ones((trg_len, trg_len), device=self.device)).bool()
        return trg_pad_mask & trg_sub_mask  # (B, 1, T, T)

    def forward(self, src, trg):
        src_mask, trg_mask = self.make_src_mask(src), self.make_trg_mask(trg)
        enc_src = self.encoder(src, src_mask)
        output, attention = self.decoder(trg, enc_src, trg_mask, src_mask)
        return output, attention


def load(device: torch.device = DEVICE) -> nn.Module:
    """attnscope passes the device it runs the model on: the model makes tensors on ``self.device``."""
    torch.manual_seed(0)
    computed: list = []
    enc = Encoder(len(VOCAB), 32, 2, 4, 64, 0.1, device, computed)
    dec = Decoder(len(VOCAB), 32, 2, 4, 64, 0.1, device, computed)
    model = Seq2Seq(enc, dec, PAD, PAD, device).to(device)
    model.computed = computed
    return model


def encode(text: str) -> list[int]:
    """<sos> words <eos>, lower-cased; a word the vocabulary lacks reads as <unk>."""
    return [BOS] + [_STOI.get(w, UNK) for w in text.lower().split()] + [EOS]


def encode_target(text: str) -> list[int]:
    return [_STOI.get(w, UNK) for w in text.lower().split()] + [EOS]


def forward(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor):
    return model(src, tgt)  # (logits (B, T, V), attention (B, H, T, S)), as the tutorial returns them
