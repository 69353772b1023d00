"""A sentence classifier pooled by attention with a learned seed query (the Set Transformer's PMA, "attention
pooling"): a self-attention encoder layer over the tokens, then ``nn.MultiheadAttention`` from one learned query
over them, and a linear head. The seed only ever asks: it is no position of the sentence. The encoder's own maps
are in ``model.computed`` as ("enc_self", probs (B, 2, S, S)).
"""

from __future__ import annotations

import torch
from torch import nn

ARCH = "encoder"
VOCAB = ["[PAD]", "[CLS]", "[SEP]", *"abcdefghijklmnopqrstuvwxyz "]
PAD, BOS, EOS = 0, 1, 2
LABELS = ["negative", "positive"]
EXAMPLES = ["great movie", "i hated it"]


class SeedPooled(nn.Module):
    def __init__(self, d: int = 32, heads: int = 2):
        super().__init__()
        self.emb = nn.Embedding(len(VOCAB), d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.seed = nn.Parameter(torch.randn(1, 1, d))
        self.pool = nn.MultiheadAttention(d, heads, batch_first=True)
        self.head = nn.Linear(d, len(LABELS))
        self.computed: list[tuple[str, torch.Tensor]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == PAD
        x = self.emb(ids)
        y, w = self.attn(x, x, x, key_padding_mask=pad, need_weights=True, average_attn_weights=False)
        self.computed.append(("enc_self", w.detach()))
        x = x + y
        pooled, _ = self.pool(self.seed.expand(ids.shape[0], -1, -1), x, x, key_padding_mask=pad)
        return self.head(pooled[:, 0])


def load() -> nn.Module:
    torch.manual_seed(0)
    return SeedPooled()


def encode(text: str) -> list[int]:
    return [BOS, *(VOCAB.index(c) for c in text.lower() if c in VOCAB), EOS]


def forward(model: nn.Module, src: torch.Tensor, tgt: None) -> torch.Tensor:
    return model(src)
