"""Bahdanau attention with an nn.GRUCell decoder (a very common hand-written seq2seq): bidirectional
batch-first GRU encoder, directions concatenated; per step energy = v(tanh(attn(cat(s.unsqueeze(1)
.repeat(1, S, 1), enc)))) where s is the GRUCell's hidden state, masked_fill(-1e10), softmax(dim=1),
context = bmm(a.unsqueeze(1), enc); the next cell input is cat(emb, context). Teacher forcing.
Ground truth per step (B, 1, 1, S) cross."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, V, E, H = 0, 20, 8, 8


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.src_emb = nn.Embedding(V, E, padding_idx=PAD)
        self.tgt_emb = nn.Embedding(V, E, padding_idx=PAD)
        self.enc = nn.GRU(E, H, batch_first=True, bidirectional=True)
        self.init = nn.Linear(2 * H, H)
        self.attn = nn.Linear(H + 2 * H, H)
        self.v = nn.Linear(H, 1, bias=False)
        self.cell = nn.GRUCell(E + 2 * H, H)
        self.out = nn.Linear(H, V)

    def reset(self):
        self.computed.clear()

    def forward(self, src, tgt):
        mask = src != PAD
        enc, _ = self.enc(self.src_emb(src))
        S = enc.size(1)
        s = torch.tanh(self.init(enc.mean(1)))
        logits = []
        for t in range(tgt.size(1)):
            emb = self.tgt_emb(tgt[:, t])
            energy = self.v(
                torch.tanh(self.attn(torch.cat((s.unsqueeze(1).repeat(1, S, 1), enc), dim=2)))
            ).squeeze(2)
            energy = energy.masked_fill(~mask, -1e10)
            a = F.softmax(energy, dim=1)
            self.computed.append(("cross", a[:, None, None, :].clone()))
            ctx = torch.bmm(a.unsqueeze(1), enc).squeeze(1)
            s = self.cell(torch.cat((emb, ctx), 1), s)
            logits.append(self.out(s))
        return torch.stack(logits, 1)


def build(seed=0):
    torch.manual_seed(seed)
    return Model().eval()


def sample_batch():
    src = torch.tensor([[4, 5, 6, 7, 2], [8, 9, 2, 0, 0], [10, 11, 12, 2, 0]])
    tgt = torch.tensor([[1, 3, 4, 5], [1, 6, 7, 0], [1, 8, 9, 0]])
    return src, tgt
