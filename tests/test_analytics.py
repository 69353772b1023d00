"""Head analytics on hand-built attention maps whose answers are known; rollout vs plain numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from attnscope.core.analysis import analytics as A
from attnscope.core.families.native import LoadedModel
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer.config import tiny
from attnscope.core.transformer.model import Transformer
from attnscope.core.transformer.tokenizer import CharTokenizer
from attnscope.dashboard.plots import analytics as P


def stack(*heads: np.ndarray) -> np.ndarray:
    """Heads (Q, K) -> (1 layer, H, Q, K)."""
    return np.stack(heads)[None]


def diag(n: int) -> np.ndarray:
    return np.eye(n)


def previous(n: int) -> np.ndarray:
    p = np.zeros((n, n))
    p[0, 0] = 1.0
    p[np.arange(1, n), np.arange(n - 1)] = 1.0
    return p


def following(n: int) -> np.ndarray:
    p = np.zeros((n, n))
    p[np.arange(n - 1), np.arange(1, n)] = 1.0
    p[n - 1, n - 1] = 1.0
    return p


def column(n: int, k: int) -> np.ndarray:
    p = np.zeros((n, n))
    p[:, k] = 1.0
    return p


def random_probs(rng, shape) -> np.ndarray:
    x = rng.random(shape) ** 3
    return x / x.sum(-1, keepdims=True)


N = 6


def test_head_type_scores_on_pure_heads():
    s = A.head_stats(stack(diag(N), previous(N), following(N), column(N, 0), column(N, N - 1)))
    # heads: diagonal, previous (row 0 reads itself), next (last row reads itself), first, last
    np.testing.assert_allclose(s["diagonal"][0], [1, 1 / N, 1 / N, 1 / N, 1 / N])
    np.testing.assert_allclose(s["previous"][0], [0, 1, 0, 1 / (N - 1), 0])
    np.testing.assert_allclose(s["next"][0], [0, 0, 1, 0, 1 / (N - 1)])
    np.testing.assert_allclose(s["first"][0], [1 / N, 2 / N, 0, 1, 0])
    np.testing.assert_allclose(s["last"][0], [1 / N, 0, 2 / N, 0, 1])
    np.testing.assert_allclose(s["entropy"][0], 0.0, atol=1e-12)  # one-hot rows
    np.testing.assert_allclose(s["distance"][0, 0], 0.0)
    np.testing.assert_allclose(s["distance"][0, 1], (N - 1) / N)  # row 0 reads itself


def test_uniform_attention_has_entropy_log_n_and_known_distance():
    s = A.head_stats(np.full((2, 3, N, N), 1.0 / N))
    np.testing.assert_allclose(s["entropy"], math.log(N))
    expected = np.mean([np.mean([abs(q - k) for k in range(N)]) for q in range(N)])
    np.testing.assert_allclose(s["distance"], expected)
    np.testing.assert_allclose(s["diagonal"], 1 / N)


def test_causal_uniform_entropy_is_mean_log_of_visible_keys():
    p = np.tril(np.ones((N, N)))
    p /= p.sum(-1, keepdims=True)
    s = A.head_stats(p[None, None])
    np.testing.assert_allclose(s["entropy"][0, 0], np.mean([math.log(q + 1) for q in range(N)]))
    np.testing.assert_allclose(s["next"][0, 0], 0.0)


def test_padding_is_left_out_of_statistics():
    """Rows of PAD queries hold garbage, keys beyond the real ones are PAD: neither counts."""
    n_real = 4
    p = np.zeros((N, N))
    p[:n_real, :n_real] = np.eye(n_real)
    p[n_real:] = 1.0 / N  # PAD query rows: anything
    q_ok = k_ok = np.arange(N) < n_real
    s = A.head_stats(p[None, None], q_ok, k_ok)
    assert s["diagonal"][0, 0] == pytest.approx(1.0)
    assert s["entropy"][0, 0] == pytest.approx(0.0)
    # last = the last REAL key (EOS), not the last PAD column
    p2 = np.zeros((N, N))
    p2[:, n_real - 1] = 1.0
    assert A.head_stats(p2[None, None], q_ok, k_ok)["last"][0, 0] == pytest.approx(1.0)
    assert A.head_stats(p2[None, None])["last"][0, 0] == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("alignment", "tau"),
    [(np.arange(5), 1.0), (np.arange(5)[::-1], -1.0), (np.zeros(5, int), 0.0)],
    ids=["monotonic", "reversed", "constant"],
)
def test_monotonic_alignment_of_cross_attention(alignment, tau):
    t, s = len(alignment), 7
    p = np.zeros((t, s))
    p[np.arange(t), alignment] = 1.0
    stats = A.head_stats(p[None, None], cross=True)
    assert stats["monotonic"][0, 0] == pytest.approx(tau)
    assert "monotonic" not in A.head_stats(p[None, None])


def test_kendall_tau_matches_scipy_without_ties():
    rng = np.random.default_rng(0)
    for _ in range(5):
        v = rng.permutation(9).astype(float)
        assert A.kendall_tau(v) == pytest.approx(kendalltau(np.arange(9), v).statistic)


# -- rollout ------------------------------------------------------------------------------------


def rollout_direct(probs: np.ndarray) -> np.ndarray:
    """The paper's recipe written out: per layer 0.5 A + 0.5 I, rows normalised, multiplied up."""
    n_layers, _, n, _ = probs.shape
    mats = []
    for ly in range(n_layers):
        a = np.zeros((n, n))
        for h in range(probs.shape[1]):
            a += probs[ly, h] / probs.shape[1]
        a = 0.5 * a + 0.5 * np.eye(n)
        for i in range(n):
            a[i] /= a[i].sum()
        mats.append(a)
    out = np.eye(n)
    for a in mats:
        out = a @ out
    return out


