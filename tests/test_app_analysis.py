"""The analysis pages (mask audit, mask lab, head analytics, compare) under streamlit.testing.v1.AppTest.

Each page renders for every registry model and the tiny fixtures; widgets change what is
shown (a bug turns the lab's verdict from pass to fail, ablating heads changes the maps, picking a
head changes the detail heatmap); the expensive work is cached; Hugging Face models are audited
black-box and refused by the lab with a message. Figures are read back from the chart protos.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from apptest_helpers import ANALYSIS_PAGES, ZOO, _array, assert_no_exception, errors, figure, figures, titles
from streamlit.testing.v1 import AppTest

from attnscope.core.analysis import audit as core_audit
from attnscope.core.analysis import bugs
from attnscope.dashboard import keys as K
from attnscope.dashboard import state as S
from attnscope.dashboard import words
from attnscope.dashboard.plots.audit import STATUS_ICON

PASS = STATUS_ICON["pass"]


# -- helpers (the rest in apptest_helpers.py; make_app and tiny: conftest.py) ----------------------


def texts(at: AppTest) -> str:
    """Every text, markdown, caption and alert of the page, joined."""
    parts = [e.value for kind in ("markdown", "caption", "text", "success", "error", "warning", "info")
             for e in at.get(kind)]  # fmt: skip
    return "\n".join(str(p) for p in parts)


def successes(at: AppTest) -> list[str]:
    return [s.value for s in at.success]


@pytest.fixture()
def audits(monkeypatch) -> list[int]:
    """Counts attnscope.core.analysis.audit.run_audit calls (each runs the model several times)."""
    calls = [0]
    original = core_audit.run_audit

    def counting(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(core_audit, "run_audit", counting)
    return calls


# -- every page, every model ------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["tiny-seq2seq", "tiny-classifier", *ZOO])
def test_every_analysis_page_renders(make_app, extra_models, which):
    model = {"tiny-seq2seq": extra_models[0], "tiny-classifier": extra_models[1]}.get(which, which)
    at = make_app(model)
    for name, path in ANALYSIS_PAGES.items():
        at.switch_page(path).run()
        assert_no_exception(at)
        assert not errors(at) or name == "lab", (name, errors(at))  # the lab's buggy side reports FAIL
        assert at.title, name
        figs = figures(at)
        assert figs, f"no chart on the {name} page"
        for f in figs:
            assert len(f["layout"]["title"]["text"]) > 20
            axes = [f["layout"].get(a, {}).get("title", {}).get("text") for a in ("xaxis", "yaxis")]
            assert all(axes), (f["layout"]["title"]["text"], axes)  # every axis says what it shows
    # The correct model passes its own audit (zoo models and fixtures alike).
    at.switch_page(ANALYSIS_PAGES["audit"]).run()
    assert any(s.startswith("All ") and "checks pass" in s for s in successes(at)), errors(at)


# -- mask audit ---------------------------------------------------------------------------------------


def test_audit_page_lists_every_check_with_words(make_app, tiny):
    at = make_app(tiny, page="audit", **{K.BATCH: True})
    at.sidebar.text_area(key=K.SOURCES).input("hello world\nab").run()
    assert_no_exception(at)
    static, dynamic, info = (df.value for df in at.dataframe)  # in page order
    assert set(static["check"]) == {f"{c}[{k}]" for c in words.STATIC[:4] for k in ("enc_self", "dec_self", "cross")} | {
        "finite"
    }  # fmt: skip
    assert list(dynamic["check"]) == [
        "finite_outputs",
        "batch_invariance",
        "causal_leak",
        "padding_leak[src]",
        "padding_leak[tgt]",
    ]
    assert (static["status"] == PASS).all() and (dynamic["status"] == PASS).all()
    assert len(info) == 3
    mm = static[static["check"] == "masked_mass[enc_self]"].iloc[0]
    assert mm["detail"].startswith("0 on all") and mm["value"] == 0  # the batch has PAD keys
    shown = texts(at)
    for base in (*words.STATIC, *words.DYNAMIC):
        assert words.CHECK_HELP[base] in shown
    heat = figure(at, "largest attention one real query puts on masked keys")
    assert np.nanmax(_array(heat["data"][0]["z"])) == 0
    # Another kind, another head: display only.
    at.radio(key=K.AUD_KIND).set_value("cross").run()
    at.selectbox(key="aud_head").select(3).run()
    assert_no_exception(at)
    figure(at, "cross-attention · layer 0 · head 3 · sequence 0")
    assert "attention, ✕ = must be 0" in titles(at)[2]
    compare = figure(at, "mask the model used vs the mask the tokens call for<br>cross-attention")
    assert set(np.unique(_array(compare["data"][0]["z"]))) <= {
        0,
        1,
    }  # no leak, no over-masking (z: state codes)


def test_audit_page_answers_bad_input(make_app, tiny):
    at = make_app(tiny, page="audit")
    at.sidebar.text_input(key=K.SOURCE).input("   ").run()
    assert_no_exception(at)
    assert any("empty" in w.value for w in at.warning) and not figures(at)
    at.sidebar.text_input(key=K.SOURCE).input("hello€").run()
    assert_no_exception(at)
    assert len(errors(at)) == 1 and "'€'" in errors(at)[0] and not figures(at)
    at.sidebar.text_input(key=K.SOURCE).input("ab" * 30).run()  # too long: truncated elsewhere, refused here
    assert_no_exception(at)
    assert any("The audit cannot run on this input" in e for e in errors(at))
    at.switch_page(ANALYSIS_PAGES["lab"]).run()
    assert_no_exception(at)
    assert any("The lab cannot run on this input" in e for e in errors(at))
    at.sidebar.text_input(key=K.SOURCE).input("hello€").run()
    for page in ("lab", "heads", "compare"):
        at.switch_page(ANALYSIS_PAGES[page]).run()
        assert_no_exception(at)
        assert len(errors(at)) == 1 and "'€'" in errors(at)[0] and not figures(at), page


# -- mask lab ----------------------------------------------------------------------------------------------


def test_every_bug_turns_the_lab_verdict_from_pass_to_fail(make_app, tiny, audits):
    at = make_app(tiny, page="lab")
    assert_no_exception(at)
    assert at.selectbox(key=K.LAB_BUG).options == [words.bug_title(n) for n in bugs.names()]
    for name in bugs.names():
        at.selectbox(key=K.LAB_BUG).set_value(name).run()
        assert_no_exception(at)
        ok, bad = successes(at), errors(at)
        assert any(s.startswith("All ") for s in ok), (name, ok)  # the correct side
        assert len(bad) == 1 and "FAIL" in bad[0], (name, bad)
        assert words.BUG_HELP[name][1] in [c.value for c in at.code]  # the buggy code is shown
    n_audits = audits[0]
    assert n_audits == 1 + len(bugs.names())  # the correct run once, each bug once
    # Display selections do not run the model again.
    at.selectbox(key=K.LAB_BUG).set_value("causal_next_visible").run()
    at.radio(key=K.LAB_KIND).set_value("dec_self").run()
    at.selectbox(key=K.LAB_LAYER).select(1).run()
    at.selectbox(key=K.LAB_HEAD).select(2).run()
    at.selectbox(key=K.LAB_SEQ).select(0).run()
    assert audits[0] == n_audits
    assert_no_exception(at)
    assert "causal_leak" in errors(at)[0]
    codes = _array(figure(at, "mask with causal_next_visible")["data"][0]["z"])
    n = codes.shape[0]
    assert (np.diag(codes, 1)[: n - 1] == 2).sum() >= n - 2  # the next position wrongly visible (red)
    assert len(titles(at)) == 2  # the closed tab (the two attention maps) is neither built nor sent
    # The other tab: the two maps of the same head, and no model run for the switch.
    at.session_state[K.LAB_VIEW] = words.LAB_VIEWS["maps"]
    at.run()
    assert_no_exception(at)
    assert audits[0] == n_audits
    where = "decoder self-attention · layer 1 · head 2 · sequence 0"
    ok = _array(figure(at, f"correct attention<br>{where}")["data"][0]["z"])
    bad = _array(figure(at, f"attention with causal_next_visible<br>{where}")["data"][0]["z"])
    assert len(titles(at)) == 2
    assert np.nansum(np.triu(ok, 1)) == 0 and np.nansum(np.diag(bad, 1)) > 0  # the bug reads the next token


def test_lab_padding_copy_makes_padding_bugs_visible(make_app, tiny):
    at = make_app(tiny, page="lab", **{K.LAB_BUG: "cross_no_src_pad"})
    assert_no_exception(at)
    assert at.selectbox(key=K.LAB_SEQ).value == 1  # the padded copy is shown first
    codes = _array(figure(at, "mask with cross_no_src_pad")["data"][0]["z"])
    assert (codes == 2).any()  # PAD source keys wrongly visible
    at.toggle(key=K.LAB_PAD).set_value(False).run()
    assert_no_exception(at)
    codes = _array(figure(at, "mask with cross_no_src_pad")["data"][0]["z"])
    assert not (codes == 2).any()  # one input, no PAD: the mask itself is right here
    assert any("padding_leak[src]" in e for e in errors(at))  # the leak test appends PAD of its own


def test_lab_traces_its_own_batch_only(make_app, tiny, monkeypatch):
    """With the shorter copy, the lab's batch is not the sidebar's: the page asks for no trace of the
    sidebar's single input (it would be thrown away), only for its two-input batch."""
    from apptest_helpers import ANALYSIS_PAGES

    from attnscope.dashboard import loaders

    at = make_app(tiny)
    asked: list[tuple[str, ...]] = []
    real = loaders.compute_traces
    monkeypatch.setattr(loaders, "compute_traces", lambda key: asked.append(key.sources) or real(key))
    at.switch_page(ANALYSIS_PAGES["lab"]).run()
    assert_no_exception(at)
    assert asked and all(len(sources) == 2 for sources in asked), asked
    at.toggle(key=K.LAB_PAD).set_value(False).run()  # the lab's batch is the sidebar's input again
    assert_no_exception(at)
    assert len(asked[-1]) == 1


