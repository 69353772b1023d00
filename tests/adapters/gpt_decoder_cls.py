"""The nanoGPT-style decoder of gpt_decoder.py with a learned vector the model prepends to the tokens itself
(a [CLS] or register token inside the model): its position is a labelled learned position of the sequence.
forward(model, None, tgt) -> logits (B, T, V) of the tokens' positions."""

from __future__ import annotations

import torch
from torch import nn

from tests.adapters.gpt_decoder import (  # noqa: F401  (the adapter's names)
    ARCH,
    BOS,
    EOS,
    EXAMPLES,
    GPT,
    MAX_LEN,
    PAD,
    VOCAB,
    encode,
    encode_target,
)


class GPTWithCLS(GPT):
    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 32) * 0.2)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1) + 1, device=idx.device)
        x = torch.cat([self.cls.expand(idx.size(0), 1, -1), self.wte(idx)], dim=1) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))[:, 1:]


def load() -> nn.Module:
    torch.manual_seed(0)
    return GPTWithCLS()


def forward(model: nn.Module, src: None, tgt: torch.Tensor) -> torch.Tensor:
    return model(tgt)
