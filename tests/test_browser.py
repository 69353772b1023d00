"""The dashboard in a real browser: Debian's chromium driven by Playwright (python).

Starts ``streamlit run dashboard/app.py`` on a free localhost port with the tiny fixture
models listed, visits every page, checks that no Streamlit exception box appears, types a
new input and waits for the heatmap's tick labels to change, clicks a grid tile, and checks
that the bertviz page renders with no request leaving localhost and no script from the
user's text running. Screenshots of every page go to artifacts/screenshots/.

CI sets ATTNSCOPE_REQUIRE_BROWSER=1: then a missing chromium or playwright is a failure;
locally the tests skip with the reason. ATTNSCOPE_CHROMIUM overrides the browser path (bench/harness.py).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

from attnscope.core.traces.trace import AttentionTrace
from bench import harness

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboard" / "app.py"
SHOTS = ROOT / "artifacts" / "screenshots"
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
INJECTION = "</script><script>alert(1)</script>"
PAGES = [  # (nav title, page h1, what shows it rendered)
    ("Attention", "Attention", "· layer 0 · head 0"),
    ("Decoding", "Decoding", "top-5 next tokens"),
    ("Masks", "Masks", "source padding mask"),
    ("Positional encoding", "Positional encoding", "PE matrix"),
    ("bertviz", "bertviz", None),
    ("Model", "Model", "parameters per module"),
]
WAIT_MS = 45_000

pytestmark = pytest.mark.browser


def _require_browser() -> None:
    problem = harness.chromium_problem()
    if problem:
        if os.environ.get("ATTNSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ATTNSCOPE_REQUIRE_BROWSER=1 but {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="module")
def browser():
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = harness.launch_chromium(p)
        yield b
        b.close()


def run_app(tmp_path_factory, **env: str):
    """The real app on a free localhost port (bench.harness.app_server); yields its URL."""
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with harness.app_server(APP, env={"OMP_NUM_THREADS": "1", **env}, log=log, timeout=60) as (url, _):
        yield url


@pytest.fixture(scope="module")
def server(browser, tiny_folder, tiny_clf_folder, tmp_path_factory):
    yield from run_app(
        tmp_path_factory, ATTNSCOPE_MODELS=os.pathsep.join([str(tiny_folder), str(tiny_clf_folder)])
    )


# -- page helpers ------------------------------------------------------------------------------


def _input_box(page):
    """The sidebar's "Input text" box, found by its label: other sidebar text inputs (the own-model
    path, the trace path) sit in expanders and may come first in the DOM, hidden."""
    return page.locator('[data-testid="stSidebar"]').get_by_label("Input text", exact=True)


def _new_page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.requests = []
    page.dialogs = []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    return page


def _wait_chart_title(page, text: str) -> None:
    page.wait_for_function(
        """t => [...document.querySelectorAll('.js-plotly-plot .gtitle')].some(e => e.textContent.includes(t))""",
        arg=text,
        timeout=WAIT_MS,
    )


def _no_exception_box(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, page.locator(
        '[data-testid="stException"]'
    ).first.inner_text()


def _open_with_tiny_model(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector('[data-testid="stSidebar"] [data-testid="stSelectbox"]', timeout=WAIT_MS)
    page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name=re.compile(r"^tiny-seq2seq ·")).click()
    # The model's examples fill the input box when the model changes.
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-testid="stSidebar"] input[type="text"]')]
               .some(e => e.value === 'hello world')""",
        timeout=WAIT_MS,
    )
    _wait_chart_title(page, "· layer 0 · head 0")


def _goto_page(page, nav_title: str, h1: str) -> None:
    page.locator('[data-testid="stSidebarNav"] a', has_text=nav_title).first.click()
    page.wait_for_function(
        """t => [...document.querySelectorAll('h1')].some(e => e.textContent.trim() === t)""",
        arg=h1,
        timeout=WAIT_MS,
    )


