"""Bad input on the command line: one sentence on stderr and a non-zero exit (never a traceback, a silent
wrong answer or a file left behind), and output that is not a number said as a warning."""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from attnscope.cli import main
from attnscope.core.errors import TraceFormatError
from attnscope.core.traces.trace import AttentionTrace

# A tiny adapter (untrained, d = 8): each test edits one line of it.
ADAPTER = """
import torch
from torch import nn

ARCH = "encoder-decoder"
VOCAB = ["<pad>", "<bos>", "<eos>"] + list("abcdefghijklmnopqrstuvwxyz ")
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 8
EXAMPLES = ["abc"]


class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(len(VOCAB), d)
        self.pos = nn.Embedding(MAX_LEN, d)
        self.tf = nn.Transformer(d, 2, 1, 1, 16, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, len(VOCAB))

    def embed(self, ids):
        return self.emb(ids) + self.pos(torch.arange(ids.shape[1]))

    def forward(self, src, tgt):
        fut = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool).triu(1)
        h = self.tf(self.embed(src), self.embed(tgt), tgt_mask=fut, src_key_padding_mask=src == PAD,
                    tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=src == PAD)
        return self.out(h)


def load():
    return Model()


def encode(text):
    return [VOCAB.index(c) for c in text.lower()] + [EOS]


def forward(model, src, tgt):
    return model(src, tgt)
"""


def adapter(tmp_path: Path, old: str = "", new: str = "", name: str = "ad.py") -> Path:
    assert old in ADAPTER
    path = tmp_path / name
    path.write_text(ADAPTER.replace(old, new) if old else ADAPTER, encoding="utf-8")
    return path


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ") and "Traceback" not in err[0] and "unexpected" not in err[0]
    return err[0]


# -- 1. sys.exit in the adapter's code ------------------------------------------------------------


@pytest.mark.parametrize(
    "old, new, fn",
    [
        ("    return Model()", "    raise SystemExit(0)", "load()"),
        ("    return [VOCAB.index(c)", "    import sys; sys.exit(3)\n    return [VOCAB.index(c)", "encode("),
        ("    return model(src, tgt)", "    raise SystemExit", "forward(model"),
    ],
)
def test_sys_exit_in_the_adapter_is_one_sentence_exit_2(tmp_path, capsys, old, new, fn):
    path = adapter(tmp_path, old, new)
    assert main(["trace", "--model", str(path), "abc", "--out", str(tmp_path / "t.npz")]) == 2
    line = one_error(capsys)
    assert fn in line and "sys.exit" in line
    assert not (tmp_path / "t.npz").exists()


# -- 2. NaN or infinite output ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ['float("nan")', 'float("inf")'])
def test_non_finite_output_is_said(tmp_path, capsys, value):
    path = adapter(tmp_path, "    return model(src, tgt)\n", f"    return model(src, tgt) * {value}\n")
    assert main(["predict", "--model", str(path), "abc"]) == 0
    err = capsys.readouterr().err.splitlines()
    word = "NaN" if "nan" in value else "infinite"
    assert len(err) == 1 and err[0].startswith("warning: forward returned") and word in err[0]
    out = tmp_path / "t.npz"
    assert main(["trace", "--model", str(path), "abc", "--out", str(out)]) == 0
    assert "out_probs holds NaN" in capsys.readouterr().err
    assert any("out_probs" in p for p in AttentionTrace.load(out).problems())


def test_minus_infinity_logits_are_a_vocabulary_mask_not_a_warning(tmp_path, capsys):
    path = adapter(tmp_path, "    return model(src, tgt)\n",
                   "    o = model(src, tgt)\n    o[..., 5] = float('-inf')\n    return o\n")  # fmt: skip
    assert main(["predict", "--model", str(path), "abc"]) == 0
    assert capsys.readouterr().err == ""


