"""A run being written, followed in a real browser (chromium, as test_browser.py): the server is started
as ``attnscope view FOLDER`` starts it (ATTNSCOPE_VIEW_RUN), the Training page opens on the newest watched
step, and a step the training loop writes afterwards (a background thread) appears without a reload."""

from __future__ import annotations

import threading
from urllib.parse import urlparse

import pytest
from test_app_runs import start_run
from test_browser import WAIT_MS, _new_page, _no_exception_box, _settle, _wait_chart_title, browser  # noqa: F401

from attnscope.dashboard import watched
from bench import harness

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def growing_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "growing"
    w, train_to = start_run(folder, audit_every=None)
    train_to(10)  # watched steps 0, 5, 10 so far; the run stays open
    yield folder, train_to
    w.close()


@pytest.fixture(scope="module")
def run_server(browser, growing_run, tmp_path_factory):  # noqa: F811
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    env = {"OMP_NUM_THREADS": "1", watched.RUN_ENV: str(growing_run[0])}
    with harness.app_server(env=env, log=log, timeout=60) as (url, _):
        yield url


def test_a_new_step_appears_without_a_reload(browser, growing_run, run_server):  # noqa: F811
    _, train_to = growing_run
    page = _new_page(browser)
    page.goto(run_server)
    _wait_chart_title(page, "at step 10: all layers")  # opened on the Training page, newest step
    _settle(page)
    _no_exception_box(page)
    assert urlparse(page.url).path == "/training", page.url
    page.evaluate("() => { window.__sameDocument = true; }")  # a reload would lose it

    writer = threading.Thread(target=train_to, args=(15,))  # the training loop goes on
    writer.start()
    writer.join()
    _wait_chart_title(page, "at step 15: all layers")  # the slider was on the newest step: it follows
    assert page.evaluate("() => window.__sameDocument === true")
    slider = page.locator('[data-testid="stSlider"]').filter(has_text="Training step")
    assert "15" in slider.inner_text()
    _no_exception_box(page)
    page.close()
