"""A time-series Transformer with NO token embedding (PatchTST / TST style): float inputs
``(B, T, n_features)`` projected by ``nn.Linear(n_features, d_model)``, a learned positional
``nn.Parameter``, padding given as a bool ``key_padding_mask`` (True = padded step) filled in
place with ``masked_fill_(..., -np.inf)``, keys pre-transposed ``k.permute(0, 2, 3, 1)`` so scores
are ``torch.matmul(q, k) * self.scale`` with ``scale`` an ``nn.Parameter``, and residual attention
(RealFormer: each layer adds the previous layer's scores). forward(x, key_padding_mask) -> logits.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

N_FEATURES, D_MODEL, N_HEADS, N_LAYERS, N_CLASSES = 5, 32, 4, 2, 3


class ScaledDotProductAttention(nn.Module):
    def __init__(self, head_dim: int, sink: list):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(head_dim**-0.5), requires_grad=False)
        self.sink = sink

    def forward(self, q, k, v, prev=None, key_padding_mask=None):
        attn_scores = torch.matmul(q, k) * self.scale  # (B, H, T, T)
        if prev is not None:
            attn_scores = attn_scores + prev
        if key_padding_mask is not None:
            attn_scores.masked_fill_(key_padding_mask.unsqueeze(1).unsqueeze(2), -np.inf)
        attn_weights = F.softmax(attn_scores, dim=-1)
        self.sink.append(("enc_self", attn_weights.detach().clone()))
        return torch.matmul(attn_weights, v), attn_scores


class MultiheadAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.n_heads, self.d_k = N_HEADS, D_MODEL // N_HEADS
        self.W_Q, self.W_K, self.W_V = (nn.Linear(D_MODEL, D_MODEL) for _ in range(3))
        self.sdp_attn = ScaledDotProductAttention(self.d_k, sink)
        self.to_out = nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x, prev, key_padding_mask):
        bs = x.size(0)
        q_s = self.W_Q(x).view(bs, -1, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, d)
        k_s = self.W_K(x).view(bs, -1, self.n_heads, self.d_k).permute(0, 2, 3, 1)  # (B, H, d, T)
        v_s = self.W_V(x).view(bs, -1, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, d)
        output, scores = self.sdp_attn(q_s, k_s, v_s, prev=prev, key_padding_mask=key_padding_mask)
        output = output.transpose(1, 2).contiguous().view(bs, -1, self.n_heads * self.d_k)
        return self.to_out(output), scores


class TSTEncoderLayer(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.self_attn = MultiheadAttention(sink)
        self.norm_attn = nn.BatchNorm1d(D_MODEL)
        self.ff = nn.Sequential(nn.Linear(D_MODEL, 64), nn.GELU(), nn.Linear(64, D_MODEL))
        self.norm_ffn = nn.BatchNorm1d(D_MODEL)

    def forward(self, src, prev, key_padding_mask):
        src2, scores = self.self_attn(src, prev, key_padding_mask)
        src = self.norm_attn((src + src2).transpose(1, 2)).transpose(1, 2)
        src = self.norm_ffn((src + self.ff(src)).transpose(1, 2)).transpose(1, 2)
        return src, scores


class TSTClassifier(nn.Module):
    def __init__(self, max_len: int = 32):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.W_P = nn.Linear(N_FEATURES, D_MODEL)  # input projection: no embedding lookup at all
        self.W_pos = nn.Parameter(torch.empty(max_len, D_MODEL).uniform_(-0.02, 0.02))
        self.layers = nn.ModuleList(TSTEncoderLayer(self.computed) for _ in range(N_LAYERS))
        self.head = nn.Linear(D_MODEL, N_CLASSES)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, x, key_padding_mask):
        u = self.W_P(x) + self.W_pos[: x.shape[1]]  # (B, T, D)
        scores = None
        for layer in self.layers:
            u, scores = layer(u, scores, key_padding_mask)
        keep = (~key_padding_mask).unsqueeze(-1).float()  # (B, T, 1)
        return self.head((u * keep).sum(1) / keep.sum(1))  # (B, N_CLASSES)


def build(seed: int = 0) -> TSTClassifier:
    torch.manual_seed(seed)
    return TSTClassifier().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """x (3, 7, 5) float series (padded steps are zeros); key_padding_mask: 7, 5, 3 real steps."""
    lengths = torch.tensor([7, 5, 3])
    key_padding_mask = torch.arange(7)[None, :] >= lengths[:, None]  # (3, 7) True = padded
    x = torch.randn(3, 7, N_FEATURES, generator=torch.Generator().manual_seed(1))
    return x.masked_fill(key_padding_mask[..., None], 0.0), key_padding_mask
