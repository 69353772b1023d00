"""Probe ax2: five pages and checks that disagreed with the trace they show. Learned keys outside the
sequence on the Heads page and in the fully_masked check, NaN rows in the Masks page's all-zero check, a
sliding-window layer in the Mask audit's mask comparison, and an encoder trace with no outputs on the
Decoding page. The traces are written by hand (numpy), so each test reads exactly the case it names.
"""

from __future__ import annotations

import numpy as np
import pytest
from apptest_helpers import _array, assert_no_exception, figure, figures, run_app

from attnscope.core.analysis import analytics as A
from attnscope.core.analysis import audit
from attnscope.core.analysis.tables import masked_mass_table
from attnscope.core.traces.trace import AttentionTrace
from attnscope.dashboard import keys as K
from attnscope.dashboard import opened
from attnscope.dashboard.plots.audit import compare_codes
from attnscope.dashboard.plots.common import token_label

MEMORY = ["<mem_k 0>", "<mem_k 1>"]


def _softmax(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Rows of softmax over the allowed entries (a row with none allowed: NaN, as -inf everywhere gives)."""
    s = np.where(allowed, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _memory_trace(learned_weight: bool = True) -> AttentionTrace:
    """Encoder self-attention, 2 layers x 2 heads over 5 tokens, and 2 learned memory keys every query may
    see. Layer 1 lets queries 3 and 4 see no token: all their weight goes to the memory keys (or, with
    ``learned_weight`` False, nowhere: the row comes out all zero)."""
    rng = np.random.default_rng(0)
    n, m = 5, len(MEMORY)
    masks = np.ones((2, n, n), bool)
    masks[1, 3:] = False
    scores = rng.normal(size=(2, 2, n, n + m))
    allowed = np.concatenate([np.broadcast_to(masks[:, None], (2, 2, n, n)), np.ones((2, 2, n, m), bool)], -1)
    p = _softmax(scores, allowed)
    tokens, learned = p[..., :n].copy(), p[..., n:].copy()
    if not learned_weight:
        learned[1, :, 3:] = 0.0
    return AttentionTrace(
        model="hand",
        config_name="hand",
        device="cpu",
        src_tokens=tuple("abcde"),
        enc_self=tokens,
        enc_self_mask=masks[0],
        enc_self_layer_masks=masks,
        enc_self_learned=learned,
        src_real=np.ones(n, bool),
        meta={"learned_keys": {"enc_self": MEMORY}},
    )


def _open(monkeypatch, tmp_path, tr: AttentionTrace, name: str) -> None:
    monkeypatch.setenv(opened.VIEW_ENV, str(tr.save(tmp_path / f"{name}.npz")))


# -- 1. Heads page: the learned keys' columns ------------------------------------------------------------


def test_heads_page_draws_the_learned_keys_as_columns_and_says_so(tmp_path, monkeypatch):
    tr = _memory_trace()
    _open(monkeypatch, tmp_path, tr, "memory")
    at = run_app(page="heads")
    at.selectbox(key=K.HA_LAYER).set_value(1).run()
    assert_no_exception(at)
    heat = figure(at, " · layer 1 · head 0 ·")["data"][0]
    z = _array(heat["z"]).astype(np.float64)
    assert z.shape == (5, 7)
    assert list(heat["x"])[-2:] == [f"{5 + i} {token_label(t)}" for i, t in enumerate(MEMORY)]
    np.testing.assert_allclose(z.sum(-1), 1.0, atol=1e-6)  # whole rows, queries 3 and 4 included
    np.testing.assert_allclose(z[:, 5:], tr.enc_self_learned[1, 0], atol=1e-7)
    notes = " ".join(i.value for i in at.info)
    assert "2 learned key(s)" in notes and "<mem_k 0>" in notes


def test_head_entropy_counts_the_weight_on_learned_keys():
    tr = _memory_trace()
    full = np.concatenate([tr.enc_self, tr.enc_self_learned], -1).astype(np.float64)  # (L, H, Q, K + M)
    want = -(full * np.log(np.where(full > 0, full, 1.0))).sum(-1).mean(-1)  # (L, H)
    got = A.trace_head_stats(tr, "enc_self")["entropy"]
    np.testing.assert_allclose(got, want, rtol=1e-5)


# -- 2. Masks page: NaN rows are not held against the all-zero rows -------------------------------------


def test_masked_mass_table_leaves_nan_rows_out_of_the_all_zero_check(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    real = np.array([True, True, True, False])
    mask = real[:, None] & real[None, :]  # the PAD query may attend to nothing: its row is NaN
    p = _softmax(rng.normal(size=(2, 2, 4, 4)), np.broadcast_to(mask, (2, 2, 4, 4)))
    assert np.isnan(p[..., 3, :]).all() and not np.isnan(p[..., :3, :]).any()
    tr = AttentionTrace(
        model="nan rows", config_name="hand", device="cpu", src_tokens=("a", "b", "c", "<pad>"),
        enc_self=p, enc_self_mask=mask, src_real=real,
    )  # fmt: skip
    table = masked_mass_table([tr])
    assert (table["NaN rows"] == 1).all() and (table["fully masked rows"] == 1).all()
    assert table["ok"].all(), table
    _open(monkeypatch, tmp_path, tr, "nanrows")
    at = run_app(page="masks")
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert any("exactly 0 attention on masked keys" in s.value for s in at.success)


# -- 3. Mask audit: a row that attends only to learned keys is not fully masked -------------------------


def test_fully_masked_check_counts_rows_that_attend_to_learned_keys():
    verdict = audit.check_fully_masked([_memory_trace()], "enc_self")
    assert verdict.passed, verdict.detail
    row_sums = audit.check_row_sums([_memory_trace()], "enc_self")
    assert row_sums.passed, row_sums.detail
    # the same rows with no weight on the learned keys either attend to nothing: still a failure
    dead = audit.check_fully_masked([_memory_trace(learned_weight=False)], "enc_self")
    assert not dead.passed and "-> zeros" in dead.detail


# -- 4. Mask audit page: the comparison at a sliding-window layer is the check's -------------------------


def _window_trace() -> AttentionTrace:
    """3 layers x 2 heads; layer 1 attends within a window of 1 position on either side; 2 PAD keys."""
    rng = np.random.default_rng(2)
    tokens = ("[CLS]", "a", "b", "c", "[SEP]", "<pad>", "<pad>")
    n = len(tokens)
    real = np.arange(n) < 5
    base = np.broadcast_to(real[None, :], (n, n))
    i = np.arange(n)
    masks = np.stack([base, base & (np.abs(i[:, None] - i[None, :]) <= 1), base])  # (L, Q, K)
    p = _softmax(rng.normal(size=(3, 2, n, n)), np.broadcast_to(masks[:, None], (3, 2, n, n)))
    return AttentionTrace(
        model="window", config_name="hand", device="cpu", src_tokens=tokens, enc_self=p,
        enc_self_mask=masks[0], enc_self_layer_masks=masks, src_real=real,
    )  # fmt: skip


def test_audit_mask_comparison_at_a_window_layer_agrees_with_the_check(tmp_path, monkeypatch):
    tr = _window_trace()
    assert audit.check_declared_mask([tr], "enc_self").passed
    assert audit.layer_rules([tr], "enc_self") == {1: ("window", 1)}
    _open(monkeypatch, tmp_path, tr, "window")
    at = run_app(page="audit")
    at.selectbox(key=K.AUD_LAYER).set_value(1).run()
    assert_no_exception(at)
    fig = figure(at, "mask the model used")
    z = _array(fig["data"][0]["z"])
    assert not (z == 3).any()  # nothing "masked, must be allowed": the window hides those keys by design
    _, expected = audit.expected_mask(tr, "enc_self")
    called_for, _ = audit.within_rule("enc_self", ("window", 1), expected)
    np.testing.assert_array_equal(z, compare_codes(called_for, tr.mask("enc_self", 1)))
    assert "within its window" in fig["layout"]["title"]["text"]
    assert any("sliding window" in c.value for c in at.caption)


# -- 5. Decoding page: an encoder trace with no outputs ---------------------------------------------------


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_decoding_page_says_an_encoder_trace_holds_no_output(tmp_path, monkeypatch, suffix):
    tr = _memory_trace()
    monkeypatch.setenv(opened.VIEW_ENV, str(tr.save(tmp_path / f"memory{suffix}")))
    at = run_app(page="decoding")
    assert_no_exception(at)
    notes = " ".join(i.value for i in at.info)
    assert "holds no output" in notes and "Its output: ." not in notes
    assert not figures(at)  # no empty chart of 0 values