def test_nan_weights_are_said_before_the_answer(tiny_folder, tmp_path, capsys):
    bad = tmp_path / "nanmodel"
    shutil.copytree(tiny_folder, bad)
    state = load_file(bad / "model.safetensors")
    state[sorted(state)[0]].fill_(float("nan"))
    save_file(state, bad / "model.safetensors")
    assert main(["predict", "--model", str(bad), "abc"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: the model's weights hold NaN") and sorted(state)[0] in err


# -- 3. integer logits --------------------------------------------------------------------------------


def test_integer_logits_are_refused(tmp_path, capsys):
    path = adapter(tmp_path, "    return model(src, tgt)\n", "    return (model(src, tgt) * 10).long()\n")
    assert main(["predict", "--model", str(path), "abc"]) == 2
    line = one_error(capsys)
    assert "int64" in line and "float" in line


# -- 4. --out that cannot be written: said before the model runs ---------------------------------------


@pytest.mark.parametrize(
    "where, message",
    [("folder", "is a folder"), ("under_file", "is not a folder"), ("proc", "cannot write")],
)
def test_unwritable_out_is_refused_before_the_model_runs(tmp_path, capsys, where, message):
    marker = tmp_path / "loaded"
    path = adapter(
        tmp_path, "    return Model()", f"    open({str(marker)!r}, 'w').close()\n    return Model()"
    )
    if where == "folder":
        out = tmp_path / "x.npz"
        out.mkdir()
    elif where == "under_file":
        (tmp_path / "afile").write_text("")
        out = tmp_path / "afile" / "x.npz"
    else:
        if not Path("/proc/self").is_dir():
            pytest.skip("no /proc")
        out = Path("/proc/x.npz")
    assert main(["trace", "--model", str(path), "abc", "--out", str(out)]) == 2
    assert message in one_error(capsys)
    assert not marker.exists()


# -- 5, 6. stats: no usable line, an input that is not a file ------------------------------------------


@pytest.mark.parametrize("text, message", [("", "has no text"), ("a" * 100 + "\n", "1 too long")])
def test_stats_without_a_usable_line_leaves_nothing_behind(tiny_folder, tmp_path, capsys, text, message):
    src = tmp_path / "in.txt"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "s.parquet"
    assert main(["stats", "--model", str(tiny_folder), "--input-file", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1] and "KeyError" not in err[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


@pytest.mark.parametrize("kind", ["folder", "device"])
def test_stats_input_that_is_not_a_file_says_what_it_is(tiny_folder, tmp_path, capsys, kind):
    src = tmp_path if kind == "folder" else Path(os.devnull)
    out = tmp_path / "s.parquet"
    assert main(["stats", "--model", str(tiny_folder), "--input-file", str(src), "--out", str(out)]) == 2
    line = one_error(capsys)
    assert ("is a folder" if kind == "folder" else "not a regular file") in line
    assert "does not exist" not in line


# -- 7. EXAMPLES that is not a list ----------------------------------------------------------------------


def test_examples_not_a_list_names_the_file(tmp_path, capsys):
    path = adapter(tmp_path, 'EXAMPLES = ["abc"]', "EXAMPLES = 5", name="exa.py")
    assert main(["predict", "--model", str(path), "abc"]) == 2
    line = one_error(capsys)
    assert "exa.py" in line and "EXAMPLES" in line and "list of texts" in line


# -- 8. a raw pickle model.pt: refused with our sentence alone ----------------------------------------


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def test_pickle_checkpoint_refused_without_torch_warning(tiny_folder, tmp_path, capsys):
    bad = tmp_path / "pickled"
    bad.mkdir()
    for f in ("config.json", "src_vocab.json", "tgt_vocab.json"):
        shutil.copy(tiny_folder / f, bad / f)
    with open(bad / "model.pt", "wb") as fh:
        pickle.dump(_Evil(), fh, protocol=4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["predict", "--model", str(bad), "abc"]) == 2
    assert "refused to load model.pt" in one_error(capsys)
    assert not [w for w in seen if "pickle protocol" in str(w.message)]


# -- 10. a bad .json trace: one sentence, not two ----------------------------------------------------


def test_bad_json_trace_is_said_once(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("[" * 100)
    with pytest.raises(TraceFormatError) as err:
        AttentionTrace.load(path)
    text = str(err.value)
    assert text.count("is not a trace attnscope can open") == 1 and "TraceFormatError" not in text


# -- 11. an empty model name -------------------------------------------------------------------------


def test_empty_model_name(capsys):
    assert main(["predict", "--model", "", "abc"]) == 2
    assert "model name is empty" in one_error(capsys)


# -- 12, 13. view: the path the user gave, and one that does not exist ---------------------------------


def test_view_names_the_link_not_its_target(tmp_path, capsys):
    target = tmp_path / "secret_target"
    target.write_text("root:x:0:0\n")
    link = tmp_path / "t.npz"
    link.symlink_to(target)
    assert main(["view", str(link)]) == 2
    line = one_error(capsys)
    assert "t.npz" in line and "secret_target" not in line


def test_view_of_a_missing_folder_says_it_does_not_exist(tmp_path, capsys):
    assert main(["view", str(tmp_path / "runs" / "typo_run")]) == 2
    line = one_error(capsys)
    assert "does not exist" in line and "ends in .npz" not in line


def test_a_config_far_larger_than_its_weights_is_refused_before_its_model_is_built(tmp_path, capsys):
    """config.json sizes that need terabytes beside real weights: the model was built (its memory allocated,
    or an allocation error) before the weights were checked against the config. The names and shapes are
    checked on the meta device first: one sentence, nothing allocated."""
    import json

    folder = tmp_path / "huge"
    shutil.copytree(Path(__file__).resolve().parents[1] / "models" / "reverse", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(d_model=1 << 20, d_ff=1 << 22, n_enc_layers=1000)
    (folder / "config.json").write_text(json.dumps(cfg))
    assert main(["predict", "--model", str(folder), "abc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "do not match config.json" in err[0], err
