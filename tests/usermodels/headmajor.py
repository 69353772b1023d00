"""The other big tutorial family (jadore801120/attention-is-all-you-need-pytorch, older version):
heads folded HEAD-major with ``q.permute(2, 0, 1, 3).contiguous().view(-1, len_q, d_k)`` (row
``h * B + b``), the key-padding mask repeated with ``mask.repeat(n_head, 1, 1)`` (matching order),
``torch.bmm`` scores divided by a temperature, ``masked_fill(mask, -np.inf)`` (True = masked), an
``nn.Softmax(dim=2)`` module, post-norm residuals and ``non_pad_mask`` multiplications. Encoder-only
classifier: forward(src) -> class logits ``(B, N_CLASSES)`` (mean over the real positions).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

PAD = 0
VOCAB_SIZE = 20
N_CLASSES = 3


def get_sinusoid_encoding_table(n_position: int, d_hid: int, padding_idx: int | None = None) -> torch.Tensor:
    def cal_angle(position, hid_idx):
        return position / np.power(10000, 2 * (hid_idx // 2) / d_hid)

    table = np.array([[cal_angle(pos, j) for j in range(d_hid)] for pos in range(n_position)])
    table[:, 0::2], table[:, 1::2] = np.sin(table[:, 0::2]), np.cos(table[:, 1::2])
    if padding_idx is not None:
        table[padding_idx] = 0.0
    return torch.FloatTensor(table)


def get_attn_key_pad_mask(seq_k: torch.Tensor, seq_q: torch.Tensor) -> torch.Tensor:
    len_q = seq_q.size(1)
    return seq_k.eq(PAD).unsqueeze(1).expand(-1, len_q, -1)  # (B, lq, lk) True = masked


def get_non_pad_mask(seq: torch.Tensor) -> torch.Tensor:
    return seq.ne(PAD).type(torch.float).unsqueeze(-1)  # (B, L, 1)


class ScaledDotProductAttention(nn.Module):
    def __init__(self, temperature: float, attn_dropout: float = 0.0):
        super().__init__()
        self.temperature = temperature
        self.dropout = nn.Dropout(attn_dropout)
        self.softmax = nn.Softmax(dim=2)

    def forward(self, q, k, v, mask=None):
        attn = torch.bmm(q, k.transpose(1, 2)) / self.temperature  # (H*B, lq, lk)
        if mask is not None:
            attn = attn.masked_fill(mask, -np.inf)
        attn = self.softmax(attn)
        attn = self.dropout(attn)
        return torch.bmm(attn, v), attn


class MultiHeadAttention(nn.Module):
    def __init__(self, n_head: int, d_model: int, d_k: int, d_v: int, sink: list, dropout: float = 0.0):
        super().__init__()
        self.n_head, self.d_k, self.d_v, self.sink = n_head, d_k, d_v, sink
        self.w_qs = nn.Linear(d_model, n_head * d_k)
        self.w_ks = nn.Linear(d_model, n_head * d_k)
        self.w_vs = nn.Linear(d_model, n_head * d_v)
        nn.init.normal_(self.w_qs.weight, mean=0, std=np.sqrt(2.0 / (d_model + d_k)))
        nn.init.normal_(self.w_ks.weight, mean=0, std=np.sqrt(2.0 / (d_model + d_k)))
        nn.init.normal_(self.w_vs.weight, mean=0, std=np.sqrt(2.0 / (d_model + d_v)))
        self.attention = ScaledDotProductAttention(temperature=np.power(d_k, 0.5))
        self.layer_norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(n_head * d_v, d_model)
        nn.init.xavier_normal_(self.fc.weight)
        self.dropout = nn.Dropout(dropout)

    def forward(self, q, k, v, mask=None):
        d_k, d_v, n_head = self.d_k, self.d_v, self.n_head
        sz_b, len_q, _ = q.size()
        sz_b, len_k, _ = k.size()
        sz_b, len_v, _ = v.size()
        residual = q
        q = self.w_qs(q).view(sz_b, len_q, n_head, d_k)
        k = self.w_ks(k).view(sz_b, len_k, n_head, d_k)
        v = self.w_vs(v).view(sz_b, len_v, n_head, d_v)
        q = q.permute(2, 0, 1, 3).contiguous().view(-1, len_q, d_k)  # (H*B, lq, dk) head-major
        k = k.permute(2, 0, 1, 3).contiguous().view(-1, len_k, d_k)  # (H*B, lk, dk)
        v = v.permute(2, 0, 1, 3).contiguous().view(-1, len_v, d_v)  # (H*B, lv, dv)
        mask = mask.repeat(n_head, 1, 1)  # (H*B, lq, lk)
        output, attn = self.attention(q, k, v, mask=mask)
        self.sink.append(("enc_self", attn.detach().view(n_head, sz_b, len_q, len_k).transpose(0, 1).clone()))
        output = output.view(n_head, sz_b, len_q, d_v)  # (H, B, lq, dv)
        output = output.permute(1, 2, 0, 3).contiguous().view(sz_b, len_q, -1)  # (B, lq, H*dv)
        output = self.dropout(self.fc(output))
        return self.layer_norm(output + residual), attn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_in: int, d_hid: int, dropout: float = 0.0):
        super().__init__()
        self.w_1 = nn.Conv1d(d_in, d_hid, 1)  # position-wise
        self.w_2 = nn.Conv1d(d_hid, d_in, 1)
        self.layer_norm = nn.LayerNorm(d_in)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        residual = x
        output = self.w_2(torch.relu(self.w_1(x.transpose(1, 2)))).transpose(2, 1)
        return self.layer_norm(self.dropout(output) + residual)


class EncoderLayer(nn.Module):
    def __init__(self, d_model, d_inner, n_head, d_k, d_v, sink):
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, sink)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner)

    def forward(self, enc_input, non_pad_mask=None, slf_attn_mask=None):
        enc_output, enc_slf_attn = self.slf_attn(enc_input, enc_input, enc_input, mask=slf_attn_mask)
        enc_output = enc_output * non_pad_mask
        enc_output = self.pos_ffn(enc_output)
        return enc_output * non_pad_mask, enc_slf_attn


class Classifier(nn.Module):
    def __init__(self, n_src_vocab=VOCAB_SIZE, len_max_seq=64, d_model=32, d_inner=64, n_layers=2, n_head=4):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        d_k = d_v = d_model // n_head
        self.src_word_emb = nn.Embedding(n_src_vocab, d_model, padding_idx=PAD)
        self.position_enc = nn.Embedding.from_pretrained(
            get_sinusoid_encoding_table(len_max_seq + 1, d_model, padding_idx=0), freeze=True
        )
        self.layer_stack = nn.ModuleList(
            [EncoderLayer(d_model, d_inner, n_head, d_k, d_v, self.computed) for _ in range(n_layers)]
        )
        self.classify = nn.Linear(d_model, N_CLASSES)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, src_seq: torch.Tensor) -> torch.Tensor:
        slf_attn_mask = get_attn_key_pad_mask(seq_k=src_seq, seq_q=src_seq)
        non_pad_mask = get_non_pad_mask(src_seq)
        src_pos = (torch.arange(1, src_seq.size(1) + 1, device=src_seq.device) * src_seq.ne(PAD)).long()
        enc_output = self.src_word_emb(src_seq) + self.position_enc(src_pos)
        for enc_layer in self.layer_stack:
            enc_output, _ = enc_layer(enc_output, non_pad_mask=non_pad_mask, slf_attn_mask=slf_attn_mask)
        pooled = enc_output.sum(1) / non_pad_mask.sum(1)  # (B, D) mean over real positions
        return self.classify(pooled)  # (B, N_CLASSES)


def build(seed: int = 0) -> Classifier:
    torch.manual_seed(seed)
    return Classifier().eval()


def sample_batch() -> tuple[torch.Tensor]:
    """src (3, 7) with 7, 5, 3 real tokens, right-padded with 0."""
    return (torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]]),)
