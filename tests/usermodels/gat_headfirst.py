"""Graph attention, heads first (DGL/pyGAT 'batched heads' style): Wh = torch.stack([x @ W_h for each
head]) (H, N, F) via torch.bmm(x.expand(H, N, Fin), self.W) with W (H, Fin, F); f1 = Wh @ a1 (H, N, 1),
f2 = Wh @ a2 (H, N, 1); e = LeakyReLU(f1 + f2.transpose(1, 2)) (H, N, N); sparse adjacency via
masked_fill(adj == 0, -inf) (adj broadcast over heads); softmax(-1); out = torch.bmm(att, Wh) (H, N, F),
heads concatenated. A batch of 2 graphs folded into one block-diagonal adjacency (PyG-style batching).
GT per layer (1, H, N, N) enc_self (the 2 graphs are one node set)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

V, E, NH, FH = 20, 8, 2, 4


class Layer(nn.Module):
    def __init__(self, fin, sink):
        super().__init__()
        self.W = nn.Parameter(torch.randn(NH, fin, FH) * 0.3)
        self.a1 = nn.Parameter(torch.randn(NH, FH, 1))
        self.a2 = nn.Parameter(torch.randn(NH, FH, 1))
        self.sink = sink

    def forward(self, x, adj):
        N = x.size(0)
        Wh = torch.bmm(x.unsqueeze(0).expand(NH, N, x.size(1)), self.W)
        f1, f2 = torch.bmm(Wh, self.a1), torch.bmm(Wh, self.a2)
        e = F.leaky_relu(f1 + f2.transpose(1, 2), 0.2)
        e = e.masked_fill(adj == 0, float("-inf"))
        att = torch.softmax(e, dim=-1)
        self.sink.append(("enc_self", att.unsqueeze(0).clone()))
        out = torch.bmm(att, Wh)
        return out.transpose(0, 1).reshape(N, NH * FH)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.emb = nn.Embedding(V, E)
        self.l1 = Layer(E, self.computed)
        self.l2 = Layer(NH * FH, self.computed)

    def reset(self):
        self.computed.clear()

    def forward(self, ids, adj):
        return self.l2(F.elu(self.l1(self.emb(ids), adj)), adj)


def build(seed=0):
    torch.manual_seed(seed)
    return Model().eval()


def sample_batch():
    ids = torch.tensor([4, 5, 6, 7, 8, 9, 10])
    adj = torch.eye(7)
    for i, j in [(0, 1), (1, 2), (3, 4), (4, 5), (5, 6), (3, 6)]:
        adj[i, j] = adj[j, i] = 1.0
    return ids, adj
