"""The TensorFlow "Transformer model for language understanding" tutorial ported to PyTorch, as Chinese-
language blogs (CSDN, Zhihu) write it, comments in Chinese: ``split_heads`` as ``x.reshape(batch_size,
-1, self.num_heads, self.depth).permute(0, 2, 1, 3)``, a free function ``scaled_dot_product_attention(q,
k, v, mask)`` with ``matmul_qk = torch.matmul(q, k.transpose(-1, -2))``, ``dk = k.shape[-1]``,
``scaled = matmul_qk / math.sqrt(dk)`` and an IN-PLACE ``scaled += (mask * -1e9)`` where the float mask is
1 at PAD (``(B, 1, 1, L)``), ``torch.softmax(scaled, dim=-1)``, the TF argument order ``mha(v, k, q,
mask)``, post-norm residuals (``layernorm1(x + attn_output)``). Encoder-decoder: encoder self-attention,
decoder self-attention with ``torch.maximum(dec_target_padding_mask, look_ahead_mask)`` and decoder-encoder
attention with the input's padding mask; forward(inp, tar) -> logits ``(B, T, TARGET_VOCAB_SIZE)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

PAD = 0
INPUT_VOCAB_SIZE = 20
TARGET_VOCAB_SIZE = 22


def get_angles(pos, i, d_model):
    angle_rates = 1 / np.power(10000, (2 * (i // 2)) / np.float32(d_model))
    return pos * angle_rates


def positional_encoding(position, d_model):
    angle_rads = get_angles(np.arange(position)[:, np.newaxis], np.arange(d_model)[np.newaxis, :], d_model)
    # 偶数下标用 sin，奇数下标用 cos
    angle_rads[:, 0::2] = np.sin(angle_rads[:, 0::2])
    angle_rads[:, 1::2] = np.cos(angle_rads[:, 1::2])
    pos_encoding = angle_rads[np.newaxis, ...]  # (1, position, d_model)
    return torch.tensor(pos_encoding, dtype=torch.float32)


def create_padding_mask(seq):
    # 填充位置为 1，其余为 0
    seq = torch.eq(seq, PAD).float()
    # 添加额外的维度，以便把填充加到注意力对数（logits）上
    return seq[:, None, None, :]  # (batch_size, 1, 1, seq_len)


def create_look_ahead_mask(size):
    # 前瞻遮挡：上三角（不含对角线）为 1，遮住未来的词
    mask = 1 - torch.tril(torch.ones((size, size)))
    return mask  # (seq_len, seq_len)


def scaled_dot_product_attention(q, k, v, mask):
    """计算注意力权重。
    q, k, v 的前面的维度必须相同；k, v 的倒数第二个维度必须相同（seq_len_k = seq_len_v）。
    mask 的形状必须能广播到 (..., seq_len_q, seq_len_k)。

    返回值：输出，注意力权重
    """
    matmul_qk = torch.matmul(q, k.transpose(-1, -2))  # (..., seq_len_q, seq_len_k)

    # 缩放 matmul_qk
    dk = k.shape[-1]
    scaled = matmul_qk / math.sqrt(dk)

    # 将 mask 加入到缩放的张量上（填充位置加上一个很大的负数）
    if mask is not None:
        scaled += mask * -1e9

    # softmax 在最后一个轴（seq_len_k）上归一化，因此分数相加等于 1
    attention_weights = torch.softmax(scaled, dim=-1)  # (..., seq_len_q, seq_len_k)

    output = torch.matmul(attention_weights, v)  # (..., seq_len_q, depth_v)
    return output, attention_weights


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, sink, kind):
        super().__init__()
        self.num_heads = num_heads
        self.d_model = d_model
        assert d_model % self.num_heads == 0
        self.depth = d_model // self.num_heads
        self.sink, self.kind = sink, kind  # 记录真实的注意力权重（测试用）

        self.wq = nn.Linear(d_model, d_model)
        self.wk = nn.Linear(d_model, d_model)
        self.wv = nn.Linear(d_model, d_model)
        self.dense = nn.Linear(d_model, d_model)

    def split_heads(self, x, batch_size):
        """分拆最后一个维度到 (num_heads, depth)。
        转置结果使得形状为 (batch_size, num_heads, seq_len, depth)
        """
        x = x.reshape(batch_size, -1, self.num_heads, self.depth)
        return x.permute(0, 2, 1, 3)

    def forward(self, v, k, q, mask):
        batch_size = q.shape[0]

        q = self.wq(q)  # (batch_size, seq_len, d_model)
        k = self.wk(k)
        v = self.wv(v)

        q = self.split_heads(q, batch_size)  # (batch_size, num_heads, seq_len_q, depth)
        k = self.split_heads(k, batch_size)  # (batch_size, num_heads, seq_len_k, depth)
        v = self.split_heads(v, batch_size)  # (batch_size, num_heads, seq_len_v, depth)

        # scaled_attention.shape == (batch_size, num_heads, seq_len_q, depth)
        # attention_weights.shape == (batch_size, num_heads, seq_len_q, seq_len_k)
        scaled_attention, attention_weights = scaled_dot_product_attention(q, k, v, mask)
        self.sink.append((self.kind, attention_weights.detach().clone()))

        scaled_attention = scaled_attention.permute(0, 2, 1, 3)  # (batch_size, seq_len_q, num_heads, depth)
        concat_attention = scaled_attention.reshape(batch_size, -1, self.d_model)

        output = self.dense(concat_attention)  # (batch_size, seq_len_q, d_model)
        return output, attention_weights


def point_wise_feed_forward_network(d_model, dff):
    return nn.Sequential(
        nn.Linear(d_model, dff),  # (batch_size, seq_len, dff)
        nn.ReLU(),
        nn.Linear(dff, d_model),  # (batch_size, seq_len, d_model)
    )


class EncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, dff, sink, rate=0.1):
        super().__init__()
        self.mha = MultiHeadAttention(d_model, num_heads, sink, "enc_self")
        self.ffn = point_wise_feed_forward_network(d_model, dff)
        self.layernorm1 = nn.LayerNorm(d_model, eps=1e-6)
        self.layernorm2 = nn.LayerNorm(d_model, eps=1e-6)
        self.dropout1 = nn.Dropout(rate)
        self.dropout2 = nn.Dropout(rate)

    def forward(self, x, mask):
        attn_output, _ = self.mha(x, x, x, mask)  # (batch_size, input_seq_len, d_model)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(x + attn_output)  # 残差连接 + 层归一化

        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        out2 = self.layernorm2(out1 + ffn_output)
        return out2


class DecoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, dff, sink, rate=0.1):
        super().__init__()
        self.mha1 = MultiHeadAttention(d_model, num_heads, sink, "dec_self")  # 带前瞻遮挡的自注意力
        self.mha2 = MultiHeadAttention(d_model, num_heads, sink, "cross")  # 编码器-解码器注意力
        self.ffn = point_wise_feed_forward_network(d_model, dff)
        self.layernorm1 = nn.LayerNorm(d_model, eps=1e-6)
        self.layernorm2 = nn.LayerNorm(d_model, eps=1e-6)
        self.layernorm3 = nn.LayerNorm(d_model, eps=1e-6)
        self.dropout1 = nn.Dropout(rate)
        self.dropout2 = nn.Dropout(rate)
        self.dropout3 = nn.Dropout(rate)

    def forward(self, x, enc_output, look_ahead_mask, padding_mask):
        # enc_output.shape == (batch_size, input_seq_len, d_model)
        attn1, attn_weights_block1 = self.mha1(x, x, x, look_ahead_mask)
        attn1 = self.dropout1(attn1)
        out1 = self.layernorm1(attn1 + x)

        # 注意参数顺序：v, k 来自编码器输出，q 来自解码器
        attn2, attn_weights_block2 = self.mha2(enc_output, enc_output, out1, padding_mask)
        attn2 = self.dropout2(attn2)
        out2 = self.layernorm2(attn2 + out1)

        ffn_output = self.ffn(out2)
        ffn_output = self.dropout3(ffn_output)
        out3 = self.layernorm3(ffn_output + out2)
        return out3, attn_weights_block1, attn_weights_block2


class Encoder(nn.Module):
    def __init__(
        self, num_layers, d_model, num_heads, dff, input_vocab_size, maximum_position_encoding, sink
    ):
        super().__init__()
        self.d_model = d_model
        self.num_layers = num_layers
        self.embedding = nn.Embedding(input_vocab_size, d_model)
        self.register_buffer("pos_encoding", positional_encoding(maximum_position_encoding, d_model))
        self.enc_layers = nn.ModuleList(
            [EncoderLayer(d_model, num_heads, dff, sink) for _ in range(num_layers)]
        )
        self.dropout = nn.Dropout(0.1)

    def forward(self, x, mask):
        seq_len = x.shape[1]
        # 将嵌入和位置编码相加
        x = self.embedding(x)  # (batch_size, input_seq_len, d_model)
        x = x * math.sqrt(self.d_model)
        x = x + self.pos_encoding[:, :seq_len, :]
        x = self.dropout(x)
        for i in range(self.num_layers):
            x = self.enc_layers[i](x, mask)
        return x  # (batch_size, input_seq_len, d_model)


class Decoder(nn.Module):
    def __init__(
        self, num_layers, d_model, num_heads, dff, target_vocab_size, maximum_position_encoding, sink
    ):
        super().__init__()
        self.d_model = d_model
        self.num_layers = num_layers
        self.embedding = nn.Embedding(target_vocab_size, d_model)
        self.register_buffer("pos_encoding", positional_encoding(maximum_position_encoding, d_model))
        self.dec_layers = nn.ModuleList(
            [DecoderLayer(d_model, num_heads, dff, sink) for _ in range(num_layers)]
        )
        self.dropout = nn.Dropout(0.1)

    def forward(self, x, enc_output, look_ahead_mask, padding_mask):
        seq_len = x.shape[1]
        attention_weights = {}
        x = self.embedding(x)  # (batch_size, target_seq_len, d_model)
        x = x * math.sqrt(self.d_model)
        x = x + self.pos_encoding[:, :seq_len, :]
        x = self.dropout(x)
        for i in range(self.num_layers):
            x, block1, block2 = self.dec_layers[i](x, enc_output, look_ahead_mask, padding_mask)
            attention_weights[f"decoder_layer{i + 1}_block1"] = block1
            attention_weights[f"decoder_layer{i + 1}_block2"] = block2
        # x.shape == (batch_size, target_seq_len, d_model)
        return x, attention_weights


def create_masks(inp, tar):
    # 编码器填充遮挡
    enc_padding_mask = create_padding_mask(inp)
    # 在解码器的第二个注意力模块使用，用于遮挡编码器输出中的填充
    dec_padding_mask = create_padding_mask(inp)
    # 在解码器的第一个注意力模块使用，遮挡未来的词和目标序列中的填充
    look_ahead_mask = create_look_ahead_mask(tar.shape[1])
    dec_target_padding_mask = create_padding_mask(tar)
    combined_mask = torch.maximum(
        dec_target_padding_mask, look_ahead_mask
    )  # (batch_size, 1, tar_len, tar_len)
    return enc_padding_mask, combined_mask, dec_padding_mask


class Transformer(nn.Module):
    def __init__(
        self,
        num_layers=2,
        d_model=32,
        num_heads=4,
        dff=64,
        input_vocab_size=INPUT_VOCAB_SIZE,
        target_vocab_size=TARGET_VOCAB_SIZE,
        pe_input=64,
        pe_target=64,
    ):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.encoder = Encoder(num_layers, d_model, num_heads, dff, input_vocab_size, pe_input, self.computed)
        self.decoder = Decoder(
            num_layers, d_model, num_heads, dff, target_vocab_size, pe_target, self.computed
        )
        self.final_layer = nn.Linear(d_model, target_vocab_size)

    def reset(self) -> None:
        self.computed.clear()  # 原地清空：所有注意力模块共享这个列表

    def forward(self, inp: torch.Tensor, tar: torch.Tensor) -> torch.Tensor:
        enc_padding_mask, combined_mask, dec_padding_mask = create_masks(inp, tar)
        enc_output = self.encoder(inp, enc_padding_mask)  # (batch_size, inp_seq_len, d_model)
        # dec_output.shape == (batch_size, tar_seq_len, d_model)
        dec_output, attention_weights = self.decoder(tar, enc_output, combined_mask, dec_padding_mask)
        final_output = self.final_layer(dec_output)  # (batch_size, tar_seq_len, target_vocab_size)
        return final_output


def build(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """inp (3, 7) with 7, 5, 3 real tokens; tar (3, 6) with a start token (1) first and 6, 4, 2 real tokens."""
    inp = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [10, 11, 12, 13, 2, 0, 0], [14, 15, 2, 0, 0, 0, 0]])
    tar = torch.tensor([[1, 3, 4, 5, 6, 7], [1, 8, 9, 10, 0, 0], [1, 11, 0, 0, 0, 0]])
    return inp, tar
