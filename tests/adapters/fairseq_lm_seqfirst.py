"""A fairseq-style language model fed SEQUENCE-first ids (tests/usermodels/fairseq_seqfirst.py:
``(T, B)`` in, ``(T, B, vocab)`` out, bmm heads, the future mask added in place): the adapter's
``forward`` transposes in and out and returns LOG-probabilities (``F.log_softmax``, as fairseq's
``get_normalized_probs(log_probs=True)``). fairseq's dictionary has no BOS here (``BOS = None``):
a prompt is its words alone, a continuation ends with ``</s>``. A word vocabulary of the model's 20
ids; a word it lacks is an error ``encode`` raises. The model's own maps are in ``model.computed``
as ("dec_self", probs (B, H, T, T)).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the user's project: tests/usermodels
from usermodels import fairseq_seqfirst  # noqa: E402

ARCH = "decoder"
VOCAB = [
    "<pad>",
    "<unk>",
    "</s>",
] + "the a cat dog sat on mat ran to park and saw big small red blue house".split()
PAD, BOS, EOS = fairseq_seqfirst.PAD, None, 2
MAX_LEN = 64
EXAMPLES = ["the cat sat on the mat", "a dog ran"]


def load() -> nn.Module:
    return fairseq_seqfirst.build(0)


def encode(text: str) -> list[int]:
    words = text.lower().split()
    unknown = [w for w in words if w not in VOCAB[3:]]
    if unknown:
        raise KeyError(f"word {unknown[0]!r} is not in the dictionary")
    return [VOCAB.index(w) for w in words]


def encode_target(text: str) -> list[int]:
    return encode(text) + [EOS]


def forward(model: nn.Module, src: None, tgt: torch.Tensor) -> torch.Tensor:
    logits = model(tgt.t())  # (T, B, V): the model is sequence-first
    return F.log_softmax(logits, dim=-1).transpose(0, 1)  # (B, T, V) log-probabilities
