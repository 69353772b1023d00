"""Every dashboard page under streamlit.testing.v1.AppTest: renders, reacts to widgets, answers bad input.

AppTest cannot look inside a Plotly chart, so the figures are read back from the chart
protos' JSON spec (tests/apptest_helpers.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from apptest_helpers import PAGES, ZOO, _array, assert_clean, figure, figures, titles
from streamlit.testing.v1 import AppTest

from attnscope.core.families.native import LoadedModel
from attnscope.core.transformer.model import count_parameters
from attnscope.dashboard import keys as K
from attnscope.dashboard import state as S

# -- helpers (make_app and tiny: conftest.py) ------------------------------------------------------


def messages(at: AppTest) -> dict[str, list[str]]:
    return {
        "exception": [e.value for e in at.exception],
        "error": [e.value for e in at.error],
        "warning": [w.value for w in at.warning],
    }


@pytest.fixture()
def tiny_clf_path(extra_models) -> str:
    return extra_models[1]


@pytest.fixture()
def count_runs(monkeypatch) -> list[int]:
    """Counts LoadedModel.trace calls (the model's forward passes) made by the app."""
    calls = [0]
    original = LoadedModel.trace

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LoadedModel, "trace", counting)
    return calls


# -- every page, every model -----------------------------------------------------------------


@pytest.mark.parametrize("which", ["tiny-seq2seq", "tiny-classifier", *ZOO])
def test_every_page_renders(make_app, extra_models, which):
    model = {"tiny-seq2seq": extra_models[0], "tiny-classifier": extra_models[1]}.get(which, which)
    at = make_app(model)
    assert at.sidebar.selectbox(key=K.MODEL).value == model
    assert any("Device used" in c.value for c in at.sidebar.caption)
    for name, path in PAGES.items():
        at.switch_page(path).run()
        assert_clean(at)
        assert at.title, name
        if name == "bertviz":
            frames = at.get("iframe")
            assert len(frames) == 1 and "bertviz" in frames[0].proto.srcdoc
        else:
            assert figures(at), f"no chart on the {name} page"
        for t in titles(at):
            assert len(t) > 10  # every chart says what it is


# -- attention page ----------------------------------------------------------------------------


def test_attention_selectors_change_the_heatmap_without_rerunning_the_model(make_app, tiny, count_runs):
    at = make_app(tiny)
    assert_clean(at)
    runs = count_runs[0]
    assert runs == 1
    big = figure(at, "· layer 0 · head 0")
    assert big["layout"]["title"]["text"].startswith("encoder self-attention")
    z00 = _array(big["data"][0]["z"])

    at.selectbox(key=K.ATT_LAYER).select(1).run()
    at.selectbox(key=K.ATT_HEAD).select(2).run()
    big = figure(at, "· layer 1 · head 2")
    assert not np.allclose(_array(big["data"][0]["z"]), z00)
    at.selectbox(key=K.ATT_HEAD).select("mean").run()
    figure(at, "· layer 1 · mean of heads")
    at.toggle(key=K.ATT_LOG).set_value(True).run()
    big = figure(at, "· layer 1 · mean of heads")
    assert big["data"][0]["zmin"] == pytest.approx(-4) and np.all(_array(big["data"][0]["z"]) <= 0)
    at.multiselect(key=K.ATT_AGG).select("mean").select("max").run()
    grid = figure(at, "all 2 layers × 4 heads")
    assert grid["layout"]["xaxis"]["ticktext"] == [
        "head 0",
        "head 1",
        "head 2",
        "head 3",
        "mean of heads",
        "max of heads",
    ]
    at.toggle(key=K.ATT_MASK).set_value(False).run()
    assert [d.get("name") for d in figure(at, "· layer 1 ·")["data"]] == ["attention"]
    assert count_runs[0] == runs  # none of these re-ran the model

    at.radio(key=K.ATT_KIND).set_value("cross").run()
    big = figure(at, "cross-attention · layer 1")
    src = at.sidebar.text_input(key=K.SOURCE).value
    assert big["layout"]["xaxis"]["ticktext"] == [*src.replace(" ", "␣"), "&lt;eos&gt;"]
    assert big["layout"]["yaxis"]["ticktext"][0] == "&lt;bos&gt;"
    assert count_runs[0] == runs


def test_new_input_changes_tick_labels_and_runs_once(make_app, tiny, count_runs):
    at = make_app(tiny)
    before = figure(at, "· layer 0 · head 0")["layout"]["xaxis"]["ticktext"]
    at.sidebar.text_input(key=K.SOURCE).input("zyx").run()
    assert_clean(at)
    after = figure(at, "· layer 0 · head 0")["layout"]["xaxis"]["ticktext"]
    assert after == ["z", "y", "x", "&lt;eos&gt;"] and after != before
    assert count_runs[0] == 2
    at.switch_page(PAGES["masks"]).run()  # another page, same inputs: served from the cache
    assert count_runs[0] == 2


