"""Trace files and links in a real browser (chromium, as test_browser.py):

- ``python -m attnscope trace ... --out t.npz`` then ``python -m attnscope view t.npz`` shows that trace's tokens;
- a link copied from one session reproduces the view in a fresh browser context;
- hostile query parameters and hostile trace files give messages and leave the app usable.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from test_browser import (  # noqa: F401
    WAIT_MS,
    _input_box,
    _new_page,
    _no_exception_box,
    _settle,
    _wait_chart_title,
    _x_ticks,
    _y_ticks,
    browser,
)

from attnscope.core.traces.trace import AttentionTrace
from attnscope.dashboard import links
from bench import harness

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.browser
HEAD = "· layer 0 · head 0"


def _sidebar_text(page) -> str:
    return page.locator('[data-testid="stSidebar"]').inner_text()


def _main_text(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


def _z(page, title_part: str):
    return page.evaluate(
        """t => {
            const gd = [...document.querySelectorAll('.js-plotly-plot')]
                .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes(t));
            return gd ? JSON.stringify(gd._fullData[0].z) : null;
        }""",
        title_part,
    )


@pytest.fixture(scope="module")
def zoo_server(browser, tmp_path_factory):  # noqa: F811
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with harness.app_server(env={"OMP_NUM_THREADS": "1"}, log=log, timeout=60) as (url, _):
        yield url


def test_trace_then_view_shows_that_trace(browser, tmp_path):  # noqa: F811
    out = tmp_path / "t.npz"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    made = subprocess.run(
        [sys.executable, "-m", "attnscope", "trace", "--model", "reverse", "stressed", "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    tokens = list(AttentionTrace.load(out).src_tokens)
    port = harness.free_port()
    log = open(tmp_path / "view.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnscope", "view", str(out), "--port", str(port), "--server.fileWatcherType", "none"],
        cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    tmp_path / "view.log"
                ).read_text()
                time.sleep(0.5)
        page = _new_page(browser)
        page.goto(url)
        _wait_chart_title(page, HEAD)
        _settle(page)
        assert _x_ticks(page, HEAD) == tokens  # the file's own tokens (s t r e s s e d <eos>)
        assert "Trace file" in _sidebar_text(page) and "t.npz" in _sidebar_text(page)
        _no_exception_box(page)

        # A page that runs the model says so in one line and names the model to load.
        page.locator('[data-testid="stSidebarNav"] a', has_text="Mask lab").first.click()
        page.get_by_text("needs the model itself", exact=False).first.wait_for(timeout=WAIT_MS)
        assert "load reverse" in _main_text(page)
        _no_exception_box(page)
        page.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def test_a_copied_link_reproduces_the_view_in_a_fresh_browser(browser, zoo_server):  # noqa: F811
    page = _new_page(browser)
    page.goto(zoo_server)
    _wait_chart_title(page, HEAD)
    box = _input_box(page)
    box.fill("linked")
    box.press("Enter")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.xtick text')].map(e => e.textContent).join('') .includes('linked')""",
        timeout=WAIT_MS,
    )
    page.locator('[data-testid="stMain"] [data-testid="stRadio"]').first.get_by_text(
        "cross-attention"
    ).click()
    _wait_chart_title(page, "cross-attention · layer 0 · head 0")
    _settle(page)
    # Another head: the grid is not drawn again (plotly reports no new plot of it: the same figure),
    # and the URL and the link box follow.
    grid_js = """() => [...document.querySelectorAll('.js-plotly-plot')]
        .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes('click a tile'))"""
    page.evaluate(
        f"() => {{ const g = ({grid_js})(); g.__plots = 0; g.on('plotly_afterplot', () => g.__plots++); }}"
    )
    boxes = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]')
    boxes.filter(has_text=re.compile(r"^Head")).first.click()
    page.keyboard.type("head 1")
    page.keyboard.press("Enter")
    title = "cross-attention · layer 0 · head 1"
    _wait_chart_title(page, title)
    _settle(page)
    assert page.evaluate(f"() => ({grid_js})().__plots") == 0  # the same grid, not drawn again
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-testid="stSidebar"] [data-testid="stCode"] code')]
            .some(c => c.innerText.includes('head=1'))""",
        timeout=WAIT_MS,
    )
    link = page.locator('[data-testid="stSidebar"] [data-testid="stCode"] code').last.inner_text().strip()
    assert link.startswith(zoo_server) and "kind=cross" in link and "text=linked" in link and "head=1" in link
    assert page.url.endswith(link[len(zoo_server) :]) or "kind=cross" in page.url  # the URL follows
    picture = (_x_ticks(page, title), _y_ticks(page, title), _z(page, title))
    page.close()

    fresh = browser.new_context(viewport={"width": 1400, "height": 1100})
    other = fresh.new_page()
    other.goto(link)
    _wait_chart_title(other, title)
    _settle(other)
    assert (_x_ticks(other, title), _y_ticks(other, title), _z(other, title)) == picture
    assert picture[0][:6] == list("linked")
    _no_exception_box(other)
    fresh.close()


def test_the_attention_path_is_the_attention_page(browser, zoo_server):  # noqa: F811
    """``/attention`` (the menu's name, as every other page's path is its own) opens the Attention page with
    its link's values; Streamlit serves the default page at ``/`` only, and said "Page not found"."""
    page = _new_page(browser)
    page.goto(zoo_server.rstrip("/") + "/attention?kind=cross&head=1")
    title = "cross-attention · layer 0 · head 1"
    _wait_chart_title(page, title)
    _settle(page)
    assert "page not found" not in page.locator("body").inner_text().lower()
    nav = page.locator('[data-testid="stSidebarNav"]').inner_text().splitlines()
    assert [line for line in nav if line.strip() == "Attention"] == ["Attention"]  # one menu entry
    _no_exception_box(page)
    page.close()


