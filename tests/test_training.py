"""Training: the held-out split holds by construction, training is a fixed number of seeded steps
(deterministic), every task smoke-trains, snapshots load as NAME@STEP everywhere a name is accepted,
and the Training page replays them (AppTest; chromium in test_browser_training.py)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from apptest_helpers import _array, assert_clean, figure, figures, run_app
from safetensors.torch import load_file

from attnscope.core.errors import ModelLoadError
from attnscope.dashboard import keys as K
from attnscope.models import attention_rules as R
from attnscope.models import registry, train
from attnscope.models import tasks as T

TRAINING_PAGE = "app_pages/training.py"
SMOKE_STEPS = 20


# -- training --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Every task trained for a few steps into a temporary folder (as CI does)."""
    out = {}
    for name in T.TASKS:
        folder = tmp_path_factory.mktemp(f"smoke-{name}")
        meta = train.train(name, T.TRAIN_SEED, folder, steps=SMOKE_STEPS, log=lambda _m: None, n_heldout=60)
        out[name] = (folder, meta)
    return out


@pytest.mark.parametrize("name", list(T.TASKS))
def test_smoke_training_loss_falls_and_files_are_written(smoke, name):
    folder, meta = smoke[name]
    history = registry.read_history(folder / train.RUN_DIR)
    curve = history["curve"]
    assert curve[0]["step"] == 0 and curve[-1]["step"] == SMOKE_STEPS
    # the training loss falls (brackets' includes its hint terms; its class loss needs more steps)
    assert curve[1]["train_loss"] > curve[-1]["train_loss"] > 0
    assert all(p["heldout_loss"] > 0 for p in curve)
    metric = "heldout_accuracy" if name == "brackets" else "heldout_exact_match"
    assert meta == json.loads((folder / "meta.json").read_text())
    assert meta["task"] == name and meta["metrics"]["n_heldout"] == 60 and 0 <= meta["metrics"][metric] <= 1
    assert meta["train"]["steps"] == SMOKE_STEPS and meta["train"]["seed"] == T.TRAIN_SEED
    assert meta["train"]["command"] == f"python -m attnscope.models.train --task {name}"
    card = (folder / "card.md").read_text()
    assert (
        f"Held-out {'accuracy' if name == 'brackets' else 'exact match'}: **{meta['metrics'][metric]:.2%}**"
        in card
    )
    assert f"A fixed {SMOKE_STEPS:,} steps" in card and meta["train"]["command"] in card
    steps = [s["step"] for s in history["snapshots"]]
    assert steps == train.snapshot_steps(SMOKE_STEPS) and steps[0] == 0
    for snap in history["snapshots"][:-1]:
        state = load_file(str(folder / snap["file"]))
        assert all(t.dtype == torch.float16 for t in state.values())
    assert history["snapshots"][-1]["file"] == "model.safetensors"
    assert ("hinted_heads" in meta) == (name == "brackets")


