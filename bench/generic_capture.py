"""Capture from any model (attnscope.core.families.capture): forward time with capture_attention / without, side by side.

    python -m bench.generic_capture [--lengths 32 128 512] [--repeats 7] [--d-model 256] [--layers 4] [--threads N]
        [--device cpu|cuda]

Three hand-written styles a user might bring, each 8 heads: a softmax with masked_fill(-1e9) on 4-D
scores (the Annotated Transformer's way), F.scaled_dot_product_attention with is_causal=True (nanoGPT),
and nn.TransformerEncoder. The modes alternate so all see the same machine load; the script prints
the median of each and their ratios. The capture runs the model's own forward once: what it adds is the
TorchFunctionMode's per-op bookkeeping (lineage codes included) plus, for SDPA and MultiheadAttention,
recomputing the weights; torch.nn's own encoder layers and MultiheadAttention run with the mode set aside
(their fused fast path where torch takes it, as uncaptured) and their weights are computed from their
arguments. Where the model never writes its maps (SDPA's fused kernel, the encoder's
fast path), computing them is the floor: ``eager ms`` is the same model with an eager attention that
writes them (softmax over q @ k.T with the same masks), and ``vs eager`` the capture's ratio to it.
``floor ms`` is the forward that writes its maps (the eager one for SDPA and the encoder) run under a
TorchFunctionMode that does nothing but call each op: what any capture that sees every op costs before
it does any bookkeeping (under a mode, ``nn.TransformerEncoder`` leaves its fused fast path for its
Python one; capture sets its own mode aside there). ``vs floor`` is the capture's ratio to it: the bookkeeping's own share. ``least ms`` is
the model's own forward under a mode that calls each op and, where the model never writes its weights
(SDPA, MultiheadAttention), computes them once more, as any capture of such a call must; ``least x`` is
its ratio to ``eager ms`` (to ``plain ms`` for the style that writes its maps): the ratio no capture
built on a TorchFunctionMode can go below, before any lineage, layout or record.
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
from torch.overrides import TorchFunctionMode

from attnscope.core.families.capture import capture_attention

VOCAB, PAD = 1000, 0


class PassThrough(TorchFunctionMode):
    """A mode that sees every op and does nothing else: the floor of any capture built on one."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _weights(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) over the keys ``keep`` allows: the weights a capture of a call that never
    writes them has to compute once more."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return (scores if keep is None else scores.masked_fill(~keep, float("-inf"))).softmax(-1)