def _truncated_npz() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, enc_self=np.ones((1, 1, 3, 3), np.float32))
    return buf.getvalue()[:60]


def _pickle_npz() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        item = io.BytesIO()
        np.save(item, np.array([{"x": 1}], dtype=object), allow_pickle=True)
        z.writestr("enc_self.npy", item.getvalue())
    return buf.getvalue()


def test_hostile_links_and_trace_files_leave_the_app_usable(browser, zoo_server, tmp_path):  # noqa: F811
    page = _new_page(browser)
    page.goto(f"{zoo_server}/?model=/etc/passwd&layer=abc&text=" + "x" * 3000 + "&%3Cscript%3E=1")
    page.get_by_text("This link's", exact=False).first.wait_for(timeout=WAIT_MS)
    text = _main_text(page)
    assert "never a path" in text and "layer='abc'" in text and "at most 2,000" in text
    _wait_chart_title(page, HEAD)  # the default model and input are drawn
    _no_exception_box(page)
    assert not page.dialogs

    for name, data, says in [
        ("cut.npz", _truncated_npz(), "Cannot open the trace"),
        ("evil.npz", _pickle_npz(), "never unpickles"),
        ("bad.json", b'{"src_tokens": ["a"], "enc_self": "nope"', "Cannot open the trace"),
    ]:
        path = tmp_path / name
        path.write_bytes(data)
        sidebar = page.locator('[data-testid="stSidebar"]')
        button = sidebar.get_by_role("button", name="Open trace")
        if not button.is_visible():
            sidebar.locator("summary", has_text="Open a trace").click()
            button.wait_for(state="visible", timeout=WAIT_MS)
        uploader = sidebar.get_by_label("Upload a trace (.npz or .json)", exact=True)
        uploader.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(path))
        sidebar.get_by_text(name, exact=True).first.wait_for(timeout=WAIT_MS)  # uploaded
        _settle(page)
        button.click()
        sidebar.get_by_text(says, exact=False).first.wait_for(timeout=WAIT_MS)
        _no_exception_box(page)

    # Still usable: a new input redraws the grid.
    box = _input_box(page)
    box.fill("still")
    box.press("Enter")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.xtick text')].map(e => e.textContent).join('').includes('still')""",
        timeout=WAIT_MS,
    )
    _no_exception_box(page)
    page.close()


