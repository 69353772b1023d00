"""A speech encoder with NO token embedding: log-mel frames ``(B, T, n_mels)`` through an
``nn.Linear`` input projection, heads folded HEAD-major ``view(B, T, H, d).permute(2, 0, 1, 3)
.reshape(H * B, T, d)``, and the key-padding mask handed to ``torch.baddbmm`` as its additive
``input`` (``-inf`` at padded frames, ``repeat(H, 1, 1)``) with ``alpha`` = 1/sqrt(d), then
``torch.softmax`` on the 3-D scores and ``torch.bmm`` for the context.
forward(features, frame_lengths) -> frame logits (B, T, n_tokens) for CTC.
"""

from __future__ import annotations

import math

import torch
from torch import nn

N_MELS, D_MODEL, N_HEAD, N_LAYERS, N_TOKENS = 12, 32, 4, 2, 6


class SelfAttention(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.n_head, self.d_head = N_HEAD, D_MODEL // N_HEAD
        self.scaling = 1.0 / math.sqrt(self.d_head)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(D_MODEL, D_MODEL) for _ in range(3))
        self.out_proj = nn.Linear(D_MODEL, D_MODEL)
        self.sink = sink

    def fold(self, x):
        B, T, _ = x.shape
        return (
            x.view(B, T, self.n_head, self.d_head)
            .permute(2, 0, 1, 3)
            .reshape(self.n_head * B, T, self.d_head)
        )

    def forward(self, x, key_padding_mask):
        """x (B, T, D); key_padding_mask (B, T) True = padded frame."""
        B, T, _ = x.shape
        q, k, v = (
            self.fold(self.q_proj(x)),
            self.fold(self.k_proj(x)),
            self.fold(self.v_proj(x)),
        )  # (H*B, T, d)
        bias = torch.zeros(B, 1, T, dtype=x.dtype).masked_fill(key_padding_mask[:, None, :], float("-inf"))
        bias = bias.repeat(self.n_head, 1, 1)  # (H*B, 1, T), head-major like q
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=self.scaling)  # (H*B, T, T)
        probs = torch.softmax(scores, dim=-1)
        self.sink.append(("enc_self", probs.detach().view(self.n_head, B, T, T).transpose(0, 1).clone()))
        out = (
            torch.bmm(probs, v)
            .view(self.n_head, B, T, self.d_head)
            .permute(1, 2, 0, 3)
            .reshape(B, T, D_MODEL)
        )
        return self.out_proj(out)


class ConformerLikeBlock(nn.Module):
    def __init__(self, sink: list):
        super().__init__()
        self.norm_mha, self.self_attn = nn.LayerNorm(D_MODEL), SelfAttention(sink)
        self.norm_ff = nn.LayerNorm(D_MODEL)
        self.feed_forward = nn.Sequential(nn.Linear(D_MODEL, 64), nn.SiLU(), nn.Linear(64, D_MODEL))

    def forward(self, x, key_padding_mask):
        x = x + self.self_attn(self.norm_mha(x), key_padding_mask)
        return x + 0.5 * self.feed_forward(self.norm_ff(x))


class SpeechEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.input_proj = nn.Linear(N_MELS, D_MODEL)
        pos = torch.arange(256)[:, None] / torch.pow(10000.0, torch.arange(0, D_MODEL, 2) / D_MODEL)
        self.register_buffer("pe", torch.stack([pos.sin(), pos.cos()], dim=-1).flatten(1), persistent=False)
        self.blocks = nn.ModuleList(ConformerLikeBlock(self.computed) for _ in range(N_LAYERS))
        self.ctc_head = nn.Linear(D_MODEL, N_TOKENS)

    def reset(self) -> None:
        self.computed.clear()  # in place: the attention modules hold this same list

    def forward(self, features, frame_lengths):
        T = features.shape[1]
        key_padding_mask = torch.arange(T)[None, :] >= frame_lengths[:, None]  # (B, T)
        x = self.input_proj(features) * math.sqrt(D_MODEL) + self.pe[:T]
        for block in self.blocks:
            x = block(x, key_padding_mask)
        return self.ctc_head(x).log_softmax(dim=-1)


def build(seed: int = 0) -> SpeechEncoder:
    torch.manual_seed(seed)
    return SpeechEncoder().eval()


def sample_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """features (3, 7, 12), zero after 7, 5 and 3 frames; frame_lengths (3,)."""
    lengths = torch.tensor([7, 5, 3])
    feats = torch.randn(3, 7, N_MELS, generator=torch.Generator().manual_seed(2))
    return feats * (torch.arange(7)[None, :, None] < lengths[:, None, None]), lengths
