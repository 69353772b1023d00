"""Trace files in the dashboard under AppTest (dashboard/opened.py): traces from every source open and
draw their own tokens and numbers; pages that need only the trace work on it; pages that run the
model say so in one line and name the model; paths outside the allowed folders are refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from apptest_helpers import ANALYSIS_PAGES, PAGES, _array, assert_clean, assert_no_exception, figure, run_app
from test_hf import _specs

from attnscope.core.families.capture import capture_attention
from attnscope.core.traces.trace import AttentionTrace
from attnscope.dashboard import keys as K
from attnscope.dashboard import opened
from attnscope.dashboard.plots.common import token_labels
from attnscope.models import registry

TRACE_PAGES = ["attention", "masks", "heads", "bertviz", "audit", "decoding", "model"]
MODEL_PAGES = ["lab", "compare", "positional"]


def _equal(a: AttentionTrace, b: AttentionTrace) -> None:
    assert (a.src_tokens, a.tgt_tokens, a.out_tokens, a.model, a.output_text) == (
        b.src_tokens, b.tgt_tokens, b.out_tokens, b.model, b.output_text,
    )  # fmt: skip
    for name, value in a.to_numpy().items():
        np.testing.assert_array_equal(value, b.to_numpy()[name], err_msg=name)
    assert set(a.to_numpy()) == set(b.to_numpy())


@pytest.fixture(scope="module")
def reverse_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("traces") / "reverse.npz"
    registry.load("reverse").trace(["stressed"])[0].save(path)
    return path


def _hand_written_trace() -> AttentionTrace:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0).eval()
    x = torch.randn(1, 5, 16)
    with capture_attention(layer) as cap:
        layer(x)
    return cap.trace(0, src_tokens=list("abcde"), model="hand-written")


def _traces(tmp_path) -> dict[str, AttentionTrace]:
    """One trace from each source: a zoo model, capture, minilm, Hugging Face folders, an adapter file."""
    out = {"zoo": registry.load("reverse").trace(["abc"], ["cba"])[0], "capture": _hand_written_trace()}
    if "minilm" in registry.all_names():
        out["minilm"] = registry.load("minilm").trace(["The cat sat."])[0]
    specs = _specs()
    for name in ("gpt2", "bart"):
        cls, cfg, tok = specs[name]
        torch.manual_seed(0)
        folder = tmp_path / name
        cls(cfg).eval().save_pretrained(folder)
        tok.save_pretrained(folder)
        out[name] = registry.load(str(folder)).trace(["a b c"])[0]
    out["adapter"] = registry.load("examples/my_adapter.py").trace(["hello"])[0]
    return out


def test_traces_from_every_source_round_trip_and_draw_their_own_tokens(tmp_path, monkeypatch):
    for source, tr in _traces(tmp_path).items():
        for suffix in (".npz", ".json"):
            path = tr.save(tmp_path / f"{source}{suffix}")
            back = AttentionTrace.load(path)
            _equal(tr, back)
            assert AttentionTrace.from_bytes(path.read_bytes(), path.name).to_json() == back.to_json()
            assert back.problems() == [], (source, back.problems())
        monkeypatch.setenv(opened.VIEW_ENV, str(tmp_path / f"{source}.npz"))
        at = run_app(page="attention")
        assert_clean(at)
        kind = tr.kinds[0]
        q, k = tr.axes(kind)
        fig = figure(at, "· layer 0 · head 0")
        assert fig["layout"]["xaxis"]["ticktext"] == token_labels(k), source
        assert fig["layout"]["yaxis"]["ticktext"] == token_labels(q), source
        np.testing.assert_allclose(_array(fig["data"][0]["z"]), tr.probs(kind)[0, 0], atol=1e-6)


def test_trace_pages_draw_and_model_pages_name_the_model(reverse_trace, monkeypatch):
    monkeypatch.setenv(opened.VIEW_ENV, str(reverse_trace))
    for page in TRACE_PAGES:
        at = run_app(page=page)
        assert_clean(at)
        assert at.session_state[K.TRACE], page  # the trace, not a model
        assert not any("needs the model" in i.value for i in at.info), page
    at = run_app(page="audit")
    assert any("All" in s.value and "checks pass" in s.value for s in at.success)
    assert any("leak tests run the model again" in i.value for i in at.info)
    at = run_app(page="decoding")
    assert "top-5 next tokens" in " ".join(
        f["layout"]["title"]["text"] for f in map(_fig, at.get("plotly_chart"))
    )
    for page in MODEL_PAGES:
        at = run_app(page=page)
        assert_no_exception(at)
        lines = [i.value for i in at.info if "needs the model itself" in i.value]
        assert len(lines) == 1 and "**reverse**" in lines[0], (page, [i.value for i in at.info])
    # "Close the trace and load reverse": back to the model, the model pages run.
    at.button(key="needs_model_load").click().run()
    assert_clean(at)
    assert at.session_state[K.TRACE] is None and at.session_state[K.MODEL] == "reverse"
    assert not any("needs the model" in i.value for i in at.info)


def _fig(el):
    import json

    return json.loads(el.proto.spec)


def test_open_from_a_path_only_inside_the_allowed_folders(reverse_trace, tmp_path, monkeypatch):
    at = run_app("reverse", "attention")
    at.sidebar.text_input(key=K.TRACE_PATH).input("/etc/passwd")
    at.sidebar.button(key=K.TRACE_PATH_BUTTON).click().run()
    assert_no_exception(at)
    assert any("outside the folders" in e.value for e in at.sidebar.error), [
        e.value for e in at.sidebar.error
    ]
    assert K.TRACE not in at.session_state  # nothing was opened

    monkeypatch.setenv("ATTNSCOPE_MODEL_DIRS", str(reverse_trace.parent))
    at.sidebar.text_input(key=K.TRACE_PATH).input(str(reverse_trace))
    at.sidebar.button(key=K.TRACE_PATH_BUTTON).click().run()
    assert_clean(at)
    assert any("Opened reverse.npz" in s.value for s in at.sidebar.success)
    fig = figure(at, "· layer 0 · head 0")
    assert fig["layout"]["xaxis"]["ticktext"] == token_labels(AttentionTrace.load(reverse_trace).src_tokens)

    bad = tmp_path / "cut.npz"
    bad.write_bytes(reverse_trace.read_bytes()[:100])
    monkeypatch.setenv("ATTNSCOPE_MODEL_DIRS", str(tmp_path))
    at.sidebar.button(key=K.TRACE_CLOSE_BUTTON).click().run()
    at.sidebar.text_input(key=K.TRACE_PATH).input(str(bad))
    at.sidebar.button(key=K.TRACE_PATH_BUTTON).click().run()
    assert_no_exception(at)
    errors = [e.value for e in at.sidebar.error]
    assert len(errors) == 1 and errors[0].startswith("Cannot open") and "\n" not in errors[0], errors
    assert at.session_state[K.TRACE] is None  # the model is shown again, unharmed
    assert figure(at, "· layer 0 · head 0")


def test_a_trace_with_nan_and_a_leaking_mask_opens_with_warnings(reverse_trace, tmp_path, monkeypatch):
    tr = AttentionTrace.load(reverse_trace)
    probs = tr.enc_self.copy()
    probs[0, 1, 0, :] = np.nan
    mask = tr.enc_self_mask.copy()
    mask[:, -1] = False  # the mask forbids the last key, which the maps use
    path = tr.replace(enc_self=probs, enc_self_mask=mask).save(tmp_path / "odd.npz")
    monkeypatch.setenv(opened.VIEW_ENV, str(path))
    for page in ("attention", "masks", "heads", "audit"):
        at = run_app(page=page)
        assert_no_exception(at)
        shown = " ".join(w.value for w in at.sidebar.warning)
        assert "NaN" in shown and "layer 0, head 1" in shown, shown
    failed = " ".join(e.value for e in at.error)  # the audit page, last: its static checks fail
    assert "FAIL" in failed and "declared_mask[enc_self]" in failed, failed


def test_capture_flags_in_a_trace_show_on_every_page_that_draws_it(reverse_trace, tmp_path, monkeypatch):
    """What capture could not verify travels in the file and is one warning above each page."""
    tr = AttentionTrace.load(reverse_trace)
    note = (
        "encoder.layers.0.attn (12, 7, 7): could not verify: the queries were not projected inside the call"
    )
    path = tr.replace(meta={**tr.meta, "capture_notes": [note]}).save(tmp_path / "flagged.npz")
    monkeypatch.setenv(opened.VIEW_ENV, str(path))
    for page in ("attention", "masks", "heads", "bertviz", "model"):
        at = run_app(page=page)
        assert_no_exception(at)
        shown = [w.value for w in at.warning if "what it could not verify, left out, or drew" in w.value]
        assert len(shown) == 1 and "(1 note, one per module and reason)" in shown[0] and note in shown[0], (
            page
        )


def test_a_trace_where_only_some_positions_ask_opens_on_every_trace_page(tmp_path, monkeypatch):
    """Self-attention where only some positions ask (agents among entities), drawn at their rows: every page
    that needs only the trace draws it without an error, the audit too (its empty rows are no dead queries)."""
    from test_capture_trace_tokens import Agents

    torch.manual_seed(0)
    model = Agents().eval()
    with torch.no_grad(), capture_attention(model) as cap:
        model(torch.randn(1, 6, 5), torch.zeros(1, 6, dtype=torch.bool))
    path = cap.trace(0, src_tokens=list("abcdef"), model="agents").save(tmp_path / "agents.npz")
    monkeypatch.setenv(opened.VIEW_ENV, str(path))
    for page in TRACE_PAGES:
        at = run_app(page=page)
        assert_clean(at)


assert set(TRACE_PAGES + MODEL_PAGES) == set(PAGES) | set(ANALYSIS_PAGES)
