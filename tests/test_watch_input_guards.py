"""attnscope.watch's guards on what a training loop hands it: a run folder continued with another probe is
refused before anything is written (and a folder that already mixes probe or model shapes still draws on
the Training page), a model that grows a layer mid-run is said once and drawn, negative and fractional
steps are refused in one sentence, and a metric that is not one number is said once, not dropped in
silence."""

from __future__ import annotations

import json
import math
import shutil
import warnings

import numpy as np
import pytest
import torch
from apptest_helpers import _array, assert_no_exception, figure, run_app
from torch import nn

import attnscope
from attnscope.core.runs import runfile
from attnscope.core.runs.runfile import Run
from attnscope.dashboard import keys as K
from attnscope.dashboard import watched


class Attn(nn.Module):
    """One causal self-attention written by hand (4 heads of 4)."""

    def __init__(self, d: int = 16, h: int = 4):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in self.qkv(x).split(d, -1))
        a = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.h)
        a = a.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        return self.o((a @ v).transpose(1, 2).reshape(b, t, d))


class LM(nn.Module):
    """A tiny causal LM whose layers can be added to mid-run (``blocks.append``)."""

    def __init__(self, layers: int = 2, vocab: int = 11, d: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Attn(d) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 11, (batch, length), generator=torch.Generator().manual_seed(seed))


def _watched(run_dir, probe, steps, model=None, **kw):
    w = attnscope.watch(model or LM(), probe, every=2, run_dir=run_dir, **kw)
    for s in steps:
        w.step(s, loss=1.0 / (s + 1))
    w.close()
    return run_dir


def _files(run_dir) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _said(caught, part: str) -> list[str]:
    return [str(x.message) for x in caught if part in str(x.message)]


@pytest.fixture(autouse=True)
def _fresh_caches():
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()


# -- 1. a run folder continued with another probe ------------------------------------------------------


def test_a_run_continued_with_another_probe_is_refused_before_anything_is_written(tmp_path):
    run_dir = _watched(tmp_path / "r", _ids(2, 6), range(5))
    before = _files(run_dir)
    for other in (_ids(3, 8, seed=1), _ids(2, 8, seed=1), _ids(2, 6, seed=1)):  # count, length, ids
        with pytest.raises(ValueError, match="another probe") as err:
            attnscope.watch(LM(), other, every=2, run_dir=run_dir)
        assert "new run_dir" in str(err.value)
        assert _files(run_dir) == before  # nothing written: not the header, not a scalar
    with pytest.raises(ValueError, match=r"2 inputs of 6 tokens there, 3 inputs of 8 tokens here"):
        attnscope.watch(LM(), _ids(3, 8, seed=1), every=2, run_dir=run_dir)
    # the run's own probe continues it (other token labels too: the ids are the probe, not the vocab)
    w = attnscope.watch(LM(), _ids(2, 6), every=2, run_dir=run_dir, vocab=[f"t{i}" for i in range(11)])
    assert w.last_step == 4 and w.step(6, loss=0.1)
    w.close()
    assert Run.open(run_dir).steps() == [0, 2, 4, 6]


def test_a_run_from_before_the_digest_is_compared_by_its_steps_shapes(tmp_path):
    run_dir = _watched(tmp_path / "r", _ids(2, 6), range(3))
    head = json.loads((run_dir / "run.json").read_text())
    del head["probe"]["digest"]  # as an older attnscope wrote it
    (run_dir / "run.json").write_text(json.dumps(head))
    with pytest.raises(ValueError, match="another probe"):
        attnscope.watch(LM(), _ids(2, 9, seed=3), every=2, run_dir=run_dir)
    attnscope.watch(LM(), _ids(2, 6), every=2, run_dir=run_dir).close()  # the same shapes: continued


