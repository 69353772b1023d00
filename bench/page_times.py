"""Every page's time in a real browser: a new input entered -> the page done, per page and input length.

    python -m bench.page_times [--lengths 32 128 512] [--pages heads mask-audit ...] [--repeats 2]
                               [--app BEFORE/dashboard/app.py dashboard/app.py --label before after]

One headless chromium, MiniLM (6 layers x 12 heads), texts of exactly N WordPiece tokens (a new text for
every measurement, so no cache hides the work). For each page: open it with MiniLM, type the text in
the sidebar and press Enter; the time runs (in-page clock) until the app has started and finished its
rerun (Streamlit's running indicator gone, no stale element left) and no chart is still being drawn.
That is what a user waits for: the model run, every statistic and every chart of that page.

``--app`` takes several checkouts' dashboard/app.py (e.g. a "before" worktree and this one): each gets
its own server, and every (page, length) is measured on each in turn, so they see the same load. Before
each measurement the machine is let go quiet (``harness.wait_quiet``: what the previous one left running,
e.g. a server's collection after its run, would otherwise be charged to the next), and who goes first
alternates between repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
from pathlib import Path

from bench import harness

NAV = {"attention": "Attention", "decoding": "Decoding", "masks": "Masks", "mask-audit": "Mask audit",
       "mask-lab": "Mask lab", "heads": "Head analytics", "compare": "Compare", "positional": "Positional encoding",
       "bertviz": "bertviz", "model": "Model"}  # fmt: skip
PAGES = ["attention", "decoding", "masks", "mask-audit", "mask-lab", "heads", "compare", "positional", "bertviz",
         "model"]  # fmt: skip
TARGET_S = {"mask-lab": 3.0}  # the targets at 512 tokens: 2 s for every other page

# After Enter: wait until a rerun has started (running icon or stale elements), then until it is over.
STARTED_JS = """() => !!(document.querySelector('[data-stale="true"]')
    || document.querySelector('[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]'))"""
# Done: settled (no running icon, no stale element) and still settled QUIET_MS later, so a moment between
# two reruns (a widget callback, a page switch) is not taken for the end; the time is when it settled.
QUIET_MS = 400
DONE_JS = (
    "() => { const settled = (" + harness.SETTLED_JS + ")(); const now = performance.now();"
    " if (!settled) { window.__since = null; return false; }"
    " if (window.__since == null) window.__since = now;"
    f" return now - window.__since >= {QUIET_MS} ? Math.max(window.__since - window.__t0, 1) : false; }}"
)


def open_page(tab, url: str, path: str) -> None:
    """MiniLM picked in the sidebar (a link's ?model= is newer than a "before" checkout), then the page
    opened from the sidebar's navigation, as a user does; returns when its first run is over."""
    harness.open_app(tab, url, "minilm")
    if path != "attention":
        tab.locator('[data-testid="stSidebarNav"] a', has_text=NAV[path]).first.click()
        tab.wait_for_function(
            "t => [...document.querySelectorAll('h1')].some(e => e.textContent.trim() === t)",
            arg=NAV[path], timeout=90_000,
        )  # fmt: skip
    tab.wait_for_selector(harness.SIDEBAR_INPUT, timeout=90_000)
    tab.evaluate("() => { window.__t0 = performance.now(); window.__since = null; }")
    tab.wait_for_function(DONE_JS, timeout=90_000, polling="raf")


def alternating(runs: list, rep: int) -> list:
    """``runs`` (one per checkout) in order on even repeats, reversed on odd ones: who goes first alternates."""
    return runs if rep % 2 == 0 else runs[::-1]


def measure(page, url: str, path: str, text: str, timeout_ms: int) -> float:
    """Seconds from Enter on ``text`` to the page being done. First the machine is let go quiet
    (``harness.wait_quiet``): what the previous measurement left running, e.g. a server's collection
    after its run, would otherwise be charged to this one."""
    harness.wait_quiet()
    box = page.locator(harness.SIDEBAR_INPUT).first
    box.fill(text)
    page.evaluate("() => { window.__t0 = performance.now(); window.__since = null; }")
    box.press("Enter")
    try:
        page.wait_for_function(STARTED_JS, timeout=5_000, polling="raf")
    except Exception:  # a rerun faster than one frame: nothing to wait for
        pass
    ms = float(page.wait_for_function(DONE_JS, timeout=timeout_ms, polling="raf").json_value())
    errors = page.evaluate(harness.EXCEPTION_JS)
    if errors:
        raise RuntimeError(f"{path}: exception on the page: {errors[0][:300]}")
    return ms / 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--pages", nargs="+", default=PAGES, choices=PAGES)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--app", nargs="+", default=[str(harness.APP)])
    p.add_argument("--label", nargs="+", default=None)
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for one page")
    args = p.parse_args(argv)
    labels = args.label or [Path(a).resolve().parents[1].name for a in args.app]
    from playwright.sync_api import sync_playwright

    from attnscope.models import registry

    tok = registry.load("minilm").src_tok
    words = harness.one_piece_words(tok)
    print(
        f"# page times, MiniLM: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    results: dict[tuple[str, str, int], list[float]] = {}
    with sync_playwright() as pw, contextlib.ExitStack() as stack:
        browser = harness.launch_chromium(pw)
        servers = [
            stack.enter_context(harness.app_server(app=Path(a), env={"OMP_NUM_THREADS": "1"}))
            for a in args.app
        ]
        tabs = [browser.new_page(viewport={"width": 1400, "height": 1000}) for _ in servers]
        seed = 0
        for path in args.pages:
            for (url, _), tab in zip(servers, tabs, strict=True):
                open_page(tab, url, path)
            for n in args.lengths:
                for rep in range(args.repeats):
                    seed += 1
                    text = harness.word_text(tok, n, seed, words)
                    runs = list(zip(labels, servers, tabs, strict=True))
                    for label, (url, _), tab in alternating(runs, rep):
                        secs = measure(tab, url, path, text, int(args.timeout * 1000))
                        results.setdefault((label, path, n), []).append(secs)
                row = "  ".join(
                    f"{label} {statistics.median(results[label, path, n]):6.2f} s" for label in labels
                )
                print(f"{path:<12} {n:>4} tokens  {row}", flush=True)
        browser.close()
    print("\n| page | " + " | ".join(f"{n} tokens" for n in args.lengths) + " |")
    print("| --- | " + " | ".join("---" for _ in args.lengths) + " |")
    for path in args.pages:
        cells = []
        for n in args.lengths:
            cells.append(" / ".join(f"{statistics.median(results[label, path, n]):.2f}" for label in labels))
        print(f"| {path} | " + " | ".join(cells) + " |")
    print(f"(seconds, median of {args.repeats}; " + " / ".join(labels) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
