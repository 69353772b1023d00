"""A GPT-2-small-sized decoder at 1,024 tokens: trace, memory, grid and one head, in Python and in chromium.

    python -m bench.big_model [--tokens 1024] [--layers 12] [--heads 12] [--d-model 768] [--no-browser]

The model is a randomly initialised ``GPT2Config`` (timings and memory do not depend on the weights)
with GPT-2's vocabulary size, saved as a Hugging Face folder (safetensors + a word-level tokenizer
built here, so nothing is downloaded) in a temporary folder and loaded the way a user's folder is.

Printed, in one run:
- Python: the trace's time and the bytes of its maps, the peak resident memory the trace added, the
  grid figure's and one head's figure build time and JSON size;
- chromium (the real app, the folder in ATTNSCOPE_MODELS): Enter on a new input -> the grid drawn
  (generation and the traced forward pass included); the grid drawn again from the cached trace (the
  log colour scale switched on: what drawing the grid costs); another head picked -> that head's exact
  heatmap drawn (default linear colours; then once more in log colours); the server's resident memory before the
  input and at its peak (sampled), so the memory the trace costs the server.
Targets (the issue): grid <= 3 s, one head <= 1 s, server memory for the trace <= 1.5 GB.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import tempfile
import time
from pathlib import Path

from bench import harness

TARGETS = {"grid_s": 3.0, "head_s": 1.0, "trace_mb": 1536.0}
VOCAB = 50257  # GPT-2's


def build_folder(folder: Path, n_layer: int, n_head: int, d_model: int, n_positions: int) -> Path:
    """A random GPT-2 with a word-level tokenizer ("w0 w1 ..." is one token a word) in ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    eos = "<|endoftext|>"
    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {eos: VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=eos))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, bos_token=eos, unk_token=eos
    ).save_pretrained(folder)
    cfg = GPT2Config(
        n_layer=n_layer, n_head=n_head, n_embd=d_model, n_positions=n_positions, vocab_size=VOCAB,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
    )  # fmt: skip
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).eval().save_pretrained(folder, safe_serialization=True)
    return folder


def prompt(n_tokens: int, seed: int) -> str:
    """``n_tokens`` tokens of this tokenizer (never the end-of-text token)."""
    import random

    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(VOCAB - 1)}" for _ in range(n_tokens))


def python_side(folder: Path, n_tokens: int) -> dict:
    """Trace time, bytes, peak memory added; grid and head figure build times and JSON sizes."""
    import plotly.io as pio

    from attnscope.dashboard.plots import attention as P
    from attnscope.dashboard.trace_cache import nbytes
    from attnscope.models import registry

    lm = registry.load(str(folder))
    n_new = max(0, min(lm.max_new_tokens, n_tokens - 1))
    lm.trace([prompt(32, 0)])  # warm-up
    sampler = harness.RssSampler(os.getpid(), interval=0.05)
    base_mb = sampler.sample()
    with sampler:
        t0 = time.perf_counter()
        tr = lm.trace_continuation([prompt(n_tokens - n_new, 1)])[0]
        trace_s = time.perf_counter() - t0
    probs = tr.probs("dec_self")
    toks = tr.axes("dec_self")
    t0 = time.perf_counter()
    grid = P.grid_figure(probs, toks[0], toks[1], title="all heads", mask=tr.mask("dec_self"))
    grid_s = time.perf_counter() - t0
    grid_mb = len(pio.to_json(grid, validate=False)) / 1e6
    t0 = time.perf_counter()
    head = P.head_heatmap(
        P.head_weights(probs, 5, 7), toks[0], toks[1], mask=tr.mask("dec_self"), title="layer 5 head 7"
    )
    head_s = time.perf_counter() - t0
    head_mb = len(pio.to_json(head, validate=False)) / 1e6
    return {
        "tokens": probs.shape[-1], "shape": tuple(probs.shape), "values": int(probs.size),
        "trace_s": trace_s, "trace_arrays_mb": nbytes(tr) / 2**20, "trace_peak_added_mb": sampler.peak_mb - base_mb,
        "grid_build_s": grid_s, "grid_json_mb": grid_mb, "head_build_s": head_s, "head_json_mb": head_mb,
    }  # fmt: skip


def _toggle_log(tab) -> float:
    """Click 'Log colour scale'; ms until the grid is drawn again, then waits for the page to settle."""
    tab.evaluate(harness.MARK_JS)
    tab.locator('[data-testid="stMain"] [data-testid="stCheckbox"]').filter(
        has_text="Log colour scale"
    ).first.click()
    ms = float(tab.wait_for_function(harness.WAIT_GRID_JS, timeout=120_000, polling="raf").json_value())
    tab.wait_for_function(harness.SETTLED_JS, timeout=120_000)
    return ms


