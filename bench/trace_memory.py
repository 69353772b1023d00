"""Peak memory of one attention trace of the paper's `base` config, and what happens past the limit.

    python -m bench.trace_memory [--lengths 128 512]

Each measurement runs in a fresh subprocess: peak RSS (ru_maxrss) of building the model and
running a forward pass without capture, against the same with capture (LoadedModel.trace path:
capture + numpy packaging). The ratio is printed next to the theoretical size of the maps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, torch
from attnscope.core.transformer.config import base
from attnscope.core.transformer.model import Transformer
from attnscope.core.families.native import LoadedModel
from attnscope.core.transformer.tokenizer import CharTokenizer
length, capture = int(sys.argv[1]), sys.argv[2] == "1"
torch.manual_seed(0)
tok = CharTokenizer.fit(["abcdefghijklmnopqrstuvwxyz"])
cfg = base(vocab_size=len(tok)).replace(max_len=length + 8, dropout=0.0)
model = Transformer(cfg).eval()
lm = LoadedModel("base", None, cfg, model, tok, tok)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
text = ("abcdefghijklmnopqrstuvwxyz" * 40)[:length - 1]
with torch.no_grad():
    if capture:
        lm.trace([text], [text])
    else:
        src = torch.tensor([lm.prepare(text).ids])
        tgt = torch.tensor([[1] + lm.prepare_target(text).ids])
        model(src, tgt)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_mb": before / 1024, "after_mb": after / 1024}))
"""


def run(length: int, capture: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(length), "1" if capture else "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    args = ap.parse_args()
    from attnscope.core.families.native import MAX_TRACE_MB, trace_bytes

    print("# peak RSS of one forward pass of `base` (6+6 layers, 8 heads), batch 1, source = target length")
    print(f"{'tokens':>7}{'maps MB (theory)':>18}{'no capture MB':>15}{'capture MB':>12}{'ratio':>8}")
    for length in args.lengths:
        plain, cap = run(length, False), run(length, True)
        theory = trace_bytes(6, 6, 8, 1, length, length) / 2**20
        ratio = cap["after_mb"] / plain["after_mb"]
        print(f"{length:>7}{theory:>18.1f}{plain['after_mb']:>15.1f}{cap['after_mb']:>12.1f}{ratio:>7.2f}x")
    print(
        f"\nlimit: a trace whose maps exceed {MAX_TRACE_MB} MB (ATTNSCOPE_MAX_TRACE_MB) is refused before the "
        "forward pass with a message naming the size and the limit; batches above ATTNSCOPE_MAX_BATCH too."
    )
    n = 1
    while trace_bytes(6, 6, 8, n, 512, 512) <= MAX_TRACE_MB * 2**20:
        n += 1
    print(f"at 512 tokens that is a batch of {n - 1} sequences for `base`; a batch of {n} is refused.")


if __name__ == "__main__":
    main()
