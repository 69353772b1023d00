"""Attention pooling over a BiLSTM with the softmax written by hand (common in older repos and in
Keras ports: 'masked exp, then divide by the sum'): u = torch.tanh(self.W(h)); e = self.ctx(u).squeeze(-1)
(a learned context vector); ex = torch.exp(e - e.max(dim=1, keepdim=True)[0]) * mask;
a = ex / ex.sum(dim=1, keepdim=True); sent = torch.sum(a.unsqueeze(-1) * h, dim=1);
the classifier returns F.softmax(logits, -1) (class probabilities, as Keras ports do).
GT (B, 1, 1, S) cross."""

from __future__ import annotations

import torch
from torch import nn

PAD, V, E, H = 0, 20, 8, 8


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.emb = nn.Embedding(V, E, padding_idx=PAD)
        self.lstm = nn.LSTM(E, H, batch_first=True, bidirectional=True)
        self.W = nn.Linear(2 * H, 2 * H)
        self.ctx = nn.Linear(2 * H, 1, bias=False)
        self.fc = nn.Linear(2 * H, 2)

    def reset(self):
        self.computed.clear()

    def forward(self, ids):
        h, _ = self.lstm(self.emb(ids))
        mask = (ids != PAD).float()
        e = self.ctx(torch.tanh(self.W(h))).squeeze(-1)
        ex = torch.exp(e - e.max(dim=1, keepdim=True)[0]) * mask
        a = ex / ex.sum(dim=1, keepdim=True)
        self.computed.append(("cross", a[:, None, None].clone()))
        return torch.softmax(self.fc(torch.sum(a.unsqueeze(-1) * h, dim=1)), dim=-1)


def build(seed=0):
    torch.manual_seed(seed)
    return Model().eval()


def sample_batch():
    return (torch.tensor([[4, 5, 6, 7, 8], [9, 10, 11, 0, 0]]),)
