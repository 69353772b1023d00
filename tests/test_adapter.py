"""Adapter files: any PyTorch model on every command (trace, predict, audit) with its maps exact,
bad files answered in one sentence, and the adapter reference's example kept runnable."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from attnscope.cli import main
from attnscope.core.analysis import audit as AU
from attnscope.core.errors import InputError, ModelLoadError
from attnscope.core.families.adapter import load_adapter
from attnscope.core.families.interface import AttentionModel
from attnscope.core.traces.trace import AttentionTrace

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_adapter.py"


@pytest.fixture(scope="module")
def example():
    return load_adapter(EXAMPLE)


def test_the_adapter_reference_shows_the_tested_example():
    doc = (ROOT / "docs" / "your-model.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks


def test_adapter_implements_the_interface(example):
    assert isinstance(example, AttentionModel)
    assert example.arch == "seq2seq" and example.has_decoder and not example.injectable
    assert example.cfg.n_enc_layers == 2 and example.cfg.n_dec_layers == 2 and example.cfg.n_heads == 4
    assert example.cfg.d_model == 32 and example.cfg.pad_id == 0
    assert example.meta["examples"] == ["hello world", "attention"]


def _reference_maps(model, src, tgt) -> dict[str, list[torch.Tensor]]:
    """Every attention of the model called again by hand on the inputs it got, need_weights per head. The
    model runs as it runs uncaptured (global hooks, which leave torch's fused fast paths on): an encoder
    layer's self-attention is called on what that layer hands it (its input, or its first norm's)."""
    names = {id(m): n for n, m in model.named_modules()}
    in_layer = {id(m.self_attn) for m in model.modules() if isinstance(m, nn.TransformerEncoderLayer)}
    calls: list[tuple[str, tuple, dict]] = []

    def seen(mod, a, k, _out):
        if isinstance(mod, nn.TransformerEncoderLayer) and id(mod) in names:
            src = a[0].to_padded_tensor(0.0) if a[0].is_nested else a[0]  # (one sequence, no padding)
            x = mod.norm1(src) if mod.norm_first else src
            masks = {"attn_mask": k.get("src_mask"), "key_padding_mask": k.get("src_key_padding_mask")}
            calls.append((names[id(mod)] + ".self_attn", (x, x, x), masks))
        elif isinstance(mod, nn.MultiheadAttention) and id(mod) in names and id(mod) not in in_layer:
            calls.append((names[id(mod)], a, k))

    hook = torch.nn.modules.module.register_module_forward_hook(seen, with_kwargs=True)
    try:
        with torch.no_grad():
            model(src, tgt)
    finally:
        hook.remove()
    out: dict[str, list[torch.Tensor]] = {"enc_self": [], "dec_self": [], "cross": []}
    for name, a, k in calls:
        mod = model.get_submodule(name)
        kw = {x: k[x] for x in ("key_padding_mask", "attn_mask") if k.get(x) is not None}
        with torch.no_grad():
            _, w = mod.forward(*a[:3], need_weights=True, average_attn_weights=False, **kw)
        kind = "cross" if "multihead_attn" in name else ("dec_self" if ".decoder." in name else "enc_self")
        out[kind].append(w)
    return out


def test_cli_trace_writes_exactly_the_maps_the_model_computed(example, tmp_path, capsys):
    out = tmp_path / "t.npz"
    assert main(["trace", "--model", str(EXAMPLE), "hello", "--target", "olleh", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    tr = AttentionTrace.load(out)
    src = torch.tensor([tr.src_ids])
    tgt = torch.tensor([tr.tgt_ids])
    assert tr.src_tokens == tuple("hello") + ("<eos>",) and tr.tgt_tokens == ("<bos>", *"olleh", "<eos>")
    ref = _reference_maps(example.model, src, tgt)
    for kind in ("enc_self", "dec_self", "cross"):
        got = tr.probs(kind)
        assert got.shape[0] == 2 and len(ref[kind]) == 2
        for layer, w in enumerate(ref[kind]):
            np.testing.assert_allclose(got[layer], w[0].numpy(), atol=1e-6, rtol=0)
    assert not tr.mask("dec_self")[0, 1:].any()  # causal, taken from the model's own arguments
    # out tokens: the model's argmax at every decoder position
    logits = example.module.forward(example.model, src, tgt)
    assert tuple(tr.out_tokens) == example.tgt_tok.tokens(logits[0].argmax(-1).tolist())


def test_adapter_trace_batch_keeps_padding_and_real_positions(example):
    traces = example.trace(["hello world", "abc"], ["dlrow olleh", "cba"])
    short = traces[1]
    assert short.src_real.tolist() == [True] * 4 + [False] * 8
    assert short.tgt_real.tolist() == [True] * 5 + [False] * 8
    assert (short.probs("enc_self")[:, :, :4, 4:] == 0).all()  # real queries never read PAD keys
    assert short.meta["mask_sources"] == {
        "enc_self": "arguments",
        "dec_self": "arguments",
        "cross": "arguments",
    }


def test_example_passes_the_audit(example):
    report = AU.run_audit(example, ["hello world", "abc"], ["dlrow olleh", "cba"])
    assert report.passed, report.lines()
    names = {v.name: v.status for v in report.verdicts}
    assert names["batch_invariance"] == "pass" and names["causal_leak"] == "pass"
    assert names["padding_leak[src]"] == "skip"  # masks come from the ids: PAD content cannot change


def test_greedy_generation_runs_through_forward(example):
    tr = example.trace(["abc"])[0]
    assert tr.meta["teacher_forced"] is False and tr.tgt_tokens[0] == "<bos>"
    # the decoder input is the model's own greedy output: each next token is the argmax before it
    assert tr.tgt_tokens[1:] == tr.out_tokens[: len(tr.tgt_tokens) - 1]
    assert example.predict(["abc"]) == [tr.output_text]


def test_example_weights_reverse_as_the_readme_says(example, capsys):
    assert example.predict(["hello world", "attention"]) == ["dlrow olleh", "noitnetta"]
    assert main(["predict", "--model", str(EXAMPLE), "hello world"]) == 0
    out = capsys.readouterr()
    assert "dlrow olleh" in out.out and "nested tensors" not in out.err


def test_bad_text_is_an_input_error(example):
    with pytest.raises(InputError, match="cannot be encoded"):
        example.trace(["h3llo"])
    with pytest.raises(InputError, match="empty"):
        example.trace(["  "])
    with pytest.raises(InputError, match="at most 64"):
        example.trace(["a" * 80])


# -- broken adapter files: one sentence each --------------------------------------------------------

GOOD = EXAMPLE.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.replace("def forward(model, src, tgt):\n    return model(src, tgt)\n", ""), "lacks forward"),
        (lambda s: s.replace('ARCH = "encoder-decoder"', 'ARCH = "seq2seq"'), "ARCH is 'seq2seq'"),
        (lambda s: s.replace("    model = Model()  #", "    raise RuntimeError('weights file missing')  #"),
         "load() raised RuntimeError: weights file missing"),
        (lambda s: s.replace("    return model(src, tgt)", "    return model(src, tgt)[:, 0]"),
         "forward returned (2, 30); it must return logits or probabilities [2, 1, 30]"),
        (lambda s: s.replace("    return model(src, tgt)", "    return model(src, tgt)[..., :5]"),
         "its last axis must be the vocabulary"),
        (lambda s: s.replace("PAD, BOS, EOS = 0, 1, 2", "PAD, BOS, EOS = 0, 99, 2"), "BOS must be a token id"),
        (lambda s: s + "\nraise ImportError('no module named my_project')\n", "running the file raised ImportError"),
        (lambda s: s + "\nLABELS = ['a', 'b']\n", "LABELS is for encoder classifiers"),
        (lambda s: s.replace("def load():", "def load():\n    return 'not a model'\n\n\ndef _x():"),
         "must return a torch.nn.Module"),
        (lambda s: s.replace("    return model(src, tgt)", "    return model.out(model.emb(tgt))"), "no attention found"),
    ],
)  # fmt: skip
def test_broken_adapter_is_one_sentence(tmp_path, capsys, edit, message):
    path = tmp_path / "adapter.py"
    path.write_text(edit(GOOD), encoding="utf-8")
    shutil.copy(EXAMPLE.with_name("my_adapter.safetensors"), tmp_path)
    with pytest.raises(ModelLoadError) as err:
        load_adapter(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert main(["trace", "--model", str(path), "abc", "--out", str(tmp_path / "t.npz")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in lines[0]
