"""A BERT sentence classifier the Hugging Face way: tests/usermodels/additive.py's encoder (additive
extended mask, grouped-query heads) under a pooler (dense + tanh on the [CLS] position) and a linear
head, returning a DICT like ``SequenceClassifierOutput``: ``{"logits": (B, 2), "pooler_output": ...}``.
The ``attention_mask`` is built from PAD by the adapter. Word-piece style specials ``[PAD] [UNK]
[CLS] [SEP]`` (``[CLS]`` is BOS, ``[SEP]`` EOS) in a DICT vocabulary token -> id, unknown words read
as ``[UNK]``, and ``encode`` truncates to MAX_LEN itself (``truncation=True``), as tokenizers do.
The model's own maps are in ``model.encoder.computed`` as ("enc_self", probs (B, 4, S, S)).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the user's project: tests/usermodels
from usermodels import additive  # noqa: E402

ARCH = "encoder"
_WORDS = "good bad movie film great awful not very fun boring plot acting was is the a".split()
VOCAB = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *_WORDS])}
PAD, UNK, BOS, EOS = VOCAB["[PAD]"], VOCAB["[UNK]"], VOCAB["[CLS]"], VOCAB["[SEP]"]
LABELS = ["negative", "positive"]
MAX_LEN = 12
EXAMPLES = ["the movie was good", "boring plot"]


class BertForSequenceClassification(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = additive.build(0)
        hidden = self.encoder.config.hidden_size
        self.pooler = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())
        self.classifier = nn.Linear(hidden, len(LABELS))

    def forward(self, input_ids, attention_mask=None) -> dict[str, torch.Tensor]:
        hidden = self.encoder(input_ids, attention_mask)  # (B, S, D)
        pooled = self.pooler(hidden[:, 0])  # the [CLS] position
        return {"logits": self.classifier(pooled), "pooler_output": pooled}


def load() -> nn.Module:
    torch.manual_seed(0)
    return BertForSequenceClassification()


def encode(text: str) -> list[int]:
    ids = [VOCAB.get(w, UNK) for w in text.lower().split()][: MAX_LEN - 2]
    return [BOS, *ids, EOS]


def forward(model: nn.Module, src: torch.Tensor, tgt: None) -> dict[str, torch.Tensor]:
    return model(src, attention_mask=(src != PAD).long())
