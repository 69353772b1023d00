"""What attention moves on the pages (AppTest): the Attention page's weight | what-moves toggle, its
disabled state on a trace without value vectors, the sink table on Head analytics with its
thresholds, and the attention | norm-based rollout switch. Figures are read back from the chart protos."""

from __future__ import annotations

import numpy as np
import pytest
from apptest_helpers import _array, assert_clean, figure, titles

import attnscope
from attnscope.core.analysis import analytics as A
from attnscope.core.analysis.audit import real_positions
from attnscope.dashboard import keys as K

TEXT = "stressed"
MODE, ROLLOUT = "att_moves_mode", "ha_moves_rollout"  # the pages' own session keys


@pytest.fixture(scope="module")
def reverse_trace():
    return attnscope.load("reverse").trace([TEXT])[0]


def _sink_table(at):
    found = [df.value for df in at.dataframe if "sink weight" in df.value.columns]
    assert len(found) == 1, [list(df.value.columns) for df in at.dataframe]
    return found[0]


def _texts(at) -> str:
    return "\n".join(str(e.value) for kind in ("markdown", "caption", "info") for e in at.get(kind))


def test_toggle_switches_the_head_view_to_what_moves(make_app, reverse_trace):
    at = make_app(
        "reverse", page="attention", **{K.SOURCE: TEXT, K.TEXT_FOR_MODEL: "reverse", K.ATT_KIND: "enc_self"}
    )
    assert_clean(at)
    at.selectbox(key=K.ATT_LAYER).select(1).run()
    at.selectbox(key=K.ATT_HEAD).select(2).run()
    head = figure(at, "encoder self-attention · layer 1 · head 2")
    weights = _array(head["data"][0]["z"])
    np.testing.assert_allclose(weights, reverse_trace.probs("enc_self")[1, 2], atol=1e-6)
    assert "what-moves share %{customdata[1]" in head["data"][0]["hovertemplate"]  # both numbers in the hover

    at.radio(key=MODE).set_value("moves").run()
    assert_clean(at)
    head = figure(at, "encoder self-attention · layer 1 · head 2 · input · what moves")
    z = _array(head["data"][0]["z"])
    want = reverse_trace.moves("enc_self", normalize=True)[1, 2]
    np.testing.assert_allclose(z, want, atol=1e-6)
    assert not np.allclose(z, weights, atol=1e-3)  # the norms change the picture
    hover = head["data"][0]["hovertemplate"]
    assert "what-moves share" in hover and "weight %{customdata[1]" in hover and "‖α·f(x)‖" in hover
    custom = _array(head["data"][0]["customdata"])  # (Q, K, 3): share, weight, raw ‖α f(x)‖
    raw = reverse_trace.moves("enc_self")[1, 2]
    np.testing.assert_allclose(custom[..., 1], weights, atol=1e-6)
    np.testing.assert_allclose(custom[..., 2], raw, rtol=1e-5)
    assert any("what moves" in t and "all 2 layers" in t for t in titles(at))  # the grid follows
    assert "share of what this query receives" in _texts(at)


def test_toggle_is_disabled_on_a_trace_without_values(make_app, reverse_trace, tmp_path, monkeypatch):
    bare = reverse_trace.replace(
        **{
            f"{k}_{what}": None
            for k in ("enc_self", "dec_self", "cross")
            for what in ("value_norms", "residual_norms")
        }
    )
    path = bare.save(tmp_path / "bare.npz")
    monkeypatch.setenv("ATTNSCOPE_MODEL_DIRS", str(tmp_path))
    at = make_app("reverse", page="attention")
    at.sidebar.text_input(key=K.TRACE_PATH).input(str(path))
    at.sidebar.button(key=K.TRACE_PATH_BUTTON).click().run()
    assert_clean(at)
    toggle = at.radio(key=MODE)
    assert toggle.disabled and toggle.value == "weight"
    assert "this trace holds no value vectors" in _texts(at)
    # Head analytics on the same trace: the sink table gives the weight share only, the rollout stays attention
    at.switch_page("app_pages/head_analytics.py").run()
    assert_clean(at)
    assert at.radio(key=ROLLOUT).disabled
    table = _sink_table(at)
    assert table["sink moves"].isna().all() and not table["parked"].any()
    assert "no head can be called parked" in _texts(at)


