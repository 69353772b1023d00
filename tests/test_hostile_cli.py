"""Hostile and odd input through the core and the CLI: a clear message, never a traceback or a hang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnscope.cli import main
from attnscope.core.errors import InputError
from attnscope.core.families.native import load_folder
from attnscope.core.transformer import checkpoint
from attnscope.core.transformer.config import tiny
from attnscope.core.transformer.model import Transformer
from attnscope.core.transformer.tokenizer import CharTokenizer

ROOT = Path(__file__).resolve().parents[1]
ALPHABET = "abcdefghijklmnopqrstuvwxyz1 <>/()="

HOSTILE = {
    "empty": "",
    "whitespace": " \t\n  ",
    "huge": "a" * 100_000,
    "control": "ab\x00\x07\x1bc",
    "emoji": "hi 👋🏽 there",
    "combining": "e\u0301e\u0301",
    "rtl": "שלום עולם",
    "html": "<img src=x onerror=alert(1)>",
    "script": "</script><script>alert(1)</script>",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tok = CharTokenizer.fit([ALPHABET])
    torch.manual_seed(0)
    model = Transformer(tiny(vocab_size=len(tok), max_len=48)).eval()
    path = tmp_path_factory.mktemp("hostile") / "m"
    checkpoint.save(path, model, tok, tok)
    return path


@pytest.mark.parametrize("case", list(HOSTILE))
def test_cli_answers_hostile_text_with_one_line(folder, case, capsys):
    code = main(["predict", "--model", str(folder), HOSTILE[case]])
    out, err = capsys.readouterr()
    if case in ("html", "script"):  # in this vocabulary these are ordinary characters
        assert code == 0 and out.strip(), err
        return
    assert code == 2, out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err
    assert len(lines[0]) < 400  # a huge input is not echoed back


def test_cli_process_huge_input_exits_2_without_traceback(folder):
    proc = subprocess.run(
        [sys.executable, "-m", "attnscope", "predict", "--model", str(folder), HOSTILE["huge"]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("case", list(HOSTILE))
def test_runner_rejects_or_traces_hostile_text(folder, case):
    lm = load_folder(folder)
    text = HOSTILE[case]
    try:
        traces = lm.trace([text], truncate=True)
    except InputError as exc:
        assert str(exc)  # a message for the user
        return
    (t,) = traces
    assert len(t.src_tokens) <= lm.cfg.max_len
    assert np.isfinite(t.enc_self).all()


@pytest.fixture(scope="module")
def short_lm(tmp_path_factory):
    """max_len 16: fuzzed text is often truncated, and greedy decoding stays short."""
    tok = CharTokenizer.fit([ALPHABET])
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("fuzz") / "m"
    checkpoint.save(path, Transformer(tiny(vocab_size=len(tok), max_len=16)).eval(), tok, tok)
    return load_folder(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(ALPHABET + "é€\n"), min_size=0, max_size=80))
def test_fuzz_text_to_trace(short_lm, text):
    lm = short_lm
    try:
        (t,) = lm.trace([text], truncate=True)
    except InputError:
        assert not text.strip() or set(text) - set(ALPHABET)
        return
    for kind in t.kinds:
        probs = t.probs(kind)
        q, k = t.axes(kind)
        assert probs.shape[-2:] == (len(q), len(k))
        assert np.isfinite(probs).all()
        assert (probs[..., ~t.mask(kind)] == 0).all()
