"""The command line: models, predict, trace, and one clear line for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnscope.cli import main
from attnscope.core.traces.trace import AttentionTrace
from attnscope.core.transformer import checkpoint
from attnscope.core.transformer.config import tiny
from attnscope.core.transformer.model import Transformer
from attnscope.core.transformer.tokenizer import CharTokenizer
from attnscope.models import registry

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tok = CharTokenizer.fit(["abcdefghijklmnopqrstuvwxyz "])
    torch.manual_seed(0)
    model = Transformer(tiny(vocab_size=len(tok), max_len=32)).eval()
    path = tmp_path_factory.mktemp("cli") / "tinymodel"
    checkpoint.save(path, model, tok, tok, card="# tiny\n\nUntrained.\n")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnscope", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_models_lists_zoo_with_summaries(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in registry.zoo_names():
        line = next(ln for ln in out.splitlines() if ln.startswith(name))
        assert registry.zoo_summary(name) in line


def test_predict_prints_output(folder, capsys):
    assert main(["predict", "--model", str(folder), "abc", "hello"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    from attnscope.models.registry import load

    lm = load(str(folder))
    assert lines == lm.predict(["abc"]) + lm.predict(["hello"])


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_trace_writes_documented_file(folder, tmp_path, capsys, suffix):
    out = tmp_path / f"trace{suffix}"
    assert main(["trace", "--model", str(folder), "abc", "--target", "cba", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    if suffix == ".npz":
        data = dict(np.load(out, allow_pickle=False))
    else:
        data = {k: np.array(v) for k, v in json.loads(out.read_text()).items() if isinstance(v, list)}
    assert list(data["src_tokens"]) == ["a", "b", "c", "<eos>"]
    assert list(data["tgt_tokens"]) == ["<bos>", "c", "b", "a"]
    assert data["enc_self"].shape == (2, 4, 4, 4)
    assert data["dec_self"].shape == (2, 4, 4, 4)
    assert data["cross"].shape == (2, 4, 4, 4)
    assert data["dec_self_mask"].dtype == bool
    assert data["dec_self_mask"].tolist() == np.tril(np.ones((4, 4), bool)).tolist()


def test_trace_without_target_uses_greedy_output(folder, tmp_path):
    out = tmp_path / "g.npz"
    assert main(["trace", "--model", str(folder), "abc", "--out", str(out)]) == 0
    data = np.load(out, allow_pickle=False)
    assert data["tgt_tokens"][0] == "<bos>"
    assert list(data["tgt_tokens"][1:]) == list(data["out_tokens"][:-1])


@pytest.mark.parametrize(
    "args, message",
    [
        (["predict", "--model", "FOLDER", ""], "empty"),
        (["predict", "--model", "FOLDER", "ABC!"], "unknown characters"),
        (["predict", "--model", "FOLDER", "a" * 200], "at most 31"),
        (["predict", "--model", "no-such-model", "abc"], "unknown model"),
        (["predict", "--model", "FOLDER", "abc", "--device", "tpu"], "unknown device"),
        (["trace", "--model", "FOLDER", "abc", "--out", "x.txt"], ".npz or .json"),
        (["predict", "--model", "BROKEN", "abc"], "config"),
    ],
)
def test_bad_input_exits_nonzero_with_one_line(folder, tmp_path, args, message):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    args = [str(folder) if a == "FOLDER" else str(broken) if a == "BROKEN" else a for a in args]
    proc = run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("error:") and message in lines[0]


def test_capture_flags_print_on_stderr_and_travel_in_the_file(tmp_path, capsys):
    """An adapter whose attention capture cannot verify: the trace is written, and stderr says why."""
    adapter = Path(__file__).resolve().parent / "adapters" / "flagged_outside_queries.py"
    out = tmp_path / "t.json"
    assert main(["trace", "--model", str(adapter), "abc", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "wrote" in captured.out
    assert (
        "warning: capture's notes on the model's attention, what it could not verify, left out, or drew from "
        "another row or step (1 note," in captured.err
    )
    assert "not projected inside the captured call" in captured.err
    assert "could not verify" in AttentionTrace.load(out).meta["capture_notes"][0]


def test_capture_notes_are_counted_as_notes_not_as_calls(capsys):
    """One call with two reasons is two notes, and one note may stand for every call of a module: stderr counts
    what it lists, and never claims a number of attention calls."""
    from attnscope import cli

    notes = ["attn (2, 4, 4): could not verify: a", "attn (2, 4, 4): could not verify: b"]
    cli._capture_warnings({"capture_notes": notes})
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "warning: capture's notes on the model's attention, what it could not verify, left out, or drew from "
        "another row or step (2 notes, one per module "
        "and reason):"
    )
    assert err[1:] == [f"warning:   {n}" for n in notes]


def test_heads_masked_differently_are_a_warning_on_stderr(capsys):
    from attnscope import cli

    cli._capture_warnings({"head_masks_differ": {"enc_self": ["attn.0", "attn.1"]}})
    err = capsys.readouterr().err
    assert "masked differently (enc_self: attn.0, attn.1)" in err and "every head may see" in err
    cli._capture_warnings({"head_masks_differ": "nonsense"})  # a meta from a file: nothing, no traceback
    cli._capture_warnings({"head_masks_differ": {"enc_self": 5}})
    cli._capture_warnings({})
    assert capsys.readouterr().err == ""
