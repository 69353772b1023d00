"""Bahdanau et al. (2015) additive attention in a GRU encoder-decoder, decoded step by step with
teacher forcing (the PyTorch "NLP from scratch" / bentrevett seq2seq tutorial #3 style):
energy = v^T tanh(W s_{t-1} + U h_j) from nn.Linear layers (scores are NOT a product of two
activations), masked_fill(mask == 0, -1e10), F.softmax(dim=1) over a 2-D (B, S) tensor, and the
context torch.bmm(a.unsqueeze(1), encoder_outputs). forward(src, tgt) -> logits (B, T, V)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, V, E, HID = 0, 20, 16, 16


class Attention(nn.Module):
    def __init__(self, sink):
        super().__init__()
        self.attn = nn.Linear(2 * HID + HID, HID)
        self.v = nn.Linear(HID, 1, bias=False)
        self.sink = sink

    def forward(self, hidden, encoder_outputs, mask):
        # hidden (B, HID), encoder_outputs (B, S, 2HID), mask (B, S)
        src_len = encoder_outputs.shape[1]
        hidden = hidden.unsqueeze(1).repeat(1, src_len, 1)
        energy = torch.tanh(self.attn(torch.cat((hidden, encoder_outputs), dim=2)))
        attention = self.v(energy).squeeze(2)  # (B, S)
        attention = attention.masked_fill(mask == 0, -1e10)
        a = F.softmax(attention, dim=1)
        self.sink.append(("cross", a[:, None, None, :].detach().clone()))
        return a


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.src_emb = nn.Embedding(V, E, padding_idx=PAD)
        self.tgt_emb = nn.Embedding(V, E, padding_idx=PAD)
        self.rnn = nn.GRU(E, HID, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(2 * HID, HID)
        self.attention = Attention(self.computed)
        self.dec = nn.GRU(2 * HID + E, HID, batch_first=True)
        self.out = nn.Linear(2 * HID + HID + E, V)

    def reset(self):
        self.computed.clear()

    def forward(self, src, tgt):
        mask = src != PAD
        enc, hidden = self.rnn(self.src_emb(src))
        hidden = torch.tanh(self.fc(torch.cat((hidden[-2], hidden[-1]), dim=1)))
        outs = []
        for t in range(tgt.shape[1]):
            emb = self.tgt_emb(tgt[:, t]).unsqueeze(1)  # (B, 1, E)
            a = self.attention(hidden, enc, mask).unsqueeze(1)  # (B, 1, S)
            weighted = torch.bmm(a, enc)  # (B, 1, 2HID)
            output, h = self.dec(torch.cat((emb, weighted), dim=2), hidden.unsqueeze(0))
            hidden = h.squeeze(0)
            outs.append(self.out(torch.cat((output.squeeze(1), weighted.squeeze(1), emb.squeeze(1)), dim=1)))
        return torch.stack(outs, dim=1)


def build(seed=0):
    torch.manual_seed(seed)
    return Seq2Seq().eval()


def sample_batch():
    src = torch.tensor([[4, 5, 6, 7, 8, 2], [9, 10, 11, 2, 0, 0], [12, 2, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 3, 4, 5], [1, 6, 7, 0], [1, 8, 0, 0]])
    return src, tgt
