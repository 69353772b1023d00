"""Traced passes with and without attnscope.core.families.map_pool (recycled map memory), side by side in one process.

    python -m bench.map_pool [--tokens 512] [--repeats 5] [--keep-mb 1024]

MiniLM, a batch of the text of exactly N WordPiece tokens plus its shorter copy (the Mask lab's
batch): one traced pass on one thread, then the lab's pair (the correct and the buggy traced pass
at once in two threads). Each repeat runs both settings in turn, the previous traces dropped first,
as a long-lived server drops what its caches evict (the pool keeps its blocks while the other setting
runs; the first round, which creates them, is not counted). Reported: median CPU seconds of the process
per step (``time.process_time``), page faults (``ru_minflt``) and system CPU seconds per step,
and on / off ratios. The maps of both settings are checked equal, number for number.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import threading
import time

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--keep-mb", type=int, default=1024)
    p.add_argument("--bug", default="inverted")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from attnscope.core.analysis import bugs
    from attnscope.core.families import map_pool
    from attnscope.dashboard import runs
    from attnscope.models import registry
    from bench import harness

    lm = registry.load("minilm")
    srcs = list(runs.lab_batch(lm, (harness.word_text(lm.src_tok, args.tokens, 0),), None, True)[0])

    def pair():
        res = {}
        th = threading.Thread(target=lambda: res.setdefault("bad", bugs.trace_with_bug(lm, srcs, args.bug)))
        th.start()
        ok = lm.trace(srcs)
        th.join()
        return ok, res["bad"]

    steps = {"one traced pass": lambda: lm.trace(srcs), "the lab's pair, two threads": pair}
    rows: dict[tuple[str, str], list[tuple[float, int, float]]] = {}
    reference = np.array(lm.trace(srcs)[1].enc_self)
    kept = None
    pools = {
        "off": map_pool.MapPool(0),
        "on": map_pool.MapPool(args.keep_mb * 2**20),
    }  # "on" keeps its blocks
    for r in range(args.repeats + 1):  # the first round warms up (blocks created), not counted
        for setting in ("off", "on") if r % 2 == 0 else ("on", "off"):
            map_pool.POOL = pools[setting]
            for name, step in steps.items():
                kept = None  # the previous traces go, as a cache evicts them
                r0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
                kept = step()
                r1, c1 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
                traces = kept if name.startswith("one") else kept[0]
                if not np.array_equal(np.asarray(traces[1].enc_self), reference):
                    print(f"maps differ ({setting}, {name})")
                    return 1
                if r:
                    rows.setdefault((setting, name), []).append(
                        (c1 - c0, r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime)
                    )
    print(f"# traced passes, MiniLM, {args.tokens} tokens + its shorter copy, median of {args.repeats}")
    print("| step | off CPU s | on CPU s | on / off | off faults | on faults | off sys s | on sys s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in steps:
        off, on = rows["off", name], rows["on", name]
        med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
        print(
            f"| {name} | {med(off, 0):.3f} | {med(on, 0):.3f} | {med(on, 0) / med(off, 0):.2f}x | "
            f"{med(off, 1):,.0f} | {med(on, 1):,.0f} | {med(off, 2):.3f} | {med(on, 2):.3f} |"
        )
    print("maps equal with and without the pool: True")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
