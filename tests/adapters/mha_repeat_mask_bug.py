"""An encoder on nn.MultiheadAttention whose per-head padding mask carries a common bug: the
(B, L, L) mask is made (B·heads, L, L) with ``repeat(heads, 1, 1)`` where ``repeat_interleave(heads, 0)``
was meant, so head h of every sequence is masked with sequence h's keys. Random seeded weights,
character vocabulary; forward returns per-position logits (B, S, V).

``encode(text)`` = BOS, the characters, EOS. The model's own maps are in ``model.computed`` as
("enc_self", probs (B, 2, S, S)).
"""

from __future__ import annotations

import torch
from torch import nn

ARCH = "encoder"
VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>"] + list("abcdefghijklmnopqrstuvwxyz ")
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 64
EXAMPLES = ["hello world", "masks"]
_STOI = {c: i for i, c in enumerate(VOCAB) if len(c) == 1}


class Encoder(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2, layers: int = 2):
        super().__init__()
        self.heads = heads
        self.computed: list[tuple[str, torch.Tensor]] = []
        self.emb, self.pos = nn.Embedding(len(VOCAB), d, padding_idx=PAD), nn.Embedding(MAX_LEN, d)
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, heads, batch_first=True) for _ in range(layers))
        self.out = nn.Linear(d, len(VOCAB))

    def reset(self) -> None:
        self.computed.clear()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        x = self.emb(ids) + self.pos(torch.arange(n, device=ids.device))
        hide = (ids == PAD)[:, None, :].expand(-1, n, -1)  # (B, L, L), True = may not attend
        mask = hide.repeat(self.heads, 1, 1)  # the bug: meant hide.repeat_interleave(self.heads, 0)
        for attn in self.attn:
            y, w = attn(x, x, x, attn_mask=mask, average_attn_weights=False)
            self.computed.append(("enc_self", w.detach().clone()))
            x = x + y
        return self.out(x)


def load() -> nn.Module:
    torch.manual_seed(0)
    return Encoder()


def encode(text: str) -> list[int]:
    """BOS, the characters (a-z and space, lower-cased), EOS."""
    bad = sorted({c for c in text.lower() if c not in _STOI})
    if bad:
        raise ValueError(f"characters {''.join(bad)!r} are not in the vocabulary (a-z and space)")
    return [BOS] + [_STOI[c] for c in text.lower()] + [EOS]


def forward(model: nn.Module, src: torch.Tensor, tgt: None) -> torch.Tensor:
    return model(src)
