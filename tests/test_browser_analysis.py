"""The analysis pages in a real browser: Debian's chromium driven by Playwright (python).

Starts ``streamlit run dashboard/app.py`` (zoo plus the tiny fixture models), visits the mask
audit, mask lab, head analytics and compare pages, waits for their charts, checks that no
Streamlit exception box appears, injects a bug in the lab and waits for the FAIL, and clicks a
cell of the head-statistics heatmap to open that head. Screenshots go to artifacts/screenshots/
(10-mask-audit.png ...). Same rules as tests/test_browser.py: CI sets ATTNSCOPE_REQUIRE_BROWSER=1
(then a missing chromium or playwright fails); locally the tests skip with the reason.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from test_browser import browser, server  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboard" / "app.py"
SHOTS = ROOT / "artifacts" / "screenshots"
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
WAIT_MS = 45_000

pytestmark = pytest.mark.browser


def _new_page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.requests = []
    page.on("request", lambda r: page.requests.append(r.url))
    return page


def _wait_chart_title(page, text: str, timeout: int = WAIT_MS) -> None:
    page.wait_for_function(
        """t => [...document.querySelectorAll('.js-plotly-plot .gtitle')].some(e => e.textContent.includes(t))""",
        arg=text,
        timeout=timeout,
    )


def _wait_text(page, selector: str, pattern: str) -> None:
    page.wait_for_function(
        """([s, p]) => [...document.querySelectorAll(s)].some(e => new RegExp(p).test(e.textContent))""",
        arg=[selector, pattern],
        timeout=WAIT_MS,
    )


def _no_exception_box(page) -> None:
    boxes = page.locator('[data-testid="stException"]')
    assert boxes.count() == 0, boxes.first.inner_text()


def _open(page, url: str, option: str) -> None:
    """Open the app and pick a model in the sidebar (the option's label starts with ``option``)."""
    page.goto(url)
    page.wait_for_selector('[data-testid="stSidebar"] [data-testid="stSelectbox"]', timeout=WAIT_MS)
    page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name=re.compile(rf"^{re.escape(option)} ·")).click()
    _wait_chart_title(page, "· layer 0 · head 0")


def _goto_page(page, nav_title: str) -> None:
    page.locator('[data-testid="stSidebarNav"] a', has_text=nav_title).first.click()
    page.wait_for_function(
        """t => [...document.querySelectorAll('h1')].some(e => e.textContent.trim() === t)""",
        arg=nav_title,
        timeout=WAIT_MS,
    )


def _settle(page) -> None:
    page.wait_for_function(
        """() => !document.querySelector('[data-stale="true"]')
                 && !document.querySelector('[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]')""",
        timeout=WAIT_MS,
    )
    time.sleep(0.3)


def _screenshot(page, name: str) -> None:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to fit it."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = page.evaluate(
        """() => Math.max(...[...document.querySelectorAll('[data-testid="stMain"], [data-testid="stMainBlockContainer"]')]
                             .map(e => e.scrollHeight), 800)"""
    )
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 120, 9000)})
    time.sleep(0.5)
    page.screenshot(path=str(SHOTS / name), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 1100})


def _pick(page, label: str, option: str) -> None:
    """Choose ``option`` in the main area's selectbox labelled ``label``."""
    box = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').filter(has_text=label).first
    box.click()
    page.get_by_role("option", name=option, exact=True).click()


def _click_cell(page, title_part: str, layer: int, head: int) -> None:
    """Click the cell (layer, head) of a head-statistics heatmap (its selectable marker)."""
    point = page.evaluate(
        """([t, ly, h]) => {
            const gd = [...document.querySelectorAll('.js-plotly-plot')]
                .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes(t));
            const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
            const r = gd.getBoundingClientRect();
            return {x: r.left + xa._offset + xa.d2p('head ' + h), y: r.top + ya._offset + ya.d2p('layer ' + ly)};
        }""",
        [title_part, layer, head],
    )
    page.mouse.move(point["x"], point["y"])
    page.mouse.click(point["x"], point["y"])


