"""Many users at once: N concurrent browser sessions against one real attnscope server.

    python -m bench.load [--sessions 10] [--seconds 60] [--models reverse sort minilm ...]
                         [--threads default 1]

Starts ``streamlit run dashboard/app.py`` on a free port, opens N chromium pages, each in its
own browser context (its own Streamlit session), each with its own model (round robin over
--models) and its own inputs, and for --seconds sends a new input, waits until the all-heads
grid is redrawn, and checks that the grid's query labels are the tokens of *its own* input
and that the page shows no exception or error. Reports p50/p95 response time (Enter ->
grid drawn, in-page clock), errors, isolation failures and the server's peak RSS.
``--threads`` runs the whole load once per torch intra-op thread setting of the server
(``app``: the app's default, half the cores; a number: ATTNSCOPE_TORCH_THREADS), so
oversubscription shows up as a side-by-side comparison. ``--think MIN MAX``: each user waits that
long before typing the next input (0 0: back to back, a stress test).

tests/test_load.py runs ``run_load`` with 10 sessions for a bounded time in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import harness

GRID_Y_JS = """() => {
    const gd = [...document.querySelectorAll('.js-plotly-plot')]
        .find(g => (g.querySelector('.gtitle') || {}).textContent?.includes('click a tile'));
    return gd ? [...gd.data[0].y] : null;
}"""
ERRORS_JS = """() => [...document.querySelectorAll('[data-testid="stException"], [data-testid="stAlertContentError"]')]
    .map(e => e.innerText.slice(0, 300))"""


@dataclass
class SessionPlan:
    model: str  # what the picker holds: a registry name or a folder path
    label: str  # how the picker shows it (a folder: its name)
    make_input: object  # (rng) -> text
    expected: object  # (text) -> list of grid query labels for layer 0
    default: str = ""  # the model's first example: what the input box holds before a user types
    examples: tuple[str, ...] = ()  # every example the sidebar offers (a page that starts over shows one)


@dataclass
class LoadResult:
    sessions: int
    seconds: float
    times_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    mixups: list[str] = field(default_factory=list)  # a session saw tokens that are not its input's
    # a session whose grid showed its model's default example instead of its input (its page restarted
    # with the examples under load), answered when the input was sent once more
    resets: list[str] = field(default_factory=list)
    # a session whose page did not answer an input within the timeout (grid not redrawn, or still
    # running or stale), with what the page showed; it was reloaded, and a second stall is an error
    stalls: list[str] = field(default_factory=list)
    requests: int = 0
    peak_rss_mb: float = 0.0
    rss_start_mb: float = 0.0
    rss_end_mb: float = 0.0
    per_model: dict = field(default_factory=dict)
    hostile: list[dict] = field(default_factory=list)  # what the hostile session did and saw
    open_s: float = 0.0  # time to open every session (first page, model picked, grid drawn)
    server_cpu_s: float = 0.0  # CPU time the server used during the run
    browser_cpu_s: float = 0.0  # ... and the chromium processes driving it (same machine)

    def pct(self, q: float) -> float:
        xs = sorted(self.times_ms)
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs)) - 1))]

    def summary(self) -> str:
        p50, p95 = self.pct(50), self.pct(95)
        return (
            f"{self.sessions} sessions (opened in {self.open_s:.0f} s), {self.seconds:.0f} s: "
            f"{self.requests} inputs answered, "
            f"p50 {p50:.0f} ms, p95 {p95:.0f} ms, max {max(self.times_ms, default=float('nan')):.0f} ms; "
            f"errors {len(self.errors)}, mix-ups {len(self.mixups)}, restarts {len(self.resets)}, stalls {len(self.stalls)}; server RSS {self.rss_start_mb:.0f} MB at start, "
            f"peak {self.peak_rss_mb:.0f} MB, {self.rss_end_mb:.0f} MB at the end; CPU s: server "
            f"{self.server_cpu_s:.0f}, browsers {self.browser_cpu_s:.0f}"
        )


def plan_for(name: str) -> SessionPlan:
    """How a session using model ``name`` makes inputs (within the model's vocabulary) and what it expects."""
    from attnscope.dashboard import loaders
    from attnscope.dashboard.plots.common import token_label
    from attnscope.models import registry

    lm = registry.load(name)
    examples = [e for e in loaders.examples(lm, 5) if e.strip()]
    char_level = getattr(lm.src_tok, "kind", "") == "char"
    words = sorted({w for e in examples for w in e.split()})
    limit = min(lm.max_src_tokens, 40)

    def make_input(rng: random.Random) -> str:
        if char_level:
            chars = list(rng.choice(examples))
            rng.shuffle(chars)
            text = "".join(chars)[:limit]
            return text if text.strip() else examples[0]
        return " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))

    def expected(text: str) -> list[str]:
        ids = lm.prepare(text, truncate=True).ids
        return [f"layer 0 · query {i} {token_label(t)}" for i, t in enumerate(lm.src_tok.tokens(ids))]

    return SessionPlan(
        name,
        loaders.display_name(name),
        make_input,
        expected,
        examples[0] if examples else "",
        tuple(examples),
    )


class _Start:
    """Every session opens its page first; the timed load starts when all are open (or failed)."""

    def __init__(self, n: int, seconds: float):
        self.n, self.seconds, self.opened = n, seconds, 0
        self.event = asyncio.Event()
        self.deadline = 0.0
        self.started = 0.0

    def ready(self) -> None:
        self.opened += 1
        if self.opened == self.n:
            self.started = time.monotonic()
            self.deadline = self.started + self.seconds
            self.event.set()


# Opening: every session loads the app at once (on 2 cores, 11 tabs parse Streamlit's bundle and run
# two page runs each: 40-100 s); what is measured starts when all are open. Inputs: timeout_ms.
OPEN_TIMEOUT_MS = 120_000


async def _open_page(page, url: str, plan: SessionPlan) -> None:
    """Load the app in ``page``, pick the session's model, wait until its grid is drawn and settled."""
    import re

    await page.goto(url, timeout=OPEN_TIMEOUT_MS)
    await page.wait_for_selector(harness.MODEL_PICKER, timeout=OPEN_TIMEOUT_MS)
    await page.locator(harness.MODEL_PICKER).first.click()
    await page.get_by_role("option", name=re.compile(rf"^{re.escape(plan.label)}( \(|( ·|$))")).first.click()
    await page.wait_for_function(harness.GRID_STATE_JS, timeout=OPEN_TIMEOUT_MS)
    await page.wait_for_function(harness.SETTLED_JS, timeout=OPEN_TIMEOUT_MS)


async def _session(
    browser,
    url: str,
    idx: int,
    plan: SessionPlan,
    start: _Start,
    res: LoadResult,
    timeout_ms: int,
    think: tuple[float, float],
) -> None:
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    context = await browser.new_context(viewport={"width": 1300, "height": 1000})
    page = await context.new_page()
    page.set_default_timeout(OPEN_TIMEOUT_MS)  # clicks and fills on a busy machine (waits: their own)
    rng = random.Random(1000 + idx)
    counted = stalled = False
    stage = "opening the page"  # named in the error if a wait times out
    try:
        await _open_page(page, url, plan)
        box = page.locator(harness.SIDEBAR_INPUT).first
        counted = True
        stage = "waiting for the others to open"
        start.ready()
        await start.event.wait()
        while time.monotonic() < start.deadline:
            if think[1] > 0:  # a user reads the page before typing the next input
                await asyncio.sleep(rng.uniform(*think))
            text = plan.make_input(rng)
            if text == await box.input_value():
                continue
            await box.fill(text)
            await page.evaluate(harness.MARK_JS)
            await box.press("Enter")
            stage = f"waiting for the grid of {text!r}"
            try:
                handle = await page.wait_for_function(harness.WAIT_GRID_JS, timeout=timeout_ms, polling=50)
                ms = float(await handle.json_value())
                stage = f"waiting for the page to settle after {text!r}"
                await page.wait_for_function(harness.SETTLED_JS, timeout=timeout_ms)
            except PlaywrightTimeout:
                # the page did not answer within timeout_ms: reported as a stall with what the page
                # showed, and the user reloads it (a second stall of this session is an error)
                if stalled:
                    raise
                stalled = True
                res.stalls.append(f"session {idx} ({plan.label}), {stage}: page {await _page_state(page)}")
                stage = "reloading the page after a stall"
                await _open_page(page, url, plan)
                box = page.locator(harness.SIDEBAR_INPUT).first
                continue
            errors = await page.evaluate(ERRORS_JS)
            if errors:
                res.errors.append(f"session {idx} ({plan.label}) input {text!r}: {errors[0]}")
                continue
            labels = [y for y in (await page.evaluate(GRID_Y_JS) or []) if y.startswith("layer 0 · ")]
            want = plan.expected(text)
            if labels != want and any(
                labels == plan.expected(e) for e in (plan.default, *plan.examples) if e
            ):
                res.resets.append(
                    f"session {idx} ({plan.label}) sent {text!r}, grid showed the default example"
                )
                await box.fill(text)  # the page started over with its examples: the user types again
                await page.evaluate(harness.MARK_JS)
                await box.press("Enter")
                await page.wait_for_function(harness.WAIT_GRID_JS, timeout=timeout_ms, polling=50)
                await page.wait_for_function(harness.SETTLED_JS, timeout=timeout_ms)
                labels = [y for y in (await page.evaluate(GRID_Y_JS) or []) if y.startswith("layer 0 · ")]
            if labels != want:
                res.mixups.append(
                    f"session {idx} ({plan.label}) sent {text!r} ({len(want)} queries), grid shows "
                    f"{len(labels)} queries: {labels[:6]}…"
                )
            res.times_ms.append(ms)
            res.per_model.setdefault(plan.label, []).append(ms)
            res.requests += 1
    except Exception as exc:  # a timeout or a crash is an error of this session
        res.errors.append(
            f"session {idx} ({plan.label}), {stage}: {type(exc).__name__}: {str(exc)[:200]}"
            f" (page: {await _page_state(page)})"
        )
    finally:
        if not counted:
            start.ready()
        await context.close()


PAGE_STATE_JS = """() => ({
    stale: document.querySelectorAll('[data-stale="true"]').length,
    running: !!document.querySelector('[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]'),
    status: (document.querySelector('[data-testid="stStatusWidget"]') || {}).innerText || '',
    alerts: [...document.querySelectorAll('[data-testid="stAlert"]')].map(e => e.innerText.slice(0, 120)),
})"""


async def _page_state(page) -> str:
    """What a page showed when a wait on it failed (stale elements, running, status text), for the report."""
    try:
        return json.dumps(await page.evaluate(PAGE_STATE_JS))
    except Exception as exc:  # the page itself is gone
        return f"unreadable: {type(exc).__name__}"


# -- one hostile user among them ----------------------------------------------------------------------

STATE_JS = (
    """() => ({
    grid: ("""
    + harness.GRID_STATE_JS
    + """)(),
    alerts: [...document.querySelectorAll('[data-testid="stAlert"]')].map(e => e.innerText).join(' | '),
    exc: document.querySelectorAll('[data-testid="stException"]').length,
})"""
)
CHANGED_JS = (
    """s0 => { const s = ("""
    + STATE_JS
    + """)();
    return s.grid !== s0.grid || s.alerts !== s0.alerts || s.exc > 0; }"""
)
INJECTED_JS = """() => document.querySelectorAll('img[src="x"]').length
    + [...document.scripts].filter(s => s.text.trim() === 'alert(1)').length"""  # what the payloads would add
BATCH_TOGGLE = "Batch: several inputs, one per line"
BATCH_BOX = '[data-testid="stSidebar"] textarea[aria-label="Inputs (one per line)"]'
PATH_BOX = '[data-testid="stSidebar"] input[aria-label="Folder, weights file, adapter file or cached Hugging Face name"]'


def hostile_steps(bad_folder: str | None = None) -> list[tuple[str, str, str]]:
    """(name, how, payload): how is 'text' (the input box), 'batch' (the batch box) or 'path'."""
    steps = [
        ("img tag in the input", "text", "<img src=x onerror=alert(1)>"),
        ("script end in the input", "text", "</script><script>alert(1)</script>"),
        ("control characters", "text", "ab\x07\x1b[31mc\u200b\u202ed"),
        ("emoji, combining marks, right-to-left", "text", "hi 👋🏽 👩‍👩‍👧 e\u0301 שלום مرحبا"),
        ("whitespace only", "text", "   \t  "),
        ("100,000 characters", "text", ("attention is all you need " * 4000)[:100_000]),
        ("4,000 characters (the most the box takes)", "text", ("attention is all you need " * 200)[:4000]),
        ("a batch of 1,000 lines", "batch", "\n".join(f"hello {i}" for i in range(1000))),
        ("a path outside the allowed folders", "path", "/etc"),
        ("a path with ..", "path", "../../../../etc/passwd"),
    ]
    if bad_folder:
        steps.append(("a truncated safetensors file", "path", bad_folder))
    return steps


async def _hostile_session(
    browser,
    url: str,
    plan: SessionPlan,
    start: _Start,
    res: LoadResult,
    timeout_ms: int,
    steps: list[tuple[str, str, str]],
) -> None:
    """Opens like the others, then sends each hostile step.

    Every step must end in a drawn grid or a clear message (an error/warning alert), never an
    exception box, a dialog or an element the input injected; after a message, an ordinary input
    must draw its own grid again.
    """
    context = await browser.new_context(viewport={"width": 1300, "height": 1000})
    page = await context.new_page()
    page.set_default_timeout(OPEN_TIMEOUT_MS)  # clicks and fills on a busy machine (waits: their own)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), asyncio.ensure_future(d.dismiss())))
    rng = random.Random(7)
    counted = False

    async def settle(s0) -> dict:
        await page.wait_for_function(CHANGED_JS, arg=s0, timeout=timeout_ms, polling=100)
        await page.wait_for_function(harness.SETTLED_JS, timeout=timeout_ms, polling=100)
        await asyncio.sleep(0.3)
        return await page.evaluate(STATE_JS)

    async def injected() -> int:
        n = 0
        for frame in page.frames:
            try:
                n += await frame.evaluate(INJECTED_JS)
            except Exception:  # a frame that went away
                pass
        return n

    try:
        await _open_page(page, url, plan)
        counted = True
        start.ready()
        await start.event.wait()
        box = page.locator(harness.SIDEBAR_INPUT).first
        for name, how, payload in steps:
            t0 = time.monotonic()
            s0 = await page.evaluate(STATE_JS)
            if how == "text":
                before = await box.input_value()
                await box.fill(payload)
                if len(payload) > 4000 and await box.input_value() == before:
                    # Streamlit's box (max_chars=4000) refuses a longer paste: nothing is sent
                    res.hostile.append(
                        {
                            "step": name,
                            "outcome": "refused by the box (max_chars)",
                            "ok": not dialogs,
                            "message": "",
                            "seconds": 0.0,
                        }
                    )
                    continue
                await box.press("Enter")
            elif how == "batch":
                await page.get_by_text(BATCH_TOGGLE).click()
                await page.wait_for_selector(BATCH_BOX, timeout=timeout_ms)
                await page.wait_for_function(harness.SETTLED_JS, timeout=timeout_ms)
                s0 = await page.evaluate(STATE_JS)
                await page.locator(BATCH_BOX).fill(payload)
                await page.locator(BATCH_BOX).press("Control+Enter")
            else:
                details = page.locator('[data-testid="stSidebar"] details', has_text="Your own model").first
                for attempt in range(6):  # the expander closes on other reruns, with an animation
                    if not await details.evaluate("d => d.open"):
                        await page.get_by_text("Your own model").first.click()
                    await asyncio.sleep(0.5)
                    try:
                        await page.locator(PATH_BOX).fill(payload, timeout=3000)
                        break
                    except Exception:
                        if attempt == 5:
                            raise
                await page.locator(PATH_BOX).press("Enter")
                await page.get_by_role("button", name="Load", exact=True).click()
            state = await settle(s0)
            outcome = (
                "exception"
                if state["exc"]
                else (
                    "message"
                    if state["alerts"] and state["alerts"] != s0["alerts"]
                    else "drawn"
                    if state["grid"] and state["grid"] != s0["grid"]
                    else "nothing"
                )
            )
            step = {
                "step": name,
                "outcome": outcome,
                "message": state["alerts"][:300],
                "seconds": round(time.monotonic() - t0, 2),
                "dialogs": list(dialogs),
                "injected": await injected(),
            }
            if how == "batch":  # back to one input
                await page.get_by_text(BATCH_TOGGLE).click()
                await page.wait_for_selector(harness.SIDEBAR_INPUT, timeout=timeout_ms)
                await page.wait_for_function(harness.SETTLED_JS, timeout=timeout_ms)
            if outcome == "drawn" and not step["dialogs"] and not step["injected"]:
                step["recovered"] = step["ok"] = True  # it drew: nothing to recover from
                res.hostile.append(step)
                continue
            # an ordinary input right after: the grid comes back
            text = plan.make_input(rng)
            await box.fill(text)
            await page.evaluate(harness.MARK_JS)
            await box.press("Enter")
            await page.wait_for_function(harness.WAIT_GRID_JS, timeout=timeout_ms, polling=100)
            await page.wait_for_function(harness.SETTLED_JS, timeout=timeout_ms, polling=100)
            labels = [y for y in (await page.evaluate(GRID_Y_JS) or []) if y.startswith("layer 0 · ")]
            step["recovered"] = labels == plan.expected(text)
            step["ok"] = (
                outcome in ("drawn", "message")
                and not step["dialogs"]
                and not step["injected"]
                and step["recovered"]
            )
            res.hostile.append(step)
    except Exception as exc:
        res.hostile.append(
            {"step": "session", "ok": False, "outcome": f"{type(exc).__name__}: {str(exc)[:2000]}"}
        )
    finally:
        if not counted:
            start.ready()
        await context.close()


async def _drive(
    url: str,
    plans: list[SessionPlan],
    seconds: float,
    res: LoadResult,
    timeout_ms: int,
    think: tuple[float, float],
    hostile: tuple[SessionPlan, list] | None = None,
) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(harness.CHROMIUM), args=harness.CHROMIUM_ARGS)
        try:
            start = _Start(len(plans) + (hostile is not None), seconds)  # the clock starts once all are open
            tasks = [
                asyncio.create_task(_session(browser, url, i, plan, start, res, timeout_ms, think))
                for i, plan in enumerate(plans)
            ]
            if hostile is not None:
                tasks.append(
                    asyncio.create_task(
                        _hostile_session(browser, url, hostile[0], start, res, timeout_ms, hostile[1])
                    )
                )
            t0 = time.monotonic()
            await start.event.wait()
            res.open_s = time.monotonic() - t0
            await asyncio.gather(*tasks)
            res.seconds = time.monotonic() - start.started if start.started else 0.0
        finally:
            await browser.close()


