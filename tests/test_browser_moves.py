"""What attention moves in a real browser (Debian's chromium driven by Playwright): on the Attention page
the weight | what-moves toggle redraws the head view (title and numbers change), and Head analytics shows
the sink table under its thresholds, with the norm-based rollout one click away. Screenshots go to
artifacts/screenshots/ (30-what-moves.png, 31-sink-heads.png). Same rules as tests/test_browser.py:
CI sets ATTNSCOPE_REQUIRE_BROWSER=1; locally the tests skip with the reason when chromium is missing.
"""

from __future__ import annotations

import pytest
from test_browser import browser, server  # noqa: F401  (fixtures)
from test_browser_analysis import (
    WAIT_MS,
    _goto_page,
    _new_page,
    _no_exception_box,
    _only_local,
    _open,
    _screenshot,
    _settle,
    _wait_chart_title,
    _wait_text,
)

pytestmark = pytest.mark.browser

HEAD_Z_JS = """t => {
    const gd = [...document.querySelectorAll('.js-plotly-plot')]
        .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes(t));
    return gd ? Array.from(gd.calcdata[0][0].z, row => Array.from(row)) : null;
}"""


def test_toggle_and_sink_table_in_a_real_browser(browser, server):  # noqa: F811  (pytest fixtures)
    page = _new_page(browser)
    _open(page, server, "reverse")  # opens on the Attention page: encoder self-attention, layer 0 head 0
    _settle(page)
    weights = page.evaluate(HEAD_Z_JS, "encoder self-attention · layer 0 · head 0 · input")
    assert weights and abs(sum(weights[0]) - 1) < 1e-4

    page.locator('[data-testid="stMain"] [data-testid="stRadio"]').filter(has_text="Show").get_by_text(
        "what moves", exact=False
    ).first.click()
    _wait_chart_title(page, "encoder self-attention · layer 0 · head 0 · input · what moves")
    _wait_chart_title(page, "encoder self-attention: what moves: all 2 layers")
    _wait_text(page, '[data-testid="stCaptionContainer"]', "share of what this query receives")
    _settle(page)
    _no_exception_box(page)
    moved = page.evaluate(HEAD_Z_JS, "· what moves")
    assert moved and len(moved) == len(weights)
    assert abs(sum(moved[0]) - 1) < 1e-4  # rows of the what-moves share sum to 1 too ...
    assert (
        max(abs(a - b) for ra, rb in zip(moved, weights, strict=True) for a, b in zip(ra, rb, strict=True))
        > 1e-3
    )
    _screenshot(page, "30-what-moves.png")

    _goto_page(page, "Head analytics")
    _wait_text(page, "h3", "Sink heads")
    _wait_text(page, '[data-testid="stMarkdownContainer"]', "weight share is at least 0.5")
    page.locator('[data-testid="stDataFrame"]').last.wait_for(timeout=WAIT_MS)
    _wait_chart_title(page, "encoder attention rollout")
    page.get_by_text("norm-based rollout", exact=True).click()
    _wait_chart_title(page, "encoder norm-based rollout")
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "31-sink-heads.png")
    _only_local(page)
    page.close()
