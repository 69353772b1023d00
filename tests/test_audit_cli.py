"""`python -m attnscope audit`: one line per check, exit 0 (all pass) / 1 (a check failed) / 2 (bad input)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnscope.cli import main
from attnscope.core.analysis import bugs
from attnscope.core.transformer import checkpoint
from attnscope.core.transformer.config import tiny
from attnscope.core.transformer.model import Transformer
from attnscope.core.transformer.tokenizer import CharTokenizer

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(PASS|FAIL|SKIP|INFO) [a-z_]+(\[[a-z_]+\])?: .+$")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    tok = CharTokenizer.fit(["abcdefgh "])
    torch.manual_seed(0)
    model = Transformer(tiny(vocab_size=len(tok), max_len=16)).eval()
    return checkpoint.save(
        tmp_path_factory.mktemp("audit") / "tiny", model, tok, tok, card="# tiny\n\nUntrained.\n"
    )


@pytest.fixture(scope="module")
def clf_folder(tmp_path_factory) -> Path:
    tok = CharTokenizer.fit(["abcdefgh "])
    torch.manual_seed(0)
    model = Transformer(tiny(vocab_size=len(tok), max_len=16, n_dec_layers=0, n_classes=2)).eval()
    return checkpoint.save(
        tmp_path_factory.mktemp("audit") / "clf", model, tok, None, meta={"labels": ["n", "y"]}
    )


def audit(capsys, *args: str) -> tuple[int, list[str], str]:
    code = main(["audit", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_correct_model_exits_0_with_one_line_per_check(folder, capsys):
    code, lines, err = audit(capsys, "--model", str(folder), "abcdef", "ab")
    assert code == 0 and err == ""
    assert lines and all(LINE.match(ln) for ln in lines), lines
    names = [ln.split(":")[0].split(" ", 1)[1] for ln in lines]
    assert len(names) == len(set(names))
    assert {"masked_mass[dec_self]", "causal_leak", "padding_leak[src]", "finite"} <= set(names)
    assert not any(ln.startswith("FAIL") for ln in lines)


@pytest.mark.parametrize("bug", bugs.names())
def test_injected_bug_exits_1(folder, capsys, bug):
    code, lines, _ = audit(capsys, "--model", str(folder), "--inject", bug, "abcdef", "ab")
    assert code == 1
    assert any(ln.startswith("FAIL ") for ln in lines)


def test_teacher_forcing_targets(folder, capsys):
    code, lines, _ = audit(
        capsys, "--model", str(folder), "--target", "fedcba", "--target", "ba", "abcdef", "ab"
    )
    assert code == 0
    code, lines, _ = audit(
        capsys, "--model", str(folder), "--inject", "causal_next_visible", "--target", "hg", "gh"
    )
    assert code == 1 and any(ln.startswith("FAIL causal_leak:") for ln in lines)


def test_list_bugs(capsys):
    code, lines, _ = audit(capsys, "--list-bugs")
    assert code == 0
    assert [ln.split()[0] for ln in lines] == bugs.names()
    for ln, bug in zip(lines, bugs.BUGS.values(), strict=True):
        assert ln.endswith(bug.description)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--inject", "nope", "abc"], "unknown bug 'nope'"),
        ([], "at least one input text"),
        (["ABC"], "unknown characters"),
        (["--target", "a", "abc", "abd"], "one per text"),
    ],
    ids=["unknown-bug", "no-text", "bad-chars", "target-count"],
)
def test_bad_input_exits_2_with_one_line(folder, capsys, args, message):
    code, lines, err = audit(capsys, "--model", str(folder), *args)
    assert code == 2 and lines == []
    assert len(err.strip().splitlines()) == 1 and message in err


def test_bad_model_and_decoder_bug_on_encoder_only(clf_folder, tmp_path, capsys):
    code, _, err = audit(capsys, "--model", str(tmp_path / "missing"), "abc")
    assert code == 2 and "unknown model" in err
    code, _, err = audit(capsys, "abc")
    assert code == 2 and "--model is required" in err
    code, _, err = audit(capsys, "--model", str(clf_folder), "--inject", "cross_no_src_pad", "abc")
    assert code == 2 and "encoder-only" in err
    code, lines, _ = audit(capsys, "--model", str(clf_folder), "--inject", "wrong_broadcast", "abcdefg", "ab")
    assert code == 1 and any(ln.startswith("SKIP causal_leak") for ln in lines)


def test_entry_point_subprocess():
    proc = subprocess.run([sys.executable, "-m", "attnscope", "audit", "--list-bugs"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and "wrong_broadcast" in proc.stdout
