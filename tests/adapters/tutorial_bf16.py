"""tutorial_seq2seq.py's model (imported from beside this file) with its weights in BFLOAT16 (cast
to save memory, as users do before showing a model): forward still returns the Generator's
PROBABILITIES, now bfloat16, whose sums are 1 only to bfloat16 precision (off by ~2e-3 when the model
is confident: the Generator's weights are scaled by 8 so that random weights give peaked outputs, as
trained ones do). The model's own maps (bfloat16) are in ``model.computed`` as (label, probs (B, H, q, k)).
"""

from __future__ import annotations

import torch
from torch import nn
from tutorial_seq2seq import ARCH, BOS, EOS, EXAMPLES, MAX_LEN, PAD, VOCAB, Transformer, encode, forward

__all__ = ["ARCH", "BOS", "EOS", "EXAMPLES", "MAX_LEN", "PAD", "VOCAB", "encode", "forward", "load"]


def load() -> nn.Module:
    torch.manual_seed(0)
    model = Transformer()
    with torch.no_grad():
        model.proj.weight.mul_(8.0)  # confident, as a trained model is
    return model.to(torch.bfloat16)