def _click_cell_until(page, title_part: str, layer: int, head: int, shown: str) -> None:
    """Click the cell (layer, head) until the chart titled ``shown`` is drawn: a click that lands while the
    heatmap is being drawn again (a rerun on a busy machine) selects nothing, and clicking the same cell again
    selects the same head. Fails where four clicks never draw it."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(3):
        _click_cell(page, title_part, layer, head)
        try:
            _wait_chart_title(page, shown, WAIT_MS // 3)
            return
        except PlaywrightTimeout:
            _settle(page)
    _click_cell(page, title_part, layer, head)
    _wait_chart_title(page, shown)


def _only_local(page) -> None:
    outside = sorted(
        {u for u in page.requests
         if urlparse(u).hostname not in LOCAL_HOSTS and urlparse(u).scheme not in ("data", "blob", "about")}
    )  # fmt: skip
    assert not outside, outside


# -- tests ------------------------------------------------------------------------------------------


def test_analysis_pages_in_a_real_browser(browser, server):
    page = _new_page(browser)
    _open(page, server, "reverse")  # a trained zoo model: its heads have clear jobs

    _goto_page(page, "Mask audit")
    _wait_chart_title(page, "largest attention one real query puts on masked keys")
    _wait_text(page, '[data-testid="stAlert"]', "^All \\d+ checks pass")
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "10-mask-audit.png")

    _goto_page(page, "Mask lab")
    _wait_chart_title(page, "cell by cell against the correct one")
    _pick(page, "Mask bug", "Causal mask off by one: the next token visible")
    _wait_chart_title(page, "mask with causal_next_visible")
    _wait_text(page, '[data-testid="stAlert"]', "checks FAIL: .*causal_leak")
    _wait_text(page, '[data-testid="stAlert"]', "^All \\d+ checks pass")  # the correct side still passes
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "11-mask-lab.png")

    _goto_page(page, "Head analytics")
    _wait_chart_title(page, "per head (input); click a cell")
    _wait_chart_title(page, "encoder self-attention · layer 0 · head 0 · input")
    _pick(page, "Statistic", "diagonal / self")
    _wait_chart_title(page, "diagonal / self per head")
    _settle(page)
    _click_cell_until(
        page, "diagonal / self per head", 1, 2, "encoder self-attention · layer 1 · head 2 · input"
    )
    _wait_chart_title(page, "cross-attention alignment")
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "12-head-analytics.png")

    _goto_page(page, "Compare")
    _wait_chart_title(page, "B − A:")
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "13-compare-inputs.png")
    page.get_by_text("a mask bug", exact=True).click()
    _wait_text(page, '[data-testid="stAlert"]', "Audit of B: .*FAIL")
    _wait_chart_title(page, "B: with inverted")
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "14-compare-mask-bug.png")
    # Switch two encoder heads off: the output and the per-head change follow.
    page.get_by_text("heads switched off", exact=True).click()
    _wait_text(page, '[data-testid="stAlert"]', "No head is switched off yet")
    box = page.locator('[data-testid="stMain"] [data-testid="stMultiSelect"]').first
    for option in ("encoder self-attention · layer 0 · head 1", "encoder self-attention · layer 0 · head 3"):
        box.click()
        page.get_by_role("option", name=option, exact=True).click()
        _settle(page)
    page.keyboard.press("Escape")
    _wait_text(page, '[data-testid="stAlert"]', "Audit of B: All \\d+ checks pass")
    _wait_chart_title(page, "B: heads off")
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "16-compare-heads-off.png")
    _only_local(page)
    page.close()


def test_lab_with_a_tiny_model_and_padding(browser, server):
    """The untrained fixture: the lab's shorter copy gives padding, so cross_no_src_pad shows red cells."""
    page = _new_page(browser)
    _open(page, server, "tiny-seq2seq")
    _goto_page(page, "Mask lab")
    _pick(page, "Mask bug", "Cross attention without the source padding mask")
    _wait_chart_title(page, "mask with cross_no_src_pad")
    _wait_text(page, '[data-testid="stAlert"]', "checks FAIL: .*padding_leak\\[src\\]")
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "15-mask-lab-padding.png")
    page.close()
