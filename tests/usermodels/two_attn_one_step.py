"""A knowledge-grounded dialogue decoder: per decoding step (GRUCell), attention to the source
utterance (Bahdanau additive: v(tanh(W_s(h)[:, None] + U(enc)))) AND to a knowledge memory (Luong dot
written as a sum: torch.sum(h[:, None] * mem, 2)), both in one module; the memory's context is
taken before the source's (mem_ctx, src_ctx = bmm(a_mem...), bmm(a_src...)). Utterance and
memory have the same length (5). Greedy decoding 3 steps.
GT per step: [source (B,1,1,S), memory (B,1,1,M)], both cross, in the order the softmaxes run."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, SOS, V, E, H = 0, 1, 20, 8, 8


class Decoder(nn.Module):
    def __init__(self, emb, sink):
        super().__init__()
        self.emb = emb
        self.sink = sink
        self.W_s = nn.Linear(H, H, bias=False)
        self.U = nn.Linear(H, H)
        self.v = nn.Linear(H, 1, bias=False)
        self.cell = nn.GRUCell(E, H)
        self.out = nn.Linear(3 * H, V)

    def forward(self, tok, h, enc, src_mask, mem, mem_mask):
        h = self.cell(self.emb(tok), h)
        e_src = self.v(torch.tanh(self.W_s(h)[:, None] + self.U(enc))).squeeze(2)
        a_src = F.softmax(e_src.masked_fill(~src_mask, -1e9), dim=1)
        e_mem = torch.sum(h[:, None] * mem, 2)
        a_mem = F.softmax(e_mem.masked_fill(~mem_mask, -1e9), dim=1)
        self.sink.append(("cross", a_src[:, None, None].clone()))
        self.sink.append(("cross", a_mem[:, None, None].clone()))
        mem_ctx = torch.bmm(a_mem.unsqueeze(1), mem).squeeze(1)
        src_ctx = torch.bmm(a_src.unsqueeze(1), enc).squeeze(1)
        return self.out(torch.cat((h, src_ctx, mem_ctx), 1)), h


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.emb = nn.Embedding(V, E, padding_idx=PAD)
        self.enc = nn.GRU(E, H, batch_first=True)
        self.mem_enc = nn.Linear(E, H)
        self.decoder = Decoder(self.emb, self.computed)

    def reset(self):
        self.computed.clear()

    def forward(self, src, know):
        enc, hn = self.enc(self.emb(src))
        mem = torch.tanh(self.mem_enc(self.emb(know)))
        h = hn[0]
        tok = torch.full((src.size(0),), SOS, dtype=torch.long)
        toks = []
        for _ in range(3):
            logits, h = self.decoder(tok, h, enc, src != PAD, mem, know != PAD)
            tok = logits.argmax(-1)
            toks.append(tok)
        return torch.stack(toks, 1)


def build(seed=0):
    torch.manual_seed(seed)
    return Model().eval()


def sample_batch():
    src = torch.tensor([[4, 5, 6, 7, 2], [8, 9, 2, 0, 0]])
    know = torch.tensor([[12, 13, 14, 0, 0], [15, 16, 17, 18, 19]])
    return src, know