def test_rollout_matches_direct_numpy():
    rng = np.random.default_rng(1)
    probs = random_probs(rng, (3, 4, 5, 5))
    r = A.rollout(probs)
    assert r.shape == (3, 5, 5)
    np.testing.assert_allclose(r[-1], rollout_direct(probs), rtol=1e-12)
    np.testing.assert_allclose(r[0], rollout_direct(probs[:1]), rtol=1e-12)
    np.testing.assert_allclose(r.sum(-1), 1.0)


def test_rollout_with_padding_crops_to_real_tokens():
    rng = np.random.default_rng(2)
    probs = random_probs(rng, (2, 2, 6, 6))
    valid = np.array([1, 1, 1, 1, 0, 0], bool)
    r = A.rollout(probs, valid=valid)
    assert r.shape == (2, 4, 4)
    np.testing.assert_allclose(r[-1], rollout_direct(probs[:, :, :4, :4]), rtol=1e-12)


# -- traces of a tiny model -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm() -> LoadedModel:
    tok = CharTokenizer.fit(["abcdefgh"])
    torch.manual_seed(0)
    cfg = tiny(len(tok), max_len=16)
    return LoadedModel("tiny", None, cfg, Transformer(cfg).eval(), tok, tok)


@pytest.fixture(scope="module")
def traces(lm) -> list[AttentionTrace]:
    return lm.trace(["abcdef", "abc"], ["fedcba", "cba"])


def test_trace_head_stats_and_records(traces):
    tr = traces[1]  # padded sequence
    s = A.trace_head_stats(tr, "cross")
    assert set(s) == set(A.CROSS_STATS) and s["entropy"].shape == (2, 4)
    q_real = np.asarray(tr.tgt_ids) != 0
    k_real = np.asarray(tr.src_ids) != 0
    direct = A.head_stats(tr.probs("cross"), q_real, k_real, cross=True)
    np.testing.assert_allclose(s["entropy"], direct["entropy"])
    rows = A.head_records(tr)
    assert len(rows) == 3 * 2 * 4
    given = {kind: A.trace_head_stats(tr, kind) for kind in tr.kinds}  # computed once, passed in
    assert str(A.head_records(tr, None, given)) == str(rows)  # (str: NaN == NaN)
    assert {r["kind"] for r in rows} == {"enc_self", "dec_self", "cross"}
    assert all(math.isnan(r["monotonic"]) for r in rows if r["kind"] != "cross")
    entropy_max = np.log(k_real.sum())
    assert all(0 <= r["entropy"] <= entropy_max + 1e-6 for r in rows if r["kind"] == "cross")