def test_training_is_deterministic(tmp_path, smoke):
    """Same task, seed and steps: the same weights, bit for bit."""
    folder, _ = smoke["reverse"]
    again = tmp_path / "again"
    train.train("reverse", T.TRAIN_SEED, again, steps=SMOKE_STEPS, log=lambda _m: None, n_heldout=60)
    a, b = load_file(str(folder / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_snapshot_steps_are_log_spaced():
    steps = train.snapshot_steps(8000)
    assert steps[0] == 0 and steps[-1] == 8000 and 10 <= len(steps) <= 13
    ratios = [b / a for a, b in itertools.pairwise(steps[1:])]
    assert max(ratios) / min(ratios) < 1.3  # about the same ratio each time


# -- committed snapshots ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", registry.ORDER)
def test_committed_snapshots_load_and_step_zero_is_worse(name):
    snaps = registry.snapshots(name)
    steps = [s["step"] for s in snaps]
    assert steps[0] == 0 and steps == train.snapshot_steps(train.RECIPES[name].steps)
    first, last = registry.load(f"{name}@0"), registry.load(f"{name}@{steps[-1]}")
    assert first.name == f"{name}@0" and first.meta["snapshot"]["step"] == 0
    final = registry.load(name)
    for k, v in final.model.state_dict().items():  # the last step is the model itself
        assert torch.equal(v, last.model.state_dict()[k])
    heldout = T.heldout_set(name, 200)
    task = T.get(name)
    acc0 = train.accuracy(first.model, task, heldout, first.src_tok, first.tgt_tok)
    acc1 = train.accuracy(final.model, task, heldout, final.src_tok, final.tgt_tok)
    assert acc1 > acc0 + 0.3, (acc0, acc1)  # measurably worse at step 0
    assert snaps[0]["heldout"] < snaps[-1]["heldout"]


def test_reverse_right_attention_rises_over_training():
    """The anti-diagonal of reverse's cross-attention forms during training."""
    src = "attention"
    kind, rows = R.right_keys("reverse", src)
    scores = []
    for snap in registry.snapshots("reverse"):
        lm = registry.load(f"reverse@{snap['step']}")
        tr = lm.trace([src], [src[::-1]])[0]
        scores.append(float(np.nanmax(R.head_scores(tr.probs(kind), rows))))
    assert scores[0] < 0.3 and scores[-1] > 0.6, scores  # uniform is 0.1 here; the final model ~0.7
    assert scores[-1] > max(scores[:4]) + 0.3


def test_snapshot_names_are_checked():
    with pytest.raises(ModelLoadError, match="no snapshot at step 7; its snapshots are at steps 0, 10"):
        registry.load("reverse@7")
    assert registry.split_snapshot("reverse@10") == ("reverse", 10)
    assert registry.split_snapshot("nosuchmodel@10") == ("nosuchmodel@10", None)
    assert registry.model_kind("reverse@10") == "zoo"
    assert "after 10 training steps" in registry.summary("reverse@10")


def test_cli_lists_snapshots(capsys):
    from attnscope.cli import main

    assert main(["models", "--snapshots", "reverse"]) == 0
    out = capsys.readouterr().out
    for snap in registry.snapshots("reverse"):
        assert f"reverse@{snap['step']}" in out and f"{snap['heldout']:.1%}" in out
    assert main(["models", "--snapshots", "minilm"]) != 0
    assert "only they have snapshots" in capsys.readouterr().err
    assert main(["predict", "--model", "reverse@0", "abc"]) == 0  # NAME@STEP wherever a name is
    assert main(["predict", "--model", "reverse@3", "abc"]) != 0
    assert "no snapshot at step 3" in capsys.readouterr().err


# -- the Training page -----------------------------------------------------------------------------


def _training(model: str, **session):
    at = run_app(model, **{K.TEXT_FOR_MODEL: model, **session})  # (else the model's examples fill the box)
    return at.switch_page(TRAINING_PAGE).run()


def test_training_page_replays_the_snapshots():
    at = _training("reverse", **{K.SOURCE: "stressed"})
    assert_clean(at)
    steps = [s["step"] for s in registry.snapshots("reverse")]
    assert at.select_slider(key=K.TRAIN_STEP).value == steps[-1]
    grid = figure(at, "at step")
    assert f"at step {steps[-1]:,}" in grid["layout"]["title"]["text"]
    replay = figure(at, "through training")
    assert [f["name"] for f in replay["frames"]] == [str(s) for s in steps]
    assert replay["layout"]["updatemenus"][0]["buttons"][0]["label"] == "▶ Play"
    right = figure(at, "right attention per head")
    assert len(right["data"]) == 2 * 4  # one line per decoder layer x head
    assert max(float(np.nanmax(_array(d["y"]))) for d in right["data"]) > 0.6
    # another step: the grid follows, the curves mark it
    at.select_slider(key=K.TRAIN_STEP).set_value(steps[0]).run()
    assert_clean(at)
    assert "at step 0" in figure(at, "at step")["layout"]["title"]["text"]
    curves = figure(at, "learning curves")
    assert any(s.get("x0") == 1 for s in curves["layout"]["shapes"])  # step 0 sits at 1 on the log axis
    # the shared step axis is titled once, under the bottom plot (a title on the top one overlaps it)
    assert not curves["layout"]["xaxis"].get("title", {}).get("text")
    assert "log scale" in curves["layout"]["xaxis2"]["title"]["text"]


def test_training_page_marks_forced_heads():
    at = _training("brackets", **{K.SOURCE: "([]{})"})
    assert_clean(at)
    assert at.radio(key=K.TRAIN_KIND).value == "enc_self"
    grid = figure(at, "at step")
    assert any("trained" in a.get("text", "") for a in grid["layout"].get("annotations", []))
    assert any("Trained to look like this" in c.value for c in at.caption)
    lines = figure(at, "entropy per head")
    assert sum("(trained to look like this)" in d["name"] for d in lines["data"]) == 2


def test_training_page_without_snapshots_says_what_to_pick(make_app, extra_models):
    at = make_app(extra_models[0])
    at.switch_page(TRAINING_PAGE).run()
    assert_clean(at)
    assert any("no training snapshots" in w.value and "reverse" in w.value for w in at.warning)
    assert not figures(at)


def test_training_page_refuses_an_input_outside_the_task():
    at = _training("reverse", **{K.SOURCE: "Hello"})
    assert not at.exception
    assert at.warning or at.error


def test_snapshot_from_the_sidebar_box_and_compare_two_steps():
    at = run_app("reverse")
    at.sidebar.text_input(key=K.LOAD_PATH).input("reverse@145")
    at.sidebar.button(key=K.LOAD_PATH_BUTTON).click().run()
    assert_clean(at)
    assert at.session_state[K.MODEL] == "reverse@145"
    at.switch_page("app_pages/compare.py").run()
    at.radio(key=K.CMP_MODE).set_value("another training step").run()
    assert_clean(at)
    assert figure(at, "how much each head changed")
    assert any("B: reverse@" in m.value for m in at.markdown)


def test_a_link_names_a_snapshot_and_a_step():
    from test_links import _open_link

    at = _open_link({"model": "reverse@145", "text": "abc"}, "attention")
    assert_clean(at)
    assert at.session_state[K.MODEL] == "reverse@145"
    assert at.query_params["model"] in ("reverse@145", ["reverse@145"])  # the link keeps naming it
    at = _open_link({"model": "reverse@7", "text": "abc"}, "attention")
    assert not at.exception
    assert any("no snapshot at step 7" in w.value for w in at.warning), [w.value for w in at.warning]
    assert at.session_state[K.MODEL] != "reverse@7"
