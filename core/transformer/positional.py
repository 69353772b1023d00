"""Positional encodings: the paper's sinusoids, or a learned table."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """``[max_len, d_model]``: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same)."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (L, ceil(d/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


def wavelengths(d_model: int) -> torch.Tensor:
    """``[d_model]``: wavelength (in positions) of each dimension, 2*pi*10000^(2i/d)."""
    two_i = (torch.arange(d_model) // 2 * 2).double()
    return (2 * math.pi * torch.pow(10000.0, two_i / d_model)).float()


class SinusoidalPositions(nn.Module):
    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.pe: torch.Tensor
        self.register_buffer("pe", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (B, L) long -> (B, L, D)."""
        return self.pe[positions]

    def table(self) -> torch.Tensor:
        return self.pe


class LearnedPositions(nn.Module):
    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.weight[positions]

    def table(self) -> torch.Tensor:
        return self.weight.detach()
