"""Watch your own model learn: a hand-written encoder-decoder trained to reverse digit strings, with
attnscope.watch in the plain training loop (three lines: make the watcher, call step, close).

    .venv/bin/python examples/watch_training.py [--steps 400] [--run-dir runs/reverse-digits]

Then open the run (it can be open while training goes on: new steps appear on their own):

    attnscope view runs/reverse-digits

The model is written the way tutorials write it (the Annotated Transformer's layout): heads split with
view + transpose, masks with True = may attend, masked_fill(-1e9), dropout. The probe is 8 fixed
inputs; every 50 steps the run folder gets their attention, the loss, the accuracy and the mask
audit's verdicts.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import torch
import torch.nn.functional as F
from torch import nn

import attnscope

PAD, BOS, EOS = 0, 1, 2
VOCAB = ["<pad>", "<bos>", "<eos>", *"0123456789"]
D_MODEL, HEADS, LAYERS, D_FF, DROPOUT = 64, 4, 2, 128, 0.1
MAX_LEN = 16


class MultiHeadAttention(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.h, self.dk = h, d // h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x, mem, mask):  # mask: (B, 1 or Tq, Tk) bool, True = may attend
        b = x.size(0)
        q = self.q(x).view(b, -1, self.h, self.dk).transpose(1, 2)
        k = self.k(mem).view(b, -1, self.h, self.dk).transpose(1, 2)
        v = self.v(mem).view(b, -1, self.h, self.dk).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dk)
        scores = scores.masked_fill(~mask.unsqueeze(1), -1e9)
        attn = self.drop(F.softmax(scores, dim=-1))
        return self.o((attn @ v).transpose(1, 2).reshape(b, -1, self.h * self.dk))


class Block(nn.Module):
    def __init__(self, cross: bool):
        super().__init__()
        self.self_attn = MultiHeadAttention(D_MODEL, HEADS)
        self.cross_attn = MultiHeadAttention(D_MODEL, HEADS) if cross else None
        self.ff = nn.Sequential(nn.Linear(D_MODEL, D_FF), nn.ReLU(), nn.Linear(D_FF, D_MODEL))
        self.norms = nn.ModuleList(nn.LayerNorm(D_MODEL) for _ in range(3 if cross else 2))
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x, mask, mem=None, mem_mask=None):
        h = self.norms[0](x)
        x = x + self.drop(self.self_attn(h, h, mask))
        if self.cross_attn is not None:
            x = x + self.drop(self.cross_attn(self.norms[1](x), mem, mem_mask))
        return x + self.drop(self.ff(self.norms[-1](x)))


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(len(VOCAB), D_MODEL)
        self.pos = nn.Embedding(MAX_LEN, D_MODEL)
        self.enc = nn.ModuleList(Block(cross=False) for _ in range(LAYERS))
        self.dec = nn.ModuleList(Block(cross=True) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D_MODEL)
        self.out = nn.Linear(D_MODEL, len(VOCAB))

    def embed(self, ids):
        return self.emb(ids) * math.sqrt(D_MODEL) + self.pos(torch.arange(ids.size(1), device=ids.device))

    def forward(self, src, tgt):
        src_mask = (src != PAD).unsqueeze(1)  # (B, 1, S)
        causal = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=tgt.device).tril()
        tgt_mask = (tgt != PAD).unsqueeze(1) & causal  # (B, T, T)
        mem = self.embed(src)
        for block in self.enc:
            mem = block(mem, src_mask)
        x = self.embed(tgt)
        for block in self.dec:
            x = block(x, tgt_mask, mem, src_mask)
        return self.out(self.norm(x))  # logits (B, T, V)


def encode(digits: str) -> list[int]:
    return [VOCAB.index(c) for c in digits] + [EOS]


def make_batch(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source = digits + EOS; decoder input = BOS + reversed digits; labels = reversed digits + EOS."""
    src = [encode(t) for t in texts]
    out = [encode(t[::-1]) for t in texts]

    def pad(rows):
        width = max(map(len, rows))
        return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])

    return pad(src), pad([[BOS] + r[:-1] for r in out]), pad(out)


def sample(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 10)))


PROBE = ["31415", "2718281", "1234567890", "9876", "555", "10203", "867530", "4242424"]


def train(
    steps: int, run_dir: str | None, every: int = 50, batch: int = 32, seed: int = 0, audit: bool = True
):
    """Train for ``steps`` steps, watching the probe every ``every`` steps when ``run_dir`` is given.
    Returns (model, seconds spent training)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = Seq2Seq()
    opt = torch.optim.Adam(model.parameters(), 3e-4 * 3)
    w = None
    if run_dir is not None:
        src, tgt, _ = make_batch(PROBE)
        w = attnscope.watch(model, probe=(src, tgt), every=every, run_dir=run_dir, vocab=VOCAB,
                            arch="encoder-decoder", pad=PAD, bos=BOS,
                            audit_every=every if audit else None)  # fmt: skip
    model.train()
    start = time.perf_counter()
    for step in range(steps + 1):
        src, tgt, labels = make_batch([sample(rng) for _ in range(batch)])
        logits = model(src, tgt)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        real = labels != PAD  # the loop's own metric (computed with or without watching)
        acc = ((logits.argmax(-1) == labels) & real).sum() / real.sum()
        if w is not None:
            w.step(step, loss=loss, token_accuracy=acc)
    seconds = time.perf_counter() - start
    if w is not None:
        w.close()
    return model, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--run-dir", default="runs/reverse-digits")
    args = ap.parse_args()
    _, seconds = train(args.steps, args.run_dir, args.every)
    print(f"trained {args.steps} steps in {seconds:.1f} s, watching every {args.every}")
    print(f"open the run:  attnscope view {args.run_dir}")


if __name__ == "__main__":
    main()