class Least(TorchFunctionMode):
    """What any capture that sees every op does at the least: call each op and, where the model never writes
    its weights (SDPA, MultiheadAttention), compute them once more. No lineage, no layout, no record; for
    MultiheadAttention q and k are projected once more (capture reuses the ones the call makes where it can)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            q, k = args[0], args[1]
            keep = kwargs.get("attn_mask")
            if kwargs.get("is_causal"):
                keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            _weights(q, k, keep)
        elif func is F.multi_head_attention_forward:
            query, key, h, w, b = args[0], args[1], args[4], args[5], args[6]
            (lq, bs, e), lk = query.shape, key.shape[0]
            q = F.linear(query, w[:e], b[:e]).view(lq, bs * h, e // h).transpose(0, 1)
            k = F.linear(key, w[e : 2 * e], b[e : 2 * e]).view(lk, bs * h, e // h).transpose(0, 1)
            pad = kwargs.get("key_padding_mask")
            keep = None
            if pad is not None:  # True (or -inf) where a key is padding
                keep = (~pad if pad.dtype == torch.bool else pad == 0).view(bs, 1, 1, lk)
                keep = keep.expand(bs, h, 1, lk).reshape(bs * h, 1, lk)
            _weights(q, k, keep)
        return out


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


class EagerEncoderLayer(nn.Module):
    """nn.TransformerEncoderLayer's math (post-norm, ReLU) with an attention that writes its maps."""

    def __init__(self, layer: nn.TransformerEncoderLayer):
        super().__init__()
        self.layer, self.h = layer, layer.self_attn.num_heads

    def forward(self, x, keep):
        a, (b, n, d) = self.layer.self_attn, x.shape
        q, k, v = (t.view(b, n, self.h, d // self.h).transpose(1, 2)
                   for t in F.linear(x, a.in_proj_weight, a.in_proj_bias).chunk(3, dim=-1))  # fmt: skip
        w = (q @ k.transpose(-2, -1) / math.sqrt(d // self.h)).masked_fill(~keep, float("-inf")).softmax(-1)
        y = a.out_proj((w @ v).transpose(1, 2).reshape(b, n, d))
        x = self.layer.norm1(x + y)
        return self.layer.norm2(x + self.layer.linear2(F.relu(self.layer.linear1(x))))


class Stack(nn.Module):
    def __init__(self, d: int, layers: int, style: str):
        super().__init__()
        self.style = style
        self.eager = False  # SDPA and the encoder: run the same weights with an attention that writes maps
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
        if self.style == "nn.TransformerEncoder" and self.eager:
            keep = (ids != PAD)[:, None, None, :]
            for layer in self.enc.layers:
                x = EagerEncoderLayer(layer)(x, keep)
        elif self.style == "nn.TransformerEncoder":
            x = self.enc(x, src_key_padding_mask=ids == PAD)
        elif self.style == "sdpa" and self.eager:
            n = ids.shape[1]
            causal = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
            for attn, ff in zip(self.attn, self.ff, strict=True):
                b, _, d = x.shape
                q, k, v = (t.view(b, n, 8, d // 8).transpose(1, 2) for t in attn.qkv(x).split(d, dim=2))
                w = (
                    (q @ k.transpose(-2, -1) / math.sqrt(d // 8))
                    .masked_fill(~causal, float("-inf"))
                    .softmax(-1)
                )
                x = x + attn.o((w @ v).transpose(1, 2).reshape(b, n, d))
                x = x + ff(x)
        else:
            mask = (ids != PAD)[:, None, None, :]
            for attn, ff in zip(self.attn, self.ff, strict=True):
                x = x + attn(x, mask)
                x = x + ff(x)
        return self.out(x).softmax(-1)  # a vocabulary softmax the capture must skip


def _lap(start: float, sync) -> float:
    sync()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (each timing ends with a synchronize)")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {args.device}, d_model {args.d_model}, {args.layers} layers x 8 heads, batch 2")  # fmt: skip
    print(f"{'style':<22} {'tokens':>6} {'plain ms':>9} {'capture ms':>11} {'ratio':>6} {'eager ms':>9} "
          f"{'vs eager':>8} {'floor ms':>8} {'vs floor':>8} {'least ms':>8} {'least x':>8} {'maps':>5}")  # fmt: skip
    for style in ("softmax + masked_fill", "sdpa", "nn.TransformerEncoder"):
        model = Stack(args.d_model, args.layers, style).eval().to(dev)
        for n in args.lengths:
            ids = torch.randint(1, VOCAB, (2, n))
            ids = ids.to(dev)
            ids[1, n // 2 :] = PAD
            plain, captured, eager, floor, least, n_maps = [], [], [], [], [], 0
            writes = style == "softmax + masked_fill"  # the model writes its maps itself
            with torch.no_grad():
                model(ids)  # warm-up
                sync()
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    model(ids)
                    plain.append(_lap(start, sync))
                    start = time.perf_counter()
                    with capture_attention(model) as cap:
                        model(ids)
                    captured.append(_lap(start, sync))
                    n_maps = len(cap.records)
                    model.eager = not writes
                    if not writes:
                        start = time.perf_counter()
                        model(ids)
                        eager.append(_lap(start, sync))
                    start = time.perf_counter()
                    with PassThrough():
                        model(ids)
                    floor.append(_lap(start, sync))
                    model.eager = False
                    start = time.perf_counter()
                    with Least():
                        model(ids)
                    least.append(_lap(start, sync))
            a, b = statistics.median(plain) * 1000, statistics.median(captured) * 1000
            e = statistics.median(eager) * 1000 if eager else a
            f = statistics.median(floor) * 1000
            le = statistics.median(least) * 1000
            print(f"{style:<22} {n:>6} {a:>9.1f} {b:>11.1f} {b / a:>6.2f} {e:>9.1f} {b / e:>8.2f} {f:>8.1f} "
                  f"{b / f:>8.2f} {le:>8.1f} {le / e:>8.2f} {n_maps:>5}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
