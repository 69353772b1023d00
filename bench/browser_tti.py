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

The two are interleaved (attnscope N, bertviz N, next N, ...) so both see the same machine load.
``--app`` points at another checkout's dashboard/app.py to measure a "before" version.
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
    from core.bertviz_adapter import bertviz_args, render_html

    args = bertviz_args(trace, view="model", max_tokens=10**9, max_cells=10**15)
    html = render_html(args)
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


def bertviz_trial(browser, base_url: str, name: str, n_thumbs: int, guard: MemoryGuard, timeout_s: float) -> dict:
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
        ws.on("framereceived", lambda payload: self.frames.append(
            payload if isinstance(payload, bytes) else payload.encode("utf-8")))


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
    ap.add_argument("--app", type=Path, default=harness.APP, help="dashboard/app.py of the checkout to measure")
    ap.add_argument("--bertviz-max-mb", type=float, default=6000, help="stop bertviz's renderer above this RSS")
    ap.add_argument("--bertviz-timeout", type=float, default=180, help="seconds to wait for bertviz to draw")
    ap.add_argument("--timeout", type=float, default=180, help="seconds to wait for attnscope's grid")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    problem = harness.chromium_problem()
    if problem:
        raise SystemExit(problem)

    import torch
    from playwright.sync_api import sync_playwright

    from models import registry

    torch.set_num_threads(1)
    lm = registry.load("minilm")
    n_layers, n_heads = lm.cfg.n_enc_layers, lm.cfg.n_heads
    words = harness.one_piece_words(lm.src_tok)
    load0 = os.getloadavg()
    results: dict[int, dict[str, list]] = {n: {"a": [], "b": []} for n in args.lengths}
    bertviz_bytes: dict[int, int] = {}
    bertviz_gave_up: dict[int, str] = {}
    server_peak = 0.0

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        tmp = Path(tmp)
        shutil.copytree(VENDOR, tmp / "vendor")
        before = _chromium_pids()
        bv_browser = harness.launch_chromium(pw)
        bv_main = {p for p in _chromium_pids() - before}
        app_browser = harness.launch_chromium(pw)
        with (
            static_server(tmp) as static_url,
            harness.app_server(args.app, env={"OMP_NUM_THREADS": "1"}, log=tmp / "server.log") as (url, proc),
            harness.RssSampler(proc.pid) as server_rss,
            MemoryGuard(bv_main, args.bertviz_max_mb) as guard,
        ):
            page = app_browser.new_page(viewport={"width": 1400, "height": 1100})
            frames = FrameLog(page)
            harness.open_app(page, url, "minilm")
            for rep in range(args.repeats):
                for n in args.lengths:
                    text = harness.word_text(lm.src_tok, n, seed=7919 * rep + n, words=words)
                    a = attnscope_trial(page, frames, text, args.timeout)
                    results[n]["a"].append(a)
                    print(f"  attnscope {n:>4} tokens: grid {a['ms']:8.0f} ms, page done {a['settled_ms']:8.0f} ms, "
                          f"grid frame {a['grid_bytes']:,} B", flush=True)
                    if n in bertviz_gave_up:
                        continue
                    tr = lm.trace([text])[0]
                    t = time.perf_counter()
                    html = bertviz_page(tr)
                    py_s = time.perf_counter() - t
                    name = f"bertviz-{n}-{rep}.html"
                    (tmp / name).write_text(html, encoding="utf-8")
                    bertviz_bytes[n] = len(html.encode("utf-8"))
                    del html
                    b = bertviz_trial(bv_browser, static_url, name, n_layers * n_heads, guard, args.bertviz_timeout)
                    b["python_s"] = py_s
                    (tmp / name).unlink()
                    results[n]["b"].append(b)
                    if b["ms"] is None:
                        bertviz_gave_up[n] = b["why"]
                        print(f"  bertviz   {n:>4} tokens: {b['why']}", flush=True)
                        # a killed renderer can leave the browser unusable: start a fresh one
                        with contextlib.suppress(Exception):
                            bv_browser.close()
                        before = _chromium_pids()
                        bv_browser = harness.launch_chromium(pw)
                        guard.roots = [__import__("psutil").Process(p) for p in _chromium_pids() - before]
                    else:
                        print(f"  bertviz   {n:>4} tokens: drawn {b['ms']:8.0f} ms (+{py_s:.1f} s python), "
                              f"renderer peak {b['peak_mb']:,.0f} MB", flush=True)
            server_peak = server_rss.peak_mb
        with contextlib.suppress(Exception):
            bv_browser.close()
        app_browser.close()
    load1 = os.getloadavg()

    print()
    print(f"# browser time to interactive, MiniLM ({n_layers} layers x {n_heads} heads), median of {args.repeats}")
    print(f"# {platform.machine()}, {os.cpu_count()} cores, load average {load0[0]:.2f} -> {load1[0]:.2f}; "
          f"app: {args.app}")
    hdr = (f"{'tokens':>6} {'attnscope grid s':>17} {'page done s':>12} {'bertviz s':>10} {'speed-up':>9} "
           f"{'attnscope B/value':>18} {'bertviz B/value':>16}")
    print(hdr)
    summary = {}
    for n in args.lengths:
        values = n_layers * n_heads * n * n
        a_ms = _median([r["ms"] for r in results[n]["a"]])
        a_done = _median([r["settled_ms"] for r in results[n]["a"]])
        a_bpv = _median([r["grid_bytes"] for r in results[n]["a"]]) / values
        b_ms = _median([r["ms"] for r in results[n]["b"]])
        b_bpv = bertviz_bytes.get(n, 0) / values
        b_txt = f"{b_ms / 1000:10.2f}" if b_ms is not None else f"{'—':>10}"
        ratio = f"{b_ms / a_ms:8.1f}x" if b_ms is not None else f"{'—':>9}"
        print(f"{n:>6} {a_ms / 1000:17.2f} {a_done / 1000:12.2f} {b_txt} {ratio} {a_bpv:18.2f} {b_bpv:16.1f}")
        summary[n] = {"attnscope_ms": a_ms, "attnscope_settled_ms": a_done, "attnscope_bytes_per_value": a_bpv,
                      "bertviz_ms": b_ms, "bertviz_bytes_per_value": b_bpv,
                      "bertviz_note": bertviz_gave_up.get(n), "raw": results[n]}
    for n, why in bertviz_gave_up.items():
        print(f"bertviz at {n} tokens ({bertviz_bytes[n] / 2**20:,.0f} MB of HTML): {why}")
    print(f"streamlit server peak RSS: {server_peak:,.0f} MB")
    if args.json:
        args.json.write_text(json.dumps({"load": [load0, load1], "server_peak_mb": server_peak, "results": summary},
                                        indent=1, default=str))


if __name__ == "__main__":
    main()
