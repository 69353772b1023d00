"""torch_translation_seqfirst.py with the slip users make most often when they adapt that tutorial:
``memory_key_padding_mask`` left out of the ``nn.Transformer`` call, so cross-attention reads the
source's padding (every other mask is right). The model and tokens are imported from beside this
file; only ``forward`` differs.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch_translation_seqfirst import (
    ARCH,
    BOS,
    EOS,
    EXAMPLES,
    MAX_LEN,
    PAD,
    TGT_VOCAB,
    VOCAB,
    create_mask,
    encode,
    encode_target,
    load,
)

__all__ = ["ARCH", "BOS", "EOS", "EXAMPLES", "MAX_LEN", "PAD", "TGT_VOCAB", "VOCAB", "encode", "encode_target",
           "forward", "load"]  # fmt: skip


def forward(model: nn.Module, src: Tensor, tgt: Tensor) -> Tensor:
    src, tgt = src.T, tgt.T
    src_mask, tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt)
    logits = model(
        src, tgt, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, None
    )  # the slip: no memory mask
    return logits.transpose(0, 1)
