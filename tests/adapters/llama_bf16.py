"""Meta's reference LLaMA code (tests/usermodels/llama_meta.py: rotary embeddings, grouped-query
heads, a KV cache written in place, ``F.softmax(scores.float()).type_as(xq)``) with its weights in
BFLOAT16, as Meta's loader sets them. The model is called as ``model(tokens, start_pos=0)``; its
cache holds at most ``MAX_BATCH`` sequences of 16 tokens, so ``MAX_LEN = 16``. Like LLaMA: ``<unk>``
0, ``<s>`` 1, ``</s>`` 2 and no pad token (Meta pads with -1), so PAD is EOS (the causal mask hides
right padding anyway). ``encode`` returns a NUMPY array, as ``np.array(sp.encode(text))`` does; a
character outside the vocabulary reads as ``<unk>``. The model's own maps (bfloat16, as the model
uses them) are in ``model.computed`` as ("dec_self", probs (B, H, T, T)).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the user's project: tests/usermodels
from usermodels import llama_meta  # noqa: E402

ARCH = "decoder"
VOCAB = ["<unk>", "<s>", "</s>"] + list(" abcdehilmnorstuw")  # the model's 20 ids
UNK, BOS, EOS = 0, 1, 2
PAD = EOS
MAX_LEN = llama_meta.MAX_SEQ
MAX_BATCH = llama_meta.MAX_BATCH
EXAMPLES = ["hello world", "a bird"]
_STOI = {t: i for i, t in enumerate(VOCAB)}


def load() -> nn.Module:
    return llama_meta.build(0).to(torch.bfloat16)


def encode(text: str) -> np.ndarray:
    return np.array([BOS] + [_STOI.get(c, UNK) for c in text.lower()])


def encode_target(text: str) -> np.ndarray:
    return np.array([_STOI.get(c, UNK) for c in text.lower()] + [EOS])


def forward(model: nn.Module, src: None, tgt: torch.Tensor) -> torch.Tensor:
    return model(tgt, start_pos=0)