# (nav entry, page title, url path, parameters that page always writes); the default page's path is "/".
NAV_PAGES = {
    "Attention": ("Attention", "/", {"kind", "layer", "head"}),
    "Decoding": ("Decoding", "/decoding", {"step", "layer"}),
    "Masks": ("Masks", "/masks", set()),
    "Mask audit": ("Mask audit", "/mask-audit", {"kind", "layer", "head"}),
    "Head analytics": ("Head analytics", "/heads", {"stat", "layer", "head"}),
    "Model": ("Model", "/model", set()),
}
# Clicks in a row, with a new input typed before some of them (the sidebar's input is a widget too).
CLICKS = [
    ("Masks", "alpha"), ("Attention", None), ("Decoding", "bravo"), ("Masks", None),
    ("Head analytics", "charlie"), ("Attention", "delta"), ("Mask audit", None), ("Masks", "echo"),
    ("Model", None), ("Attention", "foxtrot"), ("Decoding", None), ("Mask audit", "golf"),
    ("Attention", None), ("Masks", "hotel"), ("Head analytics", None), ("Attention", "india"),
]  # fmt: skip


def _url_view(url: str) -> tuple[str, dict[str, list[str]]]:
    parts = urlsplit(url)
    return parts.path or "/", parse_qs(parts.query, keep_blank_values=True)


def _shows_page(page, title: str) -> None:
    """The page's content has rendered and the run that drew it has ended."""
    page.wait_for_function(
        """t => [...document.querySelectorAll('[data-testid="stMain"] h1')].some(e => e.textContent.trim() === t)""",
        arg=title,
        timeout=WAIT_MS,
    )
    _settle(page)


def _url_caught_up(page, path: str, own: set[str], text: str) -> None:
    """The address bar is rewritten after the page's run (replaceState from the page): wait until it
    shows the page, its own parameters and the input (the asserts after it then say what is wrong)."""
    try:
        page.wait_for_function(
            """([path, own, text]) => {
                const q = new URLSearchParams(location.search);
                return location.pathname === path && q.get("text") === text && own.every(p => q.has(p));
            }""",
            arg=[path, sorted(own), text],
            timeout=WAIT_MS,
        )
    except Exception:  # noqa: BLE001 (the asserts that follow name what the address bar lacks)
        pass


def _link_caught_up(page, want, wait_s: float = WAIT_MS / 1000):
    """The view the sidebar's link box shows, once it shows ``want`` or after ``wait_s``: the box and the
    address bar come from the same run, but the browser may draw one a moment before the other."""
    deadline = time.monotonic() + wait_s
    while True:
        code = page.locator('[data-testid="stSidebar"] [data-testid="stCode"] code').last
        got = _url_view(code.inner_text().strip())
        if got == want or time.monotonic() > deadline:
            return got
        page.wait_for_timeout(200)


def test_the_url_follows_every_navigation_click_and_input(browser, zoo_server):  # noqa: F811
    from playwright.sync_api import expect

    page = _new_page(browser)
    page.goto(zoo_server)
    _wait_chart_title(page, HEAD)
    _settle(page)
    box = _input_box(page)
    text = box.input_value()
    for nav, new_text in CLICKS:
        if new_text is not None:  # a widget change, then the click right away (its run may still go on)
            box.fill(new_text)
            box.press("Enter")
            text = new_text
        page.locator('[data-testid="stSidebarNav"] a', has_text=nav).first.click()
        title, path, own = NAV_PAGES[nav]
        _shows_page(page, title)
        expect(box).to_have_value(text, timeout=WAIT_MS)  # the run that writes it may still be on its way
        _url_caught_up(page, path, own, text)
        seen = f"after clicking {nav}: {page.url}"
        got_path, params = _url_view(page.url)
        assert got_path == path, seen
        assert params.get("text") == [text] and params.get("model") == ["reverse"], seen
        allowed = set(links.SIDEBAR) | {p for p, _, _ in links.PAGE_PARAMS[links.page_name(path.strip("/"))]}
        assert set(params) <= allowed, seen  # no parameter of another page left behind
        assert own <= set(params), seen  # the page's own parameters are there
        # The link box says the same (it is drawn by the same run: wait until that run has drawn it).
        assert _link_caught_up(page, (got_path, params)) == (got_path, params), seen

    # The copied URL opens the same page with the same input in a new tab.
    copied = page.url
    other = _new_page(browser)
    other.goto(copied)
    _shows_page(other, NAV_PAGES[CLICKS[-1][0]][0])
    expect(_input_box(other)).to_have_value(text, timeout=WAIT_MS)  # the link's run, then the page's
    _settle(other)
    assert _url_view(other.url) == _url_view(copied)
    _no_exception_box(other)
    _no_exception_box(page)
    other.close()
    page.close()
