"""Links to a view (dashboard/links.py) under AppTest: the URL follows the clicks, a link rebuilds the
same picture in a fresh session, and hostile parameters get a message, never an exception, a path
load or code run. (The real-browser version, a fresh chromium context, is in test_browser_links.py.)

AppTest can switch pages only after a first run, so "a fresh session opened on this link" is a first
run followed by the link's parameters read as on a session's first run (``_open_link``).
"""

from __future__ import annotations

import pytest
from apptest_helpers import ANALYSIS_PAGES, PAGES, assert_no_exception, figure, run_app
from streamlit.testing.v1 import AppTest

from attnscope.dashboard import keys as K
from attnscope.dashboard import links, words

ALL_PAGES = {**PAGES, **ANALYSIS_PAGES}


def _open_link(params: dict[str, str], page: str, **env) -> AppTest:
    at = run_app()
    at.session_state[K.LINK_APPLIED] = False  # as a fresh session: the URL is read on this run
    at.query_params.clear()
    for k, v in params.items():
        at.query_params[k] = v
    return at.switch_page(ALL_PAGES[page]).run()


def _params(at: AppTest) -> dict[str, str]:
    return {k: (v[-1] if isinstance(v, list) else v) for k, v in at.query_params.items()}


def _warnings(at: AppTest) -> str:
    return " ".join(w.value for w in at.warning)


def test_the_url_follows_the_clicks_and_a_link_rebuilds_the_picture():
    at = run_app("reverse", "attention")
    at.sidebar.text_input(key=K.SOURCE).input("attention").run()
    at.radio(key=K.ATT_KIND).set_value("cross").run()
    at.selectbox(key=K.ATT_LAYER).set_value(1).run()
    at.selectbox(key=K.ATT_HEAD).set_value(3).run()
    at.toggle(key=K.ATT_LOG).set_value(True).run()
    assert_no_exception(at)
    params = _params(at)
    assert params["model"] == "reverse" and params["text"] == "attention"
    assert (params["kind"], params["layer"], params["head"], params["log"]) == ("cross", "1", "3", "1")
    assert at.sidebar.code[-1].value.endswith("?" + links.urlencode(params))  # the link shown to copy
    title = "cross-attention · layer 1 · head 3"
    before = figure(at, title)

    fresh = _open_link(params, "attention")
    assert_no_exception(fresh)
    assert not fresh.warning, _warnings(fresh)
    after = figure(fresh, title)
    assert after["data"][0]["x"] == before["data"][0]["x"] and after["data"][0]["y"] == before["data"][0]["y"]
    assert after["data"][0]["z"] == before["data"][0]["z"]  # the same numbers, the same picture
    assert _params(fresh) == params


@pytest.mark.parametrize(
    "page,params,key,value",
    [
        ("heads", {"kind": "cross", "stat": "monotonic", "layer": "1", "head": "2"}, K.HA_STAT, "monotonic"),
        ("audit", {"kind": "enc_self", "layer": "1", "head": "1"}, K.AUD_HEAD, 1),
        ("lab", {"bug": "causal_next_visible", "kind": "dec_self", "layer": "0", "head": "2"}, K.LAB_BUG,
         "causal_next_visible"),
        ("lab", {"bug": "inverted", "view": "maps", "layer": "1"}, K.LAB_VIEW, words.LAB_VIEWS["maps"]),
        ("decoding", {"step": "3", "layer": "0", "log": "1"}, K.DEC_STEP, 3),
        ("compare", {"vs": "bug", "bug": "causal_diag_masked", "kind": "dec_self"}, K.CMP_BUG, "causal_diag_masked"),
        ("attention", {"show": "moves", "kind": "enc_self", "layer": "1"}, K.ATT_SHOW, "moves"),
        ("compare", {"vs": "moves", "kind": "cross"}, K.CMP_MODE, "what the weights move"),
    ],
)  # fmt: skip
def test_each_pages_settings_come_back_from_a_link(page, params, key, value):
    at = _open_link({"model": "reverse", "text": "hello", **params}, page)
    assert_no_exception(at)
    assert "link" not in _warnings(at), _warnings(at)
    assert at.session_state[key] == value
    assert {k: _params(at)[k] for k in params} == params  # and the URL still says so


HOSTILE = [
    ({"model": "no-such-model"}, "not a model this server has"),
    ({"model": "/etc/passwd"}, "never a path"),
    ({"model": "examples/my_adapter.py"}, "never a path"),
    ({"model_b": "../../etc", "vs": "model"}, "never a path"),
    ({"text": "x" * 5000}, "links carry at most 2,000"),
    ({"layer": "99", "head": "-1"}, "head='-1' must be a whole number"),
    ({"kind": "<script>alert(1)</script>"}, "must be one of enc_self"),
    ({"log": "maybe", "agg": "mean,sum"}, "must be 1 or 0"),
    ({"step": "0"}, "must be a whole number from 1"),
    ({"a" * 500: "1"}, "is not a setting of this page"),
]


@pytest.mark.parametrize("params,message", HOSTILE)
def test_hostile_parameters_get_a_message_and_load_nothing(params, message, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_ALLOW_CODE", "1")  # even then, a link never runs code
    page = "decoding" if "step" in params else "compare" if "model_b" in params else "attention"
    at = _open_link({"text": "hello", **params}, page)
    assert_no_exception(at)
    assert message in _warnings(at), _warnings(at)
    assert at.session_state[K.MODEL] == "reverse"  # the default: a refused model is never picked
    assert K.USER_MODELS not in at.session_state  # nor loaded from a path


def test_a_layer_the_model_lacks_is_reported_once_the_page_ran():
    at = _open_link({"model": "reverse", "text": "hello", "layer": "99"}, "attention")
    assert_no_exception(at)
    assert "layer=99 (showing 0)" in _warnings(at)
    assert _params(at)["layer"] == "0"  # the URL now says what is shown


def test_text_outside_the_vocabulary_is_the_sidebars_message():
    at = _open_link({"model": "reverse", "text": "HELLO ☃"}, "attention")
    assert_no_exception(at)
    assert at.session_state[K.SOURCE] == "HELLO ☃"
    assert any("☃" in e.value for e in at.error), [e.value for e in at.error]
