"""Cost of a trace-cache hit (every rerun of a page: each widget click): st.cache_data vs the shared store.

    python -m bench.cache_hit [--lengths 32 128 512] [--repeats 7]

st.cache_data keeps a pickle and unpickles a copy on every hit; dashboard/trace_cache.py (what
loaders.compute_traces uses) hands every session the same read-only AttentionTrace objects.
Both cache the same MiniLM traces; the hits are timed alternately (median of --repeats).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import time
import warnings

from bench import harness


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import streamlit as st

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("streamlit"):
            logging.getLogger(name).setLevel(logging.ERROR)
    import torch

    from attnscope.dashboard import trace_cache
    from attnscope.models import registry

    torch.set_num_threads(1)
    lm = registry.load("minilm")

    @st.cache_data(max_entries=32, max_size="1GiB", show_spinner=False)
    def by_cache_data(text: str):
        return lm.trace([text], truncate=True)

    @trace_cache.shared_cache(1024, 32, 3600, "")
    def by_shared(text: str):
        return lm.trace([text], truncate=True)

    print(f"# trace cache hit, MiniLM, median of {args.repeats}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'tokens':>6} {'trace MB':>9} {'cache_data hit ms':>18} {'shared hit ms':>14} {'ratio':>8}")
    for n in args.lengths:
        text = harness.word_text(lm.src_tok, n, seed=n)
        first = by_cache_data(text)  # the misses: compute and store
        by_shared(text)
        size = trace_cache.nbytes(first) / 2**20
        a, b = [], []
        for _ in range(args.repeats):
            gc.collect()
            t = time.perf_counter()
            got = by_cache_data(text)
            a.append(time.perf_counter() - t)
            del got
            gc.collect()
            t = time.perf_counter()
            got = by_shared(text)
            b.append(time.perf_counter() - t)
            del got
        ma, mb = statistics.median(a) * 1000, statistics.median(b) * 1000
        print(f"{n:>6} {size:>9.1f} {ma:>18.2f} {mb:>14.3f} {ma / max(mb, 1e-6):>7.0f}x")


if __name__ == "__main__":
    main()
