"""Corpus statistics on the Head analytics page in a real browser (chromium, as test_browser.py): a
stats file opens from its path, the corpus heatmaps draw, and "Trace" sends an atypical input to the
sidebar, whose own maps then draw below."""

from __future__ import annotations

import json

import pytest
from test_browser import WAIT_MS, _new_page, _no_exception_box, _settle, _wait_chart_title, browser  # noqa: F401

from attnscope.core.analysis import corpus
from attnscope.models import registry
from bench import harness

pytestmark = pytest.mark.browser
LINES = ["hello", "attention", "abc", "zzzzzz", "stressed", "desserts", "qwerty", "a", "mississippi", "kayak"]


@pytest.fixture(scope="module")
def stats_server(browser, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("corpus")
    out = folder / "reverse.parquet"
    corpus.write(corpus.run(registry.load("reverse"), LINES, batch=4), LINES, out,
                 {"model": "reverse", "input_file": "lines.txt", "n_lines": len(LINES), "world": 1})  # fmt: skip
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    env = {"OMP_NUM_THREADS": "1", "ATTNSCOPE_MODEL_DIRS": str(folder)}
    with harness.app_server(env=env, log=log, timeout=60) as (url, _):
        yield url, out


def test_open_a_stats_file_and_trace_an_atypical_input(browser, stats_server):  # noqa: F811
    url, out = stats_server
    page = _new_page(browser)
    page.goto(f"{url}/heads")
    _wait_chart_title(page, "per head")
    page.get_by_text("Corpus statistics: open a file").click()
    box = page.get_by_label("or its path")
    box.fill(str(out))
    box.press("Enter")
    _settle(page)  # the rerun the Enter started ends before the click: a click during it can be lost
    page.get_by_role("button", name="Open path").click()
    _wait_chart_title(page, "over 10 inputs")
    _settle(page)
    _no_exception_box(page)
    assert page.get_by_text("Over 10 inputs").count() >= 1
    frame, _ = corpus.read(out)
    kind = "enc_self"  # the first kind the view offers
    row = frame[
        (frame["kind"] == kind) & (frame["stat"] == "entropy") & (frame["layer"] == 0) & (frame["head"] == 0)
    ]
    text = json.loads(row.iloc[0]["top_high"])[0]["text"]
    page.get_by_role("button", name="Trace").first.click()
    page.wait_for_function(
        """t => [...document.querySelectorAll('[data-testid="stSidebar"] input')].some(e => e.value === t)""",
        arg=text,
        timeout=WAIT_MS,
    )
    _settle(page)
    _no_exception_box(page)
    page.close()
