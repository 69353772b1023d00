"""What attnscope.watch costs a training run: wall time with and without watching, side by side.

    python -m bench.watch_cost [--steps 1000] [--every 100] [--repeats 3]

Trains the model of examples/watch_training.py (a hand-written 2+2-layer, 4-head encoder-decoder,
batch 32) for ``--steps`` steps, plain and watched (a probe of 8 inputs every ``--every`` steps; and
again with the mask audit at every watched step), the modes alternating so all see the same machine
load. Prints the median wall time of each, the ratio to plain, the time spent inside ``Watcher.step``
(probe, capture, writing; timed around each call in the same run) as a share of the plain run, and the
run folder's size against its budget. The issue's target: watching adds at most 3% to the wall time.
On a shared 2-core machine the wall-time ratio moves by several percent from run to run, more than
watching costs; the time inside ``step`` is what watching itself adds, measured directly.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from attnscope.core.runs import watch as watch_mod
from attnscope.core.runs.runfile import Run

ROOT = Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location("watch_training", ROOT / "examples" / "watch_training.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ex = _example()
    times: dict[str, list[float]] = {"plain": [], "watch": [], "watch + audit": []}
    inside: dict[str, list[float]] = {mode: [] for mode in times}  # seconds inside Watcher.step per run
    spent = [0.0]
    original = watch_mod.Watcher.step

    def timed_step(self, *a, **k):
        start = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            spent[0] += time.perf_counter() - start

    watch_mod.Watcher.step = timed_step  # type: ignore[method-assign]
    sizes: dict[str, int] = {}
    budget = 0
    tmp = Path(tempfile.mkdtemp(prefix="watch-cost-"))
    try:
        for r in range(args.repeats):
            for mode in times:
                run_dir = None if mode == "plain" else tmp / f"{mode.replace(' + ', '-')}-{r}"
                spent[0] = 0.0
                _, seconds = ex.train(args.steps, None if run_dir is None else str(run_dir), args.every,
                                      audit=mode == "watch + audit")  # fmt: skip
                times[mode].append(seconds)
                inside[mode].append(spent[0])
                if run_dir is not None:
                    sizes[mode] = _size(run_dir)
                    budget = Run.open(run_dir).header["budget_bytes"]
                    n_steps = len(Run.open(run_dir).steps())
                    shutil.rmtree(run_dir)
    finally:
        watch_mod.Watcher.step = original  # type: ignore[method-assign]
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.steps} steps of batch 32, probe of 8 inputs every {args.every} steps ({n_steps} watched), "
          f"median of {args.repeats}")  # fmt: skip
    base = statistics.median(times["plain"])
    print(f"{'mode':<15} {'wall s':>8} {'ratio':>7} {'in step s':>10} {'of plain':>9} {'run folder':>12}")
    for mode, ts in times.items():
        med = statistics.median(ts)
        size = f"{sizes[mode] / 2**20:.1f} MB" if mode in sizes else ""
        ins = statistics.median(inside[mode])
        share = f"{ins / base:9.2%}" if mode != "plain" else ""
        print(f"{mode:<15} {med:8.2f} {med / base:7.3f} {ins:10.2f} {share:>9} {size:>12}")
    print(f"budget: {budget / 2**20:,.0f} MB per run folder")


if __name__ == "__main__":
    main()