def test_source_attribution_rows_sum_to_one_and_match_products(traces):
    tr = traces[0]
    att = A.source_attribution(tr)
    c = tr.probs("cross").astype(np.float64).mean(axis=(0, 1))
    np.testing.assert_allclose(att, c @ rollout_direct(tr.probs("enc_self").astype(np.float64)), rtol=1e-9)
    np.testing.assert_allclose(att.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(A.source_attribution(tr, through_encoder=False, layer=1),
                               tr.probs("cross")[1].mean(0), rtol=1e-6)  # fmt: skip


def test_alignment_ignores_pad_keys_and_rows():
    w = np.array([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    np.testing.assert_array_equal(A.alignment(w), [2, 0, 2])
    np.testing.assert_array_equal(A.alignment(w, q_valid=[1, 1, 0], k_valid=[1, 1, 0]), [1, 0, -1])


def test_cross_alignment_on_padded_trace(traces):
    tr = traces[1]
    w, arg = A.cross_alignment(tr, layer=0, head=1)
    np.testing.assert_allclose(w, tr.probs("cross")[0, 1])
    n_src, n_tgt = int((tr.src_ids != 0).sum()), int((tr.tgt_ids != 0).sum())
    assert (arg[:n_tgt] >= 0).all() and (arg[:n_tgt] < n_src).all()
    assert (arg[n_tgt:] == -1).all()


def test_ablation_switches_heads_off(lm):
    iv = A.ablation(lm.cfg, [("enc_self", 1, 2), ("cross", 0, 0)])
    assert iv.head_mask["enc_self"].shape == (2, 4)
    assert float(iv.head_mask["enc_self"][1, 2]) == 0.0 and float(iv.head_mask["enc_self"].sum()) == 7.0
    assert "dec_self" not in iv.head_mask
    with pytest.raises(ValueError, match="heads 0..3"):
        A.ablation(lm.cfg, [("enc_self", 0, 4)])
    base = lm.trace(["abcdef"], ["fedcba"])[0]
    off = A.run_ablation(lm, ["abcdef"], [("cross", 1, h) for h in range(4)], ["fedcba"])[0]
    # attention maps of the switched-off layer are still computed; the output changes
    np.testing.assert_allclose(off.probs("cross")[1], base.probs("cross")[1], atol=1e-6)
    assert not np.allclose(off.out_probs, base.out_probs)


def test_trace_difference_and_head_difference(traces):
    a, b = traces
    assert np.abs(A.trace_difference(a, a, "enc_self")).max() == 0
    d = A.trace_difference(a, b, "cross")
    assert d.shape == (2, 4, min(len(a.tgt_tokens), len(b.tgt_tokens)), len(a.src_tokens))
    np.testing.assert_array_equal(A.trace_difference(a, b, "cross", 1, 3), d[1, 3])  # one head alone
    hd = A.head_difference(a, b, "enc_self")
    assert hd.shape == (2, 4) and (hd >= 0).all() and (hd <= 1 + 1e-9).all() and hd.max() > 0
    n = min(a.enc_self.shape[2], b.enc_self.shape[2])
    pa, pb = a.enc_self[:, :, :n, :n].astype(np.float64), b.enc_self[:, :, :n, :n].astype(np.float64)
    np.testing.assert_allclose(hd, (0.5 * np.abs(pb - pa).sum(-1)).mean(-1), rtol=1e-12)  # mean TV
    other = a.replace(enc_self=a.enc_self[:1])
    with pytest.raises(ValueError, match="layers x heads"):
        A.trace_difference(a, other, "enc_self")


# -- figures ------------------------------------------------------------------------------------------


def test_stat_heatmap_cells_and_click_through():
    v = np.arange(6, dtype=float).reshape(2, 3) / 10
    fig = P.stat_heatmap(v, title="diagonal", stat="diagonal")
    hm = fig.data[0]
    assert np.asarray(hm.z).shape == (2, 3)
    assert list(hm.x) == ["head 0", "head 1", "head 2"] and list(hm.y) == ["layer 0", "layer 1"]
    assert (hm.zmin, hm.zmax) == (0.0, 1.0)
    assert P.parse_head_point(hm.x[2], hm.y[1]) == (1, 2)
    assert P.parse_head_point("mean", "layer 0") is None
    mono = P.stat_heatmap(v - 0.3, title="m", stat="monotonic").data[0]
    assert (mono.zmin, mono.zmax) == (-1.0, 1.0)
    with pytest.raises(ValueError):
        P.stat_heatmap(np.zeros(3), title="bad")


def test_head_table_sorts(traces):
    df = P.head_table(A.head_records(traces[0]))
    assert list(df.columns[:3]) == ["kind", "layer", "head"] and len(df) == 24
    top = df.sort_values("entropy", ascending=False).iloc[0]
    assert top["entropy"] == df["entropy"].max()


def test_matrix_figures_label_rows_and_columns_with_tokens(traces):
    tr = traces[0]
    r = A.rollout(tr.probs("enc_self"))[-1]
    fig = P.rollout_figure(r, tr.src_tokens)
    assert np.asarray(fig.data[0].z).shape == (len(tr.src_tokens),) * 2
    assert list(fig.layout.xaxis.ticktext) == [
        t.replace("<", "&lt;").replace(">", "&gt;") for t in tr.src_tokens
    ]
    d = A.trace_difference(traces[0], traces[0].replace(cross=traces[0].cross[::-1]), "cross")[0, 0]
    fig = P.difference_figure(d, tr.tgt_tokens, tr.src_tokens)
    assert fig.data[0].zmin == -fig.data[0].zmax
    with pytest.raises(ValueError):
        P.rollout_figure(r, tr.src_tokens[:-1])


def test_alignment_figure_draws_one_line_per_strong_weight():
    w = np.array([[0.9, 0.1, 0.0], [0.0, 0.5, 0.5]])
    fig = P.alignment_figure(["a", "b", "c"], ["x", "y"], w, A.alignment(w), min_weight=0.2)
    line_traces = [t for t in fig.data if t.mode == "lines" and t.name != "argmax"]
    n_lines = sum(list(t.x).count(None) for t in line_traces)
    assert n_lines == int((w >= 0.2).sum())
    arg = next(t for t in fig.data if t.name == "argmax")
    assert list(arg.x) == [0, 0, None, 1, 1, None]
    tokens = [t for t in fig.data if t.mode == "markers+text"]
    assert [list(t.text) for t in tokens] == [["a", "b", "c"], ["x", "y"]]