def test_sink_table_thresholds_and_the_rollout_switch(make_app, reverse_trace):
    at = make_app("reverse", page="heads", **{K.SOURCE: TEXT, K.TEXT_FOR_MODEL: "reverse"})
    assert_clean(at)
    shown = _texts(at)
    assert "weight share is at least 0.5" in shown and "at most 0.5 × its weight share" in shown
    table = _sink_table(at)
    assert list(table.columns) == [
        "kind",
        "layer",
        "head",
        "sink weight",
        "sink moves",
        "parked",
        "main sink",
    ]
    assert len(table) == 3 * 2 * 4  # every head of every kind
    assert (np.diff(table["sink weight"].to_numpy()) <= 0).all()  # sorted by weight share
    want = {(r["kind"], r["layer"], r["head"]): r for r in A.sink_records(reverse_trace)}
    for row in table.itertuples(index=False):
        r = want[(row.kind, row.layer, row.head)]
        assert row[3] == pytest.approx(r["sink weight"], abs=1e-3) and row[5] == r["parked"]
        assert row[5] == (row[3] >= 0.5 and row[4] <= 0.5 * row[3] + 1e-3)
    top = table.iloc[0]
    assert top["main sink"] == "<eos>"  # reverse's encoder heads rest on <eos>
    assert "encoder self-attention head" in shown  # the sentence in words

    # the rollout switch: the formula and the figure follow it
    assert "attention rollout" in " ".join(titles(at))
    at.radio(key=ROLLOUT).set_value("norm").run()
    assert_clean(at)
    assert any(r"\lVert x_i\rVert" in el.value for el in at.get("latex"))
    roll = figure(at, "encoder norm-based rollout through layers 0–1")
    src_real = real_positions(reverse_trace, "src")
    want_roll = A.norm_rollout(
        reverse_trace.probs("enc_self"),
        reverse_trace.value_norms("enc_self"),
        reverse_trace.residual_norms("enc_self"),
        src_real,
    )[-1]
    np.testing.assert_allclose(_array(roll["data"][0]["z"]), want_roll, atol=1e-5)
    attr = figure(at, "norm-based) · input")  # source attribution follows the switch
    np.testing.assert_allclose(
        _array(attr["data"][0]["z"]), A.source_attribution(reverse_trace, method="norm"), atol=1e-5
    )


def test_compare_puts_the_weights_and_what_moves_side_by_side(make_app, reverse_trace):
    at = make_app(
        "reverse",
        page="compare",
        **{
            K.SOURCE: TEXT,
            K.TEXT_FOR_MODEL: "reverse",
            K.CMP_MODE: "what the weights move",
            K.CMP_KIND: "enc_self",
        },
    )
    assert_clean(at)
    at.selectbox(key=K.CMP_LAYER).select(1).run()
    at.selectbox(key=K.CMP_HEAD).select(2).run()
    a = _array(figure(at, "A: the weights α<br>encoder self-attention · layer 1 · head 2")["data"][0]["z"])
    b = figure(at, "B: what moves, ‖α·f(x)‖ (each row scaled to sum 1)<br>encoder self-attention · layer 1")
    np.testing.assert_allclose(a, reverse_trace.probs("enc_self")[1, 2], atol=1e-6)
    np.testing.assert_allclose(_array(b["data"][0]["z"]), reverse_trace.moves("enc_self", normalize=True)[1, 2],
                               atol=1e-6)  # fmt: skip
    per_head = _array(figure(at, "how much each head changed")["data"][0]["z"])
    assert per_head.shape == reverse_trace.probs("enc_self").shape[:2] and np.all(per_head > 0)
