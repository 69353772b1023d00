"""The README's picture of the dashboard: ``make screenshot`` (``python -m bench.screenshot``).

Starts the dashboard on a free localhost port (bench.harness.app_server), opens the Attention page
in headless chromium, picks ``reverse`` in the sidebar (it opens on its first input, ``attention``:
models/registry.py FIRST_INPUTS), shows its cross-attention, waits until the all-heads grid is drawn
and every spinner is gone, and writes

- ``docs/images/attention.png``: the browser window, VIEWPORT pixels times SCALE;
- ``docs/images/attention.json``: what the picture shows, read from the page's DOM (page path,
  model, input, headings, the Plotly charts' titles, the sidebar's widget labels), so that
  tests/test_screenshot.py can tell when the committed picture no longer matches the page.

``--out DIR`` writes both files elsewhere (the test uses a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from unittest import mock

from attnscope.core.traces.trace import KIND_LABELS
from attnscope.models import registry
from bench import harness

OUT = harness.ROOT / "docs" / "images"
NAME = "attention"  # attention.png and attention.json
MODEL = "reverse"
KIND = "cross"  # reverse's cross-attention is an anti-diagonal (output letter i reads input letter n-1-i)
PAGE_PATH = "/"  # the Attention page is the app's default page, served at the root
VIEWPORT = {"width": 1400, "height": 1120}  # down to the layer and head pickers under the grid
SCALE = 1  # device pixels per CSS pixel: the PNG is VIEWPORT times SCALE
WAIT_MS = 90_000
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
KEEP = {
    "ATTNSCOPE_CHROMIUM",
    "ATTNSCOPE_REQUIRE_BROWSER",
}  # every other ATTNSCOPE_* is left out: the defaults

# What the page shows, from the DOM; texts are whitespace-normalised, hidden elements left out.
STRUCTURE_JS = """() => {
    const text = e => (e.innerText || e.textContent || '').replace(/\\s+/g, ' ').trim();
    const shown = e => !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length);
    const main = document.querySelector('[data-testid="stMain"]') || document.body;
    const side = document.querySelector('[data-testid="stSidebar"]');
    return {
        headings: [...main.querySelectorAll('h1, h2, h3')].filter(shown).map(text).filter(Boolean),
        charts: [...main.querySelectorAll('.js-plotly-plot')].filter(shown)
            .map(g => text(g.querySelector('.gtitle') || g)),
        sidebar_widgets: side ? [...side.querySelectorAll('[data-testid="stWidgetLabel"]')]
            .filter(shown).map(text).filter(Boolean) : [],
        nav: side ? [...side.querySelectorAll('[data-testid="stSidebarNav"] a')]
            .map(a => (a.querySelector('span[label]') || {}).getAttribute?.('label') || text(a)) : [],
        model: ((side && side.querySelector('input[aria-label="Model"]') || {}).value || '').split(' · ')[0],
        input: (side && side.querySelector('input[aria-label="Input text"]') || {}).value ?? null,
        page: (side && side.querySelector('[data-testid="stSidebarNav"] a[aria-current="page"]') || {}).pathname
            ?? null,
        kind: text((main.querySelector('[data-testid="stRadio"] input:checked') || {closest: () => null})
            .closest('label') || document.createElement('i')),
        spinners: document.querySelectorAll('[data-testid="stSpinner"]').length,
        exceptions: [...document.querySelectorAll('[data-testid="stException"]')].map(text),
    };
}"""

# Every Plotly chart on the page has drawn its plot area (a heatmap's image or a trace layer).
CHARTS_DRAWN_JS = """() => {
    const plots = [...document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')];
    return plots.length > 0 && plots.every(g => g.querySelector('.hm image, .trace, .cartesianlayer .plot *'))
        && !document.querySelector('[data-testid="stSpinner"]');
}"""


def _settle(page, quiet_ms: int = 600) -> None:
    """Wait until the rerun is over and nothing changed for ``quiet_ms`` (no stale element, no
    running icon, no spinner, every chart drawn)."""
    page.wait_for_function(harness.SETTLED_JS, timeout=WAIT_MS)
    page.wait_for_function(CHARTS_DRAWN_JS, timeout=WAIT_MS)
    page.wait_for_timeout(quiet_ms)
    page.wait_for_function(harness.SETTLED_JS, timeout=WAIT_MS)
    page.wait_for_function(CHARTS_DRAWN_JS, timeout=WAIT_MS)


def _wait_grid_kind(page, label: str) -> None:
    """The grid's title names ``label`` (the kind picked) and its heatmap image is drawn."""
    page.wait_for_function(
        """l => [...document.querySelectorAll('.js-plotly-plot')].some(g => {
            const t = (g.querySelector('.gtitle') || {}).textContent || '';
            return t.startsWith(l) && t.includes('click a tile') && g.querySelector('.hm image');
        })""",
        arg=label,
        timeout=WAIT_MS,
    )


def capture(page, url: str, text: str) -> dict[str, Any]:
    """Drive ``page`` to the view the picture shows; returns its structure (STRUCTURE_JS, checked)."""
    harness.open_app(page, url.rstrip("/") + PAGE_PATH, MODEL, timeout_ms=WAIT_MS)
    box = page.locator(harness.SIDEBAR_INPUT).first
    if box.input_value() != text:  # the model's first input is the picture's; typed when it is not
        harness.send_input(page, text, timeout_ms=WAIT_MS)
    page.locator(
        '[data-testid="stMain"] [data-testid="stRadio"] label', has_text=KIND_LABELS[KIND]
    ).first.click()
    _wait_grid_kind(page, KIND_LABELS[KIND])
    _settle(page)
    page.mouse.move(0, 0)  # no hover label over the grid
    seen = page.evaluate(STRUCTURE_JS)
    if seen["exceptions"] or seen["spinners"] or not seen["charts"]:
        raise RuntimeError(f"the page is not ready for its picture: {seen}")
    if seen["model"] != MODEL or seen["input"] != text:
        raise RuntimeError(
            f"the sidebar shows {seen['model']!r} on {seen['input']!r}, not {MODEL!r} on {text!r}"
        )
    return {
        "page": seen["page"],
        "model": seen["model"],
        "input": seen["input"],
        "attention_kind": seen["kind"],
        "viewport": dict(VIEWPORT),
        "scale": SCALE,
        "headings": seen["headings"],
        "charts": {"count": len(seen["charts"]), "titles": seen["charts"]},
        "sidebar_widgets": seen["sidebar_widgets"],
        "nav": seen["nav"],
    }


def _server_env() -> dict[str, str]:
    """ENV, with the ATTNSCOPE_* settings of this process taken out of os.environ (patched by the caller)."""
    for key in [k for k in os.environ if k.startswith("ATTNSCOPE_") and k not in KEEP]:
        del os.environ[key]
    return dict(ENV)


def take(out: Path = OUT, name: str = NAME, text: str | None = None) -> tuple[Path, Path]:
    """Start the app, capture the view, write ``out/name.png`` and ``out/name.json``; returns both paths."""
    problem = harness.chromium_problem()
    if problem:
        raise RuntimeError(problem)
    from playwright.sync_api import sync_playwright

    text = text if text is not None else registry.FIRST_INPUTS[MODEL]
    out.mkdir(parents=True, exist_ok=True)
    png, structure_file = out / f"{name}.png", out / f"{name}.json"
    log = out / f".{name}-server.log"
    try:
        with (
            mock.patch.dict(os.environ),  # the server gets the defaults, whatever this shell has set
            harness.app_server(harness.APP, env=_server_env(), log=log) as (url, _),
            sync_playwright() as p,
        ):
            browser = harness.launch_chromium(p)
            try:
                page = browser.new_page(viewport=VIEWPORT, device_scale_factor=SCALE)
                structure = capture(page, url, text)
                page.screenshot(path=str(png), full_page=False, animations="disabled")
            finally:
                browser.close()
    finally:
        log.unlink(missing_ok=True)
    structure_file.write_text(json.dumps(structure, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return png, structure_file


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    try:
        return str(path.resolve().relative_to(harness.ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help="folder for attention.png and attention.json")
    args = ap.parse_args(argv)
    try:
        png, structure = take(args.out)
    except RuntimeError as exc:
        print(f"screenshot: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {_shown(png)} and {_shown(structure)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
