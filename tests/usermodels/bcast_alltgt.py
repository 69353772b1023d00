"""Additive (Bahdanau/'concat') attention computed for ALL decoder steps at once by broadcasting, as
in many teacher-forced implementations: dec = GRU(tgt) (B, T, d), enc = GRU(src) (B, S, d);
energy = self.v(torch.tanh(self.W_q(dec).unsqueeze(2) + self.W_k(enc).unsqueeze(1))).squeeze(-1)
(B, T, 1, d) + (B, 1, S, d) -> (B, T, S); masked_fill(~src_mask[:, None, :], -inf); softmax(-1);
context = torch.bmm(a, enc). GT (B, 1, T, S) cross."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, V, E, H = 0, 20, 8, 8


class Model(nn.Module):
    def __init__(self, swap=False):
        super().__init__()
        self.swap = swap  # bcast_alltgt_swapped: (B, 1, S, d) + (B, T, 1, d)
        self.computed = []
        self.src_emb = nn.Embedding(V, E, padding_idx=PAD)
        self.tgt_emb = nn.Embedding(V, E, padding_idx=PAD)
        self.enc = nn.GRU(E, H, batch_first=True)
        self.dec = nn.GRU(E, H, batch_first=True)
        self.W_q = nn.Linear(H, H, bias=False)
        self.W_k = nn.Linear(H, H)
        self.v = nn.Linear(H, 1, bias=False)
        self.out = nn.Linear(2 * H, V)

    def reset(self):
        self.computed.clear()

    def forward(self, src, tgt):
        enc, hn = self.enc(self.src_emb(src))
        dec, _ = self.dec(self.tgt_emb(tgt), hn)
        if self.swap:
            e = self.W_k(enc).unsqueeze(1) + self.W_q(dec).unsqueeze(2)
        else:
            e = self.W_q(dec).unsqueeze(2) + self.W_k(enc).unsqueeze(1)
        energy = self.v(torch.tanh(e)).squeeze(-1)
        energy = energy.masked_fill(~(src != PAD)[:, None, :], float("-inf"))
        a = F.softmax(energy, dim=-1)
        self.computed.append(("cross", a.unsqueeze(1).clone()))
        ctx = torch.bmm(a, enc)
        return self.out(torch.cat((dec, ctx), -1))


def build(seed=0, swap=False):
    torch.manual_seed(seed)
    return Model(swap).eval()


def sample_batch():
    src = torch.tensor([[4, 5, 6, 7, 2], [8, 9, 2, 0, 0], [10, 11, 12, 2, 0]])
    tgt = torch.tensor([[1, 3, 4, 5], [1, 6, 7, 0], [1, 8, 9, 0]])
    return src, tgt
