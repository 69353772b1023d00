"""Beam search inside forward, as fairseq's SequenceGenerator / HF generate do it by hand: the
encoder output expanded to beams with index_select(0, arange(B).repeat_interleave(beam)), a decoder
with a KV cache (torch.cat of past keys) whose cache rows are REORDERED every step by the selected
beams (cache.index_select(0, beam_idx)), cross-attention over the expanded memory with the source
padding mask, scores via torch.matmul(q, k.transpose(-2, -1)) / sqrt(d), masked_fill(-inf),
F.softmax(dim=-1).  B = 2 sentences x 2 beams = 4 rows = H.  Ground truth per step: dec_self
(4, 4, 1, t + 1) and cross (4, 4, 1, S).  forward(src, steps) -> best tokens (B, steps)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD, BOS, V, D, NH, BEAM = 0, 1, 20, 32, 4, 2


class MHA(nn.Module):
    def __init__(self, sink, kind):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.kind, self.sink = kind, sink

    def split(self, x):
        return x.view(x.shape[0], x.shape[1], NH, -1).transpose(1, 2)

    def forward(self, x, kv=None, cache=None, key_pad=None):
        q = self.split(self.q(x))
        if cache is not None:  # self-attention, incremental
            k, v = self.split(self.k(x)), self.split(self.v(x))
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        else:
            k, v = self.split(self.k(kv)), self.split(self.v(kv))
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if key_pad is not None:
            s = s.masked_fill(key_pad[:, None, None, :], float("-inf"))
        p = F.softmax(s, dim=-1)
        self.sink.append((self.kind, p.detach().clone()))
        out = torch.matmul(p, v).transpose(1, 2).reshape(x.shape[0], x.shape[1], D)
        return self.o(out)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.emb = nn.Embedding(V, D, padding_idx=PAD)
        self.pos = nn.Embedding(16, D)
        self.enc = MHA(self.computed, "enc_self")
        self.self_attn = MHA(self.computed, "dec_self")
        self.cross_attn = MHA(self.computed, "cross")
        self.ln = nn.ModuleList(nn.LayerNorm(D) for _ in range(3))
        self.out = nn.Linear(D, V)

    def reset(self):
        self.computed.clear()

    def forward(self, src, steps):
        B, S = src.shape
        src_pad = src == PAD
        mem = self.emb(src) + self.pos(torch.arange(S))
        mem = self.ln[0](mem + self.enc(mem, kv=mem, key_pad=src_pad))
        order = torch.arange(B).repeat_interleave(BEAM)
        mem = mem.index_select(0, order)
        mem_pad = src_pad.index_select(0, order)
        cache = {}
        tokens = torch.full((B * BEAM, 1), BOS)
        scores = torch.zeros(B, BEAM)
        scores[:, 1:] = -1e9  # only the first beam is live at step 0
        for t in range(steps):
            y = self.emb(tokens[:, -1:]) + self.pos(torch.tensor([t]))
            y = self.ln[1](y + self.self_attn(y, cache=cache))
            y = self.ln[2](y + self.cross_attn(y, kv=mem, key_pad=mem_pad))
            lprobs = F.log_softmax(self.out(y[:, -1]), dim=-1).view(B, BEAM, V)
            cand = (scores[:, :, None] + lprobs).view(B, BEAM * V)
            scores, idx = cand.topk(BEAM, dim=-1)
            beam_idx = (idx // V + torch.arange(B)[:, None] * BEAM).view(-1)
            word = (idx % V).view(-1, 1)
            tokens = torch.cat([tokens.index_select(0, beam_idx), word], dim=1)
            for key in ("k", "v"):
                cache[key] = cache[key].index_select(0, beam_idx)
        return tokens.view(B, BEAM, -1)[:, 0, 1:]


def build(seed=0):
    torch.manual_seed(seed)
    return Model().eval()


def sample_batch():
    return torch.tensor([[4, 5, 6, 7, 2], [8, 9, 2, 0, 0]]), 3