def test_lab_on_an_encoder_only_model_offers_encoder_bugs(make_app, extra_models):
    at = make_app(extra_models[1], page="lab", **{K.LAB_BUG: "wrong_broadcast"})
    assert_no_exception(at)
    names = at.selectbox(key=K.LAB_BUG).options
    assert names == [words.bug_title(n) for n in bugs.names() if not bugs.get(n).needs_decoder]
    assert "need a decoder" in texts(at)
    assert "FAIL" in errors(at)[0]


# -- head analytics ------------------------------------------------------------------------------------


def test_head_analytics_selection_changes_the_detail(make_app, tiny):
    at = make_app(tiny, page="heads")
    assert_no_exception(at)
    stat = figure(at, "entropy (nats) per head")
    z = _array(stat["data"][0]["z"])
    assert z.shape == (2, 4) and np.all(z > 0)
    head00 = _array(figure(at, "encoder self-attention · layer 0 · head 0 · input")["data"][0]["z"])
    at.selectbox(key=K.HA_LAYER).select(1).run()
    at.selectbox(key=K.HA_HEAD).select(2).run()
    head12 = _array(figure(at, "encoder self-attention · layer 1 · head 2 · input")["data"][0]["z"])
    assert not np.allclose(head00, head12)
    at.selectbox(key=K.HA_STAT).set_value("diagonal").run()
    diag = _array(figure(at, "diagonal / self per head")["data"][0]["z"])
    assert diag.shape == (2, 4) and not np.allclose(diag, z) and np.all((diag >= 0) & (diag <= 1))
    table = at.dataframe(key=K.HA_TABLE).value
    assert len(table) == 3 * 2 * 4 and set(table["kind"]) == {"enc_self", "dec_self", "cross"}
    enc = table[table["kind"] == "enc_self"].sort_values(["layer", "head"])
    np.testing.assert_allclose(enc["diagonal"].to_numpy().reshape(2, 4), diag, atol=1e-3)
    assert "monotonic alignment (Kendall tau)" not in at.selectbox(key=K.HA_STAT).options
    at.radio(key=K.HA_KIND).set_value("cross").run()
    assert_no_exception(at)
    assert "monotonic alignment (Kendall tau)" in at.selectbox(key=K.HA_STAT).options
    figure(at, "cross-attention · layer 1 · head 2")
    rollout = _array(figure(at, "encoder attention rollout")["data"][0]["z"])
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-5)
    attribution = _array(figure(at, "share of each source token")["data"][0]["z"])
    np.testing.assert_allclose(attribution.sum(-1), 1.0, atol=1e-5)
    al = figure(at, "cross-attention alignment, mean of layers, mean of heads")
    arg = next(d for d in al["data"] if d.get("name") == "argmax")
    assert len(arg["x"]) == 3 * attribution.shape[0]  # one line per target step
    at.selectbox(key=K.HA_AL_LAYER).set_value(1).run()
    at.selectbox(key=K.HA_AL_HEAD).set_value(0).run()
    figure(at, "cross-attention alignment, layer 1, head 0")


