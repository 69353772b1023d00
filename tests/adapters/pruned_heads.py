"""A BERT-style encoder after head pruning (as Hugging Face's ``prune_heads`` leaves it): its three layers
keep 4, 2 and 4 heads. ``torch.matmul`` scores over ``sqrt(head_dim)``, the additive extended mask,
``nn.functional.softmax``. Random seeded weights, character vocabulary. A trace holds one head count
per kind: the layers with 4 heads are drawn, and the one with 2 is said.

The model's own maps are in ``model.computed`` as ("enc_self", probs (B, heads, S, S)), per layer.
"""

from __future__ import annotations

import math

import torch
from torch import nn

ARCH = "encoder"
VOCAB = ["<pad>", "<bos>", "<eos>"] + list("abcdefghijklmnopqrstuvwxyz ")
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 64
EXAMPLES = ["hello world", "attention"]
HEADS = (4, 2, 4)  # per layer, after pruning
HEAD_DIM = 8


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, n_heads: int, sink: list):
        super().__init__()
        self.num_heads = n_heads
        self.query = nn.Linear(hidden, n_heads * HEAD_DIM)
        self.key = nn.Linear(hidden, n_heads * HEAD_DIM)
        self.value = nn.Linear(hidden, n_heads * HEAD_DIM)
        self.dense = nn.Linear(n_heads * HEAD_DIM, hidden)
        self.sink = sink

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size()[:-1] + (self.num_heads, HEAD_DIM)).permute(0, 2, 1, 3)

    def forward(self, h, ext):
        q, k, v = self.split(self.query(h)), self.split(self.key(h)), self.split(self.value(h))
        probs = nn.functional.softmax(
            torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HEAD_DIM) + ext, dim=-1
        )
        self.sink.append(("enc_self", probs.detach().clone()))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return self.dense(ctx.view(ctx.size()[:-2] + (self.num_heads * HEAD_DIM,)))


class PrunedEncoder(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.emb = nn.Embedding(len(VOCAB), hidden, padding_idx=PAD)
        self.pos = nn.Embedding(MAX_LEN, hidden)
        self.layers = nn.ModuleList(SelfAttention(hidden, n, self.computed) for n in HEADS)
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in HEADS)
        self.head = nn.Linear(hidden, len(VOCAB))

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ext = (ids == PAD)[:, None, None, :].float() * torch.finfo(torch.float32).min
        h = self.emb(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        for layer, norm in zip(self.layers, self.norms, strict=True):
            h = norm(h + layer(h, ext))
        return self.head(h)


def load() -> nn.Module:
    torch.manual_seed(0)
    return PrunedEncoder()


def encode(text: str) -> list[int]:
    return [BOS] + [VOCAB.index(c) for c in text.lower()] + [EOS]


def forward(model: nn.Module, src: torch.Tensor, tgt: None) -> torch.Tensor:
    return model(src)
