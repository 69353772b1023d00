"""Hierarchical Attention Network (Yang et al. 2016) for document classification, as the popular
PyTorch ports write it: documents (B, S, W) of word ids; words of every sentence folded into the
batch (B*S, W) and run through a bidirectional GRU; word attention u = tanh(self.word_fc(h)),
scores = self.word_context(u).squeeze(-1) (an nn.Linear(A, 1, bias=False) as the learned context
vector u_w), masked_fill(~mask, -1e4), softmax(dim=1), sentence vector = (alpha.unsqueeze(-1) *
h).sum(1); the sentence level the same over (B, S) with the context vector an nn.Parameter used as
torch.matmul(u, self.sentence_context).  Both are attention with ONE learned query (a Perceiver-like
latent reading the tokens).  Ground truth: word level (B*S, 1, 1, W), sentence level (B, 1, 1, S).
forward(docs) -> class logits (B, 3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PAD, V, E, G, A = 0, 20, 16, 8, 16


class HAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.embedding = nn.Embedding(V, E, padding_idx=PAD)
        self.word_gru = nn.GRU(E, G, bidirectional=True, batch_first=True)
        self.word_fc = nn.Linear(2 * G, A)
        self.word_context = nn.Linear(A, 1, bias=False)
        self.sent_gru = nn.GRU(2 * G, G, bidirectional=True, batch_first=True)
        self.sent_fc = nn.Linear(2 * G, A)
        self.sentence_context = nn.Parameter(torch.randn(A))
        self.cls = nn.Linear(2 * G, 3)

    def reset(self):
        self.computed.clear()

    def forward(self, docs):
        B, S, W = docs.shape
        words = docs.view(B * S, W)
        word_mask = words != PAD
        h, _ = self.word_gru(self.embedding(words))  # (B*S, W, 2G)
        u = torch.tanh(self.word_fc(h))
        scores = self.word_context(u).squeeze(-1)  # (B*S, W)
        scores = scores.masked_fill(~word_mask, -1e4)
        alpha = F.softmax(scores, dim=1)
        self.computed.append(("cross", alpha[:, None, None, :].detach().clone()))
        sents = (alpha.unsqueeze(-1) * h).sum(dim=1).view(B, S, -1)
        sent_mask = word_mask.view(B, S, W).any(-1)
        hs, _ = self.sent_gru(sents)
        us = torch.tanh(self.sent_fc(hs))
        s_scores = torch.matmul(us, self.sentence_context)  # (B, S)
        s_scores = s_scores.masked_fill(~sent_mask, -1e4)
        beta = F.softmax(s_scores, dim=-1)
        self.computed.append(("cross", beta[:, None, None, :].detach().clone()))
        doc = (beta.unsqueeze(-1) * hs).sum(dim=1)
        return self.cls(doc)


def build(seed=0):
    torch.manual_seed(seed)
    return HAN().eval()


def sample_batch():
    docs = torch.tensor(
        [
            [[4, 5, 6, 0], [7, 8, 0, 0], [9, 10, 11, 12]],
            [[13, 14, 0, 0], [15, 16, 17, 0], [0, 0, 0, 0]],
        ]
    )
    return (docs,)