def _ticks(page, title_part: str, axis: str) -> list[str]:
    """The tick labels of the ``axis`` ('x' or 'y') of the chart whose title contains ``title_part``."""
    return page.evaluate(
        """([t, axis]) => {
            const gd = [...document.querySelectorAll('.js-plotly-plot')]
                .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes(t));
            return gd ? [...gd.querySelectorAll(`.${axis}tick text`)].map(e => e.textContent) : [];
        }""",
        [title_part, axis],
    )


def _x_ticks(page, title_part: str) -> list[str]:
    return _ticks(page, title_part, "x")


def _y_ticks(page, title_part: str) -> list[str]:
    return _ticks(page, title_part, "y")


def _screenshot(page, name: str) -> None:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to fit it."""
    height = page.evaluate(
        """() => Math.max(...[...document.querySelectorAll('[data-testid="stMain"], [data-testid="stMainBlockContainer"]')]
                             .map(e => e.scrollHeight), 800)"""
    )
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 120, 7000)})
    time.sleep(0.4)  # let plotly re-layout to the new size
    page.screenshot(path=str(SHOTS / name), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 1100})


def _settle(page) -> None:
    """Let the last rerun finish (no stale elements, no running indicator)."""
    page.wait_for_function(
        """() => !document.querySelector('[data-stale="true"]')
                 && !document.querySelector('[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]')""",
        timeout=WAIT_MS,
    )
    time.sleep(0.3)  # plotly's last layout pass before a screenshot


# Every heatmap trace plotly draws renders into a canvas read back with toDataURL: count those reads.
COUNT_DRAWS_JS = """
window.__heatmapDraws = 0;
const toDataURL = HTMLCanvasElement.prototype.toDataURL;
HTMLCanvasElement.prototype.toDataURL = function (...args) { window.__heatmapDraws += 1; return toDataURL.apply(this, args); };
"""
VISIBLE_HEATMAPS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')]
    .reduce((n, gd) => n + (gd._fullData || []).filter(t => t.type === 'heatmap' && t.visible === true).length, 0)"""


# -- tests -----------------------------------------------------------------------------------------


