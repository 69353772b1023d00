"""Attention pooling over LSTM states for classification with AllenNLP's masked_softmax (the
pre-1.0 version people copy): vector = vector * mask; result = softmax(vector, dim=-1);
result = result * mask; result = result / (result.sum(dim=-1, keepdim=True) + 1e-13).
Scores from a learned context vector: self.att(h).squeeze(-1). pooled = (h * a.unsqueeze(-1)).sum(1).
GT: the renormalized weights (what multiplies h), (B, 1, 1, S) cross."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, V, E, H = 0, 20, 8, 8


def masked_softmax(vector, mask, dim=-1):
    mask = mask.float()
    vector = vector * mask
    result = F.softmax(vector, dim=dim)
    result = result * mask
    return result / (result.sum(dim=dim, keepdim=True) + 1e-13)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.emb = nn.Embedding(V, E, padding_idx=PAD)
        self.lstm = nn.LSTM(E, H, batch_first=True, bidirectional=True)
        self.att = nn.Linear(2 * H, 1)
        self.fc = nn.Linear(2 * H, 2)

    def reset(self):
        self.computed.clear()

    def forward(self, ids):
        h, _ = self.lstm(self.emb(ids))
        a = masked_softmax(self.att(h).squeeze(-1), ids != PAD)
        self.computed.append(("cross", a[:, None, None, :].clone()))
        pooled = (h * a.unsqueeze(-1)).sum(1)
        return self.fc(pooled)


def build(seed=0):
    torch.manual_seed(seed)
    return Model().eval()


def sample_batch():
    return (torch.tensor([[4, 5, 6, 7, 8], [9, 10, 0, 0, 0], [11, 12, 13, 0, 0], [14, 15, 16, 17, 0]]),)
