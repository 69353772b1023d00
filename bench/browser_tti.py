"""Browser time to interactive and bytes per value: attnscope's all-heads grid against bertviz's model view.

    python -m bench.browser_tti [--lengths 32 128 512] [--repeats 3] [--app dashboard/app.py]

One run, one headless chromium, MiniLM (6 layers x 12 heads), texts of exactly N WordPiece tokens:

- attnscope: the real app (``streamlit run``) with MiniLM picked in the sidebar. Time from pressing Enter
  on a new input to the grid's heatmap image being in the DOM (in-page clock, polled every animation
  frame); this includes running the model. Bytes: the websocket frame that carries the grid (captured by
  Playwright), divided by the attention values it shows (layers x heads x N x N).
- bertviz: ``bertviz.model_view(..., html_action="return")`` for the same attention, with require.js,
  d3 and jQuery swapped from the CDN to dashboard/static/vendor/, served from localhost in a second
  chromium. Time from navigation start to bertviz's last thumbnail in the SVG (same polling). Bytes:
  the HTML page per attention value. A memory guard stops bertviz's renderer above --bertviz-max-mb
  (long inputs make it build one SVG line per query-key pair per head) and a time limit stops waiting.

--moves adds a what-moves case: a second tab per app with the Attention page's toggle on "what moves"
(the grid of ‖α·f(x)‖ rows scaled to sum 1, computed from the trace's value norms), labelled
"<app>+moves", measured the same way and interleaved with the weight tab; the summary prints its grid
time as a ratio of the weight grid's (the issue asks for at most 1.2x).

The two are interleaved (attnscope N, bertviz N, next N, ...) so both see the same machine load.
``--app`` takes several checkouts' dashboard/app.py (e.g. a "before" worktree and this one): each gets
its own server and tab, and every input goes to each in turn, so they see the same machine load.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import platform
import shutil
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench import harness

VENDOR = harness.ROOT / "dashboard" / "static" / "vendor"
MIN_FREE_MB = 2500  # the memory guard also stops bertviz when the machine has less than this left
CDN_REQUIRE = '<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js"></script>'
CDN_PATHS = {
    "https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min": "/vendor/d3-5.7.0.min",
    "https://cdnjs.cloudflare.com/ajax/libs/jquery/2.0.0/jquery.min": "/vendor/jquery-3.7.1.min",
}


# -- bertviz ---------------------------------------------------------------------------------------------


def bertviz_page(trace) -> str:
    """bertviz's own model-view HTML for the trace (no subsetting), CDN swapped for the vendored files."""
    import bertviz

    from attnscope.core.traces.bertviz_adapter import bertviz_args

    args = bertviz_args(trace, view="model", max_tokens=10**9, max_cells=10**15)
    html = bertviz.model_view(**args.kwargs, html_action="return").data  # bertviz's own page, as users get it
    if CDN_REQUIRE not in html:
        raise RuntimeError("bertviz's HTML no longer loads require.js from the expected CDN URL")
    html = html.replace(CDN_REQUIRE, '<script src="/vendor/require-2.3.6.js"></script>')
    for cdn, local in CDN_PATHS.items():
        if cdn not in html:
            raise RuntimeError(f"bertviz's model_view.js no longer names {cdn}")
        html = html.replace(cdn, local)
    return f'<!doctype html>\n<html><head><meta charset="utf-8"></head><body>\n{html}\n</body></html>\n'


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def static_server(folder: Path):
    handler = functools.partial(_Quiet, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _chromium_pids() -> set[int]:
    import psutil

    out = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "chrom" in p.name().lower():
                out.add(p.pid)
    return out


class MemoryGuard:
    """Kills the biggest renderer of a browser (its process tree) once the tree passes ``limit_mb``."""

    def __init__(self, main_pids: set[int], limit_mb: float):
        import psutil

        self.roots = [psutil.Process(p) for p in main_pids]
        self.limit_mb = limit_mb
        self.peak_mb = 0.0
        self.killed_at_mb: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree(self):
        import psutil

        procs = []
        for r in self.roots:
            with contextlib.suppress(psutil.Error):
                procs += [r, *r.children(recursive=True)]
        return procs

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            sizes = []
            for p in self._tree():
                with contextlib.suppress(psutil.Error):
                    sizes.append((p.memory_info().rss, p))
            total = sum(s for s, _ in sizes) / 2**20
            self.peak_mb = max(self.peak_mb, total)
            low = psutil.virtual_memory().available < MIN_FREE_MB * 2**20  # never starve the machine
            if (total > self.limit_mb or low) and sizes and self.killed_at_mb is None:
                self.killed_at_mb = total
                rss, biggest = max(sizes, key=lambda t: t[0])
                with contextlib.suppress(psutil.Error, ProcessLookupError):
                    os.kill(biggest.pid, signal.SIGKILL)
            self._stop.wait(0.2)

    def reset(self) -> None:
        self.peak_mb, self.killed_at_mb = 0.0, None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def bertviz_trial(
    browser, base_url: str, name: str, n_thumbs: int, guard: MemoryGuard, timeout_s: float
) -> dict:
    """Load a bertviz page; ms from navigation start to its last thumbnail (or why it never came)."""
    guard.reset()
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    crashed = []
    page.on("crash", lambda *_: crashed.append(True))
    start = time.perf_counter()
    try:
        page.goto(f"{base_url}/{name}", wait_until="commit", timeout=timeout_s * 1000)
        ms = page.wait_for_function(
            """n => { const bg = document.querySelectorAll('#vis svg rect.attn_background');
                     return bg.length >= n ? performance.now() : false; }""",
            arg=n_thumbs,
            timeout=timeout_s * 1000,
            polling=250,
        ).json_value()
        return {"ms": float(ms), "peak_mb": guard.peak_mb}
    except Exception as exc:  # timeout, crash, killed renderer
        wall = time.perf_counter() - start
        if guard.killed_at_mb is not None:
            why = f"renderer stopped at {guard.killed_at_mb:,.0f} MB after {wall:.0f} s, nothing drawn"
        elif crashed:
            why = f"renderer crashed after {wall:.0f} s"
        else:
            why = f"not drawn within {wall:.0f} s ({type(exc).__name__})"
        return {"ms": None, "why": why, "peak_mb": guard.peak_mb}
    finally:
        with contextlib.suppress(Exception):
            page.close()


# -- attnscope -----------------------------------------------------------------------------------------


class FrameLog:
    """Websocket frames the page receives (bytes), in order."""

    def __init__(self, page):
        self.frames: list[bytes] = []
        page.on("websocket", self._on_ws)

    def _on_ws(self, ws) -> None:
        ws.on(
            "framereceived",
            lambda payload: self.frames.append(
                payload if isinstance(payload, bytes) else payload.encode("utf-8")
            ),
        )


def show_what_moves(page, timeout_s: float) -> None:
    """Flip the Attention page's toggle to "what moves" and wait for that grid."""
    page.locator('[data-testid="stMain"] [data-testid="stRadio"]').filter(has_text="Show").get_by_text(
        "what moves", exact=False
    ).first.click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]
                 .some(e => e.textContent.includes('what moves') && e.textContent.includes('click a tile'))""",
        timeout=timeout_s * 1000,
    )
    page.wait_for_function(harness.SETTLED_JS, timeout=timeout_s * 1000)


def attnscope_trial(page, frames: FrameLog, text: str, timeout_s: float) -> dict:
    start = len(frames.frames)
    grid_ms = harness.send_input(page, text, timeout_ms=int(timeout_s * 1000))
    page.wait_for_function(harness.SETTLED_JS, timeout=timeout_s * 1000)
    settled_ms = float(page.evaluate("() => performance.now() - window.__t0"))
    errors = page.evaluate(harness.EXCEPTION_JS)
    if errors:
        raise RuntimeError(f"the app shows an exception: {errors[0][:500]}")
    new = frames.frames[start:]
    grid = [f for f in new if b"click a tile" in f]
    return {
        "ms": grid_ms,
        "settled_ms": settled_ms,
        "grid_bytes": max((len(f) for f in grid), default=0),
        "rerun_bytes": sum(len(f) for f in new),
    }


# -- main ------------------------------------------------------------------------------------------------


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--app",
        type=Path,
        nargs="+",
        default=[harness.APP],
        help="dashboard/app.py of each checkout to measure (interleaved), e.g. a 'before' worktree",
    )
    ap.add_argument("--label", nargs="+", help="a name per --app (default: its checkout's folder name)")
    ap.add_argument(
        "--bertviz-max-mb", type=float, default=6000, help="stop bertviz's renderer above this RSS"
    )
    ap.add_argument("--bertviz-timeout", type=float, default=180, help="seconds to wait for bertviz to draw")
    ap.add_argument("--no-bertviz", action="store_true", help="measure the app(s) only")
    ap.add_argument(
        "--moves", action="store_true", help="also time each app's grid with the what-moves toggle on"
    )
    ap.add_argument("--timeout", type=float, default=180, help="seconds to wait for attnscope's grid")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    problem = harness.chromium_problem()
    if problem:
        raise SystemExit(problem)
    app_labels = args.label or [Path(a).resolve().parents[1].name for a in args.app]
    if len(app_labels) != len(args.app):
        raise SystemExit("give one --label per --app")
    labels = [x for lab in app_labels for x in ([lab, f"{lab}+moves"] if args.moves else [lab])]

    import psutil
    import torch
    from playwright.sync_api import sync_playwright

    from attnscope.models import registry

    torch.set_num_threads(1)
    lm = registry.load("minilm")
    n_layers, n_heads = lm.cfg.n_enc_layers, lm.cfg.n_heads
    words = harness.one_piece_words(lm.src_tok)
    load0 = os.getloadavg()
    results = {lab: {n: [] for n in args.lengths} for lab in labels}
    bv_results: dict[int, list] = {n: [] for n in args.lengths}
    bertviz_bytes: dict[int, int] = {}
    bertviz_gave_up: dict[int, str] = {}
    server_peak = dict.fromkeys(labels, 0.0)

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw, contextlib.ExitStack() as stack:
        tmp = Path(tmp)
        shutil.copytree(VENDOR, tmp / "vendor")
        before = _chromium_pids()
        bv_browser = harness.launch_chromium(pw)
        bv_main = set(_chromium_pids() - before)
        app_browser = harness.launch_chromium(pw)
        static_url = stack.enter_context(static_server(tmp))
        guard = stack.enter_context(MemoryGuard(bv_main, args.bertviz_max_mb))
        apps = {}
        for lab, app in zip(app_labels, args.app, strict=True):
            url, proc = stack.enter_context(
                harness.app_server(app, env={"OMP_NUM_THREADS": "1"}, log=tmp / f"server-{lab}.log")
            )
            rss = stack.enter_context(harness.RssSampler(proc.pid))
            for tab in [lab, f"{lab}+moves"] if args.moves else [lab]:
                page = app_browser.new_page(viewport={"width": 1400, "height": 1100})
                frames = FrameLog(page)
                harness.open_app(page, url, "minilm")
                if tab != lab:
                    show_what_moves(page, args.timeout)
                apps[tab] = (page, frames, rss)
        for rep in range(args.repeats):
            for n in args.lengths:
                text = harness.word_text(lm.src_tok, n, seed=7919 * rep + n, words=words)
                for lab, (page, frames, _) in apps.items():
                    # the what-moves tab shares its app's server: its own text, so it runs the model too
                    # rather than finding the weight tab's trace in the cache
                    own = lab.endswith("+moves")
                    seed = 7919 * rep + n + 104729
                    tab_text = harness.word_text(lm.src_tok, n, seed=seed, words=words) if own else text
                    a = attnscope_trial(page, frames, tab_text, args.timeout)
                    results[lab][n].append(a)
                    print(
                        f"  {lab:<10} {n:>4} tokens: grid {a['ms']:8.0f} ms, page done {a['settled_ms']:8.0f} ms, "
                        f"grid frame {a['grid_bytes']:,} B, whole rerun {a['rerun_bytes']:,} B",
                        flush=True,
                    )
                if args.no_bertviz or n in bertviz_gave_up:
                    continue
                tr = lm.trace([text])[0]
                t = time.perf_counter()
                html = bertviz_page(tr)
                py_s = time.perf_counter() - t
                name = f"bertviz-{n}-{rep}.html"
                (tmp / name).write_text(html, encoding="utf-8")
                bertviz_bytes[n] = len(html.encode("utf-8"))
                del html, tr
                b = bertviz_trial(
                    bv_browser, static_url, name, n_layers * n_heads, guard, args.bertviz_timeout
                )
                b["python_s"] = py_s
                (tmp / name).unlink()
                bv_results[n].append(b)
                if b["ms"] is None:
                    bertviz_gave_up[n] = b["why"]
                    print(f"  {'bertviz':<10} {n:>4} tokens: {b['why']}", flush=True)
                    # a killed renderer can leave the browser unusable: start a fresh one
                    with contextlib.suppress(Exception):
                        bv_browser.close()
                    before = _chromium_pids()
                    bv_browser = harness.launch_chromium(pw)
                    guard.roots = [psutil.Process(p) for p in _chromium_pids() - before]
                else:
                    print(
                        f"  {'bertviz':<10} {n:>4} tokens: drawn {b['ms']:8.0f} ms (+{py_s:.1f} s python), "
                        f"browser peak {b['peak_mb']:,.0f} MB",
                        flush=True,
                    )
        for lab, (_, _, rss) in apps.items():
            server_peak[lab] = rss.peak_mb
        with contextlib.suppress(Exception):
            bv_browser.close()
        app_browser.close()
    load1 = os.getloadavg()

    print()
    print(
        f"# browser time to interactive, MiniLM ({n_layers} layers x {n_heads} heads), median of {args.repeats}"
    )
    print(f"# {platform.machine()}, {os.cpu_count()} cores, load average {load0[0]:.2f} -> {load1[0]:.2f}")
    print(f"{'':>16}{'grid drawn s':>13}{'page done s':>12}{'grid B/value':>13}{'bertviz ÷ this':>16}")
    summary: dict = {"load": [load0, load1], "apps": {}, "bertviz": {}}
    for n in args.lengths:
        values = n_layers * n_heads * n * n
        b_ms = _median([r["ms"] for r in bv_results[n]])
        for lab in labels:
            rs = results[lab][n]
            a_ms, a_done = _median([r["ms"] for r in rs]), _median([r["settled_ms"] for r in rs])
            a_bpv = _median([r["grid_bytes"] for r in rs]) / values
            ratio = f"{b_ms / a_ms:15.1f}x" if b_ms is not None else f"{'—':>16}"
            print(f"{n:>5} {lab:<10}{a_ms / 1000:13.2f}{a_done / 1000:12.2f}{a_bpv:13.2f}{ratio}")
            summary["apps"].setdefault(lab, {})[n] = {
                "grid_ms": a_ms,
                "settled_ms": a_done,
                "bytes_per_value": a_bpv,
                "raw": rs,
            }
        if not args.no_bertviz:
            b_bpv = bertviz_bytes.get(n, 0) / values
            b_txt = f"{b_ms / 1000:13.2f}" if b_ms is not None else f"{'not drawn':>13}"
            print(f"{n:>5} {'bertviz':<10}{b_txt}{'':>12}{b_bpv:13.1f}")
            summary["bertviz"][n] = {
                "ms": b_ms,
                "bytes_per_value": b_bpv,
                "note": bertviz_gave_up.get(n),
                "raw": bv_results[n],
            }
    if args.moves:
        for lab in app_labels:
            ratios = ", ".join(
                f"{n} tokens {summary['apps'][lab + '+moves'][n]['grid_ms'] / summary['apps'][lab][n]['grid_ms']:.2f}x"
                for n in args.lengths
            )
            print(f"what-moves grid ÷ weight grid ({lab}): {ratios}")
    for n, why in bertviz_gave_up.items():
        print(f"bertviz at {n} tokens ({bertviz_bytes[n] / 2**20:,.0f} MB of HTML): {why}")
    print("streamlit server peak RSS: " + ", ".join(f"{lab} {mb:,.0f} MB" for lab, mb in server_peak.items()))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
