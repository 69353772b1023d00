"""Shared pieces of the browser benchmarks and the load test: start the real app, drive chromium.

- ``app_server(...)``: ``streamlit run dashboard/app.py`` on a free localhost port (context manager),
  with the process for RSS sampling.
- ``launch_chromium(playwright)``: Debian's chromium, headless, no network beyond localhost.
- ``wait_grid_js`` / ``GRID_STATE_JS``: how a page tells that the all-heads grid has been redrawn
  (the heatmap's raster image changed), used by the timing benchmark and the load test.
- ``word_text(tok, n_tokens, seed)``: a text of exactly ``n_tokens`` WordPiece tokens for MiniLM.
- ``RssSampler``: peak resident memory of a process tree, sampled in a thread.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboard" / "app.py"
CHROMIUM = Path(os.environ.get("ATTNSCOPE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-renderer-backgrounding",  # several tabs at once: none is throttled as "hidden"
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
]
SIDEBAR_INPUT = '[data-testid="stSidebar"] input[aria-label="Input text"]'  # the single-input box
MODEL_PICKER = '[data-testid="stSidebar"] [data-testid="stSelectbox"]:has(input[aria-label^="Model"])'

# Words that are one WordPiece each in MiniLM's vocabulary (checked by word_text).
WORDS = (
    "the of and to in is was he for it with as his on be at by had are but from or have an they which "
    "one you were her all she there would their we him been has when who will more no if out so said "
    "what up its about into than them can only other new some could time these two may then do first "
    "any my now such like our over man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too little state good "
    "very make world still own see men work long get here between both life being under never day same "
    "another know while last might us great old year off come since against go came right used take three"
).split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium_problem() -> str | None:
    """Why a browser cannot run here (None when it can)."""
    if not CHROMIUM.exists():
        return f"chromium not found at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright python package is not installed"
    return None


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    """Whether the server at ``url`` answers its health check before ``timeout`` s (False as soon as
    ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


@contextlib.contextmanager
def app_server(
    app: Path = APP,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    timeout: float = 90.0,
    extra_args: list[str] | None = None,
):
    """Run the dashboard on a free port; yields (url, Popen). Stops it on exit."""
    port = free_port()
    full_env = dict(os.environ)
    full_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.port",
        str(port),
        "--server.address",
        "127.0.0.1",
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        *(extra_args or []),
    ]
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        cmd, cwd=Path(app).resolve().parents[1], env=full_env, stdout=out, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(url, proc, timeout):
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise RuntimeError(f"streamlit did not start (exit {proc.poll()}):\n{tail}")
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()


# -- in-page JavaScript -----------------------------------------------------------------------------

# The grid is the chart whose title says "click a tile"; it is drawn when plotly's heatmap image is in
# the DOM. Returns the image's href (a data: URL) or null.
GRID_STATE_JS = """() => {
    const gd = [...document.querySelectorAll('.js-plotly-plot')]
        .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes('click a tile'));
    if (!gd) return null;
    const img = gd.querySelector('.hm image');
    return img ? img.getAttribute('href') || img.getAttribute('xlink:href') : null;
}"""

# Called right before the input is sent: remembers the current grid image and the start time.
MARK_JS = "() => { window.__gridOld = (" + GRID_STATE_JS + ")(); window.__t0 = performance.now(); }"

# Polled every animation frame after the input was sent: ms since MARK_JS once a new grid is drawn.
WAIT_GRID_JS = (
    "() => { const now = (" + GRID_STATE_JS + ")();"
    " return (now && now !== window.__gridOld) ? performance.now() - window.__t0 : false; }"
)

SETTLED_JS = """() => !document.querySelector('[data-stale="true"]')
    && !document.querySelector('[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]')"""

EXCEPTION_JS = """() => [...document.querySelectorAll('[data-testid="stException"]')].map(e => e.innerText)"""


def open_app(page, url: str, model: str | None = None, timeout_ms: int = 90_000) -> None:
    """Load the app and (optionally) pick ``model`` in the sidebar's picker; waits for the grid."""
    import re

    page.goto(url)
    page.wait_for_selector(MODEL_PICKER, timeout=timeout_ms)
    if model:
        page.locator(MODEL_PICKER).first.click()
        # 'minilm (pretrained) · summary', 'reverse · summary'
        page.get_by_role("option", name=re.compile(rf"^{re.escape(model)}( \(|( ·|$))")).first.click()
    page.wait_for_function(GRID_STATE_JS, timeout=timeout_ms)
    page.wait_for_function(SETTLED_JS, timeout=timeout_ms)


def send_input(page, text: str, timeout_ms: int = 120_000) -> float:
    """Type ``text`` in the sidebar's input, press Enter; ms until the grid is redrawn (in-page clock)."""
    box = page.locator(SIDEBAR_INPUT).first
    box.fill(text)
    page.evaluate(MARK_JS)
    box.press("Enter")
    return float(page.wait_for_function(WAIT_GRID_JS, timeout=timeout_ms, polling="raf").json_value())


# -- inputs --------------------------------------------------------------------------------------------


def one_piece_words(tok) -> list[str]:
    """WORDS that MiniLM's tokenizer keeps as one token each."""
    return [w for w in WORDS if len(tok.encode(w)) == 1]


def word_text(tok, n_tokens: int, seed: int, words: list[str] | None = None) -> str:
    """A text that MiniLM turns into exactly ``n_tokens`` tokens ([CLS] and [SEP] included)."""
    words = words or one_piece_words(tok)
    rng = random.Random(seed)
    text = " ".join(rng.choice(words) for _ in range(n_tokens - 2))
    got = len(tok.encode(text)) + 2
    if got != n_tokens:
        raise RuntimeError(f"text has {got} tokens, wanted {n_tokens}")
    return text


# -- a quiet machine -----------------------------------------------------------------------------------------


def _cpu_busy_idle() -> tuple[int, int]:
    """(busy, idle) jiffies of all cores since boot, from /proc/stat (Linux)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, idle


def wait_quiet(max_s: float = 5.0, window_s: float = 0.25, busy_below: float = 0.15) -> float:
    """Wait until the cores were less than ``busy_below`` busy over one ``window_s`` (what the last
    measurement left running has finished: a server's collection after its run, a chart still drawn),
    at most ``max_s``. Returns the seconds waited. Without /proc/stat it waits one window."""
    start = time.perf_counter()
    try:
        before = _cpu_busy_idle()
    except OSError:
        time.sleep(window_s)
        return window_s
    while True:
        time.sleep(window_s)
        after = _cpu_busy_idle()
        busy, idle = after[0] - before[0], after[1] - before[1]
        if busy + idle == 0 or busy / (busy + idle) < busy_below or time.perf_counter() - start >= max_s:
            return time.perf_counter() - start
        before = after


# -- memory ------------------------------------------------------------------------------------------------


class RssSampler:
    """Samples the resident memory (MB) of a process and its children in a thread; ``peak_mb``."""

    def __init__(self, pid: int, interval: float = 0.2):
        import psutil

        self._proc = psutil.Process(pid)
        self.interval = interval
        self.peak_mb = 0.0
        self.last_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> float:
        import psutil

        total = 0
        try:
            procs = [self._proc, *self._proc.children(recursive=True)]
        except psutil.Error:
            return 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.is_set():
            self.last_mb = self.sample()
            self.peak_mb = max(self.peak_mb, self.last_mb)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
