"""attnscope.watch's inputs: a failing probe said once per run, numbers past a float's range, metrics named
as the run's own fields, probes, run folders, vocab dicts and step counts of the wrong kind refused (or
taken) at watch(), and the over-budget warning's size."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import attnscope
from attnscope.core.runs import runfile
from attnscope.core.runs import watch as W
from attnscope.core.runs.runfile import Run

IDS = torch.tensor([[1, 2, 3]])


class Tiny(nn.Module):
    """An embedding and one attention; counts its calls, and fails while ``fail`` is set."""

    def __init__(self, vocab: int = 5):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, 8)
        self.att = nn.MultiheadAttention(8, 2, batch_first=True)
        self.calls = 0
        self.fail = False

    def forward(self, ids):
        self.calls += 1
        if self.fail:
            raise RuntimeError("out of memory (pretend)")
        x = self.emb(ids)
        return self.att(x, x, x)[0]


def _record(run_dir, step):
    return Run.open(run_dir).by_step()[step]


def test_a_probe_that_keeps_failing_is_said_once_and_recorded_at_each_step(tmp_path):
    m = Tiny()
    w = attnscope.watch(m, IDS, every=1, run_dir=tmp_path / "r")
    m.fail = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(1, 6):
            assert not w.step(s, loss=1.0)
    w.close()
    said = [str(x.message) for x in caught if "could not probe" in str(x.message)]
    assert len(said) == 1 and "could not probe step 1" in said[0], said
    steps = Run.open(tmp_path / "r").by_step()
    assert all("out of memory" in steps[s]["watch_error"] for s in range(1, 6))


def test_an_integer_past_a_float_is_kept_as_null_and_named_not_finite(tmp_path):
    w = attnscope.watch(Tiny(), IDS, every=10, run_dir=tmp_path / "r")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.step(1, loss=0.5, n_paths=10**400, low=-(10**400))
    w.close()
    assert sum("is not finite at step 1" in str(x.message) for x in caught) == 2
    rec = _record(tmp_path / "r", 1)
    assert rec["loss"] == 0.5 and rec["n_paths"] is None and rec["low"] is None
    assert rec["not_finite"] == ["n_paths", "low"]
    assert Run.open(tmp_path / "r").not_finite() == {"n_paths": 1, "low": 1}
    assert runfile.scalar_value(10**400, finite=False) == float("inf")
    assert runfile.scalar_value(-(10**400)) is None


def test_a_metric_named_time_is_plotted(tmp_path):
    w = attnscope.watch(Tiny(), IDS, every=10, run_dir=tmp_path / "r")
    for s in range(3):
        w.step(s, loss=1.0 / (s + 1), time=0.1 * s)
    w.close()
    series = Run.open(tmp_path / "r").series()
    assert series["time"] == ([0, 1, 2], [0.0, 0.1, 0.2])


def test_a_metric_named_as_a_field_of_the_run_is_kept_under_another_name(tmp_path):
    w = attnscope.watch(Tiny(), IDS, every=10, run_dir=tmp_path / "r")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.step(1, loss=float("nan"), not_finite=3.0, audit=0.9)
        w.step(2, loss=1.0, not_finite=4.0, audit=0.8)
    w.close()
    renamed = [str(x.message) for x in caught if "would collide" in str(x.message)]
    assert len(renamed) == 2 and any("'audit_metric'" in r for r in renamed), renamed
    rec = _record(tmp_path / "r", 1)
    assert rec["not_finite"] == ["loss"] and rec["not_finite_metric"] == 3.0 and rec["audit_metric"] == 0.9
    assert "audit" not in rec
    series = Run.open(tmp_path / "r").series()
    assert series["audit_metric"] == ([1, 2], [0.9, 0.8]) and series["not_finite_metric"][1] == [3.0, 4.0]


@pytest.mark.parametrize(
    "probe, said",
    [
        (np.array([[1, 2, 3]]), "numpy array"),
        ([[1, 2, 3]], "list without tensors"),
        ("a b c", "str"),
        (None, "None"),
        ((), "empty tuple"),
    ],
)
def test_a_probe_of_the_wrong_type_is_refused_before_the_model_runs(tmp_path, probe, said):
    m = Tiny()
    with pytest.raises(TypeError, match=f"probe must be a tensor .*not .*{said}"):
        attnscope.watch(m, probe, every=1, run_dir=tmp_path / "r")
    assert m.calls == 0
    assert not (tmp_path / "r").exists()


def test_a_probe_of_any_type_goes_to_a_forward_given(tmp_path):
    m = Tiny()
    w = attnscope.watch(m, np.array([[1, 2, 3]]), every=1, run_dir=tmp_path / "r",
                        forward=lambda model, p: model(torch.as_tensor(p)))  # fmt: skip
    assert w.step(0)
    w.close()
    assert Run.open(tmp_path / "r").steps() == [0]


def test_a_run_dir_that_is_a_file_or_under_one_is_refused_before_the_probe(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    for run_dir in (f, f / "r"):
        m = Tiny()
        with pytest.raises(ValueError, match=f"run_dir {run_dir}.*(is a file|cannot be made)"):
            attnscope.watch(m, IDS, every=1, run_dir=run_dir)
        assert m.calls == 0
    with pytest.raises(ValueError, match="is a file, not a folder"):
        runfile.RunWriter(f, {})


@pytest.mark.parametrize(
    "vocab",
    [
        {0: "<pad>", 1: "a", 2: "b", 3: "c", 4: "d"},  # id -> token
        {np.int64(i): t for i, t in enumerate(["<pad>", "a", "b", "c", "d"])},
        json.loads(json.dumps({0: "<pad>", 1: "a", 2: "b", 3: "c", 4: "d"})),  # ids as strings (JSON)
        {"<pad>": 0, "a": 1, "b": 2, "c": 3, "d": 4},  # token -> id
    ],
)
def test_a_vocab_dict_either_way_labels_the_tokens(tmp_path, vocab):
    w = attnscope.watch(Tiny(), IDS, every=1, run_dir=tmp_path / "r", vocab=vocab)
    w.step(0)
    w.close()
    assert Run.open(tmp_path / "r").traces(0)[0].src_tokens == ("a", "b", "c")


def test_a_vocab_dict_neither_way_is_one_sentence(tmp_path):
    with pytest.raises(ValueError, match="maps ids to tokens .* or tokens to ids"):
        attnscope.watch(Tiny(), IDS, every=1, run_dir=tmp_path / "r", vocab={"a": "b"})


def test_every_may_be_a_numpy_integer(tmp_path):
    w = attnscope.watch(Tiny(), IDS, every=np.int64(2), run_dir=tmp_path / "r")
    assert w.every == 2 and type(w.every) is int
    assert not w.step(1) and w.step(2)
    w.close()
    assert Run.open(tmp_path / "r").header["every"] == 2
    for bad in (True, 0, 2.0, np.float64(2)):
        with pytest.raises(ValueError, match="every must be"):
            attnscope.watch(Tiny(), IDS, every=bad, run_dir=tmp_path / "x")


def test_the_over_budget_warning_names_a_small_budget_unrounded(tmp_path):
    w = attnscope.watch(Tiny(), IDS, every=1, run_dir=tmp_path / "r", budget=100)
    with pytest.warns(UserWarning, match=r"over its budget \(100 bytes\)") as caught:
        w.step(0)
    w.close()
    assert not any("0 MB" in str(x.message) for x in caught)
    assert W.size_text(1536) == "1.5 KB" and W.size_text(1 << 30) == "1 GB" and W.size_text(1) == "1 byte"
