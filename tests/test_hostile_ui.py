"""Hostile and odd input through the dashboard (Streamlit AppTest): a clear message, never an exception.

Every input below goes through the sidebar, as a user would type it, into a character-level
seq2seq model (most of these characters are outside its vocabulary) and into MiniLM (WordPiece
reads anything). Each must give either the page drawn from the input or one clear message (an
error or warning naming the problem), never an exception, and the next ordinary input must work
again. Injected HTML must stay text wherever a token or the input is rendered: Plotly labels
(escaped, so plotly.js shows "<" instead of reading a tag), bertviz's page (JSON with "<" written
as \\u003c), markdown (no element allows HTML with the input in it), tables, and a model card.

The real-browser side (several sessions at once, one of them hostile, no dialog and no injected
element in the DOM) is tests/test_load.py; paths outside the allowed folders and broken model
folders through the path box are tests/test_app_real_models.py; the CLI is tests/test_hostile_cli.py.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import streamlit as st
from apptest_helpers import APP, HAS_MINILM, figures, run_app
from streamlit.testing.v1 import AppTest

from attnscope.dashboard import keys as K

PAGES_DIR = APP.parent / "app_pages"
TIMEOUT = 90

INJECTIONS = {
    "img": "<img src=x onerror=alert(1)>",
    "script": "</script><script>alert(1)</script>",
}
ODD = {
    "empty": "",
    "whitespace": " \t   ",
    "huge": ("attention is all you need " * 4000)[:100_000],
    "control": "ab\x00\x07\x1b[31mc\x7f\u200b\u202ed",
    "emoji": "hi 👋🏽 👩‍👩‍👧 there",
    "combining": "e\u0301 n\u0303 a\u0308\u0301",
    "rtl": "שלום עולם مرحبا بالعالم",
}
RAW_HTML = re.compile(r"<\s*(img|script|/script)", re.IGNORECASE)


def all_pages() -> list[str]:
    return sorted(f"app_pages/{p.name}" for p in PAGES_DIR.glob("*.py") if p.name != "__init__.py")


@pytest.fixture()
def app_env(monkeypatch, extra_models):
    st.cache_data.clear()
    st.cache_resource.clear()
    return extra_models


def send(at: AppTest, text: str) -> AppTest:
    """Type ``text`` into the sidebar (neither box limits its length: a long text is truncated to
    the model's limit with a warning on the page, never cut silently in the browser)."""
    if at.session_state[K.BATCH]:
        at.sidebar.text_area(key=K.SOURCES).input(text).run()
    else:
        box = at.sidebar.text_input(key=K.SOURCE)
        assert not box.proto.max_chars
        box.input(text).run()
    return at


def messages(at: AppTest) -> list[str]:
    return [e.value for e in at.error] + [w.value for w in at.warning]


def assert_no_raw_html(at: AppTest, where: str) -> None:
    """No place that renders HTML holds the input's tags literally."""
    for fig in figures(at):
        text = json.dumps(fig, ensure_ascii=False)
        assert not RAW_HTML.search(text), (where, RAW_HTML.search(text).group(0), fig["layout"].get("title"))
    for md in at.get("markdown") + at.get("caption"):
        if getattr(md.proto, "allow_html", False):
            assert not RAW_HTML.search(md.proto.body), (where, md.proto.body[:200])
    for frame in at.get("iframe"):
        doc = frame.proto.srcdoc
        for script in re.findall(r"<script[^>]*>(.*?)</script>", doc, flags=re.DOTALL):
            assert "alert(1)" not in script or "\\u003c" in script, where  # tokens only as escaped JSON
        body = re.sub(r"<script[^>]*>.*?</script>", "", doc, flags=re.DOTALL)
        assert "onerror" not in body and "alert(1)" not in body, where
    for h in at.get("html"):  # the app's own scripts (links: the address bar) hold the input as escaped JSON
        body = getattr(h.proto, "body", "")
        for script in re.findall(r"<script[^>]*>(.*?)</script>", body, flags=re.DOTALL):
            assert not RAW_HTML.search(script), (where, script[:200])
        assert not RAW_HTML.search(re.sub(r"<script[^>]*>.*?</script>", "", body, flags=re.DOTALL)), where


def assert_answered(at: AppTest, text: str, where: str) -> str:
    """The page either drew something from the input or said clearly why not. Returns which."""
    assert not at.exception, (where, [e.value for e in at.exception])
    msgs = messages(at)
    if figures(at) or at.get("iframe"):
        return "drawn"
    assert msgs, (where, "neither a chart nor a message")
    assert all(len(m) < 600 and "Traceback" not in m for m in msgs), (where, msgs)
    return "message"


def models_under_test(extra_models) -> list[str]:
    return [extra_models[0]] + (["minilm"] if HAS_MINILM else [])


# -- odd text -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(ODD))
def test_odd_text_gets_a_drawing_or_a_clear_message(app_env, case):
    text = ODD[case]
    for model in models_under_test(app_env):
        at = run_app(model, timeout=TIMEOUT)
        pages = ["app_pages/attention.py", "app_pages/decoding.py"]
        if case != "huge":  # the masks page at 512 tokens takes seconds (per-cell hover text)
            pages.append("app_pages/masks.py")
        for page in pages:
            at.switch_page(page).run()
            send(at, text)
            outcome = assert_answered(at, text, f"{model} {page} {case}")
            msgs = " ".join(messages(at))
            if not text.strip():
                assert outcome == "message" and "empty" in msgs, msgs
            if case == "huge" and outcome == "drawn":
                assert "truncated" in msgs, msgs  # the page says it cut the input
        # and the next ordinary input works again
        at.switch_page("app_pages/attention.py").run()
        send(at, "hello world")
        assert not at.exception and not at.error and figures(at), [e.value for e in at.error]


def test_100000_characters_in_the_batch_box(app_env):
    for model in models_under_test(app_env):
        at = run_app(model, timeout=TIMEOUT, **{K.BATCH: True})
        send(at, ODD["huge"] + "\nhello")
        assert_answered(at, ODD["huge"], model)
        msgs = messages(at)
        assert figures(at) and any("Input 1" in m and "truncated" in m for m in msgs), msgs


def test_whitespace_and_empty_lines_in_a_batch(app_env):
    at = run_app(app_env[0], timeout=TIMEOUT, **{K.BATCH: True})
    send(at, "hello\n   \nworld")
    assert not at.exception
    assert any("Line 2" in m and "empty" in m for m in messages(at)), messages(at)
    send(at, "\n\n\n")
    assert any("empty" in m for m in messages(at)), messages(at)


def test_a_batch_of_1000_lines_is_refused_with_the_limit(app_env):
    for model in models_under_test(app_env):
        at = run_app(model, timeout=TIMEOUT, **{K.BATCH: True})
        send(at, "\n".join(f"hello {i % 10}" for i in range(1000)))
        assert not at.exception
        errs = [e.value for e in at.error]
        assert len(errs) == 1 and "1000 inputs" in errs[0] and "64" in errs[0], errs
        send(at, "hello\nworld")  # a normal batch right after
        assert not at.exception and not at.error and figures(at)


def test_a_trace_beyond_the_memory_budget_is_refused_in_the_page(app_env, monkeypatch):
    from attnscope.core.families import native as runner

    monkeypatch.setattr(runner, "MAX_TRACE_MB", 1)  # as ATTNSCOPE_MAX_TRACE_MB=1 would
    for model in models_under_test(app_env):
        at = run_app(model, timeout=TIMEOUT, **{K.BATCH: True})
        send(at, "\n".join(["attention is all you need " * 2] * 40))
        errs = [e.value for e in at.error]
        assert not at.exception and len(errs) == 1, errs
        assert "MB of attention maps" in errs[0] and "limit is 1 MB" in errs[0], errs


def test_the_limits_are_stated_in_the_sidebar_and_match_what_a_run_costs(app_env):
    """The sidebar says the token limit, the MB budget of attention maps and what the model's longest
    input needs; that figure is what a trace of that length really holds (probs and scores)."""
    from attnscope.core.families import native as runner
    from attnscope.dashboard import model_facts
    from attnscope.dashboard.trace_cache import nbytes
    from attnscope.models import registry

    for model in models_under_test(app_env):
        at = run_app(model, timeout=TIMEOUT)
        lm = registry.load(model)
        line = next((c.value for c in at.sidebar.caption if "attention maps per run" in c.value), "")
        assert f"At most {lm.max_src_tokens:,} tokens" in line and f"{runner.MAX_TRACE_MB:,} MB" in line, line
        mb = model_facts.maps_mb(lm, lm.max_src_tokens)
        assert f"needs about {mb:,.0f} MB" in line, line
        if lm.arch == "encoder":  # one input of the longest length: the maps it holds
            words = " ".join(["hello"] * (lm.max_src_tokens + 50))
            tr = lm.trace([words], truncate=True)[0]
            held = nbytes([tr.enc_self, tr.enc_self_scores]) / 2**20
            assert abs(held - model_facts.maps_mb(lm, tr.enc_self.shape[-1])) < 0.01 * held, (held, mb)


# -- injection -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(INJECTIONS))
def test_injected_html_stays_text_on_every_page(app_env, case):
    text = INJECTIONS[case]
    for model in models_under_test(app_env):
        at = run_app(model, timeout=TIMEOUT)
        send(at, text)
        drawn = 0
        for page in all_pages():
            at.switch_page(page).run()
            where = f"{model} {page} {case}"
            drawn += assert_answered(at, text, where) == "drawn"
            assert_no_raw_html(at, where)
        assert drawn >= 3, f"{model}: too few pages drew the injected input"
        at.switch_page("app_pages/attention.py").run()
        labels = [t for f in figures(at) for t in (f["layout"].get("xaxis", {}).get("ticktext") or [])]
        assert any("&lt;" in t for t in labels), labels[:20]  # "<" shown, escaped for plotly


def test_injected_model_card_and_summary_stay_text(app_env, tiny_folder, tmp_path, monkeypatch):
    evil = shutil.copytree(tiny_folder, tmp_path / "evil-card")
    meta = json.loads((evil / "meta.json").read_text())
    meta["summary"] = INJECTIONS["img"]
    meta["examples"] = [INJECTIONS["script"]]
    (evil / "meta.json").write_text(json.dumps(meta))
    (evil / "card.md").write_text(
        f"# evil\n\n{INJECTIONS['img']}\n\n{INJECTIONS['script']}\n\n[click](javascript:alert(1))\n"
    )
    monkeypatch.setenv("ATTNSCOPE_MODELS", str(evil))
    at = run_app(str(evil), timeout=TIMEOUT)
    for page in all_pages():
        at.switch_page(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert_no_raw_html(at, page)
        for md in at.get("markdown"):
            if INJECTIONS["img"] in md.proto.body or "javascript:" in md.proto.body:
                assert not md.proto.allow_html, page  # markdown shows HTML as text, drops javascript: links


# -- server defaults -------------------------------------------------------------------------------------


def test_server_defaults_fit_a_laptop():
    """Bound to localhost, XSRF protection on, uploads and messages limited (dashboard/server.toml, which
    the installed package carries and the repository's .streamlit/config.toml links to)."""
    import tomllib

    from streamlit import config as st_config

    root = APP.parents[1]
    cfg = tomllib.loads((root / "dashboard" / "server.toml").read_text(encoding="utf-8"))
    assert (root / ".streamlit" / "config.toml").resolve() == (root / "dashboard" / "server.toml").resolve()
    server = cfg["server"]
    assert server["address"] == "127.0.0.1"
    assert server["enableXsrfProtection"] is True and server["enableCORS"] is True
    assert 0 < server["maxUploadSize"] <= 64 and 0 < server["maxMessageSize"] <= 200
    assert cfg["browser"]["gatherUsageStats"] is False
    known = st_config.get_config_options()
    for section, values in cfg.items():  # every key is a real Streamlit option (no silent typo)
        for key in values:
            assert f"{section}.{key}" in known, f"{section}.{key}"
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^ADDRESS \?= 127\.0\.0\.1$", makefile, flags=re.MULTILINE)
