"""An encoder CLASSIFIER with keys beyond the tokens: a learned ``cls_token`` prepended to the
character embeddings (it gets a row and a column of every map), two learned memory key/values per
head joined in front of the keys, and a learned null key in the last layer (columns of their own).
tests/usermodels/learned_keys.py's model on characters; forward returns class logits (B, 3).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from usermodels.learned_keys import ViTLike  # noqa: E402

VOCAB = ["<pad>", "<unk>"] + list("abcdefghijklmnopqr")
PAD, BOS, EOS = 0, 1, 1  # no specials: BOS and EOS name the unknown character
ARCH = "encoder"
LABELS = ["a", "b", "c"]
MAX_LEN = 15
EXAMPLES = ["abc", "hello"]
_STOI = {c: i for i, c in enumerate(VOCAB) if len(c) == 1}


def encode(text: str) -> list[int]:
    return [_STOI.get(c, 1) for c in text]


def load() -> nn.Module:
    torch.manual_seed(0)
    return ViTLike().eval()


def forward(model: nn.Module, src: torch.Tensor, tgt: None) -> torch.Tensor:
    return model(src)
