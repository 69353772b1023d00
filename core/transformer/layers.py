"""Encoder and decoder layers: attention, feed-forward, residual + LayerNorm.

post-LN (paper):  x = LN(x + Sublayer(x))
pre-LN (Annotated Transformer): x = x + Sublayer(LN(x))
"""

from __future__ import annotations

import torch
from torch import nn

from attnscope.core.transformer.attention import AttnMaps, MultiHeadAttention
from attnscope.core.transformer.config import TransformerConfig


class FeedForward(nn.Module):
    """FFN(x) = W2 act(W1 x + b1) + b2, applied at every position."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.w_1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w_2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.act = nn.ReLU() if cfg.activation == "relu" else nn.GELU()
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.act(self.w_1(x))))


class _Sublayer(nn.Module):
    """Residual connection around a sub-layer with its LayerNorm, post- or pre-LN."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre = cfg.norm == "pre"

    def forward(self, x: torch.Tensor, fn) -> tuple[torch.Tensor, AttnMaps | None]:
        out, maps = fn(self.norm(x) if self.pre else x)
        if maps is not None and maps.residual_norms is not None:  # the residual the output is added to
            maps.residual_norms.copy_(x.detach().norm(dim=-1))
        x = x + self.dropout(out)
        return (x if self.pre else self.norm(x)), maps


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.ff = FeedForward(cfg)
        self.sub_attn = _Sublayer(cfg)
        self.sub_ff = _Sublayer(cfg)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        return_attn: bool = False,
        neg_inf_fill: bool = False,
        head_keep: torch.Tensor | None = None,
        into: AttnMaps | None = None,
    ) -> tuple[torch.Tensor, AttnMaps | None]:
        """x (B, S, D), mask (B, S, S) -> (B, S, D), self-attention maps (written into ``into`` if given)."""
        x, maps = self.sub_attn(
            x, lambda h: self.self_attn(h, h, h, mask, return_attn, neg_inf_fill, head_keep, into)
        )
        x, _ = self.sub_ff(x, lambda h: (self.ff(h), None))
        return x, maps


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.ff = FeedForward(cfg)
        self.sub_self = _Sublayer(cfg)
        self.sub_cross = _Sublayer(cfg)
        self.sub_ff = _Sublayer(cfg)

    def forward(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor | None,
        cross_mask: torch.Tensor | None,
        return_attn: bool = False,
        neg_inf_fill: bool = False,
        self_keep: torch.Tensor | None = None,
        cross_keep: torch.Tensor | None = None,
        self_into: AttnMaps | None = None,
        cross_into: AttnMaps | None = None,
    ) -> tuple[torch.Tensor, AttnMaps | None, AttnMaps | None]:
        """y (B, T, D), memory (B, S, D), masks (B, T, T) / (B, T, S) -> (B, T, D), maps (written into
        ``self_into`` / ``cross_into`` if given)."""
        y, self_maps = self.sub_self(
            y, lambda h: self.self_attn(h, h, h, self_mask, return_attn, neg_inf_fill, self_keep, self_into)
        )
        y, cross_maps = self.sub_cross(
            y,
            lambda h: self.cross_attn(
                h, memory, memory, cross_mask, return_attn, neg_inf_fill, cross_keep, cross_into
            ),
        )
        y, _ = self.sub_ff(y, lambda h: (self.ff(h), None))
        return y, self_maps, cross_maps
