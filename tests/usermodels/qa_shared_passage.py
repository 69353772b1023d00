"""Several questions about ONE passage (reading comprehension / retrieval re-ranking code that
encodes the passage once and broadcasts it): the passage (1, S) is encoded once, then
passage.expand(B, -1, -1) is the memory of a cross-attention from B = 4 questions (4, T);
heads split with view + transpose, scores = q @ k.transpose(-2, -1) * scale, question padding hides
nothing on the keys (the passage has no padding), torch.softmax(-1).  H = 4 = B.
Ground truth: self-attention of the passage (1, 4, S, S) and of the questions (4, 4, T, T), then the
cross-attention (4, 4, T, S) - four different query sequences reading the same keys.
forward(passage, questions) -> hidden (4, T, D)."""

from __future__ import annotations

import torch
from torch import nn

PAD, V, D, NH = 0, 20, 32, 4


class Attn(nn.Module):
    def __init__(self, sink, kind):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.sink, self.kind = sink, kind

    def forward(self, x, mem, key_pad=None):
        B, T, _ = x.shape
        S = mem.shape[1]
        q = self.q(x).view(B, T, NH, -1).transpose(1, 2)
        k = self.k(mem).view(B, S, NH, -1).transpose(1, 2)
        v = self.v(mem).view(B, S, NH, -1).transpose(1, 2)
        s = q @ k.transpose(-2, -1) * (D // NH) ** -0.5
        if key_pad is not None:
            s = s.masked_fill(key_pad[:, None, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        self.sink.append((self.kind, p.detach().clone()))
        return self.o((p @ v).transpose(1, 2).reshape(B, T, D))


class Reader(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.emb = nn.Embedding(V, D, padding_idx=PAD)
        self.pos = nn.Embedding(16, D)
        self.passage_attn = Attn(self.computed, "enc_self")
        self.question_attn = Attn(self.computed, "enc_self")
        self.reader = Attn(self.computed, "cross")
        self.ln = nn.LayerNorm(D)

    def reset(self):
        self.computed.clear()

    def forward(self, passage, questions):
        p = self.emb(passage) + self.pos(torch.arange(passage.shape[1]))
        p = self.ln(p + self.passage_attn(p, p))
        qpad = questions == PAD
        q = self.emb(questions) + self.pos(torch.arange(questions.shape[1]))
        q = self.ln(q + self.question_attn(q, q, qpad))
        mem = p.expand(questions.shape[0], -1, -1)
        return self.ln(q + self.reader(q, mem))


def build(seed=0):
    torch.manual_seed(seed)
    return Reader().eval()


def sample_batch():
    passage = torch.tensor([[4, 5, 6, 7, 8, 9, 2]])
    questions = torch.tensor([[10, 11, 12, 2], [13, 14, 2, 0], [15, 16, 17, 18], [19, 2, 0, 0]])
    return passage, questions
