"""hf_style_decoder.py's model run the way generation code runs it: ``forward`` feeds ONE token at a
time, passing ``past_key_values`` back in (a KV cache joined with ``torch.cat``), and the logits of
the steps are concatenated. Each layer's attention is then recorded once per step as (B, H, 1, t + 1);
attnscope joins the steps into one (B, H, T, T) map per layer. The model and tokens are imported from
beside this file; only ``forward`` differs. The model's own maps, one per layer and step, are in
``model.computed`` as ("dec_self", probs (B, H, 1, t + 1)).
"""

from __future__ import annotations

import torch
from hf_style_decoder import ARCH, BOS, EOS, EXAMPLES, MAX_LEN, PAD, VOCAB, encode, encode_target, load
from torch import nn

__all__ = ["ARCH", "BOS", "EOS", "EXAMPLES", "MAX_LEN", "PAD", "VOCAB", "encode", "encode_target", "forward",
           "load"]  # fmt: skip


def forward(model: nn.Module, src: None, tgt: torch.Tensor) -> torch.Tensor:
    attention_mask = (tgt != PAD).long()
    past, logits = None, []
    for t in range(tgt.shape[1]):
        out = model(tgt[:, t : t + 1], attention_mask=attention_mask[:, : t + 1], past_key_values=past)
        past = out.past_key_values
        logits.append(out.logits)
    return torch.cat(logits, dim=1)  # (B, T, V)