def test_every_page_in_a_real_browser(browser, server, tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = _new_page(browser)
    page.add_init_script(COUNT_DRAWS_JS)
    _open_with_tiny_model(page, server)
    for i, (nav, h1, marker) in enumerate(PAGES, start=1):
        _goto_page(page, nav, h1)
        if marker:
            _wait_chart_title(page, marker)
        else:
            page.frame_locator("iframe").first.locator("#vis svg").first.wait_for(timeout=WAIT_MS)
        _settle(page)
        _no_exception_box(page)
        _screenshot(page, f"{i}-{nav.lower().replace(' ', '-')}.png")

    # Type a new input: the heatmap's key tick labels follow.
    _goto_page(page, "Attention", "Attention")
    _wait_chart_title(page, "· layer 0 · head 0")
    before = _x_ticks(page, "· layer 0 · head 0")
    assert before[:5] == ["h", "e", "l", "l", "o"] and before[-1] == "<eos>"
    _settle(page)
    page.evaluate("() => { window.__heatmapDraws = 0; }")
    box = _input_box(page)
    box.fill("zyxw")
    box.press("Enter")
    page.wait_for_function(
        """() => {
            const gd = [...document.querySelectorAll('.js-plotly-plot')]
                .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes('· layer 0 · head 0'));
            return gd && [...gd.querySelectorAll('.xtick text')].map(e => e.textContent).join('|') === 'z|y|x|w|<eos>';
        }""",
        timeout=WAIT_MS,
    )
    _settle(page)
    _no_exception_box(page)
    # Each new heatmap drawn once: st.plotly_chart hands plotly a second, equal copy, not drawn again.
    heatmaps = page.evaluate(VISIBLE_HEATMAPS_JS)
    assert heatmaps >= 2 and page.evaluate("() => window.__heatmapDraws") == heatmaps

    # Click the grid tile of layer 1, head 2: the large heatmap switches to it.
    point = page.evaluate(
        """() => {
            const gd = [...document.querySelectorAll('.js-plotly-plot')]
                .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes('click a tile'));
            const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
            const tiles = gd._fullData.find(t => t.name === 'tiles');
            const i = tiles.x.findIndex((x, k) => x.startsWith('head 2 ·') && tiles.y[k].startsWith('layer 1 ·'));
            const r = gd.getBoundingClientRect();
            return {x: r.left + xa._offset + xa.d2p(tiles.x[i]), y: r.top + ya._offset + ya.d2p(tiles.y[i])};
        }"""
    )
    page.mouse.move(point["x"], point["y"])
    page.mouse.click(point["x"], point["y"])
    _wait_chart_title(page, "· layer 1 · head 2")
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "7-attention-after-input-and-click.png")

    # Downloads: the trace (.npz, read back with AttentionTrace.load) and a figure as standalone HTML.
    page.get_by_text("Downloads", exact=True).first.click()
    with page.expect_download(timeout=WAIT_MS) as info:
        page.get_by_role("button", name="trace .npz").click()
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    trace = AttentionTrace.load(path)
    assert trace.src_tokens == ("z", "y", "x", "w", "<eos>") and trace.enc_self.shape[:2] == (2, 4)
    with page.expect_download(timeout=WAIT_MS) as info:
        page.get_by_role("button", name="head .html").click()
    doc = info.value.path().read_text(encoding="utf-8")
    assert re.search(r"layer 1 (·|\\u00b7) head 2", doc) and not re.search(r"<script[^>]+src=", doc)
    # A batch (the model's three examples, one per line): padding on the Masks page is real.
    page.get_by_text("Batch: several inputs, one per line").click()
    page.wait_for_selector('[data-testid="stSidebar"] textarea', timeout=WAIT_MS)
    _goto_page(page, "Masks", "Masks")
    _wait_chart_title(page, "source padding mask [batch 3 ×")
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "9-masks-batch-of-3.png")
    outside = sorted(
        {
            u
            for u in page.requests
            if urlparse(u).hostname not in LOCAL_HOSTS and urlparse(u).scheme not in ("data", "blob", "about")
        }
    )
    assert not outside, outside
    page.close()


def test_bertviz_is_offline_and_shows_script_text_as_text(browser, server):
    page = _new_page(browser)
    _open_with_tiny_model(page, server)
    box = _input_box(page)
    box.fill(INJECTION)
    box.press("Enter")
    _wait_chart_title(page, "· layer 0 · head 0")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.js-plotly-plot .xtick text')].some(e => e.textContent === '<')""",
        timeout=WAIT_MS,
    )
    _goto_page(page, "bertviz", "bertviz")
    frame = page.frame_locator("iframe").first
    frame.locator("#vis svg text").first.wait_for(timeout=WAIT_MS)
    shown = frame.locator("#vis svg text").all_text_contents()
    assert "<" in shown and "/" in shown and ">" in shown  # the characters, as text
    _settle(page)
    _no_exception_box(page)
    _screenshot(page, "8-bertviz-injection-as-text.png")
    # The model view, too.
    page.get_by_text("model view", exact=True).click()
    frame = page.frame_locator("iframe").first
    frame.locator("#vis svg rect").first.wait_for(timeout=WAIT_MS)
    _settle(page)
    _no_exception_box(page)
    assert not page.dialogs, page.dialogs  # alert(1) never ran
    assert not any(
        f.url.startswith("http") and urlparse(f.url).hostname not in LOCAL_HOSTS for f in page.frames
    )
    outside = sorted(
        {
            u
            for u in page.requests
            if urlparse(u).hostname not in LOCAL_HOSTS and urlparse(u).scheme not in ("data", "blob", "about")
        }
    )
    assert not outside, outside
    page.close()


