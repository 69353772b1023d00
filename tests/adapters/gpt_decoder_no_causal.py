"""nanoGPT-style decoder-only model WITHOUT a causal mask: F.scaled_dot_product_attention is called
with is_causal=False and no attn_mask, so every position sees the future (and, in padded batches, the
padding). The model and tokens are gpt_decoder.py's, imported from beside this file (as a user's adapter
imports their own code); only ``load`` differs.
"""

from __future__ import annotations

import torch
from gpt_decoder import ARCH, BOS, EOS, EXAMPLES, GPT, MAX_LEN, PAD, VOCAB, encode, encode_target, forward
from torch import nn

__all__ = [
    "ARCH",
    "BOS",
    "EOS",
    "EXAMPLES",
    "MAX_LEN",
    "PAD",
    "VOCAB",
    "encode",
    "encode_target",
    "forward",
    "load",
]


def load() -> nn.Module:
    torch.manual_seed(0)
    return GPT(is_causal=False)  # the bug: a decoder that sees the future
