"""hf_style_decoder.py after a refactoring slip: the causal ``bias`` is applied only when no
``attention_mask`` is given, and the adapter always gives one (built from PAD), so every position
reads the future. Imported from beside this file; only ``load`` differs.
"""

from __future__ import annotations

import torch
from hf_style_decoder import (
    ARCH,
    BOS,
    EOS,
    EXAMPLES,
    MAX_LEN,
    PAD,
    VOCAB,
    GPT2LMHeadModel,
    encode,
    encode_target,
    forward,
)
from torch import nn

__all__ = ["ARCH", "BOS", "EOS", "EXAMPLES", "MAX_LEN", "PAD", "VOCAB", "encode", "encode_target", "forward",
           "load"]  # fmt: skip


def load() -> nn.Module:
    torch.manual_seed(0)
    return GPT2LMHeadModel(causal_with_mask=False)  # the bug
