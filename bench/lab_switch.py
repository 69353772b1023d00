"""The Mask lab's usual next step, timed in a real browser: another bug on an input already audited.

    python -m bench.lab_switch [--tokens 512] [--repeats 3] [--app OLD/dashboard/app.py dashboard/app.py]

One headless chromium, MiniLM, the Mask lab page of each checkout's server (side by side; who goes
first alternates, and the machine is let go quiet before each measurement, as in bench.page_times).
Per repeat: Enter on a new text of exactly N WordPiece tokens (both audits run), then two bug switches
in the lab's picker, each timed from the click to the page's rerun over and quiet (bench.page_times'
criterion). The first switch audits a bug not seen on this input; the second goes back to the bug the
page opened with, which that input already has: a cache hit, i.e. the cost of redrawing the charts.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
from pathlib import Path

from bench import harness
from bench import page_times as PT

SWITCHES = (
    "query axis",
    "broadcast the wrong way",
)  # bug titles (attnscope.dashboard.words.BUG_HELP), as typed


def _pick_bug(tab, title: str, timeout_ms: int) -> float:
    harness.wait_quiet()  # as PT.measure: nothing left running from the previous measurement
    tab.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').first.click()
    option = tab.get_by_role("option").filter(has_text=re.compile(re.escape(title), re.I)).first
    tab.evaluate("() => { window.__t0 = performance.now(); window.__since = null; }")
    option.click()
    with contextlib.suppress(Exception):  # a rerun faster than one frame: nothing to wait for
        tab.wait_for_function(PT.STARTED_JS, timeout=5_000, polling="raf")
    return float(tab.wait_for_function(PT.DONE_JS, timeout=timeout_ms, polling="raf").json_value()) / 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--app", nargs="+", default=[str(harness.APP)])
    p.add_argument("--label", nargs="+", default=None)
    args = p.parse_args(argv)
    labels = args.label or [Path(a).resolve().parents[1].name for a in args.app]
    from playwright.sync_api import sync_playwright

    from attnscope.models import registry

    tok = registry.load("minilm").src_tok
    words = harness.one_piece_words(tok)
    new_bug: dict[str, list[float]] = {label: [] for label in labels}
    cached: dict[str, list[float]] = {label: [] for label in labels}
    with sync_playwright() as pw, contextlib.ExitStack() as stack:
        browser = harness.launch_chromium(pw)
        servers = [
            stack.enter_context(harness.app_server(app=Path(a), env={"OMP_NUM_THREADS": "1"}))
            for a in args.app
        ]
        tabs = []
        for url, _ in servers:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            PT.open_page(tab, url, "mask-lab")
            _pick_bug(tab, SWITCHES[1], 180_000)  # the bug each input is first audited with
            tabs.append(tab)
        for rep in range(args.repeats):
            text = harness.word_text(tok, args.tokens, 100 + rep, words)
            for label, (url, _), tab in PT.alternating(list(zip(labels, servers, tabs, strict=True)), rep):
                PT.measure(tab, url, "mask-lab", text, 180_000)
                new_bug[label].append(_pick_bug(tab, SWITCHES[0], 180_000))
                cached[label].append(_pick_bug(tab, SWITCHES[1], 180_000))
        browser.close()
    print(f"# Mask lab, MiniLM, {args.tokens} tokens, another bug on an input already audited")
    for label in labels:
        print(f"{label:>12}: new bug {statistics.median(new_bug[label]):.2f} s "
              f"{[round(x, 2) for x in new_bug[label]]}; back to a bug already audited (charts only) "
              f"{statistics.median(cached[label]):.2f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