def test_a_rerun_that_builds_the_same_figures_redraws_nothing(browser, server):
    """The Positional encoding page's charts do not depend on the input: a new input reruns the page,
    which builds equal figures (equal revisions, finish()), and the browser leaves them as they are."""
    page = _new_page(browser)
    page.add_init_script(COUNT_DRAWS_JS)
    _open_with_tiny_model(page, server)
    _goto_page(page, "Positional encoding", "Positional encoding")
    _wait_chart_title(page, "PE matrix")
    _settle(page)
    heatmaps = page.evaluate(VISIBLE_HEATMAPS_JS)
    page.evaluate("() => { window.__heatmapDraws = 0; }")
    box = _input_box(page)
    box.fill("zyxw")
    box.press("Enter")
    page.wait_for_url(re.compile(r"text=zyxw"), timeout=WAIT_MS)  # the rerun took the new input
    _settle(page)
    _no_exception_box(page)
    assert heatmaps >= 1 and page.evaluate(VISIBLE_HEATMAPS_JS) == heatmaps
    assert page.evaluate("() => window.__heatmapDraws") == 0
    page.close()


def test_plotly_redraws_a_figure_only_for_new_numbers(browser):
    """plotly.js itself (the copy the plotly package ships): ``Plotly.react`` with an equal copy of a
    figure (what st.plotly_chart does right after the first draw) does not draw it again; another
    figure of the same shape in the same element is drawn from its own numbers (each figure carries a
    revision of its own: one shared by two figures would leave the first picture in place)."""
    import plotly

    from attnscope.dashboard.plots import attention as PT

    n = 48
    rng = np.random.default_rng(0)
    toks = [f"t{i}" for i in range(n)]
    mask = np.tril(np.ones((n, n), bool))
    figs = []
    for _ in range(2):
        w = rng.random((n, n), dtype=np.float32)
        figs.append(PT.head_heatmap(w / w.sum(1, keepdims=True), toks, toks, mask=mask, title="head"))
    specs = [f.to_json() for f in figs]
    page = browser.new_page()
    page.set_content("<html><body><div id='g' style='width:600px'></div></body></html>")
    page.add_script_tag(content=COUNT_DRAWS_JS)
    page.add_script_tag(path=str(Path(plotly.__file__).parent / "package_data" / "plotly.min.js"))
    result = page.evaluate(
        """async ([a, b]) => {
            const gd = document.getElementById('g'), draws = [];
            const z = gd => gd.calcdata[0][0].z.map(row => Array.from(row));
            let f = JSON.parse(a);
            await Plotly.newPlot(gd, f.data, f.layout); draws.push(window.__heatmapDraws);
            const drawnA = z(gd);
            f = JSON.parse(a); await Plotly.react(gd, f.data, f.layout); draws.push(window.__heatmapDraws);
            f = JSON.parse(b); await Plotly.react(gd, f.data, f.layout); draws.push(window.__heatmapDraws);
            return {draws, drawnA, drawnB: z(gd)};
        }""",
        specs,
    )
    page.close()
    assert result["draws"] == [1, 1, 2]  # an equal copy: no draw; new numbers: one draw
    for fig, drawn in zip(figs, (result["drawnA"], result["drawnB"]), strict=True):
        want = np.asarray(fig.data[0].z, dtype=float)
        got = np.asarray([[np.nan if v is None else v for v in row] for row in drawn], dtype=float)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_stale_content_dims_in_one_step_after_half_a_second(browser, server):
    """During a rerun Streamlit marks what will be replaced as stale; the app keeps Streamlit's 0.5 s
    delay (no flicker on quick reruns) but drops the 1 s opacity fade, which repaints every chart each
    frame. Read from the browser's computed style of an element marked stale."""
    page = _new_page(browser)
    _open_with_tiny_model(page, server)
    _settle(page)
    style = page.evaluate(
        """() => { const e = document.querySelector('[data-testid="stElementContainer"]');
                   e.setAttribute('data-stale', 'true');
                   const c = getComputedStyle(e);
                   return [c.transitionProperty, c.transitionDuration, c.transitionDelay]; }"""
    )
    assert style == ["opacity", "0s", "0.5s"], style
    page.close()
