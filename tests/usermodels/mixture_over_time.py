"""Mixture weights over time used to average per-frame predictions (a sound-event / weakly labelled
clip classifier, 'attention pooling of frame-level predictions'): h = GRU(x) over (B, T, F) features
(no embedding: a float input), frame_probs = torch.sigmoid(self.cla(h)) (B, T, C),
w = softmax(self.att(h).squeeze(-1).masked_fill(~valid, -inf), dim=1) (B, T),
clip = torch.einsum('bt,btc->bc', w, frame_probs). Batch of 4 clips with valid lengths.
GT (B, 1, 1, T) cross: the weights average the frames' predictions (attention pooling)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FD, H, C = 6, 8, 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.gru = nn.GRU(FD, H, batch_first=True)
        self.cla = nn.Linear(H, C)
        self.att = nn.Linear(H, 1)

    def reset(self):
        self.computed.clear()

    def forward(self, x, lengths):
        h, _ = self.gru(x)
        valid = torch.arange(x.size(1))[None] < lengths[:, None]
        frame_probs = torch.sigmoid(self.cla(h))
        w = F.softmax(self.att(h).squeeze(-1).masked_fill(~valid, float("-inf")), dim=1)
        self.computed.append(("cross", w[:, None, None].clone()))
        clip = torch.einsum("bt,btc->bc", w, frame_probs)
        return clip, frame_probs


def build(seed=0):
    torch.manual_seed(seed)
    return Model().eval()


def sample_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 7, FD, generator=g), torch.tensor([7, 5, 7, 3])
