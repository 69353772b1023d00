"""Torch intra-op threads when several sessions run models at once (the server side of bench/load.py).

    python -m bench.torch_threads [--users 1 4 10] [--threads 1 2] [--lengths 128 512] [--seconds 10]

In one process, as the Streamlit server does, U Python threads (one per user) each run MiniLM's
traced forward pass (LoadedModel.trace: capture and packaging included) back to back for
--seconds; torch's intra-op thread count is set per run. Prints p50/p95 latency and throughput
per setting, the settings alternating so each sees the same machine load. No browser involved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from bench import harness


def run(lm, texts: list[str], users: int, seconds: float) -> tuple[list[float], float]:
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def user(i: int) -> None:
        k = i
        while time.monotonic() < stop:
            t = time.perf_counter()
            lm.trace([texts[k % len(texts)]], truncate=True)
            dt = time.perf_counter() - t
            with lock:
                lat.append(dt)
            k += users

    threads = [threading.Thread(target=user, args=(i,)) for i in range(users)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, nargs="+", default=[1, 4, 10])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    import torch

    from attnscope.models import registry

    lm = registry.load("minilm")
    print(
        f"# MiniLM traces from U concurrent users in one process; {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'tokens':>6}{'users':>6}{'threads':>8}{'p50 ms':>9}{'p95 ms':>9}{'traces/s':>10}")
    for n in args.lengths:
        texts = [harness.word_text(lm.src_tok, n, seed=s) for s in range(20)]
        for users in args.users:
            for threads in args.threads:
                torch.set_num_threads(threads)
                lat, wall = run(lm, texts, users, args.seconds)
                lat.sort()
                p95 = lat[min(len(lat) - 1, round(0.95 * len(lat)) - 1)]
                print(
                    f"{n:>6}{users:>6}{threads:>8}{statistics.median(lat) * 1000:>9.0f}{p95 * 1000:>9.0f}"
                    f"{len(lat) / wall:>10.2f}",
                    flush=True,
                )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
