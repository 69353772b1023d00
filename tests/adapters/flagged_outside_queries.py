"""An encoder whose queries go through numpy and back: attnscope cannot follow their head axis, so
its capture flags every layer (the maps are drawn, marked as not verified). forward -> hidden states.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = ["<pad>", "<unk>"] + list("abcdefgh")
PAD, BOS, EOS = 0, 1, 1
ARCH = "encoder"
EXAMPLES = ["abc", "hed"]
_STOI = {c: i for i, c in enumerate(VOCAB) if len(c) == 1}


class Outside(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.q, self.k = nn.Embedding(len(VOCAB), 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.out = nn.Linear(8, len(VOCAB))

    def forward(self, ids):
        x = self.emb(ids)
        b, n, _ = x.shape
        q = torch.from_numpy(self.q(x).detach().cpu().numpy().copy())
        q = q.view(b, n, 2, 4).transpose(1, 2).reshape(b * 2, n, 4)
        k = self.k(x).view(b, n, 2, 4).transpose(1, 2).reshape(b * 2, n, 4)
        keep = (ids != PAD).repeat(2, 1)[:, None, :]
        w = torch.softmax((q @ k.transpose(1, 2)).masked_fill(~keep, float("-inf")), dim=-1)
        return self.out(x + (w @ k).view(b, 2, n, 4).transpose(1, 2).reshape(b, n, 8))


def encode(text: str) -> list[int]:
    return [_STOI.get(c, 1) for c in text]


def load() -> nn.Module:
    torch.manual_seed(0)
    return Outside().eval()


def forward(model: nn.Module, src: torch.Tensor, tgt: None) -> torch.Tensor:
    return model(src)
