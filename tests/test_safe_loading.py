"""Loading user checkpoints safely: core folders, .pt state dicts (weights_only), refused pickles, broken files."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnscope.cli import main
from attnscope.core.errors import ModelLoadError
from attnscope.core.transformer import checkpoint
from attnscope.core.transformer.config import tiny
from attnscope.core.transformer.model import Transformer
from attnscope.core.transformer.tokenizer import CharTokenizer
from attnscope.models import registry

ROOT = Path(__file__).resolve().parents[1]


class _CreatesFile:
    """Unpickling this calls open(path, "w"): it would create a file (i.e. run code)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def folder(tmp_path) -> Path:
    tok = CharTokenizer.fit(["abcdef"])
    torch.manual_seed(0)
    model = Transformer(tiny(vocab_size=len(tok))).eval()
    out = tmp_path / "mymodel"
    checkpoint.save(out, model, tok, card="# mine\n\nA tiny test model.", meta={"summary": "tiny test model"})
    return out


def _cli(argv, capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def _assert_one_line_error(rc: int, err: str, *words: str) -> None:
    assert rc == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, err


def test_core_folder_loads_from_a_path(folder):
    lm = registry.load(str(folder))
    assert registry.model_kind(str(folder)) == "core"
    assert lm.name == "mymodel" and lm.summary == "tiny test model"
    assert isinstance(lm.predict(["abc"])[0], str)
    by_file = registry.load(str(folder / "model.safetensors"))  # a weights file beside its config
    assert torch.equal(by_file.model.src_embed.tok.weight, lm.model.src_embed.tok.weight)


def test_pt_state_dict_loads_with_weights_only(folder):
    lm = registry.load(str(folder))
    state = {k: v.clone() for k, v in lm.model.state_dict().items()}
    torch.save(state, folder / "weights.pt")
    from_pt = registry.load(str(folder / "weights.pt"))
    for name, tensor in from_pt.model.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    # a folder with model.pt instead of model.safetensors, and the {"state_dict": ...} wrapper
    (folder / "model.safetensors").unlink()
    torch.save({"state_dict": state}, folder / "model.pt")
    again = registry.load(str(folder))
    assert torch.equal(again.model.src_embed.tok.weight, state["src_embed.tok.weight"])


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_malicious_pickle_is_refused(folder, tmp_path, capsys, writer):
    marker = tmp_path / "pwned.txt"
    evil = folder / "evil.pt"
    payload = {"src_embed.tok.weight": _CreatesFile(marker)}
    if writer == "torch.save":
        torch.save(payload, evil)
    else:
        with open(evil, "wb") as f:
            pickle.dump(payload, f)
    with pytest.raises(
        ModelLoadError, match="refused to load evil.pt: it holds Python objects that would run code"
    ):
        checkpoint.load_torch_state(evil)
    with pytest.raises(ModelLoadError, match="refused"):
        registry.load(str(evil))
    rc, err = _cli(["predict", "--model", str(evil), "abc"], capsys)
    _assert_one_line_error(rc, err, "refused to load evil.pt", "weights_only")
    assert not marker.exists()
    # control: the payload really runs code when unpickled the unsafe way
    control = tmp_path / "control.txt"
    pickle.loads(pickle.dumps(_CreatesFile(control))).close()
    assert control.exists()


def test_malicious_pickle_refused_by_the_real_cli(folder, tmp_path):
    marker = tmp_path / "pwned_cli.txt"
    torch.save({"w": _CreatesFile(marker)}, folder / "evil.pth")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnscope",
            "trace",
            "--model",
            str(folder / "evil.pth"),
            "abc",
            "--out",
            str(tmp_path / "t.npz"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("error: refused to load evil.pth") and run.stderr.count("\n") == 1, (
        run.stderr
    )
    assert not marker.exists()


def test_truncated_and_wrong_torch_files(folder, tmp_path):
    lm = registry.load(str(folder))
    torch.save(lm.model.state_dict(), tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (folder / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="cannot read cut.pt as a torch checkpoint"):
        registry.load(str(folder / "cut.pt"))
    torch.save([torch.zeros(2)], folder / "list.pt")
    with pytest.raises(ModelLoadError, match="not a state dict of tensors"):
        registry.load(str(folder / "list.pt"))


def test_truncated_safetensors(folder, capsys):
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated or not a safetensors file"):
        registry.load(str(folder))
    rc, err = _cli(["predict", "--model", str(folder), "abc"], capsys)
    _assert_one_line_error(rc, err, "model.safetensors")


def _edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_mismatched_shapes(folder, capsys):
    _edit_config(folder, d_ff=64)
    with pytest.raises(ModelLoadError, match=r"ff.w_1.bias has shape \(32,\), config needs \(64,\)"):
        registry.load(str(folder))
    rc, err = _cli(["trace", "--model", str(folder), "abc", "--out", str(folder / "t.npz")], capsys)
    _assert_one_line_error(rc, err, "do not match config.json")


def test_d_model_not_divisible_by_heads(folder, capsys):
    _edit_config(folder, d_model=18)
    with pytest.raises(ModelLoadError, match=r"d_model \(18\) must be divisible by n_heads \(4\)"):
        registry.load(str(folder))
    rc, err = _cli(["predict", "--model", str(folder), "abc"], capsys)
    _assert_one_line_error(rc, err, "divisible")


def test_hf_folder_never_runs_code_from_the_folder(tmp_path, capsys):
    pytest.importorskip("transformers")
    marker = tmp_path / "pwned_remote.txt"
    hf = tmp_path / "remote"
    hf.mkdir()
    (hf / "config.json").write_text(
        json.dumps({"model_type": "evil_custom", "auto_map": {"AutoConfig": "evil.EvilConfig"}})
    )
    (hf / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert registry.model_kind(str(hf)) == "hf"
    with pytest.raises(ModelLoadError, match="never runs code shipped in a model folder"):
        registry.load(str(hf))
    rc, err = _cli(["predict", "--model", str(hf), "abc"], capsys)
    _assert_one_line_error(rc, err)
    assert not marker.exists()


def test_hf_bad_config_is_one_line(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    hf = tmp_path / "bad_bert"
    cfg = transformers.BertConfig(vocab_size=10, hidden_size=16, num_attention_heads=4, num_hidden_layers=1,
                                  intermediate_size=8)  # fmt: skip
    transformers.BertModel(cfg).save_pretrained(hf)
    _edit_config(hf, hidden_size=18)
    capsys.readouterr()  # drop save_pretrained's progress bar
    with pytest.raises(ModelLoadError, match="not a multiple of the number of attention heads"):
        registry.load(str(hf))
    rc, err = _cli(["predict", "--model", str(hf), "abc"], capsys)
    _assert_one_line_error(rc, err, "cannot load the model")
