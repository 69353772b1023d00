"""Your own model through an adapter file, in a real browser: every page renders it.

The server runs with ATTNSCOPE_ALLOW_CODE=1 and lists examples/my_adapter.py in ATTNSCOPE_MODELS.
Same rules as tests/test_browser.py (whose helpers this reuses).
"""

from __future__ import annotations

import re

import pytest
from test_browser import (  # noqa: F401  (browser: a fixture)
    PAGES,
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

pytestmark = pytest.mark.browser
ADAPTER = ROOT / "examples" / "my_adapter.py"
ANALYSIS = [  # (nav title, page h1, what shows it rendered)
    ("Mask audit", "Mask audit", "checks pass"),
    ("Head analytics", "Head analytics", None),
    ("Compare", "Compare", None),
    ("Mask lab", "Mask lab", "Masks cannot be injected"),
]


@pytest.fixture(scope="module")
def server(browser, tmp_path_factory):  # noqa: F811
    yield from run_app(tmp_path_factory, ATTNSCOPE_ALLOW_CODE="1", ATTNSCOPE_MODELS=str(ADAPTER))


def test_adapter_model_on_every_page(browser, server):  # noqa: F811
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = _new_page(browser)
    page.goto(server)
    page.wait_for_selector('[data-testid="stSidebar"] [data-testid="stSelectbox"]', timeout=WAIT_MS)
    page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name=re.compile(r"^my_adapter\.py \(adapter file\)")).click()
    page.wait_for_function(  # the adapter's EXAMPLES fill the input box
        """() => [...document.querySelectorAll('[data-testid="stSidebar"] input[type="text"]')]
               .some(e => e.value === 'hello world')""",
        timeout=WAIT_MS,
    )
    _wait_chart_title(page, "· layer 0 · head 0")
    _settle(page)
    ticks = _x_ticks(page, "· layer 0 · head 0")
    assert ticks[:5] == list("hello") and ticks[-1] == "<eos>", ticks
    for i, (nav, h1, marker) in enumerate(PAGES + ANALYSIS, start=1):
        _goto_page(page, nav, h1)
        if marker and nav in dict((p[0], 1) for p in PAGES):
            _wait_chart_title(page, marker)
        elif marker:
            page.get_by_text(marker).first.wait_for(timeout=WAIT_MS)
        elif nav == "bertviz":
            page.frame_locator("iframe").first.locator("#vis svg").first.wait_for(timeout=WAIT_MS)
        else:
            page.locator(".js-plotly-plot").first.wait_for(timeout=WAIT_MS)
        _settle(page)
        _no_exception_box(page)
        _screenshot(page, f"adapter-{i}-{nav.lower().replace(' ', '-')}.png")
    page.close()
