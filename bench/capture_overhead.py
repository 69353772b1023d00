"""Capture overhead: forward time with attention capture / without (SDPA fast path), side by side.

    python -m bench.capture_overhead [--device cpu|cuda] [--repeats 7] [--lengths 32 128 512] [--against REV]

Runs the zoo's default model and the paper's `base` config at each length (a zoo model whose
max_len is shorter runs at its max_len), alternating the two modes so both see the same machine
load, and prints the median of each and their ratio.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

from attnscope.core.transformer import attention as core_attention
from attnscope.core.transformer.config import base
from attnscope.core.transformer.model import Transformer


def _time(fn, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def sdp_at(rev: str):
    """attnscope.core.transformer.attention.scaled_dot_product as it was at git revision ``rev``."""
    src = subprocess.run(
        ["git", "show", f"{rev}:core/transformer/attention.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout
    module = types.ModuleType(f"core_attention_at_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(src, f"{rev}:core/transformer/attention.py", "exec"), module.__dict__)
    return module.scaled_dot_product


def measure_against(
    model: Transformer, length: int, device: str, repeats: int, old_sdp
) -> tuple[float, float, float]:
    """Median seconds of (no capture, capture with ``old_sdp``, capture now), interleaved."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    vocab = min(cfg.src_vocab_size, cfg.tgt_vocab_size)
    src = torch.randint(4, vocab, (1, length), generator=g).to(device)
    tgt = None if cfg.is_encoder_only else torch.randint(4, vocab, (1, length), generator=g).to(device)
    if tgt is not None:
        tgt[:, 0] = cfg.bos_id
    now_sdp = core_attention.scaled_dot_product
    runs = {"plain": [], "old": [], "now": []}

    def run(which):
        core_attention.scaled_dot_product = old_sdp if which == "old" else now_sdp
        try:
            runs[which].append(_time(lambda: model(src, tgt, return_attn=which != "plain"), device))
        finally:
            core_attention.scaled_dot_product = now_sdp

    with torch.no_grad():
        for _ in range(2):
            for which in runs:
                run(which)
        for which in runs:
            runs[which].clear()
        for _ in range(repeats):
            for which in runs:
                run(which)
    return tuple(statistics.median(runs[w]) for w in ("plain", "old", "now"))


def measure(
    model: Transformer, length: int, device: str, repeats: int, batch: int = 1
) -> tuple[float, float]:
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    vocab = min(cfg.src_vocab_size, cfg.tgt_vocab_size)
    src = torch.randint(4, vocab, (batch, length), generator=g).to(device)
    tgt = torch.randint(4, vocab, (batch, length), generator=g).to(device)
    tgt[:, 0] = cfg.bos_id
    if cfg.is_encoder_only:
        tgt = None

    def plain():
        model(src, tgt)

    def capture():
        model(src, tgt, return_attn=True)

    with torch.no_grad():
        for _ in range(2):  # warm-up both paths
            plain()
            capture()
        fast, slow = [], []
        for _ in range(repeats):
            fast.append(_time(plain, device))
            slow.append(_time(capture, device))
    return statistics.median(fast), statistics.median(slow)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument(
        "--against",
        metavar="REV",
        help="also time the capture path of core/transformer/attention.py at this "
        "git revision, interleaved (before/after of a change to the explicit path)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models: list[tuple[str, Transformer]] = []
    try:
        from attnscope.models import registry

        lm = registry.load(registry.DEFAULT_MODEL, device=args.device)
        models.append((f"zoo:{lm.name}", lm.model))
    except Exception as exc:  # the zoo may be missing on a fresh checkout
        print(f"(zoo default model unavailable: {exc})")
    torch.manual_seed(0)
    models.append(("base", Transformer(base().replace(max_len=1024)).to(args.device).eval()))
    print(
        f"# capture overhead on {args.device} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__})"
    )
    old_sdp = sdp_at(args.against) if args.against else None
    if old_sdp is not None:
        print(
            f"{'model':<14}{'tokens':>7}{'no capture ms':>15}{'capture@' + args.against[:7] + ' ms':>20}"
            f"{'ratio':>8}{'capture now ms':>16}{'ratio':>8}"
        )
        for name, model in models:
            for length in sorted({min(n, model.cfg.max_len) for n in args.lengths}):
                plain, old, now = measure_against(model, length, args.device, args.repeats, old_sdp)
                print(
                    f"{name:<14}{length:>7}{plain * 1000:>15.2f}{old * 1000:>20.2f}{old / plain:>7.2f}x"
                    f"{now * 1000:>16.2f}{now / plain:>7.2f}x"
                )
        return
    print(f"{'model':<14}{'tokens':>7}{'no capture ms':>15}{'capture ms':>12}{'ratio':>8}")
    for name, model in models:
        done = set()
        for length in args.lengths:
            note = ""
            if length > model.cfg.max_len:  # a zoo model takes short inputs only: measure its longest
                length, note = model.cfg.max_len, f"  (its max_len; {length} asked)"
            if length in done:
                continue
            done.add(length)
            fast, slow = measure(model, length, args.device, args.repeats)
            print(f"{name:<14}{length:>7}{fast * 1000:>15.2f}{slow * 1000:>12.2f}{slow / fast:>7.2f}x{note}")


if __name__ == "__main__":
    main()
