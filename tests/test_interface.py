"""One model interface: every family (core, pretrained, Hugging Face, adapter) answers the same
questions the same way, and packages traces with their real positions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnscope.core.families.interface import ARCHS, FAMILIES, AttentionModel, InjectableModel, pad_rows
from attnscope.models import registry

transformers = pytest.importorskip("transformers")
from test_hf import _specs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model):
    out = {"core": tiny_model, "adapter": registry.load(str(ROOT / "examples" / "my_adapter.py"))}
    if "minilm" in registry.all_names():
        out["pretrained"] = registry.load("minilm")
    for name in ("gpt2", "bart"):
        cls, cfg, tok = _specs()[name]
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(name)
        cls(cfg).eval().save_pretrained(folder)
        tok.save_pretrained(folder)
        out[f"hf-{name}"] = registry.load(str(folder))
    return out


def test_every_family_implements_the_interface(models):
    arch = {"core": "seq2seq", "adapter": "seq2seq", "pretrained": "encoder", "hf-gpt2": "decoder",
            "hf-bart": "seq2seq"}  # fmt: skip
    for key, lm in models.items():
        assert isinstance(lm, AttentionModel), key
        assert lm.arch in ARCHS and lm.arch == arch[key], key
        assert lm.injectable == (key in ("core", "pretrained")), key
        assert lm.masks_from_ids == (key == "adapter"), key
        facts = lm.audit_facts()
        assert (
            set(facts) == {"pad_id", "skip_ids", "vocab", "max_len"} and facts["pad_id"] in facts["skip_ids"]
        )


def test_the_declared_members_answer_for_every_family(models):
    """family, thread_safe, InjectableModel, position_table and named_parameters: what callers use,
    declared on the interface, with values a wrong implementation would get wrong."""
    family = {
        "core": "core",
        "adapter": "adapter",
        "pretrained": "pretrained",
        "hf-gpt2": "hf",
        "hf-bart": "hf",
    }
    for key, lm in models.items():
        assert lm.family == family[key] and lm.family in FAMILIES, key
        assert lm.thread_safe == (key in ("core", "pretrained")), key
        assert isinstance(lm, InjectableModel) == lm.injectable, key
        names = [n for n, _ in lm.named_parameters()]
        assert names and len(names) == len(set(names)), key
        assert sum(p.numel() for _, p in lm.named_parameters()) == sum(
            p.numel() for p in {id(p): p for _, p in lm.named_parameters()}.values()
        ), key
    core = models["core"]
    pt = core.position_table()
    pos, i = np.arange(core.cfg.max_len)[:, None], np.arange(0, core.cfg.d_model, 2)[None, :]
    want = np.zeros((core.cfg.max_len, core.cfg.d_model))
    want[:, 0::2], want[:, 1::2] = (
        np.sin(pos / 10000 ** (i / core.cfg.d_model)),
        np.cos(pos / 10000 ** (i / core.cfg.d_model)),
    )
    assert pt.scheme == "sinusoidal" and pt.where == "src_embed.pos"
    np.testing.assert_allclose(pt.table, want, atol=1e-6)
    gpt2 = models["hf-gpt2"].position_table()
    wpe = dict(models["hf-gpt2"].named_parameters())["transformer.wpe.weight"]
    assert gpt2.where == "transformer.wpe" and np.array_equal(gpt2.table, wpe.detach().numpy())
    bart = models["hf-bart"].position_table()
    assert bart.table is not None and bart.offset == models["hf-bart"].cfg.pos_offset
    assert models["adapter"].position_table().table is None  # the example adapter adds no position table
    if "pretrained" in models:
        minilm = models["pretrained"].position_table()
        weight = dict(models["pretrained"].named_parameters())["src_embed.pos.weight"]
        assert minilm.scheme == "learned" and np.array_equal(minilm.table, weight.detach().numpy())


def test_forward_with_is_the_models_own_forward(models):
    """InjectableModel.forward_with runs core's forward with the masks given (what the lab and the
    audit inject), equal to the plain forward when the masks are the model's own."""
    lm = models["core"]
    src = torch.tensor([lm.prepare("abc").ids])
    tgt = torch.tensor([[lm.cfg.bos_id, 5, 6]])
    with torch.no_grad():
        plain = lm.model(src, tgt)
    out = lm.forward_with(src, tgt, masks=plain.masks)
    torch.testing.assert_close(out.logits, plain.logits)
    assert not out.logits.requires_grad


def test_traces_carry_real_positions_from_the_model(models):
    for key, lm in models.items():
        texts = ["hello world", "abc"]
        short = lm.trace(texts)[1]
        side = "tgt_real" if lm.arch == "decoder" else "src_real"
        real = getattr(short, side)
        assert real is not None and real.dtype == bool, key
        assert real[0] and not real.all(), key  # the short text is padded in the batch
        assert real.sum() == len(lm.prepare("abc").ids), key
        for kind in short.kinds:  # real query rows sum to 1
            p = short.probs(kind)
            q_real = short.tgt_real if kind != "enc_self" else short.src_real
            np.testing.assert_allclose(p[:, :, q_real].sum(-1), 1.0, atol=1e-5, err_msg=f"{key} {kind}")


def test_forward_outputs_answer_for_the_real_positions(models):
    for key, lm in models.items():
        ids = [lm.prepare(t).ids for t in ("hello world", "abc")]
        rows, real = pad_rows(ids, lm.audit_facts()["pad_id"], lm.device)
        if lm.arch == "decoder":
            out = lm.forward_outputs(None, rows, None, real)
            assert set(out) == {"dec"} and out["dec"].shape[:2] == rows.shape, key
        elif lm.arch == "encoder":
            out = lm.forward_outputs(rows, None, real, None)
            assert "enc" in out and out["enc"].shape[:2] == rows.shape, key
        else:
            b = lm.trace(["hello world", "abc"])
            tgt = torch.tensor(np.stack([t.tgt_ids for t in b]), device=lm.device)
            t_real = torch.tensor(np.stack([t.tgt_real for t in b]), device=lm.device)
            out = lm.forward_outputs(rows, tgt, real, t_real)
            assert out["dec"].shape[:2] == tgt.shape, key


def test_decoder_only_continuation_lives_in_the_model(models):
    from attnscope.core.errors import InputError

    gpt2 = models["hf-gpt2"]
    tr = gpt2.trace_continuation(["hello world"])[0]
    assert tr.meta["teacher_forced"] is False and tr.meta["prompt_len"] == len(
        gpt2.prepare("hello world").ids
    )
    with pytest.raises(InputError, match="only decoder-only models"):
        models["core"].trace_continuation(["abc"])
    with pytest.raises(InputError, match="only decoder-only models"):
        models["adapter"].trace_continuation(["abc"])


def test_core_imports_nothing_above_it():
    """core/ is the library: models/, the command line and dashboard/ build on it, never the other way
    round. Every import in core/ is of attnscope.core or of a third-party package."""
    import ast

    old_names = {"models", "dashboard", "core", "bench", "tests"}  # the folders' names are not import names
    found = []
    for path in sorted((ROOT / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [
                f"{path.name}: {n}"
                for n in names
                if n.split(".")[0] in old_names
                or (n.split(".")[0] == "attnscope" and not n.startswith("attnscope.core."))
            ]
    assert found == []