def test_batch_has_real_padding_and_a_sequence_picker(make_app, tiny):
    at = make_app(tiny, **{K.BATCH: True})
    at.sidebar.text_area(key=K.SOURCES).input("hello world\nab\nabc").run()
    assert_clean(at)
    at.selectbox(key=K.ATT_SEQ).select(1).run()
    big = figure(at, "head 0 · sequence 1")
    ticks = big["layout"]["xaxis"]["ticktext"]
    assert ticks[:3] == ["a", "b", "&lt;eos&gt;"] and ticks[3:] == ["&lt;pad&gt;"] * 9  # PAD columns visible
    at.switch_page(PAGES["masks"]).run()
    assert_clean(at)
    pad = figure(at, "source padding mask")
    z = _array(pad["data"][0]["z"])
    assert z.shape == (3, 12) and z[1].tolist() == [1, 1, 1] + [0] * 9
    assert any("exactly 0 attention on masked keys" in s.value for s in at.success)


# -- bad input ---------------------------------------------------------------------------------


def test_bad_input_is_answered_in_the_page(make_app, tiny):
    at = make_app(tiny)
    at.sidebar.text_input(key=K.SOURCE).input("   ").run()
    assert not at.exception and any("empty" in w for w in messages(at)["warning"])
    assert not figures(at)

    at.sidebar.text_input(key=K.SOURCE).input("hello€").run()
    errors = messages(at)["error"]
    assert (
        not at.exception
        and len(errors) == 1
        and "'€'" in errors[0]
        and "unknown characters" in errors[0].lower()
    )

    long_text = "ab" * 30  # 60 characters; the fixture takes 47
    at.sidebar.text_input(key=K.SOURCE).input(long_text).run()
    assert_clean(at)
    warnings = messages(at)["warning"]
    assert any("truncated from 60 to 47" in w for w in warnings), warnings
    assert len(figure(at, "· layer 0 · head 0")["layout"]["xaxis"]["ticktext"]) == 48  # 47 + EOS

    at.sidebar.toggle(key=K.BATCH).set_value(True).run()
    at.sidebar.text_area(key=K.SOURCES).input("abc\n\nabd").run()
    assert any("Line 2 of the batch is empty" in w for w in messages(at)["warning"])

    at.sidebar.text_area(key=K.SOURCES).input("abc\nabd").run()
    at.sidebar.radio(key=K.MODE).set_value(S.TEACHER).run()
    at.sidebar.text_area(key=K.TARGETS).input("cba").run()
    assert any("2 inputs but 1 target lines" in w for w in messages(at)["warning"])
    at.sidebar.text_area(key=K.TARGETS).input("cba\ndba").run()
    assert_clean(at)
    assert "teacher forcing" in " ".join(c.value for c in at.caption)


# -- other pages -------------------------------------------------------------------------------


def test_decoding_slider_steps_through_greedy_output(make_app, tiny):
    at = make_app(tiny, page="decoding")
    assert_clean(at)
    slider = at.slider(key=K.DEC_STEP)
    assert slider.value == 1 and slider.max >= 3
    slider.set_value(3).run()
    assert_clean(at)
    code = at.code[0].value
    assert code.startswith("prefix (3 tokens): <bos> ")
    top = figure(at, "step 3: top-5")
    assert len(top["data"][0]["x"]) == 5
    cross = figure(at, "step 3: cross-attention")
    assert _array(cross["data"][0]["z"]).shape[1] == len(at.sidebar.text_input(key=K.SOURCE).value) + 1
    self_attn = figure(at, "step 3: decoder self-attention")
    assert self_attn["layout"]["xaxis"]["ticktext"][0] == "&lt;bos&gt;"
    assert len(self_attn["layout"]["xaxis"]["ticktext"]) == 3
    overview = figure(at, "every step: cross-attention, layer 1")
    assert overview["layout"]["shapes"][0]["y0"] == 1.5  # step 3 (row 2) outlined
    at.selectbox(key=K.DEC_LAYER).select(0).run()
    figure(at, "every step: cross-attention, layer 0")


def test_classifier_pages(make_app, tiny_clf_path):
    at = make_app(tiny_clf_path)
    assert_clean(at)
    assert at.radio(key=K.ATT_KIND).options == ["encoder self-attention"]
    assert K.MODE not in [r.key for r in at.sidebar.radio]
    at.switch_page(PAGES["decoding"]).run()
    assert_clean(at)
    probs = figure(at, "class probabilities")
    assert probs["data"][0]["x"] == ["no", "yes"] and sum(probs["data"][0]["y"]) == pytest.approx(1, abs=1e-5)
    at.switch_page(PAGES["positional"]).run()
    assert "learned" in figure(at, "PE matrix")["layout"]["title"]["text"]
    assert "dominant period" in figure(at, "dominant period")["layout"]["yaxis"]["title"]["text"]


