"""A seq2seq model built on torch.nn.Transformer, shown to attnscope through an adapter file."""

import torch
from torch import nn

ARCH = "encoder-decoder"  # or "encoder", or "decoder" (decoder-only)
VOCAB = ["<pad>", "<bos>", "<eos>"] + list("abcdefghijklmnopqrstuvwxyz ")
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 64
EXAMPLES = ["hello world", "attention"]


class Model(nn.Module):  # yours: `from my_project.model import Model`
    def __init__(self, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(len(VOCAB), d)
        self.tf = nn.Transformer(d, 4, 2, 2, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, len(VOCAB))

    def forward(self, src, tgt):
        future = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool, device=tgt.device).triu(1)
        h = self.tf(self.emb(src), self.emb(tgt), tgt_mask=future, src_key_padding_mask=src == PAD,
                    tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=src == PAD)  # fmt: skip
        return self.out(h)  # logits (B, T, V)


def load():
    torch.manual_seed(0)
    model = Model()  # yours: model.load_state_dict(torch.load("weights.pt", weights_only=True))
    return model


def encode(text):
    return [VOCAB.index(c) for c in text.lower()] + [EOS]  # an unknown character raises: attnscope says so


def forward(model, src, tgt):
    return model(src, tgt)
