"""Graph attention (Velickovic et al. 2018) as pyGAT writes it (dense adjacency): Wh = torch.mm(h,
self.W), e = LeakyReLU(Wh @ a[:F] + (Wh @ a[F:]).T) (scores are a SUM of two projections, not a
product), attention = torch.where(adj > 0, e, -9e15 * torch.ones_like(e)), F.softmax(dim=1),
F.dropout, h' = torch.matmul(attention, Wh); H = 3 heads as separate modules in a list named
`attentions`, concatenated, then one output attention head.  Used on a token graph: node features
come from an nn.Embedding of 7 token ids, adjacency = a dependency-like tree + self loops.
Ground truth: the heads' maps joined into one layer (1, NH, N, N), as their outputs are joined along
the features (multi-head attention by concatenation), then the output head (1, 1, N, N).
forward(ids, adj) -> node logits (N, 4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

V, E, FH, NH = 20, 16, 8, 3


class GraphAttentionLayer(nn.Module):
    def __init__(self, in_features, out_features, sink, concat=True):
        super().__init__()
        self.out_features = out_features
        self.concat = concat
        self.W = nn.Parameter(torch.empty(size=(in_features, out_features)))
        nn.init.xavier_uniform_(self.W.data, gain=1.414)
        self.a = nn.Parameter(torch.empty(size=(2 * out_features, 1)))
        nn.init.xavier_uniform_(self.a.data, gain=1.414)
        self.leakyrelu = nn.LeakyReLU(0.2)
        self.sink = sink

    def forward(self, h, adj):
        Wh = torch.mm(h, self.W)
        e = self._prepare_attentional_mechanism_input(Wh)
        zero_vec = -9e15 * torch.ones_like(e)
        attention = torch.where(adj > 0, e, zero_vec)
        attention = F.softmax(attention, dim=1)
        attention = F.dropout(attention, 0.1, training=self.training)
        self.sink.append(("enc_self", attention[None, None].detach().clone()))
        h_prime = torch.matmul(attention, Wh)
        return F.elu(h_prime) if self.concat else h_prime

    def _prepare_attentional_mechanism_input(self, Wh):
        Wh1 = torch.matmul(Wh, self.a[: self.out_features, :])
        Wh2 = torch.matmul(Wh, self.a[self.out_features :, :])
        e = Wh1 + Wh2.T
        return self.leakyrelu(e)


class GAT(nn.Module):
    def __init__(self):
        super().__init__()
        self.computed = []
        self.emb = nn.Embedding(V, E)
        self.attentions = nn.ModuleList(GraphAttentionLayer(E, FH, self.computed) for _ in range(NH))
        self.out_att = GraphAttentionLayer(FH * NH, 4, self.computed, concat=False)

    def reset(self):
        self.computed.clear()

    def forward(self, ids, adj):
        x = self.emb(ids)
        x = torch.cat([att(x, adj) for att in self.attentions], dim=1)
        heads = [self.computed.pop() for _ in range(NH)][::-1]  # one layer of NH heads
        self.computed.append((heads[0][0], torch.cat([t for _, t in heads], dim=1)))
        x = F.elu(self.out_att(x, adj))
        return F.log_softmax(x, dim=1)


def build(seed=0):
    torch.manual_seed(seed)
    return GAT().eval()


def sample_batch():
    ids = torch.tensor([4, 5, 6, 7, 8, 9, 2])
    edges = [(0, 1), (1, 2), (1, 3), (3, 4), (3, 5), (5, 6)]
    adj = torch.eye(7)
    for i, j in edges:
        adj[i, j] = adj[j, i] = 1.0
    return ids, adj
