"""The Training page in a real browser (chromium, as test_browser.py): the snapshots replay, the
play button animates the grid through the training steps in the browser, and a link to a step
reproduces it."""

from __future__ import annotations

import time

import pytest
from test_browser import WAIT_MS, _new_page, _no_exception_box, _settle, _wait_chart_title, browser  # noqa: F401

from attnscope.models import registry
from bench import harness

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def zoo_server(browser, tmp_path_factory):  # noqa: F811
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with harness.app_server(env={"OMP_NUM_THREADS": "1"}, log=log, timeout=60) as (url, _):
        yield url


def _slider_state(page, title_part: str):
    return page.evaluate(
        """t => {
            const gd = [...document.querySelectorAll('.js-plotly-plot')]
                .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes(t));
            return gd ? {active: gd._fullLayout.sliders[0].active, z: JSON.stringify(gd._fullData[0].z),
                         frames: gd._transitionData._frames.length} : null;
        }""",
        title_part,
    )


def test_play_animates_the_grid_through_training(browser, zoo_server):  # noqa: F811
    steps = [s["step"] for s in registry.snapshots("reverse")]
    page = _new_page(browser)
    page.goto(f"{zoo_server}/training?text=stressed")
    _wait_chart_title(page, "through training")
    _settle(page)
    _no_exception_box(page)
    before = _slider_state(page, "through training")
    assert before["active"] == 0 and before["frames"] == len(steps)
    page.locator(".updatemenu-button").filter(has_text="Play").first.click()
    deadline = time.time() + 20
    after = before
    while time.time() < deadline and after["active"] < 3:
        time.sleep(0.5)
        after = _slider_state(page, "through training")
    assert after["active"] >= 3, after["active"]  # the browser played on through the steps
    assert after["z"] != before["z"]  # and the grid changed with them
    page.close()


def test_link_to_a_step_reproduces_it(browser, zoo_server):  # noqa: F811
    step = registry.snapshots("reverse")[4]["step"]
    page = _new_page(browser)
    page.goto(f"{zoo_server}/training?text=stressed&kind=cross&step={step}")
    _wait_chart_title(page, f"at step {step:,}")
    _settle(page)
    _no_exception_box(page)
    assert "step=" in page.url and "kind=cross" in page.url
    page.close()
