"""The Mask lab's model work for one new input, in CPU seconds and tokens run, checkouts side by side.

    python -m bench.lab_work [--tokens 512] [--repeats 3] [--bug inverted]
                             [--checkout /tmp/before . --label before after]

What the lab's server computes when a new text is entered (MiniLM, the text of exactly N WordPiece
tokens plus its shorter copy, as the page's "Add a shorter copy" default): the correct and the buggy
traced pass, then both audits (static checks and leak tests) on those traces, one after the other on
one thread. Each checkout runs in a process of its own (its own ``core``), on the same texts; the
processes take turns per repeat. Reported per step: the median CPU seconds of the process
(``time.process_time``: less sensitive to a shared machine than wall time) and the tokens the model
ran (batch rows × length, counted by a forward pre-hook on the model), plus after / before ratios.
Wall time in a browser is ``bench.page_times``; this isolates the model work from chromium's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

STEPS = ("trace correct", "trace with bug", "audit correct", "audit with bug")

# Runs inside each checkout (cwd = the checkout, its folder first on sys.path): one JSON line per repeat.
CHILD = r"""
import inspect, json, sys, time, torch
torch.set_num_threads(1)
from bench import harness
from attnscope.core.analysis import audit
from attnscope.core.analysis import bugs
from attnscope.dashboard import runs
from attnscope.models import registry
tokens, repeats, seed, bug = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
lm = registry.load("minilm")
ran = [0]
lm.model.register_forward_pre_hook(lambda m, a: ran.__setitem__(0, ran[0] + a[0].numel()))
def step(f):
    ran[0] = 0
    t0 = time.process_time()
    out = f()
    return out, time.process_time() - t0, ran[0]
lm.trace([harness.word_text(lm.src_tok, 16, 0)])  # warm up
# As the lab runs them (two audits at once, no second thread inside each); older checkouts lack the flag.
one_thread = {"concurrent": False} if "concurrent" in inspect.signature(audit.run_audit).parameters else {}
for r in range(repeats):
    text = harness.word_text(lm.src_tok, tokens, seed + r)
    srcs = list(runs.lab_batch(lm, (text,), None, True)[0])
    ok, c1, n1 = step(lambda: lm.trace(srcs))
    bad, c2, n2 = step(lambda: bugs.trace_with_bug(lm, srcs, bug))
    ra, c3, n3 = step(lambda: audit.run_audit(lm, srcs, traces=ok, **one_thread))
    rb, c4, n4 = step(lambda: audit.run_audit(lm, srcs, bug=bug, traces=bad, **one_thread))
    verdicts = [(v.name, v.status) for v in ra.verdicts + rb.verdicts]
    print(json.dumps({"cpu": [c1, c2, c3, c4], "tokens": [n1, n2, n3, n4], "verdicts": verdicts}), flush=True)
"""


def _start(checkout: Path, args, seed: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", CHILD, str(args.tokens), "1", str(seed), args.bug]
    return subprocess.Popen(
        cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bug", default="inverted")
    p.add_argument("--checkout", nargs="+", default=["."])
    p.add_argument("--label", nargs="+", default=None)
    args = p.parse_args(argv)
    checkouts = [Path(c).resolve() for c in args.checkout]
    labels = args.label or [c.name for c in checkouts]
    rows: dict[str, list[dict]] = {label: [] for label in labels}
    print(f"# the Mask lab's model work, MiniLM, {args.tokens} tokens + its shorter copy, bug {args.bug}")
    for r in range(args.repeats):
        order = list(zip(labels, checkouts, strict=True))
        for label, checkout in order if r % 2 == 0 else order[::-1]:  # who goes first alternates
            proc = _start(checkout, args, 1000 + r)
            out, _ = proc.communicate(timeout=900)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(f"{label}: the run failed (exit {proc.returncode})")
                return 1
            rows[label].append(json.loads(lines[-1]))
    verdicts = {label: rs[0]["verdicts"] for label, rs in rows.items()}
    print(
        "| step | "
        + " | ".join(f"{lb} CPU s" for lb in labels)
        + " | "
        + " | ".join(f"{lb} tokens" for lb in labels)
        + " |"
    )
    print("| --- " * (1 + 2 * len(labels)) + "|")
    totals = {}
    for i, name in enumerate((*STEPS, "all")):
        cpu, tok = [], []
        for label in labels:
            per = [sum(x["cpu"]) if name == "all" else x["cpu"][i] for x in rows[label]]
            cpu.append(statistics.median(per))
            tok.append(sum(rows[label][0]["tokens"]) if name == "all" else rows[label][0]["tokens"][i])
        totals[name] = (cpu, tok)
        print(
            f"| {name} | "
            + " | ".join(f"{c:.2f}" for c in cpu)
            + " | "
            + " | ".join(f"{t:,}" for t in tok)
            + " |"
        )
    if len(labels) > 1:
        cpu, tok = totals["all"]
        print(f"{labels[-1]} / {labels[0]}: CPU {cpu[-1] / cpu[0]:.2f}x, tokens run {tok[-1] / tok[0]:.2f}x")
        same = all(verdicts[lb] == verdicts[labels[0]] for lb in labels)
        print("verdicts (name, status) of both audits equal in every checkout:", same)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
