"""A seq2seq model built on torch.nn.Transformer, shown to attnscope through an adapter file."""

from pathlib import Path

import torch
from safetensors.torch import load_file
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
        self.pos = nn.Embedding(MAX_LEN, d)  # learned positions: attention alone cannot see order
        self.tf = nn.Transformer(d, 4, 2, 2, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, len(VOCAB))

    def embed(self, ids):
        return self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))

    def forward(self, src, tgt):
        future = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool, device=tgt.device).triu(1)
        h = self.tf(self.embed(src), self.embed(tgt), tgt_mask=future, src_key_padding_mask=src == PAD,
                    tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=src == PAD)  # fmt: skip
        return self.out(h)  # logits (B, T, V)


def load():
    model = Model()  # trained by examples/train_my_adapter.py to reverse its input
    model.load_state_dict(load_file(Path(__file__).with_name("my_adapter.safetensors")))
    return model


def encode(text):
    return [VOCAB.index(c) for c in text.lower()] + [EOS]  # an unknown character raises: attnscope says so


def forward(model, src, tgt):
    return model(src, tgt)