def test_head_analytics_on_a_classifier_has_no_cross_sections(make_app, extra_models):
    at = make_app(extra_models[1], page="heads")
    assert_no_exception(at)
    assert at.radio(key=K.HA_KIND).options == ["encoder self-attention"]
    assert not any("alignment" in t or "share of each source" in t for t in titles(at))
    figure(at, "encoder attention rollout")


# -- compare ---------------------------------------------------------------------------------------------


def test_compare_another_input_and_another_model(make_app, tiny, extra_models):
    at = make_app(tiny, page="compare")
    assert_no_exception(at)
    at.text_input(key=K.CMP_SOURCE_B).input("zyx").run()
    assert_no_exception(at)
    diff = figure(at, "B − A: encoder self-attention · layer")
    assert diff["layout"]["xaxis"]["ticktext"][:3] == ["h→z", "e→y", "l→x"]
    assert not np.allclose(_array(diff["data"][0]["z"]), 0)
    at.radio(key=K.CMP_MODE).set_value("another model").run()
    at.selectbox(key=K.CMP_MODEL_B).set_value(extra_models[1]).run()
    assert_no_exception(at)
    assert at.radio(key=K.CMP_KIND).options == ["encoder self-attention"]  # the kinds both have
    figure(at, "B: tiny-classifier<br>encoder self-attention · layer")
    assert figure(at, "how much each head changed")["data"][0]["z"]
    if "reverse" in ZOO:  # lowercase letters only: the fixture's example has a space
        at.selectbox(key=K.CMP_MODEL_B).set_value("reverse").run()
        assert_no_exception(at)
        assert any("Model B (reverse) cannot read this input" in e for e in errors(at)), errors(at)


