"""Corpus statistics (``core stats``): throughput on 1 vs 2 processes, and peak memory against corpus size.

    python -m bench.corpus_stats [--model minilm] [--lines 1000 10000] [--batch 32]

Writes synthetic sentences (6-30 words from a fixed word list, seeded), then runs, for each corpus
size, ``python -m attnscope stats`` (one process) and ``torchrun --standalone --nproc_per_node=2 -m core
stats`` (two processes, gloo), each process with one torch thread. Prints inputs per second of each,
their ratio, and the peak resident memory of the whole process tree (sampled every 0.1 s with psutil),
which must not grow with the number of lines: no trace is kept, only running sums and a top-k.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

WORDS = (
    "the a of to and in is was for on that with as by it at from his an were are which this be or has had not "
    "attention head layer model token query key value mask softmax weight input output sequence position "
    "cat dog sat mat ran over lazy quick brown fox jumps time year people way day man thing woman life child "
    "world school state family student group country problem hand part place case week company system , . ; ! ?"
).split()


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(6, 30))) for _ in range(n)]


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """(wall seconds, peak RSS of the process tree in bytes)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(ps))
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed:\n{err.decode()[-2000:]}")
    return time.perf_counter() - start, peak


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="minilm")
    p.add_argument("--lines", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print(
        f"# core stats on {args.model}: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    print(f"{'lines':>7} {'procs':>5} {'seconds':>8} {'inputs/s':>9} {'peak RSS (MB)':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for n in args.lines:
            src = Path(tmp) / f"lines{n}.txt"
            src.write_text("\n".join(corpus(n)) + "\n", encoding="utf-8")
            for procs in (1, 2):
                out = Path(tmp) / f"s{n}_{procs}.parquet"
                stats = ["attnscope", "stats", "--model", args.model, "--input-file", str(src), "--out", str(out),
                         "--batch", str(args.batch)]  # fmt: skip
                cmd = (
                    [sys.executable, "-m", *stats]
                    if procs == 1
                    else [
                        sys.executable,
                        "-m",
                        "torch.distributed.run",
                        "--standalone",
                        "--nproc_per_node=2",
                        "-m",
                        *stats,
                    ]
                )
                secs, peak = measure(cmd, env)
                rows[n, procs] = (secs, peak)
                print(f"{n:>7} {procs:>5} {secs:>8.1f} {n / secs:>9.1f} {peak / 2**20:>14.0f}", flush=True)
        for n in args.lines:
            print(f"{n} lines: 2 processes / 1 process throughput = {rows[n, 1][0] / rows[n, 2][0]:.2f}x")
        small, big = min(args.lines), max(args.lines)
        for procs in (1, 2):
            print(
                f"peak memory, {procs} process(es): {big:,} lines / {small:,} lines = "
                f"{rows[big, procs][1] / rows[small, procs][1]:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