def test_positional_free_mode(make_app, tiny):
    at = make_app(tiny, page="positional")
    assert _array(figure(at, "PE matrix")["data"][0]["z"]).shape == (48, 16)
    at.radio(key=K.PE_SOURCE).set_value(at.radio(key=K.PE_SOURCE).options[1]).run()
    at.number_input(key=K.PE_DMODEL).set_value(32).run()
    at.number_input(key=K.PE_MAXLEN).set_value(50).run()
    assert_clean(at)
    assert _array(figure(at, "PE matrix")["data"][0]["z"]).shape == (50, 32)
    at.multiselect(key=K.PE_DIMS).set_value([4, 5]).run()
    assert [d["name"] for d in figure(at, "chosen dimensions")["data"]] == [
        "dim 4 (sin, i=2)",
        "dim 5 (cos, i=2)",
    ]


def test_bertviz_page_escapes_user_text(make_app, tiny):
    at = make_app(tiny, page="bertviz")
    at.sidebar.text_input(key=K.SOURCE).input("</script><script>alert(1)</script>").run()
    assert_clean(at)
    doc = at.get("iframe")[0].proto.srcdoc
    assert doc.count("<script nonce=") == 3 and "<script>alert" not in doc and "alert(1)</script>" not in doc
    # The character tokens, as escaped JSON (bertviz shows them with d3's .text()).
    assert '"\\u003c", "/", "s", "c", "r", "i", "p", "t", "\\u003e"' in doc
    at.radio(key=K.BV_VIEW).set_value("model").run()
    assert "thumbnail" in at.get("iframe")[0].proto.srcdoc  # bertviz's model_view.js
    at.multiselect(key=K.BV_KINDS).set_value(["cross"]).run()
    assert_clean(at)
    assert '"name": null' in at.get("iframe")[0].proto.srcdoc  # one kind: no filter menu


def test_model_page_summarises_the_model(make_app, tiny, tiny_model):
    at = make_app(tiny, page="model")
    assert_clean(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Parameters"] == f"{count_parameters(tiny_model.model):,}"
    assert metrics["Device"] == "cpu" and metrics["Source vocabulary"] == f"{len(tiny_model.src_tok):,}"
    assert any("Forward pass with attention capture" in m.value and " ms" in m.value for m in at.markdown)
    assert sum(figure(at, "parameters per module")["data"][0]["x"]) == count_parameters(tiny_model.model)


def test_every_run_ends_by_keeping_the_next_collection_cheap(make_app, tiny, monkeypatch):
    """app.py calls loaders.keep_collection_cheap at the end of each run (gc.freeze of what lives on,
    tests/test_load.py); the run that loads a model asks for a refreeze."""
    from attnscope.dashboard import loaders

    calls: list[bool] = []
    original = loaders.keep_collection_cheap

    def counting(force: bool = False) -> bool:
        calls.append(loaders._gc["stale"])
        return original(force)

    monkeypatch.setattr(loaders, "keep_collection_cheap", counting)
    at = make_app(tiny)
    n = len(calls)
    assert n >= 1
    at.sidebar.text_input(key=K.SOURCE).input("zyx").run()
    assert_clean(at)
    assert len(calls) == n + 1 and calls[-1] is False  # no model loaded in that run: not stale


@pytest.mark.parametrize("batch", [False, True])
def test_a_session_started_over_keeps_the_text_its_browser_holds(make_app, tiny, batch):
    """Under load a page's server session can start over while the browser keeps its widgets: the
    text it sends is the one drawn, never replaced by the model's examples; a new session still opens
    with the examples (in both boxes), and changing the model still brings the new model's examples."""
    at = make_app(tiny, **{K.BATCH: batch})
    box = at.sidebar.text_area(key=K.SOURCES) if batch else at.sidebar.text_input(key=K.SOURCE)
    examples = box.value
    assert examples.strip()  # a new session opens with the examples
    hidden = K.SOURCE if batch else K.SOURCES
    assert at.session_state[hidden].strip()  # and the other box holds them too, for when it is shown
    del at.session_state[K.TEXT_FOR_MODEL]  # the server's state is gone; the browser's widgets are not
    (at.sidebar.text_area(key=K.SOURCES) if batch else at.sidebar.text_input(key=K.SOURCE)).input("abc").run()
    assert_clean(at)
    assert (
        at.sidebar.text_area(key=K.SOURCES) if batch else at.sidebar.text_input(key=K.SOURCE)
    ).value == "abc"
    assert at.session_state[K.TEXT_FOR_MODEL] == "tiny-seq2seq"  # the boxes' text belongs to this model again
