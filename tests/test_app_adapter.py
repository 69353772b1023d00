"""Adapter files in the dashboard (AppTest): loaded from the path box only when the server allows
code, never from an upload; then every page renders the user's model."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest
import streamlit as st
from apptest_helpers import ANALYSIS_PAGES, PAGES, assert_clean, errors, load_path, run_app

from attnscope.dashboard import keys as K
from attnscope.dashboard import user_models

ADAPTERS = Path(__file__).resolve().parent / "adapters"
EVERY_PAGE = [*PAGES.values(), *ANALYSIS_PAGES.values()]
TIMEOUT = 120


@pytest.fixture()
def env(monkeypatch):
    monkeypatch.setenv(user_models.MODEL_DIRS_ENV, str(ADAPTERS))
    monkeypatch.delenv("ATTNSCOPE_MODELS", raising=False)
    monkeypatch.delenv(user_models.ALLOW_CODE_ENV, raising=False)
    st.cache_data.clear()
    st.cache_resource.clear()
    return monkeypatch


def _app():
    return run_app(timeout=TIMEOUT)


def test_adapter_needs_the_servers_consent(env):
    at = _app()
    before = at.sidebar.selectbox(key=K.MODEL).value
    load_path(at, str(ADAPTERS / "tutorial_seq2seq.py"))
    assert not at.exception
    shown = " ".join(errors(at))
    assert "ATTNSCOPE_ALLOW_CODE=1" in shown and "runs its Python code" in shown
    assert at.sidebar.selectbox(key=K.MODEL).value == before  # the previous model stays
    assert any("Adapter files (.py) are off" in c.value for c in at.sidebar.caption)


def test_uploaded_python_file_is_never_run(env, tmp_path):
    """The uploader takes no .py (its type list); inside a .zip, or through the check itself, it is refused."""
    env.setenv(user_models.ALLOW_CODE_ENV, "1")  # even with code allowed, an upload is not run
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')\n" + (ADAPTERS / "tutorial_seq2seq.py").read_text()
    assert "py" not in user_models.UPLOAD_TYPES
    with pytest.raises(user_models.ModelLoadError, match="never run"):
        user_models.save_upload([("adapter.py", code.encode())], tmp_path / "up", 2**20)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("adapter.py", code)
    at = _app()
    at.sidebar.file_uploader(key=K.UPLOADS).set_value([("model.zip", buf.getvalue(), "application/zip")])
    at.sidebar.button(key=K.LOAD_UPLOAD_BUTTON).click().run()
    assert not at.exception
    assert any("never run" in e.value for e in at.error), [e.value for e in at.error]
    assert not marker.exists()


def test_adapter_outside_the_allowed_folders_is_refused(env, tmp_path):
    env.setenv(user_models.ALLOW_CODE_ENV, "1")
    outside = tmp_path / "x.py"
    outside.write_text((ADAPTERS / "tutorial_seq2seq.py").read_text())
    at = load_path(_app(), str(outside))
    assert any("outside the folders" in e.value for e in at.error)


@pytest.mark.parametrize("name, arch", [("tutorial_seq2seq", "encoder-decoder"), ("gpt_decoder", "decoder only"),
                                        ("bert_encoder", "encoder only"), ("bert_classifier", "encoder only")])  # fmt: skip
def test_adapter_on_every_page(env, name, arch):
    env.setenv(user_models.ALLOW_CODE_ENV, "1")
    at = load_path(_app(), str(ADAPTERS / f"{name}.py"))
    assert_clean(at)
    assert at.sidebar.selectbox(key=K.MODEL).value == os.path.realpath(ADAPTERS / f"{name}.py")
    assert any(f"Loaded model '{name}.py' ({arch})" in s.value for s in at.success)
    for page in EVERY_PAGE:
        at.switch_page(page).run()
        assert_clean(at)
    at.switch_page("app_pages/mask_lab.py").run()
    assert any("Masks cannot be injected" in w.value and "adapter file" in w.value for w in at.warning)
    at.switch_page("app_pages/audit.py").run()
    assert any("checks pass" in s.value for s in at.success)


def test_broken_adapter_keeps_the_previous_model(env):
    env.setenv(user_models.ALLOW_CODE_ENV, "1")
    at = _app()
    before = at.sidebar.selectbox(key=K.MODEL).value
    load_path(at, str(ADAPTERS / "broken_shapes.py"))
    assert not at.exception
    assert any("forward returned" in e.value for e in at.error)
    assert at.sidebar.selectbox(key=K.MODEL).value == before
    at.switch_page("app_pages/attention.py").run()
    assert not at.exception


def test_adapter_with_learned_keys_on_every_page(env):
    """A [CLS] parameter joined to the tokens, memory keys and a null key outside them: every page
    renders; the Attention page names the learned keys and draws them as columns of the head view."""
    env.setenv(user_models.ALLOW_CODE_ENV, "1")
    at = load_path(_app(), str(ADAPTERS / "vit_style_memkv.py"))
    assert_clean(at)
    for page in EVERY_PAGE:
        at.switch_page(page).run()
        assert_clean(at)
    at.switch_page("app_pages/attention.py").run()
    assert_clean(at)
    note = " ".join(i.value for i in at.info)
    assert "3 learned key(s)" in note and "<mem_k 0>" in note and "<null_k 0>" in note


def test_adapter_in_slices_without_max_len_on_every_page(env):
    """Attention computed in slices of the batch x heads fold (joined into one layer by capture) and a
    softmax written as exp(s - logsumexp(s)): every page renders; with no MAX_LEN the sidebar says
    how many tokens the map budget holds, not a limit of a billion tokens."""
    env.setenv(user_models.ALLOW_CODE_ENV, "1")
    at = load_path(_app(), str(ADAPTERS / "sliced_attention.py"))
    assert_clean(at)
    limits = [c.value for c in at.sidebar.caption if "tokens per input" in c.value]
    assert limits and "No token limit of its own" in limits[0] and "1,000,000,000" not in limits[0]
    for page in EVERY_PAGE:
        at.switch_page(page).run()
        assert_clean(at)
    at.switch_page("app_pages/attention.py").run()
    assert not [w.value for w in at.warning if "could not" in w.value]


def test_rnn_seq2seq_with_cross_attention_only_on_every_page(env):
    """PyTorch's GRU translation tutorial with Bahdanau attention, decoded a step at a time: its only
    maps are cross-attention (no self-attention kinds), and every page renders them. Its encoder reads
    the PAD tokens into the state the decoder starts from, so a sequence padded in a batch attends
    otherwise than alone: the audit says so (batch invariance), as it should for this model."""
    env.setenv(user_models.ALLOW_CODE_ENV, "1")
    at = load_path(_app(), str(ADAPTERS / "tutorial_gru_attention.py"))
    assert_clean(at)
    from attnscope.core.families.adapter import load_adapter
    from attnscope.dashboard import model_facts

    (trace,) = load_adapter(ADAPTERS / "tutorial_gru_attention.py").trace(["abc"], ["ab"])
    real = model_facts.real_decoder(trace)  # no decoder self-attention: its real positions still known
    assert real.tolist() == trace.tgt_real.tolist() and real.all() and model_facts.decode_steps(trace).count
    assert any("Loaded model 'tutorial_gru_attention.py' (encoder-decoder)" in s.value for s in at.success)
    for page in EVERY_PAGE:
        at.switch_page(page).run()
        if page != "app_pages/audit.py":
            assert_clean(at)
    at.switch_page("app_pages/decoding.py").run()
    assert any("each step attends to the source only" in c.value for c in at.caption)
    at.switch_page("app_pages/audit.py").run()
    assert not at.exception
    failed = " ".join(e.value for e in at.error)
    assert "batch_invariance" in failed and "FAIL" in failed


def test_heads_masked_differently_are_said_on_the_masks_page(env):
    """nn.MultiheadAttention given a (B·heads, L, L) mask repeated over the heads in the wrong order:
    the Masks page says the heads were masked differently and that what it shows is every head's
    share, and its audit finds the attention on PAD the bug causes; a model whose heads share their
    mask gets no such warning."""
    env.setenv(user_models.ALLOW_CODE_ENV, "1")
    from attnscope.core.families.adapter import load_adapter
    from attnscope.dashboard import model_facts

    traces = load_adapter(ADAPTERS / "mha_repeat_mask_bug.py").trace(["hello world", "abc"])
    assert traces[0].meta["head_masks_differ"] == {"enc_self": ["attn.0", "attn.1"]}
    assert "repeat_interleave" in model_facts.head_masks_note(traces[0])
    at = load_path(_app(), str(ADAPTERS / "mha_repeat_mask_bug.py"))
    assert_clean(at)
    at.sidebar.toggle(key=K.BATCH).set_value(True).run()
    at.sidebar.text_area(key=K.SOURCES).input("hello world\nabc").run()
    at.switch_page("app_pages/masks.py").run()
    assert not at.exception
    shown = [w.value for w in at.warning if "masked differently" in w.value]
    assert shown and "attn.0, attn.1" in shown[0]
    # the bug's symptom: "abc"'s first head was masked with the other sequence's keys, so it attends to PAD
    assert any("put attention on masked keys" in e.value for e in at.error)
    at = load_path(_app(), str(ADAPTERS / "bert_encoder.py"))
    at.switch_page("app_pages/masks.py").run()
    assert_clean(at)
    assert not [w.value for w in at.warning if "masked differently" in w.value]
