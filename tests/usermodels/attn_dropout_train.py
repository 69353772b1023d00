"""Additive attention pooling in TRAINING mode with dropout on the attention weights (as
capture_attention would see it inside attnscope.watch during training): h = BiGRU(emb) batch-first;
a = softmax(self.v(torch.tanh(self.W(h))).squeeze(-1).masked_fill(~mask, -1e9), 1);
a = self.drop(a) (nn.Dropout(0.3), rescaled); pooled = torch.bmm(a.unsqueeze(1), h).squeeze(1).
The RNG is re-seeded before each run (SEED_EACH_RUN), so both runs draw the same dropout.
GT: the dropped and rescaled weights that multiply h, (B, 1, 1, S) cross."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, V, E, H = 0, 20, 8, 8
SEED_EACH_RUN = 123


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.emb = nn.Embedding(V, E, padding_idx=PAD)
        self.rnn = nn.GRU(E, H, batch_first=True, bidirectional=True)
        self.W = nn.Linear(2 * H, H)
        self.v = nn.Linear(H, 1, bias=False)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(2 * H, 2)

    def reset(self):
        self.computed.clear()

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        e = self.v(torch.tanh(self.W(h))).squeeze(-1).masked_fill(ids == PAD, -1e9)
        a = self.drop(F.softmax(e, 1))
        self.computed.append(("cross", a[:, None, None].clone()))
        return self.fc(torch.bmm(a.unsqueeze(1), h).squeeze(1))


def build(seed=0):
    torch.manual_seed(seed)
    return Model().train()


def sample_batch():
    return (torch.tensor([[4, 5, 6, 7, 8, 9], [10, 11, 12, 0, 0, 0], [13, 14, 15, 16, 0, 0]]),)
