"""Capture from any model (attnscope.core.families.capture): forward time with capture_attention / without, side by side.

    python -m bench.generic_capture [--lengths 32 128 512] [--repeats 7] [--d-model 256] [--layers 4]

Three hand-written styles a user might bring, each 8 heads: a softmax with masked_fill(-1e9) on 4-D
scores (the Annotated Transformer's way), F.scaled_dot_product_attention with is_causal=True (nanoGPT),
and nn.TransformerEncoder. The two modes alternate so both see the same machine load; the script prints
the median of each and their ratio. The capture runs the model's own forward once: what it adds is the
TorchFunctionMode's per-op bookkeeping plus, for SDPA and MultiheadAttention, recomputing the weights.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnscope.core.families.capture import capture_attention

VOCAB, PAD = 1000, 0


class SoftmaxAttention(nn.Module):
    def __init__(self, d: int, h: int, sdpa: bool):
        super().__init__()
        self.h, self.sdpa = h, sdpa
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, mask):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, d // self.h).transpose(1, 2) for t in self.qkv(x).split(d, dim=2))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.h)  # (B, H, n, n)
            y = scores.masked_fill(mask == 0, -1e9).softmax(dim=-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, n, d))


class Stack(nn.Module):
    def __init__(self, d: int, layers: int, style: str):
        super().__init__()
        self.style = style
        self.emb = nn.Embedding(VOCAB, d)
        if style == "nn.TransformerEncoder":
            layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        else:
            self.attn = nn.ModuleList(SoftmaxAttention(d, 8, style == "sdpa") for _ in range(layers))
            self.ff = nn.ModuleList(
                nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d)) for _ in range(layers)
            )
        self.out = nn.Linear(d, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        if self.style == "nn.TransformerEncoder":
            x = self.enc(x, src_key_padding_mask=ids == PAD)
        else:
            mask = (ids != PAD)[:, None, None, :]
            for attn, ff in zip(self.attn, self.ff, strict=True):
                x = x + attn(x, mask)
                x = x + ff(x)
        return self.out(x).softmax(-1)  # a vocabulary softmax the capture must skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, d_model {args.d_model}, {args.layers} layers x 8 heads, batch 2")  # fmt: skip
    print(f"{'style':<22} {'tokens':>6} {'plain ms':>9} {'capture ms':>11} {'ratio':>6} {'maps':>5}")
    for style in ("softmax + masked_fill", "sdpa", "nn.TransformerEncoder"):
        model = Stack(args.d_model, args.layers, style).eval()
        for n in args.lengths:
            ids = torch.randint(1, VOCAB, (2, n))
            ids[1, n // 2 :] = PAD
            plain, captured, n_maps = [], [], 0
            with torch.no_grad():
                model(ids)  # warm-up
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    model(ids)
                    plain.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    with capture_attention(model) as cap:
                        model(ids)
                    captured.append(time.perf_counter() - start)
                    n_maps = len(cap.records)
            a, b = statistics.median(plain) * 1000, statistics.median(captured) * 1000
            print(f"{style:<22} {n:>6} {a:>9.1f} {b:>11.1f} {b / a:>6.2f} {n_maps:>5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