def _pick_head(tab, head: int) -> float:
    """Pick ``head`` in the Head box; ms from the choice (Enter) until that head's heatmap is drawn."""
    boxes = tab.locator('[data-testid="stMain"] [data-testid="stSelectbox"]')
    boxes.filter(has_text=re.compile(r"^Head")).first.click()
    tab.keyboard.type(f"head {head}")  # the selectbox filters its options as one types
    tab.evaluate("() => { window.__t0 = performance.now(); }")  # the choice made: Enter
    tab.keyboard.press("Enter")
    ms = float(
        tab.wait_for_function(
            """h => {
                const gd = [...document.querySelectorAll('.js-plotly-plot')]
                    .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes(`· head ${h} ·`));
                const img = gd && gd.querySelector('.hm image');
                return img ? performance.now() - window.__t0 : false;
            }""",
            arg=head,
            timeout=120_000,
            polling="raf",
        ).json_value()
    )
    tab.wait_for_function(harness.SETTLED_JS, timeout=120_000)
    return ms


def browser_side(folder: Path, n_tokens: int) -> dict:
    """The real app: grid after Enter, one head after picking it, server memory."""
    from playwright.sync_api import sync_playwright

    from attnscope.models import registry

    lm = registry.load(str(folder))
    n_new = max(0, min(lm.max_new_tokens, n_tokens - 1))
    env = {"ATTNSCOPE_MODELS": str(folder), "OMP_NUM_THREADS": "1"}
    with sync_playwright() as pw, harness.app_server(env=env, timeout=120) as (url, proc):
        browser = harness.launch_chromium(pw)
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        harness.open_app(tab, url, folder.name)
        tab.wait_for_function(harness.SETTLED_JS, timeout=120_000)
        sampler = harness.RssSampler(proc.pid, interval=0.1)
        before_mb = sampler.sample()
        with sampler:
            grid_ms = harness.send_input(tab, prompt(n_tokens - n_new, 2), timeout_ms=300_000)
            tab.wait_for_function(harness.SETTLED_JS, timeout=300_000)
            # The grid drawn again from the cached trace (no model run): the log colour scale switched on.
            redraw_ms = _toggle_log(tab)
            # Another head, in the default (linear) colours: its exact float32 heatmap replaces the one shown.
            _toggle_log(tab)
            head_ms = _pick_head(tab, 7)
            # And one in log colours: the colour is log10(weight), the hover's exact weights a second array.
            _toggle_log(tab)
            head_log_ms = _pick_head(tab, 8)
            tab.wait_for_function(harness.SETTLED_JS, timeout=120_000)
        errors = tab.evaluate(harness.EXCEPTION_JS)
        browser.close()
    if errors:
        raise RuntimeError(f"exception on the page: {errors[0][:300]}")
    return {
        "input_s": grid_ms / 1000, "grid_s": redraw_ms / 1000, "head_s": head_ms / 1000,
        "head_log_s": head_log_ms / 1000, "server_before_mb": before_mb,
        "server_peak_mb": sampler.peak_mb, "trace_mb": sampler.peak_mb - before_mb,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--no-browser", action="store_true")
    args = p.parse_args(argv)
    print(f"# big model: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_folder(Path(tmp) / "gpt2-random", args.layers, args.heads, args.d_model, args.tokens)
        py = python_side(folder, args.tokens)
        print(f"model: {args.layers} layers x {args.heads} heads, d {args.d_model}; "
              f"trace {py['shape']} = {py['values'] / 1e6:.0f} M attention values")  # fmt: skip
        print(f"python: trace {py['trace_s']:.2f} s, maps {py['trace_arrays_mb']:.0f} MB, peak added "
              f"{py['trace_peak_added_mb']:.0f} MB; grid figure {py['grid_build_s']:.2f} s "
              f"({py['grid_json_mb']:.1f} MB JSON); one head {py['head_build_s']:.2f} s "
              f"({py['head_json_mb']:.1f} MB JSON)")  # fmt: skip
        if not args.no_browser:
            br = browser_side(folder, args.tokens)
            print(f"chromium: Enter -> grid {br['input_s']:.2f} s (the model's run included); grid drawn "
                  f"{br['grid_s']:.2f} s (target {TARGETS['grid_s']:g}), one head "
                  f"{br['head_s']:.2f} s (target {TARGETS['head_s']:g}; in log colours {br['head_log_s']:.2f} s: "
                  f"log10 colours and the exact weights, twice the data); server {br['server_before_mb']:.0f} "
                  f"-> peak {br['server_peak_mb']:.0f} MB: the trace costs {br['trace_mb']:.0f} MB "
                  f"(target {TARGETS['trace_mb']:g})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