def _mixed_probe_run(tmp_path):
    """A run folder as an older attnscope left it: steps 0-4 on a probe of 2 x 6 tokens, steps 6 and 8
    on one of 3 x 8 (written by another run and moved in)."""
    run_dir = _watched(tmp_path / "mixed", _ids(2, 6), range(5))
    other = _watched(tmp_path / "other", _ids(3, 8, seed=1), range(9))
    for s in (6, 8):
        name = runfile.step_dir_name(s)
        shutil.copytree(other / "steps" / name, run_dir / "steps" / name)
    with open(run_dir / "scalars.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 8, "loss": 0.1}) + "\n")
    return run_dir


def test_the_training_page_draws_a_run_whose_steps_hold_another_probe(tmp_path, monkeypatch):
    run_dir = _mixed_probe_run(tmp_path)
    monkeypatch.setenv(watched.RUN_ENV, str(run_dir))
    at = run_app()
    assert_no_exception(at)
    said = [x.value for x in at.warning if "shaped unlike the latest" in x.value]
    assert len(said) == 1 and "steps 0, 2 and 4" in said[0] and "3 probe inputs" in said[0], said
    entropy = figure(at, "entropy per head")
    assert list(_array(entropy["data"][0]["x"])) == [6, 8]  # the steps shaped as the latest only
    assert [f["name"] for f in figure(at, "through training")["frames"]] == ["6", "8"]
    at.select_slider(key=K.TRAIN_STEP).set_value(2).run()  # an odd step: its own maps, no error
    assert_no_exception(at)
    assert figure(at, "at step 2: all layers")
    at.selectbox(key=K.TRAIN_PROBE).set_value(2).run()  # an input step 2 does not have
    assert_no_exception(at)
    assert any("Step 2 holds no" in x.value for x in at.info), [x.value for x in at.info]


# -- 2. a model that grows a layer mid-run -------------------------------------------------------------


def test_a_model_that_grows_a_layer_is_said_once_and_drawn(tmp_path, monkeypatch):
    m = LM(layers=1)
    w = attnscope.watch(m, _ids(2, 6), every=2, run_dir=tmp_path / "g")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.step(0, loss=1.0)
        m.blocks.append(Attn())
        w.step(2, loss=0.9)
        m.blocks.append(Attn())
        w.step(4, loss=0.8)
    w.close()
    said = _said(caught, "changed shape")
    assert len(said) == 1, said
    assert "step 2" in said[0] and "2 layers" in said[0] and "step 0 had" in said[0] and "1 layer " in said[0]
    monkeypatch.setenv(watched.RUN_ENV, str(tmp_path / "g"))
    at = run_app()
    assert_no_exception(at)
    shaped = [x.value for x in at.warning if "shaped unlike the latest" in x.value]
    assert len(shaped) == 1 and "step 0 (" in shaped[0] and "step 2 (" in shaped[0], shaped
    entropy = figure(at, "entropy per head")
    assert len(entropy["data"]) == 3 * 4  # the latest shape: 3 layers x 4 heads, at step 4 only
    assert list(_array(entropy["data"][0]["x"])) == [4]
    at.select_slider(key=K.TRAIN_STEP).set_value(0).run()
    assert_no_exception(at)
    assert figure(at, "at step 0: all layers")


def test_a_run_continued_with_a_grown_model_is_said_at_its_first_step(tmp_path):
    run_dir = _watched(tmp_path / "r", _ids(2, 6), range(3), model=LM(layers=1))
    w = attnscope.watch(LM(layers=2), _ids(2, 6), every=2, run_dir=run_dir)  # the same probe: taken
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.step(4, loss=0.5)
    w.close()
    said = _said(caught, "changed shape")
    assert len(said) == 1 and "step 2 had" in said[0], said


# -- 3. and 4. steps that are no training step ---------------------------------------------------------


def test_a_negative_step_is_refused_in_one_sentence(tmp_path):
    w = attnscope.watch(LM(), _ids(2, 6), every=2, run_dir=tmp_path / "n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for bad in (-1, -5, np.int64(-2), torch.tensor(-3)):
            with pytest.raises(ValueError, match=r"step must be 0 or more .* got -\d"):
                w.step(bad, loss=1.0)
        with pytest.raises(ValueError, match="0 or more"):
            w.log(-1, lr=0.1)
    assert not _said(caught, "already holds")
    assert w.step(0, loss=1.0)  # the run goes on
    w.close()
    assert [r["step"] for r in Run.open(tmp_path / "n").scalars()] == [0]


def test_a_fractional_step_is_refused_and_whole_numbers_of_any_kind_are_taken(tmp_path):
    w = attnscope.watch(LM(), _ids(2, 6), every=2, run_dir=tmp_path / "f")
    for bad in (0.5, 2.9, np.float32(1.5), torch.tensor(2.5), float("nan"), float("inf")):
        with pytest.raises(ValueError, match="whole number of training steps"):
            w.step(bad, loss=1.0)
    with pytest.raises(ValueError, match="whole number"):
        w.log(0.5, lr=0.1)
    with pytest.raises(ValueError, match="whole number"):
        w.step("3", loss=1.0)
    for good in (0, 1.0, np.int64(2), torch.tensor(3), np.float64(4.0), torch.tensor(5.0), np.array(6)):
        w.step(good, loss=float(good))
    w.log(6, lr=0.1)
    w.close()
    run = Run.open(tmp_path / "f")
    assert run.series()["loss"] == ([0, 1, 2, 3, 4, 5, 6], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert run.steps() == [0, 2, 4, 6]
    assert all(isinstance(r["step"], int) for r in run.scalars())


# -- 5. a metric that is not one number ----------------------------------------------------------------


def test_a_metric_that_is_not_one_number_is_said_once_per_name(tmp_path):
    w = attnscope.watch(LM(), _ids(2, 6), every=10, run_dir=tmp_path / "m")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.step(0, loss=torch.tensor([0.7, 0.9]), acc="0.5", per_class=np.array([0.1, 0.2]), lr=0.1)
        w.step(1, loss=torch.tensor([0.6, 0.8]), acc="0.6", per_class=np.array([0.3, 0.4]), lr=0.1)
        w.step(2, loss=None, skipped=None, flag=True)  # None: nothing to log, said nothing
        w.log(3, acc="0.7", note="hello")
    w.close()
    loss = _said(caught, "loss at step")
    assert len(loss) == 1 and "shape (2,)" in loss[0] and "not recorded" in loss[0], loss
    assert "loss.mean()" in loss[0]
    acc = _said(caught, "acc at step")
    assert len(acc) == 1 and "a string ('0.5')" in acc[0] and "not recorded" in acc[0], acc
    assert len(_said(caught, "per_class at step 0 is a numpy array of shape (2,)")) == 1
    assert len(_said(caught, "flag at step 2 is a bool")) == 1
    assert len(_said(caught, "note at step 3 is a string")) == 1
    assert not _said(caught, "skipped")
    assert all(x.filename == __file__ for x in caught if "not recorded" in str(x.message))  # the loop's line
    run = Run.open(tmp_path / "m")
    assert run.series() == {"lr": ([0, 1], [0.1, 0.1])}


def test_a_closed_watcher_refuses_log_as_it_refuses_step(tmp_path):
    """``w.log`` after ``w.close()`` is the same one sentence as ``w.step`` (it raised an I/O error from the
    run file), and the run on disk is left as it was."""
    w = attnscope.watch(LM(), _ids(2, 5), every=2, run_dir=tmp_path / "run")
    w.step(0, loss=1.0)
    w.close()
    before = _files(tmp_path / "run")
    for call in (lambda: w.step(5, loss=0.5), lambda: w.log(5, lr=0.1)):
        with pytest.raises(RuntimeError, match="this watcher is closed"):
            call()
    assert _files(tmp_path / "run") == before