def run_load(
    models: list[str],
    sessions: int = 10,
    seconds: float = 60.0,
    env: dict[str, str] | None = None,
    timeout_ms: int = 60_000,
    log: Path | None = None,
    think: tuple[float, float] = (0.0, 0.0),
    hostile_model: str | None = None,
    bad_folder: str | None = None,
) -> LoadResult:
    """Start the app, run ``sessions`` concurrent sessions (models round robin) for about ``seconds``,
    each waiting a random ``think`` (min, max) seconds before each new input. ``hostile_model``: one
    more session on that model sends hostile_steps(bad_folder) meanwhile (see _hostile_session)."""
    plans_by_model = {m: plan_for(m) for m in models}
    plans = [plans_by_model[models[i % len(models)]] for i in range(sessions)]
    hostile = None
    if hostile_model:
        hostile = (plans_by_model.get(hostile_model) or plan_for(hostile_model), hostile_steps(bad_folder))
    res = LoadResult(sessions, seconds)
    import psutil

    with harness.app_server(env=env, log=log) as (url, proc), harness.RssSampler(proc.pid) as rss:
        res.rss_start_mb = rss.sample()
        server = psutil.Process(proc.pid)
        cpu0 = sum(server.cpu_times()[:2])
        me = psutil.Process()
        browsers: dict[int, float] = {}

        def sample_browsers() -> None:  # chromium's CPU time, remembered before its processes exit
            for p in me.children(recursive=True):
                try:
                    if "chrom" in p.name().lower():
                        browsers[p.pid] = sum(p.cpu_times()[:2])
                except psutil.Error:
                    pass

        async def sampled() -> None:
            async def sampler():
                while True:
                    sample_browsers()
                    await asyncio.sleep(1.0)

            task = asyncio.create_task(sampler())
            try:
                await _drive(url, plans, seconds, res, timeout_ms, think, hostile)
            finally:
                task.cancel()

        asyncio.run(sampled())
        res.server_cpu_s = sum(server.cpu_times()[:2]) - cpu0
        res.browser_cpu_s = sum(browsers.values())
        res.rss_end_mb = rss.sample()
        res.peak_rss_mb = max(rss.peak_mb, res.rss_end_mb)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--models", nargs="+", default=None, help="default: the zoo and minilm")
    ap.add_argument(
        "--threads",
        nargs="+",
        default=["app"],
        help="server torch threads per forward pass: 'app' (the app's default: half the cores) "
        "or a number (ATTNSCOPE_TORCH_THREADS)",
    )
    ap.add_argument(
        "--hostile",
        action="store_true",
        help="one more session (MiniLM if installed) sends hostile input meanwhile",
    )
    ap.add_argument(
        "--think",
        type=float,
        nargs=2,
        default=[0.0, 0.0],
        metavar=("MIN", "MAX"),
        help="seconds each user waits before the next input (default 0 0: back to back)",
    )
    args = ap.parse_args()
    problem = harness.chromium_problem()
    if problem:
        raise SystemExit(problem)
    from attnscope.models import registry

    models = args.models or registry.all_names()
    print(
        f"# load: {args.sessions} sessions x {args.seconds:.0f} s, think {args.think[0]:g}-{args.think[1]:g} s, "
        f"models {models}; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}"
    )
    results = {}
    for threads in args.threads:
        env = {} if threads == "app" else {"ATTNSCOPE_TORCH_THREADS": threads}
        with tempfile.TemporaryDirectory() as tmp:
            hostile = ("minilm" if "minilm" in registry.all_names() else models[0]) if args.hostile else None
            res = run_load(
                models,
                args.sessions,
                args.seconds,
                env=env,
                log=Path(tmp) / "server.log",
                think=tuple(args.think),
                hostile_model=hostile,
            )
        results[threads] = res
        print(f"torch threads {threads:>4}: {res.summary()}")
        for m, ts in res.per_model.items():
            print(f"    {m:<10} n={len(ts):>4}  p50 {statistics.median(ts):7.0f} ms  p95 {_p95(ts):7.0f} ms")
        for e in (res.errors + res.mixups + res.stalls)[:10]:
            print("   ", e)
        for h in res.hostile:
            print(
                f"    hostile: {h['step']:<38} -> {h['outcome']:<8} {'ok' if h.get('ok') else 'FAILED'} "
                f"{h.get('seconds', '')}s  {h.get('message', '')[:90]!r}"
            )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def _p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(0.95 * len(xs)) - 1))]


if __name__ == "__main__":
    main()
