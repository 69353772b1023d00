"""An encoder-decoder Transformer as Japanese-language tutorials write it (Qiita / Zenn articles on
"作りながら学ぶ" Transformer), comments in Japanese: ONE ``MultiHeadAttention`` class used both for
self-attention and for source-target attention (``self.src_attn``), heads split with ``view(batch, -1,
h, d_k).transpose(1, 2)``, ``scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)``,
``scores.masked_fill(mask == 0, -1e9)`` (mask True/1 = attend), ``F.softmax(scores, dim=-1)``, post-norm
``AddNorm`` residuals, the decoder's self-attention mask = padding mask ``&`` subsequent mask, and a
``Generator`` with ``F.log_softmax``. forward(src, tgt) -> log-probabilities ``(B, T, TGT_VOCAB_SIZE)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0
SRC_VOCAB_SIZE = 20
TGT_VOCAB_SIZE = 18


class PositionalEncoding(nn.Module):
    """位置エンコーディング（sin / cos）"""

    def __init__(self, d_model: int, max_len: int = 64):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1).float()
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)  # 偶数次元
        pe[:, 1::2] = torch.cos(position * div_term)  # 奇数次元
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


class MultiHeadAttention(nn.Module):
    """マルチヘッドアテンション（自己注意とソース・ターゲット注意の両方で使う）"""

    def __init__(self, h: int, d_model: int, sink: list, kind: str, dropout: float = 0.1):
        super().__init__()
        assert d_model % h == 0
        self.d_k = d_model // h  # 1ヘッドあたりの次元数
        self.h = h
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.sink, self.kind = sink, kind  # テスト用：実際に計算したアテンション重みを記録する

    def forward(self, query, key, value, mask=None):
        batch = query.size(0)
        if mask is not None:
            mask = mask.unsqueeze(1)  # 全ヘッドに同じマスクを使う: (batch, 1, q_len or 1, k_len)

        # 線形変換してからヘッドに分割: (batch, h, len, d_k)
        query = self.w_q(query).view(batch, -1, self.h, self.d_k).transpose(1, 2)
        key = self.w_k(key).view(batch, -1, self.h, self.d_k).transpose(1, 2)
        value = self.w_v(value).view(batch, -1, self.h, self.d_k).transpose(1, 2)

        # スケール化内積アテンション
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)  # マスクが0の位置は見ない
        attn = F.softmax(scores, dim=-1)
        self.sink.append((self.kind, attn.detach().clone()))  # (batch, h, q_len, k_len)
        attn = self.dropout(attn)
        x = torch.matmul(attn, value)

        # ヘッドを結合して元の形に戻す: (batch, len, d_model)
        x = x.transpose(1, 2).contiguous().view(batch, -1, self.h * self.d_k)
        return self.w_o(x)


class FeedForward(nn.Module):
    """位置ごとのフィードフォワード層"""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


class AddNorm(nn.Module):
    """残差接続 + 層正規化（Post-LN）"""

    def __init__(self, d_model: int, dropout: float = 0.1):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer_out):
        return self.norm(x + self.dropout(sublayer_out))


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, h: int, d_ff: int, sink: list):
        super().__init__()
        self.self_attn = MultiHeadAttention(h, d_model, sink, "enc_self")
        self.ff = FeedForward(d_model, d_ff)
        self.add_norm1 = AddNorm(d_model)
        self.add_norm2 = AddNorm(d_model)

    def forward(self, x, src_mask):
        x = self.add_norm1(x, self.self_attn(x, x, x, src_mask))
        return self.add_norm2(x, self.ff(x))


class DecoderLayer(nn.Module):
    def __init__(self, d_model: int, h: int, d_ff: int, sink: list):
        super().__init__()
        self.self_attn = MultiHeadAttention(h, d_model, sink, "dec_self")  # マスク付き自己注意
        self.src_attn = MultiHeadAttention(h, d_model, sink, "cross")  # ソース・ターゲット注意
        self.ff = FeedForward(d_model, d_ff)
        self.add_norm1 = AddNorm(d_model)
        self.add_norm2 = AddNorm(d_model)
        self.add_norm3 = AddNorm(d_model)

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.add_norm1(x, self.self_attn(x, x, x, tgt_mask))
        # クエリはデコーダ側、キーとバリューはエンコーダの出力（memory）
        x = self.add_norm2(x, self.src_attn(x, memory, memory, src_mask))
        return self.add_norm3(x, self.ff(x))


class Generator(nn.Module):
    """出力層：語彙数への線形変換 + log_softmax"""

    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x):
        return F.log_softmax(self.proj(x), dim=-1)


def subsequent_mask(size: int) -> torch.Tensor:
    """未来の単語を見ないためのマスク（下三角が True）"""
    attn_shape = (1, size, size)
    mask = torch.triu(torch.ones(attn_shape), diagonal=1).type(torch.uint8)
    return mask == 0


class Transformer(nn.Module):
    def __init__(self, d_model: int = 32, h: int = 4, d_ff: int = 64, N: int = 2):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.src_embed = nn.Embedding(SRC_VOCAB_SIZE, d_model, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(TGT_VOCAB_SIZE, d_model, padding_idx=PAD)
        self.pos = PositionalEncoding(d_model)
        self.encoder = nn.ModuleList([EncoderLayer(d_model, h, d_ff, self.computed) for _ in range(N)])
        self.decoder = nn.ModuleList([DecoderLayer(d_model, h, d_ff, self.computed) for _ in range(N)])
        self.generator = Generator(d_model, TGT_VOCAB_SIZE)
        self.d_model = d_model

    def reset(self) -> None:
        self.computed.clear()  # 全アテンション層が同じリストを共有しているのでその場でクリアする

    def make_masks(self, src, tgt):
        src_mask = (src != PAD).unsqueeze(-2)  # (batch, 1, src_len)
        tgt_mask = (tgt != PAD).unsqueeze(-2)  # (batch, 1, tgt_len)
        tgt_mask = tgt_mask & subsequent_mask(tgt.size(-1)).type_as(tgt_mask)  # (batch, tgt_len, tgt_len)
        return src_mask, tgt_mask

    def encode(self, src, src_mask):
        x = self.pos(self.src_embed(src) * math.sqrt(self.d_model))
        for layer in self.encoder:
            x = layer(x, src_mask)
        return x

    def decode(self, memory, src_mask, tgt, tgt_mask):
        x = self.pos(self.tgt_embed(tgt) * math.sqrt(self.d_model))
        for layer in self.decoder:
            x = layer(x, memory, src_mask, tgt_mask)
        return x

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        src_mask, tgt_mask = self.make_masks(src, tgt)
        memory = self.encode(src, src_mask)
        return self.generator(
            self.decode(memory, src_mask, tgt, tgt_mask)
        )  # 対数確率 (batch, tgt_len, vocab)


def build(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """src (3, 8) with 8, 6, 4 real tokens; tgt (3, 6) with BOS (1) first and 6, 4, 3 real tokens."""
    src = torch.tensor(
        [[4, 5, 6, 7, 8, 9, 10, 2], [11, 12, 13, 14, 15, 2, 0, 0], [16, 17, 18, 2, 0, 0, 0, 0]]
    )
    tgt = torch.tensor([[1, 3, 4, 5, 6, 7], [1, 8, 9, 10, 0, 0], [1, 11, 12, 0, 0, 0]])
    return src, tgt