def test_compare_mask_bug_and_head_ablation(make_app, tiny, audits):
    at = make_app(tiny, page="compare", **{K.CMP_MODE: "a mask bug", K.CMP_BUG: "causal_next_visible"})
    assert_no_exception(at)
    assert any("Audit of A: All" in s for s in successes(at))
    assert any("Audit of B" in e and "causal_leak" in e for e in errors(at))
    at.radio(key=K.CMP_MODE).set_value("heads switched off").run()
    assert_no_exception(at)
    per_head = _array(figure(at, "how much each head changed")["data"][0]["z"])
    assert np.allclose(per_head, 0)  # nothing switched off yet: B equals A
    before = audits[0]
    at.multiselect(key=K.CMP_OFF).select(("enc_self", 0, 1)).select(("enc_self", 0, 3)).run()
    assert_no_exception(at)
    assert audits[0] == before + 1
    per_head = _array(figure(at, "how much each head changed")["data"][0]["z"])
    assert np.allclose(per_head[0], 0) and np.all(per_head[1] > 0)  # layer 0 itself unchanged, layer 1 moves
    ly, h = np.unravel_index(int(np.argmax(per_head)), per_head.shape)
    figure(at, f"B − A: encoder self-attention · layer {ly} · head {h}")  # the head that changed most
    assert any("Audit of B: All" in s for s in successes(at))  # switching heads off breaks no mask
    at.radio(key=K.CMP_KIND).set_value("cross").run()
    per_head = _array(figure(at, "how much each head changed")["data"][0]["z"])
    assert np.all(per_head > 0)  # the encoder's output changed, so every cross head reads other memory
    assert audits[0] == before + 1  # kind change: display only


# -- Hugging Face folders ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_bart(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = "the cat sat on a mat dog ran hello world".split()
    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    cfg = transformers.BartConfig(
        vocab_size=len(vocab), pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
        forced_eos_token_id=2, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf") / "tiny-bart"
    transformers.BartForConditionalGeneration(cfg).eval().save_pretrained(folder)
    fast.save_pretrained(folder)
    (folder / "meta.json").write_text(json.dumps({"examples": ["the cat sat on a mat", "hello world"]}))
    return str(folder)


def test_hf_model_is_audited_black_box_and_refused_by_the_lab(make_app, monkeypatch, extra_models, hf_bart):
    monkeypatch.setenv("ATTNSCOPE_MODELS", os.pathsep.join([*extra_models, hf_bart]))
    at = make_app(hf_bart)
    at.sidebar.radio(key=K.MODE).set_value(S.TEACHER).run()
    at.sidebar.text_input(key=K.TARGET).input("a dog ran").run()  # the untrained model stops at once
    at.switch_page(ANALYSIS_PAGES["audit"]).run()
    assert_no_exception(at)
    dynamic = at.dataframe[1].value  # static, dynamic, info
    assert list(dynamic["status"]) == [PASS] * 5, dynamic  # leak tests ran through the library call
    assert "changing each of 4 future target tokens" in dynamic["detail"][2]
    assert "black box" in texts(at)
    for page in ("lab", "compare"):
        at.switch_page(ANALYSIS_PAGES[page]).run()
        if page == "compare":
            at.radio(key=K.CMP_MODE).set_value("a mask bug").run()
        assert_no_exception(at)
        assert any("Masks cannot be injected" in w.value for w in at.warning), page
    at.switch_page(ANALYSIS_PAGES["heads"]).run()
    assert_no_exception(at)
    figure(at, "cross-attention alignment")
