"""What attention moves (core/analysis/analytics.py): sinks, sink shares, parked heads, value-weighted
entropy and the norm-based rollout, each against small hand-made arrays whose answers are worked out
by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnscope.core.analysis import analytics as A
from attnscope.core.traces.trace import KIND_LABELS, AttentionTrace

# -- sinks -------------------------------------------------------------------------------------------------


def test_sink_keys_are_the_first_token_specials_and_punctuation_never_pad():
    toks = ["<bos>", "a", ",", "b", "<eos>", "<pad>"]
    real = np.array([1, 1, 1, 1, 1, 0], bool)
    assert A.sink_keys(toks, real).tolist() == [True, False, True, False, True, False]
    # the first real token is a sink even when it is an ordinary word; [SEP] and "." are sinks
    assert A.sink_keys(["a", "b", ".", "[SEP]"]).tolist() == [True, False, True, True]
    # a real "<pad>" (T5's decoder start) is a sink only as the first token
    assert A.sink_keys(["x", "<pad>"]).tolist() == [True, False]


def _heads() -> tuple[np.ndarray, np.ndarray]:
    """(probs (1, 3, 3, 3), value norms (1, 3, 3)); key 0 is the one sink; query 2 is PAD."""
    probs = np.zeros((1, 3, 3, 3))
    probs[0, 0, :2] = [0.5, 0.5, 0.0]  # head 0: half the weight on the sink ...
    probs[0, 1, :2] = [0.5, 0.5, 0.0]  # head 1: the same weights
    probs[0, 2, :2] = [0.4, 0.6, 0.0]  # head 2: less than half on the sink
    probs[0, :, 2] = [1.0, 0.0, 0.0]  # the PAD query row: all on the sink; must not count
    norms = np.array([[[1.0, 3.0, 7.0], [1.0, 1.0, 1.0], [0.01, 1.0, 1.0]]])
    return probs, norms


def test_sink_shares_by_hand():
    probs, norms = _heads()
    sinks = np.array([True, False, False])
    q_real = np.array([True, True, False])
    weight, moves = A.sink_shares(probs, sinks, q_real, norms)
    np.testing.assert_allclose(weight, [[0.5, 0.5, 0.4]])
    # head 0: 0.5*1 / (0.5*1 + 0.5*3) = 0.25; head 1: 0.5 / 1 = 0.5; head 2: 0.004 / (0.004 + 0.6)
    np.testing.assert_allclose(moves, [[0.25, 0.5, 0.004 / 0.604]])
    # without q_real the PAD row (all weight on the sink) counts: the shares rise
    weight_all, _ = A.sink_shares(probs, sinks, None, norms)
    np.testing.assert_allclose(weight_all, [[2 / 3, 2 / 3, 1.8 / 3]])  # (0.4 + 0.4 + 1) / 3
    assert A.sink_shares(probs, sinks, q_real)[1] is None  # no value norms: no moves share


def test_parked_thresholds_are_inclusive_and_need_both_conditions():
    probs, norms = _heads()
    weight, moves = A.sink_shares(probs, np.array([True, False, False]), np.array([1, 1, 0], bool), norms)
    # head 0: weight 0.5 (>= 0.5) and moves 0.25 (<= 0.5 * 0.5): parked, on both boundaries
    # head 1: moves 0.5 > 0.25: not parked; head 2: weight 0.4 < 0.5: not parked, whatever it moves
    assert A.parked(weight, moves).tolist() == [[True, False, False]]
    assert A.parked(np.array([0.5, 0.5, 0.4999, 0.9]), np.array([0.25, 0.2501, 0.0, np.nan])).tolist() == [
        True,
        False,
        False,
        False,
    ]


def test_value_weighted_entropy_by_hand():
    probs = np.array([[[[0.5, 0.5], [0.5, 0.5]]]])  # (1, 1, 2, 2)
    # equal norms: the moves rows are the weights, entropy ln 2
    np.testing.assert_allclose(A.value_weighted_entropy(probs, np.array([[[2.0, 2.0]]])), [[math.log(2)]])
    # norms 1 and 3: shares 0.25, 0.75
    want = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    np.testing.assert_allclose(A.value_weighted_entropy(probs, np.array([[[1.0, 3.0]]])), [[want]])
    # a key whose value is 0 moves nothing: one key left, entropy 0
    np.testing.assert_allclose(A.value_weighted_entropy(probs, np.array([[[0.0, 3.0]]])), [[0.0]], atol=1e-12)


def test_normalized_moves_equal_the_trace_moves():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5), size=(2, 3, 4)).astype(np.float32)  # (2, 3, 4, 5)
    norms = rng.uniform(0.1, 3, size=(2, 3, 5)).astype(np.float32)
    tr = AttentionTrace(
        "m", "m", "cpu", tuple("abcde"), cross=p, cross_value_norms=norms, tgt_tokens=tuple("wxyz")
    )
    np.testing.assert_allclose(A.normalized_moves(p, norms), tr.moves("cross", normalize=True), rtol=1e-5)


# -- sink records and the sentence on a hand-made trace -----------------------------------------------------


def _trace(with_norms: bool = True) -> AttentionTrace:
    probs, norms = _heads()
    return AttentionTrace(
        "hand", "hand", "cpu", ("<bos>", "a", "<pad>"),
        enc_self=probs.astype(np.float32), enc_self_mask=np.array([[1, 1, 0]] * 3, bool),
        src_real=np.array([True, True, False]),
        enc_self_value_norms=norms.astype(np.float32) if with_norms else None,
    )  # fmt: skip


def test_sink_records_and_the_sentence():
    rows = A.sink_records(_trace())
    assert [r["head"] for r in rows] == [0, 1, 2]  # by weight share, highest first (ties keep head order)
    assert [r["parked"] for r in rows] == [True, False, False]
    assert rows[0]["main sink"] == "<bos>"
    np.testing.assert_allclose([r["sink moves"] for r in rows], [0.25, 0.5, 0.004 / 0.604], rtol=1e-5)
    sentence = A.parked_sentence(rows, KIND_LABELS)
    assert sentence.startswith("1 of 3 encoder self-attention heads are parked on `<bos>`")
    assert "layer 0 head 0 (50% of the weight, 25% of what moves)" in sentence
    bare = A.sink_records(_trace(with_norms=False))
    assert not any(r["parked"] for r in bare) and all(math.isnan(r["sink moves"]) for r in bare)
    assert A.parked_sentence(bare, KIND_LABELS) == ""
    stats = A.trace_sink_stats(_trace(), "enc_self")
    np.testing.assert_allclose(stats["sink_weight"], [[0.5, 0.5, 0.4]], rtol=1e-6)
    assert np.isnan(A.trace_sink_stats(_trace(False), "enc_self")["vw_entropy"]).all()


# -- norm-based rollout ------------------------------------------------------------------------------------


def test_norm_rollout_by_hand():
    probs = np.array([[[[0.5, 0.5], [0.0, 1.0]]]])  # (1 layer, 1 head, 2, 2)
    vnorm = np.array([[[2.0, 2.0]]])
    rnorm = np.array([[1.0, 3.0]])
    # row 0: [0.5*2 + 1, 0.5*2] = [2, 1] -> [2/3, 1/3]; row 1: [0, 1*2 + 3] -> [0, 1]
    c = np.array([[2 / 3, 1 / 3], [0.0, 1.0]])
    np.testing.assert_allclose(A.norm_rollout(probs, vnorm, rnorm)[0], c)
    two = A.norm_rollout(
        np.concatenate([probs, probs]), np.concatenate([vnorm, vnorm]), np.concatenate([rnorm, rnorm])
    )
    np.testing.assert_allclose(two[1], c @ c)  # [[4/9, 5/9], [0, 1]]
    np.testing.assert_allclose(two[1], [[4 / 9, 5 / 9], [0, 1]])
    # without the residual term: the weights times the norms, rows scaled
    np.testing.assert_allclose(A.norm_layers(probs, np.array([[[1.0, 3.0]]]))[0], [[0.25, 0.75], [0, 1]])


def test_norm_rollout_with_equal_norms_is_attention_rollout():
    """All ||f_h(x_j)|| = 1 and ||x_i|| = H: C = (sum_h A_h + H I) / 2H = 0.5 I + 0.5 mean_h A_h."""
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(6), size=(3, 4, 6))  # (3 layers, 4 heads, 6, 6)
    norm = A.norm_rollout(probs, np.ones((3, 4, 6)), np.full((3, 6), 4.0))
    np.testing.assert_allclose(norm, A.rollout(probs), atol=1e-12)


def test_norm_rollout_leaves_out_invalid_tokens():
    rng = np.random.default_rng(2)
    probs = rng.dirichlet(np.ones(4), size=(2, 2, 4))
    probs[..., 3] = 0.0  # nobody attends to the PAD key ...
    probs /= probs.sum(-1, keepdims=True)
    vn, rn = rng.uniform(0.5, 2, (2, 2, 4)), rng.uniform(0.5, 2, (2, 4))
    valid = np.array([True, True, True, False])
    got = A.norm_rollout(probs, vn, rn, valid)
    assert got.shape == (2, 3, 3)
    np.testing.assert_allclose(got, A.norm_rollout(probs[..., :3, :3], vn[..., :3], rn[:, :3]))
    np.testing.assert_allclose(got.sum(-1), 1.0)


def test_norm_based_attribution_on_a_zoo_trace():
    import attnscope

    tr = attnscope.load("reverse").trace(["attention"])[0]
    attr = A.source_attribution(tr, method="norm")
    np.testing.assert_allclose(attr.sum(-1), 1.0, atol=1e-9)
    assert not np.allclose(attr, A.source_attribution(tr))  # the norms change the picture
    # the encoder's norm-based rollout, layer by layer, by hand from the trace's arrays
    p, vn, rn = tr.probs("enc_self"), tr.value_norms("enc_self"), tr.residual_norms("enc_self")
    acc = np.eye(p.shape[-1])
    for ly in range(p.shape[0]):
        c = np.einsum("hqk,hk->qk", p[ly].astype(np.float64), vn[ly].astype(np.float64)) + np.diag(rn[ly])
        acc = (c / c.sum(-1, keepdims=True)) @ acc
    np.testing.assert_allclose(A.trace_rollout(tr, method="norm")[-1], acc, atol=1e-9)
    bare = tr.replace(enc_self_value_norms=None, cross_value_norms=None)
    assert not A.has_norms(bare, "enc_self")
    with pytest.raises(ValueError, match="no value"):
        A.source_attribution(bare, method="norm")


def test_a_head_of_nan_rows_names_no_sink():
    import attnscope
    from attnscope.core.analysis import analytics

    tr = attnscope.load("reverse").trace(["attention"])[0]
    probs = tr.enc_self.copy()
    probs[0, 1] = np.nan  # a whole head broken
    rows = analytics.sink_records(tr.replace(enc_self=probs))
    broken = next(r for r in rows if r["kind"] == "enc_self" and r["layer"] == 0 and r["head"] == 1)
    assert broken["main sink"] == "" and not broken["parked"]
    fine = next(r for r in rows if r["kind"] == "enc_self" and r["layer"] == 0 and r["head"] == 0)
    assert fine["main sink"] != ""
